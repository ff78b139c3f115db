#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# Keep the manual true to the code (TAP).
#
#  1. The option block of vmmrt(7) is what man/vmmrt-optdoc prints now
#     (the option table of src/options.c); "make update-man" fixes it.
#  2. Every page under man/ is clean for "mandoc -Tlint -Wwarning" (skipped
#     when mandoc is not installed). The .so link pages of man3 are what
#     the project wants, so mandoc's advice against .so itself (".so is
#     fragile, better use ln(1)") is the one message ignored.
#  3. Every public function declared in include/vmmrt.h has its page,
#     man/man3/<function>.3, a full page or a .so link to one, and that
#     page names the function in NAME and declares it in SYNOPSIS.
#  4. Every page of man3 is for a function the header declares, and every
#     .so link points to a full page.
#
# Environment: srcdir (set by automake; default .), OPTDOC (default
# ./man/vmmrt-optdoc, the build tree), MANDOC (default: mandoc in PATH).
set -u

srcdir=${srcdir:-.}
optdoc=${OPTDOC:-./man/vmmrt-optdoc}
mandir=$srcdir/man
header=$srcdir/include/vmmrt.h
page7=$mandir/man7/vmmrt.7

tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/man-check.XXXXXX") || exit 99
trap 'rm -rf "$tmpdir"' EXIT HUP INT TERM

echo "1..4"

# Print a file as TAP diagnostics.
diag() {
	sed 's/^/# /' "$@"
}

# ------------------------------------------------ 1. generated option block
t1() {
	if [ ! -x "$optdoc" ] && [ ! -f "$optdoc" ]; then
		echo "# $optdoc not found: build it first (make man/vmmrt-optdoc)"
		return 1
	fi
	cp "$page7" "$tmpdir/vmmrt.7" || return 1
	if ! sh "$srcdir/man/update-options.sh" "$optdoc" "$tmpdir/vmmrt.7" >"$tmpdir/update.out" 2>&1; then
		diag "$tmpdir/update.out"
		return 1
	fi
	if ! cmp -s "$page7" "$tmpdir/vmmrt.7"; then
		echo "# $page7: the option block differs from the option table; run 'make update-man'"
		diff -u "$page7" "$tmpdir/vmmrt.7" >"$tmpdir/diff" 2>&1
		diag "$tmpdir/diff"
		return 1
	fi
	return 0
}
if t1; then
	echo "ok 1 - vmmrt(7) option block matches the option table"
else
	echo "not ok 1 - vmmrt(7) option block matches the option table"
fi

# ------------------------------------------------------------- 2. mandoc lint
mandoc=${MANDOC:-}
if [ -z "$mandoc" ]; then
	mandoc=$(command -v mandoc 2>/dev/null || true)
fi
if [ -z "$mandoc" ]; then
	echo "ok 2 - mandoc -Tlint -Wwarning on every page # SKIP mandoc is not installed"
