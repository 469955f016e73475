#!/bin/sh
# bound_check.sh BENCH - `BENCH decode` prints "bound_ratio_paired", the
# median of the trials' own ratios to their bounds: a positive number on
# the scalar path and on the best one this CPU has, and, with one trial,
# the same figure as "bound_ratio" (one trial's ratio is its own median).
# And the plain loop's peer, "arith_stream_gbps": a positive number on the
# best path, null on the scalar one (no roofline there), and with one trial
# "arith_stream_ratio_paired" is "arith_stream_ratio". The same loop over
# contiguous memory, "arith_sweep_gbps", and "serial_gbps" (the ceiling and
# the roofline taken one after the other) likewise: positive on the best
# path, serial_gbps at or below both of its parts, and null on the scalar
# path. "At or below": the three are printed to two decimals, and where the
# roofline is small (a sanitizer build: 0.73 GB/s against a ceiling of 80)
# the serial figure, strictly below it, rounds to the same digits.
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
		stream=$(field arith_stream_gbps "$out")
		sratio=$(field arith_stream_ratio "$out")
		spaired=$(field arith_stream_ratio_paired "$out")
		sweep=$(field arith_sweep_gbps "$out")
		serial=$(field serial_gbps "$out")
		ceiling=$(field ceiling_gbps "$out")
		roof=$(field roofline_gbps "$out")
		if [ "$isa" = scalar ]; then
			if [ "$stream" != null ] || [ "$spaired" != null ] || [ "$sweep" != null ] ||
				[ "$serial" != null ]; then
				echo "bound_check: the scalar path has no roofline, yet \"arith_stream_gbps\" is '$stream', \"arith_sweep_gbps\" '$sweep', \"serial_gbps\" '$serial': $out"
				exit 1
			fi
		elif ! printf '%s\n' "$sweep $serial $ceiling $roof" | awk '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 > 0 && $2 ~ /^[0-9]+(\.[0-9]+)?$/ && $2 > 0 && $2 <= $3 && $2 <= $4 { ok = 1 } END { exit !ok }'; then
			echo "bound_check: \"arith_sweep_gbps\" '$sweep' not a positive number, or \"serial_gbps\" '$serial' not one at or below both the ceiling '$ceiling' and the roofline '$roof': $out"
			exit 1
		elif ! printf '%s\n' "$stream $spaired" | awk '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 > 0 && $2 ~ /^[0-9]+(\.[0-9]+)?$/ && $2 > 0 { ok = 1 } END { exit !ok }'; then
			echo "bound_check: \"arith_stream_gbps\" '$stream' or its paired ratio '$spaired' is not a positive number: $out"
			exit 1
		elif [ "$trials" = 1 ] && [ "$spaired" != "$sratio" ]; then
			echo "bound_check: one trial, yet \"arith_stream_ratio_paired\" $spaired is not \"arith_stream_ratio\" $sratio: $out"
			exit 1
		fi
		if [ "$trials" = 1 ] && [ "$paired" != "$ratio" ]; then
			echo "bound_check: one trial, yet \"bound_ratio_paired\" $paired is not \"bound_ratio\" $ratio: $out"
			exit 1
		fi
	done
done
echo "bound_check: bound_ratio_paired a ratio on both paths, bound_ratio's own with one trial; arith_stream_gbps, arith_sweep_gbps and serial_gbps on the best path only"
