#!/bin/bash
# SPDX-License-Identifier: LGPL-2.1-or-later
# Issue #16 on the two-GPU machine (the nvidia-h200-x2 kind), in one batch:
# examples/torch_ddp.py under torchrun, one process and one libvmmrt runtime
# per GPU, DistributedDataParallel over NCCL with NVLink multicast off. Every
# log and JSON goes to $OUT (./ddp-out without it); the last lines printed are
# a summary with the table. Run from the built release tree or a checkout:
#
#   bash .gpu/on-device.sh 'bash python/tests/ddp_run.sh'
#
# Steps (expected on two H200s, about 4 minutes in all):
#   ddp-smoke       every mode on a tiny shape (a minute at most)
#   ddp             the table: 4 Llama-3-8B-shaped layers of vmmrt.torch.bench
#                   (hidden 4096, ffn 14336, 32/8 heads, seq 4096, batch 1 per
#                   rank, bf16) with sdpa's deterministic math attention:
#                   graph-only, vmmrt none / pingpong / remap / planner, eager,
#                   eager offload; gradients after the all-reduce bitwise
#                   against the same DDP run without offload, per rank
#   ddp-bucketview  DDP's gradient_as_bucket_view and find_unused_parameters
#   pytest-ddp      python/tests/test_ddp.py (the two-GPU tests run here)
# While they run, nvidia-smi samples which process holds memory on which GPU
# ($OUT/gpu-apps.log): each rank's process must appear on its own GPU only.
#
# The library: $VMMRT_LIBRARY, else <tree>/.libs/libvmmrt.so.1, else the one
# on-device.sh built under /tmp/build/libvmmrt-*/ (its dependencies in
# /opt/deps). DDP_NPROC sets the number of ranks (default: every GPU);
# DDP_RUN_QUICK=1 runs the smoke step and pytest only; DDP_RUN_NO_PYTEST=1
# leaves pytest out (it is skipped, with a note, where python3 has none).
set -u
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "$here/../.." && pwd)
out=${OUT:-$tree/ddp-out}
mkdir -p "$out"
py=${PYTHON:-python3}

. "$here/gpu_env.sh"
# NVLink multicast stays off (NVLS in NCCL, and PyTorch's symmetric memory on it).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
# vmmrt.torch takes each rank's device from LOCAL_RANK; nothing may override it.
unset VMMRT_DEVICE

summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
nproc=${DDP_NPROC:-$gpus}
note "ddp_run: library ${VMMRT_LIBRARY:-<not found>}, tree $tree, out $out, $gpus GPU(s), $nproc rank(s)"
if [ "$gpus" -lt 2 ]; then
	note "ddp_run: WARNING: $gpus GPU(s) visible; issue #16 needs two (the nvidia-h200-x2 kind)"
fi
[ "$nproc" -ge 1 ] || { note "ddp_run: no GPU: nothing to run here (the CPU version is make check's test_ddp.py)"; exit 1; }
{ nvidia-smi -L 2>&1
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv 2>&1
  nvidia-smi topo -m 2>&1
  "$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
    "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1
  env | grep -E '^(NCCL_|TORCH_SYMM|CUDA_VISIBLE)' | sort; } | tee "$out/env.txt"

# Which process holds memory on which GPU, once a second, while the jobs run.
nvidia-smi --query-gpu=index,uuid --format=csv,noheader >"$out/gpus.csv" 2>&1
( while :; do
	nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits 2>/dev/null |
		sed "s/^/$(date +%s) /"
	sleep 1
  done ) >"$out/gpu-apps.log" 2>&1 &
sampler=$!
trap 'kill "$sampler" 2>/dev/null' EXIT

step() { # step NAME TIMEOUT COMMAND...: log to $out/NAME.log, note the status
	name=$1 limit=$2
	shift 2
	t0=$(date +%s)
	timeout -k 15 "$limit" "$@" >"$out/$name.log" 2>&1
	rc=$?
	note "$name: rc $rc ($(($(date +%s) - t0)) s) -> $out/$name.log"
	[ "$rc" -eq 0 ] || failed="$failed $name"
	return $rc
}
failed=

