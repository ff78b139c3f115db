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
