# SPDX-License-Identifier: LGPL-2.1-or-later
"""--front: PyTorch's own answers to running out of device memory against
vmmrt.torch's, each measured as a point of (step time, whole-step peak) in
one process and one loop, and the two fronts compared (:mod:`front`).

PyTorch's options (family "torch"):

eager             the layers as they are
ckpt k            eager, the first k layers under
                  torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
graphs            torch.cuda.make_graphed_callables over the layers
graphs+ckpt k     the same over the layers, the first k wrapped in a module
                  whose forward checkpoints the layer (torch captures the
                  recomputation into the backward graph)
save_on_cpu       eager under torch.autograd.graph.save_on_cpu(pin_memory=True)

vmmrt.torch's (family "vmmrt"): none (slots resident), auto
(offload="auto"), full offload in pingpong and in remap, every layer
recomputed (a hand plan), and memory_budget= at budgets from graphs' peak
(or keeping all's predicted peak, the lower) down to the smallest plan the planner finds (their plans found before
building: a budget whose plan is one already measured is not run again).
On the CPU (host backend) the eager options only: no graphs, vmmrt with
graphs=False.

k: --front-ks values spread over 1..L. Each point is built, measured and
torn down before the next (modes.build / modes.measure / modes.teardown),
from the same weights, with the same inputs; its gradients of one step are
compared with the loop's reference (graphs in set_to_none with one
microbatch, eager otherwise). The options that capture no graph (eager,
ckpt k, save_on_cpu) run first, the reference next, then the rest: the
process's first capture keeps ~70 MiB of driver memory for good, which a
graph-free point measured after it would be charged (a point before the
reference keeps its gradients on the host until the reference has run).
The peak is modes.measure's driver-level
peak of one whole step, minus the driver's used memory before the model
was made: parameters, gradients and optimizer states are in it. A point
that fails is reported and the others still run; the JSON is written after
every point, so a run stopped by a time limit keeps what it measured.
"""
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch

import vmmrt.torch as vt
from vmmrt.torch import _compat, budget, memory
from vmmrt.torch.bench import front, llama, loops, modes, progress, shapes, sweep

MiB = float(1 << 20)
TORCH_OPTIONS = ("eager", "ckpt", "graph", "graph-ckpt", "save_on_cpu")
# The options that capture no CUDA graph. The process's first capture leaves
# ~70 MiB of driver-level memory that nothing gives back (destroying the
# graph, empty_cache, cuDeviceGraphMemTrim: H100, torch 2.11): a point
# measured after any graphed one would carry it, a fresh process's would not.
GRAPH_FREE = ("eager", "ckpt", "save_on_cpu")


def k_values(n, count):
    """``count`` values of k spread over 1..n (fewer where n is smaller)."""
    if n < 1 or count < 1:
        return []
    if count == 1:
        return [n]
    return sorted({int(round(1 + (n - 1) * i / (count - 1))) for i in range(count)})


class Ckpt(torch.nn.Module):
    """A layer whose forward is checkpointed (non-reentrant), as users wrap one."""

    def __init__(self, layer, preserve_rng_state=True):
        super().__init__()
        self.layer = layer
        self.preserve_rng_state = preserve_rng_state

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.layer, x, use_reentrant=False,
                                                 preserve_rng_state=self.preserve_rng_state)


class Option:
    """One point to measure: ``label``, ``family``, ``kind`` (a TORCH_OPTIONS
    entry, a modes.MODES one, "recompute" or "budget") and its parameter
    (k, or the budget in bytes)."""

    def __init__(self, label, family, kind, param=None):
        self.label, self.family, self.kind, self.param = label, family, kind, param


def options(n, cuda, ks, families):
    """The static options in the order they run (budgets come after recompute all)."""
    out = []
    if "torch" in families:
        out.append(Option("eager", "torch", "eager"))
        out += [Option("ckpt %d" % k, "torch", "ckpt", k) for k in ks]
        if cuda:
            out.append(Option("graphs", "torch", "graph"))
            out += [Option("graphs+ckpt %d" % k, "torch", "graph-ckpt", k) for k in ks]
        out.append(Option("save_on_cpu", "torch", "save_on_cpu"))
    if "vmmrt" in families:
        if cuda:
            out += [Option("vmmrt none", "vmmrt", "none"), Option("vmmrt auto", "vmmrt", "planner"),
                    Option("vmmrt pingpong", "vmmrt", "pingpong"), Option("vmmrt remap", "vmmrt", "remap")]
        else:
            out += [Option("vmmrt eager-pingpong", "vmmrt", "eager-pingpong"),
                    Option("vmmrt eager-remap", "vmmrt", "eager-remap")]
        out.append(Option("vmmrt recompute all", "vmmrt", "recompute"))
    return out


def order(opts, ref_kind):
    """The order the points run in: those that capture no graph first (the
    reference first among them where it is one), then the reference, then
    the rest as given. A graph-free point measured after the first capture
    would be charged that capture's one-time memory (GRAPH_FREE)."""
    free = [o for o in opts if o.kind in GRAPH_FREE]
    rest = [o for o in opts if o.kind not in GRAPH_FREE]
    free.sort(key=lambda o: o.kind != ref_kind)
    rest.sort(key=lambda o: o.kind != ref_kind)
    return free + rest


