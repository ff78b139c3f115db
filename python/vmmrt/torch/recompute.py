# SPDX-License-Identifier: LGPL-2.1-or-later
"""Recomputation (activation checkpointing) of whole layers, inside the graphs.

A layer the budget planner (or the user, :func:`mark_recompute`) has
recompute saves nothing in its forward: it runs under ``torch.no_grad()``,
so autograd keeps no activation, and its inputs are what it needs again
(under graphs, its static inputs: with the memory plan, a resident slot of
its own holds them from its forward to its backward, vmmrt.torch.static_inputs;
without, they hold the call's input for the graphs' life). Its backward runs
the forward again with gradients
enabled, then ``autograd.grad`` over it: the same ops as
``torch.utils.checkpoint``, so the same gradients, bitwise. Under graphs,
where torch's non-reentrant checkpoint takes a ``context_fn`` (2.1 and
later), the forward graph is captured under it and the backward graph as
any layer's (:func:`forward_checkpointed`): the recomputation inside the
backward's capture stops once every tensor the backward reads is back, and
the gradients' statics lie in the layer's slot as any layer's; before, the
backward graph runs the whole forward again and keeps its own statics.

Random ops draw the same numbers in the recomputation as in the forward:

- eager (``graphs=False``): the RNG state of the CPU and of the inputs'
  devices is kept at the forward and put back around the recomputation
  (``preserve_rng_state``, as torch.utils.checkpoint does), and so is that
  of each of ``generators=``;
- under graphs: the forward graph and the backward graph each draw from
  generator states of their own, cloned at capture (``Generator.clone_state``)
  from the device's default generator and from each of ``generators=``
  (Megatron's RNG tracker's), and registered with their graph
  (``CUDAGraph.register_generator_state``); the capture switches the default
  generator to it (``graphsafe_set_state``) around the forward and around the
  recomputation. Every replay advances a state by its graph's increment,
  which the forward and the recomputation share (the same random ops), so
  the two stay in step: the k-th backward replays the k-th forward's
  numbers. :meth:`Offload.abort` abandons forwards whose backward never
  came: the recomputation's state is set back to the forward's then. A
  torch without these calls (before 2.4) refuses a recomputed layer that
  draws random numbers under graphs.

A recomputed layer's saved tensors do not exist, so offloading it as well
is refused where it is asked for (:mod:`vmmrt.torch.budget`'s hand plans,
a marked layer); in ping-pong its checkpoint (its graphs' static inputs)
moves through the banks instead of staying in a resident slot
(LayerOffload.inputs_move).
"""
import contextlib
import logging

import torch
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint, get_device_states, set_device_states

from vmmrt import Error, _capi
from vmmrt.torch import _compat, _contracts, eager, place
from vmmrt.torch.grads import quiet_hooks

log = logging.getLogger("vmmrt.torch")

_MARK = "_vmmrt_recompute"


def mark_recompute(*callables):
    """Mark modules (or functions) given to make_graphed_callables to be
    recomputed in backward whatever the budget: their forward keeps no
    activation. A module inside one of them (a sub-block: its MLP, its
    attention) is recomputed alone: the layer saves only the sub-block's
    inputs for it, and its backward runs the sub-block again first
    (:class:`_SubBlock`). Returns the first one (a decorator too)."""
    for c in callables:
        if not callable(c):
            raise TypeError("mark_recompute(%r): a module or function, as make_graphed_callables takes" % (c,))
        setattr(c, _MARK, True)
    return callables[0] if callables else None


def marked(fn):
    return bool(getattr(fn, _MARK, False))


def marks(runners):
    """Per runner, whether its callable is marked for recomputation; and the
    marked sub-blocks inside a module (any descendant given to
    :func:`mark_recompute`) are made to recompute in its backward
    (:class:`_SubBlock`)."""
    for r in runners:
        if isinstance(r.fn, torch.nn.Module):
            for sub in r.fn.modules():
                if sub is not r.fn and marked(sub) and "_vmmrt_sub_forward" not in sub.__dict__:
                    _install(sub)
    return [marked(r.fn) for r in runners]


# -------------------------------------------------------------- sub-blocks
def _install(sub):
    orig = sub.forward
    sub._vmmrt_sub_forward = orig
    sub._vmmrt_draws = None          # whether its forward draws random numbers (seen outside captures)
    name = type(sub).__name__

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return orig(*args, **kwargs)
        if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
            raise TypeError("mark_recompute(%s) sub-block: called with %s; a recomputed sub-block takes tensors as "
                            "positional arguments only (wrap the call, or mark the whole layer)"
                            % (name, "keyword arguments" if kwargs else "non-tensor arguments"))
        params = tuple(p for p in sub.parameters() if p.requires_grad)
        out = _SubBlock.apply(sub, len(args), *(args + params))
        return out[0] if sub._vmmrt_single else out

    sub.forward = forward


