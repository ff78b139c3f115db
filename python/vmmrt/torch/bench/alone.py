# SPDX-License-Identifier: LGPL-2.1-or-later
"""One option of the front, alone in a fresh process, measured without the
benchmark's own machinery: the independent check of the front's figures.

    python3 -m vmmrt.torch.bench.alone --shape llama --option ckpt --k 2
    python3 -m vmmrt.torch.bench.alone --shape launch --option vmmrt-none

It builds the shape's layers (:mod:`shapes`, the same weights and inputs),
runs ONE option (PyTorch's eager, ckpt K, graph, graph-ckpt K, save_on_cpu;
vmmrt.torch's none, auto and recompute all, made as a user makes them,
through vmmrt.torch.make_graphed_callables with the library's defaults) in
the loop asked, times --iterations steps after --warmup with CUDA events (the
median), then samples the driver's used memory (torch.cuda.mem_get_info)
from a thread of its own over one more whole step, and prints one line of
JSON: the step time and the peak over the used memory before the model.
Nothing here comes from modes, loops or memory: a fault of theirs would
show as a difference. A vmmrt point alone also pays what its own first
capture leaves in the process, where a front's point pays what the points
before it left (frontrun.GRAPH_FREE).

:func:`check` (``--front --check-alone``) runs this for every point of a
front whose option is here, each in its own process, and compares: time and
peak within the tolerance (3 %) agree.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

OPTIONS = ("eager", "ckpt", "graph", "graph-ckpt", "save_on_cpu", "vmmrt-none", "vmmrt-auto", "vmmrt-recompute")
# a vmmrt point's option (frontrun.Option.kind) as this module names it
VMMRT = {"none": "vmmrt-none", "planner": "vmmrt-auto", "recompute": "vmmrt-recompute"}


def option_of(pt):
    """The option here of a front's point ``pt``, or None (a budget, ping-pong...)."""
    if pt.get("family") == "torch":
        return pt.get("option") if pt.get("option") in OPTIONS else None
    return VMMRT.get(pt.get("option")) if pt.get("family") == "vmmrt" else None


def _vmmrt_callables(option, layers, samples, a, dev):
    """vmmrt.torch's graphed callables for ``option``, as a user makes them."""
    import vmmrt.torch as vt
    kw = {}
    if option == "vmmrt-none":
        kw["mode"] = "none"
    elif option == "vmmrt-auto":
        kw.update(mode="pingpong", offload="auto")
    else:
        from vmmrt.torch.bench import loops
        reserve, step = loops.optimizer_memory([p for m in layers for p in m.parameters() if p.requires_grad],
                                               a.optimizer)
        kw.update(mode="auto", memory_budget=vt.Budget(layers=["recompute"] * len(layers), reserve=reserve,
                                                           step=step, loop=a.loop))
    return list(vt.make_graphed_callables(tuple(layers), samples, graphs=dev.type == "cuda", **kw))


def _predicted(mods, params, a):
    """The whole step's peak vmmrt's plan predicts (plancheck.predicted_peak:
    a budget plan's own, told AdamW's memory by its Budget, else its
    model's told the same), or None."""
    import vmmrt.torch as vt
    from vmmrt.torch import plancheck
    from vmmrt.torch.bench import loops
    reserve, step = loops.optimizer_memory(params, a.optimizer)
    return plancheck.predicted_peak(vt.offload_of(mods[0]), reserve, step, a.loop)


class _Ckpt(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.layer, x, use_reentrant=False)


class _Sampler:
    """The largest total - free of the device while it runs."""

    def __init__(self, interval_s=50e-6):
        self.interval_s, self.peak, self.samples = interval_s, 0, 0

    def _used(self):
        free, total = torch.cuda.mem_get_info()
        return total - free

    def _loop(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._used())
            self.samples += 1
            time.sleep(self.interval_s)

    def __enter__(self):
        self._stop = threading.Event()
        self.peak, self.samples = self._used(), 1
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._used())


