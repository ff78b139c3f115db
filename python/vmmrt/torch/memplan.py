# SPDX-License-Identifier: LGPL-2.1-or-later
"""One physical memory plan for the memory that comes and goes with a layer:
its resident activations (LayerOffload.resident) and its mapped gradients
(Grads.backing), each a :class:`vmmrt.torch.backing.Backing`.

Without a plan each of those slots gets memory of its own from the driver
before its use and gives it back after (create, map, set access, unmap,
release: five driver calls per slot per step). A graphed training step is
a fixed timeline, though, so once it has been seen the life of every slot
is known, and slots whose lives never overlap can sit on the same physical
pages: one pages object (Runtime.pages) holds them all, each slot bound at
an offset of it (Slot.map_pages) for good. The steady state then makes no
driver call, and the memory is what the stream-ordered map and release give
(eager-like: a layer's resident memory is the gradients' of the layers
whose backward comes after).

The timeline is the step's order of uses (Offload.set_order: every forward
then the backwards in reverse, or a pipeline's), positions 0 .. U-1, and
U is the step's end (the optimizer step). Lives are closed intervals:

- resident of a layer: [its forward, its backward] (mapped before the
  forward, released after the backward);
- gradients, ``set_to_none`` loop (zero_grad(set_to_none=True) drops .grad
  before the next step's first forward): [the first backward of the
  callable's runners, U];
- gradients, persistent ``.grad`` loop: the whole step, and beyond: its
  memory is the ``.grad`` the user keeps, with its values, so it stays the
  slot's own (never shared, not in the pages);
- a backward graph's argument gradients (Grads.io): [the first backward
  of the callable's runners, the use after its last one]: the layer before
  reads them there (Offload.hold_gins holds them to its backward), in
  either loop;
- its output gradients (Grads.outs), which the call copies in and the
  graph reads: [its first backward, its last], in either loop; where the
  step before the plan handed it the argument gradient of the layer
  after, on that layer's io pages instead, with no copy
  (:func:`chain_gouts`).

The loop is learned, not asked (:class:`Watcher`): the plan is made at the
first forward of the second step it sees (after the captures, or after the
warm-up without graphs); gradient memory still held then is persistent.

A tensor that outlives what the plan assumed (a ``g = p.grad`` kept across
the next forward, a saved tensor held past its backward) is caught at the
use that would write over it: when a planned slot's use begins while a slot
it shares bytes with is still held, the slot being used gets memory of its
own for that use (unbound from the pages, then mapped as without a plan;
counted as ``plan_conflicts`` in Offload.stats(), logged once) and goes
back to the pages at a later use that finds its bytes free.

The pages stay mapped between steps too, and the optimizer steps in their
bytes free then (:mod:`vmmrt.torch.optmem`): foreach AdamW's temporaries,
about the parameters' size, which eager PyTorch puts in the memory the
activations gave back. What runs outside the graphed layers before their
backward (a loss head's logits) cannot use them: without the plan the
gradients' memory given back at zero_grad(set_to_none=True) could serve it.
"""
from __future__ import annotations

import logging
import random
import weakref
from typing import Any, Iterable, Sequence

from vmmrt import Error

log = logging.getLogger("vmmrt.torch")

RESIDENT = "resident"
NO_OPTIMIZER_STATS = {"optimizer_routed_steps": 0, "optimizer_survivors": 0, "optimizer_lent_bytes": 0,
                      "optimizer_peak_bytes": 0, "optimizer_fallback_bytes": 0, "optimizer_hook_us": 0.0,
                      "optimizer_view_ms": 0.0, "optimizer_bank_bytes": 0, "optimizer_relocated": 0}
GRADS = "grads"
IO = "io"
GOUTS = "output grads"
OUTPUTS = "outputs"
POOL = "pool"
POOL_KEY = ("graphs", POOL)
SHARED = "grads on resident"
# The set_to_none loop's parameter gradients on the pages of resident bytes
# their backward has read (share_grads); False: each on pages of its own.
SHARE_GRADS = True
# A backward's output gradients on the pages of the argument gradients the
# backward before handed it (chain_gouts); False: a slot of their own, the
# call's copy in.
CHAIN_GOUTS = True


class Life:
    """One slot's life over the step: ``start``, ``end`` (closed, positions in
    the step's order of uses; the step's end is the order's length), its
    size, and whether it goes in the pages (``shared``: False for a
    persistent ``.grad`` or outputs held from one step into the next, which
    keep memory of their own)."""

    def __init__(self, key: Any, kind: str, nbytes: int, start: int, end: int, shared: bool = True,
                 why: str = "") -> None:
        if nbytes <= 0:
            raise ValueError("%r: %d bytes" % (key, nbytes))
        if start > end:
            raise ValueError("%r: life [%d, %d] ends before it starts" % (key, start, end))
        self.key, self.kind, self.nbytes, self.start, self.end = key, kind, nbytes, start, end
        self.shared = shared
        self.why = why
        self.offset = None      # in the pages, once placed
        self.mapped_by = []     # the slots that map it, where two do (share_grads): their keys

    def overlaps(self, other: Life) -> bool:
        return self.start <= other.end and other.start <= self.end

    def __repr__(self) -> str:
        return "Life(%r, %s, %d B, [%d, %d]%s)" % (self.key, self.kind, self.nbytes, self.start, self.end,
                                                    "" if self.offset is None else " @%d" % self.offset)


