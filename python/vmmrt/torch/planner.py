# SPDX-License-Identifier: LGPL-2.1-or-later
"""The automatic choice of what to offload: as much as the copies can hide.

A layer's activations leave the device while the next layer's forward runs
(its D2H), and come back while the next layer's backward runs (its H2D, one
look-ahead ahead): the copy of layer i hides when

    bytes_i <= margin * min(d2h_bandwidth * fwd_ms[i+1], h2d_bandwidth * bwd_ms[i+1]).

This is vmmrt-bench's offload budget (min(1, fwd_ms / copy_ms)) applied per
layer. The last layer in forward order is the *tail*: its backward comes
first, so libvmmrt keeps its activations on the device and copies nothing.
Moving them into the slot would save no memory (they would sit in a bank
instead of the pool) and would grow both ping-pong banks to the tail's size:
the tail moves nothing. :func:`plan` is arithmetic
only; :func:`measure_bandwidth` and the layer timings feed it.
"""
import torch

import vmmrt
from vmmrt.torch import select


class LayerPlan:
    __slots__ = ("name", "fwd_ms", "bwd_ms", "sizes", "budget", "chosen", "tail")

    def __init__(self, name, fwd_ms, bwd_ms, sizes, budget, chosen, tail):
        self.name, self.fwd_ms, self.bwd_ms, self.sizes = name, fwd_ms, bwd_ms, sizes
        self.budget, self.chosen, self.tail = budget, chosen, tail

    @property
    def total(self):
        return sum(self.sizes)

    @property
    def moved(self):
        return sum(self.sizes[i] for i in self.chosen)

    def as_dict(self):
        return {"name": self.name, "fwd_ms": self.fwd_ms, "bwd_ms": self.bwd_ms, "saved_bytes": self.total,
                "budget_bytes": self.budget,
                "offloaded_bytes": self.moved, "regions": len(self.sizes), "offloaded_regions": len(self.chosen),
                "tail": self.tail}


class Plan:
    """Per layer: its budget and the regions chosen; ``summary()`` says it in words."""

    def __init__(self, layers, d2h_gbps, h2d_gbps, margin):
        self.layers, self.d2h_gbps, self.h2d_gbps, self.margin = layers, d2h_gbps, h2d_gbps, margin

    @property
    def fraction(self):
        total = sum(p.total for p in self.layers)
        return sum(p.moved for p in self.layers) / total if total else 0.0

    def summary(self):
        mib = 1 << 20
        lines = ["offload plan at D2H %.1f GB/s, H2D %.1f GB/s, margin %.2f: %.1f%% of %.0f MiB saved bytes"
                 % (self.d2h_gbps, self.h2d_gbps, self.margin, 100 * self.fraction,
                    sum(p.total for p in self.layers) / mib)]
        for p in self.layers:
            lines.append("  %-24s fwd %7.2f ms  saved %8.1f MiB  budget %9s  moves %8.1f MiB (%d of %d regions)%s"
                         % (p.name, p.fwd_ms, p.total / mib,
                            "tail" if p.tail else "%.1f MiB" % (p.budget / mib), p.moved / mib,
                            len(p.chosen), len(p.sizes), " [tail: stays, no copy]" if p.tail else ""))
        return "\n".join(lines)

    def as_dict(self):
        return {"d2h_gbps": self.d2h_gbps, "h2d_gbps": self.h2d_gbps, "margin": self.margin,
                "fraction": self.fraction, "layers": [p.as_dict() for p in self.layers]}


def plan(layers, d2h_gbps, h2d_gbps=None, margin=0.9):
    """layers: (name, fwd_ms, bwd_ms or None, [region bytes]) in forward order."""
    if not 0 < margin <= 1:
        raise ValueError("planner margin %r is not in (0, 1]" % (margin,))
    if not d2h_gbps > 0:
        raise ValueError("planner needs a positive D2H bandwidth, got %r" % (d2h_gbps,))
    h2d_gbps = h2d_gbps or d2h_gbps
    out = []
    n = len(layers)
    for i, (name, fwd_ms, bwd_ms, sizes) in enumerate(layers):
        tail = i == n - 1
        if tail:
            budget = 0.0
        else:
            _, nfwd, nbwd, _ = layers[i + 1]
            cap = nfwd * d2h_gbps  # GB/s * ms = 1e6 bytes
            if nbwd is not None:
                cap = min(cap, nbwd * h2d_gbps)
            budget = margin * cap * 1e6
        chosen = select.choose(sizes, budget)
        out.append(LayerPlan(name, fwd_ms, bwd_ms, list(sizes), budget, chosen, tail))
    return Plan(out, d2h_gbps, h2d_gbps, margin)


def measure_bandwidth(device, nbytes=64 << 20, repeats=3, runtime=None):
    """(D2H, H2D) GB/s of the copies libvmmrt itself makes: one of its slots and
    its pinned host memory, asynchronous copies on a stream of its own, timed
    with its events; the best of ``repeats``. ``runtime``: the one to measure
    with (a temporary one for ``device`` otherwise)."""
    from vmmrt.torch.offload import runtime_options
    own = runtime is None
    rt = vmmrt.Runtime(runtime_options(torch.device(device))) if own else runtime
    slot = host = stream = None
    events = []
    try:
        slot = rt.slot(nbytes)
        slot.map()
        host = rt.host_alloc(nbytes)
        stream = rt.stream_create()
        res = []
        for d2h in (True, False):
            best = float("inf")
            for _ in range(repeats):
                e0, e1 = rt.event(True), rt.event(True)
                events += [e0, e1]
                e0.record(stream)
                if d2h:
                    rt.copy_to_host_async(host, slot.address, nbytes, stream)
                else:
                    rt.copy_to_device_async(slot.address, host, nbytes, stream)
                e1.record(stream)
                e1.synchronize()
                best = min(best, e0.elapsed_ms(e1))
            res.append(nbytes / (max(best, 1e-6) * 1e-3) / 1e9)
        return res[0], res[1]
    finally:
        for e in events:
            e.destroy()
        if stream is not None:
            rt.stream_synchronize(stream)
            rt.stream_destroy(stream)
        if host is not None:
            rt.host_free(host)
        if slot is not None:
            slot.destroy()
        if own:
            rt.close()
