#!/bin/sh
# bound_check.sh BENCH - `BENCH decode` prints "bound_ratio_paired", the
# median of the trials' own ratios to their bounds: a positive number on
# the scalar path and on the best one this CPU has, and, with one trial,
# the same figure as "bound_ratio" (one trial's ratio is its own median).
set -u
bench=$1
field() { printf '%s\n' "$2" | grep -o "\"$1\":[^,}]*" | cut -d: -f2; }
for isa in scalar auto; do
	for trials in 1 2; do
		out=$("$bench" decode --quick --isa "$isa" --trials "$trials") ||
			{ echo "bound_check: the bench failed (--isa $isa --trials $trials)"; exit 1; }
		paired=$(field bound_ratio_paired "$out")
		ratio=$(field bound_ratio "$out")
		if ! printf '%s\n' "$paired" | awk '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 > 0 { ok = 1 } END { exit !ok }'; then
			echo "bound_check: \"bound_ratio_paired\" is '$paired', not a ratio: $out"
			exit 1
		fi
		if [ "$trials" = 1 ] && [ "$paired" != "$ratio" ]; then
			echo "bound_check: one trial, yet \"bound_ratio_paired\" $paired is not \"bound_ratio\" $ratio: $out"
			exit 1
		fi
	done
done
echo "bound_check: bound_ratio_paired a ratio on both paths, bound_ratio's own with one trial"
