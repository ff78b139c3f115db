# SPDX-License-Identifier: LGPL-2.1-or-later
"""The benchmark's modes: how each one builds its callables, and one measured run.

Every mode runs the same layers (the same weights, restored before each
mode and before the step whose gradients are compared), the same inputs and
the same gradients of the outputs; only how the layers run differs:

eager          the layers as they are
save_on_cpu    eager under torch.autograd.graph.save_on_cpu(pin_memory=True)
graph          torch.cuda.make_graphed_callables (graph-only, the baseline)
none           vmmrt.torch.make_graphed_callables, mode "none" (resident slots)
pingpong       ... mode "pingpong"           (two banks)
remap          ... mode "remap"              (released and mapped again)
planner        ... mode "pingpong", offload="auto"
pingpong-acc   ... mode "pingpong", grads="accumulate" (no static gradient buffers)
eager-pingpong vmmrt.torch.make_graphed_callables(graphs=False), "pingpong"
eager-remap    the same, "remap"

The vmmrt graph modes pass no ``grads=`` unless --grads gives one: what the
library does by default is what its users get.
"""
import gc
import statistics
import time

import torch

import vmmrt.torch as vt
from vmmrt.torch import memory
from vmmrt.torch.bench import loops

MODES = ("eager", "save_on_cpu", "graph", "none", "pingpong", "remap", "planner", "pingpong-acc",
         "eager-pingpong", "eager-remap")
# The default on CUDA: every comparison of the whole-step targets in one
# table. The other modes stay available with --modes.
DEFAULT_MODES = ("eager", "save_on_cpu", "graph", "none", "pingpong", "remap", "planner")
CPU_MODES = ("eager", "save_on_cpu", "eager-pingpong", "eager-remap")
GRAPH_MODES = ("graph", "none", "pingpong", "remap", "planner", "pingpong-acc")
VMMRT_MODES = ("none", "pingpong", "remap", "planner", "pingpong-acc", "eager-pingpong", "eager-remap")
TORCH_GRAPHS = ("graph", "graph-ckpt")     # torch.cuda.make_graphed_callables's (loops.Loop.made_first)
# The modes whose backward graph hands gradients over, which grads= chooses how.
_GRADS_MODES = ("none", "pingpong", "remap", "planner")


def _vmmrt_kwargs(name, args, loop=None):
    kw = dict(lookahead=args.lookahead, offload=args.fraction, margin=args.margin)
    if name in ("none", "pingpong", "remap"):
        kw["mode"] = name
    elif name == "planner":
        kw.update(mode="pingpong", offload="auto")
        if getattr(args, "auto_loop", False) and loop is not None:
            kw["loop"] = loop          # (--auto-loop: told the loop it runs, it weighs its plan for that one)
    elif name == "pingpong-acc":
        kw.update(mode="pingpong", grads="accumulate")
    elif name in ("eager-pingpong", "eager-remap"):
        kw.update(mode=name.split("-")[1], graphs=False)
    if getattr(args, "grads", None) and name in _GRADS_MODES:
        kw["grads"] = args.grads
    if getattr(args, "map_ahead", None):
        kw["map_ahead"] = args.map_ahead
    if getattr(args, "memory_plan", None) is not None:
        kw["memory_plan"] = args.memory_plan
    return kw


class Built:
    def __init__(self, name, run, offload=None, build_s=0.0, opt=None):
        self.name, self.run, self.offload, self.build_s, self.opt = name, run, offload, build_s, opt


def parameters(layers):
    """The layers' trainable parameters, each once, in order."""
    seen, out = set(), []
    for m in layers:
        for p in m.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class Weights:
    """The layers' parameters as they were first, on the host (pinned on CUDA,
    so that restoring costs milliseconds), and put back in place: the graphs
    replay over the parameters' addresses, so they are copied into, never
    replaced. Every mode starts from them (the optimizer changes them at each
    step), and so does the step whose gradients are compared: the gradients
    of one step from the same weights and inputs, not of steps that drifted."""

    def __init__(self, layers):
        self.params = parameters(layers)
        self.saved = [_host_copy(p.detach()) for p in self.params]

    def restore(self):
        with torch.no_grad():
            for p, s in zip(self.params, self.saved):
                p.copy_(s, non_blocking=True)
        _sync()


