#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# The comments of the sources name only what exists, in TAP. In every
# comment of src/, include/, tools/ and tests/ (C files), and in every
# comment and docstring of the Python package (python/vmmrt; with python3):
#   1. a file (a word ending in .c .h .cu .md .mk .sh .py .am .ac) is a file
#      of the tree: the path from the top, from the commenting file's
#      directory or from src/, or, for a bare name, any file of that name;
#      or a header the code includes with <...>;
#   2. a function (a word followed by "()") is an identifier of the code or
#      a function of the C library and the CUDA driver the code calls;
#   3. a vmmrt name (vmmrt_*, vmmrt__*, VMMRT_*: a function, a type, a macro,
#      an option's variable) is an identifier or a string of the code.
# The code is the same files' text outside comments (string literals
# included: the option table names its variables there).
# Run it from anywhere: sh tests/comment-refs.sh (make check does).
# Environment: srcdir (the top source directory; by default the one above
# this script).
set -u
srcdir=${srcdir:-$(dirname "$0")/..}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmrt-comment-refs.XXXXXX") || { echo "1..0 # SKIP no temporary directory"; exit 0; }
trap 'rm -rf "$tmp"' EXIT INT TERM
echo "1..3"

result() { # result N WHAT COUNTS PROBLEMS
	if [ -z "$4" ]; then
		echo "ok $1 - $2 ($3)"
	else
		echo "not ok $1 - $2"
		printf '%s\n' "$4"
	fi
}

cd "$srcdir" || { echo "not ok 1 - no source directory $srcdir"; exit 0; }
# Every file of the tree (what a comment may name), and the C files read.
find . -path ./.git -prune -o -path ./autom4te.cache -prune -o -type f -print | sed 's|^\./||' |
	LC_ALL=C sort >"$tmp/tree"
grep -E '^(src|include|tools|tests)/.*\.(c|h|cu)$' "$tmp/tree" | grep -v '_fatbin\.c$' >"$tmp/sources"

# Split each source into its comments ("file<TAB>line<TAB>text", one line of
# comment each) and its code (the rest, strings kept), in one pass.
# shellcheck disable=SC2046
awk -v comments="$tmp/comments" -v code="$tmp/code" '
	FNR == 1 { state = 0 }
	{
		line = $0; out = ""; text = ""; i = 1; n = length(line)
		if (state == 2) state = 0 # a // comment ends with its line
		while (i <= n) {
			c = substr(line, i, 1); c2 = substr(line, i, 2)
			if (state == 1) { # in /* */
				if (c2 == "*/") { state = 0; i += 2; continue }
				text = text c; i++; continue
			}
			if (state == 3) { # in a string or a character constant
				out = out c
				if (c == "\\") { out = out substr(line, i + 1, 1); i += 2; continue }
				if (c == quote) state = 0
				i++; continue
			}
			if (c2 == "/*") { state = 1; i += 2; text = text " "; continue }
			if (c2 == "//") { text = text " " substr(line, i + 2); i = n + 1; state = 2; continue }
			if (c == "\"" || c == "\047") { state = 3; quote = c; out = out " " c; i++; continue }
			out = out c; i++
		}
		if (state == 3) state = 0
		if (text ~ /[^ \t]/) print FILENAME "\t" FNR "\t" text >comments
		print out >code
	}' $(cat "$tmp/sources")
touch "$tmp/comments"
# The Python package's comments and docstrings, and its code, the same way
# (its identifiers count as the code's, and Python's builtins as outside ones).
if command -v python3 >/dev/null 2>&1; then
	find python/vmmrt -name '*.py' | LC_ALL=C sort >"$tmp/pysources"
	# shellcheck disable=SC2046
	python3 - "$tmp/comments" "$tmp/code" $(cat "$tmp/pysources") <<'PY' || echo "# the Python sources could not be read"
