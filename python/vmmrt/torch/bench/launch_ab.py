# SPDX-License-Identifier: LGPL-2.1-or-later
"""--launch-ab: the launch thread's cost of vmmrt's graphed call against
torch's graphed callables, measured interleaved.

The front measures each option's launch thread in its own stretch of the
run, one option after the other (modes.launch_us: the least of a few steps
begun with the device idle). On a shared host that figure drifts by more
than the difference sought: on the H200 torch's graphs read 217.5 and
156.3 us per layer per step in two runs of the same command, and vmmrt
none's excess over them +111 and +20. Here both are built side by side
(torch's over a copy of the layers) and their steps alternate, in the
order ABBA so that neither always runs first, each step begun with the
device idle: both see the same machine at nearly the same moment. The
excess is the median of the pairs' differences, given with its quartiles
and beside each side's least.
"""
import copy
import statistics

import torch

from vmmrt.torch.bench import loops, modes, shapes

LABELS = ("torch graphs", "vmmrt none")


def interleave(steps, pairs):
    """``steps``: two (label, step) where step() returns the launch
    thread's microseconds per layer of one step; each run ``pairs`` times,
    in the order ABBA. Returns {label: [us, ...]}, the i-th of each from
    the i-th pair."""
    (la, a), (lb, b) = steps
    out = {la: [], lb: []}
    for k in range(pairs):
        if k % 2 == 0:
            out[la].append(a())
            out[lb].append(b())
        else:
            out[lb].append(b())
            out[la].append(a())
    return out


def _quartiles(v):
    if len(v) < 2:
        return (v[0], v[0]) if v else (float("nan"), float("nan"))
    q = statistics.quantiles(v, n=4)
    return q[0], q[2]


def summarize(samples, base):
    """Per label: its least and median us per layer per step, and, for the
    others, the median and quartiles of its excess over ``base`` pair by
    pair."""
    out = {}
    for label, v in samples.items():
        row = {"least": min(v), "median": statistics.median(v), "steps": len(v)}
        if label != base:
            d = [x - y for x, y in zip(v, samples[base])]
            q1, q3 = _quartiles(d)
            row.update(excess_median=statistics.median(d), excess_q1=q1, excess_q3=q3)
        out[label] = row
    return out


def lines(summary, base):
    out = []
    for label, r in summary.items():
        text = "  %-14s least %7.1f  median %7.1f us per layer per step (%d steps)" % (
            label, r["least"], r["median"], r["steps"])
        if label != base:
            text += "; over %s: median %+.1f us (quartiles %+.1f, %+.1f)" % (
                base, r["excess_median"], r["excess_q1"], r["excess_q3"])
        out.append(text)
    return out


def _step(built, loop, xs, gys, n):
    def step():
        torch.cuda.synchronize()
        c = loops.LaunchClock()
        loop.step(built.run, built.opt, xs, gys, launch=c)
        torch.cuda.synchronize()
        return (c.fwd_ns + c.bwd_ns) / (1e3 * n)
    return step


def run(args, spec, dev, dtype):
    """The interleaved measurement on ``spec``'s layers (CUDA only):
    returns the summary, printed as it goes."""
    layers, dims = shapes.build(spec, dev, dtype, args.attention)
    twins = copy.deepcopy(layers)
    n = len(layers)
    g = torch.Generator(device="cpu").manual_seed(7)
    mb = args.microbatches
    xs = [torch.randn(*dims, generator=g).to(dev, dtype).requires_grad_() for _ in range(mb)]
    gys = [torch.randn(*dims, generator=g).to(dev, dtype) for _ in range(mb)]

    def sample():
        return torch.randn(*dims, device=dev, dtype=dtype, requires_grad=True)
    loop = loops.Loop(args.loops[0], mb)
    built = {}
    try:
        built[LABELS[0]] = modes.build("graph", twins, sample, args)
        built[LABELS[1]] = modes.build("none", layers, sample, args)
        for b in built.values():
            for _ in range(modes.warmup_steps(args, b.offload)):
                loop.step(b.run, b.opt, xs, gys)
        torch.cuda.synchronize()
        samples = interleave([(label, _step(built[label], loop, xs, gys, n)) for label in LABELS], args.launch_ab)
    finally:
        for label, ls in zip(LABELS, (twins, layers)):
            if label in built:
                modes.teardown(built[label], ls, inputs=xs)
    summary = summarize(samples, LABELS[0])
    print("launch thread, %s, %s loop, %d microbatch(es), %d pairs interleaved (ABBA), each step begun with the "
          "device idle:" % (spec.name, loop.name, mb, args.launch_ab), flush=True)
    for line in lines(summary, LABELS[0]):
        print(line, flush=True)
    return {"shape": spec.name, "loop": loop.name, "microbatches": mb, "pairs": args.launch_ab, "samples": samples,
            "summary": summary}