def _host_copy(t):
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
    out.copy_(t)
    return out


def build(name, layers, make_sample, args, loop=None):
    """Callables for mode `name` over `layers`, and the optimizer over their
    parameters (created after the build: its states appear at the first
    warm-up step, as in training); make_sample() gives a fresh sample
    argument; ``loop``: the loop's name, which the planner is told with
    --auto-loop."""
    t0 = time.perf_counter()
    off = None
    if name in ("eager", "save_on_cpu"):
        seq = list(layers)
    elif name == "graph":
        seq = list(torch.cuda.make_graphed_callables(tuple(layers), tuple((make_sample(),) for _ in layers)))
    else:
        seq = list(vt.make_graphed_callables(tuple(layers), tuple((make_sample(),) for _ in layers),
                                             names=["layer%d" % i for i in range(len(layers))],
                                             **_vmmrt_kwargs(name, args, loop)))
        off = vt.offload_of(seq[0])

    pin = torch.cuda.is_available()

    def run(x):
        if name == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=pin):
                return _through(seq, x)
        return _through(seq, x)

    _sync()
    return Built(name, run, off, time.perf_counter() - t0,
                 loops.optimizer(parameters(layers), getattr(args, "optimizer", "foreach")))


def _through(seq, x):
    for m in seq:
        x = m(x)
    return x


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def teardown(built, layers, weights=None, inputs=()):
    """One mode's build gone before the next is made. ``inputs``: the
    samples the steps ran on, whose ``.grad`` from the last step is the first
    layer's input gradient: in the graphs' pool or a gradient slot, it would
    keep that memory (and, on libvmmrt's arena, the runtime and its slot)
    under the next build's static memory."""
    for x in inputs:
        x.grad = None
    for m in layers:
        m.__dict__.pop("forward", None)
        m.__dict__.pop("vmmrt_offload", None)
        m.zero_grad(set_to_none=True)
    off = built.offload
    built.run = None
    built.offload = None
    built.opt = None            # its states go with it
    _sync()
    if off is not None:
        off.close()
    del off
    # Only now can the graphs, their pool and the static tensors go (the
    # offload referred to the runners): the next mode's memory is its own.
    gc.collect()
    if torch.cuda.is_available():
        vt.empty_cache()      # (and the runtime closed above, once PyTorch gave its arena segments back)
    if weights is not None:
        weights.restore()


def grads_of(layers, xs):
    return [x.grad for x in xs] + [p.grad for p in parameters(layers)]


