# SPDX-License-Identifier: LGPL-2.1-or-later
"""python3 -m vmmrt.torch.bench: whole-layer CUDA graphs with CPU activation
offload, measured as users judge them: training steps with AdamW in the two
loops people write, driver-level memory over the whole step, against eager,
save_on_cpu and graph-only, in one run; or (--front) PyTorch's own answers
to running out of memory (checkpointing, graphs of checkpointed layers,
save_on_cpu) against vmmrt.torch's, as two Pareto fronts of step time
against peak memory.

Each table is one layer set in one loop (--loop): set_to_none
(opt.zero_grad(set_to_none=True)) or persistent (.grad kept and zeroed in
place), --microbatches K per optimizer step. A row per mode: the median step
time (zeroing, forwards, backwards and the optimizer's step; CUDA events),
the peak of driver-level used memory over one whole step (a background
thread sampling cuMemGetInfo, in a step apart from the timed ones; its rate
is reported), driver-level memory between the last forward and its backward
with its parts, both against graph-only in the same loop, bytes moved, the
copy bound, and the gradients of one step from the same weights against the
loop's reference (graph-only in set_to_none with one microbatch, eager
otherwise: graph-only's .grad aliases its static buffers). Then the targets
for the whole step and for offload, each met or missed by how much.

Default: 6 Llama-3-8B-shaped layers (hidden 4096, ffn 14336, 32 heads / 8 kv
heads, seq 4096, batch 1, bf16) written with torch ops, the modes eager,
save_on_cpu, graph, none, pingpong, remap, planner, both loops; then Hugging
Face transformers' LlamaDecoderLayer in the same shape (eager, graph,
pingpong, planner) when transformers is installed. --layer encoder runs
torch.nn.TransformerEncoderLayer (--preset encoder: d 4096, ffn 16384,
32 heads, seq 4096, 6 layers). --smoke: a tiny shape that runs in seconds (on
the CPU too, where only the eager modes run, on the host backend). Without a
GPU and without --device, the bench says so and runs --smoke.

--front (vmmrt.torch.bench.frontrun, .front): for each --shape, in one
process and one loop (--loop; default set_to_none), a point per option:
eager, ckpt k (torch.utils.checkpoint, non-reentrant, the first k layers;
--front-ks values of k over 1..L), graphs (torch.cuda.make_graphed_callables),
graphs+ckpt k, save_on_cpu; vmmrt none, auto, pingpong and remap (full
offload), recompute all, and memory_budget= at --front-budgets budgets from
graphs' peak down to the smallest plan (--front-budgets-at LABELS: one at the
measured peak of each PyTorch option named). Each point's median step time and
whole-step peak (driver level, over the memory before the model), gradients
against the loop's reference; then both fronts, each vmmrt point against the
fastest PyTorch option within its peak, and a verdict line per shape ("vmmrt
ahead at N of M memory levels; dominated at K"); --json writes every point
(after each one) and a PNG of both fronts beside it (matplotlib).
--check-alone then runs each point of PyTorch's options and of vmmrt's none,
auto and recompute all again alone in a fresh process
(vmmrt.torch.bench.alone) and compares (within 3 %). Shapes and their
estimated time on the H200 with the defaults (one loop):
  llama     8 torch-ops Llama-3-8B layers, seq 4096                  ~4 min
  launch    16 layers, hidden 1024, ffn 4096, seq 1024 (launch-bound) ~2 min
  encoder   6 nn.TransformerEncoderLayer, d 4096, ffn 16384, seq 4096 ~5 min
  hf        4 transformers LlamaDecoderLayer (Llama-3-8B), seq 4096   ~2.5 min
  megatron  4 megatron-core TransformerLayer (local spec), seq 2048  ~2.5 min
  long      4 torch-ops Llama-3-8B layers, seq 32768 (long context)  ~5 min
(--check-alone adds about 15 s per point; fewer k values
(--front-ks 3), budgets or --iterations shorten a run.)
"""
import argparse
import logging
import platform
import sys
import time

