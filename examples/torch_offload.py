#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""vmmrt.torch in a training loop: Llama-style decoder layers as whole-layer
CUDA graphs whose saved activations live at fixed addresses and go to pinned
host memory between the forward and the backward.

    python3 examples/torch_offload.py [--mode pingpong|remap|none] [--offload 1.0|0.25|auto]

On a GPU the layers are captured as graphs (torch.cuda.make_graphed_callables'
contract); without one they run eagerly on the CPU, through libvmmrt's host
backend (a GPU emulated on host memory), with the same offload.
"""
import argparse

import torch

import vmmrt.torch as vt
from vmmrt.torch.bench.llama import Shape, torch_layers


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="pingpong", choices=("pingpong", "remap", "none"))
    p.add_argument("--offload", default="1.0", help="a fraction of each layer's saved bytes, or auto")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    offload = a.offload if a.offload == "auto" else float(a.offload)

    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    shape = Shape(hidden=512, ffn=1408, heads=8, kv_heads=4, seq=256, batch=2)
    layers = torch_layers(a.layers, shape, dev, dtype)

    def batch():
        return torch.randn(shape.batch, shape.seq, shape.hidden, device=dev, dtype=dtype, requires_grad=True)

    # The drop-in: the same positional arguments as torch.cuda.make_graphed_callables,
    # plus what to offload and how. Modules come back with their forward replaced.
    layers = vt.make_graphed_callables(tuple(layers), tuple((batch(),) for _ in layers),
                                       mode=a.mode, offload=offload, graphs=cuda)
    model = torch.nn.Sequential(*layers)
    off = vt.offload_of(layers[0])
    print(off.describe())
    if off.plan is not None:
        print(off.plan.summary())

    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(a.steps):
        for micro in range(2):                      # two microbatches accumulate into .grad
            y = model(batch())
            loss = y.float().pow(2).mean()
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print("step %d: loss %.5f" % (step, loss.item()))

    off.sync()
    s = off.stats()
    print("%d iterations, %.1f MiB offloaded, %.1f MiB restored, %s MiB of slots mapped now"
          % (s["iterations"], s["bytes_offloaded"] / 2**20, s["bytes_restored"] / 2**20,
             s["activation_bytes"] >> 20))


if __name__ == "__main__":
    main()
