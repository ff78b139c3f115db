#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""One pipeline stage running 1F1B with vmmrt.torch: p microbatches in flight
through the same layers, each (layer, microbatch) its own CUDA-graph runner
(as Megatron-LM's per-microbatch graphs), the order declared to libvmmrt so
that ping-pong makes the banks it needs. Trains the same layers on the same
data in each mode and prints driver-level device memory (cuMemGetInfo) with
p microbatches in flight, against running without offload: mode none (the
same runners, every activation resident) and, on a GPU, eager (the plain
layers, no graphs, no libvmmrt).

    python3 examples/torch_1f1b.py [--modes eager,none,pingpong,remap] [--in-flight 4] [--microbatches 8]

Without a GPU the layers run eagerly on CPU tensors through libvmmrt's host
backend (a GPU emulated on host memory): the memory printed is then that
emulated device's, which holds libvmmrt's activations only. --nan-step N
poisons one microbatch of step N: the step is abandoned part-way
(Offload.abort) and training goes on with the same graphs.
"""
import argparse
import gc
import time

import torch

import vmmrt.torch as vt
from vmmrt.torch import pipeline
from vmmrt.torch.bench.progress import Progress

MiB = float(1 << 20)


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def used_bytes(off, dev):
    """Device memory in use at the driver's count: cuMemGetInfo (torch's on a GPU,
    libvmmrt's emulated device on the host backend)."""
    if off is not None:
        off.sync()
    if dev == "cuda":
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
    elif off is not None:
        free, total = off.runtime.mem_info()
    else:
        free = total = 0
    return total - free


def train(mode, a, dev, dtype):
    torch.manual_seed(0)
    layers = [Block(a.hidden).to(dev, dtype) for _ in range(a.layers)]
    m, p = a.microbatches, a.in_flight

    def batch(gen):
        return torch.randn(a.batch, a.seq, a.hidden, generator=gen, device="cpu").to(dev, dtype).requires_grad_()

    # Megatron's 1F1B order for this stage, then one runner per (layer, microbatch).
    order = vt.order_1f1b(m, in_flight=p)
    if mode == "eager":                                # the plain layers: the baseline
        stage, off = [layers] * m, None
    else:
        gen = torch.Generator().manual_seed(1)
        samples = tuple((batch(gen),) for _ in range(a.layers * m))
        runners = vt.make_graphed_callables(tuple(layers), samples, order=order, mode=mode, graphs=dev == "cuda")
        stage = pipeline.split(runners, order)[0]      # stage[mb]: microbatch mb's layers
        off = vt.offload_of(runners[0])
    opt = torch.optim.SGD([q for l in layers for q in l.parameters()], lr=1e-3)

    peak, times = 0, []
    for step in range(a.steps):
        gen = torch.Generator().manual_seed(100 + step)
        xs = [batch(gen) for _ in range(m)]
        if step == a.nan_step:
            with torch.no_grad():
                xs[m // 2][0, 0, 0] = float("nan")
        t0 = time.perf_counter()
        ys, losses, skipped = {}, [], False
        for k, (backward, _, mb) in enumerate(pipeline.steps(order)):
            if not backward:                             # a forward through the stage
                y = xs[mb]
                for f in stage[mb]:
                    y = f(y)
                ys[mb] = y
                if k == min(p, m) - 1 and step == a.steps - 1:
                    peak = used_bytes(off, dev)          # p microbatches in flight
            else:                                        # a backward: its loss here (the last stage)
                loss = ys.pop(mb).float().pow(2).mean()
                if not torch.isfinite(loss):
                    if off is not None:
                        off.abort()                      # abandon the step; the graphs stay valid
                    skipped = True
                    break
                loss.backward()
                losses.append(loss.detach())
        if skipped:
            opt.zero_grad(set_to_none=True)
            print("  %s step %d: a loss is not finite: step abandoned (Offload.abort)" % (mode, step))
            continue
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        print("  %s step %d: loss %.6f" % (mode, step, torch.stack(losses).mean().item()))
    s = {"activation_bytes": 0, "banks": 0, "bytes_offloaded": 0, "aborts": 0}
    if off is not None:
        off.sync()
        s = off.stats()
        off.close()
    weights = torch.cat([q.detach().float().flatten() for l in layers for q in l.parameters()])
    return {"mode": mode, "used": peak, "vmmrt": s["activation_bytes"], "banks": s["banks"],
            "ms": sorted(times)[len(times) // 2] if times else 0.0, "moved": s["bytes_offloaded"],
            "aborts": s["aborts"], "weights": weights}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default=None, help="eager (plain layers), none, pingpong, remap (default: all; "
                    "eager only on a GPU)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--in-flight", type=int, default=4, help="p: microbatches forward before the first backward")
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--nan-step", type=int, default=None, help="poison a microbatch of this step")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    a.hidden = a.hidden or (1024 if cuda else 64)
    a.seq = a.seq or (2048 if cuda else 32)
    modes = (a.modes or ("eager,none,pingpong,remap" if cuda else "none,pingpong,remap")).split(",")
    print("1F1B on one stage: %d layers, %d microbatches, %d in flight, %s %s, [%d, %d, %d] per microbatch"
          % (a.layers, a.microbatches, a.in_flight, dev, str(dtype).replace("torch.", ""), a.batch, a.seq,
             a.hidden))
    rows = []
    with Progress(len(modes), "1F1B") as bar:
        for mode in modes:
            bar.start(mode)
            rows.append(train(mode, a, dev, dtype))
            bar.end()
            # The last mode's runners (graphs, pool, static tensors) go before the
            # next one measures: each mode's memory is its own.
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    base = next((r for r in rows if r["mode"] == "none"), rows[0])
    print("%-9s %14s %12s %6s %9s %11s %7s  %s" % ("mode", "used MiB", "vmmrt MiB", "banks", "step ms",
                                                   "moved MiB", "aborts", "weights vs " + base["mode"]))
    for r in rows:
        diff = (r["weights"] - base["weights"]).abs().max().item()
        # The share of the baseline's memory only where the baseline holds some
        # (on the host backend "none" holds no emulated device memory).
        print("%-9s %8.0f %5s %12.1f %6d %9.2f %11.1f %7d  %s"
              % (r["mode"], r["used"] / MiB, "(%.0f%%)" % (100.0 * r["used"] / base["used"]) if base["used"] else "",
                 r["vmmrt"] / MiB, r["banks"], r["ms"], r["moved"] / MiB, r["aborts"],
                 "bitwise equal" if torch.equal(r["weights"], base["weights"]) else "max |diff| %.3g" % diff))
    # libvmmrt's modes run the same graphs over the same bytes: the same weights, bit for bit
    if any(r["mode"] != "eager" and not torch.equal(r["weights"], base["weights"]) for r in rows):
        raise SystemExit("the weights differ between libvmmrt's modes")


if __name__ == "__main__":
    main()
