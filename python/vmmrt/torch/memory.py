# SPDX-License-Identifier: LGPL-2.1-or-later
"""Device memory as the driver sees it, and where it goes.

Allocator statistics alone cannot prove that offload gave memory back:
libvmmrt's slots are mapped with the driver's VMM calls, outside PyTorch's
caching allocator, and the allocator keeps freed blocks reserved. So the
total here is the driver's (cuMemGetInfo), and the parts are what each owner
reports: PyTorch's graph pools and the rest of its caching allocator (from
its segment list), libvmmrt's activation slots or banks (from its workers'
count), and the remainder (CUDA context, libraries, other processes).
"""
import torch

MiB = float(1 << 20)


def _pool_bytes(index):
    """(graph-pool bytes, other caching-allocator bytes) reserved on a device, from
    the segments (graph pools are the segments not in the default pool (0, 0))."""
    try:
        segs = torch.cuda.memory_snapshot()
    except Exception:
        return None, torch.cuda.memory_reserved(index)
    pool = other = 0
    known = False
    for s in segs:
        if s.get("device", index) != index:
            continue
        pid = s.get("segment_pool_id")
        known = known or pid is not None
        size = s.get("total_size", 0)
        if pid is not None and tuple(pid) != (0, 0):
            pool += size
        else:
            other += size
    return (pool if known else None), other


def snapshot(offloads=(), device=None):
    """Driver-level used memory and its parts, in bytes (CUDA only)."""
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(dev):
        free, total = torch.cuda.mem_get_info()
        pool, other = _pool_bytes(dev.index)
    slots = sum(o.device_bytes() for o in offloads)
    used = total - free
    known = (pool or 0) + other + slots
    return {"used": used, "total": total, "graph_pool": pool, "allocator": other, "vmmrt": slots,
            "other": used - known}


def describe(snap):
    pool = snap["graph_pool"]
    return ("used %.0f MiB = graph pool %s + caching allocator %.0f + libvmmrt %.0f + other %.0f"
            % (snap["used"] / MiB, "?" if pool is None else "%.0f" % (pool / MiB), snap["allocator"] / MiB,
               snap["vmmrt"] / MiB, snap["other"] / MiB))
