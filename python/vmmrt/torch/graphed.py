# SPDX-License-Identifier: LGPL-2.1-or-later
"""make_graphed_callables with CPU activation offload.

The same contract as torch.cuda.make_graphed_callables (same positional
arguments, one forward and one backward graph per callable in one shared
pool, captured in execution order: every forward, then the backwards in
reverse), plus: the tensors each forward saves for its backward live at
libvmmrt's fixed addresses, are copied to pinned host memory after the
forward graph and restored before the backward graph, outside the graphs.

Everything before capture (warm-up, discovery, allocation, learning the fixed
addresses) runs outside capture on a side stream, as PyTorch's warm-up does.
"""
from __future__ import annotations

import collections
import difflib
import gc
import inspect
import logging
import threading
from typing import Any, Callable, Sequence

import torch

import vmmrt
from vmmrt import Error, _capi
from vmmrt.torch import (_call, _callables, _compat, _compiled, _contracts, _te, budget, eager, graphpool,
                         pipeline, place, planner, recompute, replay_times, reuse, static_grads, static_inputs)
from vmmrt.torch.grads import Grads, quiet_hooks
from vmmrt.torch.offload import Offload, runtime_options
from vmmrt.torch.saved import original_error

GRADS = ("mapped", "static", "accumulate")
# grads="mapped": each runner's write and accumulate backward graphs are
# instantiated at their first replay (_compat.deferred_graph): in the
# set_to_none loop the accumulate graph never runs, and an executable graph
# holds device memory of its own (False: both at their capture's end, an A/B).
DEFER_MAPPED_BACKWARDS = True

log = logging.getLogger("vmmrt.torch")


def _reject_unknown(kwargs):
    # The names it takes: its own signature's, and TransformerEngine's FP8 ones.
    known = [p.name for p in inspect.signature(make_graphed_callables).parameters.values()
             if p.kind is not p.VAR_KEYWORD][2:] + list(_te.FP8)
    for k in kwargs:
        near = difflib.get_close_matches(k, known, n=1)
        raise TypeError("make_graphed_callables() got an unexpected keyword argument %r%s"
                        % (k, " (did you mean %r?)" % near[0] if near else ""))