else
	# From man/, where ".so man3/x.3" resolves, as man(1) does.
	(
		cd "$mandir" || exit 1
		pages=$(ls man*/*.[0-9] 2>/dev/null)
		[ -n "$pages" ] || { echo "no pages under $mandir"; exit 1; }
		# shellcheck disable=SC2086 # one word per page
		"$mandoc" -Tlint -Wwarning $pages 2>&1
		echo "mandoc-exit-status $?"
	) >"$tmpdir/lint.raw"
	status=$(sed -n 's/^mandoc-exit-status //p' "$tmpdir/lint.raw")
	grep -v '^mandoc-exit-status ' "$tmpdir/lint.raw" |
		grep -v ': WARNING: \.so is fragile, better use ln(1): ' >"$tmpdir/lint" || true
	# 0: clean; 2: warnings (the .so advice at least); >= 5: mandoc itself failed.
	if [ -s "$tmpdir/lint" ] || [ -z "$status" ] || [ "$status" -gt 4 ]; then
		diag "$tmpdir/lint"
		echo "# mandoc exit status: ${status:-none}"
		echo "not ok 2 - mandoc -Tlint -Wwarning on every page"
	else
		echo "ok 2 - mandoc -Tlint -Wwarning on every page"
	fi
fi

# ------------------------------------------- the functions the header declares
# Comments, strings and preprocessor lines are dropped, extern "C" is
# unwrapped, and an identifier vmmrt_* followed by "(" at brace depth 0 is a
# declared function, whatever its return type and however the declaration
# is split across lines. Function pointer typedefs ("(*vmmrt_x_fn)(") and
# struct members do not match, nor do calls inside inline function bodies.
declared_functions() {
	awk '
	{ text = text $0 "\n" }
	END {
		out = ""
		n = length(text)
		i = 1
		# pass 1: comments, string and character literals, preprocessor lines
		bol = 1
		while (i <= n) {
			c = substr(text, i, 1)
			two = substr(text, i, 2)
			if (bol && c ~ /[ \t]/) { out = out c; i++; continue }
			if (bol && c == "#") {
				# skip to the end of the line, with continuations
				while (i <= n) {
					c = substr(text, i, 1)
					if (c == "\\" && substr(text, i + 1, 1) == "\n") { i += 2; continue }
					if (c == "\n") break
					i++
				}
				continue
			}
			bol = 0
			if (two == "/*") {
				j = index(substr(text, i + 2), "*/")
				if (j == 0) break
				i += j + 3
				out = out " "
				continue
			}
			if (two == "//") {
				while (i <= n && substr(text, i, 1) != "\n") i++
				continue
			}
			if (c == "\"" || c == "\047") {
				q = c
				i++
				while (i <= n) {
					c = substr(text, i, 1)
					if (c == "\\") { i += 2; continue }
					i++
					if (c == q) break
				}
				out = out q q
				continue
			}
			if (c == "\n") bol = 1
			out = out c
			i++
		}
		gsub(/extern[ \t\n]*""[ \t\n]*\{/, " ", out)
		# pass 2: identifiers followed by "(" at brace depth 0
		n = length(out)
		depth = 0
		top = ""
		for (i = 1; i <= n; i++) {
			c = substr(out, i, 1)
			if (c == "{") { depth++; continue }
			if (c == "}") { if (depth > 0) depth--; continue }
			top = top (depth == 0 ? c : (c == "\n" ? "\n" : " "))
		}
		gsub(/\n/, " ", top)
		while (match(top, /[A-Za-z0-9_]*vmmrt_[a-z0-9_]+[ \t]*\(/)) {
			name = substr(top, RSTART, RLENGTH)
			top = substr(top, RSTART + RLENGTH)
			sub(/[ \t]*\($/, "", name)
			if (name ~ /^vmmrt_/ && !(name in seen)) {
				seen[name] = 1
				print name
			}
		}
	}' "$header"
}

# The full page behind man3/<name>.3: itself, or the target of its .so line.
full_page() {
	f=$mandir/man3/$1.3
	[ -f "$f" ] || return 1
	so=$(sed -n '/^\.\\"/d; /^[[:space:]]*$/d; p' "$f" | head -n 1 | sed -n 's/^\.so[[:space:]]\{1,\}//p')
	if [ -n "$so" ]; then
		target=$mandir/$so
		[ -f "$target" ] || return 2
		if grep -q '^\.so[[:space:]]' "$target"; then
			return 3 # a link to a link
		fi
		echo "$target"
	else
		echo "$f"
	fi
	return 0
}

# The NAME section of a page, as one line.
name_section() {
	awk '/^\.SH[ \t]+"?NAME"?[ \t]*$/ { on = 1; next } /^\.SH/ { on = 0 } on' "$1" | tr '\n' ' '
}

# The SYNOPSIS section of a page.
synopsis_section() {
	awk '/^\.SH[ \t]+"?SYNOPSIS"?[ \t]*$/ { on = 1; next } /^\.SH/ { on = 0 } on' "$1"
}

declared_functions | sort >"$tmpdir/functions"

# -------------------------------------------- 3. a page for every function
t3() {
	rc=0
	if [ ! -s "$tmpdir/functions" ]; then
		echo "no function found in $header"
		return 1
	fi
	while read -r fn; do
		page=$(full_page "$fn")
		case $? in
		0) ;;
		1) echo "$fn: no page man/man3/$fn.3"; rc=1; continue ;;
		2) echo "$fn: man/man3/$fn.3 links to a page that does not exist"; rc=1; continue ;;
		*) echo "$fn: man/man3/$fn.3 links to another link"; rc=1; continue ;;
		esac
		if ! name_section "$page" | tr -d '\\' | grep -qw -- "$fn"; then
			echo "$fn: not named in the NAME section of ${page#"$srcdir"/}"
			rc=1
		fi
		if ! synopsis_section "$page" | grep -q -- "[^A-Za-z0-9_]$fn("; then
			echo "$fn: not declared in the SYNOPSIS of ${page#"$srcdir"/}"
			rc=1
		fi
	done <"$tmpdir/functions"
	return $rc
}
if t3 >"$tmpdir/t3" 2>&1; then
	echo "ok 3 - every public function of vmmrt.h has a man3 page ($(wc -l <"$tmpdir/functions" | tr -d ' ') functions)"
else
	diag "$tmpdir/t3"
	echo "not ok 3 - every public function of vmmrt.h has a man3 page"
fi

# ------------------------------------------ 4. no page without its function
t4() {
	rc=0
	for f in "$mandir"/man3/*.3; do
		[ -f "$f" ] || continue
		base=$(basename "$f" .3)
		if ! grep -qx -- "$base" "$tmpdir/functions"; then
			echo "man/man3/$base.3: vmmrt.h declares no function $base"
			rc=1
		fi
		full_page "$base" >/dev/null
		case $? in
		0) ;;
		2) echo "man/man3/$base.3: .so target does not exist"; rc=1 ;;
		*) echo "man/man3/$base.3: .so target is itself a link"; rc=1 ;;
		esac
	done
	return $rc
}
if t4 >"$tmpdir/t4" 2>&1; then
	echo "ok 4 - every man3 page documents a declared function"
else
	diag "$tmpdir/t4"
	echo "not ok 4 - every man3 page documents a declared function"
fi
exit 0
