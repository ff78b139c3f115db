# SPDX-License-Identifier: LGPL-2.1-or-later
"""A layer's backward transients born in the bytes of its resident slot
whose saved regions that backward has already read for the last time.

Eager PyTorch frees a saved activation once the backward node that read it
has run, and the backward's next temporaries (the gradients flowing
through the layer) take those blocks. A graph's saved regions sit in the
layer's resident slot until its backward ends, so every temporary of the
backward took memory of its own in the graph pool: on a Llama-3-8B layer
(seq 4096, H200) the backward's temporaries peak at 416 MiB, against 224
beyond the saved bytes in eager, and that pool is held beside every
layer's activations at the first backward, the step's peak.

Discovery's backward (the warm-up, under a place.Mode) records the
timeline (:class:`Timeline`): each op's index, the output storages it
allocates and the index after which each was found freed, and the last
op that read each saved storage. From it :func:`plan` lays the
temporaries that die within the backward over slot bytes that are free
for their whole life (first fit, in birth order); :func:`targets` makes
them place.Placed for the backward's capture, each only at the op index
discovery saw it at and only through the op's ``out=`` overload (a copy
would save nothing).

A capture that ran other ops than discovery could read a region after a
temporary overwrote it. :class:`Guard` watches every op of the capture:
an argument over bytes that a later temporary took, and is not that
temporary or a view of it, is a violation, and the capture is made again
without reuse (graphed.py). Op indices count the ops that allocate or
read only: in-place ops (AccumulateGrad's adds when ``.grad`` exists) do
not shift them, so the accumulate graph takes the write graph's plan.
"""
import weakref

import torch

from vmmrt.torch import _compat, place
from vmmrt.torch.saved import REGION_ALIGN

try:
    from torch.multiprocessing.reductions import StorageWeakRef
except ImportError:  # pragma: no cover - very old torch
    StorageWeakRef = None

AVAILABLE = place.AVAILABLE and StorageWeakRef is not None and hasattr(torch.Tensor, "untyped_storage")
ENABLED = True          # (the benchmark's A/B and the tests turn it off)
MIN_BYTES = 1 << 20     # smaller temporaries are not worth a placement
NEVER = 1 << 62         # a last use that never ends (the static inputs)


def timeline_for(forward_mode):
    """A Timeline for the backward of the pass whose forward ``forward_mode``
    recorded (a place.Mode: its births, by storage, are the saved storages
    to watch), or None."""
    if not (AVAILABLE and ENABLED) or forward_mode is None:
        return None
    return Timeline({ptr: (b.key, b.out) for ptr, b in forward_mode.births.items()}, forward_mode.device_type)


class Timeline:
    """One backward's ops as a place.Mode sees them (its ``observer``):
    ``born`` and ``died``, per (op key, output), the index of the op that
    allocated the storage and of the op after which it was found freed
    (none: alive at the end, a gradient handed out), with its bytes and
    whether the op can write it at a given address (``out=``); and
    ``last_use``, per saved storage of ``watch`` (storage pointer -> key),
    the index of the last op that read it. ``device_type``: whose kernels
    must write an out= tensor for it to count as placeable
    (place.writes_at_target)."""

    def __init__(self, watch, device_type="cuda"):
        self.watch = dict(watch)
        self.device_type = device_type
        self.last_use = {}
        self.born = {}
        self.died = {}
        self.ops = 0
        self._live = {}
        self._owner = {}

    def before(self, i, tensors):
        for t in tensors:
            ptr = _compat.storage_of(t)[0]
            if ptr in self._owner:
                continue
            k = self.watch.get(ptr)
            if k is not None:
                self.last_use[k] = i

    def after(self, i, key, func, fresh):
        # The dead first: the allocator gives a block freed since the last op
        # (an input the engine let go) to this op's output of its size, and
        # an owner still listed at that address would hide the birth.
        for bk, ref in list(self._live.items()):
            if ref.expired():
                self.died[bk] = i
                del self._live[bk]
        if len(self._owner) > len(self._live):
            alive = set(self._live)
            self._owner = {p: bk for p, bk in self._owner.items() if bk in alive}
        for k, t in fresh:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if not ptr or ptr in self._owner:
                continue
            bk = (key, k)
            self.born[bk] = (i, st.nbytes(), place.placeable(func) and
                             place.writes_at_target(func, self.device_type))
            self._live[bk] = StorageWeakRef(st)
            self._owner[ptr] = bk
        self.ops = i + 1

    def transients(self, min_bytes=None):
        """[(key, bytes, born, died)] of the storages that die within the
        backward and can be placed (``min_bytes`` or more: MIN_BYTES), in
        birth order."""
        min_bytes = MIN_BYTES if min_bytes is None else min_bytes
        out = [(bk, n, b, self.died[bk]) for bk, (b, n, ok) in self.born.items()
               if ok and n >= min_bytes and bk in self.died]
        return sorted(out, key=lambda t: (t[2], t[3]))