class _Marks:
    """Four points of a step: CUDA events (device time) or perf_counter (CPU)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.points = [torch.cuda.Event(enable_timing=True) for _ in range(4)] if cuda else [None] * 4

    def callables(self):
        if self.cuda:
            return [e.record for e in self.points]

        def mark(i):
            def f():
                self.points[i] = time.perf_counter()
            return f
        return [mark(i) for i in range(4)]

    def ms(self, a, b):
        if self.cuda:
            return self.points[a].elapsed_time(self.points[b])
        return (self.points[b] - self.points[a]) * 1e3


def _median(v):
    return statistics.median(v) if v else float("nan")


def launch_us(clocks, layers, pick=None):
    """The launch thread's CPU time per layer, in microseconds, over the
    steps' :class:`loops.LaunchClock` (:func:`measure`: steps begun with the
    device idle), their median, or ``pick``'s (measure takes the least:
    what else the machine does only adds to it): per forward call
    (``launch_fwd_us_per_layer``), per backward call
    (``launch_bwd_us_per_layer``; a backward call goes through every layer
    once) and per step, both together (``launch_us_per_layer_step``: K
    microbatches' calls)."""
    if not clocks or layers < 1:
        return dict.fromkeys(("launch_fwd_us_per_layer", "launch_bwd_us_per_layer", "launch_us_per_layer_step"))
    per = 1e3 * layers
    pick = pick or _median
    return {"launch_fwd_us_per_layer": pick([c.fwd_ns / (c.forwards * per) for c in clocks]),
            "launch_bwd_us_per_layer": pick([c.bwd_ns / (c.backwards * per) for c in clocks]),
            "launch_us_per_layer_step": pick([(c.fwd_ns + c.bwd_ns) / per for c in clocks])}


def driver_calls_per_step(before, after, steps):
    """The driver's VMM calls per step between two Offload.stats() readings
    taken ``steps`` steps apart: in total and by kind."""
    n = max(1, steps)
    by = {k: (v - before["driver_calls_by_kind"].get(k, 0)) / n for k, v in after["driver_calls_by_kind"].items()}
    return (after["driver_calls"] - before["driver_calls"]) / n, by


def _settle(off):
    """Wait for what the steps asked of the driver workers: on the host
    backend the releases after each backward are ordered on its stream
    (on CUDA, _sync() waited for the device's)."""
    if off.host:
        off.runtime.stream_synchronize(None)
    off.sync()


# vmmrt.torch's memory plan is made at the first forward of the second step
# after the build, and binds its pages then (on CUDA a driver call or three
# per granule: 40,000 for the long-context layers): the steps before are not
# the steady state a figure is of, whatever --warmup says (the H200's long
# front at --warmup 1 counted 13,954 driver calls per step, and a peak with
# the slots' own memory and the pages both held).
PLAN_STEPS = 2

# Steps after the timed ones whose launch thread is measured, each begun with
# the device idle (see measure); the least of them is the figure. With three
# and their median the H200's launch front read torch's graphs at 284.9 us
# per layer per step and the same graphs with one layer checkpointed at
# 214.8 (session 39): the spread of a shared machine, not of the code.
LAUNCH_STEPS = 7


def warmup_steps(args, offload):
    """The steps run before the timed ones: ``args.warmup``, and for a vmmrt
    point at least the :data:`PLAN_STEPS` that make and bind its memory plan."""
    return args.warmup if offload is None else max(args.warmup, PLAN_STEPS)


def _phases(dev):
    """(marks, between, where) for a step under the peak sampler: the launch
    thread names the part of the step it is in (the zeroing, the forwards,
    the backwards, the optimizer's step, then the wait for the device), and
    where() says it with the caching allocator's reserved bytes, for the
    reading that is the peak: what part of the step made it, and how much of
    it PyTorch's allocator holds (the rest is libvmmrt's and the driver's)."""
    now = ["zeroing"]

    def at(name):
        def mark():
            now[0] = name
        return mark

    def where():
        return {"phase": now[0], "allocator": torch.cuda.memory_reserved(dev) if dev.type == "cuda" else None}
    return [at("zeroing"), at("forward"), at("optimizer step"), at("end of the step")], at("backward"), where


def measure(built, layers, loop, xs, gys, args, weights, clock=None):
    """One mode in one loop: step times (ms; device events, median), the
    launch thread's CPU time per layer (:func:`launch_us`; ``clock``, if
    given, replaces time.thread_time_ns), the driver's VMM calls per step,
    the peak of driver-level memory over a whole step, driver memory between
    forward and backward, copies; and the gradients of one step from the
    restored weights (on the device: compare them before the next step)."""
    dev = xs[0].device
    cuda = dev.type == "cuda"
    run, opt, off = built.run, built.opt, built.offload
    if built.name in TORCH_GRAPHS:
        loop = loop.made_first()
    for _ in range(warmup_steps(args, off)):
        loop.step(run, opt, xs, gys)
    _sync()
    if off is not None:
        _settle(off)
        before = off.stats()
    marks, clocks = [], []
    for _ in range(args.iterations):
        m = _Marks(cuda)
        c = loops.LaunchClock(clock)
        loop.step(run, opt, xs, gys, marks=m.callables(), launch=c)
        marks.append(m)
        clocks.append(c)
    _sync()
    step = [m.ms(0, 3) for m in marks]
    res = {"mode": built.name, "loop": loop.name, "microbatches": loop.microbatches, "build_s": built.build_s,
           "step_ms": _median(step), "step_ms_min": min(step) if step else None,
           "step_ms_max": max(step) if step else None, "iterations": len(step),
           "zero_ms": _median([m.ms(0, 1) for m in marks]), "fwd_bwd_ms": _median([m.ms(1, 2) for m in marks]),
           "opt_ms": _median([m.ms(2, 3) for m in marks])}
    res.update(launch_us(clocks, len(layers)))
    res["launch_queued_us_per_layer_step"] = res["launch_us_per_layer_step"]
    if built.name in _GRADS_MODES:
        res["grads_arg"] = getattr(args, "grads", None) or "default"
    if off is not None:
        _settle(off)
        after = off.stats()
        n = max(1, len(step))
        res["d2h_bytes_per_step"] = (after["bytes_offloaded"] - before["bytes_offloaded"]) / n
        res["h2d_bytes_per_step"] = (after["bytes_restored"] - before["bytes_restored"]) / n
        res["d2h_gbps"] = after["last_d2h_bytes"] / after["last_d2h_ms"] / 1e6 if after["last_d2h_ms"] else None
        res["h2d_gbps"] = after["last_h2d_bytes"] / after["last_h2d_ms"] / 1e6 if after["last_h2d_ms"] else None
        res["saved"] = off.saved_bytes()
        res["group_bytes"] = off.group_bytes()
        res["granularity"] = off.runtime.info()["granularity"]
        res["vmmrt_mode"] = off.mode
        res["lookahead"] = off.lookahead
        res["launch_thread_blocking"] = after["launch_thread_blocking"] - before["launch_thread_blocking"]
        res["driver_calls_per_step"], res["driver_calls_per_step_by_kind"] = \
            driver_calls_per_step(before, after, len(step))
        res["bank_conflicts"] = after["bank_conflicts"]
        res["optimizer_memory"] = {k[len("optimizer_"):]: v for k, v in after.items() if k.startswith("optimizer_")}
        # the memory plan's pages and the graphs' pool on them: where a peak above eager's comes from
        res["pages"] = {"plan_bytes": after["plan_bytes"], "graph_pool_bytes": after["graph_pool_bytes"],
                        "graph_pool_pages_bytes": after.get("graph_pool_pages_bytes", after["graph_pool_bytes"]),
                        "graph_pool_live_peak_bytes": after.get("graph_pool_live_peak_bytes", 0),
                        "graph_pool_never_freed_bytes": after.get("graph_pool_never_freed_bytes", 0),
                        "plan_conflicts": after["plan_conflicts"],
                        "plan_grad_share_bytes": after.get("plan_grad_share_bytes", 0),
                        "plan_chained_bytes": after.get("plan_chained_bytes", 0)}
        w = off.memplan
        if w is not None and w.plan is not None:
            res["pages"]["busiest"] = w.plan.busiest()     # (what sizes the pages)
            # of a backward there, its gradients that could lie on resident
            # bytes it has read (vmmrt.torch.gradshare; the plan maps them so
            # in the set_to_none loop: plan_grad_share_bytes)
            t, _ = w.plan.busiest_use()
            if t < len(w.plan.order) and w.plan.order[t][1]:
                name = w.plan.order[t][0]
                res["pages"]["busiest_grad_share"] = off.grad_share().get(name, 0)
                res["pages"]["busiest_grad_share_bound"] = off.grad_share(temporaries=False).get(name, 0)
        if off.plan is not None:
            res["plan"] = off.plan.as_dict()
            res["plan_text"] = off.plan.summary()
    # The launch thread's time from steps begun with the device idle: in the
    # timed steps the host runs ahead until the launch queue is full, and the
    # driver's wait for room (a spin) is CPU time of the thread: torch's own
    # graphs measured 331 and 469 us per layer per step in two runs of the
    # same code on the H200. A step begun idle never fills it.
    idle = []
    for _ in range(LAUNCH_STEPS):
        _sync()
        c = loops.LaunchClock(clock)
        loop.step(run, opt, xs, gys, launch=c)
        idle.append(c)
    _sync()
    res.update(launch_us(idle, len(layers), min))
    # One whole step (optimizer step included) under the peak sampler, apart
    # from the timed ones: the sampler takes the GIL and makes driver calls.
    res["peak"] = None
    if cuda:
        if off is not None:
            off.sync()
        marks, between, where = _phases(dev)
        sampler = memory.PeakSampler(dev, interval_s=getattr(args, "sample_us", 50.0) * 1e-6, where=where)
        with sampler:
            loop.step(run, opt, xs, gys, marks=marks, between=between)
            _sync()
            if off is not None:
                off.sync()      # remap's releases after the last backward belong to the step
        res["peak"] = sampler.as_dict()
    # The step whose gradients are compared, from the first weights, stopped
    # after the last microbatch's forward to read the driver's count and its
    # parts (gradients of earlier microbatches, if any, are held then).
    weights.restore()
    snap = {}
    slots = {}

    def between():
        _sync()
        if off is not None:
            off.sync()
            slots["between"] = off.stats().get("slot_bytes")
        if cuda:
            snap.update(memory.snapshot([off] if off is not None else [], dev))
    loop.step(run, opt, xs, gys, between=between)
    _sync()
    res["memory"] = snap or None
    if off is not None:
        # libvmmrt's own count at the point between forward and backward (the
        # CPU has no driver snapshot; on CUDA the snapshot's part is the same)
        res["slot_bytes"] = snap.get("slots") if snap else slots.get("between")
        res["offload_stats"] = off.stats()
    return res, grads_of(layers, xs)


def spread(built, layers, loop, xs, gys, weights, ref, runs=3):
    """The reference's own run-to-run difference: its check step again, from
    the same weights, against its first gradients (non-deterministic kernels,
    flash attention's backward, differ; math attention does not)."""
    worst = 0.0
    if built.name in TORCH_GRAPHS:
        loop = loop.made_first()
    for _ in range(runs):
        weights.restore()
        loop.step(built.run, built.opt, xs, gys)
        _sync()
        same, d, _ = compare(grads_of(layers, xs), ref)
        worst = max(worst, 0.0 if same else d)
    return worst


def host_copies(grads):
    """The reference's gradients on the host (pinned on CUDA): they must not
    take device memory while the other modes are measured."""
    return [_host_copy(g.detach()) if g is not None else None for g in grads]


_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}


