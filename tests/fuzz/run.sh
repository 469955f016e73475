#!/bin/sh
# run.sh FUZZER SEEDS SECONDS: fuzz for SECONDS from SEEDS (a directory of seed
# files kept in the tree, or a program that writes them into the directory it
# is given), in a scratch corpus; a crash, leak or abort fails the test
# (libFuzzer's exit). The target's own stdout and stderr are closed: a parser
# that says why it refused each input would drown libFuzzer's report.
set -eu
fuzzer=$(readlink -f "$1") seeds=$(readlink -f "$2") seconds=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus" "$work/seeds"
if [ -d "$seeds" ]; then
	cp "$seeds"/* "$work/seeds/"
else
	"$seeds" "$work/seeds"
fi
cd "$work"
exec "$fuzzer" -max_total_time="$seconds" -seed=1 -print_final_stats=1 -close_fd_mask=3 \
	-artifact_prefix="$work/" corpus seeds
