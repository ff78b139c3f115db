#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# What libvmmrt.so offers a program that loads it (TAP):
#  1. its exported symbols are exactly the functions include/vmmrt.h declares
#     (VMMRT_EXTERN), no internal function, no data;
#  2. no test switch (fault hook, planted bug) is in it at all;
#  3. it needs no static TLS (dlopen() would fail with "cannot allocate memory
#     in static TLS block") and its thread-local state is small;
#  4. its soname is the one configure derives from the libtool version.
# Environment: srcdir, LIBVMMRT_SO (the built library), LIBVMMRT_SONAME, NM, READELF.
set -u
srcdir=${srcdir:-.}
so=${LIBVMMRT_SO:-./.libs/libvmmrt.so.1}
header=$srcdir/include/vmmrt.h
NM=${NM:-nm}
READELF=${READELF:-readelf}

if [ ! -f "$so" ]; then
	echo "1..0 # SKIP no shared library at $so (a --disable-shared build)"
	exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/exports.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT HUP INT TERM
echo "1..4"

# Declared: the function names on VMMRT_EXTERN lines; and every line that looks
# like a function declaration must carry the mark.
grep -E '^VMMRT_EXTERN ' "$header" | grep -oE '\bvmmrt_[a-z0-9_]+ *\(' | tr -d ' (' | sort -u >"$tmp/declared"
grep -nE '^[a-z][a-z0-9_ ]*[ *]vmmrt_[a-z0-9_]+\(' "$header" >"$tmp/unmarked"
$NM -D --defined-only "$so" | awk '{print $3}' | sort -u >"$tmp/exported"
if cmp -s "$tmp/declared" "$tmp/exported" && [ ! -s "$tmp/unmarked" ]; then
	echo "ok 1 - the $(wc -l <"$tmp/exported") exported symbols are the functions of vmmrt.h"
else
	echo "not ok 1 - the exported symbols are the functions of vmmrt.h"
	comm -13 "$tmp/declared" "$tmp/exported" | sed 's/^/# exported, not declared: /'
	comm -23 "$tmp/declared" "$tmp/exported" | sed 's/^/# declared, not exported: /'
	sed 's/^/# declared without VMMRT_EXTERN: /' "$tmp/unmarked"
fi

$NM "$so" 2>/dev/null | awk '{print $NF}' | grep -E 'set_fault_hook|test_plant' >"$tmp/switches"
if [ -s "$tmp/switches" ]; then
	echo "not ok 2 - no test switch in the shared library"
	sed 's/^/# found: /' "$tmp/switches"
else
	echo "ok 2 - no test switch in the shared library"
fi

tls=$($READELF -lW "$so" | awk '$1 == "TLS" { print $6 }')
[ -n "$tls" ] && tls=$((tls))
if $READELF -dW "$so" | grep -q STATIC_TLS; then
	echo "not ok 3 - dlopen-safe TLS # the FLAGS entry has STATIC_TLS (initial-exec TLS somewhere)"
elif [ -n "$tls" ] && [ "$tls" -gt 1024 ]; then
	echo "not ok 3 - dlopen-safe TLS # $tls bytes of thread-local state (keep it under 1 KiB)"
else
	echo "ok 3 - dlopen-safe TLS (no STATIC_TLS, ${tls:-0} bytes per thread)"
fi

soname=$($READELF -dW "$so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [ "$soname" = "${LIBVMMRT_SONAME:-libvmmrt.so.1}" ]; then
	echo "ok 4 - soname $soname"
else
	echo "not ok 4 - soname # $soname, configure says ${LIBVMMRT_SONAME:-?}"
fi
