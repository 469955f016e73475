#!/usr/bin/env bash
# scripts/demo.sh - on a fresh Debian 12 machine: install what the build
# needs, build a release tree in build/demo (tests off: the demo needs only
# the library) and run kvarena-demo with this script's arguments.
#
# The demo creates an arena, forks engine processes that serve a synthetic
# LLM workload in it, SIGKILLs one half-way, reclaims its blocks while the
# others go on, and checks at the end that nothing was lost. Its exit status
# is this script's: 0 only if every check passed. `scripts/demo.sh --help`
# lists its options.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

packages=(build-essential meson ninja-build pkg-config libxxhash-dev libnuma-dev)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing+=("$p")
done
if ((${#missing[@]})); then
	if [[ $(id -u) -ne 0 ]]; then
		echo "demo.sh: missing packages; as root run:" >&2
		echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
	echo "== installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get update -qq || ! apt-get install -y -qq "${missing[@]}"; then
		echo "demo.sh: apt-get failed" >&2
		exit 1
	fi
fi

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

echo "== running $dir/tests/demo/kvarena-demo $*"
echo
"$dir/tests/demo/kvarena-demo" "$@"
status=$?
echo
echo "demo.sh: kvarena-demo exited with status $status"
exit "$status"
