# SPDX-License-Identifier: LGPL-2.1-or-later
"""The automatic choice of what to offload: as much as the copies can hide.

A layer's activations leave the device while the next layer's forward runs
(its D2H), and come back while the next layer's backward runs (its H2D, one
look-ahead ahead): the copy of layer i hides when

    bytes_i <= margin * min(d2h_bandwidth * fwd_ms[i+1], h2d_bandwidth * bwd_ms[i+1]).

This is vmmrt-bench's offload budget (min(1, fwd_ms / copy_ms)) applied per
layer. The last layer in forward order is the *tail*: its backward comes
first, so libvmmrt keeps its activations on the device and copies nothing;
in ping-pong it also keeps the layer before it in its bank (no other layer
takes that bank in between). Their copies cannot hide, so they move nothing
of their own; but where other layers move (ping-pong's two banks then take
the largest group), each of the two fills its bank up to that size, with no
copy: bytes the banks hold anyway instead of a resident slot's (``banked``).
Moved beyond it they would grow both banks.

A layer's copies also cost a fixed time per step whatever their size (two
copies enqueued, their events and fences, the host's part of the hooks):
on the H200 the launch-bound layers (16 of hidden 1024, seq 1024, 0.6 ms a
layer-step) ran 7.3-8.7 us slower per offloaded layer per step than with
nothing moved (`offload="auto"` against mode none, 2026-12-04, both loops),
1.2-1.5 % of the layer's time. ``auto`` is to stay within 1 % of graphs'
time, so a layer whose fixed cost (``COPY_FIXED_MS``) is over
``MAX_SHARE`` of its own forward and backward moves nothing. A copy that
hides still costs the compute beside it: they share the device's memory
bandwidth (on the H100, auto ran 0.7-4.6 % of its copies' time slower than
mode none where they hid; vmmrt.torch.replay_times measures it per layer,
``Offload.copy_contention``), so a layer moves at most what keeps that and
its fixed cost within the same share.
What hides is then weighed by what it saves (:func:`lightest`): the banks
hold the moved bytes again, and a step's peak may come where they are gone
anyway (the last backward of the set_to_none loop, every gradient mapped),
so the plan is also tried with each layer moving less, down to nothing, and
the one the memory model (vmmrt.torch.budget, :func:`peak_model`) predicts
lowest in both loops is kept.
:func:`plan` and :func:`lightest` are arithmetic only; :func:`measure_bandwidth`
and the layer timings feed them.
"""
import logging

import torch

import vmmrt
from vmmrt import _capi
from vmmrt.torch import select

log = logging.getLogger("vmmrt.torch")

COPY_FIXED_MS = 0.008     # an offloaded layer's copies, per step, whatever their size (H200: 7.3-8.7 us)
MAX_SHARE = 0.01          # of the layer's own step time, at most, for that cost


class LayerPlan:
    __slots__ = ("name", "fwd_ms", "bwd_ms", "sizes", "budget", "chosen", "tail", "why")

    def __init__(self, name, fwd_ms, bwd_ms, sizes, budget, chosen, tail, why=None):
        self.name, self.fwd_ms, self.bwd_ms, self.sizes = name, fwd_ms, bwd_ms, sizes
        self.budget, self.chosen, self.tail = budget, chosen, tail
        self.why = why          # why it moves less than would hide (or nothing), if so

    @property
    def total(self):
        return sum(self.sizes)

    @property
    def moved(self):
        return sum(self.sizes[i] for i in self.chosen)

    def as_dict(self):
        return {"name": self.name, "fwd_ms": self.fwd_ms, "bwd_ms": self.bwd_ms, "saved_bytes": self.total,
                "budget_bytes": self.budget,
                "offloaded_bytes": self.moved, "regions": len(self.sizes), "offloaded_regions": len(self.chosen),
                "tail": self.tail, "why": self.why}