def only(opts, labels, flag="--front-only"):
    """The options whose label is one of ``labels`` (comma-separated;
    None: all of them); a label that names none is an error (``flag``'s)."""
    if not labels:
        return opts
    want = [l.strip() for l in labels.split(",") if l.strip()]
    known = {o.label for o in opts}
    unknown = [l for l in want if l not in known]
    if unknown:
        raise ValueError("%s: no option %s here (the options: %s)"
                         % (flag, ", ".join(repr(l) for l in unknown), ", ".join(o.label for o in opts)))
    return [o for o in opts if o.label in want]


def budget_levels(labels, front_only=None, families=("torch", "vmmrt")):
    """--front-budgets-at's PyTorch options (comma-separated labels), at
    whose measured peaks budget points are made; ValueError where one is
    not a PyTorch option's label, or an option they need is left out:
    the labels themselves and vmmrt recompute all, whose build measures
    what the planner plans from."""
    want = [l.strip() for l in (labels or "").split(",") if l.strip()]
    if not want:
        raise ValueError("--front-budgets-at: one PyTorch option's label or more, comma-separated")
    bad = [l for l in want if l.startswith("vmmrt") or l.startswith("budget")]
    if bad:
        raise ValueError("--front-budgets-at: %s: PyTorch's options only (eager, ckpt k, graphs, graphs+ckpt k, "
                         "save_on_cpu)" % ", ".join(repr(l) for l in bad))
    if "vmmrt" not in families or "torch" not in families:
        raise ValueError("--front-budgets-at needs both families (--front-families torch,vmmrt)")
    if front_only:
        kept = {l.strip() for l in front_only.split(",")}
        missing = [l for l in want + ["vmmrt recompute all"] if l not in kept]
        if missing:
            raise ValueError("--front-budgets-at with --front-only: it needs %s among the options"
                             % ", ".join(repr(l) for l in missing))
    return want


def _through(seq, x):
    for m in seq:
        x = m(x)
    return x


def build(opt, layers, sample, args, reserve, cuda, step=0, loop="set_to_none"):
    """modes.Built for ``opt`` over ``layers``; ``loop``: the training loop
    a budget plans for (Budget(loop=))."""
    n = len(layers)
    if opt.kind in modes.MODES:
        return modes.build(opt.kind, layers, sample, args, loop)
    t0 = time.perf_counter()
    off, note = None, None
    if opt.kind == "ckpt":
        seq = [Ckpt(m) if i < opt.param else m for i, m in enumerate(layers)]
    elif opt.kind == "graph-ckpt":
        try:
            keep_rng = not any(getattr(m, "rng_tracked", False) for m in layers)
            if not keep_rng:
                note = "preserve_rng_state=False (Megatron's RNG tracker: see shapes.MegatronLayer)"
            mods = tuple(Ckpt(m, keep_rng) if i < opt.param else m for i, m in enumerate(layers))
            seq = list(torch.cuda.make_graphed_callables(mods, tuple((sample(),) for _ in mods)))
        except RuntimeError as e:
            # A torch whose checkpoint reads the CUDA generator's state under
            # capture refuses it ("Cannot call CUDAGeneratorImpl::current_seed
            # during CUDA graph capture"): the layers draw no random numbers,
            # so not preserving it computes the same; said in the point.
            for m in layers:
                m.__dict__.pop("forward", None)
            torch.cuda.synchronize()
            mods = tuple(Ckpt(m, False) if i < opt.param else m for i, m in enumerate(layers))
            seq = list(torch.cuda.make_graphed_callables(mods, tuple((sample(),) for _ in mods)))
            note = "preserve_rng_state=False (with the default, torch raised: %s)" % str(e).splitlines()[0][:160]
    elif opt.kind in ("recompute", "budget"):
        b = vt.Budget(layers=["recompute"] * n, reserve=reserve, step=step, loop=loop) if opt.kind == "recompute" \
            else vt.Budget(opt.param, reserve=reserve, step=step, loop=loop)
        # (recompute all: the planner chooses ping-pong, which moves the checkpoints through two banks, or
        # mode none, which keeps each in its slot from its forward to its backward: budget.hand_plan)
        mode = "auto" if opt.kind == "recompute" else args.front_budget_mode
        # the library's default under a budget (no plan) unless the run names one
        plan = {} if getattr(args, "memory_plan", None) is None else {"memory_plan": args.memory_plan}

        def make(b):
            return list(vt.make_graphed_callables(tuple(layers), tuple((sample(),) for _ in layers),
                                                  names=["layer%d" % i for i in range(n)], mode=mode,
                                                  lookahead=args.lookahead, margin=args.margin, graphs=cuda,
                                                  memory_budget=b, **plan))
        smallest = None
        try:
            seq = make(b)
        except vt.BudgetError as e:
            # The build plans from its own warm-up, whose static memory can
            # come out a few MiB above the costs the budgets were chosen
            # from: the lowest budget then asks for less than its smallest.
            if opt.kind != "budget" or not e.smallest or e.smallest > opt.param * 1.02:
                raise
            smallest = e.smallest
        if smallest is not None:
            # Out of the except block, whose traceback holds the failed
            # build's frames: what it left (its warm-up's gradients, its
            # graphs) would sit in the retry's static memory (on the H200,
            # persistent loop, 256 MiB: the retry then found its smallest
            # plan that much above the one it was given, and failed).
            for m in layers:
                m.__dict__.pop("forward", None)
                m.zero_grad(set_to_none=True)
            gc.collect()
            fresh(cuda)
            seq = make(vt.Budget(smallest, reserve=reserve, step=step, loop=loop))
            note = "given %.0f MiB, the build's smallest plan (%.0f MiB asked)" % (smallest / MiB, opt.param / MiB)
        off = vt.offload_of(seq[0])
    else:
        raise ValueError("unknown option %r" % opt.kind)
    if cuda:
        torch.cuda.synchronize()
    built = modes.Built(opt.kind, lambda x: _through(seq, x), off, time.perf_counter() - t0,
                        loops.optimizer(modes.parameters(layers), args.optimizer))
    built.note = note
    return built


