#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# The public header compiles as strict C99 and as C++11 and C++17, warnings
# as errors (TAP). Environment: srcdir, CC, CXX, CUDA_CPPFLAGS (when cuda.h is
# there, the C++ check uses CUdeviceptr itself).
set -u
srcdir=${srcdir:-.}
CC=${CC:-cc}
CXX=${CXX:-c++}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/header.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT HUP INT TERM
inc="-I$srcdir/include"
cuda=
if [ -n "${CUDA_CPPFLAGS:-}" ]; then cuda="-DHAVE_CUDA_H $CUDA_CPPFLAGS"; fi
echo "1..3"
n=0
check() { # description, command...
	n=$((n + 1))
	d=$1
	shift
	if "$@" >"$tmp/out" 2>&1; then
		echo "ok $n - $d"
	else
		echo "not ok $n - $d"
		sed 's/^/# /' "$tmp/out"
	fi
}
check "C99 -pedantic" $CC -std=c99 -Wall -Wextra -pedantic -Werror $inc -c "$srcdir/tests/abi/header.c" -o "$tmp/c.o"
if ! command -v "$CXX" >/dev/null 2>&1 || ! echo 'int main(){}' | "$CXX" -x c++ - -o "$tmp/t" >/dev/null 2>&1; then
	echo "ok 2 # SKIP no C++ compiler ($CXX)"
	echo "ok 3 # SKIP no C++ compiler ($CXX)"
	exit 0
fi
for std in c++11 c++17; do
	# shellcheck disable=SC2086
	check "$std -pedantic${cuda:+ with cuda.h}" $CXX -std=$std -Wall -Wextra -pedantic -Werror $inc $cuda \
		-c "$srcdir/tests/abi/header.cc" -o "$tmp/cc.o"
done
