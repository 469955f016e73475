# scripts/packages.sh - sourced by test.sh and demo.sh.
#
# ensure_packages CALLER PACKAGE...: install the Debian packages that are
# missing. As root, with apt-get; otherwise print the exact command and
# return 1, so the caller stops before a build that cannot succeed.
ensure_packages() {
	local caller=$1 p
	local missing=()

	shift
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			missing+=("$p")
	done
	((${#missing[@]})) || return 0
	if [[ $(id -u) -ne 0 ]]; then
		echo "$caller: missing packages; as root run:" >&2
		echo "  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
		return 1
	fi
	echo "== installing: ${missing[*]}"
	if ! DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
		! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
		echo "$caller: apt-get failed" >&2
		return 1
	fi
}
