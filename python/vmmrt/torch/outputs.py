# SPDX-License-Identifier: LGPL-2.1-or-later
"""A forward graph's outputs born in a slot of the layer's own, whose memory
the memory plan shares (vmmrt.torch.memplan) instead of a graph pool keeping
it for the life of the graphs.

torch.cuda.make_graphed_callables leaves each forward graph's outputs in the
graph pool: a chain of L layers holds L outputs for good, where eager frees
layer i's output once layer i+1 has copied it into its own static input (on
8 Llama-3-8B layers at seq 4096, 32 MiB each: 256 MiB that eager does not
hold, at every moment of the step). Here the op that makes an output writes
it at the slot (vmmrt.torch.place: births learned at discovery, placed at
the capture), and its life is learned as the memory plan learns the loop:
over the step before the plan, at each use's begin hook, whether any
tensor over the outputs (the one handed out, a view a user kept) is alive
(:meth:`Outputs.alive`: the storage's use count above what the library
holds itself). In a chain that is from the layer's forward to the next
layer's forward, and the plan puts the outputs of layers two apart on the
same bytes. A tensor kept past the life learned is caught at the use that
would write over it, as any slot's (memplan.Entry.begin_use: the slot
beginning its use gets memory of its own); once nothing holds its bytes on
the pages or its own, it goes back (memplan.Entry.come_back: the host
waits for the device once), instead of keeping that memory for good.

Without a plan (memory_plan=False, or the steps before it) the slot is
mapped from the capture on and never released (``kept``): the bytes the
pool held. Not for recomputed layers where torch's checkpoint has no graphs'
route (vmmrt.torch.recompute.CHECKPOINTED: their backward graphs run the
whole forward again), a pipeline's runners, outputs the layer saves for its backward (a saved
region's), nor outputs under half a granule in all; nor where torch has no
storage use count (torch 1.13), as liveness is read from it.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from vmmrt.torch import _compat, place
from vmmrt.torch.backing import USE_COUNT, Backing, Held, alive_by

log = logging.getLogger("vmmrt.torch")

AVAILABLE = USE_COUNT is not None and place.AVAILABLE
ALIGN = 512


def births(outputs: Sequence[Any], mode_births: dict, static: frozenset, saved: set) -> list:
    """The births to place (a discovery pass's place.Mode.births, by storage
    pointer): each output tensor's storage once, if the layer's pass made
    it and it is neither static (an argument, a parameter) nor a saved
    region's (those live to the layer's backward, in its resident slot or
    its bank)."""
    out, seen = [], set()
    for o in outputs:
        if not isinstance(o, torch.Tensor) or o.layout != torch.strided or not o.numel():
            continue
        ptr = _compat.storage_of(o)[0]
        if ptr in seen or ptr in static or ptr in saved:
            continue
        b = mode_births.get(ptr)
        if b is None:
            continue
        seen.add(ptr)
        out.append(b)
    return out


def layout(items: Sequence[Any]) -> tuple[list[int], int]:
    """Each birth's storage at an offset of the slot (aligned), and the total."""
    offs, total = [], 0
    for b in items:
        total += (-total) % ALIGN
        offs.append(total)
        total += b.storage_nbytes
    return offs, total


class Outputs:
    """One layer's forward outputs in a slot: ``backing`` (kept: mapped for
    good while off the plan's pages; ``alive`` tells the plan whether a
    tensor over it is held)."""

    def __init__(self, offload: Any, name: str, items: Sequence[Any]) -> None:
        self.items = list(items)
        self.offsets, total = layout(self.items)
        self.backing = Backing(offload, "%s/outputs" % name, total)
        self.backing.kept = True
        alive_by(self, self.backing)
        self._base = None
        self.landed = 0             # outputs of the capture over the slot (adopt)

    def placements(self, stream: Any) -> list:
        """The place.Placed of a capture: a target over the slot per birth."""
        if self._base is None:
            self.backing.ensure()
            self._base = self.backing.tensor(stream, counted=False)
        return [place.Placed(b, place.tensor_over(self._base, b.dtype, b.shape, b.stride, off + b.offset))
                for b, off in zip(self.items, self.offsets)]

    def adopt(self, outputs: Sequence[Any]) -> int:
        """After the capture: how many of its outputs lie over the slot."""
        a = self.backing.address
        self.landed = sum(1 for o in outputs if isinstance(o, torch.Tensor) and o.numel()
                          and _compat.storage_of(o)[0] == a)
        return self.landed

    def settle(self) -> None:
        """Once the build holds what it keeps (the graphs' static outputs, the
        base): that count is the library's own; above it, a tensor handed
        out is alive (backing.Held)."""
        self.backing.alive = Held(self._base)

    def alive(self) -> bool:
        """Whether a tensor over the outputs, other than the library's own, is held."""
        return self.backing.handed_out()

    def forget(self) -> None:
        """At close(): the library's base lets go (a tensor handed out keeps
        the memory, and the runtime, alive: Backing.tensor)."""
        self._base = None
        self.backing.alive = None

    def drop(self) -> None:
        """Its memory given back (nothing lies over it): the slot goes with the runtime."""
        self._base = None
        self.backing.kept = False
        self.backing.alive = None