def eager_modules():
    """CUDA loads a kernel's module on its first launch, and keeps it: in one
    process, the kernels an earlier point loaded would sit in every later
    point's peak over the memory before the model, where a fresh process
    counts only its own. Loaded all at once before the model (unless the
    caller chose otherwise), they are in every point's base alike: on the
    H200 the graphed points' peaks then agreed within 0.3 % with each option
    alone in a fresh process, against 3 % under lazy loading. Call before
    CUDA starts."""
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")


def _peak_at_start(sampled):
    """Whether a step's peak (memory.PeakSampler.as_dict()) was its first
    reading: nothing in the step took more from the driver."""
    return bool(sampled) and sampled.get("peak") is not None and sampled.get("peak") == sampled.get("start")


def fresh(cuda):
    """What a fresh process would not hold: cuBLAS keeps a workspace per
    (handle, stream) in the caching allocator, and every
    torch.cuda.make_graphed_callables warms up on a new side stream, so
    without this each graphed point would leave one behind for every later
    point's peak to count."""
    if not cuda:
        return
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    vt.empty_cache()          # (and the runtimes closed before, once PyTorch gave their arena segments back)


def warm(layers, x, gy, kind, attention, dev):
    """One eager step (loops.warm_process) and the caches emptied after it:
    the bytes the device keeps of it, which the front and a point run alone
    (bench/alone.py) count in their base."""
    before = memory.driver_used(dev)
    with llama.attention_backend(attention):
        loops.warm_process(layers, x, gy, kind)
    fresh(True)
    return max(0, memory.driver_used(dev) - before)


def isolated(opt, layers):
    """Whether the option runs in a fresh process of its own (bench/alone.py):
    torch's graphs of checkpointed Megatron layers fail inside the backward's
    capture (an operation on the legacy stream, H200, torch 2.11), and the
    process is not clean after it even once the capture is ended again
    (every later point's peak grew by GBs): one failure would make every
    later point of the front wrong. Torch's graphs of the plain layers too,
    since the graph-free options run first: after eager and ckpt 4 had run
    on them, their capture failed the same way (an AccumulateGrad node of
    an earlier pass on the legacy stream, H100)."""
    return opt.kind in ("graph", "graph-ckpt") and any(getattr(m, "rng_tracked", False) for m in layers)


def reference_kind(wanted, opts, layers):
    """The kind of option whose gradients the others are checked against:
    the loop's (``wanted``) where it runs here, else eager, else none. A
    point run alone (:func:`isolated`) keeps no gradients to compare: with
    torch's graphs of Megatron's layers isolated, eager is the set_to_none
    loop's reference."""
    if any(o.kind == wanted and not isolated(o, layers) for o in opts):
        return wanted
    return "eager" if any(o.kind == "eager" for o in opts) else None


def alone_point(pt, args, shape, loop, runner=None):
    """The figures of ``pt``'s option measured alone in a fresh process
    (:func:`isolated`): its step time and peak over its own memory before
    the model, or the error it ended with; its gradients are not compared
    (said in the point)."""
    from vmmrt.torch.bench import alone
    runner = runner or alone._subprocess
    try:
        got = runner(alone._argv(args, shape, pt, loop))
    except Exception as e:
        return {"error": "alone in a fresh process: %s: %s" % (type(e).__name__, str(e)[-300:]),
                "step_ms": float("nan"), "peak": None, "build_s": float("nan")}
    return {"step_ms": got["step_ms"], "peak": got.get("peak"), "peak_abs": got.get("peak_abs"),
            "predicted_peak_bytes": got.get("predicted_peak_bytes"),
            "iterations": got.get("iterations"), "build_s": float("nan"), "grads_text": "not compared (run alone)",
            "note": "run alone in a fresh process (bench/alone.py): a failed capture of this option leaves a "
                    "process no later point could be measured in"}


def plan_fields(plan):
    """What a point records of its offload's plan: the budget planner's
    (memory_budget=) predicts a peak; offload="auto"'s plan does not itself
    (its whole-step model does: :func:`model_fields`)."""
    if plan is None:
        return {}
    out = {"plan": plan.summary()}
    if getattr(plan, "peak_bytes", None) is not None:
        out["predicted_peak_bytes"] = plan.peak_bytes
    saving = plan.predicted_saving() if hasattr(plan, "predicted_saving") else None
    if saving is not None:
        out["predicted_vs_nothing_bytes"] = saving
    return out


