#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# The report of a hang, in TAP: with --selftest-hang every driver worker
# blocks for ever in its first VMM call (inside the fault hook, in
# t_selftest_hang), so a torture thread waits for it with no end and the
# watchdog (--watchdog=2) fails the run. The report must say where every
# thread is (vmmrt-torture(1), "Stacks"):
#   1. the run fails as a hang: exit status 1, the watchdog's "FAIL hang";
#   2. the stacks follow, one header per thread (several), each with its
#      State: and wchan, the hung torture thread's first; SUMMARY stays last;
#   3. a vmmrt-drv- worker is among them, and the frames under its header
#      show where it blocks (t_selftest_hang, t_fault_hook: the executable's
#      symbols, -rdynamic), as MODULE+OFFSET (SYMBOL+OFFSET) lines;
#   4. addr2line names the function of the worker's MODULE+OFFSET frame
#      (skipped without addr2line).
# Environment: TORTURE (the binary), TORTURE_SANITIZER (thread: a longer watchdog).

torture=${TORTURE:-./tools/vmmrt-torture}
wd=2
[ "${TORTURE_SANITIZER:-}" = thread ] && wd=10
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmrt-hang.XXXXXX") || { echo "1..0 # SKIP no temporary directory"; exit 0; }
trap 'rm -rf "$tmp"' EXIT INT TERM

echo "1..4"
# timeout(1), where there is one, ends a run whose watchdog failed to fire.
guard=""
command -v timeout >/dev/null 2>&1 && guard="timeout 120"
start=$(date +%s)
$guard "$torture" --selftest-hang --watchdog=$wd --duration=60 --threads=2 --progress=0 \
	--fault-rate=0 --delay-rate=0 --stall=0 >"$tmp/out" 2>&1
rc=$?
took=$(($(date +%s) - start))
out=$tmp/out

# 1. a hang, reported by the watchdog
hung=$(sed -n 's/^FAIL hang: .*: thread \([0-9][0-9]*\) made no progress .*/\1/p' "$out" | head -n 1)
if [ $rc -eq 1 ] && [ -n "$hung" ] && ! grep -q '^FAIL crash' "$out" &&
   grep -q '^SUMMARY result=FAIL .* hangs=[1-9]' "$out"; then
	echo "ok 1 - the run fails as a hang of torture thread $hung (exit 1 after ${took}s)"
else
	echo "not ok 1 - the run fails as a hang (exit $rc after ${took}s; want 1, the watchdog's FAIL hang, hangs>0)"
fi

# 2. one header per thread, between STACKS and END STACKS, the hung thread's
# first, then the SUMMARY line last
sed -n '/^STACKS /,/^END STACKS$/p' "$out" >"$tmp/stacks"
headers=$(grep -c "^thread [0-9][0-9]* '[^']*'.*: State: .*, wchan: " "$tmp/stacks")
first=$(grep -m1 '^thread ' "$tmp/stacks")
if [ "$headers" -ge 4 ] && grep -q '^END STACKS$' "$tmp/stacks" &&
   sed -n '/^END STACKS$/,$p' "$out" | tail -n 1 | grep -q '^SUMMARY ' &&
   echo "$first" | grep -q "(torture thread $hung)"; then
	echo "ok 2 - $headers thread headers, the hung thread's first"
else
	echo "not ok 2 - thread headers ($headers; want 4 or more, torture thread ${hung:-?} first, END STACKS, then SUMMARY)"
fi

# 3. a driver worker's frames show where it blocks
awk -v q="'" '$0 ~ ("^thread [0-9]+ " q "vmmrt-drv-[0-9]+" q) { w = 1; print; next }
     /^thread / { w = 0 }
     w' "$tmp/stacks" >"$tmp/worker"
if grep -q "^thread [0-9]* 'vmmrt-drv-[0-9]*'" "$tmp/worker" &&
   grep -q '^  #[0-9][0-9]* /.*+0x[0-9a-f]* (t_selftest_hang+0x[0-9a-f]*)$' "$tmp/worker" &&
   grep -q '^  #[0-9][0-9]* /.*+0x[0-9a-f]* (t_fault_hook+0x[0-9a-f]*)$' "$tmp/worker"; then
	echo "ok 3 - a vmmrt-drv- worker's frames show it in t_selftest_hang, called by t_fault_hook"
else
	echo "not ok 3 - a vmmrt-drv- worker's frames show it in t_selftest_hang, called by t_fault_hook"
fi

# 4. its MODULE+OFFSET resolves with addr2line
frame=$(grep -m1 '(t_selftest_hang+0x' "$tmp/worker" | sed 's/^  #[0-9]* \([^ ]*\) .*/\1/')
module=${frame%+*}
offset=${frame##*+}
if ! command -v addr2line >/dev/null 2>&1; then
	echo "ok 4 - addr2line resolves the frame # SKIP no addr2line"
elif [ -n "$frame" ] && addr2line -f -e "$module" "$offset" 2>/dev/null | head -n 1 | grep -qx 't_selftest_hang'; then
	echo "ok 4 - addr2line -f -e $module $offset names t_selftest_hang"
else
	echo "not ok 4 - addr2line resolves the frame '$frame'"
fi
sed 's/^/# /' "$out"
exit 0
