#!/bin/sh
# run.sh FUZZER SEEDGEN SECONDS: fuzz the decoder for SECONDS from fresh seeds,
# in a scratch corpus; a crash, leak or abort fails the test (libFuzzer's exit).
set -eu
fuzzer=$(readlink -f "$1") seedgen=$(readlink -f "$2") seconds=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus" "$work/seeds"
"$seedgen" "$work/seeds"
cd "$work"
exec "$fuzzer" -max_total_time="$seconds" -seed=1 -print_final_stats=1 \
	-artifact_prefix="$work/" corpus seeds
