# SPDX-License-Identifier: LGPL-2.1-or-later
"""One libvmmrt runtime and the layers that offload through it.

An :class:`Offload` is what :func:`vmmrt.torch.make_graphed_callables` builds
for its callables; frameworks with their own runners use it directly:

    off = vmmrt.torch.Offload(mode="pingpong", lookahead=1)
    layers = [off.layer("layer%d" % i, static=m.parameters()) for i, m in enumerate(model)]
    ... discovery passes (LayerOffload.discovering) ...
    off.allocate(offload=1.0)          # or a fraction, or plan=vmmrt.torch.planner.plan(...)
    ... captures and replays (LayerOffload.capturing, the four hooks) ...
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterable

import torch

import vmmrt
from vmmrt import Error, _capi
from vmmrt.torch import _arena, _compat, _contracts, _launch, backing as _backing, gradshare, select
from vmmrt.torch import static_inputs as _static_inputs
from vmmrt.torch.backing import Backing, flush_late
from vmmrt.torch.layer import LayerOffload

log = logging.getLogger("vmmrt.torch")

def runtime_options(device):
    """The C options that put a runtime on a torch device: the cuda backend on
    its ordinal, or the host backend (CPU tensors)."""
    if device.type == "cuda":
        return {"backend": "cuda", "device": device.index if device.index is not None else
                torch.cuda.current_device()}
    if device.type == "cpu":
        return {"backend": "host"}
    raise ValueError("no libvmmrt backend for device %s" % device)


def check_runtime_device(info, device):
    """Raise unless a runtime (its ``vmmrt.Runtime.info()``) works on the torch
    device its tensors are on. The VMMRT_* environment overrides the options
    the package passes (option "environment", default override): a
    VMMRT_DEVICE or VMMRT_BACKEND exported for a whole job would put the
    runtime of every process of a torchrun job on one device, or on the host
    backend, under CUDA tensors of another."""
    if device.type != "cuda":
        return
    if info["backend"] == "cuda" and info["device_ordinal"] == device.index:
        return
    env = ", ".join("%s=%s" % (k, os.environ[k]) for k in ("VMMRT_BACKEND", "VMMRT_DEVICE", "VMMRT_ENVIRONMENT")
                    if k in os.environ)
    raise Error(_capi.E_MISMATCH, "the tensors are on %s, but libvmmrt's runtime opened %s device %d (%s)%s: the "
                "VMMRT_* environment overrides the device and backend vmmrt.torch asks for; unset VMMRT_DEVICE and "
                "VMMRT_BACKEND (vmmrt.torch takes each process's device from its tensors: under torchrun, "
                "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before building the layers), or pass "
                "options={'environment': 'fallback'}"
                % (device, info["backend"], info["device_ordinal"], info.get("device", "?"),
                   " with " + env if env else ""), "vmmrt.torch.Offload")


def _storages(tensors):
    out = set()
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            out.add(_compat.storage_of(t)[0])
    return out


class Offload:
    """A libvmmrt runtime for one set of layers, created in forward order.

    ``mode``: "pingpong" (two resident banks), "remap" (memory released after
    the D2H and mapped again before the H2D) or "none" (resident, same hooks);
    left out, VMMRT_MODE's, else "pingpong".
    ``lookahead``: restores started ahead of the backward being run; left
    out, VMMRT_LOOKAHEAD's, else 1. Every VMMRT_* variable is checked by the
    library before the runtime opens (a malformed one is an error, as in the
    C tools); one that says otherwise than an argument is a warning naming
    both, and the argument applies (unless ``options={"environment":
    "override"}``).
    ``device``: a CUDA device (the cuda backend on its ordinal; by default
    the current device, so under torchrun the one torch.cuda.set_device gave
    the process), or "cpu" for the host backend (a GPU emulated on host
    memory; CPU tensors); a runtime the environment put elsewhere
    (VMMRT_DEVICE, VMMRT_BACKEND) is refused. One runtime per process and
    device; runtimes of different processes are independent. ``options``:
    any further C option ("driver_workers", "handle_pool", "timeout_ms", ...).
    ``min_bytes``: smaller regions stay (a copy node in the graph and a slot
    offset each, for memory that does not matter: scalars, index tensors).
    """

    def __init__(self, mode: str | None = None, lookahead: int | None = None,
                 device: torch.device | str | None = None, options: dict[str, Any] | None = None,
                 min_bytes: int = 1 << 16, _settled: bool = False) -> None:
        _contracts.check_offload_arguments(1 if lookahead is None else lookahead, min_bytes)
        if mode is not None and not isinstance(mode, str):
            raise TypeError("mode=%r: one of %s" % (mode, ", ".join(repr(m) for m in vmmrt.option_choices("mode"))))
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if _compat.cuda_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if not _settled:     # make_graphed_callables has done it, for its own arguments
            s = _contracts.environment_settings({"mode": mode, "lookahead": lookahead}, runtime_options(device),
                                                options, "vmmrt.torch.Offload")
            mode, lookahead = s["mode"], s["lookahead"]
        opts = {"mode": mode, "lookahead": lookahead}
        opts.update(runtime_options(device))
        opts.update(_contracts.runtime_options(options))
        _arena.sweep()      # runtimes closed before, held for their lent ranges (vmmrt.torch._arena)
        self.runtime = vmmrt.Runtime(opts)
        self.options = dict(options or {})     # as asked (planner.adopt makes another runtime with them)
        try:
            check_runtime_device(self.runtime.info(), device)
        except BaseException:
            self.runtime.close()
            raise
        self.device = device
        self.granularity = self.runtime.info()["granularity"]
        self.host = self.runtime.backend == "host"
        self.device_type = "cpu" if self.host else "cuda"
        self.mode = self.runtime.mode          # the environment may override what was asked
        self.lookahead = self.runtime.lookahead
        self.layers = []
        self.allocated = False
        self.plan = None
        self.copy_gbps = None       # (D2H, H2D) GB/s under the layers' graphs, for the planners (replay_times)
        self.copy_contention = None  # (D2H, H2D) compute ms lost per ms of copy, hidden or not (replay_times)
        self.remap_ms = None        # (ms, bytes): remap's map timed for the budget planner (planner.remap_cost)
        self.failed = None
        self._ranges = []
        self.min_bytes = min_bytes
        self.schedule = None        # the declared order: (layer, backward) pairs
        self.epoch = 0              # iterations abandoned by abort(), so far
        self._abort_hooks = []      # what forgets the abandoned iteration above the C library
        self.capturing = False      # make_graphed_callables is capturing: no release now (backing.py)
        self._due = set()           # backings whose release fell due during a capture
        self._prev = {}             # (layer name, backward) -> the uses before it, nearest first (set_order)
        self._order = None          # set_order's steps, as (layer name, backward)
        self.map_ahead = 1          # uses between the GPU's and the one memory is mapped for
        self._started = {}          # (layer name, backward) -> event where its GPU work began
        self._host_event = None     # the host backend's: where a stream-ordered map follows (map_for_use)
        self._now_event = None      # CUDA: "what is queued now", for the first uses of an iteration
        self.backings = []          # every Backing: resident slots, gradients
        self.graph_pool = None      # graphpool.GraphPool: the graphs' pool on a slot, when they are captured into it
        # (layer name, backward) -> slots sharing pages with parts of the graphs'
        # pool that begin at that use: checked there (memplan.Watcher.check_parts)
        self.part_checks = {}
        self.launchers = {}         # (runner name, backward) -> its graph's _launch.Launcher
        self._close_hooks = []      # run before the runtime goes (gradients still over its slots)
        self.memplan = None         # memplan.Watcher: resident and gradient slots on shared pages (plan_memory)
        self.loop = None            # the training loop the caller said it runs (make_graphed_callables(loop=)), or None
        self.gin_hold = None        # the latest backward's argument gradients in a slot (Grads.after_backward)
        self.plan_check = None      # plancheck.PlanCheck: the plan's peak against the caller's steps (check_plan)
        self.step_model = None      # planner.StepModel: the whole step's peak of a plan without memory_budget=

    # ------------------------------------------------------------- state
    def hold_gins(self, tensors: list) -> None:
        """Hold the argument gradients a backward hands autograd until the next
        backward or forward (Grads.after_backward), the previous ones let go."""
        self.gin_hold = tensors

    def fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            log.error("vmmrt offload unusable: %s", why)

    def check_usable(self) -> None:
        # (the per-call path asks this test inline, then calls this to raise:
        # vmmrt.torch._call; change both)
        if self.failed is not None:
            raise Error(_capi.E_INVALID_STATE, "this offload cannot be used after an earlier failure (%s); "
                        "build the graphed callables again" % self.failed)
        if self.runtime.closed:
            raise Error(_capi.E_INVALID_STATE, "this offload was closed")

    def layer(self, name: str, static: Iterable[torch.Tensor] = ()) -> LayerOffload:
        """A new layer (its group), in forward order; ``static``: tensors whose
        storage never moves (parameters, buffers, static graph inputs)."""
        if self.allocated:
            raise Error(_capi.E_INVALID_STATE, "layer %r created after allocate()" % name)
        if any(l.name == name for l in self.layers):
            raise ValueError("two layers named %r" % name)
        lay = LayerOffload(self, name, _storages(static))
        self.layers.append(lay)
        return lay

    # ---------------------------------------------------------- schedule
    def set_schedule(self, steps: Iterable[tuple[LayerOffload, bool]]) -> None:
        """Declare the order of every iteration, before :meth:`allocate`:
        ``steps`` lists (layer, backward) pairs, the forward (False) and the
        backward (True) of every layer once each, each forward before its
        backward (all forwards then all backwards, 1F1B with a layer per
        (layer, microbatch) runner, interleaved chunks; see
        :mod:`vmmrt.torch.pipeline`). At allocation it goes to the library
        (vmmrt_offload_set_schedule), less the layers that move nothing:
        ping-pong makes the banks the order needs (without it: two, and a
        look-ahead of 1) and the look-ahead works from the first iteration.
        Every iteration must then follow it: a hook out of it is a
        ``VMMRT_E_MISMATCH`` naming the runner and the one expected. Without
        a declared schedule the first iteration records one."""
        steps = [(lay, bool(backward)) for lay, backward in steps]
        for k, (lay, _) in enumerate(steps):
            if not isinstance(lay, LayerOffload):
                raise TypeError("schedule step %d: %r is not a layer of an Offload" % (k, lay))
        # The library checks the order (each use once, a backward after its
        # forward, nothing of another runtime, not after allocation): every
        # layer's group now, those with tensors again at allocation (_declare).
        try:
            self.runtime.offload_set_schedule([(lay.group, b) for lay, b in steps])
        except Error as e:
            if e.status == _capi.E_INVALID_STATE and self.allocated:
                raise Error(e.status, e.detail, "vmmrt.torch.Offload.set_schedule") from None
            raise vmmrt.InvalidValue(e.status, e.detail, "vmmrt.torch.Offload.set_schedule") from None
        # What only the package knows: its layers, those that will move nothing
        # included (the library never sees their groups at allocation).
        named = set((lay.name, b) for lay, b in steps)
        missing = [l.name for l in self.layers if (l.name, False) not in named or (l.name, True) not in named]
        if missing:
            self.runtime.offload_set_schedule([(lay.group, b) for lay, b in self.schedule or ()])
            raise ValueError("the schedule leaves out the forward or backward of layer%s %s" % (
                "s" if len(missing) > 1 else "", ", ".join(repr(n) for n in missing)))
        self.schedule = steps

    def set_order(self, steps: Iterable[tuple[LayerOffload, bool]]) -> None:
        """The order the layers run in, as (layer, backward) pairs (every
        forward then the backwards in reverse, or a pipeline's): memory a use
        needs is mapped once the GPU has reached the use before it
        (:meth:`gpu_reached_previous`)."""
        steps = [(lay.name, bool(b)) for lay, b in steps]
        self._order = steps
        self._prev = {}
        for k, key in enumerate(steps):
            self._prev[key] = tuple(steps[k - j] for j in range(1, k + 1))

    def use_started(self, lay: LayerOffload, backward: bool, current: Any = None) -> None:
        """Mark, on the current stream, where this use's GPU work begins
        (``current``: that stream, when the caller has it already: the
        per-call path asks torch for it once per hook pair)."""
        if self.host:
            return
        key = lay.keys[bool(backward)]
        ev = self._started.get(key)
        if ev is None:
            ev = self._started[key] = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device.index) if current is None else current)

    def maps_per_use(self) -> bool:
        """Whether a use may map memory (:meth:`map_for_use`: a resident
        slot, mapped gradients): its map then follows the event
        :meth:`use_started` records between an earlier use's begin hook and
        its graph, so those uses keep the hooks and the graph as separate
        calls (vmmrt.torch._launch). Asked once per graph, at build, and
        again when the memory plan has put every slot on its pages for
        good (:meth:`launch_ways_changed`): a bound slot maps nothing, nor
        does one mapped and held all along (the persistent loop's
        gradients, which the plan leaves off its pages; a forward's outputs
        off the pages, kept mapped, vmmrt.torch.outputs)."""
        return any(not b.bound and not (b.mapped and (b.live > 0 or b.kept)) for b in self.backings)

    def launch_ways_changed(self, bound: bool) -> None:
        """The memory plan bound every slot (``bound``), or a slot left its
        pages: each graph's way is decided again (vmmrt.torch._launch)."""
        for launcher in self.launchers.values():
            if bound:
                launcher.reconsider()
            else:
                launcher.map_again()

    def map_for_use(self, lay: LayerOffload, backward: bool, backing: Backing, stream: vmmrt.Stream,
                    eager: bool = False, current: Any = None) -> None:
        """Map ``backing`` for this use, ``map_ahead`` uses ahead of the GPU
        (see :meth:`gpu_reached_previous` for why not further). One use or
        more ahead and not capturing, nobody waits: the worker maps once
        the GPU has begun the use ``map_ahead`` before this one (its event
        from :meth:`use_started`; for the first uses of an iteration, once
        what is queued now has run), and the stream waits on the device for
        the map before this use's work (Backing.map_on_stream). The host
        waits instead while capturing (every slot is mapped before the first
        capture), with map_ahead=0, and for eager ops on CUDA (a copy is a
        cudaMemcpyAsync, which the driver checks when it is enqueued). On
        the host backend the CPU runs the use's ops itself: it waits for the
        map after asking for it the same way. ``current``: the torch stream
        ``stream`` is, when the caller has it (else asked when needed)."""
        planned = backing.planned
        if not backing.bound and backing.mapped:    # (a bound slot is never mapped)
            if backing.kept and planned is not None:
                planned.come_back(stream)   # (off the pages since a conflict: back if it can)
            return
        if planned is not None and planned.begin_use(stream):
            return      # on the memory plan's pages, its bytes free
        if backing.kept:
            # A forward's outputs (vmmrt.torch.outputs) off the pages after a
            # conflict: their tensors go to the caller, whose copies of them
            # (the next layer's into its static input) the driver checks when
            # they are enqueued, so the host knows the map made first.
            self.gpu_reached_previous(lay, backward)
            backing.ensure()
            return
        if self.map_ahead == 0 or self.capturing or _compat.is_capturing() or (eager and not self.host):
            self.gpu_reached_previous(lay, backward)
            backing.ensure()
            return
        backing.map_on_stream(self._map_point(lay, backward, stream, current), stream)
        if self.host:
            backing.slot.wait()

    def _map_point(self, lay: LayerOffload, backward: bool, stream: vmmrt.Stream, current: Any = None) -> Any:
        """The event a stream-ordered map for this use follows."""
        if self.host:
            # The CPU is the device and is here already: what the host
            # backend's stream has queued. (A map follows its event as it
            # is when asked: one event, recorded again each time, does.)
            if self._host_event is None:
                self._host_event = self.runtime.event()
                self._close_hooks.append(self._host_event.destroy)
            self._host_event.record(stream)
            return self._host_event
        before = self._prev.get(lay.keys[bool(backward)], ())
        ev = self._started.get(before[self.map_ahead - 1]) if len(before) >= self.map_ahead else None
        if ev is None:
            # The first uses of an iteration: after what is queued before
            # them (the optimizer step), as gpu_reached_previous waits.
            if self._now_event is None:
                self._now_event = torch.cuda.Event()
            ev = self._now_event
            ev.record(torch.cuda.current_stream(self.device.index) if current is None else current)
        return ev

    def gpu_reached_previous(self, lay: LayerOffload, backward: bool) -> None:
        """Before memory for this use is mapped: wait until the GPU has begun
        the use before it. The host runs ahead of the GPU, but a map made
        when the host gets somewhere holds memory from then on, while a
        release happens when the GPU gets there: mapping each layer's
        memory (its resident activations, its gradients) a whole pass ahead
        would hold that memory beside everything not yet released, far
        above what eager holds at any moment. One use ahead, the map is
        ready before the GPU needs it. The first use of an iteration waits
        for what is queued before it (the optimizer step) to finish."""
        if self.host or self.map_ahead == 0:
            return
        before = self._prev.get(lay.keys[bool(backward)], ())
        if len(before) >= self.map_ahead:
            ev = self._started.get(before[self.map_ahead - 1])
            if ev is not None:
                ev.synchronize()
        else:
            torch.cuda.current_stream(self.device.index).synchronize()

    def flush(self) -> None:
        """Releases that fell due while a graph was being captured. (Run at
        every hook: nothing is asked of torch unless something fell due.)"""
        if _backing._late:
            flush_late()
        if self._due and not self.capturing:
            due, self._due = self._due, set()
            for b in due:
                b.flush()

    def _declare(self):
        """The schedule, as the library takes it: the layers with tensors only (the
        hooks of the others do nothing, so they have no place in its order)."""
        if self.schedule is None:
            return
        self.runtime.offload_set_schedule([(lay.group, b) for lay, b in self.schedule if lay.in_group()])

    # -------------------------------------------------------- allocation
    def candidates(self, lay: LayerOffload) -> list:
        """The regions of a layer that may move (in discovery order): not kept for
        a reason, and not smaller than min_bytes."""
        for r in lay.regions:
            if r.reason is None and r.nbytes < self.min_bytes:
                r.selected, r.reason = False, "small"
        return [r for r in lay.regions if r.reason is None]

    def allocate(self, offload: float | bool = 1.0, plan: Any = None, memory_budget: Any = None) -> None:
        """End discovery: choose what moves, describe it to the groups, allocate
        (slots or banks, pinned host buffers) and learn every fixed address.

        ``offload``: a fraction of each layer's distinct saved bytes (1.0: all),
        or ignored when ``plan`` (a :class:`vmmrt.torch.planner.Plan`) is given.
        ``memory_budget`` (as make_graphed_callables takes it): the budget
        planner's plan over the layers' times (their graphs' replays where
        make_graphed_callables timed them, else the warm-up's:
        :func:`vmmrt.torch.planner.budget_plan`); a layer it recomputes has
        ``recompute`` set, and its runner runs it so (vmmrt.torch.recompute).
        """
        if memory_budget is not None:
            from vmmrt.torch import planner
            plan = planner.budget_plan(self, memory_budget)
            for lay, c in zip(self.layers, plan.layers):
                lay.recompute = c.action == "recompute"
        self.check_usable()
        if self.allocated:
            raise Error(_capi.E_INVALID_STATE, "allocate() called twice")
        for lay in self.layers:
            if lay.plan is None:
                raise Error(_capi.E_INVALID_STATE, "layer %r was never discovered (run a discovery pass of every "
                            "layer before allocate)" % lay.name)
        if isinstance(offload, bool):
            offload = 1.0 if offload else 0.0
        for i, lay in enumerate(self.layers):
            cand = self.candidates(lay)
            recomputed = plan is not None and getattr(plan.layers[i], "action", None) == "recompute"
            if self.mode == "none":
                # Nothing moves: what stays is resident (plan_resident), and
                # its memory comes and goes with the layer, as in eager.
                for r in cand:
                    r.selected, r.reason = False, "recompute" if recomputed else "none"
            elif plan is not None:
                chosen = set(plan.layers[i].chosen)
                # a recomputed layer saves nothing: no resident slot either
                why = "recompute" if recomputed else "budget"
                for k, r in enumerate(cand):
                    r.selected = k in chosen
                    if not r.selected:
                        r.reason = why
            else:
                sizes = [r.nbytes for r in cand]
                select.apply(cand, None if offload >= 1.0 else select.fraction_budget(sizes, offload))
            lay.describe_to_group()
        self.plan = plan
        try:
            self._declare()
            self.runtime.offload_allocate()
            self.allocated = True
            for lay in self.layers:
                lay.plan_resident()
                if lay.resident is not None:
                    self.backings.append(lay.resident)
                lay.learn_addresses()
        except BaseException as e:
            self.fail("allocation: %s" % e)
            raise
        self._ranges = [(lay.group.address, lay.group.address + lay.group.nbytes)
                        for lay in self.layers if lay.in_group()]
        self._ranges += [(lay.resident.address, lay.resident.address + lay.resident.nbytes)
                         for lay in self.layers if lay.resident is not None]
        log.info("vmmrt: %s", self.describe())

    def plan_memory(self, enabled: bool = True) -> None:
        """Once the layers' uses are set (set_order) and their slots made: put
        the resident and gradient slots on shared physical pages once a
        steady step has been seen (:mod:`vmmrt.torch.memplan`); until then,
        and with ``enabled`` False, each is mapped and released around its
        use."""
        from vmmrt.torch import memplan
        if not isinstance(enabled, bool) and enabled != "slots":
            raise TypeError("memory_plan=%r: True, False or \"slots\"" % (enabled,))
        self.memplan = memplan.Watcher(self, enabled)

    def own(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """t, or a copy of it if it lies in a slot (where its bytes will not stay)."""
        if t is None or not t.numel():
            return t
        p = t.data_ptr()
        for lo, hi in self._ranges:
            if lo <= p < hi:
                return t.clone()
        return t

    # ------------------------------------------------------ information
    def staying(self) -> list[LayerOffload]:
        """The layers with regions to move whose group libvmmrt keeps on the
        device instead (vmmrt_group_stays(3)): a group whose backward comes
        within the look-ahead in force (at least 1) of its forward, counted in
        the uses of groups with tensors, as nothing runs in between that could
        want the memory (with every forward then the backwards in reverse, the
        last layer), and in ping-pong one whose bank no other group takes in
        between (with two banks, the layer before the last one). It copies
        nothing of them from the second iteration on (from the first under a
        declared schedule); the first iteration, which records the order,
        copies every group. Once the library knows the schedule it says;
        before, the first rule over the declared schedule, else
        :meth:`set_order`'s, else every forward then the backwards in
        reverse."""
        if self.mode == "none":
            return []
        if self.allocated and not self.runtime.closed:
            st = self.runtime.offload_stats()
            if st["schedule_recorded"] or st["schedule_declared"]:
                return [l for l in self.layers if l.in_group() and l.group.stays]
        if self.schedule is not None:
            order = [(lay.name, b) for lay, b in self.schedule]
        elif self._order is not None:
            order = list(self._order)
        else:
            order = [(l.name, False) for l in self.layers] + [(l.name, True) for l in reversed(self.layers)]
        by_name = {l.name: l for l in self.layers}
        order = [(n, b) for n, b in order if n in by_name and by_name[n].in_group()]
        pos = {key: k for k, key in enumerate(order)}
        la = self.lookahead
        if self.mode == "pingpong" and self.schedule is None:
            la = min(la, 1)          # ping-pong's two banks without a declared schedule
        reach = max(la, 1)
        span = {l.name: (pos[(l.name, False)], pos[(l.name, True)]) for l in self.layers
                if (l.name, False) in pos and (l.name, True) in pos}
        out = [l for l in self.layers if l.name in span and span[l.name][1] - span[l.name][0] <= reach]
        if self.mode == "pingpong" and self.schedule is None:
            # Its two banks alternate over the groups in creation order: a
            # group stays too where no other of its bank holds it between
            # its forward and its backward (its forward, or its restore from
            # the look-ahead before its backward on).
            bank = {l.name: k % 2 for k, l in enumerate(l for l in self.layers if l.in_group())}

            def holds(n):
                p, q = span[n]
                return [(p, q)] if q - p <= reach else [(p, p), (q - la, q)]
            for l in self.layers:
                if l.name not in span or l in out:
                    continue
                p, q = span[l.name]
                if not any(lo <= q and p <= hi for h in span if h != l.name and bank[h] == bank[l.name]
                           for lo, hi in holds(h)):
                    out.append(l)
            out.sort(key=self.layers.index)
        return out

    def saved_bytes(self) -> dict[str, int]:
        """Bytes of the layers' saved tensors (LayerOffload.saved_bytes,
        summed): "views", "distinct", "moved" (the regions at offloaded
        addresses), and "copied": what goes to the host and back each
        iteration, as stats()'s bytes_offloaded grows from the second
        iteration on: the groups of the layers that move, those of
        :meth:`staying` left out, each as libvmmrt copies it (its regions
        and the alignment between them, once allocated)."""
        out = {"views": 0, "distinct": 0, "moved": 0}
        for lay in self.layers:
            for k, v in lay.saved_bytes().items():
                out[k] += v
        stay = set(l.name for l in self.staying())
        out["copied"] = sum(lay.group.nbytes if self.allocated else lay.saved_bytes()["moved"]
                            for lay in self.layers if lay.in_group() and lay.name not in stay)
        return out

    def group_bytes(self) -> list[int]:
        return [lay.group.nbytes for lay in self.layers]

    def device_bytes(self) -> int:
        """Device memory libvmmrt maps for offloaded activations now (banks or
        slots; its driver workers' count). The slots that come and go beside
        them (resident activations, gradients) are stats()["slot_bytes"]."""
        return self.runtime.offload_stats()["activation_bytes"]

    def expected_bytes(self) -> int:
        """What the strategy holds in the steady state, as the library bounds it
        (vmmrt_offload_stats' bound_bytes: two banks of the largest group, or
        the banks a declared schedule needs, for ping-pong; look-ahead + 1
        groups for remap; every group for none; in whole granules). Nothing
        is held before :meth:`allocate`."""
        if not self.allocated:
            return 0
        return self.stats()["bound_bytes"]

    def placement(self) -> dict[str, Any]:
        """How the offloaded bytes reached their slots at capture (or at the
        last eager pass), summed over the layers, and per layer: "placed"
        (born at the fixed address: no copy, no room in the pool), "copied"
        (computed, then copied in right away: the op has no out= variant),
        "copy" (copied at the end of the forward, as before); of the kept
        ones, "resident" (born in the layer's resident slot, released after its
        backward) and "pool" (left where they were allocated); with the
        reasons ("why": reason -> bytes). See :mod:`vmmrt.torch.place`."""
        out = {"placed": 0, "copied": 0, "copy": 0, "resident": 0, "pool": 0, "why": {}, "layers": {}}
        for lay in self.layers:
            p = lay.placement()
            out["layers"][lay.name] = p
            for k in ("placed", "copied", "copy", "resident", "pool"):
                out[k] += p[k]
            for why, n in p["why"].items():
                out["why"][why] = out["why"].get(why, 0) + n
        return out

    def describe(self) -> str:
        b = self.saved_bytes()
        mib = 1 << 20
        text = ("%s, look-ahead %d, %d layers: saved %.1f MiB as views, %.1f MiB distinct, %.1f MiB offloaded"
                % (self.mode, self.lookahead, len(self.layers), b["views"] / mib, b["distinct"] / mib,
                   b["moved"] / mib))
        stay = self.staying()
        if stay:
            one = len(stay) == 1
            text += (" (%.1f MiB copied to the host and back per iteration: %s (%.1f MiB) stay%s on the device, "
                     "%s backward within the look-ahead of %s forward%s)"
                     % (b["copied"] / mib, ("layer " if one else "layers ") + ", ".join(repr(l.name) for l in stay),
                        sum(l.saved_bytes()["moved"] for l in stay) / mib, "s" if one else "",
                        "its" if one else "each one's", "its" if one else "its",
                        "" if self.schedule is not None else "; the first iteration, which records the order, "
                        "copies every layer"))
        p = self.placement()
        if p["placed"] or p["copied"] or p["copy"] or p["resident"] or p["pool"]:
            text += ("; in their slots: %.1f MiB born there, %.1f MiB copied in by their op, %.1f MiB copied at "
                     "the end of the forward; kept: %.1f MiB born in resident slots, %.1f MiB in the pool"
                     % (p["placed"] / mib, p["copied"] / mib, p["copy"] / mib, p["resident"] / mib, p["pool"] / mib))
            for why, n in sorted(p["why"].items(), key=lambda kv: -kv[1]):
                text += "\n  copied %.1f MiB: %s" % (n / mib, why)
        res = [lay.resident.nbytes for lay in self.layers if lay.resident is not None]
        if res:
            planned = sum(1 for lay in self.layers if lay.resident is not None and lay.resident.bound)
            ins = sum(_static_inputs.in_slot(lay) for lay in self.layers)
            text += (" (resident slots of %d layers%s: %s)" % (
                len(res), "" if not ins else ", with %.1f MiB of the graphs' static inputs" % (ins / mib),
                "on the memory plan's pages, below" if planned else "mapped for the forward, released after the "
                "backward"))
        moving = [lay for lay in self.layers if lay.input_descs]
        if moving:
            text += ("; the graphs' static inputs of %d layers (%.1f MiB) in their groups, through the banks"
                     % (len(moving), sum(d.bytes for lay in moving for d in lay.input_descs) / mib))
        if self.launchers:
            text += "; graphs run by: " + ", ".join("%s (%d)" % kv for kv in _launch.summary(self.launchers).items())
        gr = {id(lay.grads): lay.grads for lay in self.layers if getattr(lay, "grads", None) is not None}
        if gr:
            mapped = [g for g in gr.values() if g.mapped]
            text += "; gradients: mapped %.1f MiB in %d callables" % (
                sum(g.backing.nbytes for g in mapped) / mib, len(mapped))
            for g in gr.values():
                if not g.mapped:
                    text += "\n  %s: %s" % (g.name, g.describe())
        if self.graph_pool is not None:
            text += "\n" + self.graph_pool.describe()
        plans = [lay.reuse for lay in self.layers if lay.reuse is not None]
        if plans:
            st = self._reuse_stats()
            text += ("\nthe backwards' temporaries: %.1f MiB born in bytes of %d layers' resident slots that their "
                     "saved regions no longer need, at most %.1f MiB alive at once (vmmrt.torch.reuse)%s" % (
                         st["reuse_bytes"] / mib, st["reuse_layers"], st["reuse_peak_bytes"] / mib,
                         "".join("; %s: captured again without it (%s)" % (lay.name, lay.reuse.fallback)
                                 for lay in self.layers if lay.reuse is not None and lay.reuse.fallback)))
        share, bound = self.grad_share(), self.grad_share(temporaries=False)
        if share or bound:
            mapped = self.memplan.shared_bytes() if self.memplan is not None else 0
            text += ("\nthe parameters' gradients that could lie on resident bytes their backward has already "
                     "read (vmmrt.torch.gradshare): %.1f MiB in %d layers, at most %.1f MiB of one; "
                     "%.1f MiB with the backward's temporaries placed around them; %.1f MiB lie there (the memory "
                     "plan maps them so in the set_to_none loop)"
                     % (sum(share.values()) / mib, len(share), max(share.values() or [0]) / mib,
                        sum(bound.values()) / mib, mapped / mib))
        timed = [lay for lay in self.layers if lay.times_from != "warm-up"]
        if timed:
            text += "\nthe planner's layer times (vmmrt.torch.replay_times):"
            if self.copy_gbps:
                text += " copies under the layers' graphs at D2H %s, H2D %s GB/s" % tuple(
                    "?" if g is None else "%.1f" % g for g in self.copy_gbps)
            if self.copy_contention:
                text += "; the graphs %s %% (D2H) and %s %% (H2D) slower while a copy runs" % tuple(
                    "?" if c is None else "%.1f" % (100 * c) for c in self.copy_contention)
            for lay in timed:
                w = lay.warmup_ms
                text += ("\n  %s: %s" % (lay.name, lay.times_from) if lay.times_from != "graphs" else
                         "\n  %s: graphs' replays, forward %.3f ms, backward %.3f ms (warm-up %s)"
                         % (lay.name, min(lay.fwd_ms), min(lay.bwd_ms),
                            "?" if not w or w[0] is None else "%.3f / %.3f ms" % (w[0], w[1] or 0.0)))
        if self.remap_ms is not None:
            text += ("\nremap's cost per offloaded layer, as the budget planner charged it: %.3f ms (a stream-ordered "
                     "map of %.1f MiB, timed)" % (self.remap_ms[0], self.remap_ms[1] / mib))
        if self.memplan is not None:
            text += "\n" + self.memplan.describe()
        if self.plan is not None:
            text += "\n" + self.plan.summary()
        if self.step_model is not None and getattr(self.plan, "peak_bytes", None) is None:
            text += "\n" + self.step_model.describe()
        if self.plan_check is not None:
            text += "\n" + self.plan_check.describe()
        return text

    def stats(self) -> dict[str, Any]:
        """The library's statistics (vmmrt_offload_stats_get), and how the saved
        bytes reached their slots at capture (:meth:`placement`, summed):
        placed_bytes, copied_bytes, copy_bytes, resident_bytes, pool_bytes;
        graph_launches: how the graphed callables' graphs run, {how: graphs}
        (vmmrt.torch._launch: "vmmrt_group_replay" or torch's replay and why);
        tensors_held: tensors over its slots alive now (gradients, resident
        activations), each of which defers the destroy of a :meth:`close`;
        driver_calls_by_kind: the driver's VMM calls made so far by name
        (cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease;
        vmmrt_driver_stats_get's count: since the runtime's creation or its
        last driver_stats_reset, not capped), and driver_calls, their sum.
        Two readings' difference is the calls made between them. The memory
        plan (:mod:`vmmrt.torch.memplan`): plan_bytes (its pages),
        plan_binds (slots put on them), plan_conflicts (uses that found
        bytes they share still held by a tensor, and mapped memory of their
        own instead); the optimizer step's allocations in the pages' free
        bytes (:mod:`vmmrt.torch.optmem`): optimizer_routed_steps,
        optimizer_lent_bytes (free at the latest step), optimizer_peak_bytes
        (the most the steps' segments took of them), optimizer_fallback_bytes
        (segments that did not fit, from the driver), optimizer_survivors
        (steps that left a tensor in them), optimizer_hook_us (the hooks'
        time per routed step), optimizer_bank_bytes (of the bytes lent,
        ping-pong's banks'), optimizer_relocated (storages a step left in a
        bank, moved out); the graphs' pool on a slot
        (:mod:`vmmrt.torch.graphpool`): graph_pool_bytes (what it uses),
        graph_pool_bound (the range reserved for it), graph_pool_fallback_bytes
        (its segments beyond the range, plain device memory),
        graph_pool_pages_bytes (the pages its granules take: on the memory
        plan the distinct pages under its parts, each part placed beside the
        layers' slots by the uses it is alive at, so that parts alive at
        different uses share pages; fewer than graph_pool_bytes where
        granules whose blocks' lives never met share one,
        :mod:`vmmrt.torch.poolplan`),
        graph_pool_live_peak_bytes (the most of its blocks alive at once in
        the captures), graph_pool_never_freed_bytes (one pool: those of its
        blocks the captures left in use, which every later capture's
        working set sits beside); the backward's
        temporaries in bytes of the resident slots their saved regions no
        longer need (:mod:`vmmrt.torch.reuse`): reuse_bytes (born there at
        the captures of the write and accumulate graphs, each temporary's
        bytes summed), reuse_peak_bytes (the most of them alive at one op of
        a backward, which the pool no longer holds for them), reuse_layers,
        reuse_fallbacks (layers whose capture would have read bytes a
        temporary took: captured again without it); grad_share_bytes (the
        parameters' mapped gradients that could lie on resident bytes
        their backward has already read: :meth:`grad_share`),
        grad_share_bound_bytes (the same with the bytes the backward's
        temporaries took counted free: a bound), plan_grad_share_bytes
        (those the memory plan maps there: the set_to_none loop's,
        :func:`vmmrt.torch.memplan.share_grads`); plan_chained_bytes (the
        backward graphs' output gradients the plan maps on the pages of the
        argument gradients the layer after hands them,
        :func:`vmmrt.torch.memplan.chain_gouts`), plan_chained_copies (the
        backwards that found their output gradient there and copied
        nothing in)."""
        st = self.runtime.offload_stats()
        p = self.placement()
        for k in ("placed", "copied", "copy", "resident", "pool"):
            st["%s_bytes" % k] = p[k]
        st["tensors_held"] = self.runtime.holds
        st["graph_launches"] = _launch.summary(self.launchers)
        by_kind = {d["name"]: d["count"] for d in self.runtime.driver_stats()}
        st["driver_calls_by_kind"] = by_kind
        st["driver_calls"] = sum(by_kind.values())
        st.update(self.memplan.stats() if self.memplan is not None else
                  {"plan_conflicts": 0, "plan_binds": 0, "plan_bytes": 0, "plan_grad_share_bytes": 0,
                   "plan_chained_bytes": 0, "plan_chained_copies": 0})
        st.update(self.graph_pool.stats() if self.graph_pool is not None else
                  {"graph_pool_bytes": 0, "graph_pool_bound": 0, "graph_pool_fallback_bytes": 0,
                   "graph_pool_pages_bytes": 0, "graph_pool_live_peak_bytes": 0,
                   "graph_pool_never_freed_bytes": 0})
        st.update(self._reuse_stats())
        st["grad_share_bytes"] = sum(self.grad_share().values())
        st["grad_share_bound_bytes"] = sum(self.grad_share(temporaries=False).values())
        return st

    def grad_share(self, temporaries: bool = True) -> dict[str, int]:
        """Per layer, the bytes of its parameters' mapped gradients that could
        lie on the physical pages of resident bytes its backward has already
        read (:mod:`vmmrt.torch.gradshare`; the memory plan maps them so in
        the set_to_none loop); only layers with some. ``temporaries=False``: with the bytes the
        backward's temporaries were placed in (vmmrt.torch.reuse) counted
        free too, a bound."""
        out = {}
        for lay in self.layers:
            n = gradshare.layer_share(lay, self.granularity, temporaries)
            if n:
                out[lay.name] = n
        return out

    def _reuse_stats(self) -> dict[str, int]:
        """stats()'s reuse_* keys (vmmrt.torch.reuse): each layer's write graph's
        plan and its accumulate graph's."""
        write = [lay.reuse for lay in self.layers if lay.reuse is not None]
        both = write + [lay.reuse_acc for lay in self.layers if lay.reuse_acc is not None]
        return {"reuse_bytes": sum(p.placed_bytes for p in both),
                "reuse_layers": sum(1 for p in write if p.placed_bytes),
                "reuse_peak_bytes": max([p.peak for p in both if p.placed_bytes] or [0]),
                "reuse_fallbacks": sum(1 for p in write if p.fallback)}

    def sync(self) -> None:
        """Wait for every copy and driver request in flight (end of training, tests)."""
        self.runtime.offload_sync()

    def abort(self) -> None:
        """Abandon the iteration under way (vmmrt_offload_abort): a step skipped
        for a NaN or infinite loss, an out-of-memory between two layers, a
        microbatch called out of the schedule's order. Whatever point it
        reached (forwards run whose backward never came, a backward begun),
        the copies and driver requests in flight are waited for and every
        group goes back to where an iteration starts; no address changes, so
        the captured graphs stay valid and nothing is captured again. The next
        call of a layer must be the first of an iteration.

        The abandoned iteration's outputs must not be used any more: a
        backward through one is refused (``VMMRT_E_INVALID_STATE``). Gradients
        its backwards already accumulated stay in ``.grad``: zero them
        (``optimizer.zero_grad()``) before the next step. An error that made
        the offload unusable (a failed capture, a layer that saved other
        tensors than discovery saw) is not undone: build the callables again."""
        self.check_usable()
        if not self.allocated:
            raise Error(_capi.E_INVALID_STATE, "abort() before allocate(): no iteration to abandon",
                        "vmmrt.torch.Offload")
        self.runtime.offload_abort()
        self.epoch += 1
        for lay in self.layers:
            lay._restored = False
        for fn in self._abort_hooks:
            fn()

    def release_retired(self) -> None:
        """Free the old memory of groups discovered again for a new shape
        (vmmrt_offload_release_retired): the graphs over their old addresses
        must never run again."""
        self.runtime.offload_release_retired()

    def close(self) -> None:
        """Destroy the runtime: the graphs built over its addresses must not run
        again. A tensor over one of its slots still alive (a ``.grad`` kept
        by the user, a view) keeps its memory: the destroy waits until the
        last one dies (``runtime.destroy_deferred``)."""
        # The abort hooks close over the runners (their graphs, static
        # tensors, a pool): dropping them lets those go with the callables.
        self._abort_hooks.clear()
        self.gin_hold = None
        if not self.runtime.closed:
            # An optimizer step that raised left this thread's allocations
            # routed to the plan's pages (vmmrt.torch.optmem): the hooks below
            # drop the graphs' MemPool, and PyTorch empties a pool nothing
            # holds any more in its destructor, which aborts the process
            # while any routing is under way (captures_underway.empty()).
            from vmmrt.torch import optmem
            optmem.end_routing()
            for fn in self._close_hooks:
                fn()
            self._close_hooks.clear()
            self.runtime.close()
            _arena.sweep()
