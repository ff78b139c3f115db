#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# The layering of src/, in TAP, against the table in src/README (the one
# place it is written):
#   1. every file of src/ has a layer there, and every file there exists;
#   2. every #include "..." of src/ names a header of the file's layer or lower;
#   3. every call (an undefined symbol of an object, defined by another
#      object of the library: nm) goes to a strictly lower layer;
#   4. no file of src/ is over 800 lines.
# Run it after a build, from the build directory: sh tests/layering.sh
# (make check does). Environment: srcdir (the top source directory; by
# default the one above this script), NM.
set -u
srcdir=${srcdir:-$(dirname "$0")/..}
builddir=${1:-.}
nm=${NM:-nm}
limit=800
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmrt-layering.XXXXXX") || { echo "1..0 # SKIP no temporary directory"; exit 0; }
trap 'rm -rf "$tmp"' EXIT INT TERM
echo "1..4"

# result N WHAT COUNTS PROBLEMS: "ok N - WHAT (COUNTS)", or "not ok N - WHAT"
# and PROBLEMS (lines "# ...") under it.
result() {
	if [ -z "$4" ]; then
		echo "ok $1 - $2 ($3)"
	else
		echo "not ok $1 - $2"
		printf '%s\n' "$4"
	fi
}

# The table: "    NN  file file ..." rows, and rows of more files for the same
# layer, between the "layer  files" header and the first empty line.
awk '
	/^ *layer +files *$/ { on = 1; next }
	on && /^ *-+ +-+ *$/ { next }
	on && /^ *$/ { exit }
	on && $1 ~ /^[0-9]+$/ { layer = $1; for (i = 2; i <= NF; i++) print $i, layer; next }
	on { for (i = 1; i <= NF; i++) print $i, layer }
' "$srcdir/src/README" >"$tmp/layers"
if [ ! -s "$tmp/layers" ]; then
	echo "not ok 1 - src/README has the table of layers"
	echo "not ok 2 - #include lines point down # SKIP no table"
	echo "not ok 3 - calls point down # SKIP no table"
	echo "not ok 4 - no file of src/ is over $limit lines # SKIP no table"
	exit 0
fi

# The files of src/ (the fatbin's C array is generated into the build tree).
(cd "$srcdir/src" && find . -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | sed 's|^\./||' |
	grep -v '_fatbin\.c$' | LC_ALL=C sort) >"$tmp/files"

# 1. everything has a layer, and every layer's file exists
bad1=$(awk 'NR == FNR { layer[$1] = $2; next }
	{ seen[$1] = 1; if (!($1 in layer)) print "# " $1 ": not in the table of src/README" }
	END { for (f in layer) if (!(f in seen) && f !~ /_fatbin\.c$/) print "# " f ": in the table, not in src/" }' \
	"$tmp/layers" "$tmp/files")
result 1 "every file of src/ has its layer in src/README" "$(wc -l <"$tmp/files") files" "$bad1"

# 2. includes: "x.h" is src/x.h, or next to the including file; others
# (config.h, vmmrt.h, system headers) are not the library's layers.
while read -r f; do
	dir=$(dirname "$f")
	sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$srcdir/src/$f" |
	while read -r inc; do
		if [ -f "$srcdir/src/$inc" ]; then
			echo "$f $inc"
		elif [ "$dir" != . ] && [ -f "$srcdir/src/$dir/$inc" ]; then
			echo "$f $dir/$inc"
		fi
	done
done <"$tmp/files" >"$tmp/includes"
bad2=$(awk 'NR == FNR { layer[$1] = $2; next }
	($1 in layer) && ($2 in layer) && layer[$2] + 0 > layer[$1] + 0 {
		print "# " $1 " (layer " layer[$1] ") includes " $2 " (layer " layer[$2] ")" }' \
	"$tmp/layers" "$tmp/includes")
result 2 "#include lines point down or across" "$(wc -l <"$tmp/includes") includes" "$bad2"

# 3. calls: each .c's object (libtool's non-PIC one, or the PIC one), its
# global definitions and its undefined symbols.
: >"$tmp/syms"
objects=0
while read -r f; do
	case $f in *.c) ;; *) continue ;; esac
	dir=$(dirname "$f")
	base=$(basename "$f" .c)
	obj=
	for lib in libvmmrt_base_la libvmmrt_core_la libvmmrt_testing_la; do
		for o in "$builddir/src/$dir/$lib-$base.o" "$builddir/src/$dir/.libs/$lib-$base.o"; do
			[ -f "$o" ] && { obj=$o; break 2; }
		done
	done
	[ -n "$obj" ] || continue
	objects=$((objects + 1))
	# $nm unquoted: libtool's NM is a command with options ("nm -B")
	if ! $nm -P "$obj" >"$tmp/nm" 2>&1; then
		echo "$obj" >>"$tmp/nm-failed"
		continue
	fi
	awk -v f="$f" 'NF >= 2 { print f, $1, $2 }' "$tmp/nm" >>"$tmp/syms"
done <<EOF
$(awk '{ print $1 }' "$tmp/layers"; echo kernels/vmmrt_kernels_fatbin.c)
EOF
if [ "$objects" -eq 0 ]; then
	echo "ok 3 - calls point down # SKIP no object of src/ under $builddir (build first)"
elif [ -s "$tmp/nm-failed" ] || [ ! -s "$tmp/syms" ]; then
	echo "not ok 3 - calls point down ($nm -P failed on: $(tr '\n' ' ' <"$tmp/nm-failed" 2>/dev/null))"
else
	bad3=$(awk 'NR == FNR { layer[$1] = $2; next }
		$3 ~ /^[TDBRCVW]$/ { def[$2] = $1; next }
		$3 == "U" { use[++n] = $1 " " $2 }
		END {
			for (i = 1; i <= n; i++) {
				split(use[i], u, " ")
				if (!(u[2] in def) || def[u[2]] == u[1])
					continue
				d = def[u[2]]
				if (layer[d] + 0 >= layer[u[1]] + 0)
					print "# " u[1] " (layer " layer[u[1]] ") calls " u[2] " of " d " (layer " layer[d] ")"
			}
		}' "$tmp/layers" "$tmp/syms" | LC_ALL=C sort -u)
	edges=$(awk 'NR == FNR { if ($3 ~ /^[TDBRCVW]$/) def[$2] = $1; next }
		$3 == "U" && ($2 in def) && def[$2] != $1 { print $1, def[$2] }' "$tmp/syms" "$tmp/syms" |
		LC_ALL=C sort -u | wc -l)
	result 3 "calls point down" "$objects objects, $edges file-to-file arrows" "$bad3"
fi

# 4. sizes
bad4=$(while read -r f; do
	n=$(wc -l <"$srcdir/src/$f")
	[ "$n" -gt "$limit" ] && echo "# $f: $n lines"
done <"$tmp/files")
largest=$(while read -r f; do echo "$(wc -l <"$srcdir/src/$f") $f"; done <"$tmp/files" | sort -n | tail -n 1)
result 4 "no file of src/ is over $limit lines" "the largest: ${largest#* }, ${largest%% *}" "$bad4"
exit 0
