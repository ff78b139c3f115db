#!/bin/sh
# SPDX-License-Identifier: LGPL-2.1-or-later
# vmmrt-bench smoke test, in TAP: every mode on the host backend with a tiny
# model, with --json and --trace. The exit status must be 0, naive must be
# reported failing (the negative case stays visible), the others verified, and
# both files must parse. python3 checks them where it exists; otherwise grep
# checks the keys (a Debian base image may have no python3).
# Runs from the build directory (make check); BENCH_PROGRAM overrides the binary.

bench=${BENCH_PROGRAM:-./tools/vmmrt-bench}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmmrt-bench-smoke.XXXXXX") || {
	echo "1..0 # SKIP cannot create a temporary directory"
	exit 0
}
trap 'rm -rf "$tmp"' EXIT INT TERM
# A user's VMMRT_MODE or VMMRT_TRACE would change what the rows mean.
unset VMMRT_MODE VMMRT_TRACE VMMRT_BACKEND

n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() {
	n=$((n + 1))
	fails=$((fails + 1))
	echo "not ok $n - $1"
	[ -n "${2:-}" ] && [ -f "$2" ] && sed 's/^/# /' "$2"
}
check() { # check DESCRIPTION LOG COMMAND...: LOG (or the command's output) is shown on failure
	d=$1
	log=$2
	shift 2
	if "$@" >"$tmp/check.log" 2>&1; then ok "$d"; else not_ok "$d" "${log:-$tmp/check.log}"; fi
}

echo "1..7"

if [ ! -x "$bench" ]; then
	not_ok "vmmrt-bench is built ($bench)"
	exit 1
fi

model="--backend=host --layers=3 --activation-mib=2 --iterations=2 --warmup=1 --fwd-ms=1 --bwd-ms=2 --quiet"
if [ "${TORTURE_SANITIZER:-}" = thread ]; then
	# naive reads a slot while a copy writes it, on purpose (it shows what the
	# fences are for): a data race ThreadSanitizer rightly reports. It runs
	# apart, with reports off for that run only; every other mode runs under
	# ThreadSanitizer as usual, and the JSON then has no naive row.
	"$bench" $model --modes=eager,eager-offload,graph,pingpong,remap,remap-inline \
		--json="$tmp/bench.json" --trace="$tmp/trace.json" >"$tmp/out" 2>&1
	rc=$?
	TSAN_OPTIONS="${TSAN_OPTIONS:-} report_bugs=0" "$bench" $model --modes=naive >>"$tmp/out" 2>&1 || rc=$?
	no_naive=1
else
	"$bench" $model --json="$tmp/bench.json" --trace="$tmp/trace.json" >"$tmp/out" 2>&1
	rc=$?
	no_naive=0
fi
check "all modes run and come out as expected (exit status $rc)" "$tmp/out" test "$rc" -eq 0

check "the table reports naive failing verification" "" grep -q '^naive .*no (expected)' "$tmp/out"

if command -v python3 >/dev/null 2>&1; then
	check "the JSON parses" "" python3 -m json.tool "$tmp/bench.json" /dev/null
	cat >"$tmp/check.py" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
keys = ["mode", "iter_ms_median", "iter_ms_p90", "vs_graph_ratio", "activation_device_bytes",
        "peak_device_bytes", "d2h_gbps", "h2d_gbps", "bwd_gap_us_median", "driver_call_us_p99",
        "launch_thread_blocking_calls", "verified"]
assert d["backend"] == "host" and "device" in d and d["layers"] == 3, "top level"
modes = {m["mode"]: m for m in d["modes"]}
want = {"eager", "eager-offload", "graph", "pingpong", "remap", "remap-inline", "naive"}
if sys.argv[2] == "1":
    want.discard("naive")  # ThreadSanitizer build: naive ran apart
assert set(modes) == want, modes
for name, m in modes.items():
    for k in keys:
        assert k in m, (name, k)
    if m["skipped"]:
        continue
    assert m["verified"] == (name != "naive"), (name, m["verified"])
    assert m["iter_ms_median"] > 0, name
