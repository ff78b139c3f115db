# SPDX-License-Identifier: LGPL-2.1-or-later
"""What an executable CUDA graph holds on the device, outside any allocator:
by kernel count, after the capture and after the first replay, and what
is left once the graphs are destroyed and the cache emptied (the
process's first capture: frontrun.GRAPH_FREE). On the launch-bound
layers every graphed point holds ~80-110 MiB of such memory beside
eager's ([memory-plan]: mode none's peak against eager's); this says how
much is per graph and how much is once per process.

    python3 python/tests/gpu_probe_graph_memory.py
"""
import sys

import torch

if not torch.cuda.is_available():
    print("gpu_probe_graph_memory: skipped (needs CUDA)")
    sys.exit(0)
MiB = float(1 << 20)


def used():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


x = torch.randn(1024, 1024, device="cuda")
y = torch.empty_like(x)
torch.mm(x, x, out=y)
x.add_(1)
torch.cuda.synchronize()
for kind in ("add", "mm"):
    for n in (1, 30, 200):
        keep = []
        b0 = used()
        for _ in range(16):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(n):
                    if kind == "add":
                        x.add_(1)
                    else:
                        torch.mm(x, x, out=y)
            keep.append(g)
        b1 = used()
        for g in keep:
            g.replay()
        b2 = used()
        print("%s x%d: 16 graphs: after capture %+.1f MiB (%.2f a graph), after the first replay %+.1f more; "
              "reserved %.0f" % (kind, n, (b1 - b0) / MiB, (b1 - b0) / MiB / 16, (b2 - b1) / MiB,
                                 torch.cuda.memory_reserved() / MiB), flush=True)
        del keep, g
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        print("   destroyed, cache emptied: %+.1f MiB over before them" % ((used() - b0) / MiB), flush=True)
