# SPDX-License-Identifier: LGPL-2.1-or-later
"""The graphs' pool's addresses on fewer physical pages: each granule of its
range placed by when its bytes are in use.

PyTorch's caching allocator places the captures' blocks in the pool online,
best fit, and a block's addresses are taken until it is freed: a capture
that frees small blocks between large ones leaves holes no later block
fits. On 8 long-context layers (seq 32768), recomputed, the pool reached
9472 MiB for 8452 MiB ever alive at once, inside each capture (H200,
README's eleventh session). The addresses are fixed once the graphs are
captured, but what backs them need not be: a granule of the range is in
use only while a block over it is alive, and two granules whose uses never
overlap can sit on the same physical page (vmmrt_slot_map_pages_table(3)).

When a block is alive is what PyTorch's memory history recorded during the
captures (torch.cuda.memory._snapshot()'s device traces; vmmrt.torch.graphpool
turns it on): an ``alloc`` event is its birth, its ``free_completed`` its
death (when the allocator may hand its bytes out again, after the streams
that used it have passed). That is the caching allocator's own rule for
giving the same address twice, and the captured graphs replay in the order
of their captures, so the same rule holds for the same page under two
addresses. A block not freed when the history ends (a graph's static output
or input gradient, handed out and perhaps held across steps) is in use for
good: its granules keep pages of their own, as its addresses are its own in
PyTorch's pool. One freed without its birth recorded is alive from the
latest death of a block over its bytes before it (its bytes were taken
until then), in use for good where no such death is in the history.

Time is the event order; two half-open lives [b1, d1) and [b2, d2) overlap
exactly when one contains the other's birth, so a granule's use is a bit set
over the births (:func:`masks`), and two granules can share a page when
their sets are disjoint. Placing them is colouring a graph of such sets;
first fit in two orders (by first birth, the optimum when each granule has
one life; by how long it is in use) and the smaller wins (:func:`place`).
"""
from __future__ import annotations

import bisect
from typing import Iterable, Sequence

FOREVER = None      # a life's end: not freed when the history ended


def block_history(events: Sequence[dict], lo: int,
                  hi: int) -> list[tuple[int, int, int, int | None, int | None, int | None]]:
    """(address, bytes, birth, requested, death, again) of every block in
    [lo, hi) that the events (a memory history's device trace, in order)
    saw, each an event index: its ``alloc`` (-1: not in the history), its
    ``free_requested`` (None: none seen), its ``free_completed``
    (:data:`FOREVER`: none matched by the end), and ``again``, the
    ``alloc`` that gave its address out while the history had it allocated
    or its free pending (None: no such; the block is then in use for good:
    the history is not to be trusted there).

    A block's ``free_requested`` names its address; its ``free_completed``
    comes right after it when no other stream used the block, later
    otherwise, and names the address of the free block it was merged into
    (the one before it, when that was free): the completion is matched to
    the request it follows, else to the one request pending at its address,
    else to the one pending of its size at or above it; one it cannot tell
    apart leaves the block in use for good."""
    open_ = {}          # address -> (birth, bytes): allocated
    pending = {}        # address -> (birth, bytes, requested): free requested, not completed
    out = []
    prev = None         # the address of the event just before, when it was a free_requested in range
    for k, e in enumerate(events):
        act = e.get("action")
        a = e.get("addr", 0)
        requested, prev = prev, None
        if act == "free_completed":
            x = requested if requested in pending else a if a in pending else None
            if x is None:
                size = e.get("size", 0)
                cand = [p for p, (_, n, _) in pending.items() if n == size and p >= a]
                x = cand[0] if len(cand) == 1 else None
            if x is not None:
                b, n, r = pending.pop(x)
                out.append((x, n, b, r, k, None))
            continue
        if not lo <= a < hi:
            continue
        if act == "alloc":
            old = open_.pop(a, None)
            if old is not None:
                out.append((a, old[1], old[0], None, FOREVER, k))
            old = pending.pop(a, None)
            if old is not None:
                out.append((a, old[1], old[0], old[2], FOREVER, k))
            open_[a] = (k, e.get("size", 0))
        elif act == "free_requested":
            b = open_.pop(a, None)
            pending[a] = (b[0], b[1], k) if b is not None else (-1, e.get("size", 0), k)
            prev = a
    out.extend((a, n, b, None, FOREVER, None) for a, (b, n) in open_.items())
    out.extend((a, n, b, r, FOREVER, None) for a, (b, n, r) in pending.items())
    return [h for h in out if h[1] > 0]