def _round_up(n: int, g: int) -> int:
    return -(-n // g) * g


def lives(order: Sequence[tuple[str, bool]], residents: dict[str, int],
          grads: Iterable[tuple[str, Sequence[str], int, bool]],
          outputs: dict[str, tuple[int, int | None]] | None = None, pool: int = 0,
          io: Iterable[tuple[str, Sequence[str], int]] = (),
          gouts: Iterable[tuple[str, Sequence[str], int]] = ()) -> list[Life]:
    """Every slot's life. ``order``: the step's uses, (layer name, backward);
    ``residents``: layer name -> bytes of its resident slot; ``grads``:
    (name, the layers whose backwards write them, bytes, persistent);
    ``outputs``: layer name -> (bytes of its forward's outputs, the last
    position a tensor over them was seen held: None, at no use after
    their forward; below the forward's position (from the step before) or
    the order's length (still held at the next step's first use: a caller
    keeping the last layer's output in its loop variable): the whole step,
    since nothing tells when in the next step it is let go); ``pool``:
    bytes of the graphs' pool on a slot (vmmrt.torch.graphpool), in use
    from the step's first use to its last: free at the step's end, for the
    optimizer step; or its parts (vmmrt.torch.poolplan), (bytes, first
    position, last position) each, positions None for a part in use at
    every one; ``io``: (name, the layers whose backwards use them,
    bytes) of the backward graphs' argument gradients; ``gouts``: the same
    of their output gradients."""
    pos = {}
    for k, use in enumerate(order):
        if use in pos:
            raise ValueError("use %r twice in the order" % (use,))
        pos[use] = k
    end = len(order)
    out = []
    for name, nbytes in residents.items():
        f, b = pos.get((name, False)), pos.get((name, True))
        if f is None or b is None:
            raise ValueError("layer %r: its forward or backward is not in the order" % name)
        out.append(Life((name, RESIDENT), RESIDENT, nbytes, f, b, why="from its forward to its backward"))

    def backwards(what, name, layers):
        """(first, last) position of the backwards of ``layers``."""
        bwd = [pos.get((n, True)) for n in layers]
        if not bwd or None in bwd:
            raise ValueError("%s %r: a backward of %r is not in the order" % (what, name, list(layers)))
        return min(bwd), max(bwd)
    for name, layers, nbytes, persistent in grads:
        first, _ = backwards("gradients", name, layers)
        if persistent:
            out.append(Life((name, GRADS), GRADS, nbytes, 0, end, shared=False,
                            why="persistent .grad: the whole step and the next, its own memory"))
        else:
            out.append(Life((name, GRADS), GRADS, nbytes, first, end,
                            why="from its first backward to zero_grad(set_to_none=True)"))
    for name, layers, nbytes in io:
        first, last = backwards("io", name, layers)
        out.append(Life((name, IO), IO, nbytes, first, min(last + 1, end),
                        why="from its backward to the next use, which reads the argument gradients"))
    for name, layers, nbytes in gouts:
        first, last = backwards("output gradients", name, layers)
        out.append(Life((name, GOUTS), GOUTS, nbytes, first, last,
                        why="copied in by its backward's call, read by its graph alone"))
    for name, (nbytes, seen) in (outputs or {}).items():
        f = pos.get((name, False))
        if f is None:
            raise ValueError("layer %r: its forward is not in the order" % name)
        if seen is None or seen == f:
            out.append(Life((name, OUTPUTS), OUTPUTS, nbytes, f, f, why="its forward's outputs, not held after it"))
        elif seen < f or seen >= end:
            # (a tensor over them lives from one step into the next: the slot
            # keeps the memory under it, which the pages could only take with
            # a copy at a time nothing tells)
            out.append(Life((name, OUTPUTS), OUTPUTS, nbytes, 0, end, shared=False,
                            why="its forward's outputs, held into the next step: its own memory"))
        else:
            out.append(Life((name, OUTPUTS), OUTPUTS, nbytes, f, seen,
                            why="its forward's outputs, held until %s's %s" % (
                                order[seen][0], "backward" if order[seen][1] else "forward")))
    if pool:
        for k, (nbytes, s, e) in enumerate([(pool, None, None)] if isinstance(pool, int) else pool):
            if s is None:
                out.append(Life(POOL_KEY + (k,), POOL, nbytes, 0, end - 1,
                                why="the graphs' blocks in use at every replay or handed out; free at the optimizer "
                                "step"))
            elif not 0 <= s <= e < end:
                raise ValueError("the graphs' pool's part %d: positions [%d, %d] are not the step's" % (k, s, e))
            else:
                out.append(Life(POOL_KEY + (k,), POOL, nbytes, s, e,
                                why="the graphs' blocks born and dead at %s" % (
                                    _use(order[s]) if s == e else "%s to %s" % (_use(order[s]), _use(order[e])))))
    return out


class Split:
    """A layer's resident slot and its callable's gradient slot sharing
    pages (:func:`share_grads`): ``pairs`` {gradient granule: resident
    granule}, the slots' granules, and the keys of the three lives that
    stand for them in the plan: the resident granules no gradient takes
    (``head``), the gradients' granules on no resident one (``own``; either
    None when empty), and the granules both map (``shared``)."""

    def __init__(self, resident: Life, grads: Life, pairs: dict[int, int], granularity: int) -> None:
        self.layer, self.name = resident.key[0], grads.key[0]
        self.pairs = dict(pairs)
        self.res_granules = -(-resident.nbytes // granularity)
        self.grad_granules = -(-grads.nbytes // granularity)
        self.head = (self.layer, RESIDENT) if self.res_granules > len(pairs) else None
        self.own = (self.name, GRADS) if self.grad_granules > len(pairs) else None
        self.shared = (self.name, SHARED)

    def tables(self, at: dict[Any, int], granularity: int) -> tuple[list[int], list[int]]:
        """(the resident slot's page offset of each granule, the gradient
        slot's), given the three lives' offsets ``at`` by key: the shared
        granules in the resident's order, the others in order in their
        part."""
        g = granularity
        taken = sorted(set(self.pairs.values()))
        rank = {j: i for i, j in enumerate(taken)}
        res, h = [], 0
        for j in range(self.res_granules):
            if j in rank:
                res.append(at[self.shared] + rank[j] * g)
            else:
                res.append(at[self.head] + h * g)
                h += 1
        grads, o = [], 0
        for k in range(self.grad_granules):
            if k in self.pairs:
                grads.append(at[self.shared] + rank[self.pairs[k]] * g)
            else:
                grads.append(at[self.own] + o * g)
                o += 1
        return res, grads


def share_grads(items: list[Life], pairs: dict[str, tuple[str, dict[int, int]]],
                granularity: int) -> tuple[list[Life], list[Split]]:
    """The lives with each gradient slot of ``pairs`` (its callable's name ->
    (its one layer's name, {gradient granule: resident granule}:
    vmmrt.torch.gradshare.layer_pairs)) partly on the pages of that layer's
    resident slot: the resident granules taken live from its forward to
    the gradients' end (one life, ``SHARED``, that both slots map), the
    rest of each slot keeps its own life. Only where both are in the pages
    (a persistent ``.grad`` keeps memory of its own) and the gradients'
    life begins at that layer's backward (where the backward reads the
    resident bytes before it writes the gradients over them, by the
    timeline the pairs come from). Returns the lives and the splits made."""
    by = {it.key: it for it in items}
    out = list(items)
    splits = []
    for name, (layer, pr) in sorted(pairs.items()):
        r, gl = by.get((layer, RESIDENT)), by.get((name, GRADS))
        if not pr or r is None or gl is None or not (r.shared and gl.shared) or gl.start != r.end:
            continue
        sp = Split(r, gl, pr, granularity)
        if max(pr) >= sp.grad_granules or max(pr.values()) >= sp.res_granules or \
                len(set(pr.values())) != len(pr):
            raise ValueError("%s: the pairs %r do not fit slots of %d and %d granules, one each"
                             % (name, pr, sp.grad_granules, sp.res_granules))
        n = len(pr) * granularity
        out.remove(r)
        out.remove(gl)
        if sp.head is not None:
            out.append(Life(sp.head, RESIDENT, sp.res_granules * granularity - n, r.start, r.end, why=r.why))
        if sp.own is not None:
            out.append(Life(sp.own, GRADS, sp.grad_granules * granularity - n, gl.start, gl.end, why=gl.why))
        both = Life(sp.shared, SHARED, n, r.start, gl.end,
                    why="resident bytes %s's backward has read, then gradients written after" % layer)
        both.mapped_by = [(layer, RESIDENT), (name, GRADS)]
        out.append(both)
        splits.append(sp)
    return out, splits


def chain_gouts(items: list[Life], links: dict[str, tuple[str, int]],
                granularity: int) -> tuple[list[Life], dict[Any, tuple[Life, Any, int]]]:
    """The lives with each output gradients' slot of ``links`` (its
    callable's name -> (the name of the callable whose argument gradient
    its backward was handed as its one output gradient, that gradient's
    byte offset in the latter's io slot)) taken out: the slot maps the io
    slot's pages from that offset, where the bytes it would have copied in
    already are (a chain of layers: layer i's argument gradient is layer
    i-1's output gradient; eager hands the one tensor on). Only where both
    are in the pages, the offset is a whole number of granules, the slot
    fits in the io slot's granules from there and its life lies within the
    io slot's (whose bytes nothing else takes meanwhile), one slot per io
    slot, never its own callable's (whose backward writes the one while it
    reads the other). Returns the lives left and {the slot's key: (its life, the io
    slot's key, the offset)}."""
    g = granularity
    by = {it.key: it for it in items}
    out = list(items)
    chained, taken = {}, set()
    for name, (src, off) in sorted(links.items()):
        go, io = by.get((name, GOUTS)), by.get((src, IO))
        if go is None or io is None or name == src or not (go.shared and io.shared) or io.key in taken:
            continue
        if off < 0 or off % g or off + _round_up(go.nbytes, g) > _round_up(io.nbytes, g):
            continue
        if not io.start <= go.start <= go.end <= io.end:
            continue
        out.remove(go)
        taken.add(io.key)
        go.why = "on %s's argument gradients' pages, which its backward is handed" % src
        chained[go.key] = (go, io.key, off)
    return out, chained


def _kind(key: tuple) -> str:
    """A slot's kind as the summary names it (the graphs' pool's parts by number)."""
    return key[1] if len(key) < 3 else "%s part %d" % (key[1], key[2])


def _use(use: tuple) -> str:
    return "%s's %s" % (use[0], "backward" if use[1] else "forward")


def _first_fit(items: list[Life], granularity: int) -> dict[Any, int]:
    """Each item at the lowest offset (a multiple of the granularity) where it
    shares no byte with an item placed before it whose life overlaps."""
    placed = []
    out = {}
    for it in items:
        size = _round_up(it.nbytes, granularity)
        busy = sorted((o, o + _round_up(p.nbytes, granularity)) for p, o in placed if p.overlaps(it))
        off = 0
        for lo, hi in busy:
            if off + size <= lo:
                break
            off = max(off, hi)
        out[it.key] = off
        placed.append((it, off))
    return out


# The caching allocator takes a segment of 20 MiB for each request of 1 to
# 10 MiB (its kLargeBuffer): a run of free bytes serves whole ones.
SEGMENT = 20 << 20


def free_runs(items: list[Life], offs: dict[Any, int], size: int, t: int, granularity: int) -> list[int]:
    """The runs of bytes of the pages that no item alive at ``t`` holds."""
    from vmmrt.torch.optmem import free_ranges
    busy = [(offs[it.key], offs[it.key] + _round_up(it.nbytes, granularity))
            for it in items if it.start <= t <= it.end]
    return [hi - lo for lo, hi in free_ranges(size, busy)]


# After the orders by key (:func:`place`), moves of one slot in the best
# order so far, drawn from a fixed seed (the same slots get the same
# layout); a move that costs no more is kept. At most MOVES of them, fewer
# where the slots are many (a first fit costs the square of their number:
# WORK bounds the sum), and none once PATIENCE in a row brought nothing.
MOVES = 2000
PATIENCE = 100
WORK = 2000000


def busiest(items: list[Life], granularity: int) -> int:
    """The most bytes (whole granules) of ``items`` alive at one use: no
    layout of them is smaller."""
    if not items:
        return 0
    ts = sorted({it.start for it in items})
    return max(sum(alive_at(items, t, granularity).values()) for t in ts)


def alive_at(items: list[Life], t: int, granularity: int) -> dict[str, int]:
    """The bytes (whole granules) of ``items`` alive at use ``t``, by kind."""
    by = {}
    for it in items:
        if it.start <= t <= it.end:
            by[it.kind] = by.get(it.kind, 0) + _round_up(it.nbytes, granularity)
    return by


def place(items: list[Life], granularity: int, end: int | None = None, need: int = 0) -> int:
    """Set each shared item's offset in the pages so that no two whose lives
    overlap share a byte; returns the pages' size (whole granules). Greedy
    first-fit, by size (largest first), by start, by life (longest first),
    by end (latest first) and (``end``: the step's end) the slots alive at
    the step's end first; then with one slot moved at a time in the best
    order (:data:`MOVES`), until one costs no more than the busiest use
    (:func:`busiest`). The cheapest wins: its size, and what of ``need`` (the optimizer step's temporaries, which
    step in the bytes free at the step's end: vmmrt.torch.optmem) its free
    runs cannot serve in whole segments of the caching allocator, as that
    much more comes from the driver then. Where every slot is a few MiB
    (16 layers of hidden 1024 on the H200), the smallest layout leaves the
    step's end 16 runs of 27 MiB between the gradients' slots, of which
    foreach AdamW used 20 each and took 140 MiB more from the driver.
    Where a plan recomputes some layers (no resident slot) the orders by
    key left the pages 128-736 MiB above the busiest use (8 Llama-3-8B
    layers, two recomputed: the graphs' pool, six resident slots and eight
    gradients' slots), which such moves reach within a few dozen."""
    if granularity <= 0:
        raise ValueError("granularity %d" % granularity)
    shared = [it for it in items if it.shared]
    keys = [lambda it: (-it.nbytes, it.start), lambda it: (it.start, -it.nbytes),
            lambda it: (it.start - it.end, -it.nbytes), lambda it: (-it.end, -it.nbytes)]
    if end is not None:
        keys.append(lambda it: (it.end < end, it.start, -it.nbytes))
    floor = busiest(shared, granularity)
    best = None

    def consider(ordered):
        """The layout of a first fit in that order, kept if it costs no more
        than the best so far; whether it cost less."""
        nonlocal best
        offs = _first_fit(ordered, granularity)
        size = max([offs[it.key] + _round_up(it.nbytes, granularity) for it in shared] or [0])
        cost = size
        if end is not None and need:
            usable = sum(r - r % SEGMENT for r in free_runs(shared, offs, size, end, granularity))
            cost += max(0, need - usable)
        better = best is None or (cost, size) < best[:2]
        if better or (cost, size) == best[:2]:
            best = (cost, size, offs, ordered)
        return better

    for key in keys:
        consider(sorted(shared, key=key))
    n = len(shared)
    rng = random.Random(n)
    idle = 0
    for _ in range(min(MOVES, WORK // max(1, n) ** 2) if n > 1 else 0):
        if best[0] <= floor or idle >= PATIENCE:
            break
        ordered = list(best[3])
        ordered.insert(rng.randrange(n), ordered.pop(rng.randrange(n)))
        idle = 0 if consider(ordered) else idle + 1
    size, offs = best[1], best[2]
    for it in items:
        it.offset = offs.get(it.key) if it.shared else None
    return size


def sharers(items: list[Life], granularity: int) -> dict[Any, list[Any]]:
    """For each placed item, the keys of the others it shares a byte with."""
    placed = [it for it in items if it.offset is not None]
    out = {it.key: [] for it in items}
    for a in placed:
        ea = a.offset + _round_up(a.nbytes, granularity)
        for b in placed:
            if b is not a and a.offset < b.offset + _round_up(b.nbytes, granularity) and b.offset < ea:
                out[a.key].append(b.key)
    return out


class Plan:
    """The arithmetic's result: every slot's life and offset, the pages' size
    (the plan's device memory, with the persistent gradients' own)."""

    def __init__(self, order: Sequence[tuple[str, bool]], items: list[Life], granularity: int,
                 optimizer_need: int = 0, chained: dict[Any, tuple[Life, Any, int]] | None = None) -> None:
        self.order = list(order)
        self.items = items
        self.granularity = granularity
        self.optimizer_need = optimizer_need
        self.pages_bytes = place(items, granularity, len(self.order), optimizer_need)
        # the output gradients' slots on an io slot's pages (chain_gouts):
        # their lives, not placed of their own, at its offset
        self.chained = dict(chained or {})
        by = {it.key: it for it in items}
        for go, io_key, off in self.chained.values():
            io = by[io_key]
            go.offset = None if io.offset is None else io.offset + off
            go.mapped_by = [io_key]
            io.mapped_by = io.mapped_by + [go.key]
        self.own_bytes = sum(_round_up(it.nbytes, granularity) for it in items if not it.shared)
        shared = [it for it in items if it.shared]
        # what the optimizer step's temporaries find free at the step's end,
        # in whole segments of the caching allocator (optmem routes them
        # there; the rest comes from the driver): the step model's
        # (planner.StepModel.planned) part of the step beyond the pages
        self.free_at_end = sum(r - r % SEGMENT for r in free_runs(
            shared, {it.key: it.offset for it in shared}, self.pages_bytes, len(self.order), granularity))
        # the graphs' static tensors the plan holds (their outputs, output
        # and argument gradients), which the static part counted before the
        # plan was made (planner.static_bytes), and the graphs' pool
        self.graph_bytes = sum(it.nbytes for it in items + self.chained_lives() if it.kind in (OUTPUTS, GOUTS, IO))
        self.has_pool = any(it.kind == POOL for it in items)
        self.shares = sharers(items, granularity)
        # what each slot would hold without the plan, summed at the worst use
        self.unplanned_peak = busiest(items + self.chained_lives(), granularity)

    def chained_lives(self) -> list[Life]:
        return [go for go, _, _ in self.chained.values()]

    @property
    def total_bytes(self) -> int:
        """The predicted device memory of these slots: the pages and the
        persistent gradients' own memory."""
        return self.pages_bytes + self.own_bytes

    def busiest_use(self) -> tuple[int, dict[str, int]]:
        """(the position where the slots alive hold the most bytes, those
        bytes by kind of slot): where the plan's pages are what they are."""
        alive = [(t, alive_at(self.items, t, self.granularity)) for t in range(len(self.order) + 1)]
        return max(alive, key=lambda tb: (sum(tb[1].values()), -tb[0]))

    def busiest(self) -> dict:
        """The busiest use for a report: {"use": where (a layer's forward or
        backward, or the step's end), "bytes": by kind of slot}."""
        t, by = self.busiest_use()
        return {"use": "the step's end" if t >= len(self.order) else _use(self.order[t]), "bytes": dict(by)}

    def by_key(self) -> dict[Any, Life]:
        """Every life by its slot's key, the chained output gradients' too."""
        out = {it.key: it for it in self.items}
        out.update((k, go) for k, (go, _, _) in self.chained.items())
        return out

    def summary(self) -> str:
        lines = ["memory plan: %s predicted: %s of pages for %d slots%s (mapped and released around each use "
                 "instead, the same slots would hold %s at the busiest use)"
                 % (size(self.total_bytes), size(self.pages_bytes), sum(1 for it in self.items if it.shared),
                    "" if not self.own_bytes else ", %s of persistent gradients in their own memory"
                    % size(self.own_bytes), size(self.unplanned_peak))]
        b = self.busiest()
        if b["bytes"]:
            lines.append("  the busiest use: %s, %s" % (
                b["use"], ", ".join("%s %s" % (k, size(n)) for k, n in sorted(b["bytes"].items(), key=lambda kv: -kv[1]))))
        if self.optimizer_need:
            lines.append("  the optimizer step's temporaries: %s, in the pages' free runs at the step's end where "
                         "they fit in whole segments" % size(self.optimizer_need))
        for it in sorted(self.items + self.chained_lives(), key=lambda it: (it.offset is None, it.offset or 0,
                                                                            it.start)):
            where = "own memory" if it.offset is None else "offset %s" % size(it.offset)
            with_ = it.mapped_by + (self.shares.get(it.key) or [])
            lines.append("  %s %s: %s at %s, life [%d, %d] (%s)%s"
                         % (it.key[0], _kind(it.key), size(it.nbytes), where, it.start, it.end, it.why,
                            "; shares with " + ", ".join("%s %s" % (k[0], _kind(k)) for k in with_) if with_ else ""))
        return "\n".join(lines)


def size(n: int) -> str:
    """Bytes for people: MiB from one MiB on, KiB below."""
    if n == 0:
        return "0"
    if n >= 1 << 20:
        return "%.1f MiB" % (n / float(1 << 20))
    return "%.1f KiB" % (n / 1024.0)


# --------------------------------------------------------------- applied
class Entry:
    """One planned slot: its Backing, its life, and the Backings it shares
    bytes with; a slot on several lives' pages (a :class:`Split`'s) has
    them as ``parts`` and its page offset of each granule as ``table``."""

    def __init__(self, watcher: Watcher, backing: Any, life: Life, parts: Sequence[Life] = (),
                 table: Sequence[int] | None = None) -> None:
        self.watcher = watcher
        self.backing = backing
        self.life = life
        self.parts = list(parts) or [life]
        self.table = None if table is None else list(table)
        self.sharers = []

    def begin_use(self, stream: Any) -> bool:
        """The slot's use begins (Offload.map_for_use): True when it is on the
        pages and its bytes are free (nothing to map); False when it is to
        be mapped as without a plan: bytes it shares still held (a
        conflict: it leaves the pages), or it is off them and cannot come
        back yet."""
        w = self.watcher
        if w.begin_uses((self.backing,), stream):
            return True
        b = self.backing
        held = self._held()
        if b.bound:
            if not held:
                b.begin_use()       # (the optimizer's survivors lie outside its bytes)
                return True
            w.conflict(self, held, stream)
            return False
        if self.life.offset is None or held or w.pages is None:
            return False
        if w.bind(self):
            b.begin_use()
            w._all_bound()
            return True
        return False

    def _held(self) -> Sequence[Any]:
        """What holds bytes this slot shares now: its sharers that are busy,
        and the optimizer step's survivors where they are in its range."""
        held = [o for o in self.sharers if o.busy]
        w = self.watcher
        if w.optimizer is not None and w.optimizer.holds and \
                any(w.optimizer.held(lo, hi) for lo, hi in self.pages_of()):
            held.append(SURVIVORS)
        return held

    def pages_of(self) -> list[tuple[int, int]]:
        """All the page bytes it maps: its parts'."""
        g = self.watcher.off.granularity
        return [(p.offset, p.offset + _round_up(p.nbytes, g)) for p in self.parts]

    def come_back(self, stream: Any) -> bool:
        """A kept slot (a forward's outputs, mapped for good off the pages:
        vmmrt.torch.outputs) that left the pages at a conflict, at the
        begin of a use: back on them once nothing holds its bytes there or
        its own (the host waits for the device, and for the worker to give
        its own memory back, once); else it goes on with its own memory.
        True when it is on the pages, in use, now."""
        b = self.backing
        w = self.watcher
        if b.bound or not b.kept or self.life.offset is None or w.pages is None or b.live or \
                b.handed_out() or self._held():
            return False
        w._device_done(stream)        # what read or wrote its own memory, on any stream
        if not b.let_go(stream):
            return False
        # Its release is ordered on ``stream`` (a host callback there hands
        # it to a worker): the stream reaches it, then the worker has made it.
        # (Waiting for the workers alone left it to timing whether the
        # release had been handed to them yet.)
        w._drain(stream)
        if not w.bind(self):
            b.ensure()                # (its own memory again: it is being used now)
            return False
        b.begin_use()
        w._all_bound()
        return True


    def page_ranges(self) -> list[tuple[int, int]]:
        """The page bytes it holds now that it is busy: all of its own, or
        those its owner says are held (Backing.held_ranges)."""
        held = self.backing.held_ranges()
        if held is None:
            return self.pages_of()
        if self.table is None:
            at = self.life.offset
            return [(at + lo // 512 * 512, at + _round_up(hi, 512)) for lo, hi in held]
        from vmmrt.torch.poolplan import table_ranges
        g = self.watcher.off.granularity
        return [r for lo, hi in held for r in table_ranges(self.table, g, lo // 512 * 512, _round_up(hi, 512))]


class PoolEntry(Entry):
    """The graphs' pool on the pages: its parts (vmmrt.torch.poolplan), each
    a life of its own, the slot bound by the pool's table of them. Its use
    is the step's (begun at the optimizer step's post-hook, ended at its
    pre-hook); a slot that shares pages with a part is checked where that
    part's use begins (:meth:`Watcher.check_parts`), not against the pool
    as a whole, which is in use all step."""

    def __init__(self, watcher: Watcher, backing: Any, parts: list[Life]) -> None:
        super().__init__(watcher, backing, parts[0], parts)

    def page_ranges(self) -> list[tuple[int, int]]:
        """All of its parts' pages, or the held tensors' (the pool gives them
        as page offsets: GraphPool.held_ranges)."""
        held = self.backing.held_ranges()
        if held is None:
            return self.pages_of()
        return [(lo // 512 * 512, _round_up(hi, 512)) for lo, hi in held]

    def survivors_in(self) -> bool:
        o = self.watcher.optimizer
        g = self.watcher.off.granularity
        return o is not None and o.holds and any(o.held(p.offset, p.offset + _round_up(p.nbytes, g))
                                                 for p in self.parts)


class _Survivors:
    """What holds bytes a slot shares when the optimizer step left tensors
    in them (vmmrt.torch.optmem): named in the conflict's message."""
    name = "a tensor the optimizer step left in the pages"
    busy = True


SURVIVORS = _Survivors()


class Watcher:
    """Learns the loop, then makes and applies the plan (Offload.memplan).

    At each first forward of a step (the first layer whose forward hook
    runs after the callables were made): from the
    second one on, once every resident slot has been released (a whole
    step ran), the gradient slots still held tell the loop (held:
    persistent ``.grad``; free: set_to_none), the plan is made over the
    Offload's order, the pages are created and every planned slot is bound
    (a slot whose own memory the workers have not released yet is bound at
    a later use)."""

    def __init__(self, off: Any, enabled: bool = True) -> None:
        self.off = off
        self.enabled = enabled
        order = off._order
        if order is None:
            order = [(l.name, False) for l in off.layers] + [(l.name, True) for l in reversed(off.layers)]
        self.order = list(order)
        self.first = None         # the layer whose forward begins a step: the first to call forward_begin
        self.starts = 0
        self.plan = None          # Plan, once made
        self.splits = []          # the gradient slots on their layer's resident pages (share_grads)
        self.pages = None
        self.entries = []
        self.conflicts = 0        # uses that found bytes they share still held
        self.binds = 0            # slots put on the pages (at the plan, or back after a conflict)
        self.why_not = "not made yet: the plan is made at the second step's first forward" if enabled else \
            "off (memory_plan=False)"
        self._warned = False
        self._bind_warned = False
        # The optimizer step's temporaries on the pages' free bytes
        # (vmmrt.torch.optmem): "slots" leaves them to PyTorch.
        self.optimizer_enabled = enabled is True
        self.optimizer = None     # optmem.OptimizerMemory, once the plan is applied
        self.optimizer_api = None  # what it asks of PyTorch, made from the Offload (tests: a stand-in)
        self.optimizer_why_not = None if self.optimizer_enabled else "memory_plan=\"slots\""
        self.after_optimizer = False   # a routed optimizer step ran since the last use began
        self.last_stream = None   # the stream of the latest use (begin_uses; the optimizer orders after it)
        self.seen = {}            # layer name -> the last use of the step before the plan its outputs were held at
        self._pos = None
        off._abort_hooks.append(self._aborted)
        # the optimizers that step before the plan (their temporaries need
        # free bytes at the step's end: optmem.step_need); None: not told
        self.stepped = None
        if self.optimizer_enabled:
            from vmmrt.torch import optmem
            if optmem.observe(self):
                self.stepped = weakref.WeakSet()
        # the output gradient each backward is handed, until the plan (chain_gouts)
        for g in self._grads():
            g.watch_gouts = enabled and CHAIN_GOUTS and g.outs is not None and g.gout_index is not None

    def optimizer_seen(self, optimizer: Any) -> None:
        """An optimizer steps (optmem's global pre-hook), before the plan."""
        if self.stepped is not None and self.plan is None:
            try:
                self.stepped.add(optimizer)
            except TypeError:      # not weakly referenceable: its need is not known
                self.stepped = None

    def optimizer_need(self, grads_bytes: int) -> int:
        """The bytes the optimizer step's temporaries take at the step's
        end: what the optimizers that stepped before the plan need
        (optmem.step_need; the largest, as they step one after another),
        or, not told, ``grads_bytes`` (foreach AdamW's: about the
        parameters' size, which the gradients' slots are)."""
        if not self.optimizer_enabled or self.off.host:
            return 0
        if not self.stepped:
            return grads_bytes
        from vmmrt.torch import optmem
        return max(optmem.step_need(o, grads_bytes) for o in list(self.stepped))

    # ------------------------------------------------------------ slots
    def _slots(self):
        """(residents by layer name, gradients, their io slots, their output
        gradients' slots), each of the last three [(name, layer names,
        Backing)]: the slots the plan may hold; a pinned slot (static buffers
        in it) stays as it is."""
        residents = {l.name: l.resident for l in self.off.layers if l.resident is not None}
        grads, io, gouts = {}, {}, {}
        for l in self.off.layers:
            g = getattr(l, "grads", None)
            if g is None or g.backing is None:
                continue
            for b, into in ((g.backing, grads), (getattr(g, "io", None), io), (getattr(g, "outs", None), gouts)):
                if b is not None and not b._pinned:
                    into.setdefault(id(b), (g.name, [], b))[1].append(l.name)
        return residents, list(grads.values()), list(io.values()), list(gouts.values())

    def _grads(self) -> list:
        """The layers' mapped gradients (grads.Grads), each once."""
        seen = {}
        for l in self.off.layers:
            g = getattr(l, "grads", None)
            if g is not None and g.backing is not None:
                seen.setdefault(id(g), g)
        return list(seen.values())

    def _gout_links(self, io: list, gouts: list) -> dict[str, tuple[str, int]]:
        """Per output gradients' slot of one layer's backward whose one output
        gradient was, in the step before the plan, the argument gradient
        another layer's backward handed out from its io slot, laid out as
        this slot lays it (grads.Grads.note_gouts): (that layer's callable,
        the gradient's offset in its io slot); for :func:`chain_gouts`."""
        if not CHAIN_GOUTS:
            return {}
        by_name = {g.name: g for g in self._grads()}
        ios = [(name, b) for name, layers, b in io if len(layers) == 1]
        out = {}
        for name, layers, b in gouts:
            g = by_name.get(name)
            seen = getattr(g, "gout_seen", None)
            if len(layers) != 1 or not seen or len(g.gouts) != 1 or g.gouts[0][0] != 0:
                continue
            ptr, layout = seen[0], seen[1:]
            if g.gouts[0][1:] != layout:
                continue
            for src, iob in ios:
                if src != name and iob.address <= ptr < iob.address + iob.nbytes:
                    off = ptr - iob.address
                    if any(gin is not None and gin[0] == off and gin[1:] == layout for gin in by_name[src].gins):
                        out[name] = (src, off)
                    break
        return out

    def _pool(self):
        """The Backing of the graphs' pool on a slot (vmmrt.torch.graphpool), if its captures used it."""
        gp = getattr(self.off, "graph_pool", None)
        return gp.backing if gp is not None and gp.used else None

    def pool_entry(self) -> PoolEntry | None:
        return next((e for e in self.entries if isinstance(e, PoolEntry)), None)

    def optimizer_begins(self) -> None:
        """The optimizer step's pre-hook (optmem): no graph replays from now
        until its post-hook, so the graphs' pool's use ends and its bytes can
        be lent."""
        pe = self.pool_entry()
        if pe is not None and pe.backing.bound:
            pe.backing.end_use()

    def optimizer_ends(self, stream: Any) -> None:
        """The optimizer step's post-hook: the graphs' pool is in use again,
        on the pages if nothing the step left is in its bytes; else it maps
        memory of its own now, before any replay (a conflict, as a slot's
        whose bytes are held at its use)."""
        pe = self.pool_entry()
        if pe is None or not pe.backing.bound:
            return
        if pe.survivors_in():
            self.conflict(pe, [SURVIVORS], stream, keep=self.off.graph_pool.held_bytes())
            return
        pe.backing.begin_use()

    def _outputs(self):
        """Layer name -> the Backing of its forward's outputs (vmmrt.torch.outputs)."""
        return {l.name: l.outputs.backing for l in self.off.layers if getattr(l, "outputs", None) is not None}

    def use_begins(self, lay: Any, backward: bool) -> None:
        """A use's begin hook, in the step before the plan: which forwards'
        outputs are held here (their lives, :func:`lives`)."""
        if self.plan is not None or self.starts != 1 or not self.enabled:
            return
        outs = self._outputs()
        if not outs:
            return
        if self._pos is None:
            self._pos = {use: k for k, use in enumerate(self.order)}
        p = self._pos.get((lay.name, bool(backward)))
        if p is None:
            return
        for name, b in outs.items():
            if b.handed_out() and self.seen.get(name, -1) < p:
                self.seen[name] = p

    # ------------------------------------------------------------ hooks
    def forward_begin(self, lay: Any, stream: Any) -> None:
        """LayerOffload.forward_begin, before its slot is mapped."""
        if self.plan is not None or not self.enabled:
            return
        if self.first is None:
            # (an eager recomputed layer runs no hooks: the first of the order may not be it)
            self.first = lay.name
        if lay.name != self.first:
            return
        self.starts += 1
        if self.starts < 2:
            return
        residents, grads, io, gouts = self._slots()
        if any(b.mapped for b in residents.values()):
            return      # a step's backwards have not all run: not a steady step yet
        self.make(residents, grads, stream, io, gouts)

    def check_loop(self, learned: str) -> None:
        """The loop this step showed against the one the caller said it runs
        (make_graphed_callables(loop=): what offload="auto" weighed its
        plan for): one warning when they differ, as the plan then saves
        less than it predicted, or holds more than moving nothing would."""
        said = self.off.loop
        if said is not None and said != learned:
            log.warning("vmmrt: the step runs the %s loop, but loop=%r was given: offload=\"auto\" weighed its "
                        "plan for that one; build with loop=%r (or None)", learned, said, learned)

    def _aborted(self):
        for e in self.entries:
            e.backing.end_use()

    # ------------------------------------------------------------- make
    def _grad_pairs(self, residents: dict, grads: list) -> dict[str, tuple[str, dict[int, int]]]:
        """Per gradient slot of the ``set_to_none`` loop (nothing over it
        now, at the next step's first forward) made by one layer's backward
        with a resident slot: (that layer, its gradient granules each on a
        resident granule its backward has read before it writes them:
        vmmrt.torch.gradshare.layer_pairs). Not on the host path without a
        backward timeline, nor where SHARE_GRADS is off."""
        if not SHARE_GRADS:
            return {}
        from vmmrt.torch import gradshare
        lays = {l.name: l for l in self.off.layers}
        out = {}
        for name, layers, b in grads:
            if b.live > 0 or len(layers) != 1 or layers[0] not in residents:
                continue
            lay = lays[layers[0]]
            if getattr(lay, "grads", None) is None or lay.grads.backing is not b:
                continue
            pairs = gradshare.layer_pairs(lay, self.off.granularity)
            if pairs:
                out[name] = (lay.name, pairs)
        return out

    def make(self, residents: dict, grads: list, stream: Any, io: list = (), gouts: list = ()) -> None:
        outs = self._outputs()
        end = len(self.order)
        # held now, at the next step's first forward: into it (the whole step)
        seen = {n: end if b.handed_out() else self.seen.get(n) for n, b in outs.items()}
        gp = self._pool()
        items = lives(self.order, {n: b.slot.size for n, b in residents.items()},
                      [(name, layers, b.slot.size, b.live > 0) for name, layers, b in grads],
                      {n: (b.slot.size, seen[n]) for n, b in outs.items()},
                      self.off.graph_pool.planned_parts(self.order) if gp is not None else 0,
                      [(name, layers, b.slot.size) for name, layers, b in io],
                      [(name, layers, b.slot.size) for name, layers, b in gouts])
        learned = None
        if grads:
            learned = "persistent" if any(b.live > 0 for _, _, b in grads) else "set_to_none"
            self.check_loop(learned)
        items, splits = share_grads(items, self._grad_pairs(residents, grads), self.off.granularity)
        for g in self._grads():
            g.watch_gouts = False
        items, chained = chain_gouts(items, self._gout_links(io, gouts), self.off.granularity)
        need = self.optimizer_need(sum(b.slot.size for _, _, b in grads))
        plan = Plan(self.order, items, self.off.granularity, need, chained)
        self.plan = plan
        self.splits = splits
        from vmmrt.torch import optmem
        optmem.unobserve(self)
        self.why_not = None
        backing = {(n, RESIDENT): b for n, b in residents.items()}
        backing.update({(name, GRADS): b for name, _, b in grads})
        backing.update({(name, IO): b for name, _, b in io})
        backing.update({(name, GOUTS): b for name, _, b in gouts})
        backing.update({(n, OUTPUTS): b for n, b in outs.items()})
        # the slots that map each life's bytes (a split's shared life: two)
        owners = {it.key: [backing[it.key]] for it in items if it.offset is not None and it.kind not in (POOL, SHARED)}
        by_life = plan.by_key()
        split_entries = []
        for sp in splits:
            res_b, grads_b = residents[sp.layer], backing[(sp.name, GRADS)]
            owners[sp.shared] = [res_b, grads_b]
            at = {k: by_life[k].offset for k in (sp.head, sp.own, sp.shared) if k is not None}
            rt, gt = sp.tables(at, self.off.granularity)
            for b, mine, table in ((res_b, sp.head, rt), (grads_b, sp.own, gt)):
                e = Entry(self, b, by_life[sp.shared], [by_life[k] for k in (mine, sp.shared) if k is not None], table)
                b.page_table = (lambda _offset, e=e: e.table)
                split_entries.append(e)
        split_b = {id(e.backing) for e in split_entries}
        self.entries = [Entry(self, backing[it.key], it) for it in items
                        if it.offset is not None and it.kind not in (POOL, SHARED) and id(backing[it.key]) not in split_b]
        self.entries += split_entries
        # A chained output gradients' slot maps its io slot's pages: whoever
        # shares those bytes checks it too; it does not check the io slot,
        # whose gradient it is handed (the call checks that: Grads.chained).
        by_name = {g.name: g for g in self._grads()}
        for key, (go, io_key, off) in plan.chained.items():
            if go.offset is None:
                continue
            ob, iob = backing[key], backing[io_key]
            owners[io_key].append(ob)
            self.entries.append(Entry(self, ob, go, [by_life[io_key]]))
            g, src = by_name[key[0]], by_name[io_key[0]]
            layout = next(gin[1:] for gin in src.gins if gin is not None and gin[0] == off)
            g.chain = (iob, iob.address + off) + layout + (g.gout_index,)
        parts = [it for it in items if it.kind == POOL]
        # (a slot is not checked against the pool, whose use is the whole
        # step: the pool's parts check their sharers where they begin)
        for e in self.entries:
            near = [b for p in e.parts for k in plan.shares[p.key] for b in owners.get(k, ()) if b is not e.backing]
            e.sharers = list(dict.fromkeys(near))
            e.backing.planned = e
        for sp in splits:
            # The resident slot's use (its forward) writes the bytes the
            # gradients lie on: a .grad still held then is a conflict, as
            # any sharer's. Not the other way: the gradients' use begins at
            # the backward that reads the resident bytes first (the pairs).
            res_b, grads_b = residents[sp.layer], backing[(sp.name, GRADS)]
            if grads_b not in res_b.planned.sharers:
                res_b.planned.sharers.append(grads_b)
        part_checks = {}
        if parts:
            pe = PoolEntry(self, gp, parts)
            gp.planned = pe
            self.entries.append(pe)
            checks = {}
            for it in parts:
                near = [b for k in plan.shares[it.key] for b in owners.get(k, ())]
                if near:
                    checks.setdefault(self.order[it.start], []).extend(near)
            part_checks = {use: tuple(dict.fromkeys(bs)) for use, bs in checks.items()}
        if not self.entries:
            log.info("vmmrt: %s", plan.summary())
            return
        # The releases of the last step reach the workers once the stream
        # gets to them: wait for both, so that the slots are free to bind.
        # (The outputs' slots keep their memory off the pages: given back
        # now where nothing over them is held.)
        for e in self.entries:
            if e.life.kind in (OUTPUTS, POOL):
                e.backing.let_go(stream)
        self._drain(stream)
        try:
            self.pages = self.off.runtime.pages(plan.pages_bytes)
        except Error as e:
            # (the device's memory taken, say): the slots go on being mapped
            # and released around their uses, as without a plan
            for en in self.entries:
                en.backing.planned = None
                if isinstance(en, PoolEntry) and not en.backing.mapped:
                    self.off.graph_pool.own_memory()    # (given back above: its replays need it)
            self.entries = []
            self.why_not = "its pages (%s) could not be made (%s): each slot is mapped and released around its " \
                "use" % (size(plan.pages_bytes), e)
            log.warning("vmmrt: memory plan: %s", self.why_not)
            return
        self.off._close_hooks.append(self.pages.destroy)
        for e in self.entries:
            try:
                if isinstance(e, PoolEntry):
                    self.off.graph_pool.parts_at([p.offset for p in e.parts])
                e.backing.bind(self.pages, e.life.offset) and self._bound_one()
            except Error as err:
                # (a driver that refuses the map): no plan rather than its
                # pages held beside every slot's own memory
                self._give_up("a slot could not be put on its pages (%s): each slot is mapped and released around "
                              "its use" % err)
                return
        log.info("vmmrt: %s", plan.summary())
        pe = self.pool_entry()
        if pe is not None and pe.backing.bound:
            pe.backing.begin_use()      # in a step: its replays from now on
            self.off.part_checks = part_checks     # (the pool on the pages: its parts are checked)
        self._all_bound()
        self._route_optimizer()
        self._tell_model(plan, learned)

    def _tell_model(self, plan: Plan, learned: str | None) -> None:
        """The whole step's model (Offload.step_model) takes the applied
        plan's bytes in the loop it learned (None: no gradient slot on the
        pages, whose loop then changes nothing there). A prediction never
        stops the plan it predicts: one that fails is logged and dropped."""
        model = getattr(self.off, "step_model", None)
        if model is None:
            return
        try:
            model.planned(plan, learned, self.optimizer_enabled)
        except Exception as e:  # noqa: B902 - reported; the plan is applied already
            log.warning("vmmrt: the whole step's model could not take the memory plan: %s: %s", type(e).__name__, e)
            self.off.step_model = None

    def _route_optimizer(self) -> None:
        if not self.optimizer_enabled:
            return
        from vmmrt.torch import optmem
        if self.optimizer_api is not None:
            why = optmem.hooks_missing()      # a stand-in's (tests): only the hooks must be there
        else:
            why = optmem.available(self.off)
            if why is None:
                self.optimizer_api = optmem.TorchPools
        if why is not None:
            self.optimizer_why_not = why
            log.info("vmmrt: memory plan: the optimizer step's allocations stay in PyTorch's memory: %s", why)
            return
        self.optimizer = optmem.OptimizerMemory(self, self.optimizer_api(self.off))

    def optimizer_done(self, stream: Any) -> None:
        """The first planned use after a routed optimizer step: its routing is
        over (a step that raised ends it here), and this use's stream waits
        for the optimizer's if it is another."""
        self.after_optimizer = False
        if self.optimizer is not None:
            self.optimizer.after_step(stream)

    def begin_uses(self, backings: Sequence[Any], stream: Any) -> int:
        """The uses of ``backings`` (the slots of one hook) begin on
        ``stream``, each on the pages with the bytes it shares free: nothing
        to map. Returns how many of them, from the first, began so; the
        caller maps each of the rest as without a plan (Offload.map_for_use,
        whose Entry.begin_use finds why: off the pages, a conflict, the
        optimizer step's survivors). One call a hook, as this runs at every
        use of a planned step: what Backing.busy and begin_use() do is
        written out (change them together)."""
        self.last_stream = stream
        if self.after_optimizer:
            self.optimizer_done(stream)
        opt = self.optimizer
        if opt is not None and opt.holds:
            return 0            # (whether they lie in a slot's range: Entry._held)
        k = 0
        for b in backings:
            e = b.planned
            if e is None or not b.bound:
                return k
            for o in e.sharers:
                if o.quiet:
                    continue    # (not busy when last asked, and nothing since: Backing.quiet)
                if o.bound and (o._in_use or o.live > 0 or (o.alive is not None and o.alive())):
                    return k
                o.quiet = True
            b._in_use, b.quiet = True, False
            k += 1
        return k

    def _bound_one(self) -> None:
        self.binds += 1

    def _give_up(self, why: str) -> None:
        self.off.part_checks = {}
        for en in self.entries:
            en.backing.unbind()
            en.backing.planned = None
            if isinstance(en, PoolEntry):
                self.off.graph_pool.own_memory()    # (its replays need it mapped: no use maps it)
        self.entries = []
        self.pages.destroy()
        self.off._close_hooks.remove(self.pages.destroy)
        self.pages = None
        self.why_not = why
        model = getattr(self.off, "step_model", None)
        if model is not None:
            model.planned(None)     # (back to its estimate: no pages)
        log.warning("vmmrt: memory plan: %s", why)

    def _all_bound(self) -> None:
        """Every slot on the pages: no use maps memory, so a graph may launch
        in one call (Offload.maps_per_use, vmmrt.torch._launch)."""
        if not self.off.maps_per_use():
            self.off.launch_ways_changed(True)

    def bind(self, entry: Entry) -> bool:
        """Put the entry's slot on the pages, if its own memory is gone; a
        failure leaves it mapping memory of its own (logged once)."""
        try:
            if not entry.backing.bind(self.pages, entry.life.offset):
                return False
        except Error as e:
            if not self._bind_warned:
                self._bind_warned = True
                log.warning("vmmrt: memory plan: %s could not be put on its pages (%s): it is mapped and released "
                            "around its uses; logged once", entry.backing.name, e)
            return False
        self.binds += 1
        return True

    def _drain(self, stream: Any) -> None:
        self._device_done(stream)
        self.off.runtime.offload_sync()

    def _device_done(self, stream: Any) -> None:
        """The work queued so far has run (the host backend's stream; every
        stream of the CUDA device)."""
        if self.off.host:
            self.off.runtime.stream_synchronize(stream)
        else:
            import torch
            torch.cuda.synchronize(self.off.device)

    def conflict(self, entry: Entry, held: list, stream: Any, keep: Sequence[tuple[int, int]] = ()) -> None:
        """A use of ``entry``'s slot begins while a slot sharing its bytes is
        held (a .grad kept across the next forward, a saved tensor kept past
        its backward): the slot leaves the pages, after the work that used
        them through it, and maps memory of its own as without a plan (the
        graphs' pool at once, its bytes ``keep`` copied over: the tensors
        it handed out that are held)."""
        self._counted("%s is used while %s, which shares its memory, is still held" % (
            entry.backing.name, ", ".join(b.name for b in held)), "it gets memory of its own")
        self._device_done(stream)     # what read or wrote the pages through the slot
        if isinstance(entry, PoolEntry):
            self.off.part_checks = {}
            self._move(entry.backing, keep, self.off.graph_pool.own_memory)
        else:
            entry.backing.unbind()
        self.off.launch_ways_changed(False)

    def _counted(self, what: str, then: str) -> None:
        """A conflict counted, and logged the first time."""
        self.conflicts += 1
        if not self._warned:
            self._warned = True
            log.warning("vmmrt: memory plan: %s (a tensor kept past the life the plan gave it, such as a .grad kept "
                        "across the next forward): %s, at the cost of driver calls "
                        "(Offload.stats()['plan_conflicts'] counts these); logged once", what, then)

    def check_parts(self, use: tuple, stream: Any) -> None:
        """A use begins where parts of the graphs' pool begin theirs
        (Offload.part_checks): a slot sharing their pages that is still held
        (a .grad kept across the next forward, a saved tensor past its
        backward) moves to memory of its own first, its bytes copied over,
        so that the replay does not write over what its holder reads."""
        for b in self.off.part_checks.get(use, ()):
            if not b.quiet and b.bound and b.busy:
                self._counted("the graphs' pool's blocks of %s share the memory of %s, which is still held" % (
                    _use(use), b.name), "it moves to memory of its own, its bytes copied")
                self._device_done(stream)
                self._move(b, [(0, b.nbytes)], b.ensure)
                self.off.launch_ways_changed(False)

    def _move(self, backing: Any, keep: Sequence[tuple[int, int]], remap: Any) -> None:
        """``backing`` off the pages onto memory of its own (``remap()``), the
        bytes ``keep`` ([lo, hi) offsets in its slot) copied over through
        the host (a conflict: rare, and the device memory to stage them in
        is what is short)."""
        rt = self.off.runtime
        saved = []
        try:
            for lo, hi in keep:
                if hi > lo:
                    buf = rt.host_alloc(hi - lo)
                    saved.append((lo, hi, buf))
                    rt.copy_to_host(buf, backing.address + lo, hi - lo)
            backing.unbind()
            remap()
            for lo, hi, buf in saved:
                rt.copy_to_device(backing.address + lo, buf, hi - lo)
        finally:
            for _, _, buf in saved:
                rt.host_free(buf)

    # ------------------------------------------------------------- info
    def stats(self) -> dict:
        st = {"plan_conflicts": self.conflicts, "plan_binds": self.binds,
              "plan_bytes": self.pages.size if self.pages is not None else 0,
              "plan_grad_share_bytes": self.shared_bytes(), "plan_chained_bytes": self.chained_bytes(),
              "plan_chained_copies": sum(g.chain_skips for g in self._grads())}
        st.update(self.optimizer.stats() if self.optimizer is not None else NO_OPTIMIZER_STATS)
        return st

    def chained_bytes(self) -> int:
        """The bytes of the output gradients' slots the applied plan maps on
        the argument gradients they are handed (:func:`chain_gouts`)."""
        if self.pages is None or self.plan is None:
            return 0
        return sum(go.nbytes for go, _, _ in self.plan.chained.values() if go.offset is not None)

    def shared_bytes(self) -> int:
        """The bytes of the gradients' slots the applied plan maps on their
        layers' resident pages (:func:`share_grads`)."""
        if self.pages is None:
            return 0
        return sum(len(sp.pairs) for sp in self.splits) * self.off.granularity

    def describe(self) -> str:
        if self.plan is None:
            return "memory plan: %s" % self.why_not
        if self.why_not:
            return "memory plan: not applied: %s\n%s" % (self.why_not, self.plan.summary())
        opt = ("\n" + self.optimizer.describe() if self.optimizer is not None else
               "\noptimizer step: in PyTorch's memory (%s)" % self.optimizer_why_not if self.optimizer_why_not else "")
        return self.plan.summary() + opt + "".join("\n  %s: off the pages now (memory of its own since a conflict)"
                                             % e.backing.name for e in self.entries if not e.backing.bound)