assert modes["graph"]["vs_graph_ratio"] == 1, "graph's own ratio"
assert modes["pingpong"]["d2h_gbps"] and modes["remap"]["h2d_gbps"], "copy bandwidth"
EOF
	check "the JSON has every key, naive unverified and the rest verified" "" \
		python3 "$tmp/check.py" "$tmp/bench.json" "$no_naive"
	cat >"$tmp/trace.py" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
x = [e for e in ev if e["ph"] == "X"]
tracks = {names.get((e["pid"], e["tid"]), "") for e in x}
for want in ("compute", "d2h", "h2d"):
    assert want in tracks, (want, tracks)
assert any(e["name"].startswith("cuMem") for e in x), "driver calls"
assert all(e["dur"] >= 0 for e in x), "negative durations"
# merged from each mode's runtime trace: one "MODE runtime" span per mode, on
# one clock (one after the other), and each mode's driver calls inside its own
runs = sorted((e["ts"], e["ts"] + e["dur"], e["name"][:-len(" runtime")]) for e in x
              if names.get((e["pid"], e["tid"])) == "bench" and e["name"].endswith(" runtime"))
want = ["eager", "eager-offload", "graph", "pingpong", "remap", "remap-inline", "naive"]
if sys.argv[2] == "1":
    want.remove("naive")
assert [r[2] for r in runs] == want, runs
assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:])), ("modes overlap", runs)
span = {r[2]: r for r in runs}
for e in x:
    n = names.get((e["pid"], e["tid"]), "")
    if e["pid"] == 1 and n != "launch thread":
        mode = n.rsplit(" ", 1)[0]
        assert mode in span and span[mode][0] <= e["ts"], (n, e)
assert "launch thread" in names.values(), "the launch thread's track"
EOF
	check "the trace parses, with spans on compute, d2h and h2d and driver calls, every mode on one clock" "" \
		python3 "$tmp/trace.py" "$tmp/trace.json" "$no_naive"
else
	check "the JSON has the mode keys (grep: no python3)" "" \
		grep -q '"launch_thread_blocking_calls"' "$tmp/bench.json"
	check "the JSON reports naive unverified (grep)" "" \
		sh -c "[ $no_naive = 1 ] || grep -q '\"mode\": \"naive\", .*\"verified\": false' '$tmp/bench.json'"
	check "the trace has compute, d2h, h2d tracks, driver calls and each mode's runtime (grep)" "" sh -c \
		"grep -q '\"name\":\"compute\"' '$tmp/trace.json' && grep -q '\"name\":\"d2h\"' '$tmp/trace.json' &&
		 grep -q '\"name\":\"h2d\"' '$tmp/trace.json' && grep -q '\"name\":\"cuMemCreate\"' '$tmp/trace.json' &&
		 grep -q '\"ph\":\"X\",\"pid\":2' '$tmp/trace.json' && grep -q '\"name\":\"eager runtime\"' '$tmp/trace.json' &&
		 grep -q '\"name\":\"remap-inline runtime\"' '$tmp/trace.json' &&
		 grep -q '\"name\":\"remap vmmrt-drv-0\"' '$tmp/trace.json'"
fi

"$bench" --modes=eager,bogus >"$tmp/usage" 2>&1
rc=$?
check "an unknown mode is a usage error (exit status $rc)" "$tmp/usage" test "$rc" -eq 2

# One pipeline stage's 1F1B: the library modes declare the order, and each
# one's steady-state activation peak stays within the schedule's bound.
"$bench" $model --schedule=1f1b --inflight=2 --microbatches=3 --modes=graph,pingpong,remap >"$tmp/1f1b" 2>&1
rc=$?
check "1F1B with 2 microbatches in flight: verified, every library mode within its bound (exit status $rc)" \
	"$tmp/1f1b" sh -c "test $rc -eq 0 && test \$(grep -c ': within$' '$tmp/1f1b') -eq 3"

[ "$fails" -eq 0 ]