import torch

import vmmrt
import vmmrt.torch as vt
from vmmrt.torch import planner
from vmmrt.torch.bench import encoder, frontrun, llama, loops, modes, progress, report, shapes

MiB = float(1 << 20)
HF_MODES = ("eager", "graph", "pingpong", "planner")
LAYERS = ("torch", "hf", "encoder")
PRESETS = {
    # torch.nn.TransformerEncoderLayer at d 4096, ffn 16384, 32 heads, seq 4096
    "encoder": dict(layer="encoder", layers=6, hidden=4096, ffn=16384, heads=32, kv_heads=32, seq=4096),
}


def _parser():
    p = argparse.ArgumentParser(prog="python3 -m vmmrt.torch.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="encoder: 6 torch.nn.TransformerEncoderLayers, d 4096, ffn 16384, 32 heads, seq 4096 "
                        "(explicit options win)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--modes", default=None, help="comma-separated, from: %s (default on CUDA: %s; on the CPU: %s)"
                   % (",".join(modes.MODES), ",".join(modes.DEFAULT_MODES), ",".join(modes.CPU_MODES)))
    p.add_argument("--layer", default="torch,hf",
                   help="comma-separated, from: torch (the torch-ops Llama layer), hf (transformers' "
                        "LlamaDecoderLayer, if installed), encoder (torch.nn.TransformerEncoderLayer); or all "
                        "(default: torch,hf)")
    p.add_argument("--hf-modes", default=",".join(HF_MODES), help="modes run with the transformers layer")
    p.add_argument("--loop", choices=loops.LOOPS + ("both",), default=None,
                   help="set_to_none: opt.zero_grad(set_to_none=True); persistent: .grad kept across steps and "
                        "zeroed in place; both: a table each (default: both; with --front, set_to_none)")
    p.add_argument("--optimizer", choices=loops.OPTIMIZERS, default="foreach",
                   help="AdamW's kernels: foreach (default) or fused (CUDA only)")
    p.add_argument("--microbatches", type=int, default=1, help="microbatches accumulated per optimizer step")
    p.add_argument("--grads", default=None,
                   help="grads= for vmmrt.torch.make_graphed_callables (default: none passed, the library's default)")
    p.add_argument("--map-ahead", type=int, default=None,
                   help="map_ahead= for vmmrt.torch.make_graphed_callables (default: the library's)")
    p.add_argument("--no-memory-plan", dest="memory_plan", action="store_false",
                   help="memory_plan=False for vmmrt.torch.make_graphed_callables: resident and gradient slots "
                        "mapped and released around each use (default: the plan, vmmrt.torch.memplan)")
    p.add_argument("--memory-plan", dest="memory_plan", action="store_const", const=True,
                   help="memory_plan=True passed to every vmmrt build, the budget points' too (the library's "
                        "default)")
    p.add_argument("--plan-slots-only", dest="memory_plan", action="store_const", const="slots",
                   help="memory_plan=\"slots\": the plan, but the optimizer step's allocations in PyTorch's own "
                        "memory, not in the pages' free bytes (vmmrt.torch.optmem; for comparison)")
    p.set_defaults(memory_plan=None)
    p.add_argument("--no-backward-reuse", dest="backward_reuse", action="store_false",
                   help="the backwards' temporaries in the graph pool, not in the bytes of the resident slots that "
                        "their saved regions no longer need (vmmrt.torch.reuse; for comparison)")
    p.add_argument("--fraction", type=float, default=1.0, help="offload fraction of the vmmrt modes (planner: auto)")
    p.add_argument("--lookahead", type=int, default=1)
    p.add_argument("--margin", type=float, default=0.9, help="the planner's safety factor")
    p.add_argument("--attention", choices=("auto", "flash", "math"), default="auto",
                   help="math: sdpa's deterministic math backend (gradients compare bitwise)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="steps before the timed ones, after building (a vmmrt "
                   "point: at least 2, the steps that make and bind its memory plan)")
    p.add_argument("--sample-us", type=float, default=50.0,
                   help="the peak sampler's sleep between two readings, in microseconds")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda where there is a GPU; otherwise the CPU with --smoke")
    p.add_argument("--smoke", action="store_true", help="a tiny shape: seconds, not minutes")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--budget-sweep", action="store_true",
                   help="instead of the tables: the budget planner's choice and hand-made ones (offload fractions, "
                        "checkpointing k layers, both) at budgets from graph-only's peak down to the smallest plan, "
                        "predicted against measured (vmmrt.torch.bench.sweep)")
    p.add_argument("--sweep-points", type=int, default=5, help="budgets of --budget-sweep")
    p.add_argument("--sweep-hand", type=int, default=2,
                   help="hand-made choices measured per budget: the fastest predicted to fit")
    p.add_argument("--sweep-mode", choices=("pingpong", "remap", "none", "auto"), default="pingpong",
                   help="the offload mode of --budget-sweep's runs (auto: the planner chooses it, the hand-made "
                        "choices run in pingpong)")
    p.add_argument("--front", action="store_true",
                   help="instead of the tables: PyTorch's options and vmmrt's as two fronts of step time against "
                        "peak, per --shape (see above)")
    p.add_argument("--shape", default="llama",
                   help="--front's shapes, comma-separated, from: %s; or all (default: llama)"
                        % ", ".join(shapes.SHAPES))
    p.add_argument("--front-ks", type=int, default=5, help="--front: how many values of k (checkpointed layers), "
                   "spread over 1..layers (default 5)")
    p.add_argument("--front-budgets", type=int, default=4,
                   help="--front: memory_budget= points from graphs' peak (or keeping all's predicted peak, the lower) down to the smallest plan (default 4)")
    p.add_argument("--front-budgets-at", default=None, metavar="LABELS",
                   help="--front: memory_budget= points at the measured peaks of these PyTorch options instead "
                        "(\"ckpt 16,graphs+ckpt 16\": the planner against each at its own memory level; with "
                        "--front-only too, which must then keep them and vmmrt recompute all)")
    p.add_argument("--auto-loop", action="store_true",
                   help="offload=\"auto\" (vmmrt auto, the planner mode) is told the loop it runs "
                        "(make_graphed_callables(loop=)) and weighs its plan for it alone; without, for both")
    p.add_argument("--front-budget-mode", choices=("auto", "pingpong", "remap"), default="auto",
                   help="--front: mode= of the memory_budget= points (auto: the planner chooses; default)")
    p.add_argument("--front-families", default="torch,vmmrt",
                   help="--front: whose options, comma-separated: torch, vmmrt (default both)")
    p.add_argument("--front-only", default=None, metavar="LABELS",
                   help="--front: only the options of these labels, comma-separated, as the table names them "
                        "(\"eager,graphs,vmmrt none\"; the budget points are left out too)")
    p.add_argument("--launch-ab", type=int, default=0, metavar="PAIRS",
                   help="instead of the tables: torch's graphed callables and vmmrt none over --shape's layers, "
                        "their steps alternated PAIRS times (ABBA), each begun with the device idle; the launch "
                        "thread's excess per layer per step, pair by pair (CUDA only; see bench/launch_ab.py)")
    p.add_argument("--one-time", action="store_true",
                   help="instead of the tables: the device memory a fresh process keeps once each kind of step "
                        "has run in it (the model, an eager step, torch's graphs, an empty libvmmrt runtime, "
                        "vmmrt none twice), stage by stage, on --shape's layers (CUDA only; see bench/onetime.py)")
    p.add_argument("--fresh-loops", action="store_true",
                   help="--front with --loop both: each loop after the first in a fresh process of its own (the "
                        "same arguments, that shape and loop), not after the first loop's front in this one, "
                        "whose leftovers its base would hold")
    p.add_argument("--check-alone", action="store_true",
                   help="--front: then each point of PyTorch's options and of vmmrt's none, auto and recompute "
                        "all again alone in a fresh process (python3 -m vmmrt.torch.bench.alone), its figures "
                        "against the front's")
    p.add_argument("--check-tolerance", type=float, default=0.03,
                   help="--check-alone: the largest relative difference that agrees (default 0.03)")
    p.add_argument("--check-repeats", type=int, default=2,
                   help="--check-alone: a point that differs is run alone this many times more, to tell a "
                        "front's error from the option's own spread across fresh processes (default 2)")
    return p