def _parser():
    p = argparse.ArgumentParser(prog="python3 -m vmmrt.torch.bench.alone", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama")
    p.add_argument("--option", choices=OPTIONS, required=True)
    p.add_argument("--k", type=int, default=0, help="checkpointed layers (ckpt, graph-ckpt)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--loop", choices=("set_to_none", "persistent"), default="set_to_none")
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--optimizer", choices=("foreach", "fused"), default="foreach")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--attention", choices=("auto", "flash", "math"), default="auto")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def measure(a):
    """The option alone: a dict of its figures."""
    from vmmrt.torch.bench import llama, loops, shapes   # the layers, and loops.made_first
    if a.shape not in shapes.SHAPES:
        raise SystemExit("unknown shape %r; shapes are %s" % (a.shape, ", ".join(shapes.SHAPES)))
    if a.option in ("ckpt", "graph-ckpt") and a.k < 1:
        raise SystemExit("--option %s needs --k 1 or more" % a.option)
    if a.k and a.option not in ("ckpt", "graph-ckpt"):
        raise SystemExit("--k goes with --option ckpt or graph-ckpt, not %s" % a.option)
    if a.iterations < 1 or a.warmup < 0 or a.microbatches < 1:
        raise SystemExit("--iterations and --microbatches must be at least 1, --warmup at least 0")
    if a.optimizer == "fused" and a.device != "cuda":
        raise SystemExit("--optimizer fused needs CUDA")
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    graphed = a.option.startswith(("graph", "vmmrt"))
    if graphed and not cuda:
        raise SystemExit("--option %s needs CUDA" % a.option)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    if a.smoke and not cuda:
        dtype = torch.float32
    spec = shapes.SHAPES[a.shape]
    if a.smoke:
        spec = spec.smoke(a.device)
    if a.k > spec.layers:
        raise SystemExit("--k %d: the %s shape has %d layers" % (a.k, a.shape, spec.layers))
    if cuda:
        torch.zeros(1, device=dev)
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        base = total - free
    layers, dims = shapes.build(spec, dev, dtype, a.attention)
    g = torch.Generator(device="cpu").manual_seed(7)
    xs = [torch.randn(*dims, generator=g).to(dev, dtype).requires_grad_() for _ in range(a.microbatches)]
    gys = [torch.randn(*dims, generator=g).to(dev, dtype) for _ in range(a.microbatches)]
    params = [p for m in layers for p in m.parameters() if p.requires_grad]
    # (not before torch's graphs of Megatron's layers: an eager step there
    # is what made their capture fail in the front's process)
    if cuda and not (graphed and any(getattr(m, "rng_tracked", False) for m in layers)):
        # what the process loads once, in the base as the front counts it
        # (frontrun.warm; done here with this module's own readings, not
        # the front's, so that a fault of theirs shows as a difference)
        used = total - torch.cuda.mem_get_info()[0]
        with llama.attention_backend(a.attention):
            loops.warm_process(layers, xs[0], gys[0], a.optimizer)
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
        base += max(0, total - torch.cuda.mem_get_info()[0] - used)
    k = a.k if a.option in ("ckpt", "graph-ckpt") else 0
    mods = [_Ckpt(m) if i < k else m for i, m in enumerate(layers)]
    samples = tuple((torch.randn(*dims, device=dev, dtype=dtype, requires_grad=True),) for _ in mods)
    if a.option.startswith("graph"):
        mods = list(torch.cuda.make_graphed_callables(tuple(mods), samples))
    elif a.option.startswith("vmmrt"):
        mods = _vmmrt_callables(a.option, mods, samples, a, dev)
    predicted = _predicted(mods, params, a) if a.option.startswith("vmmrt") else None
    opt = torch.optim.AdamW(params, lr=1e-4, **{a.optimizer: True})

    def forward(x):
        for m in mods:
            x = m(x)
        return x

    def step():
        if a.loop == "set_to_none":
            opt.zero_grad(set_to_none=True)
            for x in xs:
                x.grad = None
        else:
            opt.zero_grad(set_to_none=False)
            if a.option.startswith("graph"):
                loops.made_first(params + xs)       # (as the front measures them: loops.Loop.made_first)
            for x in xs:
                if x.grad is not None:
                    x.grad.zero_()
        for x, gy in zip(xs, gys):
            if a.option == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu(pin_memory=cuda):
                    y = forward(x)
            else:
                y = forward(x)
            y.backward(gy)
            del y
        opt.step()

    with llama.attention_backend(a.attention):
        for _ in range(a.warmup):
            step()
        if cuda:
            torch.cuda.synchronize()
        # steps back to back, as training runs them (the host may run ahead
        # of the device), each between two events; one wait at the end
        times, events = [], []
        for _ in range(a.iterations):
            if cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                step()
                e1.record()
                events.append((e0, e1))
            else:
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
        if cuda:
            torch.cuda.synchronize()
            times = [e0.elapsed_time(e1) for e0, e1 in events]
        out = {"shape": a.shape, "smoke": a.smoke, "option": a.option, "k": k, "loop": a.loop,
               "optimizer": a.optimizer, "step_ms": statistics.median(times), "iterations": len(times),
               "peak": None, "peak_abs": None, "predicted_peak_bytes": predicted}
        if cuda:
            torch.cuda.synchronize()
            with _Sampler() as s:
                step()
                torch.cuda.synchronize()
            out.update(peak=s.peak - base, peak_abs=s.peak, base_bytes=base, samples=s.samples)
    return out


