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

The caching allocator makes a segment whenever no free block of the pool
fits a request, and segments never merge: captured one after the other,
eight Llama layers' graphs left 12 segments, 694 MiB, for 453 MiB ever
alive at once (H200). So the pool is given its blocks from one segment
made before the captures (:meth:`GraphPool._presize`), over the range but
its front (:data:`SMALL`: the 2 MiB segments of requests up to 1 MiB,
which never come from a large one): the allocator splits it best fit and
merges what is freed, 480 MiB at most on those layers. Where the blocks
reached in it, which no snapshot keeps once they are merged again, is
read from PyTorch's memory history, on for the captures
(:func:`high_water`); the range is cut there, and the segment's free tail
above is taken by a tensor the pool keeps, so that no later request gets
bytes that are no longer mapped. Without that history (a PyTorch that
lacks it, or a caller recording one already, which cannot be turned off
and on around the captures without losing its settings) the pool makes
its segments as it goes.

With the history and :data:`PER_USE` (off by default: see there), each
use's captures (a layer's forward; its backward, and the accumulate graph
beside it) go into a MemPool of their own over one range: in one pool
best fit hands every backward the addresses the one before freed, so each
granule is in use at every backward and shares no page with a layer's
slot. The range is mapped on one
page at every granule for the captures (:meth:`GraphPool._open_per_use`),
on pages of its own by its blocks' lives after them
(:meth:`GraphPool._place_per_use`), and the memory plan places its parts,
each in use at a few uses, beside the layers' slots
(:meth:`GraphPool.planned_parts`, vmmrt.torch.poolplan.parts).

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

from vmmrt.torch import _arena, _compat, poolplan
from vmmrt.torch.backing import USE_COUNT as _USE_COUNT, Backing

log = logging.getLogger("vmmrt.torch")

# The range beyond the layers' own sizes: the caching allocator's segments
# (20 MiB for requests of 1 to 10 MiB) and rounding.
SLACK = 64 << 20
# The front of the range kept for the small segments (2 MiB each, for
# requests up to 1 MiB) when the rest is one presized segment; what they ask
# beyond it the arena serves from plain memory. (Eight Llama layers: 3.)
SMALL = 8 << 20
# One pool per use (a layer's forward, or its backward) when the memory
# history can be read: each capture's blocks at addresses of their own, so
# that a granule is in use at few positions of the step and the memory plan
# can put it on pages of slots in use at others (vmmrt.torch.poolplan's
# parts). In one pool, best fit gives every backward the addresses the one
# before freed, and each granule is in use from the first backward to the
# last: alongside every resident.
#
# Off: a process that builds with many such pools has its Python heap
# corrupted (PyTorch 2.11 on the H100 and H200: the whole of
# python/tests/test_gpu.py, about 200 MemPools over the arena's pluggable
# allocator, segfaults in PyObject_Malloc or PyType_IsSubtype at random
# places of the fifteenth build). Not libvmmrt's: built with
# AddressSanitizer it reports nothing, and the arena served every segment
# from its ranges (no fallback, no bad free); not the memory history (off,
# the same) nor the one page under the range during the captures (pages of
# its own, the same); the same builds with one MemPool for every use pass.
# So one pool for every capture, until the cause is found upstream.
PER_USE = False
# The range of one use beyond its layer's sizes: its own small segments
# (2 MiB each) and mid-size ones (20 MiB for requests of 1 to 10 MiB).
USE_SLACK = 48 << 20


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


