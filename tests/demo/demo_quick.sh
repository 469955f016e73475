#!/usr/bin/env bash
# tests/demo/demo_quick.sh AGENT CTL DEMO [AGENT-FLAG...] - the demo_quick
# tests (meson passes the three executables of the build tree, and flags for
# the agent: --backend cuda over the driver stand-in): start an agent of its
# own, run a 2-second demo on it, stop the agent. Fails if any of them fails.
set -uo pipefail

if (($# < 3)); then
	echo "usage: demo_quick.sh KVARENA-AGENT KVARENA-CTL KVARENA-DEMO [AGENT-FLAG...]" >&2
	exit 2
fi
agent=$1 ctl=$2 demo=$3
shift 3
# shellcheck source=tests/demo/agent.sh
. "$(dirname "$0")/agent.sh"

agent_start "$agent" "$ctl" "$@" || exit 1
"$demo" --socket "$agent_socket" --ctl "$ctl" --seconds 2
status=$?
agent_stop || status=1
echo "kvarena-agent's log:"
agent_show_log
exit "$status"