def make_graphed_callables(callables: Callable | tuple[Callable, ...],
                           sample_args: tuple[torch.Tensor, ...] | tuple[tuple[torch.Tensor, ...], ...],
                           num_warmup_iters: int = 3, allow_unused_input: bool = False, pool: Any = None,
                           capture_error_mode: str = "global", *, mode: str | None = None, lookahead: int | None = None,
                           offload: float | bool | str = 1.0, graphs: bool = True, grads: str = "mapped",
                           names: Sequence[str] | None = None, options: dict[str, Any] | None = None,
                           margin: float = 0.9, min_bytes: int = 1 << 16, order: Sequence[int] | None = None,
                           layers_per_chunk: int | Sequence[int] | None = None, map_ahead: int = 1,
                           sample_kwargs: dict[str, Any] | tuple[dict[str, Any], ...] | None = None,
                           generators: Sequence[torch.Generator] | None = None,
                           retain_graph_in_backward: bool = False,
                           pre_warmup_hook: Callable[[], None] | None = None,
                           post_warmup_hook: Callable[[], None] | None = None, _order: Sequence[int] | None = None,
                           _num_layers_per_chunk: int | Sequence[int] | None = None,
                           _reuse_graph_input_output_buffers: bool = False, memory_budget: Any = None,
                           memory_plan: bool | str | None = None, loop: str | None = None,
                           **unknown: Any) -> Callable | tuple[Callable, ...]:
    """Graphed (or eager) versions of ``callables`` whose saved tensors are offloaded.

    A drop-in for :func:`torch.cuda.make_graphed_callables`: ``callables`` is
    a module or function, or a tuple of them in the order they run;
    ``sample_args`` a tuple of tensors (a tuple of such tuples for several
    callables). The training loop stays ``y = model(x); loss.backward();
    optimizer.step()``; parameter gradients accumulate into ``.grad`` across
    microbatches run one after another (one forward, then its backward).

    Offload arguments (keyword only):

    mode
        "pingpong" (two resident banks; no driver call after allocation),
        "remap" (device memory released after each D2H and mapped again
        before the H2D) or "none" (slots stay resident: the same machinery
        without offload, for A/B runs). Left out: VMMRT_MODE's, else
        "pingpong".
    lookahead
        how many layers ahead the restores (and remap's maps) start. Left
        out: VMMRT_LOOKAHEAD's, else 1. Every VMMRT_* variable is checked
        by the library first (a malformed one is a ``vmmrt.InvalidValue``,
        as in the C tools); one that says otherwise than an argument given
        is one warning naming both, and the argument applies (with
        ``options={"environment": "override"}``, the variable).
    offload
        what moves: 1.0 (every saved tensor that can), a fraction of each
        layer's distinct saved bytes, 0.0 (nothing), or "auto": the planner
        measures each layer's forward and the pinned bandwidth and moves the
        most that hides behind compute (see :mod:`vmmrt.torch.planner`;
        ``offload_of(c).plan.summary()`` says what it chose; ``margin`` is
        its safety factor), weighed by what it saves at the step's peak in
        ``loop``'s loop. Tensors marked with :func:`mark_not_offload`
        never move.
    loop
        the training loop ``offload="auto"`` plans for: "set_to_none"
        (``zero_grad(set_to_none=True)``: the gradients come in backward
        and the last backward may be the step's peak, where what was moved
        is back) or "persistent" (a ``.grad`` kept and zeroed in place:
        the peak is between forward and backward). Left out: both, the
        plan no worse than moving nothing in either (on 6
        ``nn.TransformerEncoderLayer``s it then moves nothing, where the
        persistent loop alone would have 511 MiB less predicted). The
        memory plan learns the loop at the second step and warns if it is
        not the one given. With ``memory_budget=``, ``Budget(loop=)``
        says it instead.
    graphs
        False: no CUDA graphs, the same offload eagerly (also on CPU tensors
        with the host backend, for tests).
    grads
        "mapped" (the default: each parameter's gradient lives at a fixed
        address that is its ``.grad``, in memory libvmmrt maps before the
        layer's first backward of a step and releases when the ``.grad`` is
        freed; the backward graph writes it there, or adds into it in place
        when ``.grad`` is already there; AccumulateGrad and every hook on it,
        DistributedDataParallel's, still run; see :mod:`vmmrt.torch.grads`),
        "static" (PyTorch's contract: the backward graph writes static
        gradient buffers of the pool, held for the life of the graphs, handed
        to autograd) or "accumulate" (the backward graph adds into each
        parameter's one preallocated ``.grad``, outside the pool; parameter
        hooks do not run).
    names
        one name per callable for messages, traces and statistics.
    min_bytes
        regions (distinct saved byte ranges) smaller than this stay on the
        device: scalars and index tensors are not worth a copy each.
    options
        further libvmmrt options ({"driver_workers": 1, ...}; see
        ``vmmrt.options_table()``).
    order
        a pipeline schedule: several microbatches in flight through the same
        layers (TransformerEngine's ``_order``, as Megatron-LM computes it;
        :func:`vmmrt.torch.order_1f1b` makes one). ``callables`` are the
        layers of every model chunk in order, ``order`` a list of 1-based
        chunk ids (+c: the forward of chunk c's next microbatch, -c: the
        backward of its oldest one), and ``sample_args`` one tuple per
        (layer, microbatch), chunk-major, then microbatch, then layer.
        Each (layer, microbatch) becomes its own runner, with its own static
        inputs, graphs and libvmmrt group, captured in the order's order,
        and the order is declared to the library before allocation
        (ping-pong makes the banks it needs). Every iteration must follow it:
        a call out of it is a ``VMMRT_E_MISMATCH`` naming the runner
        ("0:Block/mb2") and the one expected. Returns one callable per
        (layer, microbatch), in the sample_args' layout (modules are not
        changed); :func:`vmmrt.torch.pipeline.split` arranges them by chunk
        and microbatch. ``offload="auto"`` is not available with it.
    layers_per_chunk
        with ``order``: the layers of each chunk (an int, or one per chunk);
        by default the chunks share the callables equally.
    map_ahead
        memory that comes and goes with a layer (its resident activations,
        its gradients) is mapped once the GPU has begun the use this many
        uses before (forwards and backwards in the order they run): 1 holds
        the least at any moment; 0 maps as soon as the launch thread gets
        there (a whole pass ahead of the GPU, so the memory is all mapped at
        once). With 1 or more the launch thread waits for nothing when it
        replays graphs: a driver worker maps once the GPU has begun that use,
        and the GPU waits for the map before the use (vmmrt_slot_map_after,
        vmmrt_slot_wait_stream); eager on CUDA, the launch thread waits for
        the GPU and for each map (torch's copies are checked when enqueued).
        On the H200, 8 Llama-3-8B layers, mode "none", when the launch thread
        still waited with graphs too: 1: 1.047x graph-only's step time at
        1.059x its whole-step peak; 0: 1.014x at 1.170x.
    memory_budget
        (with ``mode="auto"`` the planner chooses the mode and look-ahead too)
        the device memory a training step may hold at the driver level:
        bytes, a share of the device ("80%"), a size ("60GiB"), or a
        :class:`vmmrt.torch.budget.Budget` (with a reserve for what the step
        adds later, such as optimizer states; or a hand plan). The planner
        chooses per layer what stays, what is offloaded and what is
        recomputed in backward (:func:`mark_recompute` forces the latter),
        for the least predicted step time within it
        (``offload_of(c).plan.summary()``); it replaces ``offload=``. No
        plan fits: :class:`vmmrt.torch.budget.BudgetError`, with the
        smallest budget that would.
    memory_plan
        True (the default): once
        the first step after the captures (after the warm-up without
        graphs) has run, the memory that comes and goes
        with a layer (its resident activations, its gradients) is put on
        one set of physical pages, each slot at an offset where it shares
        bytes only with slots whose lives over the step never overlap its
        own (a layer's resident memory holds the gradients of the layers
        whose backward comes after, as eager reuses freed blocks); the
        steady state then makes no driver call. Whether ``.grad`` is set to
        None between steps or kept (persistent gradients, which keep memory
        of their own) is learned from that first step. A tensor kept past
        the life the plan gave it (a ``.grad`` kept across the next forward)
        is detected where its bytes would be written over: the slot about
        to be used then gets memory of its own
        (``stats()["plan_conflicts"]``). ``describe()`` prints the plan. The
        pages stay mapped between steps; the optimizer step's allocations
        (foreach AdamW's temporaries, about the parameters' size) are made
        in their bytes free then, as eager PyTorch makes them in the
        memory the activations gave back (:mod:`vmmrt.torch.optmem`: a
        global optimizer-step hook routes them to a MemPool over the
        pages; a tensor the step leaves there is detected and keeps its
        bytes, ``stats()["optimizer_survivors"]``). What runs outside the
        graphed layers before their backward (a loss head) cannot use
        them.
        "slots": the plan, but the optimizer step's allocations left to
        PyTorch's caching allocator (as before; for comparison).
        False: each slot is mapped before its use and released after it
        (five driver calls per slot and step). With ``memory_budget=`` the
        budget planner predicts the plan's pages: the optimizer step's
        temporaries (``Budget(step=)``) in the bytes free on them at the
        step, where it can be routed there (else beside everything else).

    TransformerEngine's arguments (its make_graphed_callables, as Megatron-LM
    calls it; all keyword only here):

    sample_kwargs
        one dict of keyword arguments per sample tuple (per callable, or per
        (layer, microbatch) with ``order``): tensors among them are graph
        inputs like ``sample_args``; other values (None, flags) are part of
        the capture and every call must pass the same. Each call passes the
        sample's keywords; ``is_first_microbatch`` is accepted and ignored.
        Outputs may hold non-tensor leaves too (Megatron's layers return
        ``(hidden_states, None)``): they come back as captured.
    _order, _num_layers_per_chunk
        TE's names of ``order`` and ``layers_per_chunk``.
    retain_graph_in_backward
        capture the backward with ``retain_graph=True``.
    pre_warmup_hook, post_warmup_hook
        functions of no arguments run just before and after the warm-up.
    generators
        CUDA ``torch.Generator`` objects that random ops in the layers draw
        from, registered with every graph (``register_generator_state``) and
        set back after the warm-up and capture to their state before it, so
        that those do not shift the random numbers of training; by default,
        Megatron's graph-safe RNG tracker's when Megatron is loaded (as
        TransformerEngine does). torch.cuda.graph registers the default
        generator itself.
    fp8_enabled, fp8_recipe, fp8_group, fp8_weight_caching, fp8_calibrating
        accepted at their "no FP8" values; FP8 itself is refused
        (``VMMRT_E_NOT_SUPPORTED``). ``_reuse_graph_input_output_buffers``
        is refused when true.

    Returns what torch.cuda.make_graphed_callables returns; each returned
    callable has ``offload_of(c)`` (the :class:`Offload`: statistics, memory,
    the plan, :meth:`Offload.abort`). Errors name the layer and the cause
    (:class:`vmmrt.Error`).
    """
    if memory_plan is None:
        memory_plan = True
    elif not isinstance(memory_plan, bool) and memory_plan != "slots":
        raise TypeError("memory_plan=%r: True, False or \"slots\"" % (memory_plan,))
    _te.take_fp8(unknown)
    if unknown:
        _reject_unknown(unknown)
    order, layers_per_chunk, layout, gens = _validate_args(
        num_warmup_iters, allow_unused_input, pool, capture_error_mode, mode, lookahead, offload, graphs, grads, names,
        options, margin, min_bytes, order, layers_per_chunk, map_ahead, retain_graph_in_backward,
        pre_warmup_hook, post_warmup_hook, _order, _num_layers_per_chunk, _reuse_graph_input_output_buffers,
        memory_budget, callables, generators, loop)
    just_one, runners, marks, uses, device = _prepare_runners(callables, sample_args, names, layout, sample_kwargs,
                                                              gens, retain_graph_in_backward, graphs, offload, order)
    gen_states = [g.get_state() for g in gens]
    off, mode = _open_offload(runners, uses, device, mode, lookahead, options, min_bytes, map_ahead, graphs)
    off.loop = loop
    try:
        stream = _warmup(runners, uses, off, num_warmup_iters, allow_unused_input, pre_warmup_hook,
                         post_warmup_hook)
        _time_for_planning(uses, off, stream, allow_unused_input, graphs, offload, memory_budget)
        off = _allocate(runners, uses, off, layout, grads, mode, offload, memory_budget, marks, margin, graphs,
                        memory_plan)
        if graphs:
            captured = _capture_all(runners, off, stream, pool, capture_error_mode, allow_unused_input, grads, uses,
                                    memory_plan is not False)
            funcs = _calls(runners, off, captured)
        else:
            funcs = [recompute.wrap(r) if r.recompute else eager.wrap(r) for r in runners]
        off.plan_memory(memory_plan)
        _release_warmup(off)
    except BaseException:
        _close(off, runners)
        raise
    finally:
        # Warm-up and capture draw random numbers: training starts from the
        # generators' state before them, as TransformerEngine's does.
        for g, st in zip(gens, gen_states):
            g.set_state(st)
    if layout is not None:
        return _finish_pipeline(runners, funcs, off)
    return _finish(runners, funcs, off, just_one)


