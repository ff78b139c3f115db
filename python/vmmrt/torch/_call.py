# SPDX-License-Identifier: LGPL-2.1-or-later
"""The per-call path of a graphed callable: everything one call does.

make_graphed_callables (graphed.py) decides everything once, when it builds
the callables: the static tensors a call fills and reads, the graphs, how
the parameters' gradients reach ``.grad``, the names for messages, and how a
call learns its stream (:func:`stream_source`). A call then does only this:

forward
    refuse a forward whose previous backward has not come;
    ``forward_begin`` (the layer's resident memory mapped, its group's
    hook, where its GPU work begins), copy the arguments into the static
    inputs (those that are not already them), replay the forward graph,
    ``forward_end`` -- or, where nothing is mapped per use and the graph
    launches raw (vmmrt.torch._launch), the four in one call into the
    library (vmmrt_group_replay_copies: the copies after the begin hook,
    where a static input in the layer's bank may be written); hand autograd
    the outputs (one detached tensor each: autograd needs its own) and,
    where the layer saves an argument or an output, their versions to
    compare at the backward;
backward
    the contracts (the iteration not abandoned, a forward to match, the
    saved arguments unchanged); by gradient mode, ``before_backward``
    (grads="mapped": which graph, the slot mapped, grads.py) or the
    preallocated .grad (grads="accumulate"); copy the output gradients into
    the static ones (grads="mapped": once the slot they lie in is mapped),
    ``backward_begin``, replay, ``backward_end`` (or the one call, with the
    copies, as the forward), and the gradients back to autograd.

Nothing here asks torch or the environment what it asked at build (the
device, whether CUDA is there, the parameters, the options in force); the
current stream is asked once per call of the Function's forward or
backward, as a user may call under another stream than at capture.
"""
import functools

import torch
from torch.autograd.function import once_differentiable

from vmmrt import Error, _capi
from vmmrt.torch import _compat, _contracts, backing as _backing, static_grads
from vmmrt.torch._launch import Launcher
from vmmrt.torch.grads import copy_into


_detach = torch.Tensor.detach


def stream_source(off):
    """The function a call asks for its stream: (the library's stream handle,
    the torch stream or None). Host backend (CPU tensors): the host's
    default stream, and no torch stream; CUDA: the current stream of the
    runtime's device, asked of torch once. (The device is given: asked
    without one, torch.cuda.current_stream finds the current device through
    torch.cuda.is_available, which reads the environment, at every call.)"""
    if off.host:
        return _host_stream
    index = off.device.index

    def cuda():
        cur = torch.cuda.current_stream(index)
        return cur.cuda_stream, cur
    return cuda


def _host_stream():
    return None, None


def raw_stream_source(off):
    """The function a call on the one-call path asks for its stream's handle
    alone: torch._C._cuda_getCurrentRawStream(device) where torch has it (one
    C call; torch.cuda.current_stream builds a Stream object at each call,
    which the one-call path never uses), else :func:`stream_source`'s."""
    if off.host:
        return _host_raw_stream
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        full = stream_source(off)
        return lambda: full()[0]
    return functools.partial(raw, off.device.index)     # (no Python frame a call, as a lambda has)


def _host_raw_stream():
    return None


def _forget(r, lists):
    """At close(): the library's own references to the runner's static
    tensors let go (those over a slot hold its runtime: Backing.tensor)."""
    for seq in lists:
        if seq is not None:
            seq.clear()
    r.static_outputs = r.static_grad_outputs = r.static_grad_inputs = r.acc_grad_inputs = None
    r.pinned_grads = r.pinned_io = r.pinned_outs = None
    if r.layer is not None and r.layer.outputs is not None:
        r.layer.outputs.forget()


def _copies(static_in, n_user):
    """How the one-call path copies a call's tensors (the forward's arguments,
    the backward's output gradients) into the first ``n_user`` of a graph's
    static inputs ``static_in``: (a vmmrt_group_replay_copies array with each
    destination and size set, [(index in the array, tensor)], the tensors
    torch copies). The library copies into every contiguous static input, in
    the one call, after the begin hook: a torch copy per tensor costs the
    launch thread more, and one into the group (LayerOffload.inputs_move)
    must wait for the forward's hook, which makes its bank free. Torch copies
    into the others (a strided sample), before the call."""
    at = [i for i in range(n_user) if static_in[i] is not None and static_in[i].numel()
          and static_in[i].is_contiguous()]
    arr = (_capi.ReplayCopy * max(len(at), 1))()
    for k, i in enumerate(at):
        arr[k].dst = static_in[i].data_ptr()
        arr[k].bytes = static_in[i].numel() * static_in[i].element_size()
    return arr, list(enumerate(at)), [i for i in range(n_user) if i not in at]


