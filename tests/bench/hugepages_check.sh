#!/bin/sh
# hugepages_check.sh BENCH - `BENCH decode --quick --hugepages` runs (checked
# against the naive decode, as bench_decode_quick is) and its line says
# whether the arena got huge pages as the hugetlb pool allows: false with
# none free, true with plenty free (the quick arena needs one 2 MiB page;
# other tests may take a few meanwhile, so between the two either will do).
set -u
bench=$1
free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
out=$("$bench" decode --quick --hugepages) || { echo "hugepages_check: the bench failed"; exit 1; }
got=$(printf '%s\n' "$out" | grep -o '"hugetlb":[a-z]*' | cut -d: -f2)
case "$got" in
true | false) ;;
*) echo "hugepages_check: no \"hugetlb\" in: $out"; exit 1 ;;
esac
if [ "${free:-0}" -eq 0 ] && [ "$got" != false ]; then
	echo "hugepages_check: no huge page free, yet \"hugetlb\":$got"
	exit 1
fi
if [ "${free:-0}" -ge 8 ] && [ "$got" != true ]; then
	echo "hugepages_check: $free huge pages free, yet \"hugetlb\":$got"
	exit 1
fi
echo "hugepages_check: $free huge pages free: \"hugetlb\":$got"