def _validate_args(num_warmup_iters, allow_unused_input, pool, capture_error_mode, mode, lookahead, offload, graphs,
                   grads, names, options, margin, min_bytes, order, layers_per_chunk, map_ahead,
                   retain_graph_in_backward, pre_warmup_hook, post_warmup_hook, _order, _num_layers_per_chunk,
                   _reuse_graph_input_output_buffers, memory_budget, callables, generators, loop=None):
    """Every argument checked before anything is built: (order,
    layers_per_chunk, the pipeline layout or None, the generators the graphs
    register), TransformerEngine's names taken for ours."""
    _te.check_flags(retain_graph_in_backward, _reuse_graph_input_output_buffers, pre_warmup_hook, post_warmup_hook)
    order, layers_per_chunk = _te.pipeline_args(order, layers_per_chunk, _order, _num_layers_per_chunk)
    gens = _te.generators(generators)
    if not graphs:
        gens = []
    _contracts.check_arguments(num_warmup_iters, allow_unused_input, pool, capture_error_mode,
                               1 if lookahead is None else lookahead, graphs, grads, names, options, margin, min_bytes)
    modes = vmmrt.option_choices("mode")    # the library's strategies
    if mode is not None and mode not in modes and not (mode == "auto" and memory_budget is not None):
        raise ValueError("mode=%r: choose %s ('auto' with memory_budget=)%s" % (
            mode, ", ".join(repr(m) for m in modes),
            "".join(" (did you mean %r?)" % m for m in difflib.get_close_matches(str(mode), modes, n=1))))
    if not isinstance(map_ahead, int) or isinstance(map_ahead, bool) or map_ahead < 0:
        raise ValueError("map_ahead=%r: a whole number of uses, 0 or more" % (map_ahead,))
    if grads not in GRADS:
        raise ValueError("grads=%r: choose %s" % (grads, ", ".join(repr(g) for g in GRADS)))
    if not (offload == "auto" or isinstance(offload, (bool, int, float))):
        raise ValueError("offload=%r: a fraction between 0 and 1, True/False, or 'auto'" % (offload,))
    if not isinstance(offload, str) and not 0 <= float(offload) <= 1:
        raise ValueError("offload=%r: a fraction between 0 and 1, True/False, or 'auto'" % (offload,))
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. "
                           "Please set `cache_enabled=False`.")
    layout = None
    if order is not None:
        if not isinstance(callables, tuple):
            raise TypeError("order= takes a tuple of callables (the layers of every chunk)")
        layout = pipeline.Layout(order, len(callables), layers_per_chunk)
        if offload == "auto":
            raise ValueError("offload='auto' with order=: the planner hides each layer's copies behind the next "
                             "layer's compute, one microbatch at a time; give a fraction")
    elif layers_per_chunk is not None:
        raise ValueError("layers_per_chunk= goes with order=")
    if memory_budget is not None and (order is not None or offload == "auto"):
        raise ValueError("memory_budget= with %s: the budget planner chooses what is offloaded, one microbatch at a "
                         "time; leave %s out" % (("order=", "order=") if order is not None else
                                                 ("offload='auto'", "offload=")))
    if memory_budget is not None:
        budget.check(memory_budget)
    if loop is not None:
        budget.check_loop(loop, "loop=%r (None: both)")
    if loop is not None and memory_budget is not None:
        raise ValueError("loop= with memory_budget=: give the budget's loop as vmmrt.torch.Budget(..., loop=%r)"
                         % (loop,))
    return order, layers_per_chunk, layout, gens