def model_fields(off, reserve, step, loop):
    """A plan made without memory_budget= (mode none's, offload="auto"'s)
    predicts the whole step by its model (Offload.step_model), told the
    optimizer's states and temporaries as the budget points are, in the
    loop the front runs; nothing where the plan predicts its own."""
    if off is None or getattr(off.plan, "peak_bytes", None) is not None or off.step_model is None:
        return {}
    return {"predicted_peak_bytes": off.step_model.peak(reserve, step, loop)}


def predicted_text(pt):
    """The point's whole-step peak as its plan predicted it (the budget
    planner's model: driver-level, the memory before the model included)
    against the measured one, or None where the plan predicts none: the
    memory plan's and the planner's target is within 2 % (plancheck.TOLERANCE)."""
    pred, got = pt.get("predicted_peak_bytes"), pt.get("peak_abs")
    if not pred or not got:
        return None
    from vmmrt.torch.plancheck import TOLERANCE
    off = pred / got - 1
    # (a budget point's reserve holds what recompute all's peak measured
    # over its prediction: that point's error is the model's, the budgets'
    # are what is left of it)
    # (both counted as the device's used memory in all: the line's own peak
    # is over the memory before the model, a different base)
    return "predicted peak %.0f MiB (%+.1f %% of the measured, %.0f MiB in all%s%s)" % (
        pred / MiB, 100 * off, got / MiB,
        "" if abs(off) <= TOLERANCE else ", off by more than %.0f %%" % (100 * TOLERANCE),
        "; recompute all's excess reserved" if pt.get("option") == "budget" else "")


def placement_fields(off):
    """How the saved bytes reached their slots at the captures
    (Offload.placement): born there, or computed elsewhere and copied in
    by each forward (an op without an out= overload: a copy per layer per
    step that torch's graphs do not make), with the reasons; nothing where
    every byte was born in place."""
    p = off.placement()
    if not p["copied"] + p["copy"]:
        return {}
    return {"placement": {k: p[k] for k in ("placed", "copied", "copy", "resident", "pool", "why")}}


def timing_fields(off):
    """What a point records of the times its planner read (vmmrt.torch.
    replay_times): per layer, where they came from (its graphs' replays or
    the warm-up), both figures, the copies' bandwidth under the layers'
    compute and the compute's time lost to them (per ms of copy); nothing
    where every layer kept its warm-up's."""
    if off is None or all(lay.times_from == "warm-up" for lay in off.layers):
        return {}
    return {"planner_times": [{"layer": lay.name, "from": lay.times_from,
                               "fwd_ms": min(lay.fwd_ms) if lay.fwd_ms else None,
                               "bwd_ms": min(lay.bwd_ms) if lay.bwd_ms else None,
                               "warmup_ms": lay.warmup_ms} for lay in off.layers],
            "copy_gbps_under_compute": off.copy_gbps,
            "copy_contention": getattr(off, "copy_contention", None)}


def _grads(cmp, spread, math_attention):
    """(right or None, words) of modes.compare's result against the reference."""
    same, ulps, _ = cmp
    if same is None:
        return None, "not compared"
    if not same and spread and ulps is not None and ulps <= spread:
        return True, "%.3g ulp (within the reference's spread)" % ulps
    ok, words = sweep.grads_check(cmp, math_attention)
    return ok, words if ok else "WRONG: " + words