import ast, builtins, io, sys, tokenize
comments, code = open(sys.argv[1], "a"), open(sys.argv[2], "a")
code.write("\n".join(dir(builtins)) + "\n")
for path in sys.argv[3:]:
    src = open(path, encoding="utf-8").read()
    docs = set()                # where each docstring starts
    for node in ast.walk(ast.parse(src)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docs.add((first.lineno, first.col_offset))
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            lines = [tok.string[1:]]
        elif tok.type == tokenize.STRING and tok.start in docs:
            lines = tok.string.split("\n")
        else:
            code.write(tok.string + "\n")
            continue
        for k, text in enumerate(lines):
            if text.strip():
                comments.write("%s\t%d\t%s\n" % (path, tok.start[0] + k, text.replace("\t", " ")))
PY
fi

# The identifiers of the code, and the functions it may name without
# defining them (the C library's, pthreads', the CUDA driver's, liburcu's).
tr -c 'A-Za-z0-9_' '\n' <"$tmp/code" | grep -E '^[A-Za-z_]' | LC_ALL=C sort -u >"$tmp/idents"

# 1. files
awk -F '\t' '{
	t = $3
	while (match(t, /[A-Za-z0-9_.\/+-]*[A-Za-z0-9_]\.(c|h|cu|md|mk|sh|py|am|ac)([^A-Za-z0-9_]|$)/)) {
		w = substr(t, RSTART, RLENGTH); t = substr(t, RSTART + RLENGTH)
		sub(/[^A-Za-z0-9_]$/, "", w); sub(/^[.\/]+/, "", w)
		print $1 "\t" $2 "\t" w
	}
}' "$tmp/comments" >"$tmp/files"
# A header from outside the tree is one the code includes (<cuda.h>, <urcu/wfcqueue.h>).
sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/\1/p' $(cat "$tmp/sources") | LC_ALL=C sort -u >"$tmp/system"
# A file the build writes (vmmrt/_config.py, by make install) is named in its makefiles.
cat configure.ac Makefile.am ./*.mk 2>/dev/null | grep -oE '[A-Za-z0-9_+-]+\.(c|h|py|sh|md|mk)' |
	LC_ALL=C sort -u >"$tmp/built"
bad1=$(awk -F '\t' 'FILENAME == ARGV[1] { outside[$1] = 1; next }
	FILENAME == ARGV[2] { built[$1] = 1; next }
	FILENAME == ARGV[3] { have[$1] = 1; n = split($1, p, "/"); base[p[n]] = 1; next }
	{
		f = $3; d = $1; sub(/\/[^\/]*$/, "", d)
		if (f in have || (d "/" f) in have || ("src/" f) in have) next
		if (f !~ /\// && f in base) next
		if (f in outside) next
		n = split(f, p, "/"); if (p[n] in built) next
		print "# " $1 ":" $2 ": names " f ", which is not in the tree"
	}' "$tmp/system" "$tmp/built" "$tmp/tree" "$tmp/files")
result 1 "every file a comment names exists" "$(wc -l <"$tmp/files") names" "$bad1"

# 2. functions: word(), where the word is the code's or a known outside one
awk -F '\t' '{
	t = $3
	while (match(t, /(^|[^A-Za-z0-9_])[A-Za-z_][A-Za-z0-9_]*\(\)/)) {
		w = substr(t, RSTART, RLENGTH - 2); t = substr(t, RSTART + RLENGTH)
		# a method of something else (torch.cuda.current_stream()) is not ours to check
		if (w ~ /^\./) continue
		sub(/^[^A-Za-z_]/, "", w)
		print $1 "\t" $2 "\t" w
	}
}' "$tmp/comments" >"$tmp/calls"
bad2=$(awk -F '\t' 'NR == FNR { have[$1] = 1; next }
	!($3 in have) { print $3 }' "$tmp/idents" "$tmp/calls" | LC_ALL=C sort -u >"$tmp/outside"
	# Not in the code: a function of a library it uses, when a header there declares it.
	while read -r w; do
		grep -rqsw -- "$w" /usr/include /usr/local/include /usr/local/cuda/include 2>/dev/null ||
			grep "	$w\$" "$tmp/calls" | awk -F '\t' '{ print "# " $1 ":" $2 ": names " $3 "(), which is no function of the code" }'
	done <"$tmp/outside")
result 2 "every function a comment names exists" "$(wc -l <"$tmp/calls") names" "$bad2"

# 3. vmmrt names
awk -F '\t' '{
	t = $3
	while (match(t, /(^|[^A-Za-z0-9_])(vmmrt_|VMMRT_)[A-Za-z0-9_]*/)) {
		w = substr(t, RSTART, RLENGTH); t = substr(t, RSTART + RLENGTH)
		sub(/^[^A-Za-z_]/, "", w)
		if (t ~ /^\.[a-z]/) continue # part of a file name (vmmrt_kernels.cu): 1 checks it
		# a family (vmmrt__cuda_<op>, VMMRT__DROP_*, the vmmrt_ prefix): the
		# prefix is what must exist
		if (substr(t, 1, 1) ~ /[<*]/ || w ~ /_$/) w = w "*"
		print $1 "\t" $2 "\t" w
	}
}' "$tmp/comments" >"$tmp/names"
bad3=$(awk -F '\t' 'NR == FNR { have[$1] = 1; ids[++n] = $1; next }
	{
		w = $3
		if (w ~ /\*$/) {
			p = substr(w, 1, length(w) - 1); ok = 0
			for (i = 1; i <= n && !ok; i++) ok = index(ids[i], p) == 1
			if (ok) next
		} else if (w in have) next
		print "# " $1 ":" $2 ": names " w ", which is not in the code"
	}' "$tmp/idents" "$tmp/names")
result 3 "every vmmrt name a comment gives exists" "$(wc -l <"$tmp/names") names" "$bad3"
exit 0