def _release_warmup(off):
    """The warm-up's and the captures' transients (a layer's activations and
    gradients, eagerly, several times) stay cached in PyTorch's allocator
    after the build, and nothing of a step takes them again: the slots, the
    plan's pages and the graphs' pool hold the step's memory. Given back to
    the driver now (on the H200, 8 Llama-3-8B layers: 954 MiB cached and
    unused after the build, in a process that does not empty the cache
    itself; the bench does, and its peaks did not change)."""
    if off.device_type == "cuda":
        from vmmrt.torch import empty_cache
        torch.cuda.synchronize(off.device)
        empty_cache()         # (and what it gave back may free a closed runtime: vmmrt.torch._arena)


def _prepare_runners(callables, sample_args, names, layout, sample_kwargs, gens, retain_graph, graphs, offload,
                     order):
    """(just_one, the runners, their mark_recompute() marks, their uses, the
    device): one runner per callable (per (layer, microbatch) with order=),
    checked as torch checks them; ``uses``: (backward, runner) in the order they run, every forward
    then the backwards in reverse, or the pipeline's."""
    just_one, runners = _callables.prepare(callables, sample_args, names, layout, sample_kwargs)
    for r in runners:
        r.generators, r.retain_graph = tuple(gens), retain_graph
    marks = recompute.marks(runners)
    if any(marks) and (order is not None or offload == "auto"):
        raise ValueError("mark_recompute() layers with %s: give memory_budget= (or a fraction) instead"
                         % ("order=" if order is not None else "offload='auto'"))
    device = _device_of(runners)
    if graphs and device.type != "cuda":
        raise ValueError("graphs=True needs CUDA tensors (sample arguments are on %s); use graphs=False for "
                         "eager offload" % device)
    if layout is None:
        uses = [(False, r) for r in runners] + [(True, r) for r in reversed(runners)]
    else:
        uses = [(b, runners[i]) for b, i in layout.uses()]
    return just_one, runners, marks, uses, device


def _open_offload(runners, uses, device, mode, lookahead, options, min_bytes, map_ahead, graphs):
    """(the Offload, the mode asked): the runtime, with the environment checked
    once against the caller's own arguments, and a layer (a group) per
    runner, in forward order, and the order they run in."""
    s = _contracts.environment_settings({"mode": mode, "lookahead": lookahead}, runtime_options(device), options,
                                        "vmmrt.torch.make_graphed_callables", stacklevel=4)
    mode, lookahead = s["mode"], s["lookahead"]
    off = Offload(mode="pingpong" if mode == "auto" else mode, lookahead=lookahead, device=device, options=options,
                  min_bytes=min_bytes, _settled=True)
    off.map_ahead = map_ahead
    try:
        for b, r in uses:
            if not b:                        # groups in forward order
                static = r.params + r.buffers + (r.sample if graphs else ())
                r.layer = off.layer(r.name, static=static)
                r.layer.compiled = _compiled.is_compiled(r.fn)
                r.layer.backward_once = not (graphs and r.retain_graph)
        off.set_order([(r.layer, b) for b, r in uses])
    except BaseException:
        off.close()
        raise
    return off, mode


def _close(off, runners):
    """A build that failed: its runtime goes (the planner's, if it made another)."""
    off.close()
    for r in runners:
        if r.layer is not None:
            r.layer.offload.close()


def _allocate(runners, uses, off, layout, grads, mode, offload, memory_budget, marks, margin, graphs,
              memory_plan=False):
    """After the warm-up: the gradients' slots, the pipeline's schedule, what
    moves (a fraction, the bandwidth planner's "auto", or the budget
    planner's plan, which may choose another mode: then another runtime,
    returned), and the allocation with every fixed address learned.
    ``memory_plan`` (make_graphed_callables'): with a plan (True or
    "slots"), the graphs' static inputs go in the resident slots
    (vmmrt.torch.static_inputs), on its pages: without one the slot is
    mapped per step, and a call's copy into it (a cudaMemcpyAsync, which
    the driver checks when it is enqueued) would wait for the map on the
    launch thread; with True the budget planner predicts the optimizer
    step on the pages."""
    inputs_here = memory_plan is not False and graphs and layout is None
    if inputs_here:
        # (before the budget planner, which counts them with their layers)
        for r in runners:
            r.layer.input_bytes = static_inputs.sizes(r.sample)

    def allocate(off, **how):
        off.allocate(**how)
        if inputs_here:
            for r in runners:
                static_inputs.place(r)

    if grads == "mapped":
        _make_grads(runners, off, graphs)
    if layout is not None:
        off.set_schedule([(r.layer, b) for b, r in uses])
    if memory_budget is not None or any(marks):
        plan = planner.budget_plan(off, memory_budget, margin, runners, graphs, offload, marks,
                                   budget.auto_strategies() if mode == "auto" else None,
                                   pages=memory_plan is True)
        if mode == "auto":          # the planner's strategy: another runtime, the same discovery
            off = planner.adopt(off, plan, runners, uses)
            if grads == "mapped":
                _make_grads(runners, off, graphs)
        for r, c in zip(runners, plan.layers):
            r.recompute = r.layer.recompute = c.action == "recompute"
        if grads == "mapped" and not recompute.CHECKPOINTED and any(
                r.recompute and r.grads is not None and r.grads.io_bytes for r in runners):
            _make_grads(runners, off, graphs)   # a recomputed layer's backward keeps its statics: none in its slot
        allocate(off, plan=plan)
        log.info("%s", plan.summary())
    elif offload == "auto":
        plan = _plan(runners, off, margin, graphs, memory_plan)
        # (before the allocation: the device's memory now is the static part)
        off.step_model = planner.step_model(off, runners, graphs, [p.chosen for p in plan.layers],
                                            pages=memory_plan is True, planned=memory_plan is not False)
        allocate(off, plan=plan)
        log.info("%s", plan.summary())
    else:
        off.step_model = planner.step_model(off, runners, graphs, offload=offload, pages=memory_plan is True,
                                            planned=memory_plan is not False)
        allocate(off, offload=float(offload))
    if graphs and layout is None:
        for r in runners:
            r.layer.plan_outputs(recomputed=recompute.CHECKPOINTED)
    return off


