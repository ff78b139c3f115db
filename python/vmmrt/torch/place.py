# SPDX-License-Identifier: LGPL-2.1-or-later
"""Tensors born at their fixed address: the op that allocates a storage the
offload cares about writes it at libvmmrt's address, instead of into the
caching allocator (or a graph pool) for a copy later.

What a pass allocates is seen at the ATen level, below autograd, through a
TorchDispatchMode: every op, in order, and the outputs it allocates (the
returns its schema gives no alias annotation). Discovery records, for each
storage, the op that allocated it: its *birth*, keyed by the op and how many
times the op ran before it in the pass ("aten.mm.default", 7), which stays
put when unrelated ops come between (AccumulateGrad's in-place adds in a
backward that accumulates). A later pass (a capture, an eager offload) gives
that op its output at the fixed address:

- its ``out=`` overload (the one whose other arguments are the op's own),
  with an out tensor over the slot of the discovered shape, strides and
  dtype: the same kernel writes the same bytes, at the slot;
- ``aten._to_copy`` (a dtype or device conversion, which has no such
  overload) and ``aten.clone`` (whose generated overload clones into a
  temporary and copies that) as the ``copy_`` each is, and ``aten.relu``
  (the same) as the ``clamp_min`` it is (:func:`writer`);
- any other op computes as usual and its output is copied into the slot at
  once: the copy stays, but the original is freed at the next op instead of
  living on in the pool until the end of the pass.

A placement that does not fit (the op is not the one discovery saw there,
other shapes, an out overload that refuses the tensor) is skipped: the
output is allocated as usual and the caller copies it as before. Nothing
here changes what is computed: only where the bytes land.

Why this route and not a pluggable allocator in a ``torch.cuda.MemPool``: a
pool's allocator sees segments (rounded up, cached, shared by every tensor
the pool serves), not tensors, so it cannot put one storage at one address
and the next elsewhere; the dispatcher sees exactly the op and the output.
"""
import threading

import torch

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # pragma: no cover - torch < 1.12
    TorchDispatchMode = None

from vmmrt.torch import _compat

AVAILABLE = TorchDispatchMode is not None

_tls = threading.local()


class quiet:
    """Ops made inside are not seen by the modes here: the offload's own hooks
    (a pack that detaches, an unpack that rebuilds a view) run in some passes
    and not others, and must not shift the count of the layer's ops. (Python
    dispatch is turned off for them: torch 1.13 hands a mode the wrapped
    scalars of such ops as Python numbers, which the op then refuses.)"""

    def __enter__(self):
        _tls.quiet = getattr(_tls, "quiet", 0) + 1
        # an RAII guard: dispatch comes back when it is dropped
        self._guard = torch._C._DisableTorchDispatch() if AVAILABLE else None

    def __exit__(self, *exc):
        self._guard = None
        _tls.quiet -= 1


class Birth:
    """The op and output that allocated a storage, and what that output was."""

    __slots__ = ("key", "out", "dtype", "shape", "stride", "offset", "storage_nbytes", "inputs", "placeable")

    def __init__(self, key, out, t, inputs, placeable=True):
        self.key = key                      # (op name, occurrence)
        self.placeable = placeable          # the op returns tensors alone (placeable): else a Mode cannot place it
        self.out = out                      # index among the op's fresh outputs
        self.dtype = t.dtype
        self.shape = tuple(t.shape)
        self.stride = tuple(t.stride())
        self.offset = _compat.storage_offset_bytes(t)
        self.storage_nbytes = _compat.storage_of(t)[1]
        self.inputs = inputs                # the op's tensor arguments: (dtype, shape, strides) each

    def same(self, other):
        return other is not None and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def describe(self):
        return "%s #%d output %d" % (self.key[0], self.key[1], self.out)


def _tensor_signature(args, kwargs, static):
    """What an op was given: each tensor's dtype, shape and strides (an
    elementwise op lays its output out as its inputs), and the address of
    those that never move (parameters, buffers, static inputs: the same op
    applied to another weight is another op), by the token ``static`` (a
    dict by storage address) gives each: a static input moved into its
    layer's slot after discovery keeps the one it had."""
    sig = []
    for a in _tensor_args(args, kwargs):
        strided = a.layout == torch.strided
        ptr = _compat.storage_of(a)[0] if strided and a.device.type != "meta" else None
        sig.append((a.dtype, tuple(a.shape), tuple(a.stride()) if strided else None,
                    static.get(ptr) if ptr is not None else None))
    return tuple(sig)


def _tensor_args(args, kwargs):
    """An op's tensor arguments in the order pytree flattens (args, kwargs):
    an ATen op takes tensors, lists of them and plain values, so a walk of
    the lists does (a pytree flatten costs dozens of Python calls per op,
    and this runs at every op of an eager pass)."""
    out = []
    _collect(args, out)
    if kwargs:
        _collect(kwargs.values(), out)
    return out


