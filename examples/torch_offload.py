#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""vmmrt.torch in a training loop: Llama-style decoder layers as whole-layer
CUDA graphs whose saved activations live at fixed addresses and go to pinned
host memory between the forward and the backward.

    python3 examples/torch_offload.py [--mode pingpong|remap|none|all] [--offload 1.0|0.25|auto]
                                      [--preset gpu|cpu]

On a GPU the layers are captured as graphs (torch.cuda.make_graphed_callables'
contract); without one they run eagerly on the CPU, through libvmmrt's host
backend (a GPU emulated on host memory), with the same offload, and the
smaller cpu preset (seconds on two cores, not minutes). A line says when each
mode starts and ends, and each step (a bar where tqdm is installed).
"""
import argparse
import os
import time

import torch

import vmmrt.torch as vt
from vmmrt.torch.bench.llama import Shape, torch_layers
from vmmrt.torch.bench.progress import Progress

MODES = ("pingpong", "remap", "none")
PRESETS = {  # (shape, layers, steps)
    "gpu": (Shape(hidden=512, ffn=1408, heads=8, kv_heads=4, seq=256, batch=2), 4, 5),
    "cpu": (Shape(hidden=128, ffn=352, heads=4, kv_heads=2, seq=64, batch=2), 2, 3),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default=None, choices=MODES + ("all",),
                   help="default: VMMRT_MODE's, else pingpong (the C tools' switch)")
    p.add_argument("--offload", default="1.0", help="a fraction of each layer's saved bytes, or auto")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="the shape, layers and steps (default: gpu with CUDA, cpu without)")
    p.add_argument("--layers", type=int, default=None, help="default: the preset's")
    p.add_argument("--steps", type=int, default=None, help="default: the preset's")
    a = p.parse_args()
    offload = a.offload if a.offload == "auto" else float(a.offload)

    cuda = torch.cuda.is_available()
    shape, n_layers, steps = PRESETS[a.preset or ("gpu" if cuda else "cpu")]
    a.layers, a.steps = a.layers or n_layers, a.steps or steps
    # Left out, mode= is left out too: VMMRT_MODE decides, as for the C tools.
    modes = MODES if a.mode == "all" else (a.mode,)
    for i, mode in enumerate(modes, 1):
        name = mode or ("%s (VMMRT_MODE)" % os.environ["VMMRT_MODE"] if os.environ.get("VMMRT_MODE") else
                        "pingpong")
        print("[%d/%d] %s: started (%d layers, hidden %d, seq %d, on %s)"
              % (i, len(modes), name, a.layers, shape.hidden, shape.seq, "cuda" if cuda else "cpu"), flush=True)
        t0 = time.perf_counter()
        train(mode, offload, shape, a.layers, a.steps, cuda)
        print("[%d/%d] %s: done in %.1f s" % (i, len(modes), name, time.perf_counter() - t0), flush=True)


def train(mode, offload, shape, n_layers, steps, cuda):
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    layers = torch_layers(n_layers, shape, dev, dtype)

    def batch():
        return torch.randn(shape.batch, shape.seq, shape.hidden, device=dev, dtype=dtype, requires_grad=True)

    # The drop-in: the same positional arguments as torch.cuda.make_graphed_callables,
    # plus what to offload and how. Modules come back with their forward replaced.
    layers = vt.make_graphed_callables(tuple(layers), tuple((batch(),) for _ in layers),
                                       mode=mode, offload=offload, graphs=cuda)
    model = torch.nn.Sequential(*layers)
    off = vt.offload_of(layers[0])
    print(off.describe())
    if off.plan is not None:
        print(off.plan.summary())

    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with Progress(steps, off.mode, start_lines=False) as bar:
        for step in range(steps):
            bar.start("step %d" % step)
            for micro in range(2):                  # two microbatches accumulate into .grad
                y = model(batch())
                loss = y.float().pow(2).mean()
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            bar.end("step %d: loss %.5f" % (step, loss.item()))

    off.sync()
    s = off.stats()
    print("%d iterations, %.1f MiB offloaded, %.1f MiB restored, %s MiB of slots mapped now"
          % (s["iterations"], s["bytes_offloaded"] / 2**20, s["bytes_restored"] / 2**20,
             s["activation_bytes"] >> 20))


if __name__ == "__main__":
    main()