def _make_grads(runners, off, graphs):
    """One Grads per callable (its pipeline runners share the parameters),
    in place of those made before; with graphs, the backward graph's output
    and argument gradients in an io slot beside it (Grads.io)."""
    by_callable = {}
    count = collections.Counter(r.callable_index for r in runners)
    for r in runners:
        if r.grads is not None and r.grads.offload is off and r.grads.backing is not None:
            r.grads.drop()
    for r in runners:
        g = by_callable.get(r.callable_index)
        if g is None:
            name = r.name.split("/mb")[0] if r.microbatch is not None else r.name
            # the backward's statics in the slot: one runner's (a pipeline's
            # runners of one callable each keep theirs where they are), whose
            # backward graph is its own (a recomputed one's has its statics
            # where torch's checkpoint does not take the graphs' route)
            own = not (r.recompute and not recompute.CHECKPOINTED)
            g = Grads(off, name, r.params, r.grads_seen, outputs=graphs and count[r.callable_index] == 1 and own)
            if not g.mapped:
                log.info("vmmrt: layer %r keeps static gradient buffers: %s", name, g.why)
            by_callable[r.callable_index] = g
        r.grads = g
        r.layer.grads = g
    off._close_hooks.append(lambda: [g.own_grads() for g in by_callable.values()])


def _device_of(runners):
    for r in runners:
        for t in r.sample + r.params:
            return t.device
    return torch.device("cuda") if _compat.cuda_available() else torch.device("cpu")


_side = threading.local()


def _side_stream():
    """This thread's warm-up and capture stream on the current device, the
    same at every build: PyTorch keeps a cuBLAS workspace (32 MiB on Hopper)
    per handle and stream for the life of the process, so a new stream per
    build left two more (the forward's and the autograd thread's) on the
    H200 after each build was torn down."""
    streams = getattr(_side, "streams", None)
    if streams is None:
        streams = _side.streams = {}
    index = torch.cuda.current_device()
    s = streams.get(index)
    if s is None:
        s = streams[index] = torch.cuda.Stream(device=index)
    return s


def _warmup(runners, uses, off, iters, allow_unused_input, pre_hook=None, post_hook=None):
    """Warm-up and discovery of every runner in forward order, between the
    caller's hooks; returns the stream the captures go on (None on the host
    backend). On a side stream on CUDA: autograd nodes made on the legacy
    default stream and kept alive made a later backward capture depend on it
    (cudaErrorStreamCaptureImplicit)."""
    forwards = [r for b, r in uses if not b]
    if pre_hook is not None:
        pre_hook()
    if off.device_type != "cuda":
        _callables.warmup(forwards, iters, allow_unused_input)
        stream = None
    else:
        torch.cuda.synchronize()
        stream = _side_stream()
        with torch.cuda.stream(stream):
            _callables.warmup(forwards, iters, allow_unused_input)
        torch.cuda.synchronize()
    if post_hook is not None:
        post_hook()
    return stream


def _time_for_planning(uses, off, stream, allow_unused_input, graphs, offload, memory_budget):
    """Where a planner will choose (offload="auto", memory_budget=) over
    graphs: the layers' times from replays of graphs captured for timing,
    not from the eager warm-up (vmmrt.torch.replay_times)."""
    if not graphs or (offload != "auto" and memory_budget is None):
        return
    time_one = replay_times.timer(off, stream, allow_unused_input)
    if time_one is not None:
        _, gbps, slow = replay_times.measure([r for b, r in uses if not b], time_one)
        off.copy_gbps = gbps if gbps != (None, None) else None
        off.copy_contention = slow if slow != (None, None) else None


def _plan(runners, off, margin, graphs, memory_plan):
    d2h, h2d = planner.copy_bandwidth(off)
    rows = []
    for r in runners:
        sizes = [g.nbytes for g in off.candidates(r.layer)]
        rows.append((r.layer.name, min(r.layer.fwd_ms), min(r.layer.bwd_ms), sizes))
    # ping-pong's banks alternate in creation order without a declared schedule
    peak = planner.peak_model(off, runners, graphs, pages=memory_plan is True, planned=memory_plan is not False,
                              loop=off.loop)
    return planner.lightest(rows, d2h, peak, off.granularity,
                            h2d_gbps=h2d, margin=margin, banked=off.mode == "pingpong" and off.schedule is None,
                            contention=off.copy_contention)


def _capture(r, what, graph, pool, stream, error_mode, body, guard=None):
    """Capture body() into graph; any failure becomes an Error naming the layer,
    what was captured and the cause (the first one: a failed capture's end
    reports only that the capture was invalidated; _compat.capture), but a
    stop of ``guard`` (a reuse.Guard), which is reuse.Overwritten."""
    try:
        for g in r.generators:
            graph.register_generator_state(g)
        return _compat.capture(graph, pool, stream, error_mode, body)
    except BaseException as e:  # noqa: B902 - made an Error naming the layer
        if guard is not None and guard.violation is not None:
            raise reuse.Overwritten(guard.violation) from e
        inner = original_error(e, [r.layer.last_rec]) or e
    r.layer.offload.fail("layer %r: %s capture failed: %s" % (r.name, what, inner))
    if isinstance(inner, Error):
        raise inner
    if _te.rng_failure(inner):
        raise Error(_capi.E_CAPTURE, "%s capture failed in %s: %s: %s" % (what, _te.RNG_HINT, type(inner).__name__,
                                                                           inner), "layer %r" % r.name) from inner
    raise Error(_capi.E_CAPTURE, "%s capture failed (is there an operation inside the layer that cannot be "
                "captured, such as a host synchronization, .item(), or a shape that depends on data?): "
                "%s: %s" % (what, type(inner).__name__, inner), "layer %r" % r.name) from inner