def block_lives(events: Sequence[dict], lo: int, hi: int) -> list[tuple[int, int, int, int | None]]:
    """(address, bytes, birth, death) of every block in [lo, hi) that the
    events (a memory history's device trace, in order) saw
    (:func:`block_history`); birth and death are event indices, death
    :data:`FOREVER` when it was not freed by the end. A block freed whose
    birth the history missed is born at the latest death before its free
    of a block over any of its bytes (:func:`unseen_birth`); with none,
    and where its address was given out again unfreed, birth -1 and in use
    for good."""
    hist = block_history(events, lo, hi)
    deaths = [(d, a, a + n) for a, n, _, _, d, again in hist if d is not FOREVER and again is None]
    out = []
    for a, n, b, r, d, again in hist:
        if again is not None:
            out.append((a, n, -1, FOREVER))
            continue
        if b < 0 and d is not FOREVER:
            b = unseen_birth(deaths, a, n, r)
        out.append((a, n, b, FOREVER if b < 0 else d))
    return out


def unseen_birth(deaths: Sequence[tuple[int, int, int]], addr: int, nbytes: int, requested: int) -> int:
    """The earliest a block at [addr, addr + nbytes) whose free was requested
    at event ``requested`` can have been born, its alloc not in the history
    (one that began after the block's birth, or lost events: until the
    thirty-fifth session the graphs' pool dropped the allocs of 40 blocks of
    a Llama layer's history, at the address of its plug): after the
    death of every block over any of its bytes that died before that free
    (``deaths``: (death, start, end)), as two blocks alive at once never
    share an address; -1 when none did (from the history's start)."""
    return max((d for d, s, e in deaths if d < requested and s < addr + nbytes and addr < e), default=-1)