def _collect(items, out):
    for a in items:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            _collect(a, out)
        elif isinstance(a, dict):
            _collect(a.values(), out)


def _fresh(func, out):
    """[(k, tensor)]: the outputs func allocated (returns without an alias
    annotation), numbered in return order. ``aten._unsafe_view`` has none
    and allocates nothing: the view matmul makes of its mm's output (a
    Linear over a 3-D input). Taken for a birth, it hid the mm that
    allocated the storage, and the saved output was computed in the pool
    and copied into its slot (two 112 MiB copies a Llama layer a forward:
    the MLP's gate and up projections)."""
    if func is _UNSAFE_VIEW:
        return []
    rets = func._schema.returns
    vals = out if isinstance(out, (tuple, list)) and len(rets) != 1 else (out,)
    res = []
    k = 0
    for r, v in zip(rets, vals):
        items = v if isinstance(v, (tuple, list)) else (v,)
        for t in items:
            if r.alias_info is None and isinstance(t, torch.Tensor) and t.layout == torch.strided:
                res.append((k, t))
            k += 1
    return res


_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default
_OUT = {}
_NAME = {}      # op -> str(op), which formats a string each time
_PLACEABLE = {}  # op -> placeable(op)
_ALIASES = {}    # op -> aliases(op)


def placeable(func):
    """Whether a Mode can place the outputs of ``func``: it returns tensors
    alone. One that returns a list, or numbers beside its tensors (SDPA's
    flash and cuDNN kernels: their output and its statistics with sizes and
    seeds), is run as it is and its outputs stay where it allocated them."""
    ok = _PLACEABLE.get(func)
    if ok is None:
        rets = func._schema.returns
        ok = _PLACEABLE[func] = all(str(r.type) == "Tensor" for r in rets)
    return ok


def aliases(func):
    """Whether ``func``'s outputs may share an input's bytes: a view (its
    return has an alias annotation) or ``aten._unsafe_view``, which has none
    but returns the view matmul makes of its mm's output, with no ``_base``
    to say so."""
    ok = _ALIASES.get(func)
    if ok is None:
        ok = _ALIASES[func] = func is _UNSAFE_VIEW or any(r.alias_info is not None for r in func._schema.returns)
    return ok


def out_overload(func):
    """(the out= overload of func, its out argument names), or None: the overload
    of the same op whose arguments, less its out ones, are func's own, with one
    out tensor per return."""
    if func in _OUT:
        return _OUT[func]
    found = None
    schema = func._schema
    rets = schema.returns
    if rets and all(str(r.type) == "Tensor" for r in rets):
        want = [(a.name, str(a.type)) for a in schema.arguments]
        packet = func.overloadpacket
        for name in packet.overloads():
            op = getattr(packet, name)
            args = op._schema.arguments
            outs = [a.name for a in args if getattr(a, "is_out", False)]
            rest = [(a.name, str(a.type)) for a in args if not getattr(a, "is_out", False)]
            if outs and len(outs) == len(rets) and rest == want:
                found = (op, outs)
                break
    _OUT[func] = found
    return found


_WRITES = {}    # (op, device type) -> writes_at_target(op, device type)


def writes_at_target(func, device_type):
    """Whether ``func``'s out= overload (:func:`out_overload`) writes its out
    tensor with the device's own kernel. PyTorch generates out= overloads
    for functional ops that have none (``autogen``: ``mul.Scalar_out``,
    ``div.Scalar_out``, ``clone.out``): registered for every backend at
    once, they run the functional op into a temporary and copy it into the
    out tensor, which is what placing by a copy costs (a kernel more per
    op), not what placing by out= saves."""
    k = (func, device_type)
    ok = _WRITES.get(k)
    if ok is None:
        found = out_overload(func)
        has = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
        if found is None:
            ok = False
        elif has is None:   # pragma: no cover - a torch without it: trust the overload
            ok = True
        else:
            ok = bool(has(found[0].name(), device_type.upper()))
        _WRITES[k] = ok
    return ok


class Placed:
    """One output to place: the tensor over its fixed address to write it in."""

    __slots__ = ("birth", "target", "how", "why", "at", "copy")

    def __init__(self, birth, target):
        self.birth = birth
        self.target = target
        self.how = None     # "placed" (born there) or "copied" (computed, then copied in) once done
        self.why = None     # why it was copied, or not placed at all
        self.at = None      # the op index (Mode.i) it must be born at, if any (vmmrt.torch.reuse)
        self.copy = True    # without an out= overload: computed, then copied in (else left where it is)