def _capture_all(runners, off, stream, pool, error_mode, allow_unused_input, grads, uses, graph_pool=True):
    """Capture every runner's forward and backward graph in the order they will
    run (``uses``: (backward, runner) pairs), in one pool or one per use
    (vmmrt.torch.graphpool): a replay in that order finds the pool's memory
    as its capture left it. With grads="mapped"
    a runner has two backward graphs (write and accumulate, vmmrt.torch.grads),
    captured one after the other; one of them runs at each backward. Returns
    (forward, backward, accumulate or None) graphs per runner, every slot
    released that nothing holds once the captures are over. ``graph_pool``:
    the pool on a slot of the library's (vmmrt.torch.graphpool), for a
    memory plan to lend at the optimizer step; without a plan it would only
    hold what torch's pool holds."""
    gp = graphpool.open_for(off, runners, pool, stream) if graph_pool else None
    mempool = None if gp is not None else torch.cuda.graph_pool_handle() if pool is None else pool
    handle = stream.cuda_stream if stream is not None else None
    # grads="mapped": a loop replays one of a runner's two backward graphs at
    # every backward (the write graph where .grad is None, as set_to_none
    # leaves it): the other, instantiated, would hold an executable graph's
    # device memory for nothing (DEFER_MAPPED_BACKWARDS)
    later = _compat.deferred_graph if DEFER_MAPPED_BACKWARDS and grads == "mapped" else torch.cuda.CUDAGraph
    captured = [(torch.cuda.CUDAGraph(), later(), None) for _ in runners]
    _before_capture(runners, off, grads, captured)
    _blas_workspaces_given_back(off)
    off.capturing = True
    try:
        for backward, r in uses:
            if gp is not None:
                mempool = gp.pool_for((r.name, backward))
                first = gp.mark((r.name, backward))
            fwd, bwd, acc = captured[r.index]
            if r.recompute and not recompute.CHECKPOINTED:
                acc = _capture_recomputed(r, backward, bwd if backward else fwd, mempool, stream, error_mode,
                                          allow_unused_input) or acc
            elif backward and r.grad_mode == "mapped":
                acc = later()
                if r.recompute:
                    recompute.register_backward(r, acc)
                if not _capture_backward_mapped(r, bwd, acc, mempool, stream, error_mode, allow_unused_input):
                    bwd, acc = later(), later()
                    if r.recompute:     # (both new: the recomputation's states registered with each)
                        recompute.register_backward(r, bwd)
                        recompute.register_backward(r, acc)
                    _capture_backward_mapped(r, bwd, acc, mempool, stream, error_mode, allow_unused_input,
                                             reuse_ok=False)
                if r.grad_mode != "mapped":
                    acc = None
            elif backward:
                _capture_backward(r, bwd, mempool, stream, error_mode, allow_unused_input, r.grad_mode)
            elif r.recompute:
                out = _capture(r, "forward (checkpointed: its backward runs it again)", fwd, mempool, stream,
                               error_mode, recompute.forward_checkpointed(r, handle))
                r.static_outputs = tuple(r.split_outputs(out))
                _adopt_outputs(r, handle)
            else:
                _capture_forward(r, fwd, mempool, stream, error_mode, handle)
            captured[r.index] = (fwd, bwd, acc)
            if gp is not None:
                gp.mark((r.name, backward), first)
    except BaseException:
        try:
            if gp is not None:
                gp.abandon()
        finally:
            _blas_workspaces_given_back(off)
        raise
    finally:
        off.capturing = False
    try:
        if gp is not None:
            gp.cut()
        _after_capture(runners, off)
    finally:
        if gp is not None:
            gp.place()      # the captures' leftovers gone: what the history saw is what replays use
        _blas_workspaces_given_back(off)
    return captured


def _blas_workspaces_given_back(off):
    """Every cuBLAS workspace PyTorch keeps (one per handle and stream, for
    the process) given back, before the captures and after them. A captured
    cuBLAS call keeps the address of the workspace it ran with, and the
    captures go on the stream the warm-up ran on: without this, that is the
    warm-up's workspace in the caching allocator's general pool, which
    anyone emptying the workspaces frees under the graphs (torch.compile's
    CUDA graph trees do around each recording; so did the benchmark's
    --one-time, whose next vmmrt step faulted on the H200). So the captures
    make theirs in the graphs' pool, in use at every replay as far as the
    pool's plan knows (the memory history is read before the second call,
    which only lets go of the blocks), and nothing is allocated from that
    pool after the captures. As torch.compile does: a pool of someone
    else's that is captured into again after this may place a tensor on a
    workspace its older graphs still use."""
    # (no wait first: a block let go is reused by later work of its stream alone)
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None) if off.device_type == "cuda" else None
    if clear is not None:
        clear()


def _before_capture(runners, off, grads, captured):
    """Each runner's gradient mode as its graphs will have it, a recomputed
    one's generator states, grads="accumulate"'s .grad tensors; and every slot
    a capture writes mapped before the first capture, nothing released until
    the last: a driver call of a worker during a "global" capture would
    invalidate it."""
    for r in runners:
        r.grad_mode = grads if grads != "mapped" else ("mapped" if r.grads is not None and r.grads.mapped
                                                       else "static")
        if r.recompute:
            r.grad_mode = "mapped" if r.grad_mode == "mapped" else "static"
            recompute.prepare_graphs(r, captured[r.index][0], captured[r.index][1], off)
    if grads == "accumulate":
        static_grads.prepare_accumulate(runners)
    for b in off.backings:
        b.ensure()


def _after_capture(runners, off):
    """The captures' leftovers go: the autograd graph of each forward capture
    (what it saved: capture-time tensors over the slots), and the memory of
    every slot that no tensor holds now (released on the current stream)."""
    for r in runners:
        r.static_outputs = tuple(o.detach() for o in r.static_outputs)
    gc.collect()
    for r in runners:
        if r.layer.outputs is not None:
            r.layer.outputs.settle()
    if off.graph_pool is not None:
        off.graph_pool.settle([t for r in runners for seq in (r.static_outputs, r.static_grad_inputs,
                                                               r.acc_grad_inputs) for t in seq or ()])
    s, _ = _call.stream_source(off)()
    for b in off.backings:
        if b.live == 0:
            b.release(s)
    off.flush()


def _calls(runners, off, captured):
    """The callable of each runner over its graphs (vmmrt.torch._call), with
    what every call needs decided now."""
    # (parameter, its static gradient buffer, its slot) of every runner: see static_grads.unalias.
    aliases = static_grads.Aliases(
        (p, r.static_grad_inputs[r.n_user + k], r.grads.backing if r.pinned_grads is not None else None)
        for r in runners for k, p in enumerate(r.params)
        if r.grad_mode == "static" and r.static_grad_inputs[r.n_user + k] is not None)
    # its static buffers let go at close(), as the callables' own (_call._forget)
    off._close_hooks.append(lambda: setattr(aliases, "items", ()))
    streams, raw = _call.stream_source(off), _call.raw_stream_source(off)
    return [_call.make(r, fwd, bwd, acc, aliases, streams, raw) for r, (fwd, bwd, acc) in zip(runners, captured)]


def _capture_forward(r, graph, mempool, stream, error_mode, handle):
    def fwd():
        with r.layer.capturing(handle, r.sample) as p:
            out = r.call(r.sample)
            p.outputs = out
        return out
    out = _capture(r, "forward", graph, mempool, stream, error_mode, fwd)
    r.static_outputs = tuple(r.split_outputs(out))
    _adopt_outputs(r, handle)


