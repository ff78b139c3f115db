#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# Planted bugs, in TAP: each must make a short torture run fail, and for the
# right reason. The testing library's switch (vmmrt__offload_test_plant)
# drops a ping-pong fence, or (remap) queues the release after a forward at
# once instead of after its D2H. Fault-free runs, so the only bug is the
# planted one; each stops at its first failure.
#   forward-fence   a forward overwrites a bank while its D2H still reads it: corrupted
#   backward-fence  a restore overwrites a bank a backward still reads: corrupted
#   early-release   memory goes before the D2H read it: a fault (or corrupted), or
#                   the runtime's own check refuses the release it finds done
#                   already ("release after use", a named error; about 1 run
#                   in 30 on the host backend, whichever the threads reach first)

torture=${TORTURE:-./tools/vmmrt-torture}
secs=${TORTURE_PLANTED:-25}
slow=""
if [ "${TORTURE_SANITIZER:-}" = thread ]; then
	slow="--timeout=6000 --watchdog=240"
	# The planted bug is a real race, and catching it is the torture's job
	# here: ThreadSanitizer's report of it would only change the exit status.
	TSAN_OPTIONS="${TSAN_OPTIONS:-} report_bugs=0"
	export TSAN_OPTIONS
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmrt-planted.XXXXXX") || { echo "1..0 # SKIP no temporary directory"; exit 0; }
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "1..3"
n=0
plant() { # plant BUG STRATEGY PATTERN
	n=$((n + 1))
	start=$(date +%s)
	"$torture" --plant="$1" --strategy="$2" --duration="$secs" --threads=2 --progress=0 --fault-rate=0 \
		--delay-rate=0 --stall=0 --lookahead=0-1 $slow >"$tmp/out" 2>&1
	rc=$?
	took=$(($(date +%s) - start))
	if [ $rc -eq 1 ] && grep -q "$3" "$tmp/out" && grep -q '^SUMMARY result=FAIL' "$tmp/out"; then
		echo "ok $n - --plant=$1 is caught (${took}s)"
	else
		echo "not ok $n - --plant=$1 is caught (exit $rc after ${took}s; want 1 and /$3/)"
	fi
	sed 's/^/# /' "$tmp/out"
}

plant forward-fence pingpong '^FAIL corrupted'
plant backward-fence pingpong '^FAIL corrupted'
plant early-release remap '^FAIL \(corrupted\|crash\|lost\|unexpected-error: .*release after use\)'
exit 0
