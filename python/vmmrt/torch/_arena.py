# SPDX-License-Identifier: LGPL-2.1-or-later
"""PyTorch's pluggable allocator over libvmmrt's arena (vmmrt_arena_lend(3)),
one for the process, never freed.

A ``torch.cuda.MemPool`` keeps a raw pointer to its allocator, and so does
the caching allocator's private pool behind it, which every CUDA graph
captured into the pool holds too: the pool's cached segments are given
back through that pointer whenever the pool is emptied or dies, which can
be after the object that made it is gone (a graph outliving its build), or
at interpreter exit, after the modules' globals were cleared. An allocator
freed before then is a call through a dangling pointer (a segmentation
fault at teardown). So the optimizer's pools (vmmrt.torch.optmem) and the
graphs' pool (vmmrt.torch.graphpool) share this one, made on first use and
kept for the process: it is a pair of function pointers into libvmmrt,
which is itself never unloaded (linked -z nodelete).

And a runtime that lent ranges to the arena lives until PyTorch holds none
of their segments (:func:`lent`, :func:`sweep`).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

_allocator = None
_lock = threading.Lock()


def allocator() -> Any:
    """The process's ``torch.cuda.memory.CUDAPluggableAllocator`` over the arena."""
    global _allocator
    with _lock:
        if _allocator is None:
            import torch
            import vmmrt
            a = torch.cuda.memory.CUDAPluggableAllocator(vmmrt.arena_library_path(), "vmmrt_arena_malloc",
                                                         "vmmrt_arena_free")
            # one reference no one gives back: not even the clearing of
            # this module's globals at interpreter exit frees it
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(a))
            _allocator = a
        return _allocator


# ------------------------------------------------------ lent ranges' lives
# A segment the arena served from a lent range stays PyTorch's until the
# caching allocator gives it back (empty_cache, or a dead pool's release), and
# a block of it may be a tensor still held (a graph's static output a user
# kept). A runtime destroyed before then unmaps its slots and frees their
# address ranges, and the driver may hand those addresses out again: to the
# caching allocator's own next cudaMalloc, say. The caching allocator then
# knows two blocks at one address; the second free aborts the process
# ("invalid device pointer", CUDACachingAllocator::free; the H200's 1F1B
# memory test, whose second Offload's build reused the first one's graphs'
# pool range). So a runtime that lent ranges is held (vmmrt.Runtime.hold)
# from its first lend until it has ended (close() or its collection) and
# PyTorch holds no segment in any range it lent; :func:`sweep` checks, at
# each build, close and full garbage collection.

class _Lender:
    __slots__ = ("life", "let_go", "ranges")

    def __init__(self, life: Any, let_go: Any) -> None:
        self.life = life
        self.let_go = let_go
        self.ranges = []


_lenders = {}          # id(the runtime's _Life) -> _Lender
_lenders_lock = threading.Lock()
_gc_hooked = False


def _torch_segments() -> list:
    """(address, bytes) of every segment PyTorch's caching allocator holds."""
    import torch
    if not torch.cuda.is_initialized():
        return []
    # (no trace entries: only the segments are read, and the sweep runs in a
    # garbage collection's callback, possibly during the graphs' build with
    # the memory history on, whose every entry a full snapshot converts)
    from vmmrt.torch import _compat
    return [(s["address"], s["total_size"]) for s in _compat.memory_segments()]


segments = _torch_segments      # (tests: a stand-in)


def lend(runtime: Any, ranges: Any, device: int) -> int:
    """runtime.arena_lend(ranges, device) (vmmrt_arena_lend(3)), and the
    runtime held until it has ended and PyTorch holds none of the segments
    served from ``ranges`` ((address, nbytes) pairs); returns the new
    generation."""
    gen = runtime.arena_lend(ranges, device)
    lent(runtime, ranges)
    return gen


def lent(runtime: Any, ranges: Any) -> None:
    """``runtime`` lent ``ranges`` to the arena: held until it has ended and
    PyTorch holds none of their segments."""
    life = runtime._life
    with _lenders_lock:
        ln = _lenders.get(id(life))
        if ln is None:
            ln = _lenders[id(life)] = _Lender(life, runtime.hold())
        ln.ranges.extend((int(a), int(n)) for a, n in ranges if n)
    _hook_gc()


def held(life: Any) -> bool:
    """Whether a runtime (its _Life) is still held for its lent ranges."""
    with _lenders_lock:
        return id(life) in _lenders


def sweep() -> int:
    """Let go of every ended runtime none of whose lent ranges holds a
    segment of PyTorch's any more (its destroy, deferred until then, runs
    now); returns how many are still held for their ranges."""
    with _lenders_lock:
        ended = [ln for ln in _lenders.values() if ln.life.ended]
        left = len(_lenders)
    if not ended:
        return left
    try:
        segs = segments()
    except Exception:  # noqa: B902 - a failed query keeps the holds (never frees under PyTorch)
        return left
    free = []
    for ln in ended:
        if not any(a < lo + n and lo < a + m for lo, n in ln.ranges for a, m in segs):
            free.append(ln)
    with _lenders_lock:
        for ln in free:
            _lenders.pop(id(ln.life), None)
        left = len(_lenders)
    for ln in free:
        ln.let_go()
    return left


def _on_gc(phase: str, info: dict) -> None:
    if phase == "stop" and info.get("generation") == 2 and _lenders:
        sweep()


def _hook_gc() -> None:
    global _gc_hooked
    if not _gc_hooked:
        import gc
        gc.callbacks.append(_on_gc)
        _gc_hooked = True