def _adopt_outputs(r, handle):
    """After a forward's capture: its outputs' slot goes where no output was born in it."""
    if r.layer.outputs is not None and not r.layer.outputs.adopt(r.static_outputs):
        log.info("vmmrt: layer %r: no output of its forward was born in its outputs' slot: they stay in the graph "
                 "pool", r.name)
        r.layer.drop_outputs(handle)


def _capture_recomputed(r, backward, graph, mempool, stream, error_mode, allow_unused_input):
    """A recomputed runner (vmmrt.torch.recompute): its forward saves nothing, its backward
    graph runs the forward again, then the gradients; returns a mapped one's accumulate graph."""
    def capture(what, gr, body):
        return _capture(r, what, gr, mempool, stream, error_mode, body)
    if not backward:
        recompute.after_forward(r, capture("forward", graph, recompute.forward_body(r)))
    elif r.grad_mode == "mapped":
        return recompute.capture_mapped(r, graph, allow_unused_input, capture)
    else:
        r.static_grad_inputs = capture("backward (recomputing the forward)", graph,
                                       recompute.backward_body(r, allow_unused_input))
    return None


def _capture_backward(r, graph, mempool, stream, error_mode, allow_unused_input, grads):
    r.static_grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in r.static_outputs)
    need = tuple(o for o in r.static_outputs if o.requires_grad)
    grad_inputs = None
    if need:
        def bwd():
            with r.layer.capturing_backward(), quiet_hooks(r.params if grads == "static" else ()):
                gos = tuple(o for o in r.static_grad_outputs if o is not None)
                if grads == "static":
                    return torch.autograd.grad(need, tuple(i for i in r.surface if i.requires_grad), gos,
                                               only_inputs=True, allow_unused=allow_unused_input,
                                               retain_graph=r.retain_graph)
                return static_grads.backward_accumulate(r, need, gos)
        grad_inputs = _capture(r, "backward", graph, mempool, stream, error_mode, bwd)
    static = []
    k = 0
    for a in r.surface:
        if a.requires_grad and grad_inputs is not None:
            static.append(grad_inputs[k])
            k += 1
        else:
            static.append(None)
    r.static_grad_inputs = tuple(static)


def _grad_outputs(r, g, outsbase):
    """The backward graph's output gradients, and whether they are in the
    output gradients' slot (over outsbase): there where the warm-up gave
    them the layouts they have now, else tensors of their own."""
    need = [o for o in r.static_outputs if o.requires_grad]
    fits = bool(g.gouts) and len(g.gouts) == len(need) and all(
        (o.dtype, tuple(o.shape)) == (dt, shape) for o, (_, dt, shape, _) in zip(need, g.gouts))
    out, j = [], 0
    for o in r.static_outputs:
        if not o.requires_grad:
            out.append(None)
            continue
        out.append(g.gout(outsbase, j) if fits else torch.empty_like(o))
        j += 1
    g.gouts_used = g.gouts_used or fits
    return tuple(out), fits


def _capture_backward_mapped(r, graph, acc_graph, mempool, stream, error_mode, allow_unused_input, reuse_ok=True):
    """grads="mapped": the write graph (the ops that make each parameter's
    gradient write it at its fixed address) and the accumulate graph
    (AccumulateGrad adds into the .grad already there, in place). Both write
    the gradients of the user's inputs into the same static tensors. A
    gradient that does not land at its address makes the runner "static"
    (the write graph's outputs become its static buffers, over a slot that
    then stays mapped). The backward's temporaries go in the resident
    slot's bytes that it has read for the last time (vmmrt.torch.reuse)
    unless ``reuse_ok`` is False; returns False when a capture read bytes a
    temporary had taken (reuse.Guard): both graphs are then to be made
    again without it."""
    g = r.grads
    need = tuple(o for o in r.static_outputs if o.requires_grad)
    inputs = [x for x in r.sample if x.requires_grad]
    wrt = tuple(i for i in r.surface if i.requires_grad)
    dev = r.layer.offload.device_type
    if not need:
        r.static_grad_outputs = tuple(None for _ in r.static_outputs)
        r.static_grad_inputs = tuple(None for _ in r.surface)
        r.grad_mode = "static"
        return True
    base = g.backing.tensor(None, counted=False)
    iobase, outsbase = g.io_base(), g.outs_base()
    r.static_grad_outputs, r.gouts_in_slot = _grad_outputs(r, g, outsbase)
    gos = tuple(o for o in r.static_grad_outputs if o is not None)
    placed = g.placements(base, iobase)
    reusing = _reuse_plan(r) if reuse_ok else None
    guard, temps = _reuse_targets(r, reusing)
    mode = place.Mode(dev, placed + temps, g.known, r.layer.static, observer=guard)

    def write():
        with r.layer.capturing_backward(), quiet_hooks(r.params):
            with mode:
                return torch.autograd.grad(need, wrt, gos, only_inputs=True, allow_unused=allow_unused_input,
                                           retain_graph=True)
    try:
        res = _capture(r, "backward", graph, mempool, stream, error_mode, write, guard)
    except reuse.Overwritten:
        return _reuse_dropped(r, reusing, guard, "write")
    if reusing:
        reusing.placed_bytes = sum(p.birth.storage_nbytes for p in temps if p.how == "placed")
    by_id = {id(t): v for t, v in zip(wrt, res)}
    n_params = len(g.regions)
    missed = [p.birth.describe() + ": " + (p.why or "not placed") for p in placed[:n_params] if p.how is None]
    if missed:
        log.warning("vmmrt: layer %r: gradients not at their addresses at capture (%s): static buffers",
                    r.name, "; ".join(missed))
        r.grad_mode = "static"
        r.pinned_grads = base      # the slot stays mapped under the static buffers in it
        g.backing.pin()
        if g.io is not None:
            r.pinned_io = iobase   # and the io slot under the argument gradients
            g.io.pin()
        if g.outs is not None:
            r.pinned_outs = outsbase   # and the output gradients'
            g.outs.pin()
        r.static_grad_inputs = tuple(by_id.get(id(a)) if a.requires_grad else None for a in r.surface)
        return True
    # The inputs' gradients: the accumulate graph writes them where the write
    # graph's are (same ops: the same births), so both share the static tensors:
    # in the slot where the write graph put them there, else in the pool.
    r.gin_where = tuple(g.gins[k] if g.gin_at(k, by_id.get(id(x))) else None for k, x in enumerate(r.sample))
    if not any(r.gin_where):
        r.gin_where = None
    targets = []
    for k, x in enumerate(r.sample):
        gx = by_id.get(id(x)) if x.requires_grad else None
        if gx is None:
            continue
        if r.gin_where is not None and r.gin_where[k] is not None:
            targets.append(g.gin_placement(iobase, k))
            continue
        b = mode.births.get(_compat.storage_of(gx)[0])
        if b is not None:
            targets.append(place.Placed(b, _compat.tensor_over(gx, b.dtype, b.shape, b.stride, b.offset)))
    acc_guard, acc_temps = _reuse_targets(r, _reuse_plan(r, True) if reusing else None)
    acc_mode = place.Mode(dev, targets + acc_temps, mode.by_key, r.layer.static, observer=acc_guard)
    params = [p for p in r.params if p.requires_grad]
    kept = [x.grad for x in inputs]
    for k, p in enumerate(r.params):
        if p.requires_grad:
            p.grad = g.view(base, k)
    for x in inputs:
        x.grad = None

    def accumulate():
        with r.layer.capturing_backward(), quiet_hooks(params):
            with acc_mode:
                # (retained with a reuse plan: a capture its Guard stops is made again, from the same graph)
                torch.autograd.backward(need, gos, inputs=inputs + params,
                                        retain_graph=r.retain_graph or acc_guard is not None)
        return tuple(x.grad for x in inputs)
    try:
        acc_in = _capture(r, "backward (accumulate)", acc_graph, mempool, stream, error_mode, accumulate, acc_guard)
    except reuse.Overwritten:
        return _reuse_dropped(r, reusing, acc_guard, "accumulate")
    finally:
        for x, old in zip(inputs, kept):
            x.grad = old
        for p in params:
            p.grad = None
    if acc_guard is not None and r.layer.reuse_acc is not None:
        r.layer.reuse_acc.placed_bytes = sum(p.birth.storage_nbytes for p in acc_temps if p.how == "placed")
    acc_by_id = {id(x): v for x, v in zip(inputs, acc_in)}
    # The parameters' part is None: their gradients come from r.grads.
    r.static_grad_inputs = tuple(by_id.get(id(a)) if a.requires_grad else None for a in r.sample) + \
        (None,) * len(r.params)
    r.acc_grad_inputs = tuple(acc_by_id.get(id(a)) if a.requires_grad else None for a in r.sample) + \
        (None,) * len(r.params)
    r.acc_shared = all(a is None or (b is not None and a.data_ptr() == b.data_ptr())
                       for a, b in zip(r.static_grad_inputs, r.acc_grad_inputs))
    if not r.acc_shared:
        log.info("vmmrt: layer %r: the accumulate graph's input gradients have buffers of their own", r.name)
    return True


