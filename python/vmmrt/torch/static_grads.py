# SPDX-License-Identifier: LGPL-2.1-or-later
"""The gradients of the graphs that do not map them (vmmrt.torch.grads):
grads="static", torch's contract (static buffers of the pool, handed to
autograd), and grads="accumulate" (the backward graph adds into one
preallocated .grad per parameter)."""
import torch


class Aliases:
    """(parameter, its static gradient buffer, the slot under it or None) of
    every grads="static" runner, and whether a backward of one ran since the
    last :func:`unalias` (``dirty``): only AccumulateGrad, after such a
    backward, makes a .grad that is a buffer, so a forward with none since
    has nothing to look at (the check walks every runner's parameters)."""

    __slots__ = ("items", "dirty")

    def __init__(self, items):
        self.items = tuple(items)
        self.dirty = bool(self.items)

    def __iter__(self):
        return iter(self.items)


def unalias(aliases):
    """AccumulateGrad keeps a static gradient buffer itself as .grad when .grad
    was None (a tensor it may steal). The next replay of ANY graph may write
    that buffer: the pool hands the blocks of tensors freed after a forward
    capture (the saved originals, once copied to their fixed addresses) to
    later captures, so a backward graph's static buffer can share memory with
    an earlier forward graph's intermediates. So before a forward replays,
    every .grad that is still such a buffer becomes a copy of its own. A
    buffer in a gradient slot (pinned) must be mapped by the time the copy is
    enqueued, which the driver checks then (a map on the stream may not be
    made yet: the H200 said "invalid argument")."""
    for p, sg, b in aliases:
        g = p.grad
        if g is not None and g.data_ptr() == sg.data_ptr():
            if b is not None:
                b.ensure()
            p.grad = g.clone()
    if isinstance(aliases, Aliases):
        aliases.dirty = False


def prepare_accumulate(runners):
    """grads="accumulate": each parameter's .grad is one preallocated tensor,
    outside the graph pool, that the backward graph adds into (one per
    parameter, whichever microbatch's runner adds into it)."""
    accs = {}
    for r in runners:
        for p in r.params:
            if not p.requires_grad or id(p) in accs:
                continue
            if getattr(p, "_post_accumulate_grad_hooks", None) or getattr(p, "_backward_hooks", None):
                raise ValueError("layer %r: a parameter has gradient hooks, which grads='accumulate' would skip "
                                 "(the backward graph writes .grad itself); use grads='static'" % r.name)
            acc = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
            p.grad = acc
            accs[id(p)] = acc
        r.acc = tuple(accs[id(p)] if p.requires_grad else None for p in r.params)


def backward_accumulate(r, need, gos):
    """The backward with parameters' AccumulateGrad inside the capture: with
    .grad defined, it is an in-place add (captured), and each temporary
    gradient is freed as soon as it is added."""
    inputs = [x for x in r.sample if x.requires_grad]
    kept = [x.grad for x in inputs]
    for x in inputs:
        x.grad = None
    wrt = inputs + [p for p in r.params if p.requires_grad]
    torch.autograd.backward(need, gos, inputs=wrt, retain_graph=r.retain_graph)
    res = []
    for x, old in zip(inputs, kept):
        res.append(x.grad)
        x.grad = old
    return tuple(res) + (None,) * (len(wrt) - len(inputs))
