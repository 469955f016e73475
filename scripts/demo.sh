#!/usr/bin/env bash
# scripts/demo.sh - on a fresh Debian 12 machine: install what the build
# needs, build a release tree in build/demo (tests off), start a
# kvarena-agent of the demo's own and run kvarena-demo on it with this
# script's arguments.
#
# The agent owns the arena (2048 blocks of 32 KiB; --blocks N changes the
# size), in a fresh temporary directory with its socket and its log. The
# demo's engine processes attach to it and serve a synthetic LLM workload;
# one is SIGKILLed half-way and the agent reclaims its blocks while the
# others go on; at the end the demo checks that nothing was lost, and the
# agent is stopped with SIGTERM and must exit cleanly. The exit status is 0
# only if every check passed and the agent stopped cleanly.
# With --backend cuda the arena lives in a GPU's memory (the driver stand-in
# where there is no driver: said when it starts).
# Then it replays the Mooncake synthetic trace through kvarena-replay (its own
# agent, 4 worker processes) with each eviction policy and prints the prefix
# hit ratios next to LRU's and Belady's on the same trace.
# `scripts/demo.sh --help` lists the demo's options.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

. scripts/packages.sh
ensure_packages demo.sh build-essential meson ninja-build pkg-config libxxhash-dev libnuma-dev \
	libsystemd-dev libjson-c-dev libmicrohttpd-dev || exit 1

# --blocks sets the agent's arena; --workers, the demo's, also the agent's
# worker slots (one more, for the demo's parent); --backend cuda puts the
# arena on a GPU; the rest is the demo's
agent_flags=()
demo_args=()
help=0
backend=host
while (($#)); do
	case $1 in
	--blocks | --workers | --backend)
		if (($# < 2)); then
			echo "demo.sh: $1 needs a number" >&2
			exit 2
		fi
		set -- "$1=$2" "${@:3}"
		continue
		;;
	--blocks=*)
		agent_flags+=(--blocks "${1#*=}")
		;;
	--backend=*)
		backend=${1#*=}
		if [[ $backend != host && $backend != cuda ]]; then
			echo "demo.sh: --backend host or cuda" >&2
			exit 2
		fi
		agent_flags+=(--backend "$backend")
		;;
	--workers=*)
		n=${1#*=}
		# in the demo's range (it refuses the others itself)
		if [[ $n =~ ^[0-9]{1,2}$ ]] && ((10#$n >= 4 && 10#$n <= 47)); then
			agent_flags+=(--max-workers "$((10#$n + 1))")
		fi
		demo_args+=(--workers "$n")
		;;
	-h | --help)
		help=1
		;;
	*)
		demo_args+=("$1")
		;;
	esac
	shift
done

dir=build/demo
mkdir -p "$dir"
if [[ -f $dir/build.ninja ]]; then
	setup=(meson setup --reconfigure "$dir" --buildtype=release -Dtests=disabled)
else
	setup=(meson setup "$dir" --buildtype=release -Dtests=disabled)
fi
echo "== building $dir"
# meson's and ninja's chatter goes to logs, shown only when they fail
if ! "${setup[@]}" >"$dir/setup.log" 2>&1; then
	tail -n 40 "$dir/setup.log"
	echo "demo.sh: meson setup failed (log: $dir/setup.log)" >&2
	exit 1
fi
if ! ninja -C "$dir" >"$dir/ninja.log" 2>&1; then
	tail -n 40 "$dir/ninja.log"
	echo "demo.sh: build failed (log: $dir/ninja.log)" >&2
	exit 1
fi
agent=$dir/agent/kvarena-agent
ctl=$dir/agent/kvarena-ctl
demo=$dir/tests/demo/kvarena-demo

if ((help)); then
	"$demo" --help
	echo
	echo "demo.sh also takes --blocks N: the size of the agent's arena (default 2048)"
	echo "and --backend cuda: the arena in a GPU's memory (over the driver stand-in"
	echo "where the machine has no CUDA driver)"
	exit 0
fi

# A GPU arena needs the CUDA driver. Where there is none, the arena runs over
# the project's driver stand-in (tests/cudastub: host memory posing as device
# memory, the driver API's contract enforced), every process of the demo
# barred from touching "device" memory with the CPU, as on a real GPU.
if [[ $backend == cuda ]] && ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
	export LD_LIBRARY_PATH=$PWD/$dir/tests/cudastub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	export KVA_CUDASTUB_NO_CPU=1
	echo "== no CUDA driver on this machine: the GPU arena runs over the driver stand-in"
	echo "   ($dir/tests/cudastub/libcuda.so.1: host memory posing as device memory; no GPU"
	echo "   is involved, and nothing here says how fast one would be)"
fi

. tests/demo/agent.sh
echo "== starting $agent" "${agent_geometry[@]}" "${agent_flags[@]}"
agent_start "$agent" "$ctl" "${agent_flags[@]}" || exit 1
echo "   pid $agent_pid, socket $agent_socket, log $agent_log"

echo "== running $demo --socket $agent_socket --ctl $ctl" "${demo_args[@]}"
echo
"$demo" --socket "$agent_socket" --ctl "$ctl" "${demo_args[@]}"
status=$?
echo
echo "demo.sh: kvarena-demo exited with status $status"

echo "== stopping kvarena-agent (SIGTERM)"
if agent_stop; then
	echo "demo.sh: kvarena-agent exited 0 and removed its socket"
else
	status=1
fi
echo "== kvarena-agent's log"
agent_show_log

# The prefix cache: the shared trace replayed through a kvarena-agent of the
# replay's own (sized at 10% of the trace's unique blocks) by 4 worker
# processes, with each eviction policy, against LRU and Belady on the same
# trace at the same capacity.
replay=$dir/tests/replay/kvarena-replay
for policy in prefix clock; do
	echo
	echo "== $replay --trace tests/replay/traces/synthetic_trace.jsonl --capacity-fraction 0.1" \
		"--workers 4 --policy $policy"
	if ! "$replay" --trace tests/replay/traces/synthetic_trace.jsonl --capacity-fraction 0.1 \
		--workers 4 --policy "$policy" --agent "$agent"; then
		echo "demo.sh: kvarena-replay failed" >&2
		status=1
	fi
done
exit "$status"
