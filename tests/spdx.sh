#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# Every source file says its licence in an SPDX line near its top (TAP), and
# LICENSE is the LGPL 2.1 it names. Generated files and automake's own
# scripts are left out. Environment: srcdir.
set -u
srcdir=${srcdir:-.}
echo "1..2"
missing=$(cd "$srcdir" && find . \( -name .git -o -name .gpu -o -name autom4te.cache -o -name m4 \
		-o -path ./tests/fuzz/corpus -o -path ./tests/regression/fuzz -o -path ./tests/fuzz/known \
		-o -name __pycache__ -o -name '*.egg-info' -o -name '_build' -o -name .venv -o -path ./python/build \) -prune -o -type f \
	\( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cc' -o -name '*.sh' -o -name '*.py' \
	   -o -name '*.am' -o -name '*.mk' -o -name configure.ac -o -name '*.pc.in' -o -name '*.supp' \
	   -o -name '*.[137]' -o -path ./.ci/run \) -print |
	grep -vE '^\./build-aux/(tap-driver\.sh|compile|missing|install-sh|depcomp|test-driver|ltmain\.sh|config\.(guess|sub))$' |
	grep -vE '_fatbin\.c$|^\./config\.h$|^\./libvmmrt-[0-9.]+/' |
	while read -r f; do
		case $f in *.3) head -1 "$f" | grep -q '^\.so ' && continue ;; esac
		head -3 "$f" | grep -q 'SPDX-License-Identifier: LGPL-2.1-or-later' || echo "$f"
	done)
if [ -z "$missing" ]; then
	echo "ok 1 - every source file has its SPDX line"
else
	echo "not ok 1 - every source file has its SPDX line"
	printf '%s\n' "$missing" | sed 's/^/# missing: /'
fi
if grep -q 'GNU LESSER GENERAL PUBLIC LICENSE' "$srcdir/LICENSE" && grep -q 'Version 2.1' "$srcdir/LICENSE"; then
	echo "ok 2 - LICENSE is the LGPL 2.1"
else
	echo "not ok 2 - LICENSE is the LGPL 2.1"
fi
