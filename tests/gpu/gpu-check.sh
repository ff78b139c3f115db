#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# gpu-check.sh PROGRAM...: run the GPU test programs (cmocka, TAP output) and
# print a short table: program, test, result. Full logs go to $GPU_CHECK_LOGS
# (default: $OUT/gpu-check when OUT is set, else tests/gpu/test-gpu-check-logs
# under the current directory, a path .gitignore already covers).
# Exit status: 0 when nothing failed (skips included), 1 otherwise.
set -u
logs=${GPU_CHECK_LOGS:-${OUT:+$OUT/gpu-check}}
logs=${logs:-tests/gpu/test-gpu-check-logs}
mkdir -p "$logs" || exit 1
failed=0
table=$logs/table.txt
printf '%-22s %-36s %s\n' program test result >"$table"
for prog in "$@"; do
	name=$(basename "$prog")
	log=$logs/$name.log
	CMOCKA_MESSAGE_OUTPUT=TAP "$prog" >"$log" 2>&1
	rc=$?
	awk -v name="$name" -v rc="$rc" '
	/^1\.\.0+[ \t]*#/ {
		sub(/^[^#]*#[ \t]*(SKIP[: \t][ \t]*)?/, "")
		skipped = $0
		next
	}
	/^1\.\.[0-9]+/ { sub(/^1\.\./, ""); planned = $0 + 0; next }
	/^(not )?ok[ \t]/ {
		seen++
		result = ($0 ~ /^ok/) ? "PASS" : "FAIL"
		if ($0 ~ /#[ \t]*SKIP/)
			result = "SKIP"
		test = $0
		sub(/^(not )?ok[ \t]+[0-9]*[ \t]*(-[ \t]*)?/, "", test)
		sub(/^#[ \t]*SKIP[ \t]*/, "", test)
		printf "%-22s %-36s %s\n", name, test, result
		if (result == "FAIL")
			bad = 1
		next
	}
	END {
		if (skipped != "" || rc == 77) {
			printf "%-22s %-36s %s\n", name, "(all)", "SKIP: " (skipped != "" ? skipped : "exit 77")
			exit 0
		}
		if (seen < planned) {
			printf "%-22s %-36s %s\n", name, "(" planned - seen " not run)", "FAIL"
			bad = 1
		}
		if (planned == 0 && seen == 0) {
			printf "%-22s %-36s %s\n", name, "(no TAP output)", "FAIL: exit " rc
			bad = 1
		} else if (rc != 0 && !bad) {
			printf "%-22s %-36s %s\n", name, "(exit status)", "FAIL: exit " rc
			bad = 1
		}
		exit bad
	}' "$log" >>"$table" || failed=1
done
cat "$table"
if [ "$failed" -ne 0 ]; then
	echo "gpu-check: FAILED (logs in $logs)"
	exit 1
fi
echo "gpu-check: ok (logs in $logs)"
exit 0
