#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# The GPU half of vmmrt.torch's checks, in one batch for the H200: the pytest
# suite (its GPU tests run there, the CPU ones too), then the benchmark's
# tables. Every log and JSON goes to $OUT (./gpu-out without it); the last
# lines printed are a summary. Run from the built release tree or a checkout:
#
#   bash .gpu/on-device.sh 'make check' 'bash python/tests/gpu_run.sh'
#
# The library: $VMMRT_LIBRARY, else <tree>/.libs/libvmmrt.so.1, else the one
# on-device.sh built under /tmp/build/libvmmrt-*/. Its dependencies (liburcu,
# ck) are in /opt/deps there. GPU_RUN_QUICK=1 runs the tests and the default
# table only; GPU_RUN_NO_PYTEST=1 leaves out pytest (make check's
# tests/python.sh runs the same tests). Expected on an H200: pytest ~1.5 min,
# the default table ~2 min, the three other tables ~1 min each.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "$here/../.." && pwd)
out=${OUT:-$tree/gpu-out}
mkdir -p "$out"
py=${PYTHON:-python3}

. "$here/gpu_env.sh"

summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

note "gpu_run: library ${VMMRT_LIBRARY:-<not found>}, tree $tree, out $out"
{ nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1
  "$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
    torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")' 2>&1
  "$py" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1; } | tee "$out/env.txt"

step() { # step NAME TIMEOUT COMMAND...: log to $out/NAME.log, note the status
	name=$1 limit=$2
	shift 2
	t0=$(date +%s)
	timeout "$limit" "$@" >"$out/$name.log" 2>&1
	rc=$?
	note "$name: rc $rc ($(($(date +%s) - t0)) s) -> $out/$name.log"
	return $rc
}

if [ -z "${GPU_RUN_NO_PYTEST:-}" ]; then
	step pytest 300 "$py" -m pytest -p no:cacheprovider -rs -v "$tree/python/tests" --junitxml="$out/pytest.xml"
	grep -E "passed|failed|error" "$out/pytest.log" | tail -1 | tee -a "$summary"
	grep -E "^(FAILED|ERROR)" "$out/pytest.log" | tee -a "$summary"
fi

bench() { # bench NAME LIMIT ARGS...
	name=$1 limit=$2
	shift 2
	step "$name" "$limit" "$py" -m vmmrt.torch.bench --json "$out/$name.json" "$@"
	grep -E "^\s+\[(met|MISSED)\]|FAILED" "$out/$name.log" | sed "s/^/$name: /" | tee -a "$summary"
}

bench bench-smoke 120 --smoke
bench bench 300                               # the default: 6 Llama-3-8B layers, seq 4096, every mode
if [ -z "${GPU_RUN_QUICK:-}" ]; then
	bench bench-s8192 180 --layer torch --seq 8192 --modes graph,none,pingpong,remap,planner
	bench bench-quarter 150 --layer torch --fraction 0.25 --modes graph,none,pingpong,remap
	bench bench-math 150 --layer torch --attention math --layers 3 --lookahead 2 \
		--modes graph,none,pingpong,remap,planner
fi
note "gpu_run: done; tables in $out/bench*.log, numbers in $out/bench*.json"
