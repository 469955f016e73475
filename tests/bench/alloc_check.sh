#!/bin/sh
# alloc_check.sh BENCH - `BENCH alloc --quick --mode uncached` prints a line
# per occupancy whose ratio_vs_dpdk and ratio_vs_dpdk_best are numbers: the
# DPDK peer, in its own process, took its turns. Null is accepted only where
# the bench says why (built without DPDK, or DPDK's EAL would not start).
set -u
bench=$1
err=$(mktemp) || exit 1
trap 'rm -f "$err"' EXIT
out=$("$bench" alloc --quick --mode uncached 2>"$err") ||
	{ echo "alloc_check: the bench failed"; cat "$err"; exit 1; }
if grep -q -e 'built without DPDK' -e 'rte_eal_init' "$err"; then
	echo "alloc_check: no DPDK peer here: $(grep -e 'built without DPDK' -e 'rte_eal_init' "$err" | head -1)"
	exit 0
fi
lines=$(printf '%s\n' "$out" | grep -c '"mode":"uncached"')
if [ "$lines" -ne 2 ]; then
	echo "alloc_check: $lines uncached lines, not one per occupancy: $out"
	exit 1
fi
for key in ratio_vs_dpdk ratio_vs_dpdk_best; do
	vals=$(printf '%s\n' "$out" | grep -o "\"$key\":[^,}]*" | cut -d: -f2)
	for v in $vals; do
		if ! printf '%s\n' "$v" | awk '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 > 0 { ok = 1 } END { exit !ok }'; then
			echo "alloc_check: \"$key\" is '$v', not a ratio: $out"
			cat "$err"
			exit 1
		fi
	done
done
echo "alloc_check: ratio_vs_dpdk" $(printf '%s\n' "$out" | grep -o '"ratio_vs_dpdk":[^,}]*' | cut -d: -f2)