def _capturing():
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _outputs(sub, out):
    single = isinstance(out, torch.Tensor)
    outs = (out,) if single else out
    if not isinstance(outs, tuple) or not all(isinstance(o, torch.Tensor) for o in outs):
        raise TypeError("mark_recompute(%s) sub-block returned %s; a recomputed sub-block returns a tensor or a "
                        "tuple of tensors" % (type(sub).__name__, type(out).__name__))
    sub._vmmrt_single = single
    return outs


class _SubBlock(torch.autograd.Function):
    """A marked sub-block: its forward saves only its inputs (which the
    layer's offload then sees as saved tensors of the layer), its backward
    runs it again with gradients, as torch.utils.checkpoint does. Eagerly
    the RNG states are kept and put back; under graphs a sub-block that draws
    random numbers is refused (its recomputation, captured into the backward
    graph, would draw other numbers than the forward graph's)."""

    @staticmethod
    def forward(ctx, sub, n, *args):
        inputs = args[:n]
        ctx.sub, ctx.n_params = sub, len(args) - n
        capturing = _capturing()
        if capturing and sub._vmmrt_draws is not False:
            raise Error(_capi.E_NOT_SUPPORTED, "the sub-block %s marked for recomputation %s under graphs: its "
                        "recomputation in the backward graph would draw other numbers than the forward; mark the "
                        "whole layer (whose recomputation keeps the forward's generator states), or leave the "
                        "sub-block unmarked" % (type(sub).__name__, "draws random numbers (dropout?)"
                                                if sub._vmmrt_draws else "was never run before a capture"),
                        "vmmrt.torch.mark_recompute")
        ctx.rng = None
        if not capturing:
            before = torch.get_rng_state()
            ctx.devices, ctx.dev_states = get_device_states(*inputs)
            ctx.rng = before
        with torch.no_grad():
            outs = _outputs(sub, sub._vmmrt_sub_forward(*inputs))
        if not capturing:
            after_devs = get_device_states(*inputs)[1]
            sub._vmmrt_draws = bool(sub._vmmrt_draws) or not torch.equal(before, torch.get_rng_state()) or any(
                not torch.equal(a, b) for a, b in zip(ctx.dev_states, after_devs))
        ctx.save_for_backward(*inputs)
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        sub = ctx.sub
        inputs = ctx.saved_tensors
        detached = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
        with torch.random.fork_rng(devices=ctx.devices if ctx.rng is not None else [],
                                   enabled=ctx.rng is not None):
            if ctx.rng is not None:
                torch.set_rng_state(ctx.rng)
                set_device_states(ctx.devices, ctx.dev_states)
            with torch.enable_grad():
                outs = _outputs(sub, sub._vmmrt_sub_forward(*detached))
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
        params = [p for p in sub.parameters() if p.requires_grad]
        wrt = [x for x in detached if x.requires_grad] + params
        res = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
                   if pairs and wrt else [None] * len(wrt))
        gin = tuple(next(res) if x.requires_grad else None for x in detached)
        return (None, None) + gin + tuple(next(res) for _ in params)