class Front:
    """One shape in one loop: the layers once, then a point per option."""

    def __init__(self, args, spec, loop, dev, dtype, on_point=None):
        self.args, self.spec, self.loop, self.dev, self.dtype = args, spec, loop, dev, dtype
        self.cuda = dev.type == "cuda"
        self.on_point = on_point or (lambda doc: None)
        self.points = []
        self.base = None
        self.warm = None
        self.doc = {"title": "%s, %s loop" % (spec.name, loop.name), "shape": spec.as_dict(),
                    "describe": spec.describe(), "loop": loop.name, "microbatches": loop.microbatches,
                    "optimizer": args.optimizer, "points": self.points}

    def _peak(self, row):
        p = (row.get("peak") or {}).get("peak")
        return (None, None) if p is None else (p - self.base, p)

    def run(self):
        a, spec = self.args, self.spec
        fresh(self.cuda)
        self.base = memory.driver_used(self.dev) if self.cuda else None
        layers, dims = shapes.build(spec, self.dev, self.dtype, a.attention)
        n = len(layers)
        weights = modes.Weights(layers)
        g = torch.Generator(device="cpu").manual_seed(7)
        mb = self.loop.microbatches
        xs = [torch.randn(*dims, generator=g).to(self.dev, self.dtype).requires_grad_() for _ in range(mb)]
        gys = [torch.randn(*dims, generator=g).to(self.dev, self.dtype) for _ in range(mb)]

        def sample():
            return torch.randn(*dims, device=self.dev, dtype=self.dtype, requires_grad=True)

        # what the process loads once: in the base, under no option's peak
        self.warm = warm(layers, xs[0], gys[0], a.optimizer, a.attention, self.dev) if self.cuda else None
        if self.warm is not None:
            self.base += self.warm

        ks = k_values(n, a.front_ks)
        opts = only(options(n, self.cuda, ks, a.front_families), getattr(a, "front_only", None))
        ref_kind = reference_kind(self.loop.reference if self.cuda else "eager", opts, layers)
        # graph-free points first; those before the reference keep their
        # gradients on the host until it has run (self.pending)
        opts = order(opts, ref_kind)
        budgets = a.front_budgets if "vmmrt" in a.front_families and not getattr(a, "front_only", None) else 0
        at = getattr(a, "front_budgets_at", None)
        at = budget_levels(at, getattr(a, "front_only", None), a.front_families) if at else []
        only(opts, ",".join(at), "--front-budgets-at")        # (each an option of this run)
        self.reserve, self.step = loops.optimizer_memory(modes.parameters(layers), a.optimizer)
        self.doc.update(ks=ks, reference=None, base_bytes=self.base, warm_bytes=self.warm, reserve_bytes=self.reserve,
                        step_bytes=self.step)
        self.ref, self.spread, self.plan_of_recompute, self.seen = None, None, None, {}
        self.ref_kind, self.ref_done, self.pending = ref_kind, False, []
        bar = progress.Progress(len(opts) + (len(at) or budgets), "%s, %s" % (spec.name, self.loop.name))
        with llama.attention_backend(a.attention):
            for o in opts:
                self._point(o, layers, weights, xs, gys, sample, bar, o.kind == ref_kind)
            if budgets or at:
                for o in self._budget_options(n, budgets, at):
                    self._point(o, layers, weights, xs, gys, sample, bar, False)
        self._compare_pending()
        bar.close()
        del layers, weights, xs, gys
        return self.doc

    def _point(self, o, layers, weights, xs, gys, sample, bar, is_ref):
        a = self.args
        bar.start(o.label)
        built = None
        pt = {"label": o.label, "family": o.family, "option": o.kind, "param": o.param}
        if not is_ref and isolated(o, layers):
            pt.update(alone_point(pt, a, self.spec.name, self.loop.name))
            self.points.append(pt)
            bar.end(self._line(len(self.points), bar.n, pt))
            self.on_point(self.doc)
            return
        try:
            if layers and hasattr(layers[0], "reseed"):
                layers[0].reseed()
            if self.cuda:
                # the model, the inputs and whatever the points before left
                # (a process's one-time costs: the first capture's, say):
                # equal at every point unless a point leaves something behind
                pt["before_build"] = memory.driver_used(self.dev) - self.base
            built = build(o, layers, sample, a, self.reserve, self.cuda, self.step, self.loop.name)
            row, grads = modes.measure(built, layers, self.loop, xs, gys, a, weights)
            if is_ref:
                self.ref = modes.host_copies(grads)
                del grads
                # its own run-to-run spread (flash attention's backward is not
                # deterministic); the CPU's kernels are
                self.spread = modes.spread(built, layers, self.loop, xs, gys, weights, self.ref) if self.cuda \
                    else 0.0
                pt["grads_ok"], pt["grads_text"] = True, "reference" + (
                    "" if not self.spread else " (run to run %.3g ulp)" % self.spread)
                self.doc["reference"] = o.label
            elif not self.ref_done and self.ref_kind is not None:
                # the reference runs later (order): its gradients are not here
                # yet. Pageable copies: up to seven points wait (eager, ckpt k,
                # save_on_cpu), each the model's size, and each is moved back once
                self.pending.append((pt, [None if g is None else g.detach().cpu() for g in grads]))
                del grads
                pt["grads_text"] = "pending (compared once the reference has run)"
            else:
                self._judge(pt, modes.compare(grads, self.ref))
                del grads
            if o.kind == "recompute" and built.offload is not None and built.offload.plan is not None:
                self.plan_of_recompute = (built.offload.plan, self._peak(row)[1])
            if built.offload is not None:
                pt.update(plan_fields(built.offload.plan), **timing_fields(built.offload),
                          **placement_fields(built.offload),
                          **model_fields(built.offload, self.reserve, self.step, self.loop.name))
            peak, peak_abs = self._peak(row)
            pt.update(step_ms=row["step_ms"], step_ms_min=row["step_ms_min"], step_ms_max=row["step_ms_max"],
                      iterations=row["iterations"], fwd_bwd_ms=row["fwd_bwd_ms"], opt_ms=row["opt_ms"],
                      build_s=row["build_s"], peak=peak, peak_abs=peak_abs,
                      peak_samples=(row.get("peak") or {}).get("samples"),
                      peak_rate_hz=(row.get("peak") or {}).get("rate_hz"),
                      peak_where=(row.get("peak") or {}).get("where"),
                      peak_at_start=_peak_at_start(row.get("peak")),
                      d2h_bytes_per_step=row.get("d2h_bytes_per_step"),
                      launch_fwd_us_per_layer=row.get("launch_fwd_us_per_layer"),
                      launch_bwd_us_per_layer=row.get("launch_bwd_us_per_layer"),
                      launch_us_per_layer_step=row.get("launch_us_per_layer_step"),
                      driver_calls_per_step=row.get("driver_calls_per_step"),
                      optimizer_memory=row.get("optimizer_memory"), pages=row.get("pages"),
                      memory=row.get("memory"))
        except Exception as e:  # a point that fails is reported, the others still run
            # where it failed, in the JSON and on stderr: the table keeps the one line
            pt.update(error="%s: %s" % (type(e).__name__, e), step_ms=float("nan"), peak=None,
                      traceback=traceback.format_exc())
            sys.stderr.write(pt["traceback"])
            grads = None
            if self.cuda:
                # torch's graphs of Megatron's checkpointed layers fail inside
                # the capture (an op on the legacy stream, H200): without
                # this every later point's random numbers fail too; and the
                # caching allocator would still route to the failed capture's
                # pool, so that the next emptying of the cache (a later
                # point's, or a pool's destructor) aborts the process
                # (megatron, H100: captures_underway.empty()).
                _compat.end_abandoned_pools()
                _compat.end_abandoned_capture()
        finally:
            if built is not None:
                if getattr(built, "note", None):
                    pt["note"] = built.note
                try:
                    modes.teardown(built, layers, weights, xs)
                except Exception as e:
                    pt.setdefault("error", "teardown: %s: %s" % (type(e).__name__, e))
            fresh(self.cuda)
        self.points.append(pt)
        bar.end(self._line(len(self.points), bar.n, pt))
        if is_ref:
            self.ref_done = True
            self._compare_pending()
        self.on_point(self.doc)

    def _judge(self, pt, cmp):
        pt["grads_ok"], pt["grads_text"] = _grads(cmp, self.spread, self.args.attention == "math")
        pt["grad_bitwise"], pt["grad_max_ulp"], pt["grad_norm_ratio"] = cmp

    def _compare_pending(self):
        """The points that ran before the reference, against it now (on the
        device, between points: no point's peak sees them); where the
        reference failed, they say so."""
        for pt, host in self.pending:
            if self.ref is None:
                pt["grads_text"] = "not compared (the reference did not run)"
                continue
            dev = [None if h is None else h.to(self.dev, non_blocking=True) for h in host]
            self._judge(pt, modes.compare(dev, self.ref))
            del dev
            print("[front] %s: grads %s" % (pt["label"], pt["grads_text"]), flush=True)
        self.pending = []
        fresh(self.cuda)

    def _line(self, i, n, pt):
        if pt.get("error"):
            return "[%d/%d] %-24s FAILED: %s" % (i, n, pt["label"], pt["error"])
        ref = next((p for p in self.points if p["label"] in ("graphs", "eager") and not p.get("error")), None)
        parts = ["[%d/%d] %-24s build %5.1f s  step %8.2f ms" % (i, n, pt["label"], pt["build_s"], pt["step_ms"])]
        if ref is not None and ref is not pt:
            parts.append("(x%.3f %s)" % (pt["step_ms"] / ref["step_ms"], ref["label"]))
        if pt.get("peak") is not None:
            w = pt.get("peak_where") or {}
            # Driver-level memory moves only when something is allocated from
            # or given back to the driver: with every cache full from the
            # warm-up steps it does not move in the measured step, and the
            # step's first reading is its peak (the phase then says nothing
            # of where the memory was taken).
            where = "held from the step's start" if pt.get("peak_at_start") else \
                "in its %s" % w["phase"] if w.get("phase") else None
            parts.append("peak %.0f MiB over the memory before the model%s" % (
                pt["peak"] / MiB, " (%s, PyTorch's allocator holding %.0f)" % (where, w["allocator"] / MiB)
                if where and w.get("allocator") is not None else ""))
        pred = predicted_text(pt)
        if pred:
            parts.append(pred)
        pg = pt.get("pages") or {}
        if pg.get("plan_bytes"):
            pool = pg["graph_pool_bytes"]
            on = pg.get("graph_pool_pages_bytes", pool)
            parts.append("pages %.0f MiB (graphs' pool %.0f%s%s)" % (
                pg["plan_bytes"] / MiB, pool / MiB,
                " on %.0f of pages, %.0f alive at once" % (on / MiB, pg.get("graph_pool_live_peak_bytes", 0) / MiB)
                if on < pool else "",
                ", %d conflicts" % pg["plan_conflicts"] if pg.get("plan_conflicts") else ""))
        om = pt.get("optimizer_memory") or {}
        if om.get("routed_steps"):
            parts.append("optimizer in the pages (%.0f MiB lent, %.0f used, %.0f from the driver, hooks %.0f us)"
                         % (om["lent_bytes"] / MiB, om["peak_bytes"] / MiB, om["fallback_bytes"] / MiB, om["hook_us"]))
        pl = pt.get("placement")
        if pl:      # (only where something is copied: placement_fields)
            why = sorted(pl["why"].items(), key=lambda kv: -kv[1])
            parts.append("copied into their slots %.0f MiB a step (%s)" % (
                (pl["copied"] + pl["copy"]) / MiB, "; ".join("%s: %.0f MiB" % (w, n / MiB) for w, n in why[:2])))
        parts.append("grads %s" % pt.get("grads_text", "-"))
        line = "  ".join(parts)
        if pt.get("memory"):
            # by owner, where the step's memory stands still (every cache
            # full): a peak above another point's is found in one part
            line += "\n      between forward and backward: " + memory.describe(pt["memory"])
            if pt.get("before_build") is not None:
                line += "; before its build %.0f MiB over the memory before the model" % (pt["before_build"] / MiB)
        line += self._against_none(pt)
        busiest = pg.get("busiest")
        if busiest and busiest.get("bytes"):
            # what sizes the pages: a peak above eager's is in one of these
            line += "\n      the pages' busiest use, %s: %s MiB" % (busiest["use"], ", ".join(
                "%s %.0f" % (k, v / MiB) for k, v in sorted(busiest["bytes"].items(), key=lambda kv: -kv[1])))
            if (pg.get("busiest_grad_share") or pg.get("busiest_grad_share_bound")) and \
                    self.loop.name == "set_to_none":
                line += "; of its gradients, %.0f MiB could lie on resident bytes its backward has read, %.0f " \
                        "with its temporaries placed around them (vmmrt.torch.gradshare); the plan maps %.0f MiB " \
                        "of the step's gradients so" % (
                            (pg.get("busiest_grad_share") or 0) / MiB, (pg.get("busiest_grad_share_bound") or 0) / MiB,
                            (pg.get("plan_grad_share_bytes") or 0) / MiB)
            if pg.get("plan_chained_bytes"):
                line += "; %.0f MiB of output gradients on the pages of the argument gradients handed them " \
                        "(memplan.chain_gouts)" % (pg["plan_chained_bytes"] / MiB)
        return line

    def _against_none(self, pt):
        """offload="auto"'s plan says what it predicts against moving
        nothing in this loop; mode none's point measured moving nothing:
        the line that checks the prediction (``measured_vs_none_bytes``)."""
        loop = self.loop
        pred = (pt.get("predicted_vs_nothing_bytes") or {}).get(loop.name)
        none = next((p for p in self.points if p.get("option") == "none" and p.get("peak") is not None), None)
        if pred is None or none is None or pt.get("peak") is None:
            return ""
        pt["measured_vs_none_bytes"] = pt["peak"] - none["peak"]
        return "\n      its plan against moving nothing (%s loop): predicted %+.0f MiB, measured %+.0f against %s" % (
            loop.name, pred / MiB, pt["measured_vs_none_bytes"] / MiB, none["label"])

    def _budget_options(self, n, count, at=()):
        """memory_budget= options from graphs' peak or keeping all's
        predicted peak, the lower, down to the smallest plan, from the costs the
        recompute-all build measured; a plan met before is not run again.
        ``at``: instead, one at the measured peak of each of these PyTorch
        options (their labels): the planner at that option's memory level."""
        if self.plan_of_recompute is None:
            print("[front] no budgets: the recompute-all point did not run (its build measures what the planner "
                  "plans from)", flush=True)
            return []
        plan, measured = self.plan_of_recompute
        costs, inputs = plan.costs, sweep._inputs(plan)
        # What the model does not see: recompute all's measured peak over its
        # prediction, reserved for every budget, as a user would measure one
        # step and reserve the rest.
        extra = max(0, measured - plan.peak_bytes) if measured else 0
        self.reserve += extra
        inputs["static_bytes"] += extra
        mode = self.args.front_budget_mode
        la = self.args.lookahead if mode == "remap" else 1
        strategies = budget.auto_strategies() if mode == "auto" else [(mode, la)]
        try:
            budget.search(costs, 1, strategies=strategies, **inputs)
            smallest = 1
        except budget.BudgetError as e:
            smallest = e.smallest
        # From graphs' peak, or keeping everything's predicted peak where it is
        # lower (every budget above it plans to keep everything: on Llama with
        # the memory plan 2 of 4 budgets were that plan again), down.
        top = budget.evaluate(costs, ["keep"] * n, "pingpong", 1, **inputs).peak_bytes
        graph = next((p for p in self.points if p["option"] == "graph" and p.get("peak_abs")), None)
        if graph is not None:
            top = min(top, graph["peak_abs"])
        top = max(top, smallest)
        if at:
            levels = []
            for name in at:
                p = next((q for q in self.points if q["label"] == name and q.get("peak_abs")), None)
                if p is None:
                    print("[front] %s: no peak measured; no budget at it" % name, flush=True)
                else:
                    levels.append((int(p["peak_abs"]), name))
        else:
            levels = [(int(top - (top - smallest) * i / (count - 1)), None) for i in range(count)] if count > 1 \
                else [(top, None)]
        budgets = [b for b, _ in levels]
        self.doc.update(budgets=budgets, smallest_plan_bytes=smallest, calibration_bytes=extra,
                        budget_mode=mode, budgets_at=[name for _, name in levels if name])
        out, seen = [], {}
        for b, name in levels:
            try:
                sig = sweep._sig(budget.search(costs, b, strategies=strategies, **inputs))
            except budget.BudgetError:
                # by how much: the planner's distance to that level ([planner] asks
                # for a plan at checkpointing every layer's peak); and whether the
                # smallest plan, as recompute all measured it, is within it: then
                # the level is lost to the model's error, not to memory
                fits = measured is not None and measured <= b
                if fits:
                    self.doc.setdefault("budgets_missed", []).append([b, measured, smallest])
                print("[front] memory_budget=%.0f MiB%s: no plan fits (the smallest plan predicts %.0f MiB, "
                      "%.0f over%s); not measured" % (
                          b / MiB, " (%s's peak)" % name if name else "", smallest / MiB, (smallest - b) / MiB,
                          "; measured as recompute all it is %.0f MiB, within it: the model's %+.1f %% missed it"
                          % (measured / MiB, 100.0 * (smallest / measured - 1)) if fits else ""), flush=True)
                continue
            label = ("budget %.0f MiB" if b >= 100 * MiB else "budget %.2f MiB") % (b / MiB) + (
                " (%s's peak)" % name if name else "")
            if sig in seen:
                print("[front] %s: the plan of %s again; not measured again" % (label, seen[sig]), flush=True)
                continue
            seen[sig] = label
            out.append(Option(label, "vmmrt", "budget", b))
        return out


