#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A probe, not a test (pytest does not collect it): torch.compile'd layers
under vmmrt.torch gave gradients that were not bitwise those of eager, and
took 1.31x the time. Two small Llama layers (bench/llama.py, math
attention), torch.compile'd, through each of:

  eager            the compiled layers, no graphs (the reference)
  torch            torch.cuda.make_graphed_callables
  vmmrt-none       vmmrt.torch.make_graphed_callables(mode="none")
  vmmrt-static     ... grads="static" (torch's gradient contract)
  vmmrt-noplace    ... placement off (vmmrt.torch.place: no op writes at a
                   fixed address; saved tensors copied in, static gradients)
  vmmrt-pingpong   ... mode="pingpong" (the offload itself)

and the same layers not compiled (eager-uncompiled), printing for each
whether its input and parameter gradients are bitwise the reference's (else
the largest difference and the first parameter that differs) and its step
time. Without CUDA or torch.compile it says so and exits 0.

    python3 python/tests/gpu_probe_compile.py [--dtype bf16|fp32] [--iters 3] [--cpu]
"""
import argparse
import copy
import sys
import time
import traceback


def main():
    import torch
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--cpu", action="store_true", help="a dry run of the probe itself on the CPU: no graphs (eager "
                    "offload, host backend), torch's graphs left out, torch.compile where there is one")
    a = ap.parse_args()
    if not a.cpu and (not torch.cuda.is_available() or not hasattr(torch, "compile")):
        print("gpu_probe_compile: skipped (needs CUDA and torch.compile)")
        return 0
    compile_ = getattr(torch, "compile", None) or (lambda m: m)
    import vmmrt.torch as vt
    from vmmrt.torch import place
    from vmmrt.torch.bench.llama import Shape, torch_layers

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    shape = Shape(hidden=256, ffn=704, heads=4, kv_heads=2, seq=128, batch=2)
    dev = torch.device("cpu" if a.cpu else "cuda")
    sync = (lambda: None) if a.cpu else torch.cuda.synchronize
    master = torch_layers(a.layers, shape, dev, dtype, attention="math")
    gen = torch.Generator(device="cpu").manual_seed(7)
    data = [(torch.randn(shape.batch, shape.seq, shape.hidden, generator=gen).to(dev, dtype),
             torch.randn(shape.batch, shape.seq, shape.hidden, generator=gen).to(dev, dtype)) for _ in range(a.iters)]

    def sample():
        return torch.randn(shape.batch, shape.seq, shape.hidden, device=dev, dtype=dtype, requires_grad=True)

    def build(kind):
        layers = copy.deepcopy(master)
        if kind != "eager-uncompiled":
            layers = [compile_(m) for m in layers]
        samples = tuple((sample(),) for _ in layers)
        if kind in ("eager", "eager-uncompiled"):
            return layers, None
        if kind == "torch":
            return list(torch.cuda.make_graphed_callables(tuple(layers), samples)), None
        kw = {"vmmrt-none": dict(mode="none"), "vmmrt-static": dict(mode="none", grads="static"),
              "vmmrt-noplace": dict(mode="none"), "vmmrt-pingpong": dict(mode="pingpong")}[kind]
        saved = place.AVAILABLE
        if kind == "vmmrt-noplace":
            place.AVAILABLE = False
        try:
            out = vt.make_graphed_callables(tuple(layers), samples, graphs=not a.cpu, **kw)
        finally:
            place.AVAILABLE = saved
        return list(out), vt.offload_of(out[0])

    def run(kind):
        layers, off = build(kind)
        params = [p for m in layers for p in m.parameters()]
        res = None
        sync()
        times = []
        for it, (x0, gy) in enumerate(data):
            for p in params:
                p.grad = None
            x = x0.clone().requires_grad_()
            t0 = time.perf_counter()
            y = x
            for m in layers:
                y = m(y)
            (y.float() * gy.float()).sum().backward()
            sync()
            times.append(time.perf_counter() - t0)
            res = [x.grad.clone()] + [p.grad.clone() if p.grad is not None else None for p in params]
        names = ["input"] + ["%d:%s" % (i, n) for i, m in enumerate(layers) for n, _ in m.named_parameters()]
        if off is not None:
            print("  %s: %s" % (kind, off.describe().splitlines()[0][:300]))
        return res, names, min(times[1:] or times)

    kinds = ["eager", "eager-uncompiled", "torch", "vmmrt-none", "vmmrt-static", "vmmrt-noplace", "vmmrt-pingpong"]
    if a.cpu:
        kinds.remove("torch")
    ref = None
    for kind in kinds:
        try:
            got, names, t = run(kind)
        except Exception as e:          # a variant that fails says so, the others still run
            print("%-18s FAILED: %s: %s" % (kind, type(e).__name__, str(e)[:400]))
            traceback.print_exc(limit=3)
            continue
        if ref is None:
            ref, t_ref = got, t
            print("%-18s reference, %.2f ms per step" % (kind, t * 1e3))
            continue
        diff = [(n, (g.float() - r.float()).abs().max().item()) for n, g, r in zip(names, got, ref)
                if g is not None and r is not None and not torch.equal(g, r)]
        missing = [n for n, g, r in zip(names, got, ref) if (g is None) != (r is None)]
        verdict = ("bitwise" if not diff and not missing else
                   "DIFFERS in %d of %d tensors (max |diff| %.3g; first %s)" % (
                       len(diff) + len(missing), len(names), max([d for _, d in diff] or [0.0]),
                       (diff or [(missing[0], 0)])[0][0]))
        print("%-18s %s, %.2f ms per step (%.2fx the reference)" % (kind, verdict, t * 1e3, t / t_ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
