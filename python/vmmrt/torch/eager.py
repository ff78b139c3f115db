# SPDX-License-Identifier: LGPL-2.1-or-later
"""Eager offload: each layer runs as usual (no graph), and the tensors its
forward saves go through its vmmrt group as they would under graphs: copied
into the fixed address at the end of the forward, offloaded (D2H), restored
(H2D) before its backward. The originals are freed after the forward, which
is where the memory goes down.

Each callable becomes one autograd node, as under make_graphed_callables:
its forward runs the callable under the recording hooks; its backward waits
for the restore, runs the callable's own backward (a nested autograd.grad
over the graph kept from the forward) and lets the group go. Parameter
gradients come back to autograd, so ``.grad`` accumulates as usual.
"""
import torch
from torch.autograd.function import once_differentiable

from vmmrt import Error, _capi
from vmmrt.torch import _contracts, place
from vmmrt.torch.grads import quiet_hooks
from vmmrt.torch.saved import original_error


def current_stream(off):
    """The stream the hooks go on: the current CUDA stream, or the host
    backend's default stream (NULL) for CPU tensors."""
    return streams(off)[0]


def streams(off):
    """(the stream the hooks go on, the torch stream it is or None): torch is
    asked once per forward or backward of a call."""
    if off.host:
        return None, None
    cur = torch.cuda.current_stream(off.device.index)   # with the device: see _call.stream_source
    return cur.cuda_stream, cur


class _EagerLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runner, *inputs):
        n = runner.n_user
        detached = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs[:n])
        off = runner.layer.offload
        stream, cur = streams(off)
        with torch.enable_grad():
            with runner.layer.offloading(stream, detached, cur) as p:
                out = runner.call(detached)
                p.outputs = out
        leaves = runner.split_outputs(out)
        ctx.runner = runner
        ctx.epoch = off.epoch
        ctx.rec = p.rec
        ctx.inner_in = detached
        ctx.inner_out = leaves
        return tuple(o.detach() for o in leaves)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        runner = ctx.runner
        lay = runner.layer
        off = lay.offload
        if ctx.inner_out is None:
            raise Error(_capi.E_INVALID_STATE, "backward through this call ran twice (retain_graph); each call "
                        "is offloaded once", "layer %r" % runner.name)
        if ctx.epoch != off.epoch:
            raise _contracts.abandoned_error(runner)
        outs, gos = [], []
        for o, g in zip(ctx.inner_out, grads):
            if o.requires_grad and g is not None:
                outs.append(o)
                gos.append(g)
        wrt_in = [k for k, x in enumerate(ctx.inner_in) if x.requires_grad]
        wrt_p = [k for k, p in enumerate(runner.params) if p.requires_grad]
        wrt = [ctx.inner_in[k] for k in wrt_in] + [runner.params[k] for k in wrt_p]
        stream, cur = streams(off)
        lay.backward_begin(stream, cur)
        if off.mode == "remap" and not off.host:
            # Eager, torch's own ops read the restored tensors, and some are
            # cudaMemcpyAsync (a clone), which the driver validates at enqueue:
            # the slot must be mapped by then, not only once the stream gets
            # there. (Graph replays check nothing; this wait is eager-only.)
            off.runtime.stream_synchronize(stream)
        failure = None
        try:
            if outs and wrt:
                mode = _grad_mode(runner, stream)
                with quiet_hooks(runner.params):
                    if mode is not None:
                        with mode:
                            res = torch.autograd.grad(outs, wrt, gos, allow_unused=True)
                    else:
                        res = torch.autograd.grad(outs, wrt, gos, allow_unused=True)
            else:
                res = [None] * len(wrt)
            # A gradient that is a view of a restored tensor would change when
            # the slot is reused: give autograd its own copy.
            res = [off.own(g) for g in res]
        except BaseException as e:  # noqa: B902 - re-raised below, once the group's backward has ended
            failure = e
        finally:
            ctx.inner_out = None
            ctx.inner_in = None
            lay.backward_end(stream)
        if failure is not None:
            # The user's (a saved tensor changed in place, an op that raised):
            # autograd stops here, so the iteration's other backwards never
            # come; it is abandoned and the next one starts clean.
            err = original_error(failure, [ctx.rec])
            _contracts.abandon(off, "layer %r: its backward raised %s" % (runner.name, err or failure))
            if err is not None:
                raise err from None
            raise failure
        _contracts.backward_done(runner)
        grads_in = [None] * runner.n_user
        grads_p = [None] * len(runner.params)
        for j, k in enumerate(wrt_in):
            grads_in[k] = res[j]
        for j, k in enumerate(wrt_p):
            grads_p[k] = res[len(wrt_in) + j]
        return (None,) + tuple(grads_in) + tuple(grads_p)


def _grad_mode(runner, stream):
    """grads="mapped" without graphs: while no tensor is over the callable's
    gradient slot (a step's first backward, .grad freed), the backward's ops
    write the gradients there and AccumulateGrad takes them as .grad (or adds
    them into another .grad); otherwise (a .grad there to accumulate into, or
    a tensor of an earlier step still alive over it) they are computed as
    usual and AccumulateGrad adds them in place, as the accumulate graph does.
    Eager never writes over a gradient someone may still hold."""
    g = runner.grads
    if g is None or not g.mapped or g.held():
        return None
    runner.layer.offload.map_for_use(runner.layer, True, g.backing, stream, eager=True)
    base = g.backing.tensor(stream)
    return place.Mode(runner.layer.offload.device_type, g.placements(base), g.known, runner.layer.static,
                      record=False)


def wrap(runner, node=None):
    """The eager-offload version of runner's callable: one autograd node per
    call (``node``: the autograd Function, this module's by default; the
    recomputation's for a recomputed layer)."""
    node = node or _EagerLayer

    def offloaded(*user_args, **user_kwargs):
        leaves = runner.flatten_call(user_args, user_kwargs)
        runner.check_args(leaves, torch.is_grad_enabled())
        runner.layer.offload.check_usable()
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in tuple(leaves) + runner.params):
            # No backward will come: no group work, no schedule entry.
            return runner.call(leaves)
        runner.check_params()
        leaves = _contracts.eager_inputs(runner, leaves)
        _contracts.forward_starts(runner)
        try:
            out = node.apply(runner, *(tuple(leaves) + runner.params))
        except BaseException:
            _contracts.forward_failed(runner)
            raise
        return runner.join_outputs(out)

    return offloaded