def _ulps(a, b):
    """The largest |a - b| in units in the last place of b's dtype at b's
    magnitude: an absolute difference of 2 is one bf16 ulp at 256 and 16 ulps
    at 32, so only ulps compare runs whose large elements differ. Magnitudes
    below 2^-10 of the tensor's largest count as that floor: an element that
    is all cancellation has no meaningful last place."""
    bits = _MANTISSA_BITS.get(b.dtype)
    if bits is None:
        return float("inf") if not torch.equal(a, b) else 0.0
    bf = b.double()
    floor = max(bf.abs().max().item() * 2.0 ** -10, torch.finfo(b.dtype).tiny)
    _, e = torch.frexp(bf.abs().clamp_min(floor))
    ulp = torch.ldexp(torch.ones_like(bf), e - 1 - bits)
    return ((a.double() - bf).abs() / ulp).max().item()


def compare(grads, ref):
    """(bitwise equal, largest difference in ulps, ratio of the gradients'
    norms) of a gradient list against a reference list (on the host: each
    tensor is moved to the gradient's device and compared there, which takes
    seconds less than the host would for billions of elements). The norm
    ratio tells a scaled gradient (2.0: doubled) from rounding differences
    (1.0 to many digits); it is None when the lists are bitwise equal."""
    if ref is None or len(grads) != len(ref):
        return None, None, None
    worst, same = 0.0, True
    num = den = 0.0
    for a, b in zip(grads, ref):
        if (a is None) != (b is None):
            return False, float("inf"), None
        if a is None:
            continue
        b = b.to(a.device, non_blocking=True)
        num += torch.linalg.vector_norm(a, dtype=torch.float64).item() ** 2
        den += torch.linalg.vector_norm(b, dtype=torch.float64).item() ** 2
        if not torch.equal(a, b):
            same = False
            worst = max(worst, _ulps(a, b))
        del b
    if same:
        return True, 0.0, None
    return False, worst, (num / den) ** 0.5 if den else None
