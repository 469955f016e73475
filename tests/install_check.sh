#!/usr/bin/env bash
# tests/install_check.sh BUILD PREFIX BINDIR LIBDIR INCLUDEDIR MANDIR UNITDIR SANITIZE PYDIR CC
# - the `install` test: `meson install` of this build tree into a scratch
# DESTDIR, then what an engine developer and an operator use of it: the
# header and the library through pkg-config (a program built and run
# against them), the Python package (imported from where it was put, over
# the installed library), the binaries, the man pages (rendered, no
# warning), the systemd units (the installed agent's path in ExecStart).
set -euo pipefail

if (($# != 10)); then
	echo "usage: install_check.sh BUILD PREFIX BINDIR LIBDIR INCLUDEDIR MANDIR UNITDIR SANITIZE PYDIR CC" >&2
	exit 2
fi
build=$1 prefix=$2 bindir=$3 libdir=$4 includedir=$5 mandir=$6 unitdir=$7 sanitize=$8 pydir=$9
compiler=${10}
pydir=${pydir%/}
# A sanitized build installs a sanitized library: a program built against it
# needs the sanitizer's flags, and a Python not built with the sanitizer must
# load its runtime first (as tests/python does).
sanflags=() preload=()
if [[ $sanitize != none ]]; then
	sanflags=("-fsanitize=$sanitize")
	case $sanitize in
	*address*) preload=(LD_PRELOAD="$("$compiler" -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0) ;;
	*thread*) preload=(LD_PRELOAD="$("$compiler" -print-file-name=libtsan.so)") ;;
	esac
fi
dest=$(mktemp -d "${TMPDIR:-/tmp}/kvarena-install.XXXXXX")
trap 'rm -rf "$dest"' EXIT
root=$dest$prefix
fail() {
	echo "install_check: $*" >&2
	exit 1
}

meson install -C "$build" --destdir "$dest" --no-rebuild --quiet

for f in "$bindir/kvarena-agent" "$bindir/kvarena-ctl" "$bindir/kvarena-bench" \
	"$includedir/kvarena.h" "$includedir/kvarena_kernels.h" "$includedir/kvarena_seq.h" \
	"$includedir/kvarena_tiers.h" "$libdir/libkvarena.so" "$libdir/libkvarena.a" \
	"$libdir/pkgconfig/kvarena.pc"; do
	[[ -e $root/$f ]] || fail "$f was not installed"
done
# the private headers stay private
[[ ! -e $root/$includedir/arena_pvt.h ]] || fail "a private header was installed"

# a program of an engine's, built with what pkg-config says
export PKG_CONFIG_PATH=$root/$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
flags=$(pkg-config --cflags --libs kvarena) || fail "pkg-config kvarena"
cat >"$dest/engine.c" <<'PROGRAM'
#include <stdio.h>
#include <kvarena.h>

int main(void)
{
	struct kva_geometry g = { .block_tokens = 16, .layers = 32, .kv_heads = 8,
				  .head_dim = 128, .dtype = KVA_BF16 };
	struct kva_block_layout l;

	if (kva_geometry_layout(&g, 1024, &l) < 0 || kva_sizeof("kva_stats") != sizeof(struct kva_stats))
		return 1;
	printf("%llu\n", (unsigned long long)l.block_bytes);
	return 0;
}
PROGRAM
# shellcheck disable=SC2086 # the flags are words
"$compiler" -std=c11 "${sanflags[@]}" -o "$dest/engine" "$dest/engine.c" $flags || fail "a program does not build against the installed library"
[[ $(LD_LIBRARY_PATH=$root/$libdir "$dest/engine") == 2097152 ]] ||
	fail "a program built against the installed library does not run right"
[[ $(LD_LIBRARY_PATH=$root/$libdir "$root/$bindir/kvarena-agent" --version) == kvarena-agent* ]] ||
	fail "the installed kvarena-agent does not run"

# the Python package, if this build found Debian's python3: imported from
# where it was put, over the installed library
if [[ -n $pydir ]]; then
	[[ -e $dest$pydir/kvarena/__init__.py && -e $dest$pydir/kvarena/py.typed ]] ||
		fail "the Python package was not installed in $pydir"
	got=$(env "${preload[@]}" PYTHONPATH=$dest$pydir KVARENA_LIB=$root/$libdir/libkvarena.so /usr/bin/python3 -c \
		'import kvarena; print(kvarena.__file__, kvarena.__version__)') ||
		fail "the installed Python package does not import"
	[[ $got == "$dest$pydir/kvarena/__init__.py"* ]] || fail "python imported another kvarena: $got"
else
	echo "install_check: no python3 found by this build: the Python package was not installed"
fi

# the man pages, if this build made them (help2man found)
if [[ -e $build/doc/kvarena-agent.8 ]]; then
	for page in kvarena-agent kvarena-ctl; do
		man8=$root/$mandir/man8/$page.8
		[[ -e $man8 ]] || fail "$page.8 was not installed"
		out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$man8" 2>&1 >/dev/null) || fail "man $page: $out"
		[[ -z $out ]] || fail "man $page warns: $out"
		LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$man8" 2>/dev/null | grep -q -- --socket ||
			fail "$page.8 has no --socket: not made from its --help"
	done
else
	echo "install_check: no man pages in this build (help2man not found): not checked"
fi

for unit in kvarena-agent.service kvarena-agent@.service kvarena-agent-gpu@.service; do
	u=$dest$unitdir/$unit
	[[ -e $u ]] || fail "$unit was not installed in $unitdir"
	grep -q "^ExecStart=$prefix/$bindir/kvarena-agent" "$u" || fail "$unit: ExecStart is not the installed agent"
	! grep -q '@[a-z]*@' "$u" || fail "$unit: a placeholder was left"
done
echo "install_check: meson install into $dest: library, headers, pkg-config, Python package, binaries, man pages, units: all there and working"
