# SPDX-License-Identifier: LGPL-2.1-or-later
"""What the graphed and the eager paths share: the callables, their argument
surfaces, and the warm-up passes that are also discovery.

The checks follow torch.cuda.make_graphed_callables, so a callable accepted
there is accepted here, and one refused there is refused with the same
reason; every error names the callable.
"""
import operator
import time

import torch

from vmmrt import Error, _capi
from vmmrt.torch import _compat, _contracts, grads, place, planner, reuse


class Runner:
    """One callable: its function, parameters, sample arguments and layer.

    Every attribute is declared here, with what sets it: the graphed, eager
    and recomputing paths (graphed.py, eager.py, recompute.py) fill them in as
    the callable is graphed; none is added from outside."""

    def __init__(self, index, fn, sample_args, name, sample_kwargs=None, callable_index=None, microbatch=None):
        self.index = index
        self.callable_index = index if callable_index is None else callable_index  # its callable (order=: a layer)
        self.microbatch = microbatch    # its microbatch under order= (None without)
        self.fn = fn
        self.module = fn if isinstance(fn, torch.nn.Module) else None
        self.name = name
        leaves, _ = _compat.tree_flatten(tuple(sample_args))
        for k, a in enumerate(leaves):
            if not isinstance(a, torch.Tensor):
                raise TypeError("%s: sample argument %d is a %s; sample_args may only hold tensors "
                                "(as for torch.cuda.make_graphed_callables)" % (name, k, type(a).__name__))
        if sample_kwargs is None:
            sample_kwargs = {}
        if not isinstance(sample_kwargs, dict) or not all(isinstance(k, str) for k in sample_kwargs):
            raise TypeError("%s: sample_kwargs must be a dict of keyword arguments per callable, not %s"
                            % (name, type(sample_kwargs).__name__))
        # A call's inputs are (args, kwargs) flattened, the keywords in the
        # sample's order: tensors are the graph's inputs; other leaves (None,
        # flags) are constants of the capture, held to the sample's values.
        self.kw_keys = tuple(sample_kwargs)
        leaves, self.in_spec = _compat.tree_flatten((tuple(sample_args), [sample_kwargs[k] for k in self.kw_keys]))
        self.in_consts = {k: a for k, a in enumerate(leaves) if not isinstance(a, torch.Tensor)}
        self.n_leaves = len(leaves)
        self.sample = tuple(a for a in leaves if isinstance(a, torch.Tensor))
        # what check_args compares a call's tensors with, read off the sample once
        self._arg_sig = tuple((a.shape, a.dtype, a.device, a.requires_grad) for a in self.sample)
        self.sample_args = tuple(sample_args)
        self.sample_kwargs = dict(sample_kwargs)
        self.out_consts = {}
        self.n_out = 0              # the forward's output leaves (split_outputs)
        self._out_plain = None      # "tensor" or "tuple" when the output is one of those (split_outputs)
        self.params = tuple(self.module.parameters()) if self.module is not None else ()
        # What the graphs and the offload's record of what stays hold on to:
        # each parameter's object and address (see check_params).
        self.param_names = tuple(n for n, _ in self.module.named_parameters()) if self.module is not None else ()
        self.param_ptrs = tuple(q.data_ptr() for q in self.params)
        self._param_slots = _param_slots(self.module) if self.module is not None else ()
        self.buffers = tuple(self.module.buffers()) if self.module is not None else ()
        self.layer = None
        self.out_spec = None
        self.orig_forward = None
        self.training = self.module.training if self.module is not None else True
        self.grads_seen = []        # grads.Seen of the warm-up backwards that recorded births
        self.grads = None           # grads.Grads (grads="mapped"), shared by a callable's runners
        self.generators = ()        # CUDA generators registered with each of its graphs
        self.retain_graph = False   # backward captured with retain_graph (retain_graph_in_backward)
        self._arg_names = None      # its arguments' names for messages (_contracts.describe_argument)
        # The budget's choice (graphed.py): forward run again in the backward (recompute.py).
        self.recompute = False
        self.recompute_rng = None   # the generators' states at the forward, for recomputation (recompute.py)
        # What the graphs replay over (graphed.py; recompute.py for a recomputed runner):
        self.static_outputs = None        # the forward graph's outputs
        self.static_grad_outputs = None   # where the backward graph reads the outputs' gradients
        self.gouts_in_slot = False        # grads="mapped": those lie in the gradients' io slot (filled once it is mapped)
        self.gin_where = None             # grads="mapped": per argument, where its gradient lies in the io slot
        self.static_grad_inputs = None    # the backward graph's gradients of surface (None where none)
        self.grad_mode = None             # how parameter gradients reach .grad: "mapped", "static", "accumulate"
        self.acc = None                   # grads="accumulate": the .grad tensors the backward graph adds into
        self.acc_grad_inputs = None       # grads="accumulate": the sample's gradients added into in the graph
        self.acc_shared = False           # grads="accumulate": those share the static gradients' memory
        self.pinned_grads = None          # a gradient slot kept mapped under static buffers in it
        self.pinned_io = None             # its io slot, with it
        self.pinned_outs = None           # and its output gradients' slot
        self.pending = False              # its forward ran and its backward has not (_call.py)

    @property
    def n_user(self):
        return len(self.sample)

    @property
    def surface(self):
        """Every input of the graph that may need a gradient: user args, then parameters."""
        return self.sample + self.params

    def flatten_call(self, args, kwargs):
        """The tensors of a call, as the graph takes them: its arguments and the
        keyword arguments the sample had, flattened as the sample was; the
        other leaves must be the sample's. ``is_first_microbatch`` (which
        TransformerEngine's graphed callables take for FP8 weight caching) is
        accepted and has no effect."""
        if not kwargs and not self.kw_keys and not self.in_consts:
            for a in args:           # (a loop, not all() over a generator: a Python call per argument)
                if type(a) is not torch.Tensor and not isinstance(a, torch.Tensor):
                    break
            else:
                return list(args)    # flat tensors, as pytree would flatten them (the common call)
        where = "layer %r" % self.name
        kwargs = {k: v for k, v in kwargs.items() if k != "is_first_microbatch" or k in self.kw_keys}
        missing = [k for k in self.kw_keys if k not in kwargs]
        extra = [k for k in kwargs if k not in self.kw_keys]
        if missing or extra:
            raise Error(_capi.E_MISMATCH, "called with keyword arguments %s where the sample_kwargs had %s%s: the "
                        "graph takes the sample's keywords, each every time" % (
                            sorted(kwargs) or "none", list(self.kw_keys) or "none",
                            " (missing %s)" % ", ".join(missing) if missing else
                            " (not in the sample: %s)" % ", ".join(extra)), where)
        leaves, spec = _compat.tree_flatten((tuple(args), [kwargs[k] for k in self.kw_keys]))
        if not self.in_consts and not self.kw_keys:
            return leaves            # positional only: check_args says what differs
        if spec != self.in_spec:
            raise Error(_capi.E_MISMATCH, "the arguments' structure %s differs from the sample's %s" % (spec, self.in_spec),
                        where)
        out = []
        for k, a in enumerate(leaves):
            if k in self.in_consts:
                c = self.in_consts[k]
                if isinstance(a, torch.Tensor) or not (a is c or _same_constant(a, c)):
                    raise Error(_capi.E_MISMATCH, "%s is %s where the sample's was %s: a value that is not a tensor "
                                "is part of the capture (capture again for another value)"
                                % (self._leaf_name(k), _short(a), _short(c)), where)
            else:
                out.append(a)
        return out

    def _leaf_name(self, k):
        """Which argument leaf k is, for messages: 'argument 1' or 'keyword rotary_pos_emb'."""
        n_args = len(_compat.tree_flatten(self.sample_args)[0])
        if k < n_args:
            return "argument %d" % k
        for key in self.kw_keys:
            n = len(_compat.tree_flatten(self.sample_kwargs[key])[0])
            if k - n_args < n:
                return "keyword %s" % key
            n_args += n
        return "argument %d" % k

    def split_outputs(self, out):
        """The tensors of a forward's output (the graph's outputs); its other
        leaves (a None beside the hidden states, as Megatron's layers return)
        are remembered and given back by join_outputs."""
        leaves, self.out_spec = _compat.tree_flatten(out)
        self.out_consts = {k: o for k, o in enumerate(leaves) if not isinstance(o, torch.Tensor)}
        self.n_out = len(leaves)
        # The common outputs, joined at every call without pytree: a tensor,
        # or a plain tuple of tensors.
        self._out_plain = ("tensor" if isinstance(out, torch.Tensor) else
                           "tuple" if type(out) is tuple and all(isinstance(o, torch.Tensor) for o in out) else None)
        return [o for o in leaves if isinstance(o, torch.Tensor)]

    def join_outputs(self, tensors):
        if self._out_plain == "tensor":
            return tensors[0]
        if self._out_plain == "tuple":
            return tuple(tensors)
        it = iter(tensors)
        leaves = [self.out_consts[k] if k in self.out_consts else next(it) for k in range(self.n_out)]
        return _compat.tree_unflatten(leaves, self.out_spec)

    def check_args(self, leaves, grad=True):
        """The arguments of a call must match the sample's: a graph cannot take
        others (and, with grad, the tensors saved depend on which need one)."""
        sig = self._arg_sig
        if len(leaves) == len(sig):
            # (the sample's properties read once, compared by identity where
            # they are singletons: this runs at every call)
            for a, (shape, dt, dev, rg) in zip(leaves, sig):
                if not isinstance(a, torch.Tensor) or (grad and a.requires_grad is not rg) or a.shape != shape or \
                        a.dtype is not dt or a.device != dev:
                    break
            else:
                return
        if len(leaves) != len(self.sample):
            raise Error(_capi.E_MISMATCH, "called with %d tensor arguments, the sample had %d"
                        % (len(leaves), len(self.sample)), "layer %r" % self.name)
        for k, (a, s) in enumerate(zip(leaves, self.sample)):
            if not isinstance(a, torch.Tensor):
                raise Error(_capi.E_MISMATCH, "%s is a %s, the sample's is a tensor"
                            % (_contracts.describe_argument(self, k), type(a).__name__), "layer %r" % self.name)
            if grad and a.requires_grad != s.requires_grad:
                raise Error(_capi.E_MISMATCH, "%s has requires_grad=%s where the sample's has %s: the "
                            "sample arguments must require gradients exactly as the real ones do"
                            % (_contracts.describe_argument(self, k), a.requires_grad, s.requires_grad),
                            "layer %r" % self.name)
            if a.shape != s.shape or a.dtype != s.dtype or a.device != s.device:
                raise _contracts.mismatch(self, k, a, s)

    def check_params(self):
        """The module's parameters must still be the tensors it was graphed with,
        at the same addresses: the graphs replay over those addresses, the
        autograd node hands gradients to those objects, and the offload keeps
        their storages on the device. A wrapper or call that replaces or
        re-allocates parameters afterwards (FSDP and fully_shard, which swap in
        sharded and unsharded parameters and free and re-allocate the
        unsharded storage around each layer; model.to(), .half(); a new
        nn.Parameter) would leave the graphs reading stale memory and the
        gradients going nowhere: refused. DDP keeps the parameters in place."""
        if self.module is None:
            return
        if _params_unchanged(self._param_slots, self.params, self.param_ptrs):
            return
        now = tuple(self.module.parameters())
        why = None
        if len(now) != len(self.params):
            why = "it has %d parameters, it was graphed with %d" % (len(now), len(self.params))
        else:
            for k, (a, b, ptr) in enumerate(zip(now, self.params, self.param_ptrs)):
                if a is not b:
                    why = "parameter %d (%s) is another tensor than the one it was graphed with" % (
                        k, self.param_names[k])
                    break
                if a.data_ptr() != ptr:
                    why = "parameter %d (%s) moved from 0x%x to 0x%x since it was graphed" % (
                        k, self.param_names[k], ptr, a.data_ptr())
                    break
        if why is not None:
            raise Error(_capi.E_MISMATCH, "%s: the graphs replay over the parameters' addresses as they were at "
                        "make_graphed_callables, and gradients go to those tensors; a wrapper or call that replaces "
                        "or re-allocates parameters afterwards is not supported (FSDP / fully_shard, model.to(), "
                        ".half(), assigning a new nn.Parameter); DistributedDataParallel keeps them and works"
                        % why, "layer %r" % self.name)

    def call(self, leaves):
        """Run the callable itself (a module's own forward once it was replaced)
        on the graph's input tensors, with the sample's constants."""
        it = iter(leaves)
        full = [self.in_consts[k] if k in self.in_consts else next(it) for k in range(self.n_leaves)]
        args, kw = _compat.tree_unflatten(full, self.in_spec)
        return (self.orig_forward or self.fn)(*args, **dict(zip(self.kw_keys, kw)))


