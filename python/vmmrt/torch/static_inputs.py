# SPDX-License-Identifier: LGPL-2.1-or-later
"""The graphs' static inputs in the layer's resident slot, so that they live
from the layer's forward to its backward, as eager holds a layer's input.

torch.cuda.make_graphed_callables replays each forward graph over the sample
arguments it was given: they are the graph's static inputs, every call copies
its arguments into them, and the graphs hold them for their life. A chain of
L layers then holds L layer inputs at every moment of the step (on 8
Llama-3-8B layers at seq 4096, 32 MiB each: 256 MiB), where eager holds layer
i's input only from layer i-1's forward to layer i's backward (a tensor
layer i saved). Here each sample tensor is replaced, before the captures, by
a tensor at the end of the layer's resident slot
(LayerOffload.plan_resident): mapped before the forward, released after the
backward, on the memory plan's pages with the resident regions' life. A call
copies its argument in once the slot is mapped (vmmrt.torch._call). The
caller's sample tensors are not held once the callables are built.

Only for a layer with a resident slot of saved regions (mode "none", or
what a plan keeps), and for a recomputed layer (vmmrt.torch.recompute),
whose slot holds its inputs alone: its checkpoint, which its backward graph
runs the forward again from (held for the graphs' life, 8 layers of 32 MiB
on Llama-3-8B at seq 4096 would sit beside the optimizer step's
temporaries). In ping-pong a recomputed layer's, and those of a layer whose
saved regions all move (it has no resident slot), go in its group instead,
and leave the device with the bank between its forward and its backward
(LayerOffload.inputs_move); a call copies its arguments in after the
forward's begin hook, when the bank is free (in the library's one call:
vmmrt_group_replay_copies). Not
for a pipeline's runners (the slot's life is one forward to one
backward), a sample that is not a contiguous strided tensor, samples that
share storage (an in-place op on one shows in the other inside the graph),
nor without graphs (there are no static inputs then).
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from vmmrt.torch import _address, _compat

log = logging.getLogger("vmmrt.torch")


def sizes(sample: Sequence[torch.Tensor]) -> tuple:
    """Per sample tensor, the bytes it takes in the resident slot, or None
    where it stays the caller's tensor."""
    ptrs = [_compat.storage_of(t)[0] for t in sample if t.numel()]
    shared = {p for p in ptrs if ptrs.count(p) > 1}
    out = []
    for t in sample:
        ok = (t.layout == torch.strided and t.numel() and t.is_contiguous()
              and not t.is_sparse and _compat.storage_of(t)[0] not in shared)
        out.append(t.numel() * t.element_size() if ok else None)
    return tuple(out)


def place(r: Any) -> None:
    """After the allocation (the resident slot mapped), before the captures:
    runner ``r``'s sample tensors that its layer planned in the slot
    (``input_at``) replaced by tensors over it, with the sample's values and
    requires_grad, everywhere the runner keeps them (its sample, its sample
    arguments and keywords), and the layer's static storages told (each
    moved one under the token discovery's signatures name it by)."""
    lay = r.layer
    if lay.input_addrs is not None:
        addrs = lay.input_addrs
    elif lay.input_at is not None and lay.resident is not None:
        addrs = [None if at is None else lay.resident.address + at for at in lay.input_at]
    else:
        return
    new, moved = {}, []
    for t, addr in zip(r.sample, addrs):
        if addr is None:
            continue
        nbytes = t.numel() * t.element_size()
        # A storage of its own at its address (not a view of the slot): the
        # layer's saved tensors are told from its static ones by storage.
        raw = _address.tensor_at(addr, nbytes, torch.uint8, lay.offload.device)
        s = _compat.tensor_over(raw, t.dtype, t.shape, t.stride(), 0)
        with torch.no_grad():
            s.copy_(t)
        s.requires_grad_(t.requires_grad)
        new[id(t)] = s
        moved.append((_compat.storage_of(t)[0], addr))
    if not new:
        return
    r.sample = tuple(new.get(id(t), t) for t in r.sample)
    leaves, spec = _compat.tree_flatten((tuple(r.sample_args), [r.sample_kwargs[k] for k in r.kw_keys]))
    args, kw = _compat.tree_unflatten([new.get(id(a), a) for a in leaves], spec)
    r.sample_args = tuple(args)
    r.sample_kwargs = dict(zip(r.kw_keys, kw))
    static = dict(lay.static)
    for old, new_ptr in moved:
        static[new_ptr] = static.pop(old, old)
    lay.static = static


def in_slot(lay: Any) -> int:
    """Bytes of the layer's static inputs in its resident slot."""
    if lay.input_at is None:
        return 0
    return sum(n for n, at in zip(lay.input_bytes, lay.input_at) if at is not None)