class Plan:
    """Per layer: its budget and the regions chosen; ``summary()`` says it in words."""

    def __init__(self, layers, d2h_gbps, h2d_gbps, margin, contention=(0.0, 0.0)):
        self.layers, self.d2h_gbps, self.h2d_gbps, self.margin = layers, d2h_gbps, h2d_gbps, margin
        self.contention = contention
        # lightest(): (bytes moved, predicted peak) of each plan weighed, and
        # the chosen one's peak: over the static bytes, not a whole-step peak
        self.weighed, self.weighed_peak, self.weighed_labels = None, None, None

    @property
    def fraction(self):
        total = sum(p.total for p in self.layers)
        return sum(p.moved for p in self.layers) / total if total else 0.0

    def summary(self):
        mib = 1 << 20
        lines = ["offload plan at D2H %.1f GB/s, H2D %.1f GB/s, margin %.2f%s: %.1f%% of %.0f MiB saved bytes"
                 % (self.d2h_gbps, self.h2d_gbps, self.margin,
                    ", the compute %.1f %% / %.1f %% slower while they copy" % (
                        100 * self.contention[0], 100 * self.contention[1]) if any(self.contention) else "",
                    100 * self.fraction, sum(p.total for p in self.layers) / mib)]
        for p in self.layers:
            lines.append("  %-24s fwd %7.2f ms  saved %8.1f MiB  budget %9s  moves %8.1f MiB (%d of %d regions)%s"
                         % (p.name, p.fwd_ms, p.total / mib,
                            "tail" if p.tail and not p.budget else "%.1f MiB" % (p.budget / mib), p.moved / mib,
                            len(p.chosen), len(p.sizes), " [%s]" % p.why if p.why else
                            " [tail: stays, no copy]" if p.tail else ""))
        if self.weighed:
            lines.append("  weighed by the peaks it predicts over the static bytes%s: %s" % (
                " (%s)" % " / ".join(self.weighed_labels) if self.weighed_labels else "",
                ", ".join("%s%.1f MiB moved -> %s MiB" % ("*" if m == self._moved() else "", m / mib,
                                                          " / ".join("%.1f" % (x / mib) for x in pk))
                          for m, pk in self.weighed)))
        return "\n".join(lines)

    def _moved(self):
        return sum(p.moved for p in self.layers)

    def predicted_saving(self):
        """{loop: bytes} the chosen plan's predicted peak minus moving
        nothing's, per loop it was weighed in (negative: lower), what a
        measured peak against mode none's checks; None where it was not
        weighed."""
        if not self.weighed or self.weighed_peak is None:
            return None
        labels = self.weighed_labels or tuple("loop %d" % k for k in range(len(self.weighed_peak)))
        nothing = self.weighed[0][1]
        return {lab: int(a - b) for lab, a, b in zip(labels, self.weighed_peak, nothing)}

    def as_dict(self):
        return {"d2h_gbps": self.d2h_gbps, "h2d_gbps": self.h2d_gbps, "margin": self.margin,
                "contention": list(self.contention), "fraction": self.fraction,
                "weighed": self.weighed, "weighed_peak_bytes": self.weighed_peak,
                "weighed_loops": self.weighed_labels,
                "layers": [p.as_dict() for p in self.layers]}


def plan(layers, d2h_gbps, h2d_gbps=None, margin=0.9, fixed_ms=None, max_share=None, banked=False,
         contention=None, cap=None):
    """layers: (name, fwd_ms, bwd_ms or None, [region bytes]) in forward order;
    ``fixed_ms``: an offloaded layer's copies' cost per step whatever their
    size (default COPY_FIXED_MS), at most ``max_share`` of its forward and
    backward (default MAX_SHARE). ``contention``: (D2H, H2D) milliseconds
    the compute loses per millisecond of copy each way, hidden or not
    (vmmrt.torch.replay_times; None: 0): the layer's copies cost that on
    top of their fixed cost, and a layer moves at most what keeps the two
    within its ``max_share``. ``banked``: ping-pong without a declared
    schedule, whose two banks take the largest group a layer moves: the
    last two layers (its tail, and the one before it, whose bank the tail
    does not take) stay in their banks from their forward to their backward
    with no copy (vmmrt_group_stays(3)), so each moves what fits in a bank,
    for no time and no memory the banks do not hold already. (A layer that
    then moves all it saves takes its static inputs into its group too, which
    may make the banks that much larger: LayerOffload.inputs_move.)
    ``cap``: the most bytes a layer moves (None: what hides), which bounds
    the banks (:func:`lightest`)."""
    fixed_ms = COPY_FIXED_MS if fixed_ms is None else fixed_ms
    max_share = MAX_SHARE if max_share is None else max_share
    if isinstance(fixed_ms, bool) or not isinstance(fixed_ms, (int, float)) or not fixed_ms >= 0:
        raise ValueError("planner fixed_ms %r is not a time in ms, 0 or more" % (fixed_ms,))
    if isinstance(max_share, bool) or not isinstance(max_share, (int, float)) or not 0 < max_share <= 1:
        raise ValueError("planner max_share %r is not in (0, 1]" % (max_share,))
    if not 0 < margin <= 1:
        raise ValueError("planner margin %r is not in (0, 1]" % (margin,))
    if not isinstance(banked, bool):
        raise ValueError("planner banked %r is not a bool" % (banked,))
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
        raise ValueError("planner cap %r is not a byte count, 0 or more" % (cap,))
    from vmmrt.torch import budget
    contention = budget.contention_pair(contention)
    if not d2h_gbps > 0:
        raise ValueError("planner needs a positive D2H bandwidth, got %r" % (d2h_gbps,))
    h2d_gbps = h2d_gbps or d2h_gbps
    # what a moved byte costs the compute, in ms: its D2H and its H2D, each
    # slowing what runs beside it
    per_byte = contention[0] / (d2h_gbps * 1e6) + contention[1] / (h2d_gbps * 1e6)
    out = []
    n = len(layers)
    for i, (name, fwd_ms, bwd_ms, sizes) in enumerate(layers):
        tail = i == n - 1
        if tail:
            budget = 0.0
        else:
            _, nfwd, nbwd, _ = layers[i + 1]
            room = nfwd * d2h_gbps  # GB/s * ms = 1e6 bytes
            if nbwd is not None:
                room = min(room, nbwd * h2d_gbps)
            budget = margin * room * 1e6
        own = fwd_ms + (bwd_ms or 0.0)
        why = None
        if not tail and fixed_ms > max_share * own:
            budget = 0.0
            why = "moves nothing: its copies' fixed cost, %.0f us a step, is over %.0f%% of its %.2f ms" % (
                fixed_ms * 1e3, max_share * 100, own)
        elif not tail and per_byte > 0 and (max_share * own - fixed_ms) / per_byte < budget:
            budget = (max_share * own - fixed_ms) / per_byte
            why = "moves at most %.1f MiB: the compute is slower while its copies run, %.0f us a step at most " \
                  "with their fixed cost (%.0f%% of its %.2f ms)" % (budget / (1 << 20), max_share * own * 1e3,
                                                                     max_share * 100, own)
        if cap is not None and cap < budget:
            budget = cap
        chosen = select.choose(sizes, budget)
        out.append(LayerPlan(name, fwd_ms, bwd_ms, list(sizes), budget, chosen, tail, why))
    bank = max((p.moved for p in out), default=0)
    if banked and bank:
        for p in out[-2:]:
            chosen = select.grow(p.sizes, p.chosen, bank)
            if chosen is not None:
                p.budget, p.chosen = bank, chosen
                p.why = "stays in its bank, no copy: it fills it to the largest group's %.1f MiB" % (bank / (1 << 20))
    return Plan(out, d2h_gbps, h2d_gbps, margin, contention)


