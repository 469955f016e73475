#!/bin/sh
# prefetch_check.sh BENCH - `BENCH decode` prints "prefetch_kept": null for
# the quick configuration (fewer bytes than a burst of 64 prefetches needs
# 4 KiB chunks), and a count from 0 to 64 for one of 2 MiB.
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
echo "prefetch_check: $kept of 64 kept"
