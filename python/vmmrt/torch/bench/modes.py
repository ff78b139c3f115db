# SPDX-License-Identifier: LGPL-2.1-or-later
"""The benchmark's modes: how each one builds its callables, and one measured run.

Every mode runs the same layers (the same weights), the same input and the
same gradient of the output; only how the layers run differs:

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
"""
import gc
import statistics
import time

import torch

import vmmrt.torch as vt
from vmmrt.torch import memory

MODES = ("eager", "save_on_cpu", "graph", "none", "pingpong", "remap", "planner", "pingpong-acc",
         "eager-pingpong", "eager-remap")
GRAPH_MODES = ("graph", "none", "pingpong", "remap", "planner", "pingpong-acc")


def _vmmrt_kwargs(name, args):
    kw = dict(lookahead=args.lookahead, offload=args.fraction, margin=args.margin)
    if name in ("none", "pingpong", "remap"):
        kw["mode"] = name
    elif name == "planner":
        kw.update(mode="pingpong", offload="auto")
    elif name == "pingpong-acc":
        kw.update(mode="pingpong", grads="accumulate")
    elif name in ("eager-pingpong", "eager-remap"):
        kw.update(mode=name.split("-")[1], graphs=False)
    return kw


class Built:
    def __init__(self, name, run, offload=None, build_s=0.0):
        self.name, self.run, self.offload, self.build_s = name, run, offload, build_s


def build(name, layers, make_sample, args):
    """Callables for mode `name` over `layers`; make_sample() gives a fresh sample argument."""
    t0 = time.perf_counter()
    off = None
    if name in ("eager", "save_on_cpu"):
        seq = list(layers)
    elif name == "graph":
        seq = list(torch.cuda.make_graphed_callables(tuple(layers), tuple((make_sample(),) for _ in layers)))
    else:
        seq = list(vt.make_graphed_callables(tuple(layers), tuple((make_sample(),) for _ in layers),
                                             names=["layer%d" % i for i in range(len(layers))],
                                             **_vmmrt_kwargs(name, args)))
        off = vt.offload_of(seq[0])

    pin = torch.cuda.is_available()

    def run(x):
        if name == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=pin):
                return _through(seq, x)
        return _through(seq, x)

    _sync()
    return Built(name, run, off, time.perf_counter() - t0)


def _through(seq, x):
    for m in seq:
        x = m(x)
    return x


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def teardown(built, layers):
    for m in layers:
        m.__dict__.pop("forward", None)
        m.__dict__.pop("vmmrt_offload", None)
        m.zero_grad(set_to_none=True)
    off = built.offload
    built.run = None
    built.offload = None
    _sync()
    if off is not None:
        off.close()
    del off
    # Only now can the graphs, their pool and the static tensors go (the
    # offload referred to the runners): the next mode's memory is its own.
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _step(run, layers, x, gy):
    for m in layers:
        m.zero_grad(set_to_none=True)
    x.grad = None
    y = run(x)
    y.backward(gy)
    return y


def grads_of(layers, x):
    return [x.grad] + [p.grad for m in layers for p in m.parameters()]


def measure(built, layers, x, gy, args):
    """Step times (ms), memory between forward and backward, copies, and the
    gradients of one step (on the host, for comparing modes)."""
    cuda = torch.cuda.is_available()
    for _ in range(args.warmup):
        _step(built.run, layers, x, gy)
    _sync()
    off = built.offload
    if off is not None:
        off.sync()
        before = off.stats()
    times = []
    for _ in range(args.iterations):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            _step(built.run, layers, x, gy)
            e1.record()
            times.append((e0, e1))
        else:
            t0 = time.perf_counter()
            _step(built.run, layers, x, gy)
            times.append((time.perf_counter() - t0) * 1e3)
    _sync()
    ms = [e0.elapsed_time(e1) for e0, e1 in times] if cuda else times
    res = {"mode": built.name, "build_s": built.build_s, "step_ms": statistics.median(ms),
           "step_ms_min": min(ms), "step_ms_max": max(ms), "iterations": len(ms)}
    if off is not None:
        off.sync()
        after = off.stats()
        n = max(1, len(ms))
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
        res["bank_conflicts"] = after["bank_conflicts"]
        if off.plan is not None:
            res["plan"] = off.plan.as_dict()
            res["plan_text"] = off.plan.summary()
    # One more step, stopped between forward and backward to read the driver.
    for m in layers:
        m.zero_grad(set_to_none=True)
    x.grad = None
    y = built.run(x)
    _sync()
    if off is not None:
        off.sync()
    if cuda:
        res["memory"] = memory.snapshot([off] if off is not None else [])
    y.backward(gy)
    _sync()
    res["grads"] = [g.detach().to("cpu", copy=True) if g is not None else None for g in grads_of(layers, x)]
    return res


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
    """(bitwise equal, largest difference in ulps) of two gradient lists."""
    if ref is None or len(grads) != len(ref):
        return None, None
    worst, same = 0.0, True
    for a, b in zip(grads, ref):
        if (a is None) != (b is None):
            return False, float("inf")
        if a is None:
            continue
        if not torch.equal(a, b):
            same = False
            worst = max(worst, _ulps(a, b))
    return same, worst