def bound_per_use(saved: Sequence[int], inputs: Sequence[int], granularity: int) -> int:
    """The range of a pool per use: each layer's forward (its saved bytes,
    twice its inputs: outputs) and backward (four times its saved bytes: a
    recomputed layer's forward again and its intermediates; twice its
    inputs: its input gradients), each with :data:`USE_SLACK`, in whole
    granules. Addresses only: the captures run on one page mapped at all
    of them, and what a replay uses gets pages after them."""
    n = sum(5 * s + 4 * i + 2 * USE_SLACK for s, i in zip(saved, inputs))
    return -(-n // granularity) * granularity


def layout(nbytes: int) -> tuple | None:
    """(small, large): how a range of ``nbytes`` is lent for a presized
    pool, its front for the small segments and the rest one segment; None
    when it is too small to split."""
    if nbytes < 2 * SMALL:
        return None
    return SMALL, nbytes - SMALL


def high_water(events: Sequence[dict], lo: int, hi: int) -> int:
    """The end, as an offset from ``lo``, of the highest block handed out in
    [lo, hi) by the ``alloc`` events of a memory history's trace
    (torch.cuda.memory._snapshot()'s device_traces); 0 when none."""
    end = lo
    for e in events:
        if e.get("action") == "alloc":
            a = e.get("addr", 0)
            if lo <= a < hi:
                end = max(end, a + e.get("size", 0))
    return end - lo


def reach(events: Sequence[dict] | None, large: tuple, granularity: int) -> int:
    """How much of the presized segment ``large`` ((address, bytes)) the
    captures used: where the blocks of ``events`` reached, in whole
    granules; all of it when there are no events to tell (None: the
    memory history was not on)."""
    a, n = large
    if events is None:
        return n
    return min(n, -(-high_water(events, a, a + n) // granularity) * granularity)


def cut_end(lo: int, segments: Sequence[tuple], large: tuple | None, used: int) -> int:
    """Where a range at ``lo`` is cut: past the end of every segment in it
    (``segments``, (address, bytes) of those in the range), but the presized
    one's (``large``: (address, bytes), or None), which ends where its
    blocks reached (``used`` bytes of it)."""
    end = lo
    for a, n in segments:
        if large is not None and a == large[0]:
            n = min(n, used)
        end = max(end, a + n)
    return end - lo


def _history_why_not() -> str | None:
    """None when the captures can turn PyTorch's memory history on and off,
    or why not."""
    on = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if on is None or not hasattr(torch.cuda.memory, "_record_memory_history") or \
            not hasattr(torch.cuda.memory, "use_mem_pool"):
        return "this PyTorch has no memory history to read the pool's use from"
    if on():
        return "the caller records PyTorch's memory history"
    return None


# The captures' history as a diagnosis wants it (vmmrt.torch.bench.poolcheck
# sets it): every block's birth with its Python frames, and every use's
# span of events marked with one pool too. It costs a stack per
# allocation and two snapshots of the history per use, so builds leave it off.
DIAGNOSE = False


def _history_on() -> None:
    """PyTorch's memory history on, from an empty trace where it can clear one."""
    context = "alloc" if DIAGNOSE else None
    try:
        torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks="python",
                                                 clear_history=True)
    except TypeError:       # (a PyTorch without clear_history)
        torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks="python")


def capture_stream(stream: Any) -> Any:
    """The stream torch.cuda.graph captures on: ``stream``, or its own (made
    here when no graph has made it yet, as torch.cuda.graph would)."""
    if stream is not None:
        return stream
    g = torch.cuda.graph
    if getattr(g, "default_capture_stream", None) is None:
        g.default_capture_stream = torch.cuda.Stream()
    return g.default_capture_stream


def _blocks(seg: dict) -> list:
    """A memory snapshot segment's blocks, each with its address (older
    snapshots give sizes only: the addresses follow from the segment's)."""
    out, a = [], seg["address"]
    for b in seg.get("blocks", ()):
        out.append(dict(b, address=b.get("address", a)))
        a += b["size"]
    return out


class GraphPool:
    """The graphs' pool over ``backing`` (a kept slot of ``nbytes``): its id for
    torch.cuda.graph(pool=...), the range's cut after the captures, and
    whether a tensor handed out from it is held."""

    def __init__(self, off: Any, nbytes: int, stream: Any = None, per_use: bool = False) -> None:
        """``stream``: the captures' (None: torch.cuda.graph's own);
        ``per_use``: one pool per use (:data:`PER_USE`), where the memory
        history can be read."""
        self.off = off
        self.per_use = per_use and _history_why_not() is None
        self.mempools = {}          # use -> its MemPool (per use)
        self.marks = []             # (use, first event, end event) of each use's captures
        self.parts = None           # poolplan.Part of its granules, for the memory plan (planned_parts)
        self.own_table = None       # the page of each granule on pages of its own (per use: own_memory)
        self.own_bytes = None
        self._abs = None            # the page offset of each granule on the plan's pages (parts_at)
        self._at = 0                # the offset of its pages in the plan's, when in order
        self._events_kept = None    # the history's events, for the parts
        self.device = off.device.index if off.device.index is not None else torch.cuda.current_device()
        self.backing = Backing(off, "graph pool", nbytes)
        self.backing.kept = True
        self.bound = self.backing.nbytes
        self.used = 0               # the bytes the pool's segments use in the range (cut)
        self.fallback = 0           # the bytes of its segments the arena served from plain memory
        self.large = None           # (address, bytes) of the presized segment
        self.presize_why_not = None  # why the pool makes its segments as it goes
        self._tracing = False       # the memory history is on for the captures
        self._plug = None           # the tensor over the presized segment's tail beyond the cut
        self._stream = None         # the captures' stream
        self._storages = []         # of the tensors handed out from the pool, and the library's count of each
        self._baseline = []
        self.live_peak = None       # the most bytes of its blocks alive at once in the captures
        self.never_freed = None     # of its blocks', those the captures left in use (one pool, with the history)
        self.place_why_not = None   # why its granules are on pages in order
        self._sealed = None         # (address, bytes) of its blocks in use when the history ended
        try:
            if self.per_use:
                self._open_per_use()
                return self._adopted(off)
            self.backing.ensure()
            lo, n = self.backing.address, self.backing.nbytes
            split = layout(n)
            self.presize_why_not = _history_why_not() if split is not None else "its range is too small"
            ranges = [(lo, n)] if self.presize_why_not else [(lo, split[0]), (lo + split[0], split[1])]
            _arena.lend(off.runtime, ranges, self.device)
            self.allocator = _arena.allocator()
            self.mempool = torch.cuda.MemPool(self.allocator.allocator())
            if not self.presize_why_not:
                self._presize(split, stream)
        except BaseException:
            self._stop_history()
            self.backing.kept = False
            self.backing.destroy()
            raise
        self._adopted(off)

    def _adopted(self, off: Any) -> None:
        self.backing.alive = self.alive
        self.backing.held = self.held_ranges
        self.backing.page_table = self.page_table
        off.backings.append(self.backing)

    def _open_per_use(self) -> None:
        """The range lent whole to the arena, mapped on one page at every
        granule for the captures (nothing runs then: the driver only checks
        that a captured copy's addresses are mapped when it instantiates the
        graph), and the memory history on."""
        g = self.off.granularity
        scratch = self.off.runtime.pages(g)
        try:
            self.backing.map_own(scratch, [0] * (self.backing.nbytes // g))
        except BaseException:
            scratch.destroy()
            raise
        _arena.lend(self.off.runtime, [(self.backing.address, self.backing.nbytes)], self.device)
        self.allocator = _arena.allocator()
        self.mempool = None
        self.presize_why_not = "one pool per use"
        _history_on()
        self._tracing = True

    @property
    def id(self) -> Any:
        return self.mempool.id

    def pool_for(self, use: tuple) -> Any:
        """The pool id the captures of ``use`` ((layer name, backward)) go
        into: the one pool, or (per use) a MemPool of its own over the
        arena."""
        if not self.per_use:
            return self.mempool.id
        mp = self.mempools.get(use)
        if mp is None:
            mp = self.mempools[use] = torch.cuda.MemPool(self.allocator.allocator())
        return mp.id

    def mark(self, use: tuple, first: int | None = None) -> int | None:
        """Where the history stands: called before a use's captures (returns
        the event count), and after them with that count (``first``), which
        records the use's span of events (vmmrt.torch.poolplan's marks).
        Per use only (or with :data:`DIAGNOSE`): one pool places no parts,
        and each mark reads the whole history so far (two full snapshots a
        use)."""
        if not self._tracing or not (self.per_use or DIAGNOSE):
            return None
        n = len(self._events())
        if first is not None:
            self.marks.append((use, first, n))
        return n

    def _presize(self, split: tuple, stream: Any) -> None:
        """The one large segment, made and freed on the captures' stream (the
        caching allocator serves a request from the free blocks of its own
        stream only), and the memory history on until :meth:`cut`."""
        small, large = split
        lo = self.backing.address + small
        stream = capture_stream(stream)
        with torch.cuda.device(self.device), torch.cuda.stream(stream), \
                torch.cuda.memory.use_mem_pool(self.mempool):
            t = torch.empty(large, dtype=torch.uint8, device="cuda")
            at = t.data_ptr()
            del t
        if at != lo:    # the arena found it no room in the range: the segment is plain memory
            self.presize_why_not = "its segment did not land in the range"
            log.info("vmmrt: the graphs' pool's presized segment is not in its range")
            return
        self.large = (lo, large)
        self._stream = stream
        try:
            _history_on()
        except Exception as e:  # noqa: B902 - the segment then stays whole: no cut below it
            self.presize_why_not = "PyTorch's memory history could not be turned on (%s)" % e
            log.info("vmmrt: the graphs' pool: %s", self.presize_why_not)
            return
        self._tracing = True

    def _events(self) -> list | None:
        """The memory history's events on the pool's device so far (when the
        captures turned it on); None otherwise (nothing tells then where
        the blocks reached, or when they were alive)."""
        if not self._tracing:
            return None
        traces = torch.cuda.memory._snapshot()["device_traces"]
        return traces[self.device] if self.device < len(traces) else []

    def _stop_history(self) -> list | None:
        """:meth:`_events`, and the history off."""
        if not self._tracing:
            return None
        try:
            return self._events()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._tracing = False

    def abandon(self) -> None:
        """Captures that failed: the memory history off again."""
        self._stop_history()

    def cut(self) -> None:
        """After the captures, before any replay: the range cut to the end of
        the last segment in it (of the presized one, where its blocks
        reached), mapped again at that size. The memory history stays on
        until :meth:`place`."""
        torch.cuda.synchronize(self.device)
        if self.per_use:
            return self._cut_per_use()
        try:
            events = self._events()
        except Exception:
            self._stop_history()
            raise
        lo, hi = self.backing.address, self.backing.address + self.backing.nbytes
        segs = []
        tail = None
        for seg in _compat.memory_segments(self.id):
            a, n = seg["address"], seg["total_size"]
            if lo <= a < hi:
                segs.append((a, n))
                if self.large is not None and a == self.large[0] and seg["blocks"] and \
                        seg["blocks"][-1]["state"] == "inactive":
                    tail = seg["blocks"][-1]["size"]
            else:
                self.fallback += n
        reached = 0
        if self.large is not None:
            reached = reach(events, self.large, self.off.granularity)
            if reached < self.large[1] and not self._plug_tail(tail):
                reached = self.large[1]
        end = cut_end(lo, segs, self.large, reached)
        self.backing.shrink(max(end, 1))
        self.used = end
        if self.fallback:
            log.info("vmmrt: the graphs' pool outgrew its range of %d MiB%s: %d MiB of it is plain device memory, "
                     "off the memory plan", self.bound >> 20,
                     "" if self.large is None else " (or the %d MiB of it kept for small segments)" % (SMALL >> 20),
                     self.fallback >> 20)

    def _pool_ids(self) -> list:
        """The ids of its pool, or of every pool per use."""
        return [mp.id for mp in self.mempools.values()] if self.per_use else [self.id]

    def _segments(self) -> list:
        """(address, bytes) of the segments of its pool, or of every pool per use."""
        return [(seg["address"], seg["total_size"]) for i in self._pool_ids()
                for seg in _compat.memory_segments(i)]

    def _cut_per_use(self) -> None:
        """Per use: what the segments take of the range (the rest stays on
        the one page until :meth:`place`), and what the arena served beyond it."""
        lo, hi = self.backing.address, self.backing.address + self.backing.nbytes
        end = lo
        for a, n in self._segments():
            if lo <= a < hi:
                end = max(end, a + n)
            else:
                self.fallback += n
        self.used = end - lo
        if self.fallback:
            log.info("vmmrt: the graphs' pools outgrew their range of %d MiB: %d MiB of them is plain device memory, "
                     "off the memory plan", self.bound >> 20, self.fallback >> 20)

    def _place_per_use(self) -> None:
        """Per use, before any replay: the granules on pages of their own by
        when their blocks are alive (poolplan), the one page of the
        captures given back. Without the history's events (it could not be
        read): every granule the segments reached on a page of its own."""
        g = self.off.granularity
        ngr = self.backing.nbytes // g
        try:
            events = self._stop_history()
        except Exception as e:  # noqa: B902 - each granule on a page of its own
            events = None
            self.place_why_not = "PyTorch's memory history could not be read (%s)" % e
        reached = -(-self.used // g)
        if events is not None:
            lo = self.backing.address
            marks = [(k, a, b) for k, (_, a, b) in enumerate(self.marks)]
            ps, own, nown, self.live_peak = poolplan.parts(events, marks, lo, self.used, g)
            self._events_kept = events
            table = own + [0] * (ngr - len(own))
        else:
            nown = max(reached, 1)
            table = list(range(reached)) + [0] * (ngr - reached)
        pages = self.off.runtime.pages(nown * g)
        try:
            self.backing.map_own(pages, [p * g for p in table])
        except BaseException:
            pages.destroy()
            raise
        self.own_table, self.own_bytes = table, nown * g

    def own_memory(self) -> None:
        """Off the plan's pages (a conflict, or no plan after all): on pages of
        its own again, as after the captures (in order, for one pool
        without a table)."""
        if self.own_table is None:
            self.backing.ensure()
            return
        g = self.off.granularity
        pages = self.off.runtime.pages(self.own_bytes)
        try:
            self.backing.map_own(pages, [p * g for p in self.own_table])
        except BaseException:
            pages.destroy()
            raise

    def place(self) -> None:
        """Once the build has dropped what the captures left (their autograd
        graphs: vmmrt.torch.graphed), the memory history off and its events
        kept, for the memory plan to place the pool's granules by when their
        blocks are alive (:meth:`planned_parts`; in order without them).
        Per use, the granules go on pages of their own now
        (:meth:`_place_per_use`)."""
        if self.per_use:
            self._place_per_use()
            self._sealed = set(self._blocks_in_use())
            return
        try:
            events = self._stop_history()
        except Exception as e:  # noqa: B902 - in order, as without a history
            self.place_why_not = "PyTorch's memory history could not be read (%s)" % e
            return
        if events is None:
            self.place_why_not = self.presize_why_not or "no memory history"
            return
        if self._plug is not None:
            # (the presized segment's tail, beyond the cut: it may begin in
            # the range's last granule, and is no block of the captures').
            # Its alloc only, the last at its address: the captures' blocks
            # there before it are theirs (dropping every alloc at it hid 40
            # blocks' births from a Llama layer's history: README,
            # thirty-fifth session)
            at = self._plug.data_ptr()
            last = next((k for k in range(len(events) - 1, -1, -1)
                         if events[k].get("addr") == at and events[k].get("action") == "alloc"), None)
            if last is not None:
                events = events[:last] + events[last + 1:]
        self._events_kept = events
        blocks = poolplan.block_lives(events, self.backing.address, self.backing.address + self.backing.nbytes)
        self.live_peak = poolplan.live_peak(blocks)
        self.never_freed = poolplan.never_freed(blocks)
        self._sealed = set(self._blocks_in_use())

    def _blocks_in_use(self) -> list:
        """(address, bytes) of the pool's blocks in use now, in its range."""
        lo, hi = self.backing.address, self.backing.address + self.backing.nbytes
        return [(b["address"], b["size"]) for i in self._pool_ids() for seg in _compat.memory_segments(i)
                for b in _blocks(seg) if b["state"] != "inactive" and lo <= b["address"] < hi]

    def planned_parts(self, order: Sequence[tuple]) -> list:
        """The pool as the memory plan places it over the step's ``order`` of
        uses: (bytes, first position, last position) of each part of its
        granules (vmmrt.torch.poolplan.parts; positions None: at every
        one), or one part of its whole range in order where the history
        did not tell (or its blocks in use are no longer those it saw: a
        block made after the captures would sit on a page it shares)."""
        g = self.off.granularity
        self.parts = None
        if self._events_kept is not None:
            now = set(self._blocks_in_use())
            if not now <= self._sealed:
                self._events_kept = None
                self.place_why_not = "%d blocks were made in it after the captures" % len(now - self._sealed)
                log.warning("vmmrt: the graphs' pool: %s: its granules go on pages in order", self.place_why_not)
        if self._events_kept is None:
            return [(self.backing.nbytes, None, None)]
        if not self.per_use:
            # One pool: a block's addresses served several captures, and
            # its granules' spans over the step's positions (hulls of
            # their blocks') left bytes in use on pages another slot took
            # (training differed from torch's graphs on the H200): it is in
            # use at every position, on pages of its own.
            return [(self.backing.nbytes, None, None)]
        pos = {use: k for k, use in enumerate(order)}
        marks = [(pos[use], a, b) for use, a, b in self.marks] if all(m[0] in pos for m in self.marks) else []
        self.parts = poolplan.parts(self._events_kept, marks, self.backing.address, self.used, g)[0]
        return [(p.npages * g, p.start, p.end) for p in self.parts]

    def parts_at(self, offsets: Sequence[int]) -> None:
        """The plan's offsets of :meth:`planned_parts`, before it binds the pool."""
        g = self.off.granularity
        self._at = offsets[0] if offsets else 0
        self._abs = poolplan.compose(self.parts, offsets, self.backing.nbytes // g, g) if self.parts else None

    def planned_bytes(self) -> int:
        """The pages the pool takes on the plan (the distinct pages its
        granules are on: its parts share pages with each other, by when they
        are alive; the sum of the parts' before they are placed), or on its
        own."""
        g = self.off.granularity
        if self._abs is not None and self.backing.bound:
            return len(set(self._abs[:-(-self.used // g)])) * g
        if self.parts is not None:
            return sum(p.npages for p in self.parts) * g
        return self.own_bytes if self.own_bytes is not None else self.backing.nbytes

    def page_table(self, offset: int) -> list | None:
        """The page offset of each granule of the pool on the plan's pages
        (:meth:`parts_at`); None: in order at ``offset``."""
        return self._abs

    def held_bytes(self) -> list:
        """[lo, hi) offsets in its range of the tensors handed out that are held."""
        lo = self.backing.address
        return [(st.data_ptr() - lo, st.data_ptr() - lo + st.nbytes()) for st in self._held()]

    def _page_ranges(self, lo: int, hi: int) -> list:
        """The pool's bytes [lo, hi) (offsets in its range) as offsets in the
        plan's pages, one range per granule."""
        if self._abs is None:
            return [(self._at + lo, self._at + hi)]
        return poolplan.table_ranges(self._abs, self.off.granularity, lo, hi)

    def _plug_tail(self, nbytes: int | None) -> bool:
        """The presized segment's free tail (``nbytes``, its last block) taken
        by a tensor the pool keeps: the bytes beyond the cut are no longer
        mapped, and no later request may get them. False when the tensor
        did not land there (the range is then not cut below the segment)."""
        if not nbytes:
            return True
        a, n = self.large
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream), \
                torch.cuda.memory.use_mem_pool(self.mempool):
            t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        if t.data_ptr() + nbytes != a + n:
            return False
        self._plug = t
        return True

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
        vmmrt.torch.optmem lends the rest), as [lo, hi) offsets in
        the plan's pages (:meth:`page_table`): each storage handed out
        that is held. A recomputed first layer's input
        gradient, say, lies in the pool, and the caller's input keeps it as
        its ``.grad`` through the step: its bytes are held, not the pool's
        other gigabytes. None (all of it) while its use lasts."""
        if self.backing.in_use:
            return None
        lo = self.backing.address
        return [r for st in self._held()
                for r in self._page_ranges(st.data_ptr() - lo, st.data_ptr() - lo + st.nbytes())]

    def forget(self) -> None:
        """At close(): the library's references go (a tensor handed out keeps
        the memory, and the runtime, alive: Backing.tensor), the pool's too:
        its segments go back to the arena once the graphs captured into it
        are gone as well."""
        self._storages, self._baseline = [], []
        self._plug = None
        self.mempool = None
        self.mempools = {}
        self._events_kept = None

    def stats(self) -> dict:
        return {"graph_pool_bytes": self.used, "graph_pool_bound": self.bound,
                "graph_pool_fallback_bytes": self.fallback,
                "graph_pool_pages_bytes": self.planned_bytes() if self.backing.bound or self.own_bytes else self.used,
                "graph_pool_live_peak_bytes": self.live_peak or 0,
                "graph_pool_never_freed_bytes": self.never_freed or 0}

    def describe(self) -> str:
        where = "on the memory plan's pages" if self.backing.bound else "its own memory"
        if self.per_use:
            how = "one pool per use (%d), each capture's blocks at addresses of their own" % len(self.mempools)
        elif self.large is None:
            how = "its segments made as the captures asked: %s" % self.presize_why_not
        elif self.presize_why_not:
            how = "one segment made before the captures, kept whole: %s" % self.presize_why_not
        else:
            how = "one segment made before the captures, cut where their blocks reached"
        if self.parts:
            g = self.off.granularity
            spans = sum(1 for p in self.parts if p.start is not None)
            pages = "; its granules on %.1f MiB of pages in %d parts by when their blocks are alive (%.1f MiB " \
                "apart), %d of them at some uses only (%.1f MiB alive at once at most)" % (
                    self.planned_bytes() / 2**20, len(self.parts), sum(p.npages for p in self.parts) * g / 2**20,
                    spans, (self.live_peak or 0) / 2**20)
        elif self.own_bytes is not None:
            pages = "; its granules on %.1f MiB of pages of its own by when their blocks are alive" % (
                self.own_bytes / 2**20)
        else:
            pages = "; its granules on pages in order: %s" % self.place_why_not if self.place_why_not else ""
        if not self.per_use and self.live_peak is not None:
            pages += "; its blocks: %.1f MiB alive at once at most, %.1f MiB left in use by the captures" % (
                self.live_peak / 2**20, (self.never_freed or 0) / 2**20)
        return "graphs' pool: %.1f MiB on a slot of the library's (%s; range %.1f MiB%s; %s%s)" % (
            self.used / 2**20, where, self.bound / 2**20,
            "" if not self.fallback else "; %.1f MiB beyond it in plain device memory" % (self.fallback / 2**20),
            how, pages)


def open_for(off: Any, runners: Sequence[Any], pool: Any, stream: Any = None) -> GraphPool | None:
    """The pool the captures (on ``stream``) go into, or None (torch's own
    pool then, and why logged): sized by :func:`bound` from what discovery
    saw."""
    why = available(off, pool)
    if why is None:
        saved = [r.layer.saved_bytes()["distinct"] for r in runners]
        inputs = [sum(x.numel() * x.element_size() for x in r.sample) for r in runners]
        per_use = PER_USE and _history_why_not() is None
        n = bound_per_use(saved, inputs, off.granularity) if per_use else bound(saved, inputs, off.granularity)
        try:
            gp = GraphPool(off, n, stream, per_use)
        except Exception as e:  # noqa: B902 - torch's pool rather than no graphs
            why = "its range could not be made (%s)" % e
        else:
            off.graph_pool = gp
            off._close_hooks.append(gp.forget)
            return gp
    log.info("vmmrt: the graphs' pool is PyTorch's: %s", why)
    return None
