#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# Runs one test (its command line) under a time limit, so that a test that
# hangs, a deadlock say, fails make check with a message instead of holding
# it for ever: after TEST_TIMEOUT_S seconds (tests.mk sets it: 300, 1800
# under ThreadSanitizer; not a VMMRT_* name, which the library would take
# for a mistyped option) the test and its children get SIGTERM, then SIGKILL
# ten seconds later, and the TAP stream ends with a "Bail out!" that names
# the test and the limit. Without timeout(1) the test runs unbounded.
limit=${TEST_TIMEOUT_S:-300}
# A test that is long by nature (a whole suite in one TAP stream) says so in
# its own first lines, "# test-timeout-s: N": the larger limit applies.
for script; do :; done
if [ -f "$script" ]; then
	own=$(head -n 20 "$script" 2>/dev/null | sed -n 's/^# test-timeout-s: *\([0-9][0-9]*\).*/\1/p' | head -n 1)
	if [ -n "$own" ] && [ "$own" -gt "$limit" ]; then
		limit=$own
	fi
fi
if ! command -v timeout >/dev/null 2>&1; then
	exec "$@"
fi
timeout -k 10 "$limit" "$@"
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
	echo "Bail out! $* did not finish in $limit s: a hang (TEST_TIMEOUT_S sets the limit)"
fi
exit $rc