# ------------------------------------------------------------------ eager
class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runner, *inputs):
        n = runner.n_user
        ctx.runner = runner
        ctx.cpu_rng = torch.get_rng_state()
        ctx.devices, ctx.dev_states = get_device_states(*inputs[:n])
        ctx.gen_states = [g.get_state() for g in runner.generators]
        ctx.inputs = inputs[:n]
        with torch.no_grad():
            out = runner.call(inputs[:n])
        return tuple(runner.split_outputs(out))

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        runner = ctx.runner
        if ctx.inputs is None:
            raise Error(_capi.E_INVALID_STATE, "backward through this call ran twice (retain_graph); a recomputed "
                        "layer keeps its inputs for one backward", "layer %r" % runner.name)
        inputs, ctx.inputs = ctx.inputs, None
        gens = runner.generators
        kept = [g.get_state() for g in gens]
        with torch.random.fork_rng(devices=ctx.devices):
            torch.set_rng_state(ctx.cpu_rng)
            set_device_states(ctx.devices, ctx.dev_states)
            for g, st in zip(gens, ctx.gen_states):
                g.set_state(st)
            detached = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
            try:
                with torch.enable_grad():
                    outs = runner.split_outputs(runner.call(detached))
            finally:
                for g, st in zip(gens, kept):
                    g.set_state(st)
        need, gos = [], []
        for o, g in zip(outs, grads):
            if isinstance(o, torch.Tensor) and o.requires_grad and g is not None:
                need.append(o)
                gos.append(g)
        wrt_in = [k for k, x in enumerate(detached) if x.requires_grad]
        wrt_p = [k for k, p in enumerate(runner.params) if p.requires_grad]
        wrt = [detached[k] for k in wrt_in] + [runner.params[k] for k in wrt_p]
        res = [None] * len(wrt)
        if need and wrt:
            # grads="mapped": the gradients' ops write them in the callable's
            # slot, as the layer's other backwards do (the recomputed forward
            # before is not counted: the births are the backward's own ops)
            mode = eager._grad_mode(runner, eager.current_stream(runner.layer.offload))
            with quiet_hooks(runner.params):
                if mode is not None:
                    with mode:
                        res = torch.autograd.grad(need, wrt, gos, allow_unused=True)
                else:
                    res = torch.autograd.grad(need, wrt, gos, allow_unused=True)
        gin = [None] * runner.n_user
        gp = [None] * len(runner.params)
        for j, k in enumerate(wrt_in):
            gin[k] = res[j]
        for j, k in enumerate(wrt_p):
            gp[k] = res[len(wrt_in) + j]
        # its backward came: the iteration ends once every layer's has (else
        # the next forward of the first layer would abandon it)
        _contracts.backward_done(runner)
        return (None,) + tuple(gin) + tuple(gp)


def wrap(runner):
    """The eager version of a recomputed runner's callable: the eager path's
    call checks and recovery (vmmrt.torch.eager.wrap), this module's node."""
    return eager.wrap(runner, _Recompute)


# ----------------------------------------------------------------- graphs
class _GraphRng:
    """The forward's and the recomputation's states of every generator the
    layer draws from: the device's default one and the user's (``generators=``,
    Megatron's tracker's); see the module."""

    def __init__(self, device, generators=()):
        default = torch.cuda.default_generators[device.index if device.index is not None else
                                                torch.cuda.current_device()]
        self.gens = [default] + [g for g in generators if g is not default]
        self.fwd = self.bwd = None
        if all(hasattr(g, "clone_state") and hasattr(g, "graphsafe_set_state") for g in self.gens):
            self.fwd = [g.clone_state() for g in self.gens]
            self.bwd = [g.clone_state() for g in self.gens]

    @property
    def available(self):
        return self.fwd is not None

    def using(self, states):
        rng = self

        class _Ctx:
            def __enter__(self):
                if states is not None:
                    self.prev = [g.graphsafe_get_state() for g in rng.gens]
                    for g, st in zip(rng.gens, states):
                        g.graphsafe_set_state(st)

            def __exit__(self, *exc):
                if states is not None:
                    for g, st in zip(rng.gens, self.prev):
                        g.graphsafe_set_state(st)

        return _Ctx()

    def resync(self):
        """After an abort: the recomputation's states back to the forward's."""
        if self.available:
            for f, b in zip(self.fwd, self.bwd):
                b.set_state(f.get_state())


def draws_random(runner):
    """Whether a forward of the runner advances the device's generator (outside
    any capture: the warm-up is over)."""
    gen = torch.cuda.default_generators[runner.sample[0].device.index or 0] if runner.sample else None
    if gen is None:
        return False
    before = gen.get_offset() if hasattr(gen, "get_offset") else None
    if before is None:
        return False
    with torch.no_grad():
        runner.call(runner.sample)
    torch.cuda.current_stream().synchronize()
    return gen.get_offset() != before


def prepare_graphs(runner, fwd_graph, bwd_graph, off):
    """Before the first capture: the generator states of a recomputed runner."""
    rng = _GraphRng(runner.layer.offload.device, runner.generators)
    if not rng.available:
        if draws_random(runner):
            raise Error(_capi.E_NOT_SUPPORTED, "the layer draws random numbers (dropout?) and is recomputed under "
                        "graphs, which needs torch's graph-safe generator states (Generator.clone_state, "
                        "graphsafe_set_state: torch 2.4 or later); leave it out of recomputation, or use graphs=False",
                        "layer %r" % runner.name)
        rng.fwd = rng.bwd = None
    else:
        for f, b in zip(rng.fwd, rng.bwd):
            fwd_graph.register_generator_state(f)
            bwd_graph.register_generator_state(b)
        off._abort_hooks.append(rng.resync)
    runner.recompute_rng = rng


