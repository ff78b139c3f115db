# SPDX-License-Identifier: LGPL-2.1-or-later
"""One runner (a layer with a forward and a backward) and its vmmrt group.

This is the per-runner API for frameworks that own their graph runners (as
Megatron does); :func:`vmmrt.torch.make_graphed_callables` is built on it.
A runner goes through, in order:

1. ``with layer.discovering() as p:`` around an eager forward (a warm-up,
   on a side stream), setting ``p.outputs``; the saved tensors are recorded
   and handed back to autograd unchanged;
2. :meth:`vmmrt.torch.Offload.allocate` (all layers at once);
3. ``with layer.capturing(stream) as p:`` around the forward being captured
   into a graph: each moving region is copied into its fixed address at the
   end of the forward, inside the graph; ``with layer.capturing_backward():``
   around the backward's capture, whose saved tensors are then views at the
   fixed addresses;
4. every iteration, :meth:`forward_begin` / :meth:`forward_end` around the
   forward graph's launch and :meth:`backward_begin` / :meth:`backward_end`
   around the backward's, on the stream they are launched on.

Without graphs, ``with layer.offloading(stream) as p:`` runs one eager
forward through the same group (the copies and the D2H), and the backward is
bracketed by the same two backward hooks.
"""
import torch

from vmmrt import Error, _capi
from vmmrt.torch import _address, _compat, _compiled, _contracts, place
from vmmrt.torch import outputs as _outputs
from vmmrt.torch.backing import Backing
from vmmrt.torch.saved import REGION_ALIGN, Recorder



def _kernel_copy(region, ptr, device):
    """Region's bytes from the original storage at ptr into its fixed address,
    as an elementwise kernel on the current stream (torch's copy_ of two
    contiguous tensors is a cudaMemcpyAsync, which the driver validates at
    enqueue)."""
    src = _address.tensor_at(ptr + region.lo, region.nbytes, torch.uint8, device)
    torch.bitwise_or(src, 0, out=region.bases[torch.uint8][:region.nbytes])