def lightest(layers, d2h_gbps, peak, granularity=1, **kw):
    """:func:`plan`'s plan, or the same with each layer moving less, whose
    peaks are lowest against moving nothing: ``peak(plan)`` is the memory
    model's peak of a plan in each loop it may run in (a tuple; its
    ``labels``, if any, name them). What a layer moves leaves its resident
    slot, but the banks (two of the largest group in ping-pong, the
    look-ahead's in remap) hold it again, and the step's peak may come
    where the moved bytes are gone anyway: on 6 encoder layers (d 4096, seq
    4096, set_to_none) the peak is the last backward, where every gradient
    is mapped and one layer's activations are left, and moving 128.5 MiB a
    layer saved 24 MiB there for 260 MiB of banks (H100, 2026-12-06). So
    the plan is tried with each layer capped at every size a layer of it
    moves, down to nothing; a plan scores the most it adds to any loop's
    peak over moving nothing, and one that moves more is taken only where
    it scores at least a ``granularity`` lower than the best that moves
    less: a copy that lowers no peak still costs time. ``kw``:
    :func:`plan`'s."""
    full = plan(layers, d2h_gbps, **kw)
    caps = sorted({int(p.moved) for p in full.layers if p.moved}, reverse=True)
    tried, seen = [], set()
    for t in [full] + [plan(layers, d2h_gbps, cap=c, **kw) for c in caps[1:]] + [plan(layers, d2h_gbps, cap=0, **kw)]:
        key = tuple(tuple(p.chosen) for p in t.layers)
        if key not in seen:
            seen.add(key)
            tried.append(t)
    weighed = sorted(((sum(p.moved for p in t.layers), tuple(peak(t)), t) for t in tried), key=lambda w: w[0])
    base = weighed[0][1]

    def score(w):
        return max(a - b for a, b in zip(w[1], base))
    best = weighed[0]
    for w in weighed[1:]:
        if score(w) <= score(best) - max(1, granularity):
            best = w
    chosen = best[2]
    chosen.weighed = [(m, pk) for m, pk, _ in weighed]
    chosen.weighed_labels = getattr(peak, "labels", None)
    chosen.weighed_peak = best[1]
    return chosen


def measure_bandwidth(device, nbytes=64 << 20, repeats=3, runtime=None):
    """(D2H, H2D) GB/s of the copies libvmmrt itself makes: one of its slots and
    its pinned host memory, asynchronous copies on a stream of its own, timed
    with its events; the best of ``repeats``. ``runtime``: the one to measure
    with (a temporary one for ``device`` otherwise)."""
    from vmmrt.torch.offload import runtime_options
    own = runtime is None
    rt = vmmrt.Runtime(runtime_options(torch.device(device))) if own else runtime
    slot = host = stream = None
    events = []
    try:
        slot = rt.slot(nbytes)
        slot.map()
        host = rt.host_alloc(nbytes)
        stream = rt.stream_create()
        res = []
        for d2h in (True, False):
            best = float("inf")
            for _ in range(repeats):
                e0, e1 = rt.event(True), rt.event(True)
                events += [e0, e1]
                e0.record(stream)
                if d2h:
                    rt.copy_to_host_async(host, slot.address, nbytes, stream)
                else:
                    rt.copy_to_device_async(slot.address, host, nbytes, stream)
                e1.record(stream)
                e1.synchronize()
                best = min(best, e0.elapsed_ms(e1))
            res.append(nbytes / (max(best, 1e-6) * 1e-3) / 1e9)
        return res[0], res[1]
    finally:
        _let_go(rt, events, stream, slot, host)
        if own:
            rt.close()