def parse(argv):
    p = _parser()
    pre = p.parse_known_args(argv)[0]
    if pre.preset:
        p.set_defaults(**PRESETS[pre.preset])
    a = p.parse_args(argv)
    a.no_gpu_smoke = False
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
        if a.device == "cpu" and not a.smoke:
            # full-size layers on a CPU take many minutes per mode: a user
            # without a GPU asked for nothing so slow
            a.smoke = a.no_gpu_smoke = True
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (torch %s)" % torch.__version__)
    if a.optimizer == "fused" and a.device != "cuda":
        p.error("--optimizer fused needs CUDA (torch's fused AdamW runs on the GPU)")
    if a.smoke:
        a.layers, a.seq, a.hidden, a.ffn, a.heads, a.kv_heads = 3, 256, 256, 704, 4, 2
        # two steps of warm-up: the memory plan is made at the second
        # (vmmrt.torch.memplan), so the timed steps are its steady state
        a.iterations, a.warmup = min(a.iterations, 3), 2
        if a.device == "cpu":
            # Debian's torch multiplies slowly on the CPU: a quarter of the work per layer.
            a.seq, a.hidden, a.ffn = 128, 128, 352
            a.dtype = "fp32"
    if a.modes is None:
        a.modes = list(modes.DEFAULT_MODES) if a.device == "cuda" else list(modes.CPU_MODES)
    else:
        a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in a.modes:
        if m not in modes.MODES:
            p.error("unknown mode %r; modes are %s" % (m, ", ".join(modes.MODES)))
        if a.device == "cpu" and m not in modes.CPU_MODES:
            p.error("mode %r needs CUDA; on the CPU: %s" % (m, ", ".join(modes.CPU_MODES)))
    a.hf_modes = [m.strip() for m in a.hf_modes.split(",") if m.strip()]
    a.layer = list(LAYERS) if a.layer == "all" else [x.strip() for x in a.layer.split(",") if x.strip()]
    for x in a.layer:
        if x not in LAYERS:
            p.error("unknown layer %r; layers are %s, or all" % (x, ", ".join(LAYERS)))
    if a.loop is None:
        a.loop = "set_to_none" if a.front or a.launch_ab or a.one_time else "both"
    a.loops = list(loops.LOOPS) if a.loop == "both" else [a.loop]
    a.shapes = list(shapes.SHAPES) if a.shape == "all" else [x.strip() for x in a.shape.split(",") if x.strip()]
    for x in a.shapes:
        if x not in shapes.SHAPES:
            p.error("unknown shape %r; shapes are %s, or all" % (x, ", ".join(shapes.SHAPES)))
    a.front_families = [x.strip() for x in a.front_families.split(",") if x.strip()]
    if not a.front_families or any(x not in ("torch", "vmmrt") for x in a.front_families):
        p.error("--front-families: torch, vmmrt or both, comma-separated (got %r)" % ",".join(a.front_families))
    if a.front_ks < 1 or a.front_budgets < 0:
        p.error("--front-ks must be at least 1 and --front-budgets at least 0")
    if a.check_alone and not a.front:
        p.error("--check-alone goes with --front")
    if a.front_only is not None and not a.front:
        p.error("--front-only goes with --front")
    if a.fresh_loops and not (a.front and len(a.loops) > 1):
        p.error("--fresh-loops goes with --front and --loop both (a later loop runs in a fresh process)")
    if a.front_budgets_at is not None:
        if not a.front:
            p.error("--front-budgets-at goes with --front")
        try:
            frontrun.budget_levels(a.front_budgets_at, a.front_only, a.front_families)
        except ValueError as e:
            p.error(str(e))
    if a.front and a.budget_sweep:
        p.error("--front and --budget-sweep are two runs: give one")
    if a.launch_ab < 0:
        p.error("--launch-ab: a number of pairs, at least 1")
    if a.launch_ab and (a.front or a.budget_sweep):
        p.error("--launch-ab is a run of its own: give it without --front or --budget-sweep")
    if a.launch_ab and not a.device.startswith("cuda"):
        p.error("--launch-ab compares graphed callables: it needs CUDA")
    if a.one_time and (a.front or a.budget_sweep or a.launch_ab):
        p.error("--one-time is a run of its own: give it without --front, --budget-sweep or --launch-ab")
    if a.one_time and not a.device.startswith("cuda"):
        p.error("--one-time reads the device's memory: it needs CUDA")
    if a.check_repeats < 0:
        p.error("--check-repeats must be 0 or more")
    if not 0 < a.check_tolerance < 1:
        p.error("--check-tolerance: a fraction between 0 and 1 (0.03 is 3 %)")
    if a.iterations < 1 or a.warmup < 0:
        p.error("--iterations must be at least 1 and --warmup at least 0")
    if a.microbatches < 1:
        p.error("--microbatches must be at least 1")
    return a