def run(args, spec, dev, dtype, docs, save=None):
    """A front per loop of ``args.loops`` over ``spec``, printed; each
    front's document is appended to ``docs`` before it runs, and ``save()``
    called after every point (the JSON so far)."""
    for k, name in enumerate(args.loops):
        if k and args.fresh_loops:
            fresh_loop(args, spec, name, docs, save)
            continue
        loop = loops.Loop(name, args.microbatches)
        print("\n-- front: %s; %s" % (spec.describe(), loop.describe(args.optimizer)), flush=True)
        fr = Front(args, spec, loop, dev, dtype, on_point=lambda doc: save and save())
        docs.append(fr.doc)
        try:
            fr.run()
        except Exception as e:      # the layers could not be made: said, the next shape still runs
            fr.doc["error"] = "%s: %s" % (type(e).__name__, e)
            print("front %s: FAILED: %s" % (fr.doc["title"], fr.doc["error"]), flush=True)
            if save:
                save()
            if isinstance(e, shapes.Unavailable):
                return
            continue
        notes = ["front (*): on its family's Pareto front; grads: against %s" % (fr.doc.get("reference") or "nothing")]
        if fr.base is not None:
            notes.append("peak: the whole step's driver-level peak over the %.0f MiB the device used before the model "
                         "was made, with the %.0f MiB one eager step left that a process loads once (kernels, "
                         "libraries' handles); a budget point is named by the memory_budget= it was given, which "
                         "counts the device's used memory in all" % (fr.base / MiB, (fr.warm or 0) / MiB))
        text, v = front.report(fr.points, "graphs" if dev.type == "cuda" else "eager", fr.doc["title"], notes)
        print(text, flush=True)
        fr.doc["verdict"] = v
        if save:
            save()


