# SPDX-License-Identifier: LGPL-2.1-or-later
"""How much of a layer's parameter gradients could lie on the physical
pages of its resident bytes that the layer's backward has already read.

Eager PyTorch frees each saved activation once the backward node that
read it has run, and the weight gradients made later in that backward take
those blocks. The memory plan (vmmrt.torch.memplan) gives the gradient
slot pages of its own beside the whole resident slot at the layer's
backward, the step's busiest use in the ``set_to_none`` loop: on 8
Llama-3-8B layers (seq 4096, H100) the pages held 7644 MiB there against
the 7246 eager's allocator held beyond mode none's (doc/pytorch.md).

VMM lets a gradient slot's granule be backed by the physical page of a
resident granule whose bytes nothing reads or writes after some op of the
backward, if the gradient bytes in that granule are first written after
it: the gradient keeps its own address, so nothing captured changes. This
module is the arithmetic, from the layer's reuse timeline
(vmmrt.torch.reuse): per resident granule, the op after which it is free
for the rest of the backward (its saved regions read for the last time,
the temporaries placed there dead); per gradient granule, the op that
first writes it; and the most gradient granules that can each take a
different free resident granule. The memory plan maps them so in the
``set_to_none`` loop (vmmrt.torch.memplan.share_grads: the gradient slot's
matched granules on the pages of the resident granules they took); the
library reports the arithmetic too (Offload.stats()["grad_share_bytes"],
describe(), the benchmark's busiest use line).
"""
from vmmrt.torch import reuse
from vmmrt.torch.reuse import NEVER


def free_after(resident_bytes, regions, temps, granule):
    """Per granule of a resident slot of ``resident_bytes``: the index of the
    op after which nothing reads or writes it again in the backward (-1:
    from its start; NEVER: not within it). ``regions``: [(start, end,
    last_use)] the saved regions (last_use NEVER for a static input);
    ``temps``: [(start, end, born, died)] the temporaries placed there
    (died None: alive at the backward's end)."""
    n = -(-resident_bytes // granule)
    out = [-1] * n
    for s, e, lu in regions:
        for j in range(s // granule, min(n, -(-e // granule))):
            out[j] = max(out[j], lu)
    for s, e, _, died in temps:
        for j in range(s // granule, min(n, -(-e // granule))):
            out[j] = max(out[j], NEVER if died is None else died)
    return out


def first_writes(grad_bytes, grads, granule):
    """Per granule of a gradient slot of ``grad_bytes``: the index of the op
    that first writes a gradient over it (None: no gradient there; -1: one
    whose birth is unknown, which nothing may share). ``grads``: [(start,
    end, born)]."""
    n = -(-grad_bytes // granule)
    out = [None] * n
    for s, e, born in grads:
        b = -1 if born is None else born
        for k in range(s // granule, min(n, -(-e // granule))):
            out[k] = b if out[k] is None else min(out[k], b)
    return out


def match(free, writes):
    """{gradient granule: resident granule}: the most gradient granules
    each on a different resident granule free before its first write
    (free[j] < writes[k]). Taking them by first write, each gets any
    granule free by then: every later one would take it too, so no choice
    loses one."""
    res = sorted((f, j) for j, f in enumerate(free) if f < NEVER)
    grads = sorted((w, k) for k, w in enumerate(writes) if w is not None and w >= 0)
    out, avail, p = {}, [], 0
    for w, k in grads:
        while p < len(res) and res[p][0] < w:
            avail.append(res[p][1])
            p += 1
        if avail:
            out[k] = avail.pop()
    return out


def regions_of(lay, timeline):
    """[(start, end, last_use)] of ``lay``'s resident slot for sharing: the
    reuse plan's (reuse.resident_regions), and every kept region in the
    slot whose birth the timeline does not know, for good (NEVER): bytes
    nothing tells when the backward is done with are never given away."""
    regions = reuse.resident_regions(lay, timeline)
    for r in lay.kept_resident():
        if r.resident is not None and r.birth is None and r.nbytes:
            regions.append((r.resident, r.resident + r.nbytes, NEVER))
    return regions


def layer_pairs(lay, granule, temporaries=True):
    """{gradient granule: resident granule} for ``lay``'s parameter gradients
    (grads="mapped") on its resident bytes already read, from its discovery
    backward's timeline and its reuse plan; empty where it has none of
    those. ``granule``: the pages' (the runtime's granularity);
    ``temporaries``: False counts the bytes the reuse plan gave the
    backward's temporaries as free too (what placing the gradients first
    could reach: a bound, never mapped)."""
    g = getattr(lay, "grads", None)
    if lay.timeline is None or lay.resident is None or g is None or not getattr(g, "mapped", False) or \
            lay.recompute or not getattr(lay, "backward_once", True):
        return {}
    timeline, _ = lay.timeline
    temps = []
    for b, off, born in (lay.reuse.items if lay.reuse and temporaries else ()):
        temps.append((off, off + b.storage_nbytes, born, timeline.died.get((b.key, b.out))))
    grads = []
    for b, off in g.regions:
        born = timeline.born.get((b.key, b.out))
        grads.append((off, off + b.storage_nbytes, None if born is None else born[0]))
    return match(free_after(lay.resident.nbytes, regions_of(lay, timeline), temps, granule),
                 first_writes(g.backing.nbytes, grads, granule))


def layer_share(lay, granule, temporaries=True):
    """The bytes of :func:`layer_pairs`: ``lay``'s parameter gradients that
    could lie on its resident bytes already read."""
    return len(layer_pairs(lay, granule, temporaries)) * granule