def _order(run_modes, ref):
    """The reference first (the others compare with it as they come), then
    graph-only (the ratios of the progress lines), then the rest as given."""
    first = [m for m in (ref, "graph") if m in run_modes]
    return list(dict.fromkeys(first + list(run_modes)))


def run_set(title, make_layers, args, shape, dtype, bw, run_modes):
    """One layer set: the layers once, then a table per loop."""
    dev = torch.device(args.device)
    layers = make_layers()
    weights = modes.Weights(layers)
    g = torch.Generator(device="cpu").manual_seed(7)
    k = args.microbatches
    dims = (shape.batch, shape.seq, shape.hidden)
    xs = [torch.randn(*dims, generator=g).to(dev, dtype).requires_grad_() for _ in range(k)]
    gys = [torch.randn(*dims, generator=g).to(dev, dtype) for _ in range(k)]

    def sample():
        return torch.randn(*dims, device=dev, dtype=dtype, requires_grad=True)

    out = {"title": title, "loops": {}}
    for name in args.loops:
        loop = loops.Loop(name, k)
        print("\n-- %s, %s" % (title, loop.describe(args.optimizer)), flush=True)
        out["loops"][name] = run_loop(title, loop, layers, weights, xs, gys, sample, args, shape, bw, run_modes)
    del layers
    return out


