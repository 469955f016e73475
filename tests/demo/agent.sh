# shellcheck shell=bash
# tests/demo/agent.sh - sourced by scripts/demo.sh and tests/demo/demo_quick.sh:
# a kvarena-agent of the demo's own, in a fresh temporary directory.
#
# agent_start AGENT CTL [FLAG...]
#	Start AGENT in the background, in a process group of its own (a
#	Ctrl-C is for the demo, which stops its engines; the agent is stopped
#	after it), with its socket and its log (stdout and stderr) in a new
#	directory from mktemp -d, the demo's geometry (agent_geometry) and
#	FLAGs, which come after it and so win. Wait until `CTL status`
#	answers. Sets agent_pid, agent_socket, agent_log, and traps so that an
#	interrupted or failed script leaves no agent behind. Return 1, with
#	the log shown, if it never answers.
# agent_stop
#	SIGTERM, and wait for it (bounded). Return 0 only if it exited 0 and
#	removed its socket.
# agent_show_log
#	The agent's log: all of it when short, else the lines about workers
#	attaching and dying, reclaims, warnings and errors.

# the demo's arena: 2048 blocks of 16 tokens x 4 layers x K,V x 2 kv heads x
# 64 x f16 = 32 KiB; worker slots for its 4 engines and its parent, which
# also sizes each worker's cache (1/16 of the arena over the slots: 25 blocks)
agent_geometry=(--name demo --blocks 2048 --block-tokens 16 --layers 4 --kv-heads 2
	--head-dim 64 --dtype f16 --layout block-major --max-workers 5 --log-level info)
agent_pid=
agent_dir=
agent_socket=
agent_log=
agent_me=${0##*/}

# agent_gone: true once the agent process has exited (bash reaps its
# background children as they end, so kill -0 then fails)
agent_gone() {
	! kill -0 "$agent_pid" 2>/dev/null
}

# agent_wait_gone TENTHS: wait up to TENTHS tenths of a second for it to exit
agent_wait_gone() {
	local i

	for ((i = 0; i < $1; i++)); do
		agent_gone && return 0
		sleep 0.1
	done
	agent_gone
}

# on the script's exit: an agent still running is stopped, killed if it must
# be; its directory goes unless the script failed, when its log is kept
agent_cleanup() {
	local status=$?

	if [[ -n $agent_pid ]] && ! agent_gone; then
		kill -TERM "$agent_pid" 2>/dev/null
		agent_wait_gone 50 || kill -KILL "$agent_pid" 2>/dev/null
		wait "$agent_pid" 2>/dev/null
		echo "$agent_me: kvarena-agent (pid $agent_pid) stopped on the way out" >&2
	fi
	if [[ -n $agent_dir && -d $agent_dir ]]; then
		if ((status)); then
			echo "$agent_me: kvarena-agent's log kept in $agent_log" >&2
		else
			rm -rf "$agent_dir"
		fi
	fi
}

agent_start() {
	local agent=$1 ctl=$2 i rc

	shift 2
	agent_dir=$(mktemp -d "${TMPDIR:-/tmp}/kvarena-demo.XXXXXX") || return 1
	agent_socket=$agent_dir/kvarena.sock
	agent_log=$agent_dir/agent.log
	trap agent_cleanup EXIT
	trap 'exit 129' HUP
	trap 'exit 130' INT
	trap 'exit 143' TERM
	# job control for this one command: the agent gets a process group of
	# its own, which a terminal's Ctrl-C does not reach
	set -m
	"$agent" --socket "$agent_socket" "${agent_geometry[@]}" "$@" \
		</dev/null >"$agent_log" 2>&1 &
	agent_pid=$!
	set +m
	for ((i = 0; i < 100; i++)); do
		if agent_gone; then
			wait "$agent_pid"
			rc=$?
			echo "$agent_me: kvarena-agent exited with status $rc before it answered;" \
				"its log:" >&2
			sed 's/^/  /' "$agent_log" >&2
			return 1
		fi
		"$ctl" --socket "$agent_socket" status >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "$agent_me: kvarena-agent (pid $agent_pid) did not answer on $agent_socket" \
		"in 10 s; its log:" >&2
	sed 's/^/  /' "$agent_log" >&2
	return 1
}

agent_stop() {
	local rc

	kill -TERM "$agent_pid" 2>/dev/null
	if ! agent_wait_gone 100; then
		echo "$agent_me: kvarena-agent (pid $agent_pid) did not exit within 10 s of" \
			"SIGTERM: killing it" >&2
		kill -KILL "$agent_pid" 2>/dev/null
		wait "$agent_pid" 2>/dev/null
		return 1
	fi
	wait "$agent_pid"
	rc=$?
	if ((rc)); then
		echo "$agent_me: kvarena-agent exited with status $rc after SIGTERM" >&2
		return 1
	fi
	if [[ -e $agent_socket ]]; then
		echo "$agent_me: kvarena-agent exited but left its socket $agent_socket" >&2
		return 1
	fi
	return 0
}

agent_show_log() {
	local lines

	lines=$(wc -l <"$agent_log")
	if ((lines <= 30)); then
		sed 's/^/  /' "$agent_log"
		return
	fi
	grep -E -e 'attached to slot|died holding|reclaimed|findable|never adopted' \
		-e 'refused|warn|error|stopped:' "$agent_log" | sed 's/^/  /'
	echo "  ($lines lines in all: the rest are workers leaving and the agent starting)"
}