def _checkpoint_route():
    """Whether torch's non-reentrant checkpoint takes ``context_fn`` and the
    dispatch modes can be set aside (torch 2.1 and later): the graphs'
    route of :func:`forward_checkpointed`."""
    try:
        import inspect
        from torch.utils._python_dispatch import _disable_current_modes   # noqa: F401
        return "context_fn" in inspect.signature(checkpoint).parameters
    except (ImportError, TypeError, ValueError):
        return False


CHECKPOINTED = _checkpoint_route()


class _Recomputing:
    """The recomputation's context (``context_fn``'s second): the generators
    in the recomputation's states, and no dispatch mode (the gradients'
    placement, vmmrt.torch.place, sees the backward's own ops, as at
    discovery: the recomputed activations are no gradient's birth)."""

    def __init__(self, rng):
        self.rng = rng

    def __enter__(self):
        from torch.utils._python_dispatch import _disable_current_modes
        self.modes = _disable_current_modes()
        self.modes.__enter__()
        self.states = self.rng.using(self.rng.bwd)
        self.states.__enter__()

    def __exit__(self, *exc):
        try:
            self.states.__exit__(*exc)
        finally:
            self.modes.__exit__(*exc)


def forward_checkpointed(runner, stream=None):
    """What the forward graph of a recomputed runner captures where torch has
    the route (:data:`CHECKPOINTED`): the forward under torch's non-reentrant
    checkpoint, with gradients. Autograd's graph then holds the static
    inputs alone, and the layer's backward is captured as any layer's
    (graphed.py): autograd.grad unpacks the first saved tensor, the
    checkpoint runs the forward again inside the backward's capture, and
    stops once every tensor the backward reads is back (early stop: the ops
    after the last one that saves, a Llama layer's down projection and
    residual add, are not run again). Its gradients' statics then lie
    where any layer's do (grads="mapped": in its slot), and its outputs are
    born in its outputs' slot (vmmrt.torch.outputs: placed as discovery saw
    them born, ``stream`` the capture's) instead of the graphs' pool for
    good."""
    rng = runner.recompute_rng
    lay = runner.layer

    def contexts():
        return contextlib.nullcontext(), _Recomputing(rng)

    def fwd():
        mode = contextlib.nullcontext()
        if lay.outputs is not None:
            mode = place.Mode(lay.offload.device_type, lay.outputs.placements(stream), lay.births, lay.static,
                              record=False)
        with rng.using(rng.fwd), torch.enable_grad(), mode:
            return checkpoint(lambda *xs: runner.call(xs), *runner.sample, use_reentrant=False,
                              preserve_rng_state=False, context_fn=contexts)
    return fwd


def register_backward(runner, graph):
    """A recomputed runner's other backward graph (grads="mapped"'s accumulate
    one) draws from the recomputation's states: one of the two replays at
    each backward, so the state stays in step."""
    rng = runner.recompute_rng
    if rng is not None and rng.available:
        for st in rng.bwd:
            graph.register_generator_state(st)


def forward_body(runner):
    """What the forward graph of a recomputed runner captures: the forward, saving nothing."""
    def fwd():
        with runner.recompute_rng.using(runner.recompute_rng.fwd), torch.no_grad():
            return runner.call(runner.sample)
    return fwd


def after_forward(runner, out):
    leaves = runner.split_outputs(out)
    runner.static_outputs = tuple(leaves)
    # a gradient buffer for every output that can have one: which need one is
    # known once the recomputation runs with gradients (in the backward's capture)
    runner.static_grad_outputs = tuple(torch.empty_like(o) if o.is_floating_point() or o.is_complex() else None
                                       for o in leaves)


def backward_body(runner, allow_unused_input):
    """What the backward graph captures: the forward again, from the static
    inputs, then its gradients into static buffers (returned in surface order)."""
    def bwd():
        rng = runner.recompute_rng
        detached = tuple(x.detach().requires_grad_(x.requires_grad) for x in runner.sample)
        with rng.using(rng.bwd), torch.enable_grad():
            outs = runner.split_outputs(runner.call(detached))
        need = [o for o, g in zip(outs, runner.static_grad_outputs) if o.requires_grad and g is not None]
        gos = [g for o, g in zip(outs, runner.static_grad_outputs) if o.requires_grad and g is not None]
        wrt = [x for x in detached if x.requires_grad] + [p for p in runner.params if p.requires_grad]
        res = torch.autograd.grad(need, wrt, gos, only_inputs=True, allow_unused=allow_unused_input,
                                  retain_graph=runner.retain_graph) \
            if need and wrt else [None] * len(wrt)
        it = iter(res)
        return tuple(next(it) if a.requires_grad else None for a in detached + runner.params)
    return bwd