def run_loop(title, loop, layers, weights, xs, gys, sample, args, shape, bw, run_modes):
    """Every mode of run_modes in one loop, on fresh callables over the same layers."""
    ref_name = loop.reference
    if ref_name not in run_modes and ref_name == "graph" and "eager" in run_modes:
        ref_name = "eager"      # eager's gradients are right in every loop
    if ref_name not in run_modes:
        ref_name = None
    order = _order(run_modes, ref_name)
    ref = None
    spread = None
    rows = {}
    bar = progress.Progress(len(order), loop.name)
    for i, name in enumerate(order, 1):
        built = None
        bar.start(name)
        try:
            with llama.attention_backend(args.attention):
                built = modes.build(name, layers, sample, args, loop.name)
                row, grads = modes.measure(built, layers, loop, xs, gys, args, weights)
                if name == ref_name:
                    ref = modes.host_copies(grads)
                    del grads
                    # The reference's own run-to-run spread (non-deterministic
                    # kernels such as flash attention's backward): three more steps.
                    spread = modes.spread(built, layers, loop, xs, gys, weights, ref)
                    row["grad_reference"] = True
                    row["spread"] = spread
                else:
                    same, diff, norm = modes.compare(grads, ref)
                    del grads
                    row["grad_bitwise"], row["grad_max_ulp"], row["grad_norm_ratio"] = same, diff, norm
                    if ref is not None:
                        row["grad_vs"] = ref_name
                    if spread is not None and diff is not None:
                        row["spread"] = spread
                        row["grad_within_spread"] = bool(same or (spread and diff <= spread))
        except Exception as e:  # a mode that fails is reported, the others still run
            bar.end("[%d/%d] %-14s FAILED: %s: %s" % (i, len(order), name, type(e).__name__, e))
            rows[name] = {"mode": name, "loop": loop.name, "error": "%s: %s" % (type(e).__name__, e),
                          "step_ms": float("nan"), "build_s": 0.0}
            grads = None
            if built is not None:
                try:
                    modes.teardown(built, layers, weights, xs)
                except Exception:
                    pass
            continue
        rows[name] = row
        bar.end(report.progress(i, len(order), row, rows.get("graph", {}).get("step_ms")))
        if row.get("plan_text"):
            print(row["plan_text"], flush=True)
        modes.teardown(built, layers, weights, xs)
    bar.close()
    gr = rows.get("graph")
    if gr and "error" not in gr:
        for r in rows.values():
            r["head_tail_ms"] = gr["fwd_bwd_ms"] / len(layers) + gr["zero_ms"] + gr["opt_ms"]
    ordered = [rows[m] for m in run_modes if m in rows]
    ok = [r for r in ordered if "error" not in r]
    report.ratios(ok)
    print(report.table(ok, "%s, %s" % (title, loop.describe(args.optimizer)), *bw, ref_name=ref_name), flush=True)
    for r in ordered:
        if "error" in r:
            print("  %s: FAILED: %s" % (r["mode"], r["error"]), flush=True)
    full = args.fraction >= 1.0
    ts = report.targets_20(ok, bw[0], bw[1], full, loop.name, ref_name)
    if ts:
        print(report.print_targets(ts, "targets for the whole step (%s loop):" % loop.name), flush=True)
    t12 = report.targets(ok, bw[0], bw[1], full, shape.seq, ref_name or "the reference")
    if t12:
        print(report.print_targets(t12, "targets for offload (%s loop):" % loop.name), flush=True)
    return {"loop": loop.name, "microbatches": loop.microbatches, "reference": ref_name, "rows": ordered,
            "targets": ts + t12}


