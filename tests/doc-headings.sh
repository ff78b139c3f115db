#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# Each topic of the documentation has one place (TAP): no heading appears
# twice among README.md and the pages of doc/, within a page or across
# pages (compared without the #s and without case). A second copy of a
# section is how README once came to say two different things about the
# same work.
# Lines inside fenced code blocks (```) are not headings.
# Environment: srcdir (the top source directory; by default the one above
# this script).
set -u
srcdir=${srcdir:-$(dirname "$0")/..}
echo "1..1"
cd "$srcdir" || { echo "not ok 1 - no source directory $srcdir"; exit 0; }
pages=README.md
for f in doc/*.md; do
	[ -f "$f" ] && pages="$pages $f"
done
# shellcheck disable=SC2086
dups=$(awk '
	FNR == 1 { fence = 0 }
	/^[ \t]*```/ { fence = !fence; next }
	fence { next }
	/^#+[ \t]/ {
		h = $0
		sub(/^#+[ \t]+/, "", h); sub(/[ \t#]+$/, "", h)
		key = tolower(h)
		where = FILENAME ":" FNR
		if (key in first)
			printf "# \"%s\" at %s repeats %s\n", h, where, first[key]
		else
			first[key] = where
		n++
	}
	END { printf "#count %d\n", n }' $pages)
count=$(printf '%s\n' "$dups" | sed -n 's/^#count //p')
dups=$(printf '%s\n' "$dups" | grep -v '^#count ')
if [ -n "$dups" ]; then
	echo "not ok 1 - a heading appears twice in README.md and doc/ (one topic, one place: merge them)"
	printf '%s\n' "$dups"
else
	echo "ok 1 - no heading twice among $count in README.md and doc/"
fi