def _param_slots(module):
    """Where each of a module's parameter dicts is, and how many entries it has:
    (the dicts with their sizes, then per parameter (its dict, its name in it)),
    in named_parameters' order, so that a call checks its parameters without
    walking the module tree (Runner.check_params)."""
    owners = {}
    dicts, leaves = [], []
    for name, _ in module.named_parameters():
        path, _, leaf = name.rpartition(".")
        sub = module.get_submodule(path) if path else module
        owners[id(sub._parameters)] = sub._parameters
        dicts.append(sub._parameters)
        leaves.append(leaf)
    return tuple((d, len(d)) for d in owners.values()), tuple(dicts), tuple(leaves)


_get = dict.get
_data_ptr = torch.Tensor.data_ptr


def _params_unchanged(slots, params, ptrs):
    """True when every parameter is still the object graphed, in its module's
    dict, at the address graphed, and no dict gained or lost one. A change is
    then described by the full walk in check_params (a parameter added in a
    submodule added since is seen by neither: the graphs never read it)."""
    if not slots:
        return False
    sizes, dicts, leaves = slots
    for d, n in sizes:
        if len(d) != n:
            return False
    # (maps of C functions: a call per parameter without a Python frame,
    # which the launch-bound layers' cProfile counted, ten per call)
    return all(map(operator.is_, map(_get, dicts, leaves), params)) and tuple(map(_data_ptr, params)) == ptrs


