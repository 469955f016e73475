#!/usr/bin/env bash
# scripts/test.sh - on a fresh Debian 12 machine: install what is missing,
# build a release tree, an ASan+UBSan tree and a TSan tree, run every test in
# them, and end with each runner's summary. Exit 0 only if everything passed.
#
# Trees: build/release (-Dwerror=true; as root, with 64 huge pages reserved
# for its run where none are), build/asan (address,undefined; UBSan
# fatal), build/tsan (clang, thread; the tests that run threads in one
# process, the crash tests and the stress test, whose worker processes run
# several threads each), build/fuzz (clang, libFuzzer with address,undefined; the protocol
# decoder for FUZZ_SECONDS, default 30). Re-running is cheap: trees are
# reused, packages not re-installed.
set -uo pipefail
cd "$(dirname "$0")/.."

. scripts/packages.sh
ensure_packages test.sh \
	build-essential meson ninja-build pkg-config python3 \
	clang libclang-rt-14-dev \
	libxxhash-dev libnuma-dev liburing-dev libcmocka-dev \
	libsystemd-dev libjson-c-dev libdpdk-dev libmicrohttpd-dev \
	python3-pytest python3-numpy python3-prometheus-client help2man ||
	exit 1
# promtool (Debian's prometheus package) checks the agent's /metrics where
# it can be installed; the metrics tests say so and go on without it
ensure_packages test.sh prometheus >/dev/null 2>&1 ||
	echo "test.sh: the prometheus package (promtool) could not be installed: its check is skipped"

# setup DIR [meson options...]: configure once, reconfigure when options change
setup() {
	local dir=$1
	shift
	if [[ -f $dir/build.ninja ]]; then
		meson setup --reconfigure "$dir" "$@" >/dev/null
	else
		meson setup "$dir" "$@" >/dev/null
	fi
}

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

failed=()
run() { # name dir [meson test args...]
	local name=$1 dir=$2
	shift 2
	echo
	echo "== $name: building"
	if ! ninja -C "$dir" >"$dir/ninja.log" 2>&1; then
		tail -n 40 "$dir/ninja.log"
		failed+=("$name (build)")
		return
	fi
	echo "== $name: testing"
	if ! meson test -C "$dir" --print-errorlogs --num-processes 2 "$@"; then
		failed+=("$name")
	fi
}

# The release tree runs with a small hugetlb pool (as root, where none is
# reserved), so that the huge-page paths are tested (an arena's --hugepages,
# the host tier, which takes huge pages where there are some); the sanitizer
# trees run without one, so that the fallbacks to ordinary pages are. The
# pool is given back after the release tree, or at exit.
HUGEPAGES=/proc/sys/vm/nr_hugepages
huge_reserved=false
huge_release() {
	if $huge_reserved; then
		echo 0 >"$HUGEPAGES" 2>/dev/null
		huge_reserved=false
	fi
}
trap huge_release EXIT
if [[ $EUID -eq 0 && -w $HUGEPAGES && $(cat "$HUGEPAGES") == 0 ]] &&
	echo 64 >"$HUGEPAGES" 2>/dev/null; then
	huge_reserved=true
	echo "test.sh: release tree with $(cat "$HUGEPAGES") huge pages of 2 MiB reserved"
fi
setup build/release --buildtype=release -Dwerror=true -Dtests=enabled
run release build/release
huge_release

setup build/asan --buildtype=debugoptimized -Dwerror=true -Dtests=enabled \
	-Db_sanitize=address,undefined -Db_lundef=false -Ddpdk=disabled
run asan+ubsan build/asan

CC=clang setup build/tsan --buildtype=debugoptimized -Dwerror=true -Dtests=enabled \
	-Db_sanitize=thread -Db_lundef=false -Ddpdk=disabled
run tsan build/tsan --suite tsan

CC=clang setup build/fuzz --buildtype=debugoptimized -Dwerror=true -Dtests=enabled \
	-Dfuzz=enabled -Dfuzz_seconds="${FUZZ_SECONDS:-30}" \
	-Db_sanitize=address,undefined -Db_lundef=false -Ddpdk=disabled
run fuzz build/fuzz --suite fuzz

echo
if ((${#failed[@]})); then
	echo "test.sh: FAILED: ${failed[*]}"
	exit 1
fi
echo "test.sh: all test runs passed (release, asan+ubsan, tsan, fuzz)"