def masks(blocks: Sequence[tuple[int, int, int, int | None]], lo: int, nbytes: int,
          granularity: int) -> list[int]:
    """Per granule of [lo, lo + nbytes): the births (bit i: the i-th birth of
    ``blocks``, in order) at which a block over it is alive; all bits for a
    granule under a block in use for good, 0 for one no block touched."""
    g = granularity
    n = -(-nbytes // g)
    births = sorted({b for _, _, b, d in blocks if b >= 0 and d is not FOREVER})
    everything = (1 << (len(births) + 1)) - 1      # one bit more: a set apart from every finite one
    out = [0] * n
    for a, size, b, d in blocks:
        if b < 0 or d is FOREVER:
            m = everything
        else:
            i = bisect.bisect_left(births, b)
            j = bisect.bisect_left(births, d)
            m = ((1 << j) - 1) ^ ((1 << i) - 1)
        g0 = max(0, (a - lo) // g)
        g1 = min(n - 1, (a + size - 1 - lo) // g)
        for k in range(g0, g1 + 1):
            out[k] |= m
    return out


def _runs(ms: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first granule, count, mask) of each run of equal masks."""
    out = []
    for k, m in enumerate(ms):
        if out and out[-1][2] == m and out[-1][0] + out[-1][1] == k:
            out[-1] = (out[-1][0], out[-1][1] + 1, m)
        else:
            out.append((k, 1, m))
    return out


def _first_fit(runs: Sequence[tuple[int, int, int]], n: int) -> tuple[list[int], int]:
    """Each run's granules on the first pages whose uses so far are disjoint
    from its own (pages with the same uses kept together, in the order they
    were opened, so that a run lands on consecutive pages where it can);
    granules in use never all on the first page. Returns (page of each
    granule, pages used)."""
    table = [0] * n
    groups = []         # [uses, [pages]]: pages whose granules so far are in use at uses
    npages = 0
    for first, count, m in runs:
        if not m:
            continue
        got = []
        k = 0
        while len(got) < count and k < len(groups):
            uses, pages = groups[k]
            if not uses & m:
                take = pages[:count - len(got)]
                got.extend(take)
                rest = pages[len(take):]
                if rest:
                    groups[k] = [uses, rest]
                    groups.insert(k + 1, [uses | m, take])
                    k += 1
                else:
                    groups[k] = [uses | m, take]
            k += 1
        if len(got) < count:
            new = list(range(npages, npages + count - len(got)))
            npages += len(new)
            got.extend(new)
            groups.append([m, new])
        for i, p in enumerate(got):
            table[first + i] = p
    return table, max(npages, 1)


def place(ms: Sequence[int]) -> tuple[list[int], int]:
    """Pages for granules in use at ``ms`` (:func:`masks`): (page of each
    granule, pages used), no two granules whose uses meet on one page. A
    range no block touched gets one page (its granules map it, unused)."""
    runs = _runs(ms)
    if not runs:
        return [], 0
    best = None
    for key in (lambda r: (_lowest(r[2]), r[0]), lambda r: (-bin(r[2]).count("1"), r[0])):
        table, npages = _first_fit(sorted(runs, key=key), len(ms))
        if best is None or npages < best[1]:
            best = (table, npages)
    return best


def _lowest(m: int) -> int:
    """The first birth at which a mask's granule is in use (none: after every one)."""
    return (m & -m).bit_length() if m else 1 << 62


def check(ms: Sequence[int], table: Sequence[int]) -> None:
    """ValueError unless no two granules of one page are in use at once."""
    on = {}
    for k, (m, p) in enumerate(zip(ms, table)):
        if on.get(p, 0) & m:
            raise ValueError("granule %d shares page %d with a granule in use at the same time" % (k, p))
        on[p] = on.get(p, 0) | m


def live_peak(blocks: Sequence[tuple[int, int, int, int | None]]) -> int:
    """The most bytes of ``blocks`` alive at once (one in use for good: from
    its birth on)."""
    return peak_moment(blocks)[0]


def peak_moment(blocks: Sequence[tuple[int, int, int, int | None]]) -> tuple[int, int | None]:
    """(the most bytes of ``blocks`` alive at once, the event it is first
    reached at; None where nothing is ever alive). Each event is one birth
    or one death, so none shares a moment with another."""
    ev = []
    for _, n, b, d in blocks:
        ev.append((max(b, 0), n))
        if d is not FOREVER and b >= 0:
            ev.append((d, -n))
    ev.sort()
    cur = top = 0
    at = None
    for t, dn in ev:
        cur += dn
        if cur > top:
            top, at = cur, t
    return top, at


def never_freed(blocks: Sequence[tuple[int, int, int, int | None]]) -> int:
    """The bytes of ``blocks`` in use for good (:func:`block_lives` ends
    them at FOREVER: not freed when the history ended, or freed with their
    birth unseen and unbounded): what a pool's captures leave
    held beside the working set of any one of them. Where the live peak is
    far above a layer's working set, this tells held blocks piling up over
    the captures from a capture that needs that much."""
    return sum(n for _, n, _, d in blocks if d is FOREVER)


def plan(events: Iterable[dict], lo: int, nbytes: int, granularity: int) -> tuple[list[int], int, int]:
    """(page of each granule of [lo, lo + nbytes), pages used, the blocks'
    live peak in bytes) from a memory history's events."""
    blocks = block_lives(events, lo, lo + nbytes)
    ms = masks(blocks, lo, nbytes, granularity)
    table, npages = place(ms)
    check(ms, table)
    return table, npages, live_peak(blocks)


# ------------------------------------------------------------ over the step
# The pool's granules on the step's timeline (vmmrt.torch.memplan): a
# granule is in use at the positions of the step (its order of uses) from
# the capture a block over it was born in to the one it died in. Granules
# in use at the same positions form a part, which the memory plan places as
# one slot among the layers' own (a backward's temporaries on the pages of
# a resident already read, as eager PyTorch reuses its freed blocks);
# inside a part, granules share pages by their blocks' lives (:func:`place`).
# That pays only where a granule's blocks come from few captures: one pool
# per use (vmmrt.torch.graphpool) gives each capture addresses of its own.

WHOLE = None        # a part's interval: in use at every position of the step but its end


class Part:
    """Granules of the pool in use at positions [start, end] of the step
    (``start`` None: at all of them but the step's end), and their pages:
    granule ``granules[i]`` on the part's page ``table[i]``, ``npages``
    pages in all."""
    __slots__ = ("start", "end", "granules", "table", "npages")

    def __init__(self, start, end, granules, table, npages):
        self.start, self.end, self.granules, self.table, self.npages = start, end, granules, table, npages

    def __repr__(self):
        return "Part([%s, %s], %d granules on %d pages)" % (self.start, self.end, len(self.granules), self.npages)


def position_of(marks: Sequence[tuple[int, int, int]]):
    """From ``marks`` ((position, first event, end event) of each capture,
    in the order they were captured): a function giving an event index's
    position and whether it fell in a capture (between two, it is the
    previous capture's; before the first, None)."""
    starts = [m[1] for m in marks]

    def at(k: int):
        i = bisect.bisect_right(starts, k) - 1
        if i < 0:
            return None, False
        pos, s, e = marks[i]
        return pos, s <= k < e
    return at


def granule_spans(blocks: Sequence[tuple[int, int, int, int | None]], marks: Sequence[tuple[int, int, int]],
                  lo: int, nbytes: int, granularity: int) -> list:
    """Per granule of [lo, lo + nbytes): (first, last) positions at which a
    block over it is alive, :data:`WHOLE` for one under a block in use for
    good, born outside the captures or dying at a position before its
    birth's (captures out of the step's order), None for one no block
    touched. A block freed after the last capture is alive to the
    step's last captured position: who reads it there is not known."""
    g = granularity
    n = -(-nbytes // g)
    at = position_of(marks)
    after = marks[-1][2] if marks else 0
    last = max((m[0] for m in marks), default=None)
    out = [None] * n
    for a, size, b, d in blocks:
        span = WHOLE
        if b >= 0 and d is not FOREVER:
            pb, inside = at(b)
            pd = at(d)[0] if d < after else last
            if inside and pd is not None and pd >= pb:
                span = (pb, pd)
        g0 = max(0, (a - lo) // g)
        g1 = min(n - 1, (a + size - 1 - lo) // g)
        for k in range(g0, g1 + 1):
            old = out[k]
            if old is None:
                out[k] = span
            elif old is WHOLE or span is WHOLE:
                out[k] = WHOLE
            else:
                out[k] = (min(old[0], span[0]), max(old[1], span[1]))
        # (a granule's span is the hull of its blocks': its bytes are
        # taken from the first birth to the last death among them)
    return out


def parts(events: Iterable[dict], marks: Sequence[tuple[int, int, int]], lo: int, nbytes: int,
          granularity: int) -> tuple[list[Part], list[int], int, int]:
    """(the pool's parts, :class:`Part`; the page of each granule on pages of
    its own, by its blocks' lives over the whole history: the pool's
    memory before the memory plan; pages used; the blocks' live peak) from
    a memory history's events and the captures' ``marks``. Granules no
    block touched are in no part."""
    events = list(events)
    blocks = block_lives(events, lo, lo + nbytes)
    ms = masks(blocks, lo, nbytes, granularity)
    spans = granule_spans(blocks, marks, lo, nbytes, granularity)
    by = {}
    for k, (m, s) in enumerate(zip(ms, spans)):
        if m:
            by.setdefault(s if s is WHOLE else tuple(s), []).append(k)
    out = []
    for span, ks in sorted(by.items(), key=lambda kv: (-1, -1) if kv[0] is WHOLE else kv[0]):
        table, npages = place([ms[k] for k in ks])
        check([ms[k] for k in ks], table)
        out.append(Part(None if span is WHOLE else span[0], None if span is WHOLE else span[1], ks, table, npages))
    own, nown = place(ms)
    check(ms, own)
    return out, own, nown, live_peak(blocks)


def compose(parts_: Sequence[Part], offsets: Sequence[int], ngranules: int, granularity: int) -> list[int]:
    """The page offset of each of ``ngranules`` granules when part i's pages
    begin at ``offsets[i]``: a granule in no part (no block touched it)
    on the first part's first page (its addresses are never read or
    written: they only need to be mapped)."""
    g = granularity
    first = offsets[0] if offsets else 0
    out = [first] * ngranules
    for p, at in zip(parts_, offsets):
        for k, page in zip(p.granules, p.table):
            out[k] = at + page * g
    return out


def table_ranges(table: Sequence[int], granularity: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The bytes [lo, hi) of a slot mapped granule by granule (``table``: the
    pages' offset of each of its granules, vmmrt_slot_map_pages_table(3)) as
    offsets in the pages, one range per granule."""
    g = granularity
    out = []
    k = lo // g
    while k * g < hi:
        a, b = max(lo, k * g) - k * g, min(hi, (k + 1) * g) - k * g
        out.append((table[k] + a, table[k] + b))
        k += 1
    return out