# the arguments a later loop's process is not given again (each with its value)
_OWN = ("--loop", "--shape", "--json")


def loop_argv(argv, shape, loop, json_path):
    """``argv`` for ``shape``'s front of ``loop`` alone: the caller's
    arguments less --loop, --shape, --json (either spelling) and
    --fresh-loops, then those three."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _OWN:
            skip = True
            continue
        if a == "--fresh-loops" or any(a.startswith(o + "=") for o in _OWN):
            continue
        out.append(a)
    return out + ["--shape", shape, "--loop", loop, "--json", json_path]


def fresh_loop(args, spec, name, docs, save=None, runner=None):
    """``spec``'s front of the loop ``name`` in a fresh process (--fresh-loops):
    measured after the first loop's front in this process, its base would
    hold what that front left (cuBLAS workspaces, graphs' memory), which
    flattered the graphed points of the second loop by 2-5 % (H100,
    launch-bound: each point alone in a fresh process held 52-158 MiB
    more). Its output goes to this one's; its fronts join ``docs``; a
    process that brings none back leaves a front that says why.
    ``runner(argv)`` -> exit status (tests: in-process; default a
    subprocess of python3 -m vmmrt.torch.bench)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()        # (what this process caches is not the fresh one's to lose)
    fd, path = tempfile.mkstemp(suffix=".json", prefix="vmmrt-front-")
    os.close(fd)
    try:
        argv = loop_argv(args.argv, spec.name, name, path)
        print("\n-- front: %s, %s loop, in a fresh process (--fresh-loops)" % (spec.name, name), flush=True)
        if runner is None:
            def runner(av):
                return subprocess.run([sys.executable, "-m", "vmmrt.torch.bench"] + av).returncode
        rc = runner(argv)
        try:
            with open(path) as f:
                got = json.load(f).get("fronts") or []
        except (OSError, ValueError):
            got = []
        if not got:
            got = [{"title": "%s, %s loop" % (spec.name, name), "points": [], "loop": name,
                    "error": "its fresh process (exit status %s) brought no front back" % rc}]
        docs.extend(got)
    finally:
        os.unlink(path)
    if save:
        save()


def summary(docs):
    """One verdict line per shape and loop."""
    return ["verdict (%s): %s" % (d["title"], d["verdict"]["line"] if d.get("verdict") else
                                  "not run: " + d.get("error", "stopped")) for d in docs]

