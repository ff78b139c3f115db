# SPDX-License-Identifier: LGPL-2.1-or-later
"""Pipeline schedules of one stage: several microbatches in flight through the
same layers.

An *order* is TransformerEngine's ``_order`` (which Megatron-LM computes for
its per-microbatch CUDA graphs): a list of 1-based chunk ids, ``+c`` for the
forward of chunk c's next microbatch, ``-c`` for the backward of chunk c's
oldest microbatch whose backward has not run. A chunk is a run of
consecutive layers (one chunk, unless the schedule is interleaved); each of
the m microbatches goes through each chunk once forward and once backward,
so the order holds each chunk m times with each sign::

    order_1f1b(4, in_flight=2)  ->  [1, 1, -1, 1, -1, 1, -1, -1]

``make_graphed_callables(layers, sample_args, order=order)`` then makes one
runner per (layer, microbatch), each with its own static inputs, graphs and
libvmmrt group, captured in the order's order and declared to the library
as its schedule; it returns them in TransformerEngine's layout (chunk, then
microbatch, then layer: :meth:`Layout.index`), and :func:`split` arranges
them by chunk and microbatch for the training loop.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["order_1f1b", "steps", "split", "Layout"]


def order_1f1b(microbatches: int, in_flight: int | None = None, *, warmup: int | None = None, chunks: int = 1,
               group: int | None = None) -> list[int]:
    """The 1F1B order of one pipeline stage, as Megatron-LM runs it (and as it
    hands it to TransformerEngine's make_graphed_callables).

    ``microbatches``: m. ``in_flight``: p, the microbatches (chunk passes, if
    interleaved) whose forward runs before the first backward: the warm-up
    forwards of p - 1, then one forward and one backward at a time, then the
    last backwards (p = 1 is forward, backward, forward, ...; p >= m: every
    forward, then every backward). ``warmup`` instead gives Megatron's
    num_warmup_microbatches (p - 1) directly: for stage r of P,
    ``P - r - 1``, or ``(P - r - 1) * 2 + (chunks - 1) * group`` interleaved.

    ``chunks``: model chunks of this stage (interleaved 1F1B): microbatches
    go through the chunks in groups of ``group`` (Megatron's
    microbatch_group_size_per_vp_stage; default ``in_flight``, or m), each
    group through chunk 1, then chunk 2, ...; the backwards visit the chunks
    in reverse. A single-device order needs the warm-up to cover one group of
    every chunk but the last ((chunks - 1) * group); :class:`Layout` refuses
    an order that runs a backward before its forward.
    """
    m = _positive(microbatches, "microbatches")
    chunks = _positive(chunks, "chunks")
    if (in_flight is None) == (warmup is None):
        raise ValueError("order_1f1b: give in_flight (microbatches forward before the first backward) or warmup "
                         "(Megatron's num_warmup_microbatches), one of them")
    if warmup is None:
        warmup = _positive(in_flight, "in_flight") - 1
    elif not isinstance(warmup, int) or warmup < 0:
        raise ValueError("order_1f1b: warmup=%r is not a count" % (warmup,))
    if group is None:
        group = in_flight if in_flight is not None else m
    group = _positive(group, "group")
    table = []                      # the chunk of each virtual microbatch, in forward order
    for lo in range(0, m, group):
        for c in range(chunks):
            table.extend([c] * (min(lo + group, m) - lo))
    fwd = [c + 1 for c in table]
    bwd = [c - chunks for c in table]   # -(chunks - c): the backwards go through the chunks in reverse
    w = min(warmup, len(fwd))
    order = fwd[:w]
    for i in range(w, len(fwd)):
        order += [fwd[i], bwd[i - w]]
    if w:
        order += bwd[-w:]
    return order


def _positive(v, what):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError("%s=%r: a positive count" % (what, v))
    return v


def steps(order: Sequence[int]) -> list[tuple[bool, int, int]]:
    """The order as (backward, chunk, microbatch) triples, chunk and microbatch
    0-based: what a training loop runs, one step at a time."""
    return Layout(order).steps


def split(graphed: Sequence[Callable], order: Sequence[int],
          layers_per_chunk: int | Sequence[int] | None = None) -> list[list[tuple[Callable, ...]]]:
    """``runs[chunk][microbatch]``: the tuple of the chunk's layer callables for
    that microbatch, from what make_graphed_callables(..., order=order) returned."""
    lay = Layout(order, None, layers_per_chunk, n_callables=len(graphed))
    return [[tuple(graphed[lay.index(c, mb, l)] for l in range(lay.layers_per_chunk[c]))
             for mb in range(lay.microbatches)] for c in range(lay.chunks)]


class Layout:
    """An order checked, and where each (chunk, microbatch, layer) runner is.

    ``n_layers``: the callables (layers of every chunk, in order); with
    ``layers_per_chunk`` (an int or one count per chunk) omitted, the chunks
    share them equally. ``n_callables`` instead counts the runners
    (TransformerEngine's sample_args: layers x microbatches). With none of
    the three, only the order is checked and :attr:`steps` made.
    """

    def __init__(self, order: Sequence[int], n_layers: int | None = None,
                 layers_per_chunk: int | Sequence[int] | None = None, n_callables: int | None = None) -> None:
        order = list(order)
        if not order or any(not isinstance(c, int) or isinstance(c, bool) or c == 0 for c in order):
            raise ValueError("order: a list of non-zero chunk ids (+c forward of chunk c, -c its backward), "
                             "got %r" % (order,))
        self.order = order
        self.chunks = max(abs(c) for c in order)
        counts = {}
        for c in order:
            counts[c] = counts.get(c, 0) + 1
        m = counts.get(1, 0)
        for c in range(1, self.chunks + 1):
            if counts.get(c, 0) != m or counts.get(-c, 0) != m:
                raise ValueError("order: chunk %d has %d forwards and %d backwards where chunk 1 has %d: every "
                                 "chunk runs every microbatch once each way" % (c, counts.get(c, 0),
                                                                                 counts.get(-c, 0), m))
        self.microbatches = m
        fwd, bwd, self.steps = [0] * self.chunks, [0] * self.chunks, []
        for k, c in enumerate(order):
            ch = abs(c) - 1
            if c > 0:
                self.steps.append((False, ch, fwd[ch]))
                fwd[ch] += 1
            else:
                # Checked here too, not only by the library's schedule: a Layout
                # serves training loops (steps, split) with no runtime, and the
                # runners it lays out are built before any group exists.
                if bwd[ch] >= fwd[ch]:
                    raise ValueError("order: step %d is the backward of chunk %d, microbatch %d, before its forward"
                                     % (k, abs(c), bwd[ch]))
                self.steps.append((True, ch, bwd[ch]))
                bwd[ch] += 1
        self.layers_per_chunk = None
        if layers_per_chunk is None and n_layers is None and n_callables is None:
            return                      # the steps only
        if layers_per_chunk is None:
            if n_layers is None:
                if n_callables is None or n_callables % (m * self.chunks):
                    raise ValueError("order: %r runners for %d chunks of %d microbatches"
                                     % (n_callables, self.chunks, m))
                n_layers = n_callables // m
            if n_layers % self.chunks:
                raise ValueError("order: %d layers do not split into %d equal chunks; give layers_per_chunk"
                                 % (n_layers, self.chunks))
            layers_per_chunk = n_layers // self.chunks
        if isinstance(layers_per_chunk, int):
            layers_per_chunk = [layers_per_chunk] * self.chunks
        layers_per_chunk = list(layers_per_chunk)
        if len(layers_per_chunk) != self.chunks or any(not isinstance(n, int) or n < 1 for n in layers_per_chunk):
            raise ValueError("layers_per_chunk=%r: one positive count per chunk (%d)" % (layers_per_chunk,
                                                                                      self.chunks))
        self.layers_per_chunk = layers_per_chunk
        self.prefix = [0]
        for n in layers_per_chunk:
            self.prefix.append(self.prefix[-1] + n)
        self.n_layers = self.prefix[-1]
        if n_layers is not None and n_layers != self.n_layers:
            raise ValueError("order: %d callables, but layers_per_chunk %r makes %d" % (n_layers, layers_per_chunk,
                                                                                       self.n_layers))
        if n_callables is not None and n_callables != self.n_layers * m:
            raise ValueError("order: %d runners where %d layers x %d microbatches make %d"
                             % (n_callables, self.n_layers, m, self.n_layers * m))

    @property
    def n_runners(self) -> int:
        return self.n_layers * self.microbatches

    def index(self, chunk: int, microbatch: int, layer: int) -> int:
        """Where runner (chunk, microbatch, layer-in-chunk) is, in TransformerEngine's
        layout: chunk-major, then microbatch, then layer."""
        return self.prefix[chunk] * self.microbatches + microbatch * self.layers_per_chunk[chunk] + layer

    def where(self, i: int) -> tuple[int, int, int, int]:
        """(chunk, microbatch, layer in chunk, callable index) of runner i."""
        for c in range(self.chunks):
            lo, n = self.prefix[c] * self.microbatches, self.layers_per_chunk[c]
            if i < lo + n * self.microbatches:
                mb, l = divmod(i - lo, n)
                return c, mb, l, self.prefix[c] + l
        raise IndexError("runner %d of %d" % (i, self.n_runners))

    def uses(self) -> list[tuple[bool, int]]:
        """The order over runners: (backward, runner index) for every layer of every
        step, a chunk's layers in order forward and in reverse backward."""
        out = []
        for backward, c, mb in self.steps:
            layers = range(self.layers_per_chunk[c])
            for l in (reversed(layers) if backward else layers):
                out.append((backward, self.index(c, mb, l)))
        return out

    def forwards(self) -> list[int]:
        """Runner indices in the order of their forwards."""
        return [i for backward, i in self.uses() if not backward]