def _grads_default():
    """vmmrt.torch.make_graphed_callables' default grads= (what users get)."""
    import inspect
    try:
        return inspect.signature(vt.make_graphed_callables).parameters["grads"].default
    except (KeyError, ValueError, TypeError):
        return None


def _budget_sweep(args, argv, doc, shape, dev, dtype, t0):
    from vmmrt.torch.bench import sweep
    if args.layer[0] == "encoder":
        title, make = "torch.nn.TransformerEncoderLayer", lambda: encoder.encoder_layers(args.layers, shape, dev, dtype)
    else:
        title, make = "torch-ops Llama layer", lambda: llama.torch_layers(args.layers, shape, dev, dtype,
                                                                           args.attention)
    print("\n== budget sweep: %d %ss" % (args.layers, title), flush=True)
    doc["sweep"] = sweep.run_sweep(args, title, make, shape, dtype)
    doc["wall_s"] = time.perf_counter() - t0
    print("\ncommand: python3 -m vmmrt.torch.bench %s   (%.0f s)" % (" ".join(argv), doc["wall_s"]), flush=True)
    if args.json:
        report.dump(args.json, doc)
        png = sweep.plot(doc["sweep"], args.json.rsplit(".", 1)[0] + ".png")
        if png:
            print("plot: %s" % png, flush=True)
    return 0