def agree(front_pt, alone_pt, tol=0.03):
    """(agree, time ratio, peak ratio) of a front point and the same option
    alone: both figures within ``tol`` (the peak only where both have one)."""
    rt = alone_pt["step_ms"] / front_pt["step_ms"] if front_pt.get("step_ms") else None
    rp = None
    if front_pt.get("peak") and alone_pt.get("peak") is not None:
        rp = alone_pt["peak"] / front_pt["peak"]
    ok = rt is not None and abs(rt - 1) <= tol and (rp is None or abs(rp - 1) <= tol)
    return ok, rt, rp


def _argv(args, shape, pt, loop):
    out = ["--shape", shape, "--option", option_of(pt), "--loop", loop, "--microbatches", str(args.microbatches),
           "--optimizer", args.optimizer, "--iterations", str(args.iterations), "--warmup", str(args.warmup),
           "--attention", args.attention, "--dtype", args.dtype, "--device", args.device]
    if pt.get("param") and pt.get("family") == "torch":
        out += ["--k", str(pt["param"])]
    if args.smoke:
        out.append("--smoke")
    return out


def spread_covers(front_pt, runs, tol=0.03):
    """(covers, time spread, peak spread) of a front point and several alone
    runs of the same option: the option's own process-to-process spread
    (largest over smallest, minus 1) and whether the front's figures lie
    within it, widened by ``tol`` at both ends. A CPU-bound step (eager on
    small layers) varies by more than 3 % from one fresh process to the
    next on a shared host, and so does the peak of steps whose caching
    allocator pays for no more than it reserves: no single run can check
    such a point to 3 %."""
    def within(v, xs):
        return min(xs) * (1 - tol) <= v <= max(xs) * (1 + tol)
    times = [r["step_ms"] for r in runs]
    peaks = [r["peak"] for r in runs if r.get("peak") is not None]
    ts = max(times) / min(times) - 1
    ps = max(peaks) / min(peaks) - 1 if peaks else None
    ok = within(front_pt["step_ms"], times) and (not peaks or not front_pt.get("peak")
                                                 or within(front_pt["peak"], peaks))
    return ok, ts, ps


