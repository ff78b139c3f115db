#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# "make installcheck" (make distcheck runs it): the installed tree as a
# distribution would ship it and a consumer would use it.
#  - no libtool .la file; the header, vmmrt.pc and the man pages are there;
#  - pkg-config --cflags gives no liburcu/ck flags (vmmrt.h needs none);
#  - a program builds and runs with pkg-config's flags, shared and static;
#  - the installed vmmrt-bench runs on the installed libvmmrt.so, not a copy.
# Usage: check.sh SRCDIR PREFIX LIBDIR INCLUDEDIR BINDIR MANDIR CC SONAME
set -eu
srcdir=$1 prefix=$2 libdir=$3 includedir=$4 bindir=$5 mandir=$6 cc=$7 soname=$8
tmp=$(mktemp -d "${TMPDIR:-/tmp}/installcheck.XXXXXX")
trap 'rm -rf "$tmp"' EXIT HUP INT TERM
fail() { echo "installcheck: $*" >&2; exit 1; }

[ -e "$libdir/libvmmrt.la" ] && fail "$libdir/libvmmrt.la is installed (distributions ship no .la files)"
[ -f "$includedir/vmmrt.h" ] || fail "no $includedir/vmmrt.h"
[ -f "$libdir/pkgconfig/vmmrt.pc" ] || fail "no $libdir/pkgconfig/vmmrt.pc"
[ -f "$mandir/man3/vmmrt_runtime_create.3" ] || fail "no man3 pages under $mandir"
[ -f "$mandir/man7/vmmrt.7" ] || fail "no vmmrt(7) under $mandir"

export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
cflags=$(pkg-config --cflags vmmrt)
# nothing but the include directory (which pkg-config drops when it is a system one)
for flag in $cflags; do
	[ "$flag" = "-I$includedir" ] || fail "pkg-config --cflags vmmrt gives more than -I$includedir: $cflags"
done

# shellcheck disable=SC2046
$cc -o "$tmp/shared" "$srcdir/tests/install/consumer.c" $cflags $(pkg-config --libs vmmrt) ||
	fail "cannot build a program with pkg-config --cflags --libs vmmrt"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/shared" || fail "the shared program failed"
# shellcheck disable=SC2046
$cc -static -o "$tmp/static" "$srcdir/tests/install/consumer.c" $cflags $(pkg-config --static --libs vmmrt) \
	2>"$tmp/static.err" || { cat "$tmp/static.err" >&2; fail "cannot link statically with pkg-config --static --libs vmmrt"; }
"$tmp/static" || fail "the static program failed"

bench=$bindir/vmmrt-bench
[ -x "$bench" ] || fail "no $bench"
resolved=$(LD_LIBRARY_PATH= ldd "$bench" | awk -v so="$soname" '$1 == so { print $3 }')
[ -n "$resolved" ] || fail "$bench does not use $soname (it carries its own copy of the library)"
[ "$(readlink -f "$resolved")" = "$(readlink -f "$libdir/$soname")" ] ||
	fail "$bench loads $resolved, not the installed $libdir/$soname"
[ -e "$bindir/vmmrt-torture" ] && fail "vmmrt-torture is installed (it needs the internal test switches)"
echo "installcheck: ok ($prefix)"
