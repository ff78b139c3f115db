#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# Replace the generated option block of vmmrt(7) with the output of
# vmmrt-optdoc, the option table of src/options.c printed as man(7) rows.
#
#   man/update-options.sh [OPTDOC [PAGE]]
#
# OPTDOC defaults to ./man/vmmrt-optdoc (the build tree), PAGE to
# $srcdir/man/man7/vmmrt.7. The block is everything between the lines
#   .\" BEGIN GENERATED OPTIONS
#   .\" END GENERATED OPTIONS
# which are kept. PAGE is rewritten in place only when its text changes.
# tests/man-check.sh runs this on a copy of the page and compares.
set -eu

optdoc=${1:-./man/vmmrt-optdoc}
page=${2:-${srcdir:-.}/man/man7/vmmrt.7}
me=update-options.sh

begin='.\" BEGIN GENERATED OPTIONS'
end='.\" END GENERATED OPTIONS'

if [ ! -f "$page" ]; then
	echo "$me: $page: no such page" >&2
	exit 1
fi
# Exactly one begin marker followed by exactly one end marker.
nb=$(grep -c -x -F "$begin" "$page" || true)
ne=$(grep -c -x -F "$end" "$page" || true)
if [ "$nb" != 1 ] || [ "$ne" != 1 ]; then
	echo "$me: $page: needs exactly one '$begin' and one '$end' line (found $nb and $ne)" >&2
	exit 1
fi

tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/vmmrt-man.XXXXXX")
trap 'rm -rf "$tmpdir"' EXIT HUP INT TERM

if ! "$optdoc" >"$tmpdir/rows"; then
	echo "$me: $optdoc failed" >&2
	exit 1
fi
if [ ! -s "$tmpdir/rows" ]; then
	echo "$me: $optdoc printed nothing" >&2
	exit 1
fi

# Through the environment: awk -v would turn the \" of the markers into ".
VMMRT_BEGIN=$begin VMMRT_END=$end VMMRT_ROWS=$tmpdir/rows awk '
	BEGIN {
		begin = ENVIRON["VMMRT_BEGIN"]
		end = ENVIRON["VMMRT_END"]
		rows = ENVIRON["VMMRT_ROWS"]
	}
	$0 == begin {
		print
		while ((getline line < rows) > 0)
			print line
		close(rows)
		skip = 1
		seen_begin = 1
		next
	}
	$0 == end {
		if (!seen_begin) {
			print "end marker before begin marker" > "/dev/stderr"
			exit 1
		}
		skip = 0
	}
	!skip { print }
' "$page" >"$tmpdir/page"

if cmp -s "$tmpdir/page" "$page"; then
	exit 0
fi
# Keep the file (and its permissions): overwrite, do not replace.
cat "$tmpdir/page" >"$page"
echo "$me: updated $page"
