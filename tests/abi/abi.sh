#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# The built library against the stored ABI (abi/libvmmrt.abi, written by
# abidw; abi/README.md says when and how it changes), with libabigail's
# abidiff (TAP). Any difference fails: an incompatible one is a soname bump,
# a compatible one (a function added) is an "age" bump and a new baseline
# ("make update-abi"), both deliberate. Skipped without abidiff unless
# ABI_CHECK_REQUIRED=1 (CI sets it).
# Environment: srcdir, LIBVMMRT_SO, ABIDIFF.
set -u
srcdir=${srcdir:-.}
so=${LIBVMMRT_SO:-./.libs/libvmmrt.so.1}
abidiff=${ABIDIFF:-abidiff}
baseline=$srcdir/abi/libvmmrt.abi
if ! command -v "$abidiff" >/dev/null 2>&1; then
	if [ "${ABI_CHECK_REQUIRED:-0}" = 1 ]; then
		echo "1..1"
		echo "not ok 1 - ABI check # abidiff not found and ABI_CHECK_REQUIRED=1 (apt-get install abigail-tools)"
		exit 0
	fi
	echo "1..0 # SKIP abidiff not found (Debian: abigail-tools)"
	exit 0
fi
if [ ! -f "$so" ]; then
	echo "1..0 # SKIP no shared library at $so"
	exit 0
fi
echo "1..1"
out=$("$abidiff" --headers-dir2 "$srcdir/include" "$baseline" "$so" 2>&1)
rc=$?
# abidiff reports added functions apart from changes: look at both
if [ $rc -eq 0 ] && ! printf '%s\n' "$out" | grep -qE '[1-9][0-9]* Added (functions|variable)'; then
	echo "ok 1 - ABI of $(basename "$so") matches abi/libvmmrt.abi"
else
	echo "not ok 1 - ABI of $(basename "$so") matches abi/libvmmrt.abi (abidiff exit $rc)"
	printf '%s\n' "$out" | sed 's/^/# /'
	echo "# an intended change: follow abi/README.md, then make update-abi"
fi
