#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# The Python package's tests (python/tests, pytest) under make check, in TAP.
# test-timeout-s: 1200
# (one stream for the whole suite: about 5 min here alone, and make check
# runs it beside the C tests on 2 cores; twice that under the sanitizers)
#
# They need a python3 that imports torch and pytest. $PYTHON, python3 and
# /usr/bin/python3 are tried in turn: the first python3 on PATH may lack torch
# (a pyenv one), while Debian's has python3-torch. With none, the whole file
# is skipped: a "1..0 # SKIP" plan under make check (automake's TAP driver
# reads exit 77 as an error), exit 77 when run by hand.
#
# Runs from the build directory: the library is the one built there
# (VMMRT_LIBRARY), the package the one in the source tree.

srcdir=${srcdir:-$(dirname "$0")/..}
tried=
py=
for cand in ${PYTHON:+"$PYTHON"} python3 /usr/bin/python3; do
	[ "$cand" = : ] && continue
	if "$cand" -c 'import torch, pytest' >/dev/null 2>&1; then
		py=$cand
		break
	fi
	tried="$tried $cand"
done
if [ -z "$py" ]; then
	why="no python3 that imports torch and pytest (tried:$tried); install python3-torch and python3-pytest"
	if [ "${CMOCKA_MESSAGE_OUTPUT:-}" = TAP ]; then
		echo "1..0 # SKIP $why"
		exit 0
	fi
	echo "SKIP: $why" >&2
	exit 77
fi

lib=$(pwd)/.libs/libvmmrt.so.1
if [ -z "${VMMRT_LIBRARY:-}" ] && [ -f "$lib" ]; then
	VMMRT_LIBRARY=$lib
	export VMMRT_LIBRARY
fi
# A sanitizer build of the library loads only into a process whose first
# libraries are the sanitizer runtimes: preload the ones it links (python and
# torch are not leak-clean, so leak detection stays off). ThreadSanitizer
# cannot be preloaded into an interpreter that has started threads: skipped.
if [ -n "${VMMRT_LIBRARY:-}" ] && command -v ldd >/dev/null 2>&1; then
	if ldd "$VMMRT_LIBRARY" 2>/dev/null | grep -q 'libtsan\.so'; then
		echo "1..0 # SKIP libvmmrt built with ThreadSanitizer cannot be loaded into $py"
		exit 0
	fi
	pre=$(ldd "$VMMRT_LIBRARY" 2>/dev/null | awk '/lib(asan|ubsan)\.so/ { printf "%s:", $3 }')
	if [ -n "$pre" ]; then
		LD_PRELOAD=${pre%:}${LD_PRELOAD:+:$LD_PRELOAD}
		ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
		export LD_PRELOAD ASAN_OPTIONS
	fi
fi
PYTHONPATH=$srcdir/python:$srcdir/python/tests${PYTHONPATH:+:$PYTHONPATH}
PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH PYTHONDONTWRITEBYTECODE
echo "# $py: $("$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)')" >&2

# TAP on fd 3 (the driver's stdout), pytest's report on stderr (the log).
exec 3>&1
"$py" -m pytest -p vmmrt_tap -p no:cacheprovider --rootdir "$srcdir/python" -q -rs "$@" \
	"$srcdir/python/tests" 1>&2
