# SPDX-License-Identifier: LGPL-2.1-or-later
"""grads="mapped": each parameter's gradient at a fixed address that is its
``.grad``, in memory that exists only while a gradient does.

torch.cuda.make_graphed_callables' backward graph writes every parameter's
gradient into a static buffer of the graph pool, held for the life of the
graphs (1x the parameters), and a persistent ``.grad`` is a second copy that
AccumulateGrad adds the buffer into. Here instead, per callable (a module,
shared by its pipeline runners):

- discovery (the warm-up backward) records the op that allocates each
  parameter's gradient (vmmrt.torch.place); those storages are laid out in
  one libvmmrt slot (:class:`vmmrt.torch.backing.Backing`), and the backward
  graph is captured twice: *write*, where those ops write the gradient at its
  fixed address (no copy), and *accumulate*, where AccumulateGrad adds this
  microbatch's gradient into the ``.grad`` already there, in place, as eager
  does (the same kernels: gradients bitwise as eager's);
- at each backward, per callable: a ``.grad`` that is already ours
  (accumulation over microbatches, or a persistent ``.grad`` zeroed in place)
  takes the accumulate graph; otherwise the write graph, into memory mapped
  just then (the driver workers map it ahead, one backward in advance);
- either way the gradients go back to autograd as the Function's gradients,
  so AccumulateGrad runs after the graph as it does in eager and in torch's
  graphs: it takes our tensor as ``.grad`` (a ``.grad`` already ours is
  handed back to it the same way, after the graph added into it), or adds it
  into a ``.grad`` of someone else's (DistributedDataParallel's bucket views),
  and every hook on it runs: ``register_post_accumulate_grad_hook``, DDP's
  reducer;
- the memory is released when the last tensor over it dies
  (``zero_grad(set_to_none=True)``, or the last reference dropped), once the
  stream has finished with it: between the forward and the backward of a
  step, nothing is held for gradients, as in eager; with a persistent
  ``.grad``, one copy.

A callable whose gradients cannot all be placed (a gradient no op of the
backward allocates, a layout AccumulateGrad would not take as is) keeps
torch's static buffers ("static"), and says why (:meth:`Grads.describe`).
"""
import logging

import torch

from vmmrt import Error, _capi
from vmmrt.torch import _compat, place
from vmmrt.torch.backing import USE_COUNT, Backing, Held, alive_by
from vmmrt.torch.saved import REGION_ALIGN

log = logging.getLogger("vmmrt.torch")


class Seen:
    """What one warm-up backward produced for a callable's parameters: per
    parameter, its gradient's birth and where the gradient sits in that
    storage, or why it cannot be placed; the same for the gradient of each
    argument (``inputs``); and the layout (dtype, shape, stride) of each
    output gradient it was given (``gouts``)."""

    def __init__(self, params, grads, mode, gouts=(), inputs=(), input_grads=()):
        self.entries = []
        for p, g in zip(params, grads):
            self.entries.append(self._entry(p, g, mode))
        self.inputs = [self._entry(x, g, mode) for x, g in zip(inputs, input_grads)]
        self.input_layouts = [None if g is None else (g.dtype, tuple(g.shape), tuple(g.stride()))
                              for g in input_grads]
        self.by_key = dict(mode.by_key)
        self.gouts = tuple(gouts)

    @staticmethod
    def _entry(p, g, mode):
        if g is None:
            return (None, "no gradient reaches it")
        ptr = _compat.storage_of(g)[0]
        b = mode.births.get(ptr)
        if b is None:
            return (None, "its gradient is not allocated by an op of the backward")
        if g.dtype != p.dtype or tuple(g.shape) != tuple(p.shape) or tuple(g.stride()) != tuple(p.stride()):
            return (None, "its gradient's layout (%s %s stride %s) is not the parameter's (AccumulateGrad would "
                    "copy it)" % (str(g.dtype).replace("torch.", ""), list(g.shape), list(g.stride())))
        return ((b, _compat.storage_offset_bytes(g)), None)

    def same(self, other):
        if other is None or len(other.entries) != len(self.entries) or len(other.inputs) != len(self.inputs):
            return False
        for (a, wa), (b, wb) in zip(self.entries + self.inputs, other.entries + other.inputs):
            if (a is None) != (b is None) or wa != wb:
                return False
            if a is not None and (not a[0].same(b[0]) or a[1] != b[1]):
                return False
        return self.gouts == other.gouts