def _same_constant(a, b):
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def _short(v):
    if isinstance(v, torch.Tensor):
        return "a tensor"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def default_name(i, fn):
    kind = type(fn).__name__ if isinstance(fn, torch.nn.Module) else getattr(fn, "__name__", "callable")
    return "%d:%s" % (i, kind)


def prepare(callables, sample_args, names, layout=None, sample_kwargs=None):
    """(just_one, runners), with torch.cuda.make_graphed_callables' checks.

    With a pipeline ``layout`` (:class:`vmmrt.torch.pipeline.Layout`), as
    TransformerEngine's ``_order``: one runner per (layer, microbatch), in its
    layout, each named after its layer and microbatch ("2:Block/mb1")."""
    _contracts.check_callables(callables)
    just_one = not isinstance(callables, tuple)
    if just_one:
        if layout is not None:
            raise TypeError("order= takes a tuple of callables (the layers of every chunk)")
        callables, sample_args = (callables,), (sample_args,)
    n = len(callables) if layout is None else layout.n_runners
    if len(sample_args) != n:
        if layout is None:
            raise ValueError("%d callables but %d sample argument tuples" % (len(callables), len(sample_args)))
        raise ValueError("%d sample argument tuples for %d layers x %d microbatches: with order=, one per layer "
                         "and microbatch (chunk-major, then microbatch, then layer, as TransformerEngine's "
                         "_order)" % (len(sample_args), len(callables), layout.microbatches))
    if sample_kwargs is not None:
        if just_one:
            sample_kwargs = (sample_kwargs,)
        if not isinstance(sample_kwargs, (tuple, list)) or len(sample_kwargs) != len(sample_args):
            raise ValueError("sample_kwargs: one dict per sample argument tuple (%d), got %s" % (
                len(sample_args), "%d" % len(sample_kwargs) if isinstance(sample_kwargs, (tuple, list))
                else "a %s" % type(sample_kwargs).__name__))
    if names is not None and len(names) != len(callables):
        raise ValueError("%d names for %d callables" % (len(names), len(callables)))
    _contracts.distinct_callables(callables, names)
    layer_names = []
    for i, c in enumerate(callables):
        name = names[i] if names is not None else default_name(i, c)
        layer_names.append(name)
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise ValueError("%s: modules must not have hooks registered at the time they are passed "
                                 "(registering hooks after make_graphed_callables is allowed)" % name)
            if any(b.requires_grad for b in c.buffers()):
                raise ValueError("%s: only parameters may be trainable; every buffer must have "
                                 "requires_grad=False" % name)
    runners = []
    for i, args in enumerate(sample_args):
        k, mb = i, None
        if layout is not None:
            _, mb, _, k = layout.where(i)
        name = layer_names[k] if mb is None else "%s/mb%d" % (layer_names[k], mb)
        if not isinstance(args, tuple):
            raise TypeError("%s: sample_args must be a tuple of tensors per callable" % name)
        r = Runner(i, callables[k], args, name, None if sample_kwargs is None else sample_kwargs[i], k, mb)
        runners.append(r)
    return just_one, runners