# torch 1.13's launcher on Python 3.11 cannot parse its default "--redirects 0":
# its output goes through its tee there (a CPU dry run; the GPU machine has 2.x).
launch_fix=
if "$py" -c 'import sys; from torch.distributed.elastic.multiprocessing.api import Std
sys.exit(Std.from_str("0") is not None)' 2>/dev/null; then
	launch_fix="--redirects 1 --tee 1"
fi

ddp() { # ddp NAME LIMIT ARGS...: the example under torchrun, then its verdicts
	name=$1 limit=$2
	shift 2
	# shellcheck disable=SC2086
	step "$name" "$limit" "$py" -m torch.distributed.run --standalone --nproc_per_node="$nproc" $launch_fix \
		"$tree/examples/torch_ddp.py" --timeout $((limit - 30)) --json "$out/$name.json" "$@"
	sed 's/^\[default[0-9]*\]://' "$out/$name.log" | grep -E "^\s+\[(ok|FAILED)\] |FAILED:" |
		sed "s/^/$name: /" | tee -a "$summary"
}

ddp ddp-smoke 90 --smoke
if [ -z "${DDP_RUN_QUICK:-}" ]; then
	ddp ddp 240 --layers 4 --iterations 8
	ddp ddp-bucketview 120 --layers 2 --iterations 5 --gradient-as-bucket-view --find-unused-parameters \
		--modes graph,pingpong,remap,eager,eager-pingpong
fi
if [ -n "${DDP_RUN_NO_PYTEST:-}" ]; then
	note "pytest-ddp: left out (DDP_RUN_NO_PYTEST)"
elif ! "$py" -c 'import pytest' >/dev/null 2>&1; then
	note "pytest-ddp: skipped: $py has no pytest (make check's tests/python.sh runs test_ddp.py where one has)"
else
	step pytest-ddp 150 "$py" -m pytest -p no:cacheprovider -rs -v "$tree/python/tests/test_ddp.py" \
		--junitxml="$out/pytest-ddp.xml"
	grep -E "passed|failed|error" "$out/pytest-ddp.log" | tail -1 | tee -a "$summary"
	grep -E "^(FAILED|ERROR)" "$out/pytest-ddp.log" | tee -a "$summary"
fi

kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
# Per rank of the main run: the GPUs its process held memory on, and the most it held.
"$py" - "$out" 2>&1 <<'EOF' | tee -a "$summary"
import json, os, sys
out = sys.argv[1]
uuid = {}
for line in open(os.path.join(out, "gpus.csv")):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2:
        uuid[parts[1]] = parts[0]
seen = {}
for line in open(os.path.join(out, "gpu-apps.log")):
    parts = line.replace(",", " ").split()
    if len(parts) == 4 and parts[1].isdigit():
        pid, gpu, mib = int(parts[1]), uuid.get(parts[2], parts[2]), parts[3]
        cur = seen.setdefault(pid, {})
        cur[gpu] = max(cur.get(gpu, 0), int(mib) if mib.isdigit() else 0)
for name in ("ddp", "ddp-smoke"):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        continue
    ranks = json.load(open(path))["ranks"]
    for r in ranks:
        gpus = seen.get(r["pid"])
        if not gpus:
            print("%s: rank %d (pid %d): not in nvidia-smi's process list (a PID namespace?)" % (name, r["rank"], r["pid"]))
            continue
        own = r["device"].split(":")[-1]
        print("%s: rank %d (pid %d, %s): memory on GPU %s (max MiB: %s)%s" % (
            name, r["rank"], r["pid"], r["device"], ",".join(sorted(gpus)),
            ", ".join("%s: %d" % kv for kv in sorted(gpus.items())),
            "" if set(gpus) == {own} else "  <- NOT only its own GPU"))
    break
EOF
if [ -f "$out/ddp.log" ]; then
	echo
	sed 's/^\[default[0-9]*\]://' "$out/ddp.log" | sed -n '/^DDP, /,/^command:/p' | tee -a "$summary"
fi
if [ -n "$failed" ]; then
	note "ddp_run: done, FAILED:$failed; logs and JSON in $out"
	exit 1
fi
note "ddp_run: done, every step passed; logs and JSON in $out"