def _let_go(rt, events, stream, slot, host=None):
    """What a probe of ``rt`` made (timing events, a stream, a slot, pinned
    host memory), given back once the stream has run."""
    for e in events:
        e.destroy()
    if stream is not None:
        rt.stream_synchronize(stream)
        rt.stream_destroy(stream)
    if host is not None:
        rt.host_free(host)
    if slot is not None:
        slot.destroy()


# remap's probe is the largest group a layer could move, at most this much:
# a map's cost grows with its size, and the probe's memory is taken for it
REMAP_PROBE_MAX = 1 << 30
REMAP_REPEATS = 5


def measure_remap(off, nbytes, repeats=REMAP_REPEATS):
    """Milliseconds a stream waits for one map of ``nbytes`` in remap's way:
    a slot of ``off``'s runtime, its memory released, mapped again by a
    driver worker once an event on the stream has completed (a host function
    wakes it: vmmrt_slot_map_after(3)) while the stream waits for it on the
    device (vmmrt_slot_wait_stream(3)); from that event to the stream going
    on, timed with the library's events. The release is made and waited for
    first (vmmrt_slot_unmap): one still queued would be cancelled by the map,
    which then had nothing to do (the H200 read 0.004 ms that way). One
    untimed cycle, then the median of ``repeats``: a map's latency has a
    tail (the worker's wake-up), and the plan charges it at every offloaded
    layer."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError("measure_remap: nbytes must be an int, 0 or more (0: one granule), not %r" % (nbytes,))
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError("measure_remap: repeats must be an int, 1 or more, not %r" % (repeats,))
    rt = off.runtime
    g = max(1, off.granularity)
    nbytes = -(-max(1, min(nbytes, REMAP_PROBE_MAX)) // g) * g
    slot = stream = None
    events = []
    try:
        slot = rt.slot(nbytes)
        slot.map()
        stream = rt.stream_create()
        times = []
        for k in range(repeats + 1):
            t0, t1 = rt.event(True), rt.event(True)
            events += [t0, t1]
            rt.stream_synchronize(stream)
            slot.unmap()
            t0.record(stream)
            slot.map_after(t0)
            slot.wait_stream(stream)
            t1.record(stream)
            t1.synchronize()
            if k:
                times.append(t0.elapsed_ms(t1))
        slot.wait()
        times.sort()
        return times[len(times) // 2]
    finally:
        _let_go(rt, events, stream, slot)


def remap_cost(off, costs):
    """remap's cost per offloaded layer for the planner: measured once per
    Offload (:func:`measure_remap`, a map of the largest group a layer could
    move) and kept as ``off.remap_ms`` ((ms, bytes)); the assumed
    budget.REMAP_MS where the measure fails (said in the log)."""
    from vmmrt.torch import budget
    if off.remap_ms is not None:
        return off.remap_ms[0]
    nbytes = max([sum(c.sizes) for c in costs] or [0])
    try:
        ms = measure_remap(off, nbytes)
    except vmmrt.Error as e:
        log.warning("vmmrt: remap's map could not be timed (%s); the planner assumes %.2f ms", e, budget.REMAP_MS)
        return budget.REMAP_MS
    off.remap_ms = (ms, min(nbytes, REMAP_PROBE_MAX))
    return ms


def _uses_remap(mode, strategies):
    """Whether a budget plan will predict remap: chosen among, or the
    runtime's mode (whose alternatives are predicted too)."""
    if strategies is not None:
        return any(m == "remap" for m, _ in strategies)
    return mode != "none"


def routed(off, graphs):
    """Whether the optimizer step's allocations can go to the memory plan's
    free pages here (vmmrt.torch.optmem: graphs on CUDA, a PyTorch that
    routes)."""
    if not graphs:
        return False
    from vmmrt.torch import optmem
    return optmem.available(off) is None


def copy_bandwidth(off):
    """(D2H, H2D) GB/s the planners plan ``off``'s copies with: libvmmrt's
    own copies measured idle (:func:`measure_bandwidth`), each no more than
    what the layers' compute left them where that was measured
    (``Offload.copy_gbps``, vmmrt.torch.replay_times): the copies share the
    device's memory bandwidth with the layers they hide behind."""
    d2h, h2d = measure_bandwidth(off.device, runtime=off.runtime)
    under = getattr(off, "copy_gbps", None) or (None, None)
    return (d2h if under[0] is None else min(d2h, under[0]), h2d if under[1] is None else min(h2d, under[1]))