class Mode(TorchDispatchMode if AVAILABLE else object):
    """One pass's ops: records every birth (``births``: storage pointer ->
    :class:`Birth`, the latest at each address; ``by_key``: (op key, output)
    -> :class:`Birth`) and places the outputs of ``targets`` (a list of
    :class:`Placed`). ``known``: a discovery pass's ``by_key``, for the
    outputs of a placed op that are not placed themselves. ``record``
    False: a pass that only places (an eager call's forward or backward)
    keeps no births, and looks at an op's arguments only when it places
    its output: the rest of its ops are counted and run, at the least cost
    per op."""

    def __init__(self, device_type, targets=(), known=None, static=None, record=True, observer=None):
        super().__init__()
        self.device_type = device_type
        # ``observer``: told of every op (vmmrt.torch.reuse's Timeline and
        # Guard): before it, its index and tensor arguments; after it, its
        # key and fresh outputs, and to an observer with ``aliased``, the
        # arguments and outputs of an op whose outputs alias its arguments.
        # The index counts the ops that are not in-place, so that
        # AccumulateGrad's adds leave it as it was.
        self.observer = observer
        self.i = 0
        self.static = {} if static is None else static
        self.record = record
        self.births = {}
        self.by_key = {}
        self.count = {}
        self.known = known or {}
        self.targets = {}
        for p in targets:
            self.targets.setdefault(p.birth.key, []).append(p)
        # a target born at a given op index (Placed.at) needs the index counted too
        self.counting = observer is not None or any(p.at is not None for p in targets)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(_tls, "quiet", 0) > 0:       # inside a quiet (read inline: this runs at every op)
            return func(*args, **kwargs)
        name = _NAME.get(func)
        if name is None:
            name = _NAME[func] = str(func)
        n = self.count.get(name, 0)
        self.count[name] = n + 1
        key = (name, n)
        want = self.targets.get(key)
        obs = self.observer
        if obs is not None:
            obs.before(self.i, _tensor_args(args, kwargs))
        if want is not None and self.counting:
            want = [p for p in want if p.at is None or p.at == self.i] or None
        sig = _tensor_signature(args, kwargs, self.static) if want is not None or self.record else None
        if want is not None:
            out = self._place(func, key, args, kwargs, want, sig)
        else:
            out = func(*args, **kwargs)
        if isinstance(out, (bool, int, float, complex)) and len(func._schema.returns) == 1 and \
                str(func._schema.returns[0].type) == "Tensor":
            out = _rewrap(func, args, kwargs, out)
        fresh = _fresh(func, out) if obs is not None or self.record else ()
        if obs is not None:
            obs.after(self.i, key, func, fresh)
            if aliases(func) and hasattr(obs, "aliased"):
                obs.aliased(_tensor_args(args, kwargs), out)
        if self.counting and not func._schema.is_mutable:
            self.i += 1
        if not self.record:
            return out
        for k, t in fresh:
            if t.device.type == self.device_type:
                ptr = _compat.storage_of(t)[0]
                if ptr:
                    b = Birth(key, k, t, sig, placeable(func))
                    self.births[ptr] = b
                    self.by_key[(key, k)] = b
        return out

    def _place(self, func, key, args, kwargs, want, sig):
        if not placeable(func):
            for p in want:
                p.why = "%s returns more than tensors" % name_of(func)
            return func(*args, **kwargs)
        for p in want:
            if p.birth.inputs != sig:
                p.why = "%s saw other inputs than at discovery" % p.birth.describe()
                return func(*args, **kwargs)
        write = writer(func, kwargs)
        if write is not None and len(want) == 1 and want[0].birth.out == 0 \
                and tuple(args[0].shape) == tuple(want[0].target.shape):
            p = want[0]
            tg, p.target = p.target, None
            write(tg, args, kwargs)
            p.how, p.why = "placed", None
            return tg
        by_out = {p.birth.out: p for p in want}
        found = out_overload(func)
        if found is not None:
            op, names = found
            outs = {}
            for k, nm in enumerate(names):
                p = by_out.get(k)
                if p is not None:
                    outs[nm] = p.target
                    continue
                b = self.known.get((key, k))
                if b is None:
                    outs = None
                    break
                # an output left where the op would put it: allocated as the op would
                outs[nm] = torch.empty_strided(b.shape, b.stride, dtype=b.dtype, device=want[0].target.device)
            if outs is not None:
                try:
                    res = op(*args, **kwargs, **outs)
                except Exception as e:  # a refused out tensor (resize, layout): allocate as usual
                    for p in want:
                        p.why = "%s: out= refused: %s" % (p.birth.describe(), str(e).splitlines()[0][:120])
                    return func(*args, **kwargs)
                for p in want:
                    p.how, p.why = "placed", None
                    p.target = None     # the op's output now: no other reference (AccumulateGrad may take it)
                return res
        out = func(*args, **kwargs)
        fresh = dict(_fresh(func, out))
        vals = list(out) if isinstance(out, (tuple, list)) else None
        for p in want:
            if not p.copy:
                p.why = "%s has no out= variant" % name_of(func)
                continue
            t = fresh.get(p.birth.out)
            tg = p.target
            if t is None or t.dtype != tg.dtype or tuple(t.shape) != tuple(tg.shape) or \
                    tuple(t.stride()) != tuple(tg.stride()):
                p.why = "%s produced another tensor than at discovery" % p.birth.describe()
                continue
            tg.copy_(t)
            p.target = None
            p.how, p.why = "copied", "%s has no out= variant" % name_of(func)
            if vals is None:
                out = tg
            else:
                vals[p.birth.out] = tg
        if vals is not None:
            out = tuple(vals) if isinstance(out, tuple) else vals
        return out


