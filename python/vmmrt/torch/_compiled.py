# SPDX-License-Identifier: LGPL-2.1-or-later
"""torch.compile'd callables: their saved tensors reached after the forward.

Dynamo does not run a compiled frame while a TorchDispatchMode is active, nor
while saved-tensor hooks it has to trace are: it runs the frame's Python
instead, op by op (torch 2.11: the layer's eager kernels, other numerics and
eager's speed). The passes of an ordinary layer run under both (the pack and
unpack of :mod:`vmmrt.torch.saved`, and :mod:`vmmrt.torch.place`'s mode), so
a compiled layer graphed by them would capture its uncompiled self: on the
H200, 4 compiled Llama-3-8B layers came out 1.5e-2 off the compiled layer's
gradients (none bitwise) at 1.37x its time.

For a compiled callable the forward therefore runs with neither. Its saved
tensors are then still reachable, one by one, from the autograd nodes the
forward made (a CompiledFunctionBackward holds what the compiled graph saved,
as ``_raw_saved_tensors``; eager nodes between graph breaks hold theirs as
``_raw_saved_<name>``): each gets the same pack and unpack as per-tensor hooks
(``SavedTensor.register_hooks``, whose pack runs at once). So what moves, the
checks and the restores are those of any other layer; what changes is that no
saved tensor is born at its fixed address (the compiled code allocates its
own buffers; they are copied into the slot at the end of the pass), and the
order of the saved tensors is the nodes' (outputs first, depth first), not
the order the forward saved them in, the same at every pass.
"""
import torch

try:
    from torch._dynamo.eval_frame import OptimizedModule
except ImportError:  # torch < 2.0: nothing is compiled
    OptimizedModule = None

_RAW = "_raw_saved_"
# why a compiled layer's saved tensors are copied into their slots, not born there
UNSEEN = "torch.compile'd: its code allocates its own buffers, out of sight"


def is_compiled(fn):
    """Whether fn is, or holds, something torch.compile made: an
    OptimizedModule (torch.compile(module)), a module with one among its
    submodules, or a function torch.compile wrapped."""
    if OptimizedModule is None:
        return False
    if isinstance(fn, torch.nn.Module):
        return any(isinstance(m, OptimizedModule) for m in fn.modules())
    return getattr(fn, "_torchdynamo_orig_callable", None) is not None


def _nodes(outputs, stop):
    """The autograd nodes reachable from outputs' grad_fn, depth first from
    the first output, not past the nodes in stop (the inputs' own)."""
    stack = [o.grad_fn for o in reversed(outputs) if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    seen, order = set(), []
    while stack:
        n = stack.pop()
        if n is None or n in seen or n in stop:
            continue
        seen.add(n)
        order.append(n)
        stack.extend(f for f, _ in reversed(n.next_functions) if f is not None)
    return order


def saved_tensors(outputs, inputs=()):
    """The raw saved tensors (torch._C._autograd.SavedTensor) of the nodes a
    forward made, from its outputs back to its inputs, in a fixed order."""
    stop = {x.grad_fn for x in inputs if isinstance(x, torch.Tensor) and x.grad_fn is not None}
    out = []
    for n in _nodes(outputs, stop):
        for name in sorted(a for a in dir(n) if a.startswith(_RAW)):
            v = getattr(n, name)
            for s in (v if isinstance(v, (tuple, list)) else (v,)):
                if s is not None and hasattr(s, "register_hooks"):
                    out.append(s)
    return out


def attach(rec, outputs, inputs=()):
    """Hand every tensor the forward saved to rec's pack (now) and unpack (in
    the backward), as saved_tensors_hooks would have."""
    for s in saved_tensors(outputs, inputs):
        try:
            s.register_hooks(rec.pack, rec.unpack)
        except RuntimeError as e:
            # an undefined tensor (an optional argument not given) holds
            # nothing; SavedTensor says so only by refusing
            if "value None" not in str(e):
                raise