def _up(n, a=REGION_ALIGN):
    return -(-n // a) * a


def plan(slot_bytes, regions, transients, align=REGION_ALIGN):
    """Where each temporary goes in a slot of ``slot_bytes``: ``regions``,
    [(start, end, last_use)] the bytes that saved regions (or static
    inputs: last use NEVER) hold until the op of index last_use has run
    (bytes of no region are free at every op); ``transients``, [(key,
    bytes, born, died)], lives as closed intervals of op indices. First
    fit, in birth order: a temporary goes at the lowest offset where every
    region it covers was last read before its birth and no temporary
    placed there lives at the same time. Returns {key: offset}; those that
    fit nowhere are left out (they stay in the pool)."""
    regions = sorted(regions)
    placed = []                 # (start, end, born, died)
    out = {}
    for key, n, born, died in transients:
        size = _up(n, align)
        cands = sorted({0} | {_up(e, align) for _, e, _ in regions} | {_up(e, align) for _, e, _, _ in placed})
        for a in cands:
            e = a + size
            if e > slot_bytes:
                break
            if any(s < e and a < re and lu >= born for s, re, lu in regions):
                continue
            if any(s < e and a < pe and not (pd < born or pb > died) for s, pe, pb, pd in placed):
                continue
            placed.append((a, e, born, died))
            out[key] = a
            break
    return out


class Planned:
    """A layer's reuse plan: per temporary (its discovery Birth), its offset
    in the resident slot and the op index it is born at."""

    def __init__(self, items, nbytes, peak=0):
        self.items = items          # [(birth, offset, index)]
        self.nbytes = nbytes        # the temporaries' bytes placed (each counted once)
        self.peak = peak            # the most of them alive at one op: what the pool no longer holds for them
        self.placed_bytes = 0       # of them, born in the slot at the last capture
        self.fallback = None        # why a capture was made again without it

    def __len__(self):
        return len(self.items)


def resident_regions(lay, timeline):
    """[(start, end, last_use)] of ``lay``'s resident slot: each kept saved
    region until the op of its backward that reads it last (-1: a region
    the backward reads from the pool), and its static inputs for good
    (NEVER)."""
    regions = []
    for r in lay.kept_resident():
        if r.birth is None or r.resident is None:
            continue
        lu = -1 if r.how == "pool" else timeline.last_use.get((r.birth.key, r.birth.out), -1)
        regions.append((r.resident, r.resident + r.nbytes, lu))
    for at, n in zip(lay.input_at or (), lay.input_bytes or ()):
        if at is not None and n:
            regions.append((at, at + n, NEVER))
    return regions


def layer_plan(lay, timeline, births):
    """The plan for ``lay`` (a LayerOffload with a resident slot) from its
    discovery backward's ``timeline`` and that pass's births by (op key,
    output), or None when nothing fits."""
    if not (AVAILABLE and ENABLED) or timeline is None or lay.resident is None or lay.recompute:
        return None
    regions = resident_regions(lay, timeline)
    trans = [t for t in timeline.transients() if t[0] in births]
    where = plan(lay.resident.nbytes, regions, trans)
    if not where:
        return None
    items = [(births[k], off, timeline.born[k][0]) for k, off in where.items()]
    lives = [(b, d, n) for k, n, b, d in trans if k in where]
    peak = max(sum(n for b, d, n in lives if b <= i <= d) for i in {b for b, _, _ in lives})
    return Planned(items, sum(births[k].storage_nbytes for k in where), peak)


def targets(planned, base):
    """The place.Placed of a plan over ``base`` (a tensor over the resident
    slot): fresh for each capture (a Placed is spent once placed)."""
    out = []
    for b, off, at in planned.items:
        p = place.Placed(b, _compat.tensor_over(base, b.dtype, b.shape, b.stride, off + b.offset))
        p.at = at
        p.copy = False
        out.append(p)
    return out


class Overwritten(Exception):
    """Raised by a Guard before an op that would read overwritten bytes: the
    capture stops there (nothing of it is replayed) and is made again
    without the plan. (On the device the op would only have been recorded;
    on the host backend, whose captures run, it would have run on them.)"""


class Guard:
    """A capture's check of a reuse plan (a place.Mode ``observer``): every
    temporary born in the slot [lo, hi) takes its bytes from then on; an
    op argument over bytes that a temporary took, and that is not that
    temporary (or a view of it, matmul's _unsafe_view included), reads what
    was overwritten: Overwritten."""

    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi
        self.violation = None
        self.placed = []        # (start, end, weak reference to the temporary, its token)
        self._token = 0
        # id(alias) -> (weak reference to it, its temporary's token): the
        # views of a temporary that have no ``_base`` to say so (matmul's
        # _unsafe_view of its mm's output, whose own Python object is gone
        # by then: megatron-core's backward reads one, and every layer's
        # plan was dropped for it, H100) and views of those
        self.aliases = {}

    def _token_of(self, t):
        """The token of the placed temporary ``t`` is, is a view of, or
        aliases; None for any other tensor."""
        for _, _, ref, tok in self.placed:
            o = ref()
            if o is not None and (t is o or t._base is o):
                return tok
        for u in (t, t._base):
            if u is not None:
                got = self.aliases.get(id(u))
                if got is not None and got[0]() is u:
                    return got[1]
        return None

    def aliased(self, inputs, out):
        """An op whose outputs alias its arguments: those of a temporary's
        become its aliases."""
        if not self.placed:
            return
        for t in inputs:
            tok = self._token_of(t)
            if tok is not None:
                break
        else:
            return
        for u in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(u, torch.Tensor):
                self.aliases[id(u)] = (weakref.ref(u), tok)

    def before(self, i, tensors):
        if self.violation is not None or not self.placed:
            return
        for t in tensors:
            if not t.numel() or t.layout != torch.strided:
                continue
            a = t.data_ptr()
            if not self.lo <= a < self.hi:
                continue
            e = a + _compat.span_elements(t.shape, t.stride()) * t.element_size()
            mine = None
            for s, pe, ref, tok in self.placed:
                if s < e and a < pe:
                    if mine is None:
                        mine = self._token_of(t)
                    if mine != tok:
                        self.violation = ("op %d reads 0x%x..0x%x, bytes a temporary of the backward took at "
                                          "0x%x" % (i, a, e, s))
                        raise Overwritten(self.violation)

    def after(self, i, key, func, fresh):
        for _, t in fresh:
            a = t.data_ptr()
            if not self.lo <= a < self.hi:
                continue
            e = a + _compat.span_elements(t.shape, t.stride()) * t.element_size()
            self.placed = [p for p in self.placed if p[1] <= a or e <= p[0]]
            self._token += 1
            self.placed.append((a, e, weakref.ref(t), self._token))