def make(r, fwd_graph, bwd_graph, acc_graph, aliases, streams, raw_stream=None):
    """The callable of runner ``r`` (its graphs captured, its static tensors
    set): ``fwd_graph``, ``bwd_graph`` and ``acc_graph`` (the accumulate
    graph of grads="mapped", else None) are what is replayed (anything with
    a ``replay()``); ``aliases``: the static_grads.Aliases of every runner;
    ``streams``: :func:`stream_source`'s function; ``raw_stream``:
    :func:`raw_stream_source`'s (default: the handle of ``streams``')."""
    lay = r.layer
    off = lay.offload
    raw_stream = raw_stream or (lambda: streams()[0])
    grads = r.grad_mode
    mapped = r.grads if grads == "mapped" else None
    # Lists, emptied at close() (_forget): then only the tensors handed out
    # keep the memory under them, and the runtime, alive (a call after close()
    # is refused before it reads any of them).
    acc_gin = list(r.acc_grad_inputs) if r.acc_grad_inputs is not None else None
    n_user = r.n_user
    static_in = r.surface
    static_out = list(r.static_outputs)
    static_gout = list(r.static_grad_outputs)
    static_gin = list(r.static_grad_inputs)
    gouts_in_slot = mapped is not None and r.gouts_in_slot
    gin_where = r.gin_where if mapped is not None else None
    if gouts_in_slot:
        one = [j for j, t in enumerate(static_gout) if t is not None]
        mapped.gout_index = one[0] if len(one) == 1 else None
    params = r.params
    accs = tuple((p, a) for p, a in zip(params, r.acc) if a is not None) if grads == "accumulate" else ()
    static = grads == "static"
    where = "layer %r" % r.name
    r.pending = False
    off._abort_hooks.append(lambda: setattr(r, "pending", False))
    off._close_hooks.append(lambda: _forget(r, (static_out, static_gout, static_gin, acc_gin)))
    watch_in, watch_out = _contracts.watched(r, lay.last_rec)
    watching = bool(watch_in or watch_out)
    again = ("one microbatch at a time (forward, then its backward)" if r.microbatch is None else
             "each (layer, microbatch) runner runs once per iteration (forward, then its backward)")
    # The graphs' way (vmmrt.torch._launch): the forward's and, grads other
    # than "mapped", the backward's; exec > 0: a use is one call into the
    # library.
    fl = Launcher(fwd_graph, off, r.generators, r.recompute)
    bl = Launcher(bwd_graph, off, r.generators, r.recompute)
    # grads="mapped": the backward that adds into a .grad already at its address
    al = Launcher(acc_graph, off, r.generators, r.recompute) if mapped is not None and acc_graph is not None \
        else None
    group = lay.group
    replay_fn, gh = group.replayer()
    copy_fn, _ = group.copier()
    copies, copy_at, torch_at = _copies(static_in, n_user)
    gcopies, gcopy_at, gtorch_at = _copies(static_gout, len(static_gout))
    # the arguments whose static input lies in the layer's group (LayerOffload.inputs_move)
    in_group = frozenset(i for i, a in enumerate(lay.input_addrs or ()) if a is not None)
    # The host backend's copies run on a stream thread and read CPU tensors
    # that Python frees when the call returns: the host waits for them.
    sync_fn, rth = off.runtime.synchronizer() if off.host else (None, None)
    outs_b = lay.outputs.backing if lay.outputs is not None else None
    # the forward's slots, one hook's uses (memplan.Watcher.begin_uses)
    fwd_uses = tuple(b for b in (lay.resident, outs_b) if b is not None)
    res_sync = lay.input_at is not None     # the static inputs in the resident slot: mapped before a call copies into them
    off.launchers[(r.name, False)] = fl
    off.launchers[(r.name, True)] = bl
    if al is not None:
        off.launchers[(r.name, "accumulate")] = al

    def run_backward(ln, s, cur, gouts=None):
        """The backward's graph ``ln.graph`` between the layer's backward hooks:
        one library call when its launcher has the handle, else the hooks
        and torch's replay (the first time, its probe). ``gouts``: the output
        gradients, which the one call copies in where they are contiguous
        (torch the others, before it: an expanded gradient, as a sum's is, or
        a strided static); None: the caller copied them."""
        x = ln.exec
        if x > 0:
            if off.failed is not None or off.runtime.closed:
                off.check_usable()          # (raises: Offload.check_usable's test, inline at every call)
            if _backing._late or off._due:
                off.flush()
            if off.part_checks:
                off.memplan.check_parts(lay.keys[True], s)
            n = 0
            if gouts is not None:
                for k, j in gcopy_at:
                    g = gouts[j]
                    if g is not None and g.is_contiguous():
                        gcopies[k].src = g.data_ptr()
                        continue
                    gcopies[k].src = gcopies[k].dst                # (skipped)
                    if g is not None:
                        static_gout[j].copy_(g)
                for j in gtorch_at:
                    g = gouts[j]
                    if g is not None and static_gout[j] is not None and static_gout[j].data_ptr() != g.data_ptr():
                        static_gout[j].copy_(g)
                n = len(gcopy_at)
            st = copy_fn(gh, 1, x, s, gcopies, n) if n else replay_fn(gh, 1, x, s)
            if st:
                group.replay_failed(st)
            if sync_fn is not None and n and sync_fn(rth, s):
                off.runtime.stream_synchronize(s)
            if lay.resident is not None:
                lay.resident.release(s)     # (bound: its use ends; the pages stay)
            return
        if cur is None:
            s, cur = streams()
        lay.backward_begin(s, cur)
        if x < 0:
            ln.probe()
        else:
            ln.graph.replay()
        lay.backward_end(s)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            if r.pending:
                raise Error(_capi.E_INVALID_STATE, "forward called again before the backward of the previous call: "
                            + again, where)
            ctx.epoch = off.epoch
            if off.gin_hold is not None:
                off.gin_hold = None             # (Grads.after_backward)
            if aliases.dirty:
                static_grads.unalias(aliases)
            x = fl.exec
            if x > 0:
                s = raw_stream()
                if _backing._late or off._due:
                    off.flush()
                if off.part_checks:
                    off.memplan.check_parts(lay.keys[False], s)
                if fwd_uses:
                    # on the plan's pages: whether their bytes are free (else
                    # a slot gets memory of its own, and the graphs their hooks)
                    w = off.memplan
                    k = w.begin_uses(fwd_uses, s) if w is not None else 0
                    if k < len(fwd_uses):
                        for b in fwd_uses[k:]:
                            off.map_for_use(lay, False, b, s, res_sync and b is lay.resident, None)
                for i in torch_at:
                    if static_in[i].data_ptr() != inputs[i].data_ptr():
                        static_in[i].copy_(inputs[i])
                # the others by the library, after the forward's begin hook
                # (what makes writing a bank safe)
                for k, i in copy_at:
                    a = inputs[i]
                    if not a.is_contiguous():
                        if i not in in_group:
                            static_in[i].copy_(a)
                            copies[k].src = copies[k].dst     # (skipped)
                            continue
                        # (freed after the call: CUDA's caching allocator
                        # orders its reuse after the copy on this stream)
                        a = a.contiguous()
                    copies[k].src = a.data_ptr()
                st = copy_fn(gh, 0, x, s, copies, len(copy_at)) if copy_at else replay_fn(gh, 0, x, s)
                if st:
                    group.replay_failed(st)
                if sync_fn is not None and copy_at and sync_fn(rth, s):
                    off.runtime.stream_synchronize(s)   # (raises what failed)
                if outs_b is not None:
                    outs_b.release(s)       # (its use ends; the tensors handed out say more: vmmrt.torch.outputs)
            else:
                s, cur = streams()
                lay.forward_begin(s, False, cur)
                # the arguments in, once the static inputs' memory is mapped
                # (those in the resident slot: vmmrt.torch.static_inputs) and
                # the group's bank free (those in the group: LayerOffload.inputs_move;
                # the host backend's torch copies run now, not in stream order)
                if sync_fn is not None and in_group and sync_fn(rth, s):
                    off.runtime.stream_synchronize(s)   # (raises what failed)
                for i in range(n_user):
                    if static_in[i].data_ptr() != inputs[i].data_ptr():
                        static_in[i].copy_(inputs[i])
                if x < 0:
                    fl.probe()
                else:
                    fwd_graph.replay()
                lay.forward_end(s)
            r.pending = True
            outs = tuple(map(_detach, static_out))     # (a generator is a Python call per item)
            ctx.watch = _contracts.watch(watch_in, watch_out, inputs, outs) if watching else None
            return outs

        @staticmethod
        def backward(ctx, *gouts):
            if torch.is_grad_enabled():
                # backward(create_graph=True): once_differentiable's way (this
                # under no_grad, a second backward through it an error). The
                # engine runs a backward without grad otherwise, and a call
                # skips the decorator's context manager: seven Python calls.
                return twice(ctx, *gouts)
            if ctx.epoch != off.epoch:
                raise _contracts.abandoned_error(r)
            if not r.pending:
                raise Error(_capi.E_INVALID_STATE, "backward without a forward (or twice for one forward)", where)
            err = ctx.watch.check(where) if ctx.watch is not None else None
            if err is not None:
                _contracts.abandon(off, str(err))
                raise err
            _contracts.backward_done(r)
            s = raw_stream()
            if mapped is not None:
                # the gradients' memory made ready (Grads.before_backward),
                # the output gradients into their static tensors (in the io
                # slot: once it is mapped), then the backward as the others:
                # one call where it can, which copies them in too
                acc, src, states = mapped.before_backward(s, where, lay, None)
                if mapped.chain is not None:
                    gouts = mapped.chained(gouts, s)
                elif mapped.watch_gouts:
                    mapped.note_gouts(gouts)
                ln = al if acc else bl
                if ln.exec > 0 and (not gouts_in_slot or mapped.outs.bound):
                    run_backward(ln, s, None, gouts)
                else:
                    if gouts_in_slot:
                        mapped.fill_outputs(static_gout, gouts)
                    else:
                        copy_into(static_gout, gouts)
                    run_backward(ln, s, None)
                r.pending = False
                gin = acc_gin if acc else static_gin
                if gin_where is not None:
                    # the arguments' gradients in the slot: over src, as the parameters'
                    gs, pg = mapped.after_backward(acc, src, states, gin_where, s)
                    return tuple([a if a is not None else None if b is None else b.detach()
                                  for a, b in zip(gs, gin[:n_user])] + pg)
                pg = mapped.after_backward(acc, src, states, None, s)
                return tuple([b.detach() if b is not None else None for b in gin[:n_user]] + pg)
            for p, acc in accs:                 # grads="accumulate": .grad is the tensor the graph adds into
                if p.grad is None:
                    acc.zero_()
                    p.grad = acc
                elif p.grad.data_ptr() != acc.data_ptr():
                    acc.copy_(p.grad)
                    p.grad = acc
            if bl.exec > 0:
                run_backward(bl, s, None, gouts)
            else:
                copy_into(static_gout, gouts)
                run_backward(bl, s, None)
            r.pending = False
            if static:
                aliases.dirty = True            # AccumulateGrad may take a buffer as .grad: see unalias
            return tuple([b.detach() if b is not None else None for b in static_gin])

    twice = once_differentiable(Graphed.backward)

    def functionalized(*user_args, **user_kwargs):
        leaves = r.flatten_call(user_args, user_kwargs)
        r.check_args(leaves, torch.is_grad_enabled())
        if off.failed is not None or off.runtime.closed:
            off.check_usable()              # (raises: Offload.check_usable's test, inline at every call)
        if not torch.is_grad_enabled() or not _any_requires_grad(leaves, params):
            # No backward will come: replaying would leave the group's schedule
            # waiting for it, so the callable runs eagerly.
            return r.call(leaves)
        r.check_params()
        if grads == "accumulate" and _compat.ddp_forward_active():
            raise Error(_capi.E_NOT_SUPPORTED, "grads='accumulate' under DistributedDataParallel: the backward graph "
                        "adds into .grad itself, so no parameter's AccumulateGrad hook runs and DDP's reducer would "
                        "never all-reduce these gradients (every rank would silently keep its own); use "
                        "grads='static' (the default: the gradients go through autograd, and DDP's hooks run), or "
                        "all-reduce .grad yourself after the backward without DDP", where)
        _contracts.forward_starts(r)
        try:
            out = Graphed.apply(*leaves, *params)
        except BaseException:
            _contracts.forward_failed(r)
            raise
        return r.join_outputs(out)

    return functionalized


def _any_requires_grad(leaves, params):
    """Whether a backward will come: asked at every call, as a user may freeze
    parameters (requires_grad_(False)) between calls."""
    for t in leaves:
        if t.requires_grad:
            return True
    for p in params:
        if p.requires_grad:
            return True
    return False