class Pass:
    """The context of one pass: set ``outputs`` to what the forward returned."""

    def __init__(self, layer, kind, stream=None, inputs=(), current=None):
        self.layer, self.kind, self.stream = layer, kind, stream
        self.current = current      # the torch stream that stream is, if the caller has it (forward_begin)
        self.inputs = inputs        # where a walk back from the outputs stops (_compiled.py)
        self.outputs = ()
        self.record = True
        self.rec = None
        self.mode = None
        self.placed = []
        self._hooks = None

    def __enter__(self):
        lay = self.layer
        lay._check_usable()
        dev = lay.offload.device_type
        if self.kind == "discover":
            if lay.offload.allocated:
                raise Error(_capi.E_INVALID_STATE, "discovery after allocation", lay._where())
            self.rec = Recorder(lay.name, dev, lay.static, keep_all=True)
            if place.AVAILABLE and self.record and not lay.compiled:
                self.mode = place.Mode(dev, static=lay.static)
        else:
            if not lay.offload.allocated:
                raise Error(_capi.E_INVALID_STATE, "%s before Offload.allocate()" % self.kind, lay._where())
            self.rec = Recorder(lay.name, dev, lay.static, plan=lay.plan)
            self.rec.guard = lay._guard
            self.placed = [] if lay.compiled else lay.placements()
            if self.kind == "capture" and lay.outputs is not None:
                self.placed += lay.outputs.placements(self.stream)
            if self.kind == "eager":
                lay.forward_begin(self.stream, eager=True, current=self.current)
                if self.placed and (lay.offload.host or lay.offload.mode == "remap"):
                    # The layer's own ops write the slot: it must be free
                    # (its bank's D2H done) or mapped (remap) before they
                    # are enqueued, not only when the stream gets there (a
                    # copy_ is a cudaMemcpyAsync, checked at enqueue; the
                    # host backend's CPU ops run at once).
                    lay.offload.runtime.stream_synchronize(self.stream)
            lay.group.begin_capture()
            if self.placed:
                # births are discovery's to record: this pass only places
                self.mode = place.Mode(dev, self.placed, lay.births, lay.static, record=False)
        lay.last_rec = self.rec
        if not lay.compiled:
            self._hooks = self.rec.hooks(self.mode)
            self._hooks.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        lay, rec = self.layer, self.rec
        raised = exc
        try:
            if self._hooks is not None:
                self._hooks.__exit__(exc_type, exc, tb)
            elif exc is None:
                # torch.compile'd: no hooks while it ran (_compiled.py)
                _compiled.attach(rec, _compat.tree_leaves(self.outputs), _compat.tree_leaves(self.inputs))
        except BaseException as e:  # the Error a hook raised, unwrapped
            raised = e
        if raised is not None:
            rec.release()
            if self.kind == "eager":
                _contracts.user_failure(lay, "forward", raised)
            elif self.kind != "discover":
                lay.offload.fail("%s: %s pass failed: %s" % (lay._where(), self.kind, raised))
            if raised is not exc:
                raise raised
            return False
        user = self.kind == "eager"     # until finish(): what failed is the layer's, not the library's
        try:
            births = self.mode.births if (self.kind == "discover" and self.mode is not None) else None
            try:
                moves = rec.finish(_compat.tree_leaves(self.outputs), births, recorded=self.mode is not None,
                                   unrecorded=_compiled.UNSEEN if lay.compiled else "torch without TorchDispatchMode")
            except BaseException as e:
                if user:
                    rec.release()
                    _contracts.user_failure(lay, "forward", e)
                raise
            user = False
            if self.kind == "discover":
                lay._discovered(rec, self.mode, _compat.tree_leaves(self.outputs))
                return False
            eager_cuda = self.kind == "eager" and not lay.offload.host
            lay._placed(self.placed, moves, _compat.tree_leaves(self.outputs), rec)
            for r, ptr in moves:
                # as this pass saved it: the library compares it with discovery's
                desc = r.desc(rec.regions[r.index])
                if ptr + r.lo == r.addr:
                    # born there (place.py): nothing to copy
                    addr = lay.group.save(desc, 0, None)
                elif eager_cuda:
                    # The driver checks a copy's addresses when it is enqueued, and
                    # a remap slot is mapped only once the stream reaches the map
                    # the forward hook waited for: a kernel checks nothing then.
                    _kernel_copy(r, ptr, lay.offload.device)
                    addr = lay.group.save(desc, 0, None)
                else:
                    addr = lay.group.save(desc, ptr + r.lo, self.stream)
                if addr != r.addr:
                    raise Error(_capi.E_MISMATCH, "region %d got address 0x%x, learned 0x%x"
                                % (r.index, addr, r.addr), lay._where())
            if lay.input_descs:
                # the static inputs the group holds (inputs_move), already
                # there: each forward's call copied its argument in
                for d, want in zip(lay.input_descs, [a for a in lay.input_addrs if a is not None]):
                    addr = lay.group.save(d, 0, None)
                    if addr != want:
                        raise Error(_capi.E_MISMATCH, "static input got address 0x%x, learned 0x%x" % (addr, want),
                                    lay._where())
            lay.group.end_capture()
            if lay.offload.host:
                # Host backend: the copies run on a stream thread and read the
                # originals, which are freed next.
                lay.offload.runtime.stream_synchronize(self.stream)
            if self.kind == "eager":
                lay.group.forward_end(self.stream)
        except BaseException as e:
            if self.kind != "discover" and not user:
                lay.offload.fail("%s: %s pass failed: %s" % (lay._where(), self.kind, e))
            raise
        finally:
            rec.release()
        return False