def check(doc, args, runner=None):
    """Every point of the fronts in ``doc`` whose option is here (option_of)
    alone, each in a fresh process (``runner(argv)`` -> dict: a subprocess by default), against the
    front's figures: {"rows": [...], "agree", "within_spread", "disagree",
    "line"}. A point that differs is run alone ``check_repeats`` times more:
    if the front's figures lie within the spread of those fresh processes
    (spread_covers), the row says so, with the spread, and is not counted
    as agreeing."""
    runner = runner or _subprocess
    repeats = getattr(args, "check_repeats", 2)
    rows = []
    for d in doc.get("fronts", []):
        shape = d["shape"]["name"]
        for pt in d.get("points", []):
            if pt.get("error") or option_of(pt) is None:
                continue
            argv = _argv(args, shape, pt, d["loop"])
            row = {"front": d["title"], "label": pt["label"], "argv": argv, "front_step_ms": pt["step_ms"],
                   "front_peak": pt.get("peak"), "within_spread": False}
            try:
                got = runner(argv)
                ok, rt, rp = agree(pt, got, args.check_tolerance)
                row.update(alone_step_ms=got["step_ms"], alone_peak=got.get("peak"), time_ratio=rt, peak_ratio=rp,
                           agree=ok)
                if not ok and repeats > 0:
                    runs = [got] + [runner(argv) for _ in range(repeats)]
                    cov, ts, ps = spread_covers(pt, runs, args.check_tolerance)
                    row.update(alone_runs=[{"step_ms": r["step_ms"], "peak": r.get("peak")} for r in runs],
                               time_spread=ts, peak_spread=ps, within_spread=cov)
            except Exception as e:
                row.update(error="%s: %s" % (type(e).__name__, e), agree=False)
            rows.append(row)
            print(_row_text(row), flush=True)
    n_ok = sum(1 for r in rows if r["agree"])
    n_spread = sum(1 for r in rows if r.get("within_spread"))
    out = {"rows": rows, "agree": n_ok, "within_spread": n_spread, "disagree": len(rows) - n_ok - n_spread,
           "tolerance": args.check_tolerance}
    out["line"] = "alone check: %d of %d points agree within %.0f %% with the same option alone in a " \
                  "fresh process%s%s" % (
                      n_ok, len(rows), 100 * args.check_tolerance,
                      "; %d more lie within the spread of %d fresh processes of their option (which differ among "
                      "themselves by more than that)" % (n_spread, repeats + 1) if n_spread else "",
                      "" if args.device == "cuda" else " (CPU: times only, no peak)")
    print(out["line"], flush=True)
    return out


def _row_text(r):
    if r.get("error"):
        return "[alone] %s %s: FAILED: %s" % (r["front"], r["label"], r["error"])
    mib = float(1 << 20)
    peak = "" if r["peak_ratio"] is None else ", peak %.0f vs %.0f MiB (x%.3f)" % (
        r["alone_peak"] / mib, r["front_peak"] / mib, r["peak_ratio"])
    verdict = "agrees" if r["agree"] else "DIFFERS"
    if r.get("alone_runs"):
        verdict += "; %d fresh processes: step %s ms%s (spread %.1f %% time%s): %s" % (
            len(r["alone_runs"]), "/".join("%.2f" % a["step_ms"] for a in r["alone_runs"]),
            "" if r.get("peak_spread") is None else ", peak " + "/".join(
                "%.0f" % (a["peak"] / mib) for a in r["alone_runs"]) + " MiB",
            100 * r["time_spread"], "" if r.get("peak_spread") is None else ", %.1f %% peak" % (100 * r["peak_spread"]),
            "the front lies within it" if r["within_spread"] else "the front lies outside it")
    return "[alone] %s %-16s step %.2f vs %.2f ms (x%.3f)%s: %s" % (
        r["front"], r["label"], r["alone_step_ms"], r["front_step_ms"], r["time_ratio"], peak, verdict)


def _subprocess(argv):
    p = subprocess.run([sys.executable, "-m", "vmmrt.torch.bench.alone"] + argv, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise RuntimeError("exit status %d: %s" % (p.returncode, (p.stderr or p.stdout).strip()[-400:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
    # as the front measures (frontrun.eager_modules): every kernel module in
    # the memory before the model
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    a = _parser().parse_args(argv)
    print(json.dumps(measure(a)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
