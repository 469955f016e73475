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

. scripts/packages.sh
ensure_packages demo.sh build-essential meson ninja-build pkg-config libxxhash-dev libnuma-dev ||
	exit 1

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