class LayerOffload:
    """The offload state of one runner; made by :meth:`vmmrt.torch.Offload.layer`."""

    def __init__(self, offload, name, static_storages):
        self.offload = offload
        self.name = name
        self.keys = ((name, False), (name, True))   # its uses (forward, backward) in the Offload's order
        # storage address -> the token an op's signature names it by
        # (place._tensor_signature): its address at discovery, kept when a
        # static input moves into the resident slot (static_inputs.place)
        self.static = {p: p for p in static_storages}
        self.group = offload.runtime.group(name)
        self.plan = None            # the discovery Recorder: signature and regions
        self.passes = 0
        self.fwd_ms = []
        self.bwd_ms = []
        self.times_from = "warm-up"  # or "graphs": replays timed for the planners (vmmrt.torch.replay_times)
        self.warmup_ms = None       # (fwd, bwd) of the warm-up, where graphs' times replaced them
        self.fwd_work = []          # the warm-up's working sets, bytes (vmmrt.torch.planner.working)
        self.bwd_work = []
        self._restored = False      # between backward_begin and backward_end
        self._bwd_capture = False
        self.last_rec = None        # the recorder of the latest pass (its hooks' errors)
        self.births = {}            # discovery's births by (op key, output): see place.Mode
        self.timeline = None        # discovery's backward: (reuse.Timeline, its births by key)
        self.reuse = None           # its temporaries in the resident slot (reuse.Planned), once captured
        self.timeline_acc = None    # the same, of a backward that accumulates (the accumulate graph's)
        self.reuse_acc = None       # its plan for the accumulate graph (the parameters' gradients too)
        self.resident = None        # Backing of the kept regions born in a slot (plan_resident)
        self.input_bytes = ()       # per graph input, its bytes in the resident slot or None (static_inputs)
        self.input_at = None        # their offsets in it (None: not there), once planned
        # or, for a recomputed layer in ping-pong, in its group: they are its
        # checkpoint, which moves with the bank as an offloaded layer's
        # saved regions do (inputs_move)
        self.input_descs = []       # the group's descriptors of them, after the moving regions'
        self.input_addrs = None     # per graph input, its fixed address in the group (None: not there)
        self.out_births = []        # discovery's births of the forward's outputs (vmmrt.torch.outputs)
        self.outputs = None         # outputs.Outputs: the forward graph's outputs in a slot (plan_outputs)
        self.grads = None           # grads.Grads of the callable (grads="mapped")
        self.recompute = False      # the budget planner recomputes it: it saves nothing (vmmrt.torch.recompute)
        # Its backward runs once per forward: not captured with retain_graph
        # (retain_graph_in_backward), whose second replay reads the saved
        # regions again, so no gradient may lie on bytes it has read
        # (vmmrt.torch.gradshare), as no temporary may (reuse).
        self.backward_once = True
        self.compiled = False       # torch.compile'd: its saved tensors are reached after the forward (_compiled.py)

    # What discovery learned of the layer (the warm-up passes, and what
    # graphed.py adds before allocation): planner.adopt() moves a discovered
    # layer to a runtime of another mode with all of it. The rest is its
    # runtime's (OWN), or made at allocation or capture, after adopt().
    # Every attribute is in one of the two (tested): one left out of both
    # was how adopt() once dropped the outputs' births and the backward's
    # timelines, so an adopted plan's outputs were born in the graphs'
    # pool instead of their slot (H100, 8 Llama layers recomputed in mode
    # none: the pool 1520 MiB against 1272 built in mode none directly).
    DISCOVERED = ("static", "plan", "births", "passes", "fwd_ms", "bwd_ms", "times_from", "warmup_ms",
                  "fwd_work", "bwd_work", "timeline", "timeline_acc", "input_bytes", "out_births", "recompute",
                  "backward_once", "compiled")
    OWN = ("offload", "name", "keys", "group", "_restored", "_bwd_capture", "last_rec", "reuse", "reuse_acc",
           "resident", "input_at", "input_descs", "input_addrs", "outputs", "grads")

    def carry_discovery(self, old):
        """Take what discovery learned of ``old`` (the same layer, discovered
        under another runtime, not allocated)."""
        for k in self.DISCOVERED:
            setattr(self, k, getattr(old, k))

    def _where(self):
        return "layer %r" % self.name

    def _check_usable(self):
        self.offload.check_usable()

    # ------------------------------------------------------------ passes
    def discovering(self, record=True, inputs=()):
        """A discovery pass; ``record``: also record which op allocates each
        saved tensor (vmmrt.torch.place), which costs Python time per op.
        ``inputs``: the forward's (for a compiled layer: see _compiled.py)."""
        p = Pass(self, "discover", inputs=inputs)
        p.record = record
        return p

    def capturing(self, stream, inputs=()):
        return Pass(self, "capture", stream, inputs)

    def offloading(self, stream, inputs=(), current=None):
        """An eager pass; ``current``: the torch stream ``stream`` is, if the
        caller has it (else asked when needed)."""
        return Pass(self, "eager", stream, inputs, current)

    def capturing_backward(self):
        lay = self

        class _Ctx:
            def __enter__(self):
                lay._bwd_capture = True

            def __exit__(self, *exc):
                lay._bwd_capture = False

        return _Ctx()

    def _discovered(self, rec, mode=None, outputs=()):
        if mode is not None and _outputs.AVAILABLE:
            self.out_births = _outputs.births(outputs, mode.births, self.static, set(rec.region_ptrs().values()))
        if self.plan is not None and mode is None:
            # a pass that did not record (timing only): what the recording
            # passes saw stands, if it saved the same tensors
            self._check_same(rec)
            for a, b in zip(self.plan.regions, rec.regions):
                b.birth, b.unplaced, b.hi, b.views_hi = a.birth, a.unplaced, a.hi, a.views_hi
            self.plan = rec
            self.passes += 1
            return
        if self.plan is not None:
            self._check_same(rec)
            for a, b in zip(self.plan.regions, rec.regions):
                if a.birth is None or not a.birth.same(b.birth):
                    if b.birth is not None:
                        b.unplaced = b.unplaced or "its op differed between warm-up passes"
                    b.birth = None
                    b.hi = b.views_hi   # the bytes its views cover, not the whole storage
        self.plan = rec
        self.births = mode.by_key if mode is not None else {}
        self.passes += 1

    def _check_same(self, rec):
        old, new = [e.key() for e in self.plan.entries], [e.key() for e in rec.entries]
        if old != new:
            i = next((k for k, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
            was = self.plan.entries[i].describe() if i < len(old) else "nothing"
            now = rec.entries[i].describe() if i < len(new) else "nothing"
            if i < len(old) and i < len(new):
                now += " (%s)" % rec.entries[i].differences(self.plan.entries[i])
            raise Error(_capi.E_MISMATCH, "warm-up passes saved different tensors: tensor %d was %s, then %s; "
                        "a layer must save the same tensors at every call" % (i, was, now), self._where())

    def _guard(self, i):
        if not (self._restored or self._bwd_capture):
            raise Error(_capi.E_INVALID_STATE, "saved tensor %d was used outside the layer's backward (its bytes "
                        "are only there between backward_begin and backward_end)" % i, self._where())

    # -------------------------------------------------------- allocation
    @property
    def regions(self):
        return self.plan.regions if self.plan else []

    def moving(self):
        return [r for r in self.regions if r.selected]

    def in_group(self):
        """Whether its group holds anything: regions that move, or its static
        inputs (:meth:`inputs_move`)."""
        return bool(self.input_descs) or any(r.selected for r in self.regions)

    def kept_resident(self):
        """The regions that stay on the device in the layer's resident slot."""
        return [r for r in self.regions if r.resident is not None]

    def plan_resident(self):
        """Kept regions (not offloaded: the planner's or the fraction's choice,
        or mode "none") that an op of the layer allocates are born in a slot of
        the layer's own, mapped before its forward and released after its
        backward, as eager frees them: the memory is there for the gradients of
        the layers whose backward comes next, where a graph pool would keep it
        for good. Outputs, marked and small regions stay where they are. The
        graphs' static inputs of ``input_bytes`` go after the regions
        (vmmrt.torch.static_inputs); a recomputed layer's slot holds them
        alone: they are its checkpoint, what its backward runs the forward
        again from, held from its forward to its backward as eager
        checkpointing holds a layer's input, not for the graphs' life. A
        region whose op cannot be made to write it there (place.placeable:
        SDPA's flash and cuDNN kernels) stays in the pool and takes no bytes
        of the slot: reserved, they were held twice (on 8 Llama-3-8B layers
        at seq 4096, 260 MiB of attention outputs)."""
        cand = self._slot_candidates()
        total = 0
        for r in cand:
            total += (-total) % REGION_ALIGN
            r.resident = total
            total += r.nbytes
        # The graphs' static inputs after them (vmmrt.torch.static_inputs):
        # they live as the saved regions do, from the forward to the backward.
        at = []
        for n in (self.input_bytes if (total or self.recompute) and not self.input_descs else ()):
            if n is None:
                at.append(None)
                continue
            total += (-total) % REGION_ALIGN
            at.append(total)
            total += n
        # A slot is mapped in whole granules (2 MiB on the H200), with a map
        # and a release per step: less than half a granule stays in the pool.
        if not total or total < self.offload.granularity // 2:
            for r in cand:
                r.resident = None
            return
        self.input_at = tuple(at) if any(a is not None for a in at) else None
        self.resident = Backing(self.offload, "%s/resident" % self.name, total)

    def plan_outputs(self, recomputed=False):
        """The forward graph's outputs in a slot of their own (graphed.py: with
        graphs, a layer not a pipeline's, and not recomputed unless
        ``recomputed``: its forward graph makes them as any layer's), if
        discovery found where each is born and they are half a granule or
        more."""
        if not self.out_births or (self.recompute and not recomputed) or self.outputs is not None:
            return
        total = _outputs.layout(self.out_births)[1]
        if total < self.offload.granularity // 2:
            return
        self.outputs = _outputs.Outputs(self.offload, self.name, self.out_births)
        self.offload.backings.append(self.outputs.backing)

    def drop_outputs(self, stream):
        """No output landed in the outputs' slot at the capture: the slot goes
        (its memory once ``stream`` gets here)."""
        o, self.outputs = self.outputs, None
        o.drop()
        o.backing.release(stream)
        if o.backing in self.offload.backings:
            self.offload.backings.remove(o.backing)

    def placements(self):
        """The place.Placed of this layer's regions that can be born in their
        slot (a fresh target tensor each, over the fixed address): moving ones
        and resident ones."""
        out = []
        for r in self.moving() + self.kept_resident():
            b = r.birth
            if b is None or r.addr is None:
                continue
            base = r.bases.get(b.dtype)
            if base is None:
                continue
            out.append(place.Placed(b, place.tensor_over(base, b.dtype, b.shape, b.stride, b.offset - r.lo)))
        return out

    def _placed(self, placed, moves, outputs, rec):
        """Record how each moving region got into its slot at this pass. A
        target that went to another op's output (the pass ran other ops than
        discovery, with the same inputs) is refused if that output leaves the
        layer: its bytes are the slot's, which the region's copy overwrites.
        A resident region that was not born in its slot stays where it was
        allocated (the pool), as it did before."""
        by_birth = {id(p.birth): p for p in placed}
        ptrs = rec.region_ptrs()
        for r in self.kept_resident():
            p = by_birth.get(id(r.birth))
            ptr = ptrs.get(r.index)
            if ptr is not None and ptr + r.lo == r.addr:
                r.how, r.why = "resident", None
            else:
                r.how = "pool"
                r.why = (p.why if p is not None and p.why else None) or "not born in its resident slot"
                if p is not None and p.how is not None:
                    self._misplaced(r, p, outputs)
        for r, ptr in moves:
            p = by_birth.get(id(r.birth)) if r.birth is not None else None
            if ptr + r.lo == r.addr:
                r.how, r.why = (p.how if p is not None and p.how else "placed"), (p.why if p is not None else None)
                continue
            r.how = "copy"
            r.why = (p.why if p is not None and p.why else r.unplaced) or "not born in the slot"
            if p is not None and p.how is not None:
                self._misplaced(r, p, outputs)

    def _misplaced(self, r, p, outputs):
        r.why = "its slot went to another output of %s (the layer ran other ops than at discovery)" % (
            p.birth.describe())
        for o in outputs:
            if isinstance(o, torch.Tensor) and o.numel() and r.addr <= _compat.storage_of(o)[0] < r.addr + r.nbytes:
                raise Error(_capi.E_MISMATCH, "the layer ran other ops than at discovery, and an output of %s it "
                            "returns landed in the slot of saved region %d; a layer must run the same ops at "
                            "every call" % (p.birth.describe(), r.index), self._where())

    def placement(self):
        """How the moving regions reached their slot at the last capture (or
        eager pass): bytes born there ("placed"), computed and then copied in
        by the op's pass ("copied": the op has no out= variant), copied at the
        end of the forward ("copy"), with the reasons."""
        out = {"placed": 0, "copied": 0, "copy": 0, "resident": 0, "pool": 0, "why": {}}
        for r in self.moving() + self.kept_resident():
            if r.how is None:
                continue
            out[r.how] += r.nbytes
            if r.how not in ("placed", "resident"):
                why = r.why or "?"
                out["why"][why] = out["why"].get(why, 0) + r.nbytes
        return out

    def _slot_candidates(self):
        """The kept regions its resident slot would hold (plan_resident)."""
        return [r for r in self.regions if not r.selected and r.birth is not None and r.birth.placeable
                and r.reason in ("budget", "none") and r.nbytes >= self.offload.min_bytes]

    def inputs_move(self):
        """Whether the graphs' static inputs go in the group, in ping-pong:
        for a recomputed layer (its checkpoint) and for one whose saved
        regions all move (no resident slot would hold them: they were held
        for the graphs' life, on 16 launch-bound layers full offload's
        peak 2 % above eager checkpointing's). They leave the device
        between the forward and the backward as the saved regions do,
        through the banks. A call copies its arguments in after the
        forward's begin hook, once the bank's earlier bytes have gone to
        the host: the hooks' path, or the library in its one call
        (vmmrt_group_replay_copies). A layer that keeps regions in a slot
        keeps its inputs there, from its forward to its backward."""
        if self.offload.mode != "pingpong" or not any(n for n in self.input_bytes if n):
            return False
        return self.recompute or (any(r.selected for r in self.regions) and not self._slot_candidates())

    def describe_to_group(self):
        for r in self.moving():
            self.group.discover(r.desc())
        self.input_descs = []
        if self.inputs_move():
            from vmmrt import Group
            for n in self.input_bytes:
                if n:
                    d = Group.desc(n, 0, (n,), (1,), REGION_ALIGN)
                    self.group.discover(d)
                    self.input_descs.append(d)

    def learn_addresses(self):
        """Ask the group for each region's fixed address (no copy) and build the
        tensors over them, while every slot is mapped and outside any capture."""
        moving = self.moving()
        self.group.begin_capture()
        for r in moving:
            r.addr = self.group.save(r.desc(), 0, None)
        if self.input_descs:
            addrs = iter([self.group.save(d, 0, None) for d in self.input_descs])
            self.input_addrs = tuple(next(addrs) if n else None for n in self.input_bytes)
        self.group.end_capture()
        if self.resident is not None:
            self.resident.ensure()
            for r in self.kept_resident():
                r.addr = self.resident.address + r.resident
        for r in moving + self.kept_resident():
            # uint8 too: the eager copies in (a tensor over an address is made
            # here, while mapped: torch asks the driver about the pointer); and
            # the dtype of the op that allocates the storage, to be born there
            dts = set(r.dtypes) | {torch.uint8} | ({r.birth.dtype} if r.birth is not None else set())
            r.bases = {dt: _address.tensor_at(r.addr, r.nbytes, dt, self.offload.device) for dt in dts}

    def saved_bytes(self):
        """Bytes of this layer's saved tensors: "views" (as autograd saved them,
        each view counted, kept tensors not), "distinct" (the regions behind
        those views, each once), "moved" (the regions that are offloaded)."""
        if not self.plan:
            return {"views": 0, "distinct": 0, "moved": 0}
        return {"views": self.plan.view_bytes(),
                "distinct": sum(r.nbytes for r in self.regions),
                "moved": sum(r.nbytes for r in self.moving())}

    # ------------------------------------------------------------- hooks
    def forward_begin(self, stream=None, eager=False, current=None):
        """``current``: the torch stream that ``stream`` is, when the caller
        has it already (vmmrt.torch._call asks torch once per hook pair)."""
        self._check_usable()
        self.offload.flush()
        if self.offload.memplan is not None:
            self.offload.memplan.forward_begin(self, stream)
            self.offload.memplan.use_begins(self, False)
            if self.offload.part_checks:
                self.offload.memplan.check_parts(self.keys[False], stream)
        if self.resident is not None:
            # with static inputs in it, mapped before the call copies them in
            # (see graphed._allocate)
            self.offload.map_for_use(self, False, self.resident, stream, eager or self.input_at is not None, current)
        if self.outputs is not None:
            self.offload.map_for_use(self, False, self.outputs.backing, stream, eager, current)
        self.group.forward_begin(stream)
        self.offload.use_started(self, False, current)

    def forward_end(self, stream=None):
        self.group.forward_end(stream)
        if self.outputs is not None:
            self.outputs.backing.release(stream)    # (on the pages: its use ends; the tensors handed out say more)

    def backward_begin(self, stream=None, current=None):
        self._check_usable()
        self.offload.flush()
        if self.offload.memplan is not None:
            self.offload.memplan.use_begins(self, True)
            if self.offload.part_checks:
                self.offload.memplan.check_parts(self.keys[True], stream)
        self.group.backward_begin(stream)
        if self.offload.host:
            # Host backend: the CPU reads the restored bytes itself, so it
            # waits here for the restore the stream waits for.
            self.offload.runtime.stream_synchronize(stream)
        self._restored = True
        self.offload.use_started(self, True, current)

    def backward_end(self, stream=None):
        self._restored = False
        self.group.backward_end(stream)
        if self.resident is not None:
            self.resident.release(stream)

