#!/bin/sh
# The short torture of `make check`, in TAP (see vmmrt-torture(1)):
#   1. fault-free, both strategies, look-ahead 0-1: must pass;
#   2. every fault kind (failures, latency spikes, stalled workers), look-ahead 0-1;
#   3. fault-free, look-ahead 2.
# A run that hits a library bug reported and not fixed yet is listed in
# KNOWN_BUGS below: while it is listed, its failure is a TAP TODO (XFAIL in
# the summary, the FAIL lines in the log) rather than a failure. Fix the bug,
# then empty its line here: the run must then pass.
# Every run prints its seed; replay one with the command it prints.
# Environment: TORTURE (the binary), TORTURE_SHORT (seconds per run, default 12),
# TORTURE_SANITIZER (set by make check in ThreadSanitizer builds: longer timeouts).

torture=${TORTURE:-./tools/vmmrt-torture}
secs=${TORTURE_SHORT:-12}
# (#1, #2, #4, #8 and #9 of the torture report are fixed.) Open:
# - a rare SIGSEGV on a stream thread while a torture thread is inside
#   vmmrt_runtime_destroy on the host backend, seen once in about a dozen
#   short runs (CI, seed 0xd3e56d08a7d08ab0, scenario 0xe0921489bc70f60f;
#   replays do not reproduce it): most likely #17, which
#   tests/unit/test-torture-known.c reproduces every time. Only that exact
#   failure is a TODO.
# - #16, a failed cuEventQuery on a worker (also reproduced there): the run
#   with faults lists it.
KNOWN_CRASH_IN_DESTROY="rare SIGSEGV inside vmmrt_runtime_destroy on the host backend (seed 0xd3e56d08a7d08ab0; likely #17)"
KNOWN_BUGS_FAULTS="remap: a failed cuEventQuery ends a backward's release early and admission counts it, so a restore's map passes the group's pending forward release, which then unmaps the slot under the H2D (#16); remap teardown starts an H2D whose map only waited for a release in flight, which then unmaps the slot under it (#17); reproducers in tests/unit/test-torture-known.c"
KNOWN_BUGS_LOOKAHEAD2=""

# ThreadSanitizer makes everything many times slower: bound waits further out
# (a stall must still outlast the timeout). ASan and UBSan need no change.
slow=""
if [ "${TORTURE_SANITIZER:-}" = thread ]; then
	slow="--timeout=6000 --watchdog=240 --stall=7000"
	secs=${TORTURE_SHORT:-30}
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmrt-torture.XXXXXX") || { echo "1..0 # SKIP no temporary directory"; exit 0; }
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "1..3"
if [ ! -x "$torture" ]; then
	echo "not ok 1 - vmmrt-torture is built ($torture)"
	exit 1
fi

n=0
run() { # run DESCRIPTION KNOWN_BUG OPTIONS...
	d=$1
	known=$2
	shift 2
	n=$((n + 1))
	"$torture" --duration="$secs" --threads=2 --progress=0 $slow "$@" >"$tmp/out" 2>&1
	rc=$?
	summary=$(grep '^SUMMARY' "$tmp/out" | tail -n 1)
	if [ $rc -eq 0 ] && [ -n "$summary" ]; then
		echo "ok $n - $d"
	elif [ $rc -eq 1 ] && grep -q '^FAIL crash:' "$tmp/out" &&
	     grep -A1 '^FAIL crash:' "$tmp/out" | grep -q '(vmmrt_runtime_destroy)' &&
	     [ "$(grep -c '^FAIL' "$tmp/out")" -eq 1 ]; then
		# Only this failure, and only as a crash inside vmmrt_runtime_destroy:
		echo "not ok $n - $d # TODO known library bug: $KNOWN_CRASH_IN_DESTROY"
	elif [ -n "$known" ] && [ $rc -eq 1 ]; then
		echo "not ok $n - $d # TODO known library bug: $known"
	else
		echo "not ok $n - $d (exit $rc)"
	fi
	sed 's/^/# /' "$tmp/out"
}

run "fault-free, look-ahead 0-1" "" --fault-rate=0 --delay-rate=0 --stall=0 --lookahead=0-1
run "every fault kind, look-ahead 0-1" "$KNOWN_BUGS_FAULTS" --lookahead=0-1
run "fault-free, look-ahead 2" "$KNOWN_BUGS_LOOKAHEAD2" --fault-rate=0 --stall=0 --lookahead=2
exit 0
