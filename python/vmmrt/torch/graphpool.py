# SPDX-License-Identifier: LGPL-2.1-or-later
"""The graphs' pool on a slot of the library's, so that the memory plan can
lend it to the optimizer step.

torch.cuda.make_graphed_callables captures every graph into one pool of
PyTorch's caching allocator and keeps it for the graphs' life (806 MiB on 8
Llama-3-8B layers at seq 4096). A replay uses it for its intermediates; the
graphs' static tensors that are not in slots of their own (outputs of
recomputed layers, input gradients) stay in it. Between the last backward of
a step and the next forward, the optimizer step, nothing is there but what
was handed out from it and is still held. Eager PyTorch gives its
intermediates' memory back and foreach AdamW's temporaries take it; the
graphs' pool cannot be given to anyone.

Here the graphs are captured into a ``torch.cuda.MemPool`` whose allocator is
libvmmrt's arena (vmmrt_arena_lend(3)), lent the range of a slot. The slot is
mapped whole for the captures (the driver checks the address of a captured
copy or memset when it instantiates the graph: an unmapped range fails
there), then cut to what the pool's segments use and mapped again
(vmmrt_slot_truncate(3)): its memory is what PyTorch's pool would hold, at
addresses the library owns. The memory plan (vmmrt.torch.memplan) puts it on
its pages with a life of the whole step but its end: it is in use from the
optimizer step's post-hook to its next pre-hook (vmmrt.torch.optmem), and
those bytes serve the optimizer step's temporaries in between, unless a
tensor handed out from the pool is held then (:meth:`GraphPool.alive`: the
use count of its storage above the library's own). A tensor the optimizer
step leaves in those bytes (optmem's survivor) makes the pool leave the
pages for memory of its own before any graph runs again (memplan's
conflict).

How big the range is cannot be known before the captures: it is made from
what discovery saw (:func:`bound`). What the pool asks beyond it, the arena
serves from plain device memory (``graph_pool_fallback_bytes``): it stays
the pool's for the graphs' life, as PyTorch's would, off the plan.

Only with CUDA graphs, where torch has a MemPool with a pluggable allocator
and a storage use count, and without a pool of the caller's: ``pool=``
(``torch.cuda.graph_pool_handle()``, say) keeps PyTorch's.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from vmmrt.torch import _arena
from vmmrt.torch.backing import USE_COUNT as _USE_COUNT, Backing

log = logging.getLogger("vmmrt.torch")

# The range beyond the layers' own sizes: the caching allocator's segments
# (20 MiB for requests of 1 to 10 MiB) and rounding.
SLACK = 64 << 20


def available(off: Any, pool: Any) -> str | None:
    """None when the graphs can be captured into a pool over a slot here, or why not."""
    if pool is not None:
        return "the caller gave the graphs a pool of its own"
    if off.device_type != "cuda":
        return "not on CUDA"
    if _USE_COUNT is None:
        return "this PyTorch has no storage use count"
    from vmmrt.torch import optmem
    return optmem.available(off)


def bound(saved: Sequence[int], inputs: Sequence[int], granularity: int) -> int:
    """The range reserved (and mapped during the captures) for the pool: four
    times the largest layer's saved bytes (a backward's intermediates, or a
    recomputed layer's forward again and its backward), twice every layer's
    inputs (the outputs and input gradients that stay in the pool), and
    :data:`SLACK`, in whole granules."""
    n = 4 * max(list(saved) or [0]) + 2 * sum(inputs) + SLACK
    return -(-n // granularity) * granularity


class GraphPool:
    """The graphs' pool over ``backing`` (a kept slot of ``nbytes``): its id for
    torch.cuda.graph(pool=...), the range's cut after the captures, and
    whether a tensor handed out from it is held."""

    def __init__(self, off: Any, nbytes: int) -> None:
        self.off = off
        self.device = off.device.index if off.device.index is not None else torch.cuda.current_device()
        self.backing = Backing(off, "graph pool", nbytes)
        self.backing.kept = True
        self.bound = self.backing.nbytes
        self.used = 0               # the bytes the pool's segments use in the range (cut)
        self.fallback = 0           # the bytes of its segments the arena served from plain memory
        self._storages = []         # of the tensors handed out from the pool, and the library's count of each
        self._baseline = []
        try:
            self.backing.ensure()
            _arena.lend(off.runtime, [(self.backing.address, self.backing.nbytes)], self.device)
            self.allocator = _arena.allocator()
            self.mempool = torch.cuda.MemPool(self.allocator.allocator())
        except BaseException:
            self.backing.kept = False
            self.backing.slot.destroy()
            raise
        self.backing.alive = self.alive
        self.backing.held = self.held_ranges
        off.backings.append(self.backing)

    @property
    def id(self) -> Any:
        return self.mempool.id

    def cut(self) -> None:
        """After the captures, before any replay: the range cut to the end of
        the last segment in it, mapped again at that size."""
        torch.cuda.synchronize(self.device)
        lo, hi = self.backing.address, self.backing.address + self.backing.nbytes
        end = lo
        for seg in torch.cuda.memory_snapshot(self.id, include_traces=False):
            a, n = seg["address"], seg["total_size"]
            if lo <= a < hi:
                end = max(end, a + n)
            else:
                self.fallback += n
        self.backing.shrink(max(end - lo, 1))
        self.used = end - lo
        if self.fallback:
            log.info("vmmrt: the graphs' pool outgrew its range of %d MiB: %d MiB of it is plain device memory, "
                     "off the memory plan", self.bound >> 20, self.fallback >> 20)

    def settle(self, tensors: Sequence[Any]) -> None:
        """Once the build holds what it keeps: the storages of ``tensors`` (the
        graphs' static outputs and input gradients) that lie in the pool, and
        the library's own count of each; above it, one handed out is held."""
        lo, hi = self.backing.address, self.backing.address + self.used
        seen = {}
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel() and lo <= t.data_ptr() < hi:
                st = t.untyped_storage()
                seen.setdefault(st.data_ptr(), st)
        self._storages = list(seen.values())
        self._baseline = [_USE_COUNT(st._cdata) for st in self._storages]

    def alive(self) -> bool:
        """Whether a tensor handed out from the pool is held by someone else
        than the library. A count found below the library's own is its own
        from then on (a reference of the build that went after settle)."""
        return bool(self._held())

    def _held(self) -> list:
        """The storages handed out that someone holds (the library's own count
        lowered where it went below it)."""
        out = []
        for k, st in enumerate(self._storages):
            n = _USE_COUNT(st._cdata)
            if n < self._baseline[k]:
                self._baseline[k] = n
            elif n > self._baseline[k]:
                out.append(st)
        return out

    def held_ranges(self) -> list | None:
        """The pool's bytes held while its use is over (the optimizer step:
        vmmrt.torch.optmem lends the rest), as [lo, hi) offsets in it: each
        storage handed out that is held. A recomputed first layer's input
        gradient, say, lies in the pool, and the caller's input keeps it as
        its ``.grad`` through the step: its bytes are held, not the pool's
        other gigabytes. None (all of it) while its use lasts."""
        if self.backing.in_use:
            return None
        lo = self.backing.address
        return [(st.data_ptr() - lo, st.data_ptr() - lo + st.nbytes()) for st in self._held()]

    def forget(self) -> None:
        """At close(): the library's references go (a tensor handed out keeps
        the memory, and the runtime, alive: Backing.tensor), the pool's too:
        its segments go back to the arena once the graphs captured into it
        are gone as well."""
        self._storages, self._baseline = [], []
        self.mempool = None

    def stats(self) -> dict:
        return {"graph_pool_bytes": self.used, "graph_pool_bound": self.bound,
                "graph_pool_fallback_bytes": self.fallback}

    def describe(self) -> str:
        where = "on the memory plan's pages" if self.backing.bound else "its own memory"
        return "graphs' pool: %.1f MiB on a slot of the library's (%s; range %.1f MiB%s)" % (
            self.used / 2**20, where, self.bound / 2**20,
            "" if not self.fallback else "; %.1f MiB beyond it in plain device memory" % (self.fallback / 2**20))


def open_for(off: Any, runners: Sequence[Any], pool: Any) -> GraphPool | None:
    """The pool the captures go into, or None (torch's own pool then, and why
    logged): sized by :func:`bound` from what discovery saw."""
    why = available(off, pool)
    if why is None:
        saved = [r.layer.saved_bytes()["distinct"] for r in runners]
        inputs = [sum(x.numel() * x.element_size() for x in r.sample) for r in runners]
        try:
            gp = GraphPool(off, bound(saved, inputs, off.granularity))
        except Exception as e:  # noqa: B902 - torch's pool rather than no graphs
            why = "its range could not be made (%s)" % e
        else:
            off.graph_pool = gp
            off._close_hooks.append(gp.forget)
            return gp
    log.info("vmmrt: the graphs' pool is PyTorch's: %s", why)
    return None
