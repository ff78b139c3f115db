#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""vmmrt.torch under DistributedDataParallel: one libvmmrt runtime per rank.

    torchrun --standalone --nproc-per-node=2 examples/torch_ddp.py [--json PATH]
    torchrun --standalone --nproc-per-node=2 examples/torch_ddp.py --device cpu --smoke

Each process (rank) trains the same Llama-style decoder layers as
``python3 -m vmmrt.torch.bench`` (vmmrt.torch.bench.llama) on its own
microbatch, wrapped in DistributedDataParallel: on a GPU, on the device
torch.cuda.set_device(LOCAL_RANK) gave it, with NCCL; without one (or with
--device cpu), on CPU tensors with gloo, libvmmrt's host backend and eager
offload. Every mode is built from the same weights, runs the same per-rank
batch, and is compared per rank, after DDP's all-reduce, with the same DDP run
without offload: vmmrt's graph modes (none, pingpong, remap, planner) with
torch.cuda.make_graphed_callables ("graph"), its eager modes (eager-pingpong,
eager-remap) with the plain layers ("eager"). With deterministic kernels
(--attention math, the default, or the CPU) they must be bitwise equal, and
the all-reduced gradients must be the same on every rank. Rank 0 prints one
table: per mode and rank, the step time (the benchmark's set_to_none loop:
zeroing, forward, backward, AdamW's step; median, CUDA events), the ratio to
the run without offload, driver-level device memory between forward and
backward (graph pool, caching allocator, libvmmrt, the rest: CUDA context,
NCCL's buffers), bytes moved per step, the gradients against the reference
and whether the ranks agree; --json writes every number.

How the pieces fit (see doc/pytorch.md, "Several GPUs", and vmmrt(7)):

- one runtime per process: vmmrt.torch opens it on the device of the layers'
  tensors (libvmmrt's "device" option), here cuda:LOCAL_RANK; runtimes of
  different processes share nothing;
- make_graphed_callables first, then DistributedDataParallel around the
  returned modules; grads="static" (the default), so every parameter's
  gradient goes through autograd's AccumulateGrad and DDP's hooks after it,
  once the layer's backward graph and libvmmrt's backward hooks have run;
  grads="accumulate" is refused under DDP (its gradients would never be
  reduced);
- libvmmrt maps and unmaps only its own reservations: NCCL's buffers and
  DDP's buckets are never remapped;
- NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1, set here when unset).
"""
import os
import sys

# Before torch or NCCL read them.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
if any(a in ("--device=cpu",) for a in sys.argv) or any(
        a == "--device" and i + 1 < len(sys.argv) and sys.argv[i + 1] == "cpu" for i, a in enumerate(sys.argv)):
    os.environ["CUDA_VISIBLE_DEVICES"] = ""      # CPU tensors, host backend, wall-clock times

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import vmmrt  # noqa: E402
import vmmrt.torch as vt  # noqa: E402
from vmmrt.torch.bench import llama, loops, modes  # noqa: E402

MiB = float(1 << 20)
# Run in this order: each reference before the modes compared with it (and
# torch's own capture first, before any NCCL work exists).
ORDER = ("graph", "none", "pingpong", "remap", "planner", "eager", "eager-pingpong", "eager-remap")
REFERENCE = {"none": "graph", "pingpong": "graph", "remap": "graph", "planner": "graph",
             "eager-pingpong": "eager", "eager-remap": "eager"}
GRAPH_MODES = ("graph", "none", "pingpong", "remap", "planner")
NCCL_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
            "NCCL_CUMEM_ENABLE", "NCCL_ALGO", "NCCL_PROTO", "CUDA_VISIBLE_DEVICES", "VMMRT_DEVICE", "VMMRT_BACKEND")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default=None, help="comma-separated, from: %s (default: the graph modes, eager and "
                   "eager-pingpong on CUDA; eager, eager-pingpong and eager-remap on the CPU); a mode's reference "
                   "is added when missing" % ",".join(ORDER))
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1, help="per rank")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="default: bf16 (fp32 on CPU)")
    p.add_argument("--attention", choices=("auto", "flash", "math"), default="math",
                   help="math (default): deterministic kernels, gradients compared bitwise; auto/flash: in ulps")
    p.add_argument("--fraction", type=float, default=1.0, help="offload fraction of the vmmrt modes")
    p.add_argument("--lookahead", type=int, default=1)
    p.add_argument("--margin", type=float, default=0.9, help="the planner's safety factor")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--gradient-as-bucket-view", action="store_true", help="DDP's option")
    p.add_argument("--find-unused-parameters", action="store_true", help="DDP's option")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's option")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds before a stuck collective fails")
    p.add_argument("--smoke", action="store_true", help="a tiny shape: seconds")
    p.add_argument("--json", metavar="PATH", help="every number, written by rank 0")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.layers, a.seq, a.hidden, a.ffn, a.heads, a.kv_heads = 3, 256, 256, 704, 4, 2
        a.iterations, a.warmup = min(a.iterations, 3), min(a.warmup, 1)
    if a.dtype is None:
        a.dtype = "bf16" if a.device == "cuda" else "fp32"
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device")
    if a.modes is None:
        chosen = ["graph", "none", "pingpong", "remap", "planner", "eager", "eager-pingpong"] if a.device == "cuda" \
            else ["eager", "eager-pingpong", "eager-remap"]
    else:
        chosen = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in chosen:
        if m not in ORDER:
            p.error("unknown mode %r; modes are %s" % (m, ", ".join(ORDER)))
        if a.device == "cpu" and m in GRAPH_MODES:
            p.error("mode %r needs CUDA graphs; on the CPU: eager, eager-pingpong, eager-remap" % m)
    chosen += [REFERENCE[m] for m in chosen if m in REFERENCE]
    a.modes = [m for m in ORDER if m in chosen]
    return a


class Dist:
    """This process's place in the job: torchrun's variables (one process
    without them), its device, the process group."""

    def __init__(self, args):
        env = os.environ
        if "RANK" not in env:             # started without torchrun: a job of one
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            env.setdefault("MASTER_PORT", str(_free_port()))
            env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        self.rank = int(env["RANK"])
        self.world = int(env["WORLD_SIZE"])
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.cuda = args.device == "cuda"
        if self.cuda:
            if self.local_rank >= torch.cuda.device_count():
                raise SystemExit("rank %d: LOCAL_RANK %d but only %d CUDA devices are visible"
                                 % (self.rank, self.local_rank, torch.cuda.device_count()))
            # The device of this process: everything after this (the layers,
            # vmmrt.torch's runtime, NCCL) follows it.
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            self.backend = "nccl"
        else:
            self.device = torch.device("cpu")
            self.backend = "gloo"
        kw = dict(backend=self.backend, timeout=datetime.timedelta(seconds=args.timeout))
        if self.cuda and "device_id" in inspect.signature(dist.init_process_group).parameters:
            kw["device_id"] = self.device          # NCCL bound to this device from the start (torch >= 2.3)
        dist.init_process_group(**kw)

    def gather(self, obj):
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self):
        dist.destroy_process_group()


def _nccl_version():
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
    except Exception as e:
        return "? (%s)" % e


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quiesce(d):
    """Before torch captures a graph in its default ("global") capture mode:
    nothing NCCL enqueued may still be polled by its watchdog thread, whose
    event queries would invalidate the capture. (vmmrt.torch's captures here
    use capture_error_mode="thread_local", which other threads do not affect.)"""
    if d.cuda:
        torch.cuda.synchronize()
        time.sleep(1.0)


def build(mode, layers, shape, dtype, args, d):
    """The callables of one mode over layers (no collective): (sequence, Offload or None)."""
    def sample():
        return torch.randn(shape.batch, shape.seq, shape.hidden, device=d.device, dtype=dtype, requires_grad=True)

    samples = tuple((sample(),) for _ in layers)
    if mode == "eager":
        return list(layers), None
    if mode == "graph":
        return list(torch.cuda.make_graphed_callables(tuple(layers), samples)), None
    if mode.startswith("eager-"):
        how, graphs = mode[len("eager-"):], False
    else:
        how, graphs = ("pingpong" if mode == "planner" else mode), True
    kw = dict(mode=how, lookahead=args.lookahead, offload="auto" if mode == "planner" else args.fraction,
              margin=args.margin, graphs=graphs, names=["layer%d" % i for i in range(len(layers))])
    if graphs:
        kw["capture_error_mode"] = "thread_local"
    seq = vt.make_graphed_callables(tuple(layers), samples, **kw)
    return list(seq), vt.offload_of(seq[0])


def wrap(seq, args, d):
    """DistributedDataParallel around the graphed (or offloaded) modules."""
    model = torch.nn.Sequential(*seq)
    return DistributedDataParallel(model, device_ids=[d.local_rank] if d.cuda else None,
                                   gradient_as_bucket_view=args.gradient_as_bucket_view,
                                   find_unused_parameters=args.find_unused_parameters,
                                   bucket_cap_mb=args.bucket_cap_mb)


def _bits(g):
    """A gradient's bit patterns as integers a collective can take the max and min of."""
    g = g.detach().contiguous()
    size = g.element_size()
    if size == 2:
        return g.view(torch.int16).to(torch.int32)
    if size == 4:
        return g.view(torch.int32)
    return g.view(torch.int64)


def ranks_agree(layers, d):
    """Whether every parameter's gradient (after DDP's all-reduce) is bitwise the
    same on every rank: the elementwise max and min of the bit patterns over
    the ranks are equal. Every rank runs every collective."""
    same = True
    for m in layers:
        for p in m.parameters():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            hi = _bits(g).clone()
            lo = hi.clone()
            dist.all_reduce(hi, op=dist.ReduceOp.MAX)
            dist.all_reduce(lo, op=dist.ReduceOp.MIN)
            same = same and torch.equal(hi, lo)
    return bool(same)


def run_mode(mode, args, d, shape, dtype, refs, x, gy):
    """One mode on every rank: this rank's row (no gradients in it)."""
    row = {"mode": mode, "rank": d.rank, "local_rank": d.local_rank, "pid": os.getpid(),
           "device": str(d.device), "reference": REFERENCE.get(mode)}
    gc.collect()
    if d.cuda:
        torch.cuda.empty_cache()          # the previous mode's blocks: not in this one's numbers
    if mode in GRAPH_MODES:
        _quiesce(d)
    layers = llama.torch_layers(args.layers, shape, d.device, dtype, args.attention)
    t0 = time.perf_counter()
    err = None
    try:
        with llama.attention_backend(args.attention):
            seq, off = build(mode, layers, shape, dtype, args, d)
    except Exception as e:  # a mode that cannot be built is reported; the others still run
        err = "%s: %s" % (type(e).__name__, e)
        seq = off = None
    errors = [e for e in d.gather(err) if e is not None]
    if errors:
        row["error"] = errors[0] if err is None else err
        if off is not None:               # built here, failed on another rank
            off.close()
        del seq, layers
        gc.collect()
        return row
    row["vmmrt_device"] = ("%s:%d" % (off.runtime.info()["backend"], off.runtime.info()["device_ordinal"])
                           if off is not None else None)
    # From here on a failure on one rank leaves the others inside a collective:
    # it ends this process, and torchrun ends the job.
    try:
        ddp = wrap(seq, args, d)
        # The benchmark's step: zero_grad(set_to_none=True), forward, backward
        # (DDP's all-reduce), AdamW's step; the gradients compared are those
        # of one step from the first weights.
        weights = modes.Weights(layers)
        built = modes.Built(mode, ddp, off, time.perf_counter() - t0, loops.optimizer(modes.parameters(layers)))
        del ddp, seq
        with llama.attention_backend(args.attention):
            res, grads = modes.measure(built, layers, loops.Loop("set_to_none"), [x], [gy], args, weights)
        row.update(res)
        row["ranks_agree"] = ranks_agree(layers, d)
        ref = row["reference"]
        if ref is None:
            refs[mode] = modes.host_copies(grads)
        elif ref in refs:
            same, ulp, _ = modes.compare(grads, refs[ref])
            row["grad_bitwise"], row["grad_max_ulp"] = same, ulp
        del grads
        modes.teardown(built, layers)
        del built, off, layers
        gc.collect()
    except BaseException:
        print("[rank %d] %s: FAILED after the DDP wrap:\n%s" % (d.rank, mode, traceback.format_exc()),
              file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(3)
    row.pop("plan", None)
    return row


def _f(v, fmt):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt % v


def _mib(mem, key):
    if not mem:
        return "-"
    v = mem.get(key)
    return "?" if v is None else "%.0f" % (v / MiB)


def _ratio(a, b):
    return a / b if a is not None and b else None


def table(rows, title):
    by = {(r["mode"], r["rank"]): r for r in rows}
    fmt = "%-14s %4s %-7s %-7s %9s %7s %9s %7s %7s %7s %7s %7s %9s  %-24s %s"
    head = fmt % ("mode", "rank", "device", "vmmrt", "step ms", "vs ref", "used MiB", "vs ref", "pool", "alloc",
                  "vmmrt", "other", "moved MiB", "grads after all-reduce", "ranks")
    lines = [title, head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append("%-14s %4d  FAILED: %s" % (r["mode"], r["rank"], r["error"]))
            continue
        ref = by.get((r["reference"], r["rank"]), {}) if r["reference"] else {}
        m = r.get("memory") or {}
        used, ref_used = m.get("used"), (ref.get("memory") or {}).get("used")
        if r["reference"] is None:
            grads = "(reference)"
        elif r.get("grad_bitwise") is None:
            grads = "-"
        elif r["grad_bitwise"]:
            grads = "bitwise = %s" % r["reference"]
        else:
            grads = "%.3g ulp vs %s" % (r["grad_max_ulp"], r["reference"])
        moved = r.get("d2h_bytes_per_step")
        lines.append(fmt % (
            r["mode"], r["rank"], r["device"], r.get("vmmrt_device") or "-", "%.2f" % r["step_ms"],
            _f(_ratio(r["step_ms"], ref.get("step_ms")), "%.3f"), _mib(m, "used"),
            _f(_ratio(used, ref_used), "%.3f"), _mib(m, "graph_pool"), _mib(m, "allocator"), _mib(m, "vmmrt"),
            _mib(m, "other"), _f(moved / MiB if moved is not None else None, "%.0f"), grads,
            "agree" if r.get("ranks_agree") else "DIFFER"))
    return "\n".join(lines)


def verdicts(rows, world, deterministic):
    """What the run shows, per mode: each line (ok, text)."""
    out = []
    for mode in ORDER:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        bad = [r for r in mine if "error" in r]
        if bad:
            out.append((False, "%s: FAILED: %s" % (mode, bad[0]["error"])))
            continue
        agree = all(r.get("ranks_agree") for r in mine)
        ref = REFERENCE.get(mode)
        if ref is None:
            out.append((agree, "%s (reference): gradients after the all-reduce %s on the %d ranks"
                        % (mode, "the same" if agree else "DIFFER", world)))
            continue
        bitwise = all(r.get("grad_bitwise") for r in mine)
        worst = max((r.get("grad_max_ulp") or 0.0) for r in mine)
        ok = agree and (bitwise or not deterministic)
        out.append((ok, "%s: gradients after the all-reduce %s %s's on every rank%s; ranks %s"
                    % (mode, "bitwise equal to" if bitwise else "up to %.3g ulp from" % worst, ref,
                       "" if bitwise or deterministic else " (non-deterministic kernels: not judged)",
                       "agree" if agree else "DIFFER")))
    return out


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    d = Dist(args)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    shape = llama.Shape(args.hidden, args.ffn, args.heads, args.kv_heads, args.seq, args.batch)
    # This rank's batch: the same in every mode, another on every rank.
    g = torch.Generator(device="cpu").manual_seed(7 + 1000 * d.rank)
    x = torch.randn(shape.batch, shape.seq, shape.hidden, generator=g).to(d.device, dtype).requires_grad_()
    gy = torch.randn(shape.batch, shape.seq, shape.hidden, generator=g).to(d.device, dtype)
    torch.manual_seed(1234 + d.rank)
    me = {"rank": d.rank, "local_rank": d.local_rank, "pid": os.getpid(), "host": socket.gethostname(),
          "device": str(d.device), "visible_devices": torch.cuda.device_count() if d.cuda else 0,
          "device_name": torch.cuda.get_device_name(d.device) if d.cuda else platform.processor() or "cpu"}
    ranks = d.gather(me)
    deterministic = args.attention == "math" or not d.cuda
    info = {"torch": torch.__version__, "python": platform.python_version(), "vmmrt": vmmrt.version_string(),
            "backend": d.backend, "world_size": d.world,
            "nccl": _nccl_version() if d.cuda else None,
            "env": {k: os.environ.get(k) for k in NCCL_ENV}}
    if d.rank == 0:
        print("torch_ddp: %d ranks (%s), %d layers %s, %s, attention %s; torch %s, libvmmrt %s%s"
              % (d.world, d.backend, args.layers, shape.as_dict(), args.dtype, args.attention, info["torch"],
                 info["vmmrt"], ", NCCL %s" % info["nccl"] if info["nccl"] else ""), flush=True)
        for r in ranks:
            print("  rank %d: pid %d on %s, %s (%s)" % (r["rank"], r["pid"], r["host"], r["device"],
                                                         r["device_name"]), flush=True)
        print("  DDP: gradient_as_bucket_view=%s, find_unused_parameters=%s; NCCL_NVLS_ENABLE=%s"
              % (args.gradient_as_bucket_view, args.find_unused_parameters, os.environ.get("NCCL_NVLS_ENABLE")),
              flush=True)
    refs = {}
    rows = []
    for i, mode in enumerate(args.modes, 1):
        if d.rank == 0:
            print("[%d/%d] %s: started" % (i, len(args.modes), mode), flush=True)
        row = run_mode(mode, args, d, shape, dtype, refs, x, gy)
        got = d.gather(row)
        rows.extend(got)
        if d.rank == 0:
            for r in got:
                if "error" in r:
                    print("[%d/%d] %-14s rank %d FAILED: %s" % (i, len(args.modes), mode, r["rank"], r["error"]),
                          flush=True)
                else:
                    print("[%d/%d] %-14s rank %d  build %5.1f s  step %8.2f ms%s%s" % (
                        i, len(args.modes), mode, r["rank"], r["build_s"], r["step_ms"],
                        "  used %.0f MiB" % (r["memory"]["used"] / MiB) if r.get("memory") else "",
                        "" if r.get("grad_bitwise") is None else
                        "  grads %s" % ("bitwise" if r["grad_bitwise"] else "%.3g ulp" % r["grad_max_ulp"])),
                        flush=True)
                    if args.verbose and r.get("plan_text"):
                        print(r["plan_text"], flush=True)
    rows.sort(key=lambda r: (args.modes.index(r["mode"]), r["rank"]))
    vs = verdicts(rows, d.world, deterministic)
    ok = all(v for v, _ in vs)
    if d.rank == 0:
        title = ("DDP, %d ranks (%s): per mode and rank; memory between forward and backward (driver level)"
                 % (d.world, d.backend))
        print("\n" + table(rows, title), flush=True)
        print("\n" + "\n".join("  [%s] %s" % ("ok" if v else "FAILED", t) for v, t in vs), flush=True)
        wall = time.perf_counter() - t0
        print("\ncommand: torchrun --nproc-per-node=%d %s %s   (%.0f s)"
              % (d.world, os.path.relpath(__file__), " ".join(sys.argv[1:] if argv is None else argv), wall),
              flush=True)
        if args.json:
            doc = {"config": dict(vars(args), shape=shape.as_dict()), "info": info, "ranks": ranks, "rows": rows,
                   "verdicts": [{"ok": v, "text": t} for v, t in vs], "ok": ok, "wall_s": wall}
            with open(args.json, "w") as f:
                json.dump(_clean(doc), f, indent=1)
    d.close()
    return 0 if ok else 1


def _clean(o):
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    return o


if __name__ == "__main__":
    sys.exit(main())