def _reuse_plan(r, accumulate=False):
    """The runner's reuse plan (vmmrt.torch.reuse) for its write graph, or
    for its accumulate graph (from the warm-up's pass that accumulated,
    where the parameters' gradients are temporaries too; else the write
    graph's), made once per layer; None where there is none."""
    lay = r.layer
    if lay.timeline is None or lay.resident is None or r.retain_graph:
        return None     # (retain_graph_in_backward: a backward that runs twice reads its regions again)
    if lay.reuse is None:
        lay.reuse = reuse.layer_plan(lay, *lay.timeline)
    if accumulate and lay.timeline_acc is not None:
        if lay.reuse_acc is None:
            lay.reuse_acc = reuse.layer_plan(lay, *lay.timeline_acc)
        return lay.reuse_acc or None
    return lay.reuse or None


def _reuse_targets(r, reusing):
    """(a reuse.Guard, the place.Placed of the plan) for one capture, or (None, [])."""
    if not reusing:
        return None, []
    res = r.layer.resident
    return reuse.Guard(res.address, res.address + res.nbytes), reuse.targets(reusing, res.tensor(None, counted=False))


def _reuse_dropped(r, reusing, guard, graph):
    """A capture that would have read bytes a temporary had taken: logged, the
    plans dropped for this layer (``reusing``, its write graph's, says why);
    False (both graphs to be made again)."""
    reusing.fallback = "its %s graph: %s" % (graph, guard.violation)
    for p in (reusing, r.layer.reuse_acc):
        if p is not None:
            p.placed_bytes = 0
    log.warning("vmmrt: layer %r: its backward would read bytes a temporary had taken (%s): captured again with "
                "its temporaries in the graph pool", r.name, reusing.fallback)
    return False


def _finish(runners, funcs, off, just_one):
    ret = []
    for r, f in zip(runners, funcs):
        f.vmmrt_offload = off
        if r.module is not None:
            m = r.module
            orig = m.forward
            r.orig_forward = orig
            training = m.training

            def new_forward(*args, _m=m, _f=f, _orig=orig, _training=training, **kwargs):
                if _m.training == _training:
                    return _f(*args, **kwargs)
                return _orig(*args, **kwargs)

            m.forward = new_forward
            m.vmmrt_offload = off
            ret.append(m)
        else:
            ret.append(f)
    return ret[0] if just_one else tuple(ret)


def _finish_pipeline(runners, funcs, off):
    """One function per (layer, microbatch), as TransformerEngine returns them for
    an order: a module is shared by its microbatches' runners, so it keeps its
    own forward; each function runs its runner while the module's training
    flag is the one it was graphed in, and the module's forward otherwise."""
    ret = []
    for r, f in zip(runners, funcs):
        if r.module is not None:
            m, training = r.module, r.module.training
            r.orig_forward = m.forward

            def run(*args, _m=m, _f=f, _training=training, **kwargs):
                if _m.training == _training:
                    return _f(*args, **kwargs)
                return _m(*args, **kwargs)
        else:
            run = f
        run.__name__ = "vmmrt_%s" % r.name
        run.vmmrt_offload = off
        run.vmmrt_runner = r.name
        ret.append(run)
    return tuple(ret)


def offload_of(c: Callable) -> Offload:
    """The :class:`Offload` behind a callable returned by make_graphed_callables."""
    off = getattr(c, "vmmrt_offload", None)
    if off is None:
        raise ValueError("%r did not come from vmmrt.torch.make_graphed_callables" % (c,))
    return off