def _again(runner):
    """The forward run again from the static inputs, with gradients, in the
    recomputation's generator states: (inputs, outputs to differentiate, their
    gradient buffers)."""
    rng = runner.recompute_rng
    detached = tuple(x.detach().requires_grad_(x.requires_grad) for x in runner.sample)
    with rng.using(rng.bwd), torch.enable_grad():
        outs = runner.split_outputs(runner.call(detached))
    pairs = [(o, g) for o, g in zip(outs, runner.static_grad_outputs) if g is not None and o.requires_grad]
    return detached, [o for o, _ in pairs], [g for _, g in pairs]


def capture_mapped(r, graph, allow_unused_input, capture):
    """grads="mapped" for a recomputed runner (see vmmrt.torch.grads): two
    backward graphs, each running the forward again first, then *write* (the
    ops that make each parameter's gradient write it in the callable's slot)
    or *accumulate* (AccumulateGrad adds into the .grad there, in place). Its
    gradients then come and go as the other layers' do, instead of static
    buffers of the pool held for the life of the graphs (1x its parameters).
    The place.Mode sees the backward's ops only, as discovery did. A gradient
    not at its address leaves the runner "static", as for any layer.
    ``capture(what, graph, body)`` captures into the shared pool. Returns
    the accumulate graph (None: "static")."""
    g = r.grads
    dev = r.layer.offload.device_type
    base = g.backing.tensor(None, counted=False)
    placed = g.placements(base)
    mode = place.Mode(dev, placed, g.known, r.layer.static)
    params = [p for p in r.params if p.requires_grad]
    seen = {}

    def write():
        detached, need, gos = _again(r)
        inputs = [x for x in detached if x.requires_grad]
        seen["inputs"] = [k for k, x in enumerate(detached) if x.requires_grad]
        if not need or not inputs + params:
            return [None] * (len(inputs) + len(params))
        with quiet_hooks(r.params), mode:
            return torch.autograd.grad(need, inputs + params, gos, only_inputs=True,
                                       allow_unused=allow_unused_input, retain_graph=r.retain_graph)
    res = list(capture("backward (recomputing the forward)", graph, write))
    k_in = seen["inputs"]
    gin, gp = res[:len(k_in)], iter(res[len(k_in):])
    by_pos = dict(zip(k_in, gin))
    sample_gin = tuple(by_pos.get(k) for k in range(len(r.sample)))
    missed = [p.birth.describe() + ": " + (p.why or "not placed") for p in placed if p.how is None]
    if missed or all(x is None for x in res):
        if missed:
            log.warning("vmmrt: layer %r: gradients not at their addresses at capture (%s): static buffers",
                        r.name, "; ".join(missed))
        r.grad_mode = "static"
        r.pinned_grads = base
        g.backing.pin()             # the static buffers are in the slot: it stays mapped
        r.static_grad_inputs = sample_gin + tuple(next(gp) if p.requires_grad else None for p in r.params)
        return None
    # the inputs' gradients: the accumulate graph writes them where the write graph's are
    targets = []
    for gx in gin:
        b = mode.births.get(_compat.storage_of(gx)[0]) if gx is not None else None
        if b is not None:
            targets.append(place.Placed(b, _compat.tensor_over(gx, b.dtype, b.shape, b.stride, b.offset)))
    acc_mode = place.Mode(dev, targets, mode.by_key, r.layer.static)
    acc_graph = torch.cuda.CUDAGraph()
    rng = r.recompute_rng
    if rng.available:
        for st in rng.bwd:          # one of the two replays at each backward: the state stays in step
            acc_graph.register_generator_state(st)
    for k, p in enumerate(r.params):
        if p.requires_grad:
            p.grad = g.view(base, k)

    def accumulate():
        detached, need, gos = _again(r)
        inputs = [x for x in detached if x.requires_grad]
        with quiet_hooks(params), acc_mode:
            torch.autograd.backward(need, gos, inputs=inputs + params, retain_graph=r.retain_graph)
        return tuple(x.grad for x in inputs)
    try:
        acc_in = capture("backward (recomputing the forward, accumulate)", acc_graph, accumulate)
    finally:
        for p in params:
            p.grad = None
    acc_pos = dict(zip(k_in, acc_in))
    r.static_grad_inputs = sample_gin + (None,) * len(r.params)
    r.acc_grad_inputs = tuple(acc_pos.get(k) for k in range(len(r.sample))) + (None,) * len(r.params)
    r.acc_shared = all(a is None or (b is not None and a.data_ptr() == b.data_ptr())
                       for a, b in zip(r.static_grad_inputs, r.acc_grad_inputs))
    return acc_graph