def _per_shape(key, title, run, args, argv, doc, dev, dtype, t0):
    """A run of its own over each of --shape's layers (--launch-ab,
    --one-time): ``run(args, spec, dev, dtype)``'s result per shape in
    doc[key], a shape whose package is missing said and skipped."""
    doc[key] = []
    for name in args.shapes:
        spec = shapes.SHAPES[name]
        if args.smoke:
            spec = spec.smoke(args.device)
        print("\n== %s: %s" % (title, spec.describe()), flush=True)
        try:
            doc[key].append(run(args, spec, dev, dtype))
        except shapes.Unavailable as e:     # a package the shape's layers need is missing: said, and skipped
            print("skipped: %s" % e, flush=True)
            doc[key].append({"shape": spec.name, "error": "Unavailable: %s" % e})
    doc["wall_s"] = time.perf_counter() - t0
    print("\ncommand: python3 -m vmmrt.torch.bench %s   (%.0f s)" % (" ".join(argv), doc["wall_s"]), flush=True)
    if args.json:
        report.dump(args.json, doc)
    return 0


def _one_time(args, argv, dev, dtype, t0):
    from vmmrt.torch.bench import onetime
    print("vmmrt.torch.bench: one-time memory of %s, %s, attention %s, on %s (torch %s, libvmmrt %s)"
          % (", ".join(args.shapes), args.dtype, args.attention, torch.cuda.get_device_name(dev), torch.__version__,
             vmmrt.version_string()), flush=True)
    return _per_shape("one_time", "one-time memory", onetime.run, args, argv, {"config": dict(vars(args))}, dev,
                      dtype, t0)


def _launch_ab(args, argv, doc, dev, dtype, t0):
    from vmmrt.torch.bench import launch_ab
    return _per_shape("launch_ab", "launch A/B", launch_ab.run, args, argv, doc, dev, dtype, t0)