class Grads:
    """The gradients of one callable's parameters at fixed addresses."""

    def __init__(self, offload, name, params, seen, outputs=False):
        self.offload = offload
        self.name = name
        self.params = params
        self.why = None              # why it is "static", if it is
        self.views = []              # per parameter: (offset of the gradient in the slot, dtype, shape, stride) or None
        self.regions = []            # (birth, offset of its storage in the slot)
        # outputs=True: the backward graph's output gradients (its static
        # inputs, which the call fills) lie in a slot of their own (``io``):
        # (offset, dtype, shape, stride) per output that needs a gradient,
        # in the order the warm-up gave them.
        self.gouts = []
        self.gouts_used = False      # a backward graph reads them there (graphed.py)
        # and the gradients of its arguments, which the backward graph makes
        # (its static outputs): born in the io slot, handed to autograd as
        # the parameters' gradients are: (offset, dtype, shape, stride) per
        # argument, None for one that needs none or cannot be placed
        self.gins = []
        self.gin_regions = []        # (argument index, birth, offset of its storage in the io slot)
        self.known = {}
        self.backing = None
        # The io slot: the argument gradients live from this backward to
        # the next use (the layer before reads them: Offload.hold_gins), the
        # parameters' gradients to the optimizer step or, as a persistent
        # .grad, for good. In one slot the persistent loop kept both for
        # good: a layer output's size twice per layer beside the
        # activations (8 x 64 MiB on the Llama layers, H200, session 51).
        self.io = None
        # The output gradients' slot (``outs``): filled by the call, read by
        # the backward graph, dead once it has run. In the io slot they
        # lived to the next use too, so the layer before's backward held
        # two output-sized buffers of the layer after's beside its own two
        # (seq 32768: 1024 MiB of io slots at the step's busiest use, H100,
        # 2026-12-06; eager holds one gradient per layer boundary there).
        self.outs = None
        # A chain of layers hands this backward, as its one output gradient
        # (``gout_index`` of the outputs: set by the call), the argument
        # gradient the layer after's backward made in its io slot: the
        # memory plan maps the outs slot on those pages (memplan.chain_gouts),
        # learning it from what the step before the plan handed
        # (:meth:`note_gouts`: ``gout_seen``, (address, dtype, shape,
        # stride), False where it differed or was none); then ``chain`` is
        # (the io slot's Backing, the address, dtype, shape, stride, index)
        # and the call copies nothing in when that tensor comes
        # (:meth:`chained`; ``chain_skips`` counts them).
        self.gout_index = None
        self.watch_gouts = False
        self.gout_seen = None
        self.chain = None
        self.chain_skips = 0
        self._io_bases = None        # on the plan's pages: one base per dtype over it, made once (io.alive: their Held)
        self._io_cached = None       # each argument's gradient as a view over them, made once (after_backward)
        self._warned = False
        # On the memory plan's pages: a tensor over the whole slot and one
        # per dtype, made once (:meth:`_source`); the storage's use count
        # above what they hold tells a gradient handed out is alive: the
        # slot's ``alive`` is their backing.Held, set here (alive_by).
        self._bases = None
        self._cached = None          # each parameter's gradient as a view over them (after_backward)
        self._layout(seen, outputs)

    @property
    def mapped(self):
        return self.backing is not None

    def _layout(self, seen, outputs):
        if not seen:
            self.why = "no warm-up backward recorded its gradients"
            return
        last = seen[-1]
        if len(seen) > 1 and not seen[-2].same(last):
            self.why = "the ops that make its gradients differed between warm-up passes"
            return
        offsets = {}
        total = 0
        io_total = 0
        outs_total = 0
        views = []
        for k, (p, (e, why)) in enumerate(zip(self.params, last.entries)):
            if not p.requires_grad:
                views.append(None)
                continue
            if e is None:
                self.why = "parameter %d: %s" % (k, why)
                return
            b, off = e
            key = (b.key, b.out)
            if key not in offsets:
                total += (-total) % REGION_ALIGN
                offsets[key] = total
                self.regions.append((b, total))
                total += b.storage_nbytes
            views.append((offsets[key] + off, p.dtype, tuple(p.shape), tuple(p.stride())))
        if not total:
            self.why = "no parameter needs a gradient"
            return
        if outputs:
            # Read (the output gradients) or written (the arguments') by the
            # backward graph, and handed on to the layer before: memory only
            # from this backward to the next use; in the graph pool or the
            # caching allocator they were held for the life of the graphs
            # (one layer output's size each, per layer, beside the
            # activations).
            io_keys = set()
            for k, ((e, why), layout) in enumerate(zip(last.inputs, last.input_layouts)):
                if e is None or (e[0].key, e[0].out) in offsets or (e[0].key, e[0].out) in io_keys:
                    self.gins.append(None)   # (none, or in a gradient's storage already: left where it is)
                    continue
                b, off = e
                io_total += (-io_total) % REGION_ALIGN
                io_keys.add((b.key, b.out))
                self.gin_regions.append((k, b, io_total))
                self.gins.append((io_total + off,) + layout)
                io_total += b.storage_nbytes
            for dt, shape, stride in last.gouts:
                outs_total += (-outs_total) % REGION_ALIGN
                self.gouts.append((outs_total, dt, shape, stride))
                outs_total += storage_nbytes(dt, shape, stride)
        self.views = views
        # what a backward reads per parameter, decided here once: its
        # gradient's place as as_strided takes it (dtype, shape, stride, the
        # offset in elements of that dtype), and the states when no .grad
        # exists (the set_to_none loop's every backward)
        self._strided = [None if v is None else (v[1], v[2], v[3], v[0] // _compat.itemsize(v[1])) for v in views]
        self._none_states = [None if v is None else "none" for v in views]
        self.known = last.by_key
        self.backing = Backing(self.offload, "%s/grads" % self.name, total)
        alive_by(self, self.backing)
        self.offload.backings.append(self.backing)
        if io_total:
            self.io = Backing(self.offload, "%s/io" % self.name, io_total)
            alive_by(self, self.io)
            self.offload.backings.append(self.io)
        if outs_total:
            self.outs = Backing(self.offload, "%s/outs" % self.name, outs_total)
            self.offload.backings.append(self.outs)
        # a backward's slots, as one hook's uses (memplan.Watcher.begin_uses):
        # with the gradients' slot, or without it while a gradient over it is
        # held (the persistent loop's .grad: mapped all along)
        self._uses = (self.backing,) + tuple(b for b in (self.io, self.outs) if b is not None)
        self._io_uses = self._uses[1:]

    @property
    def io_bytes(self):
        """The bytes of the io and output gradients' slots: the backward's
        argument and output gradients."""
        return sum(b.nbytes for b in (self.io, self.outs) if b is not None)

    def io_base(self):
        """A tensor over the io slot (a capture's: its statics are views of it)."""
        return self.io.tensor(None, counted=False) if self.io is not None else None

    def outs_base(self):
        """A tensor over the output gradients' slot (a capture's: the backward
        graph's static output gradients are views of it)."""
        return self.outs.tensor(None, counted=False) if self.outs is not None else None

    # ----------------------------------------------------- the slot's source
    def held(self):
        """Whether a tensor over the slot's memory is alive (the library's
        own cached bases aside)."""
        return self.backing.live > 0 or self.alive()

    def alive(self):
        """Whether a gradient handed out over the cached bases (on the plan's
        pages) is alive: the storage's use count above theirs."""
        return self.backing.handed_out()

    def _source(self, stream):
        """(src, bases): a tensor over the slot's memory that this backward's
        gradients are made from, and the dict of its per-dtype bases
        (:func:`_over`) to fill or use. Off the plan's pages, a tensor of its
        own at each backward (Backing.tensor: its death releases the slot).
        On them the memory is there for good and a release maps nothing: one
        base per dtype, made once, and liveness from the storage's use count
        (vmmrt.torch.outputs' way). The dlpack capsule and finalizer of a
        tensor per backward were the largest per-call cost of the launch-
        bound layers' backward left after the per-parameter views (H200,
        cProfile of the calling thread)."""
        b = self.backing
        if not b.bound or USE_COUNT is None:
            if self._bases is not None and not self.alive():
                self.forget()         # off the pages (a conflict): each backward's own tensor again
            return b.tensor(stream), {}
        if self._bases is None:
            bases = _slot_bases(b, self.views, stream)
            # Each parameter's gradient as a view made once: a backward hands
            # out its detach() (a tensor of its own over the same storage,
            # which AccumulateGrad takes as .grad), half an as_strided's cost.
            self._cached = [None if s is None else bases[s[0]].as_strided(s[1], s[2], s[3])
                            for s in self._strided]
            self._bases = bases
            b.alive = Held(bases[torch.uint8])     # (counted with the views above: the library's own)
        return self._bases[torch.uint8], self._bases

    def _io_source(self, stream):
        """(src, bases) over the io slot, as :meth:`_source` over the
        gradients' slot: on the plan's pages one base per dtype made once,
        liveness from the storage's use count; off them a tensor of its own
        per backward, whose death (the argument gradients handed out let
        go) releases the slot."""
        b = self.io
        if not b.bound or USE_COUNT is None:
            if self._io_bases is not None and not self.io_alive():
                self._io_bases = self._io_cached = b.alive = None
            return b.tensor(stream), {}
        if self._io_bases is None:
            bases = _slot_bases(b, self.gins, stream)
            # each argument's gradient as a view made once, as the
            # parameters' (_source): a backward hands out its detach()
            self._io_cached = [None if spec is None else _over(bases[torch.uint8], bases, spec) for spec in self.gins]
            self._io_bases = bases
            b.alive = Held(bases[torch.uint8])     # (counted with the views above: the library's own)
        return self._io_bases[torch.uint8], self._io_bases

    def io_alive(self):
        """Whether an argument gradient handed out over the io slot's cached
        bases is alive."""
        return self.io is not None and self.io.handed_out()

    def forget(self):
        """At close(), or off the pages: the cached bases let go (a gradient
        handed out keeps the memory, and the runtime, alive: Backing.tensor)."""
        self._bases = None
        self._cached = None
        self._io_bases = self._io_cached = None
        for slot in (self.backing, self.io, self.outs):
            if slot is not None:
                slot.alive = None

    def drop(self):
        """Before anything used it (graphed.py makes them again): the slots go."""
        for b in (self.backing, self.io, self.outs):
            if b is None:
                continue
            if b in self.offload.backings:
                self.offload.backings.remove(b)
            b.destroy()
        self.backing = None
        self.io = None
        self.outs = None

    # ---------------------------------------------------------- tensors
    def view(self, src, k):
        """Parameter k's gradient over src's storage (a base over the slot, or a
        gradient already there): a fresh tensor, as an op's output."""
        off, dt, shape, stride = self.views[k]
        return _compat.tensor_over(src, dt, shape, stride, off)

    def gout(self, src, j):
        """The j-th output gradient's tensor over src's storage (the output
        gradients' slot's; None when they are not in it)."""
        if j >= len(self.gouts):
            return None
        off, dt, shape, stride = self.gouts[j]
        return _compat.tensor_over(src, dt, shape, stride, off)

    def placements(self, base, iobase=None):
        """Where the backward's ops put the parameters' gradients (place.Placed),
        over base; ``iobase`` (over the io slot): the arguments' too (a
        backward graph whose call hands them out from there: graphed.py's,
        not a recomputing one's)."""
        out = [place.Placed(b, _compat.tensor_over(base, b.dtype, b.shape, b.stride, off + b.offset))
               for b, off in self.regions]
        if iobase is not None:
            out += [self.gin_placement(iobase, k) for k, _, _ in self.gin_regions]
        return out

    def gin_placement(self, iobase, k):
        """Where the backward's op puts argument k's gradient (place.Placed), over the io slot's iobase."""
        b, off = next((b, off) for j, b, off in self.gin_regions if j == k)
        return place.Placed(b, _compat.tensor_over(iobase, b.dtype, b.shape, b.stride, off + b.offset))

    def gin_at(self, k, t):
        """Whether argument k's gradient ``t`` (a capture's) is at its place in the io slot."""
        spec = self.gins[k] if k < len(self.gins) else None
        if spec is None or t is None or self.io is None:
            return False
        off, dt, shape, stride = spec
        return t.data_ptr() == self.io.address + off and t.dtype == dt and tuple(t.shape) == shape and \
            tuple(t.stride()) == stride

    def state(self, k, p):
        """"none" (no .grad), "ours" (.grad is the gradient at its fixed
        address) or "foreign" (another tensor: DDP's bucket view, a user's)."""
        g = p.grad
        if g is None:
            return "none"
        off, dt, shape, stride = self.views[k]
        if g.dtype == dt and tuple(g.shape) == shape and tuple(g.stride()) == stride and \
                g.device.type == self.offload.device.type and g.data_ptr() == self.backing.address + off:
            return "ours"
        return "foreign"

    # --------------------------------------------------------- per step
    def before_backward(self, stream, where, lay=None, current=None):
        """Choose the graph of this backward and get the memory ready (mapped
        once the GPU has begun the use before, the stream waiting for it: see
        Offload.map_for_use). Returns (accumulate, src, states): src
        is a tensor over the live memory that the gradients handed back are
        made from. ``current``: the torch stream ``stream`` is, if the caller
        has it."""
        if lay is not None:
            b = self.backing
            uses = self._io_uses if b.live > 0 or (b.alive is not None and b.alive()) else self._uses  # (held(): a call)
            if uses:
                off = self.offload
                w = off.memplan
                k = w.begin_uses(uses, stream) if w is not None else 0
                if k < len(uses):
                    for u in uses[k:]:
                        off.map_for_use(lay, True, u, stream, current=current)
        for p in self.params:
            if p.grad is not None:
                states = [None if v is None else self.state(k, p) for k, (p, v) in
                          enumerate(zip(self.params, self.views))]
                break
        else:
            states = self._none_states
        acc = "ours" in states
        src = None
        if acc:
            for k, (p, st) in enumerate(zip(self.params, states)):
                if st is not None and getattr(p, "_backward_hooks", None):
                    raise Error(_capi.E_NOT_SUPPORTED, "parameter %d has a gradient hook (Tensor.register_hook) and "
                                "its .grad accumulates in the backward graph (grads='mapped'): the hook would see "
                                "the sum, not this backward's gradient; use register_post_accumulate_grad_hook, "
                                "or grads='static'" % k, where)
            if any(st in ("none", "foreign") for st in states):
                src, bases = self._source(stream)
                if "foreign" in states and not self.offload.host:
                    self.backing.ensure()  # copy_ is a cudaMemcpyAsync, checked when enqueued: mapped by then
                for k, (p, st) in enumerate(zip(self.params, states)):
                    if st == "none":
                        _over(src, bases, self.views[k]).zero_()
                    elif st == "foreign":
                        _over(src, bases, self.views[k]).copy_(p.grad)
            else:
                src = next(p.grad for p, st in zip(self.params, states) if st == "ours")
        else:
            if self.held() and not self._warned:
                self._warned = True
                log.warning("vmmrt: %s: a gradient tensor of an earlier backward is still referenced (not as .grad); "
                            "this backward writes its gradients over it, as the static buffers of torch's graphs "
                            "are written over", where)
            src, _ = self._source(stream)
        return acc, src, states

    def note_gouts(self, gouts):
        """A backward before the memory plan is made: the output gradient it
        is handed (one per step: a chain hands the same tensor each time)."""
        j = self.gout_index
        g = gouts[j] if j is not None and j < len(gouts) else None
        seen = False if g is None else (g.data_ptr(), g.dtype, tuple(g.shape), tuple(g.stride()))
        self.gout_seen = seen if self.gout_seen is None or self.gout_seen == seen else False

    def chained(self, gouts, stream):
        """The output gradients to copy in, after :meth:`before_backward`,
        where the outs slot is on the io slot's pages of the layer after
        (``chain``): the one it is handed lies there already when it is
        that layer's argument gradient over those pages (None in its place:
        no copy); any other would be copied over that layer's argument
        gradients, which a caller may hold (a hook's tensor, say), so the
        slot leaves the pages for memory of its own first (a conflict of the
        plan's, counted). Once the io slot itself is off the pages nothing
        is written over it: the copy goes to the pages as without a chain."""
        io, ptr, dt, shape, stride, j = self.chain
        outs = self.outs
        if not outs.bound:
            return gouts
        g = gouts[j]
        if io.bound:
            if g is not None and g.data_ptr() == ptr and g.dtype == dt and g.shape == shape and \
                    g.stride() == stride:
                self.chain_skips += 1
                return gouts[:j] + (None,) + gouts[j + 1:]
            self.offload.memplan.conflict(outs.planned, [io], stream)
            outs.ensure()
        return gouts

    def fill_outputs(self, statics, gouts):
        """The output gradients autograd gives into their place in the slot
        (``statics``, over it), after :meth:`before_backward`: the stream has
        the memory by then; a copy_ (cudaMemcpyAsync, whose addresses the
        driver checks when it is enqueued) needs the host to know it mapped
        too, which a slot on the plan's pages always is. (The wait is not
        the copy's alone: filling by a kernel instead, which the driver does
        not check, left every later copy over the slot, AccumulateGrad's or
        a .grad's clone, to find it unmapped at enqueue: "invalid argument"
        on the H200, budget plans and the first steps of a plan.)"""
        if not self.outs.bound and not self.offload.host:
            self.outs.ensure()
        copy_into(statics, gouts)

    def after_backward(self, acc, src, states, inputs=None, stream=None):
        """The gradients to hand to autograd, one per parameter (None where it
        needs none). Where .grad is ours, or was copied in, it is set to None
        first, so that AccumulateGrad takes the sum back as it is.

        ``inputs``: per argument, where its gradient lies in the io slot
        ((offset, dtype, shape, stride) or None); those gradients, made the
        same way, are returned first ((arguments' list, parameters' list)),
        and held until the next backward of this offload or its next
        forward (Offload.hold_gins): AccumulateGrad of a leaf argument (an
        input tensor that requires grad) would otherwise take the tensor
        itself as its .grad, which then held the slot past the step (the
        memory plan's pages under it taken by the next forward's slots);
        held, it copies it, as it does any gradient referenced elsewhere.
        The io slot's use ends here (ordered on ``stream``): what holds it
        on is the argument gradients handed out.

        They are made as views (Tensor.as_strided) of one tensor per dtype
        over src's storage, one call each: a tensor of its own per gradient
        (:meth:`view`: torch.empty, then set_) was the largest cost of a
        graphed layer's call on the launch-bound layers (H200, cProfile:
        about a third of vmmrt's per-layer launch time over torch's graphs).
        AccumulateGrad takes a view as it takes DDP's bucket views; the
        storage, whose death releases the slot, is src's either way."""
        cached = self._bases is not None and src is self._bases.get(torch.uint8)
        bases = self._bases if cached else {}
        if cached:
            out = [None if st is None else v.detach() for st, v in zip(states, self._cached)]
            if acc:
                for p, st in zip(self.params, states):
                    if st is not None:
                        p.grad = None
        else:
            out = []
            for p, st, spec in zip(self.params, states, self._strided):
                if st is None:
                    out.append(None)
                    continue
                dt, shape, stride, elems = spec
                base = bases.get(dt)
                if base is None:
                    base = _base(src, bases, dt)
                out.append(base.as_strided(shape, stride, elems))
                if acc or st == "ours":
                    p.grad = None
        if self.outs is not None:
            self.outs.release(stream)   # (read by the graph, done with: nothing is handed out over them)
        if inputs is None:
            self._handed(cached, stream)
            io = self.io
            if io is not None and not io.live:
                io.release(stream)      # (no argument gradient handed out from it)
            return out
        iosrc, iobases = self._io_source(stream)
        if iobases is self._io_bases and self._io_cached is not None:
            # (inputs: the arguments' entries of self.gins, None where one is not handed out)
            gins = [None if spec is None else v.detach() for spec, v in zip(inputs, self._io_cached)]
        else:
            gins = [None if spec is None else _over(iosrc, iobases, spec) for spec in inputs]
        self.offload.hold_gins(gins)
        self._handed(cached, stream)
        if self.io.bound:
            self.io.release(stream)     # (off the pages, the tensor over it does, once the last gradient dies)
        return gins, out

    def _handed(self, cached, stream):
        # Over the cached bases no storage's death releases the slot: its
        # use ends now (bound: release() only ends it, no lock, no driver
        # call), and what is handed out holds it (alive) from here.
        if cached:
            self.backing.release(stream)

    def own_grads(self):
        """Before the runtime goes (close()): every .grad over the slot becomes
        a copy, and the cached bases let go."""
        if self.backing is None:
            return
        for k, p in enumerate(self.params):
            if self.views and self.views[k] is not None and p.grad is not None and self.state(k, p) == "ours":
                p.grad = p.grad.clone()
        self.forget()

    def describe(self):
        if self.backing is None:
            return "static gradient buffers (%s)" % self.why
        io = ""
        if self.io is not None:
            io = "; the backward's argument gradients in a slot of their own (%.1f MiB at 0x%x)" % (
                self.io.nbytes / 2.0 ** 20, self.io.address)
        if self.outs is not None and self.gouts_used:
            io += "; its %d output gradient(s) in another, for its backward alone (%.1f MiB at 0x%x%s)" % (
                len(self.gouts), self.outs.nbytes / 2.0 ** 20, self.outs.address,
                "" if self.chain is None else ", on the pages of %s, where the layer after hands it: %d copies "
                "skipped" % (self.chain[0].name, self.chain_skips))
        return "mapped: %.1f MiB at 0x%x, %d regions%s" % (
            self.backing.nbytes / 2.0 ** 20, self.backing.address, len(self.regions), io)


def _slot_bases(backing, specs, stream):
    """A base over the whole slot (uint8, uncounted: its life is the
    caller's) and one per dtype of ``specs`` (:func:`_over`), made once."""
    base = backing.tensor(stream, counted=False)
    bases = {base.dtype: base}
    for spec in specs:
        if spec is not None:
            _over(base, bases, spec)
    return bases


def _over(src, bases, spec):
    """A view of src's storage at spec ((offset, dtype, shape, stride)),
    through one base tensor per dtype (``bases``, filled as needed)."""
    off, dt, shape, stride = spec
    base = bases.get(dt)
    if base is None:
        base = _base(src, bases, dt)
    return base.as_strided(shape, stride, off // base.element_size())


def _base(src, bases, dt):
    """src's storage as a tensor of dtype ``dt`` (src itself where it is
    one), kept in ``bases``: the views of :func:`_over` are made from it."""
    base = bases[dt] = src if src.dtype == dt else _compat.tensor_over(src, dt, (0,), (1,), 0)
    return base


def copy_into(statics, gouts):
    """The output gradients autograd gives into the backward graph's static
    ones (those that are not already them)."""
    for g, grad in zip(statics, gouts):
        if g is not None and grad is not None and g.data_ptr() != grad.data_ptr():
            g.copy_(grad)


class quiet_hooks:
    """The hooks on these parameters (Tensor.register_hook,
    register_post_accumulate_grad_hook) do not run inside: a backward captured
    into a graph, or the nested backward of an eager layer, computes the
    gradients that AccumulateGrad then takes after it, where each hook runs
    once, as in eager (torch 2 runs a leaf's hooks in torch.autograd.grad too:
    they would run twice, and once inside the graph)."""

    _ATTRS = ("_backward_hooks", "_post_accumulate_grad_hooks")

    def __init__(self, params):
        self.params = params
        self.saved = []

    def __enter__(self):
        for p in self.params:
            for attr in self._ATTRS:
                d = getattr(p, attr, None)
                if d:
                    self.saved.append((d, list(d.items())))
                    d.clear()
        return self

    def __exit__(self, *exc):
        for d, items in self.saved:
            d.update(items)
        self.saved = []


def record_backward(runner, mode, wrt, res, gouts=()):
    """After a warm-up backward under a place.Mode: what it made for the
    callable's parameters (``wrt`` the tensors differentiated, ``res`` their
    gradients), and the output gradients it was given (``gouts``)."""
    by_id = {id(t): g for t, g in zip(wrt, res)}
    grads = [by_id.get(id(p)) for p in runner.params]
    sample = getattr(runner, "sample", ())
    runner.grads_seen.append(Seen(runner.params, grads, mode,
                                  [(g.dtype, tuple(g.shape), tuple(g.stride())) for g in gouts],
                                  sample, [by_id.get(id(x)) for x in sample]))


def storage_nbytes(dtype, shape, stride):
    """The bytes a tensor of this layout spans from its first element."""
    if any(n == 0 for n in shape):
        return 0
    span = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    return span * _compat.itemsize(dtype)