# ------------------------------------------------------------ memory budget
def _nbytes(t):
    return t.numel() * t.element_size()


class working:
    """Around a warm-up pass of a layer (on CUDA): what it allocates beyond
    what it keeps, from the caching allocator's peak (which this resets), into
    ``lay.fwd_work`` (the peak over what the forward leaves: intermediates)
    and ``lay.bwd_work`` (the peak over what was there before the backward:
    its results are taken off in :func:`layer_costs`)."""

    def __init__(self, lay, backward):
        self.lay, self.backward = lay, backward
        self.dev = lay.offload.device if lay.offload.device_type == "cuda" else None

    def __enter__(self):
        if self.dev is not None:
            self.before = torch.cuda.memory_allocated(self.dev)
            torch.cuda.reset_peak_memory_stats(self.dev)
        return self

    def __exit__(self, *exc):
        if self.dev is not None and exc[0] is None:
            peak = torch.cuda.max_memory_allocated(self.dev)
            if self.backward:
                self.lay.bwd_work.append(max(0, peak - self.before))
            else:
                self.lay.fwd_work.append(max(0, peak - torch.cuda.memory_allocated(self.dev)))


def _mapped(r):
    g = getattr(r, "grads", None)
    return g is not None and g.mapped


def static_bytes(off, runners=(), graphs=True, reserve=0):
    """What is on the device whatever the plan, as the budget planner counts
    it: on CUDA the driver's used memory now less what PyTorch's caching
    allocator holds unused (the warm-up's freed activations), on the host
    backend the parameters and the sample arguments; plus the gradients not
    allocated yet that do not come and go (static buffers: a callable whose
    gradients are not mapped), under graphs the static tensors each capture
    adds (outputs as large as the inputs, their gradients' buffers, the
    inputs' gradients: counted here even where the two last lie in a mapped
    gradients' io slot, which layer_costs leaves out, as a recomputed
    layer has none) and ``reserve`` (what the step adds later: an
    optimizer's states and temporaries). The graphs' static inputs that go in
    the layers' resident slots (``LayerOffload.input_bytes``,
    vmmrt.torch.static_inputs) are not: the caller's sample tensors they take
    the place of are let go by the library (a caller who keeps them holds
    memory of its own), and :func:`layer_costs` counts them with their layer
    (``LayerCost.inputs``)."""
    params, static, seen = [], [], set()
    for r in runners:
        for p in r.params:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
                if not _mapped(r):
                    static.append(p)
    samples = sum(_nbytes(t) for r in runners for t in r.sample)
    if off.host:
        base = sum(_nbytes(p) for p in params) + samples
    else:
        free, total = off.runtime.mem_info()
        dev = off.device
        base = (total - free) - (torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
    grads = sum(_nbytes(p) for p in static if p.requires_grad and p.grad is None)
    moved = sum(_inputs(r.layer) for r in runners)
    return base - moved + grads + (graph_statics(runners) if graphs else 0) + reserve


def graph_statics(runners):
    """The static tensors the layers' captures add, as :func:`static_bytes`
    counts them: outputs as large as the sample inputs, their gradients'
    buffers, the inputs' gradients."""
    samples = sum(_nbytes(t) for r in runners for t in r.sample)
    return 2 * samples + sum(_nbytes(t) for r in runners for t in r.sample if t.requires_grad)


def _inputs(lay):
    """The bytes of ``lay``'s graphs' static inputs that go in its resident slot."""
    return sum(n for n in lay.input_bytes if n is not None)


def layer_costs(off, marked=None, runners=()):
    """The budget planner's view of each layer of ``off`` (forward order): its
    fastest forward and backward (its graphs' replays where they were timed,
    vmmrt.torch.replay_times; else the warm-up's), the regions that may move, the saved
    bytes that stay unless it is recomputed, the working sets of its passes and,
    from ``runners`` (the layers' own, in the same order), the bytes of its
    mapped gradients; ``marked``: per layer, True when the user marked it for
    recomputation (vmmrt.torch.mark_recompute)."""
    from vmmrt.torch import budget
    by_layer = {id(r.layer): r for r in runners}
    rows = []
    for i, lay in enumerate(off.layers):
        if not lay.fwd_ms:
            raise budget.InvalidBudget("layer %r has no measured forward time: the planner reads the warm-up passes' "
                                       "times (LayerOffload.fwd_ms, bwd_ms); append them before planning" % lay.name)
        cand = off.candidates(lay)
        fixed = sum(r.nbytes for r in lay.regions if r.reason not in (None, "output", "recompute", "budget"))
        r = by_layer.get(id(lay))
        gbytes = lay.grads.backing.nbytes if r is not None and _mapped(r) else 0
        # the backward's results are counted elsewhere: the parameters' gradients
        # (mapped or static), the inputs' and the outputs' gradient buffers
        results = 0 if r is None else (sum(_nbytes(p) for p in r.params if p.requires_grad)
                                       + sum(2 * _nbytes(t) for t in r.sample if t.requires_grad))
        fwd_work = min(lay.fwd_work) if lay.fwd_work else 0
        bwd_work = max(0, min(lay.bwd_work) - results) if lay.bwd_work else 0
        rows.append(budget.LayerCost(lay.name, min(lay.fwd_ms), min(lay.bwd_ms) if lay.bwd_ms else 0.0,
                                     [r.nbytes for r in cand], fixed,
                                     True if marked is not None and marked[i] else None,
                                     gbytes, fwd_work, bwd_work, _inputs(lay)))
    return rows


def peak_model(off, runners=(), graphs=True, pages=False, planned=False, loop=None):
    """``peak(plan)`` for :func:`lightest` over the layers of ``off`` (after
    their warm-up): the budget planner's memory model (vmmrt.torch.budget)
    of the regions a bandwidth plan moves, in each of the two loops, as
    nothing says yet which one the caller runs (set_to_none: the gradients
    arrive in backward and the last backward may be the peak; a persistent
    ``.grad``: they are there all along, and the peak is between forward
    and backward, where the moved bytes are gone): the peaks of both.
    ``pages``: the optimizer steps in the memory plan's pages;
    ``planned``: the slots are on them, each live from its use to its
    last (vmmrt.torch.memplan), not mapped ahead; ``loop``: the one loop
    the caller said it runs ("set_to_none" or "persistent"), whose peak
    alone is then predicted."""
    from vmmrt.torch import budget
    costs = layer_costs(off, None, runners)
    kw = _model_kw(off, graphs, pages, planned)

    def peak(p):
        if [c.name for c in costs] != [q.name for q in p.layers]:
            raise vmmrt.Error(_capi.E_MISMATCH, "the plan's layers %r are not the runtime's %r"
                              % ([q.name for q in p.layers], [c.name for c in costs]), "vmmrt.torch planner")
        chosen = [q.chosen for q in p.layers]
        return tuple(budget.predict(costs, chosen, persistent=x, **kw).peak_bytes for x in loops)
    if loop is not None:
        budget.check_loop(loop, "loop=%r (None: both)")
    loops = (False, True) if loop is None else (loop == "persistent",)
    peak.labels = ("set_to_none", "persistent") if loop is None else (loop,)
    return peak


def _model_kw(off, graphs, pages, planned):
    """The memory model's view of ``off``'s runtime: its mode, look-ahead,
    granularity, how far ahead slots are mapped (none with the memory
    plan's pages, each slot live from its use to its last) and whether the
    optimizer steps in those pages."""
    return dict(mode=off.mode, lookahead=off.lookahead if off.mode == "remap" else 1, granularity=off.granularity,
                map_ahead=0 if off.host or planned else off.map_ahead, pages=bool(pages) and routed(off, graphs))


class StepModel:
    """The whole step's predicted driver-level peak of a plan made without
    ``memory_budget=`` (offload="auto"'s, a fraction's, mode none's): the
    budget planner's model (vmmrt.torch.budget) of the regions it moves and
    keeps, over what was on the device when it was made (``static_bytes``:
    parameters, the graphs' static tensors, what the process held before),
    in the loop asked. Such a plan is not told the optimizer's memory, so
    :meth:`peak` takes it as ``Budget(reserve=, step=)`` gives it to a budget
    plan: ``reserve``, its states (AdamW: twice the parameters), ``step``,
    the temporaries its step makes and frees (foreach AdamW: the
    parameters' size)."""

    def __init__(self, costs, chosen, static_bytes, kw, graph_bytes=0):
        self.costs, self.chosen, self.static_bytes, self.kw = costs, [list(c) for c in chosen], static_bytes, kw
        self.graph_bytes = graph_bytes      # of static_bytes: the captures' static tensors (graph_statics)
        self.made = None                    # the memory plan's facts, once it is made (planned)

    def planned(self, plan, loop=None, routed=False):
        """The memory plan (vmmrt.torch.memplan.Plan) is made, for ``loop``
        (the one it learned; None: either, no gradient slot on it), with
        the optimizer step routed to its pages or not (``routed``). From
        now on the peak in that loop puts the plan's own bytes (its pages
        and the persistent gradients' own memory) where the model had the
        activations, gradients and working set it estimated before the
        captures: the pages know what the estimate could not (the
        gradients on resident bytes their backward has read, the pool's
        parts on pages the slots free, the granules), and hold the graphs'
        static tensors the static part counted too. The other loop keeps
        the estimate. ``plan`` None: no plan (given up), the estimate in
        both."""
        if plan is None:
            self.made = None
            return
        self.made = dict(loop=loop, total=plan.total_bytes, free_at_end=plan.free_at_end,
                         graph_bytes=plan.graph_bytes, pool=plan.has_pool, routed=bool(routed))

    def peak(self, reserve: int = 0, step: int = 0, loop: str = "set_to_none") -> int:
        from vmmrt.torch import budget
        for name, v in (("reserve", reserve), ("step", step)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise budget.InvalidBudget("%s=%r: bytes, 0 or more" % (name, v), "vmmrt.torch StepModel.peak")
        budget.check_loop(loop)
        p = budget.predict(self.costs, self.chosen, persistent=loop == "persistent",
                           static_bytes=self.static_bytes + reserve, step_bytes=step, **self.kw)
        m = self.made
        if m is None or m["loop"] not in (None, loop):
            return p.peak_bytes
        # the optimizer's temporaries: in the bytes free at the step's end
        # and ping-pong's banks where routed there (vmmrt.torch.optmem lends
        # both; what does not fit comes from the driver), else all from
        # PyTorch's allocator; the working set outside the pages where the
        # graphs' pool is not on them
        lent = m["free_at_end"] + (p.bank_bytes if self.kw.get("mode") == "pingpong" else 0)
        held = m["total"] + (max(0, step - lent) if m["routed"] else step)
        held += 0 if m["pool"] else p.inflight_bytes
        static = self.static_bytes - min(self.graph_bytes, m["graph_bytes"])
        return static + reserve + p.inputs_bytes + p.bank_bytes + held

    def describe(self) -> str:
        mib = float(1 << 20)
        m = self.made
        return ("the plan's whole step, predicted (the budget planner's model, driver-level, without the "
                "optimizer's memory: vt.check_plan(reserve=, step_bytes=) adds it): %.0f MiB set_to_none, "
                "%.0f MiB persistent .grad%s" % (
                    self.peak() / mib, self.peak(loop="persistent") / mib,
                    "" if m is None else "; %s from the memory plan's pages (%.0f MiB), %s estimated before it" % (
                        "both" if m["loop"] is None else "the %s loop's" % m["loop"], m["total"] / mib,
                        "neither" if m["loop"] is None else "the other")))


def step_model(off, runners, graphs, chosen=None, offload=None, pages=False, planned=False):
    """:class:`StepModel` of ``off``'s layers (after their warm-up, before
    their allocation: what the device holds now is the static part), for
    the regions ``chosen`` (per layer, indices into its candidates: a
    bandwidth plan's) or, without them, those ``offload`` (a fraction)
    moves; ``pages`` and ``planned`` as :func:`peak_model`'s. None, with
    the reason logged, where a layer has no measured times to model (or
    the model fails: it predicts, it never stops a build that works)."""
    from vmmrt.torch import budget
    try:
        costs = layer_costs(off, None, runners)
        if chosen is None:
            f = 0.0 if off.mode == "none" else float(offload)
            chosen = [budget.fraction_chosen(c, f) for c in costs]
        return StepModel(costs, chosen, static_bytes(off, runners, graphs), _model_kw(off, graphs, pages, planned),
                         graph_statics(runners) if graphs else 0)
    except budget.InvalidBudget as e:
        log.info("vmmrt: no whole-step model of the plan: %s", e)
    except Exception as e:  # noqa: B902 - reported, and the build goes on without a prediction
        log.warning("vmmrt: no whole-step model of the plan: %s: %s", type(e).__name__, e)
    return None


def budget_plan(off, memory_budget, margin=0.9, runners=(), graphs=True, offload=1.0, marked=None, strategies=None,
                pages=False):
    """:func:`_budget_plan`'s plan, with the reserve it was given (what
    check_plan names when a step holds more than predicted)."""
    from vmmrt.torch import budget
    p = _budget_plan(off, memory_budget, margin, runners, graphs, offload, marked, strategies, pages)
    p.reserve_bytes = memory_budget.reserve if isinstance(memory_budget, budget.Budget) else 0
    return p


def _budget_plan(off, memory_budget, margin, runners, graphs, offload, marked, strategies, pages):
    """The plan for ``memory_budget`` (bytes, "80%", "60GiB" or a
    :class:`vmmrt.torch.budget.Budget`) over the layers of ``off`` (after
    their warm-up): searched under a limit, predicted for a hand plan, or,
    with only layers marked for recomputation, those recomputed and the
    others offloaded by the fraction ``offload``. ``strategies``: the (mode,
    look-ahead) pairs to choose among (default: the runtime's; :func:`adopt`
    then moves the layers to the chosen one). ``pages``: the memory plan
    will put the slots on its pages with the optimizer step routed into
    them (``memory_plan=True``): the step's temporaries (``Budget(step=)``)
    are then predicted in the bytes free at the step where optmem can
    route them here. Raises BudgetError when no plan
    fits, InvalidBudget for a budget that is not one."""
    from vmmrt.torch import budget
    b = memory_budget if isinstance(memory_budget, budget.Budget) else (
        None if memory_budget is None else budget.Budget(memory_budget))
    total = off.runtime.mem_info()[1]
    limit = None if b is None or b.limit is None else budget.parse(b.limit, total)
    costs = layer_costs(off, marked, runners)
    gbps = copy_bandwidth(off)
    static = static_bytes(off, runners, graphs, b.reserve if b is not None else 0)
    mode = off.mode
    # ping-pong without a declared schedule has two banks and restores one layer ahead
    la = off.lookahead if mode == "remap" else 1
    common = dict(static_bytes=static, d2h_gbps=gbps[0], h2d_gbps=gbps[1], margin=margin,
                  granularity=off.granularity, map_ahead=0 if off.host else off.map_ahead,
                  step_bytes=b.step if b is not None else 0, pages=bool(pages) and routed(off, graphs),
                  persistent=b is not None and b.loop == "persistent", contention=off.copy_contention)
    # remap's map is timed only where a prediction will charge it: a plan
    # in remap, or a search whose strategies (or alternatives) include it
    searched = b is not None and b.layers is None and limit is not None
    if mode == "remap" or (searched and _uses_remap(mode, strategies)):
        common["remap_ms"] = remap_cost(off, costs)
    if b is not None and b.layers is not None:
        # (mode none: its own model, a recomputed layer's checkpoint in its slot, not in ping-pong's banks;
        # mode="auto" runs a plan that moves nothing there where that holds less)
        p = budget.hand_plan(costs, b.layers, mode, la, strategies, budget=limit, **common)
        if mode == "none" and any(c.moved for c in p.layers):
            raise budget.InvalidBudget("mode='none' moves nothing: a hand plan that offloads needs 'pingpong' or "
                                       "'remap'")
        if not p.fits:
            raise budget.BudgetError("the hand plan's predicted peak, %d bytes, is over the budget of %d bytes"
                                     % (p.peak_bytes, limit), limit, p.peak_bytes)
        return p
    if limit is None:
        choices = ["recompute" if c.recompute else float(offload) if mode != "none" else "keep" for c in costs]
        return budget.evaluate(costs, choices, mode, la, **common)
    chosen = strategies is not None
    if strategies is None:
        strategies = [(mode, la)] if mode != "none" else [("none", 1)]
    p = budget.search(costs, limit, strategies=strategies, recompute=b.recompute, **common)
    if chosen:
        return p
    # what the other strategies would predict (they need another Offload(mode=, lookahead=))
    if mode != "none":
        others = [s for s in budget.STRATEGIES if s != (mode, la)]
        for s in others:
            try:
                q = budget.search(costs, limit, strategies=[s], recompute=b.recompute, **common)
                p.alternatives.append((s[0], s[1], q.predicted_ms, q.peak_bytes))
            except budget.BudgetError:
                pass
    return p


def adopt(off, plan, runners, uses):
    """The layers of ``off`` (discovered, not allocated) moved to a runtime in
    the plan's mode and look-ahead: a runtime's mode is fixed when it opens,
    and nothing of a layer is in its C group before allocation, so the
    discovery (regions, births, timings) carries over and only the groups are
    made again. ``off`` is closed; returns the new :class:`Offload`."""
    from vmmrt.torch.offload import Offload
    la = off.lookahead if off.mode == "remap" else 1
    if (plan.mode, plan.lookahead) == (off.mode, la):
        return off
    opts = dict(off.options, mode=plan.mode, lookahead=plan.lookahead)
    device, min_bytes, map_ahead = off.device, off.min_bytes, off.map_ahead
    olds = [r.layer for r in runners]
    off.close()         # one runtime per device at a time
    new = Offload(mode=plan.mode, lookahead=plan.lookahead, device=device, options=opts, min_bytes=min_bytes,
                  _settled=True)     # the planner's choice, against the environment already
    try:
        new.map_ahead = map_ahead
        new.copy_gbps, new.copy_contention, new.remap_ms = off.copy_gbps, off.copy_contention, off.remap_ms
        for r, old in zip(runners, olds):
            lay = new.layer(old.name)
            lay.carry_discovery(old)
            r.layer = lay
        new.loop = off.loop
        new.set_order([(r.layer, b) for b, r in uses])
        if (new.mode, new.lookahead) != (plan.mode, plan.lookahead):
            raise vmmrt.Error(_capi.E_MISMATCH, "the planner chose mode %r at look-ahead %d but the runtime opened %r "
                              "at %d (a VMMRT_MODE or VMMRT_LOOKAHEAD in the environment?); unset them, or give mode= "
                              "yourself" % (plan.mode, plan.lookahead, new.mode, new.lookahead),
                              "vmmrt.torch memory_budget")
    except BaseException:
        new.close()
        raise
    return new