class _Timer:
    """Device time of a region of work on the current stream (wall time on CPU)."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __enter__(self):
        if self.cuda:
            self.e0 = torch.cuda.Event(enable_timing=True)
            self.e1 = torch.cuda.Event(enable_timing=True)
            self.e0.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.e1.record()
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3

    def elapsed(self):
        if self.cuda:
            self.e1.synchronize()
            return self.e0.elapsed_time(self.e1)
        return self.ms


# Warm-up passes that record what each op allocates (vmmrt.torch.place): two,
# so that what they saw can be compared.
RECORDING_PASSES = 2


def warmup(runners, iters, allow_unused_input):
    """The warm-up passes of every callable, each one a discovery pass: the
    forward under the layer's recording hooks, then its gradients, as
    make_graphed_callables warms up. Runs on the caller's current stream (a
    side stream, on CUDA).

    The first passes also record every op (vmmrt.torch.place: which op
    allocates each saved tensor and each parameter's gradient), which costs
    Python time per op; the forward and backward times the planner reads come
    from the passes after them (at least two: the first after the recording
    ones still runs slower)."""
    recording = min(max(1, iters), RECORDING_PASSES)
    passes = recording + max(2, max(1, iters) - recording)
    for r in runners:
        cuda = r.layer.offload.device_type == "cuda"
        static = r.layer.static
        for i in range(passes):
            record = i < recording and place.AVAILABLE
            with _Timer(cuda) as tf, planner.working(r.layer, False):
                with r.layer.discovering(record, r.sample) as p:
                    out = r.call(r.sample)
                    p.outputs = out
            outputs = r.split_outputs(out)
            need = tuple(o for o in outputs if o.requires_grad)
            wrt = tuple(i for i in r.surface if i.requires_grad)
            with _Timer(cuda) as tb, planner.working(r.layer, True):
                if need and wrt:
                    # (made before the mode: the op indices of the backward are the capture's)
                    gos = tuple(torch.empty_like(o) for o in need)
                    tl = reuse.timeline_for(p.mode) if record else None
                    mode = place.Mode(r.layer.offload.device_type, static=static, observer=tl) if record else None
                    if mode is not None:
                        mode.__enter__()
                    try:
                        res = torch.autograd.grad(need, wrt, gos, only_inputs=True, allow_unused=allow_unused_input)
                    finally:
                        if mode is not None:
                            mode.__exit__(None, None, None)
                    if mode is not None:
                        grads.record_backward(r, mode, wrt, res, gos)
                        r.layer.timeline = (tl, mode.by_key) if tl is not None else None
                    del res, gos
            if not record:
                r.layer.fwd_ms.append(tf.elapsed())
                r.layer.bwd_ms.append(tb.elapsed())
            del out, outputs, need
        if r.layer.timeline is not None:
            _accumulate_timeline(r)


def _accumulate_timeline(r):
    """One more pass whose backward accumulates, as the accumulate graph's
    capture does (vmmrt.torch.grads): there each parameter's gradient is a
    temporary, which AccumulateGrad adds into ``.grad`` and frees when its
    turn comes; this pass records when (reuse.Timeline), for that graph's
    reuse plan (``layer.timeline_acc``). Its ``.grad`` tensors are zeros of
    its own, put back as they were after; the layer's buffers (BatchNorm's
    running statistics) see it as one warm-up pass more."""
    with r.layer.discovering(True, r.sample) as p:
        out = r.call(r.sample)
        p.outputs = out
    need = tuple(o for o in r.split_outputs(out) if o.requires_grad)
    params = [q for q in r.params if q.requires_grad]
    inputs = [x for x in r.sample if isinstance(x, torch.Tensor) and x.requires_grad]
    if not need or not params or p.mode is None:
        return
    gos = tuple(torch.empty_like(o) for o in need)
    kept = [q.grad for q in params + inputs]
    for q in params:
        q.grad = torch.zeros_like(q)
    for x in inputs:
        x.grad = None
    tl = reuse.timeline_for(p.mode)
    mode = place.Mode(r.layer.offload.device_type, static=r.layer.static, observer=tl)
    try:
        with grads.quiet_hooks(params), mode:
            torch.autograd.backward(need, gos, inputs=inputs + params)
    finally:
        for q, g in zip(params + inputs, kept):
            q.grad = g
    r.layer.timeline_acc = (tl, mode.by_key)
