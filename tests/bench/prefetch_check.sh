#!/bin/sh
# prefetch_check.sh BENCH - `BENCH decode` prints "prefetch_kept": null for
# the quick configuration (fewer bytes than a burst of 64 prefetches needs
# 4 KiB chunks), and a count from 0 to 64 for one of 2 MiB; and for that
# one, the prefetched 4 KiB read: a rate above 0 at one of the four
# distances it tries, and the decode's ratio to it; and "pf_step", the
# step the library takes: 4 or 8 where the AVX2 tile runs, null elsewhere.
set -u
bench=$1
small=$("$bench" decode --quick) || { echo "prefetch_check: the bench failed"; exit 1; }
case "$small" in
*'"prefetch_kept":null'*) ;;
*) echo "prefetch_check: not null for the quick configuration: $small"; exit 1 ;;
esac
out=$("$bench" decode --quick --kv-heads 8 --context 512) ||
	{ echo "prefetch_check: the bench failed"; exit 1; }
kept=$(printf '%s\n' "$out" | grep -o '"prefetch_kept":[^,}]*' | cut -d: -f2)
if ! printf '%s\n' "$kept" | awk '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 >= 0 && $1 <= 64 { ok = 1 } END { exit !ok }'; then
	echo "prefetch_check: \"prefetch_kept\" is '$kept', not a count from 0 to 64: $out"
	exit 1
fi
field() { printf '%s\n' "$out" | grep -o "\"$1\":[^,}]*" | cut -d: -f2; }
pf=$(field scatter4k_pf_gbps)
dist=$(field scatter4k_pf_distance)
ratio=$(field scatter4k_pf_ratio)
if ! printf '%s\n' "$pf" | awk '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 > 0 { ok = 1 } END { exit !ok }'; then
	echo "prefetch_check: \"scatter4k_pf_gbps\" is '$pf', not a rate: $out"
	exit 1
fi
case "$dist" in
16384 | 32768 | 65536 | 131072) ;;
*) echo "prefetch_check: \"scatter4k_pf_distance\" is '$dist', not one tried: $out"; exit 1 ;;
esac
if ! printf '%s\n' "$ratio" | awk '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 > 0 { ok = 1 } END { exit !ok }'; then
	echo "prefetch_check: \"scatter4k_pf_ratio\" is '$ratio', not a ratio: $out"
	exit 1
fi
step=$(field pf_step)
# the step is the AVX2 tile's, wherever it runs: the AVX2 path, and the
# AVX-512 path's groups 3, 4 and 6-8 on a core that splits 512-bit
# operations (Zen 4); "tile" names the tile that ran
case "$(field isa)/$(field tile)/$step" in
'"avx2"/"avx2"/4' | '"avx2"/"avx2"/8' | '"avx512"/"avx2"/4' | '"avx512"/"avx2"/8' | \
	'"avx512"/"avx512"/null' | '"scalar"/"scalar"/null') ;;
*) echo "prefetch_check: \"pf_step\" is '$step' on the $(field isa) path's $(field tile) tile: $out"; exit 1 ;;
esac
for isa in avx2 scalar; do
	o=$("$bench" decode --quick --kv-heads 8 --context 512 --isa "$isa" 2>/dev/null) || continue
	s=$(printf '%s\n' "$o" | grep -o '"pf_step":[^,}]*' | cut -d: -f2)
	case "$isa/$s" in
	avx2/4 | avx2/8 | scalar/null) ;;
	*) echo "prefetch_check: \"pf_step\" is '$s' with --isa $isa: $o"; exit 1 ;;
	esac
done
echo "prefetch_check: pf_step $step ($(field isa) path, $(field tile) tile);" \
	"$kept of 64 kept; prefetched 4 KiB reads $pf GB/s at $dist bytes ahead"