def _rewrap(func, args, kwargs, out):
    """torch 1.13 hands an op of a wrapped number (a Python scalar autograd
    saved) back from Python dispatch as the number, which the dispatcher
    then refuses where a tensor is due: run it as a method, out of sight."""
    src = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if src is None:
        return out
    with quiet():
        if name_of(func) in ("aten.detach", "aten.alias"):
            return src.detach()
        return torch.tensor(out, dtype=src.dtype, device=src.device)


def name_of(func):
    return str(func).rsplit(".", 1)[0]


def _copy_into(target, args, kwargs):
    target.copy_(args[0])


def _clamp_min_into(target, args, kwargs):
    _CLAMP_MIN_OUT(args[0], 0, out=target)


def _safe_softmax_into(target, args, kwargs):
    """aten._safe_softmax (what sdpa's math backend saves for its backward)
    has no out= overload; PyTorch computes it, on every device, as softmax,
    then where(every input of the row is -inf, 0, softmax). The same ops
    here, the last one by its out= kernel at the target: the same bits, and
    no copy of the attention's probabilities (32 heads x seq^2 a layer a
    forward: 64 MiB at seq 1024, bf16)."""
    x, dim = args[0], args[1]
    dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
    out = torch.softmax(x, dim, dtype=dtype)
    neg_inf = torch.scalar_tensor(float("-inf"), dtype=out.dtype, device=out.device)
    rows = torch.all(x.eq(neg_inf), dim, keepdim=True)
    zero = torch.scalar_tensor(0.0, dtype=out.dtype, device=out.device)
    _WHERE_OUT(rows, zero, out, out=target)


_TO_COPY = torch.ops.aten._to_copy.default
_CLAMP_MIN_OUT = torch.ops.aten.clamp_min.out
# Ops whose out= overload is missing or PyTorch's generated one (the op into
# a temporary, then a copy of it), written at the target by what they are:
# clone (on 8 Llama-3-8B layers repeat_interleave's k and v, two 32 MiB
# copies a layer a forward, H100) and _to_copy by a copy_, relu by the
# clamp_min(self, 0) PyTorch computes it as (the encoder's 128 MiB FFN
# activation a layer a forward), _safe_softmax by the ops it is (math
# attention's probabilities: mode none ran 1.046x torch graphs' time on the
# launch-bound layers, H100), bit for bit.
_WHERE_OUT = torch.ops.aten.where.self_out
_WRITERS = {torch.ops.aten.clone.default: _copy_into, torch.ops.aten.relu.default: _clamp_min_into}
if hasattr(torch.ops.aten, "_safe_softmax") and \
        torch._C._dispatch_has_kernel_for_dispatch_key("aten::_safe_softmax", "CompositeExplicitAutograd") and \
        not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_safe_softmax", "CUDA"):
    # (only where it is that composite: a kernel of its own could round otherwise)
    _WRITERS[torch.ops.aten._safe_softmax.default] = _safe_softmax_into


def writer(func, kwargs):
    """How a placement writes the single output of ``func`` into its target
    (``write(target, args, kwargs)``, the op's own) where not through its out=
    kernel, or None. The target has the strides discovery saw the op give
    its output; a _to_copy only on the same device with no pinned or
    non-default memory format request."""
    if func is _TO_COPY:
        plain = not kwargs.get("pin_memory") and kwargs.get("memory_format") in (None, torch.preserve_format)
        return _copy_into if plain else None
    return _WRITERS.get(func)


def tensor_over(base, dtype, shape, stride, offset_bytes):
    """A tensor (not a view: autograd sees a fresh tensor, as an op's output)
    over base's storage: dtype, shape and strides, offset_bytes from base's
    first byte. base is a 1-D tensor over a slot."""
    return _compat.tensor_over(base, dtype, shape, stride, offset_bytes)