def _front(args, argv, doc, dev, dtype, t0):
    from vmmrt.torch.bench import alone, front, frontrun
    doc["fronts"] = []

    def save():
        doc["wall_s"] = time.perf_counter() - t0
        if args.json:
            report.dump(args.json, doc)
    for name in args.shapes:
        spec = shapes.SHAPES[name]
        if args.smoke:
            spec = spec.smoke(args.device)
        print("\n== front: %s" % spec.describe(), flush=True)
        frontrun.run(args, spec, dev, dtype, doc["fronts"], save)
    if args.check_alone:
        doc["alone"] = alone.check(doc, args)
        save()
    doc["wall_s"] = time.perf_counter() - t0
    print("\ncommand: python3 -m vmmrt.torch.bench %s   (%.0f s)" % (" ".join(argv), doc["wall_s"]), flush=True)
    for line in frontrun.summary(doc["fronts"]):
        print(line, flush=True)
    if args.json:
        save()
        png = front.plot_all(doc["fronts"], args.json.rsplit(".", 1)[0] + ".png")
        print("plot: %s" % (png or "none (matplotlib is not importable, or no peak was measured)"), flush=True)
    # A shape whose package is missing is said and skipped; an option of
    # PyTorch's that raises is its own answer (recorded); a vmmrt point that
    # fails or whose gradients differ is ours.
    failed = any(d.get("error") and not d["error"].startswith("Unavailable") for d in doc["fronts"]) or any(
        p["family"] == "vmmrt" and (p.get("error") or p.get("grads_ok") is False)
        for d in doc["fronts"] for p in d["points"])
    if args.check_alone and doc["alone"].get("disagree"):
        failed = True
    return 1 if failed else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--front" in argv:
        from vmmrt.torch.bench import frontrun
        frontrun.eager_modules()
    args = parse(argv)
    args.argv = list(argv)          # (--fresh-loops: a later loop's process is given them again)
    if not args.backward_reuse:
        from vmmrt.torch import reuse
        reuse.ENABLED = False
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    shape = llama.Shape(args.hidden, args.ffn, args.heads, args.kv_heads, args.seq, args.batch)
    dev = torch.device(args.device)
    t0 = time.perf_counter()
    if args.one_time:
        # before anything of libvmmrt's is opened (the copies' probe below)
        return _one_time(args, argv, dev, dtype, t0)
    probe = 256 << 20 if dev.type == "cuda" else 64 << 20
    bw = planner.measure_bandwidth(dev, probe)
    info = {"torch": torch.__version__, "python": platform.python_version(), "vmmrt": vmmrt.version_string(),
            "device": torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor() or "cpu",
            "grads_default": _grads_default()}
    if args.no_gpu_smoke:
        print("vmmrt.torch.bench: no CUDA device here: running the tiny --smoke shape on the CPU (eager modes, "
              "libvmmrt's host backend); give --device cpu for the full shape", flush=True)
    # (a front and the launch A/B run the shapes they name, not the table's layers)
    what = "front of %s" % ", ".join(args.shapes) if args.front else \
        "launch A/B of %s" % ", ".join(args.shapes) if args.launch_ab else "%d layers, hidden %d, ffn %d, %d heads " \
        "(%d kv), seq %d, batch %d" % (args.layers, shape.hidden, shape.ffn, shape.heads, shape.kv_heads, shape.seq,
                                      shape.batch)
    print("vmmrt.torch.bench: %s, %s, attention %s, on %s (torch %s, libvmmrt %s)"
          % (what, args.dtype, args.attention, info["device"], info["torch"], info["vmmrt"]), flush=True)
    print("libvmmrt's copies (a slot and pinned host memory, %d MiB): D2H %.1f GB/s, H2D %.1f GB/s"
          % (probe >> 20, bw[0], bw[1]), flush=True)
    print("loops: %s, %d microbatch%s per step, AdamW(lr=1e-4, %s=True); vmmrt grads=%s"
          % (", ".join(args.loops), args.microbatches, "" if args.microbatches == 1 else "es", args.optimizer,
             args.grads or "the library's default (%s)" % info["grads_default"]), flush=True)
    doc = {"config": dict(vars(args), shape=shape.as_dict()), "info": info,
           "bandwidth": {"d2h_gbps": bw[0], "h2d_gbps": bw[1]}, "sets": []}
    if args.budget_sweep:
        return _budget_sweep(args, argv, doc, shape, dev, dtype, t0)
    if args.front:
        return _front(args, argv, doc, dev, dtype, t0)
    if args.launch_ab:
        return _launch_ab(args, argv, doc, dev, dtype, t0)
    sets = []
    if "torch" in args.layer:
        sets.append(("torch", "torch-ops Llama layer",
                     lambda: llama.torch_layers(args.layers, shape, dev, dtype, args.attention), args.modes))
    if "hf" in args.layer:
        try:
            import transformers  # noqa: F401
            hf_modes = [m for m in args.hf_modes if m in args.modes] if len(args.layer) > 1 else args.hf_modes
            if args.device == "cpu":
                hf_modes = [m for m in hf_modes if m in modes.CPU_MODES]
            sets.append(("hf", "transformers LlamaDecoderLayer (%s)" % transformers.__version__,
                         lambda: llama.hf_layers(args.layers, shape, dev, dtype, args.attention), hf_modes))
        except ImportError as e:
            print("transformers layer: skipped (%s)" % e, flush=True)
            doc["hf_skipped"] = str(e)
    if "encoder" in args.layer:
        sets.append(("encoder", "torch.nn.TransformerEncoderLayer",
                     lambda: encoder.encoder_layers(args.layers, shape, dev, dtype), args.modes))
    for kind, title, make, run_modes in sets:
        print("\n== %s: %s" % (title, ", ".join(run_modes)), flush=True)
        try:
            s = run_set(title, make, args, shape, dtype, bw, run_modes)
            s["layer"] = kind
            doc["sets"].append(s)
        except Exception as e:
            print("%s: FAILED: %s: %s" % (title, type(e).__name__, e), flush=True)
            doc["sets"].append({"title": title, "layer": kind, "error": "%s: %s" % (type(e).__name__, e)})
    doc["wall_s"] = time.perf_counter() - t0
    print("\ncommand: python3 -m vmmrt.torch.bench %s   (%.0f s)" % (" ".join(argv), doc["wall_s"]), flush=True)
    if args.json:
        report.dump(args.json, doc)
    failed = any("error" in s or any("error" in r for lp in s.get("loops", {}).values() for r in lp["rows"])
                 for s in doc["sets"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
