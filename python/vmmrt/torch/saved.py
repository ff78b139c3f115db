# SPDX-License-Identifier: LGPL-2.1-or-later
"""Saved tensors of one runner's forward: which stay, which move, and how.

Every tensor autograd saves reaches :class:`Recorder.pack`. It is either
*kept* (returned to autograd as an alias: parameters, buffers, static graph
inputs and outputs, tensors on another device, 0-size tensors, tensors
marked with :func:`vmmrt.torch.mark_not_offload`), or it is a *view* of a
*region*: the byte range of one storage that the layer's saved views cover.
Each region is copied once, however many views stand on it (q, k and v of one
projection; a tensor and its transpose; the same tensor saved twice), and the
views are rebuilt over the region's fixed address (dtype, shape, stride,
offset).

The first pass (discovery) fixes the *signature*: for each saved tensor in
order, what it is. Every later pass must produce the same signature, or the
graphs would read the wrong bytes: a difference is a VMMRT_E_MISMATCH naming
the layer and the tensor.

The originals stay alive until the pass ends: a freed address could come
back for the next tensor of the same shape and merge two regions that
discovery saw apart.
"""
import threading
import weakref

import torch

from vmmrt import Error, _capi
from vmmrt.torch import _compat, _contracts, place

# Region boundaries fall on multiples of this many bytes of their storage, so
# a view keeps its address alignment modulo 512 inside the slot (the caching
# allocator's block alignment): kernels that pick a path by alignment pick
# the same one, and the results stay bitwise the same.
REGION_ALIGN = 512

# dtype tags for the C descriptors (compared there, never interpreted).
_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
           torch.float16, torch.bfloat16, torch.float32, torch.float64,
           torch.complex64, torch.complex128]
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES.append(getattr(torch, _name))
DTYPE_TAG = {dt: i + 1 for i, dt in enumerate(_DTYPES)}

_tls = threading.local()


def mark_not_offload(*tensors: torch.Tensor) -> None:
    """Keep these tensors on the device when a layer saves them (TransformerEngine's
    ``mark_not_offload``): the whole storage region they stand on stays resident.
    Call it inside the layer's forward, on every call (it marks tensor objects).
    TransformerEngine's own mark (``transformer_engine.pytorch.mark_not_offload``)
    and Megatron's (``offloading_activation = False``) are honoured too."""
    for t in tensors:
        if hasattr(t, "get_data_tensors"):   # TransformerEngine's quantized tensors: their data, as TE marks them
            mark_not_offload(*[d for d in t.get_data_tensors() if d is not None])
        elif isinstance(t, torch.Tensor):
            t._vmmrt_keep = True


class no_offload:
    """Context manager: tensors saved inside it stay on the device."""

    def __enter__(self):
        _tls.depth = getattr(_tls, "depth", 0) + 1

    def __exit__(self, *exc):
        _tls.depth -= 1


def _marked(t):
    if getattr(_tls, "depth", 0) > 0:
        return True
    if getattr(t, "_vmmrt_keep", False) or _contracts.not_offload_marked(t):
        return True
    base = t._base
    return base is not None and (getattr(base, "_vmmrt_keep", False) or _contracts.not_offload_marked(base))


# A region born at its fixed address holds the whole storage its op
# allocated: one whose saved views leave more than this share of it out is
# copied instead (the rest would ride along in every D2H).
PLACE_SLACK = 8


class Region:
    """Bytes [lo, hi) of one storage, saved once; ``selected`` says whether it moves."""

    __slots__ = ("index", "storage_nbytes", "lo", "hi", "dtypes", "selected", "reason", "addr", "bases", "birth",
                 "views_hi", "unplaced", "resident", "how", "why", "view")

    def __init__(self, index, storage_nbytes):
        self.index = index
        self.storage_nbytes = storage_nbytes
        self.lo = None
        self.hi = None
        self.dtypes = []
        self.view = None     # (shape, stride) of the view that opened it (its descriptor's)
        self.selected = True
        self.reason = None   # why it is kept, when it is
        self.addr = None     # its fixed address, once learned
        self.bases = {}      # dtype -> tensor over [addr, addr + nbytes)
        self.views_hi = None  # hi before a birth made it the whole storage
        self.resident = None  # kept: its offset in the layer's resident slot (LayerOffload.plan_resident)
        self.birth = None    # the op that allocated the storage (place.Birth), when it can be born in the slot
        self.unplaced = None  # why it cannot be
        self.how = None      # at the last capture: "placed", "copied" (in the pass) or "copy" (at its end)
        self.why = None      # why it was copied

    @property
    def nbytes(self):
        return self.hi - self.lo

    def extend(self, start, end, t):
        self.lo = start if self.lo is None else min(self.lo, start)
        self.hi = end if self.hi is None else max(self.hi, end)
        dtype = t.dtype
        if self.view is None:
            self.view = (tuple(t.shape), tuple(t.stride()))
        if dtype not in self.dtypes:
            self.dtypes.append(dtype)

    def close(self):
        """Round lo down to the alignment (never below the storage's start)."""
        self.lo -= self.lo % REGION_ALIGN

    def desc(self, seen=None):
        """The region as the library checks it at every save against discovery:
        its bytes, and the dtype, shape and strides of the view that opened it,
        as ``seen`` (this pass's region of the same index) saw them; by default
        as discovery did. A view of more dimensions than a descriptor takes is
        described flat (its bytes)."""
        from vmmrt import Group
        seen = self if seen is None else seen
        shape, stride = seen.view
        if len(shape) > _capi.MAX_DIMS:
            shape, stride = (self.nbytes,), (1,)
        return Group.desc(self.nbytes, DTYPE_TAG.get(seen.dtypes[0], 0), shape, stride, REGION_ALIGN)


class Entry:
    """What one saved tensor was, for comparing passes."""

    __slots__ = ("kind", "region", "dtype", "shape", "stride", "offset", "storage_nbytes")

    def __init__(self, kind, region, t, offset, storage_nbytes):
        self.kind = kind            # "keep:<why>" or "view"
        self.region = region        # region index (views)
        self.dtype = t.dtype
        self.shape = tuple(t.shape)
        self.stride = tuple(t.stride())
        self.offset = offset        # bytes from the storage's start
        self.storage_nbytes = storage_nbytes

    def key(self):
        return (self.kind, self.region, self.dtype, self.shape, self.stride, self.offset, self.storage_nbytes)

    def describe(self):
        what = self.kind if self.kind != "view" else "view of region %d at byte %d" % (self.region, self.offset)
        return "%s %s stride %s (%s)" % (str(self.dtype).replace("torch.", ""), list(self.shape),
                                          list(self.stride), what)

    def differences(self, other):
        """What differs between this entry and ``other`` (discovery's), in
        words: describe() leaves out the storage's size, which two views
        alike in everything else (``big[:2]`` and a tensor of its own) differ
        in, and the message would show the same text twice."""
        out = []
        for field, name in (("kind", "kind"), ("region", "region"), ("dtype", "dtype"), ("shape", "shape"),
                            ("stride", "strides"), ("offset", "byte offset in its storage"),
                            ("storage_nbytes", "storage size in bytes")):
            a, b = getattr(self, field), getattr(other, field)
            if a != b:
                if field == "dtype":
                    a, b = str(a).replace("torch.", ""), str(b).replace("torch.", "")
                elif field in ("shape", "stride"):
                    a, b = list(a), list(b)
                out.append("%s %s, not %s" % (name, a, b))
        return "; ".join(out)


class Packed:
    """What autograd keeps for one saved tensor: an alias, or a view to rebuild;
    and its version when saved, with (for a view to rebuild) a weak reference
    to the original, which only a user's reference keeps alive: autograd
    checks no version of what went through saved_tensors_hooks, so unpack
    does (see vmmrt.torch._contracts)."""

    __slots__ = ("rec", "index", "alias", "version", "original")

    def __init__(self, rec, index, alias, version, original=None):
        self.rec = rec
        self.index = index
        self.alias = alias
        self.version = version
        self.original = original


class Recorder:
    """The saved tensors of one pass of one layer.

    ``plan`` is the discovery recorder whose signature this pass must follow
    (None for discovery itself). ``static`` holds storage pointers that never
    move (parameters, buffers, static graph inputs); ``device_type`` is the
    runtime's ("cuda", or "cpu" on the host backend).
    """

    def __init__(self, layer_name, device_type, static=frozenset(), plan=None, keep_all=False):
        self.name = layer_name
        self.device_type = device_type
        self.static = static
        self.plan = plan
        self.keep_all = keep_all      # discovery: every tensor goes back to autograd as is
        self.entries = []
        self.regions = []
        self._by_storage = {}
        self._alive = []              # (index, original, its version), until the pass ends
        self.finished = False
        # Called before a view is rebuilt, to refuse one the layer's backward
        # has not restored (or has already let go of).
        self.guard = None
        self.error = None             # the first Error a hook raised
        self.saved_storages = set()   # storage pointers of every tensor saved (graphed calls' version checks)

    # ------------------------------------------------------------ hooks
    def hooks(self, mode=None):
        """The saved_tensors_hooks context of this pass (and ``mode``, a
        place.Mode, over the same span). An error raised in a hook reaches the
        caller as a RuntimeError (autograd wraps it); leaving the context
        raises the original :class:`vmmrt.Error` instead."""
        return _Hooks(self, mode)

    def _fail(self, e):
        if self.error is None:
            self.error = e
        raise e

    def _classify(self, t):
        if not isinstance(t, torch.Tensor):
            return "keep:object", None
        if t.device.type != self.device_type:
            return "keep:device", None
        if t.numel() == 0:
            return "keep:empty", None
        if isinstance(t, torch.nn.Parameter):
            return "keep:param", None
        ptr, nbytes = _compat.storage_of(t)
        if nbytes == 0:
            return "keep:empty", None
        if ptr in self.static:
            return "keep:static", None
        if _marked(t):
            return "keep:marked", None
        return "view", (ptr, nbytes)

    def pack(self, t):
        with place.quiet():
            return self._pack(t)

    def _pack(self, t):
        if self.finished:
            self._fail(Error(_capi.E_INVALID_STATE, "a tensor was saved after the layer's pass ended", self._where()))
        kind, storage = self._classify(t)
        i = len(self.entries)
        if isinstance(t, torch.Tensor) and t.numel():
            self.saved_storages.add(_compat.storage_of(t)[0])
        if kind != "view":
            self.entries.append(Entry(kind, None, t, 0, 0))
            self._check(i)
            # An alias, never t itself: for an op's saved output, t's grad_fn
            # holds the SavedVariable that would hold t, a cycle through C++
            # that Python's gc never sees (a whole layer leaked per pass).
            # The alias shares t's version counter.
            alias = t.detach() if isinstance(t, torch.Tensor) else t
            return Packed(self, i, alias, getattr(t, "_version", 0))
        ptr, nbytes = storage
        r = self._by_storage.get(ptr)
        if r is None:
            r = Region(len(self.regions), nbytes)
            self.regions.append(r)
            self._by_storage[ptr] = r
        start = _compat.storage_offset_bytes(t)
        end = start + _compat.span_elements(t.shape, t.stride()) * t.element_size()
        r.extend(start, end, t)
        self.entries.append(Entry("view", r.index, t, start, nbytes))
        self._alive.append((i, t, t._version))
        self._check(i)
        if self.keep_all or not self._moves(r.index):
            return Packed(self, i, t.detach(), t._version)
        # A view's base shares its version counter and is what a user holds
        # (the view autograd saves is often a temporary of the op).
        return Packed(self, i, None, t._version, weakref.ref(t._base if t._base is not None else t))

    def _moves(self, region):
        return self.plan.regions[region].selected

    def unpack(self, p):
        live = p.alias if p.alias is not None else (p.original() if p.original is not None else None)
        if isinstance(live, torch.Tensor) and live._version != p.version:
            p.rec._fail(_contracts.inplace_error(p.rec._where(), live, "saved tensor %d of the layer" % p.index,
                                                 live._version, p.version))
        if p.alias is not None:
            return p.alias
        with place.quiet():
            return p.rec.rebuild(p.index)

    # --------------------------------------------------------- checking
    def _where(self):
        return "layer %r" % self.name

    def _check(self, i):
        if self.plan is None:
            return
        plan = self.plan.entries
        if i >= len(plan):
            self._fail(Error(_capi.E_MISMATCH, "saved tensor %d (%s) was not saved at discovery, which saw %d; "
                             "a layer must save the same tensors, in the same order, at every call"
                             % (i, self.entries[i].describe(), len(plan)), self._where()))
        if self.entries[i].key() != plan[i].key():
            self._fail(Error(_capi.E_MISMATCH, "saved tensor %d is %s where discovery saw %s (%s); a layer must "
                             "save the same tensors (shapes, dtypes, views) in the same order at every call"
                             % (i, self.entries[i].describe(), plan[i].describe(),
                                self.entries[i].differences(plan[i])), self._where()))

    def finish(self, outputs=(), births=None, recorded=True, unrecorded="torch without TorchDispatchMode"):
        """End the pass: check it against the plan, mark output regions kept, and
        return the originals of the regions that move (in region order).
        ``births`` (discovery): the pass's place.Mode births, by storage
        (``recorded`` False: a pass that did not record them, because of
        ``unrecorded``)."""
        self.finished = True
        for i, t, v in self._alive:
            if t._version != v:
                # its bytes would be copied as they are now, not as saved
                raise _contracts.inplace_error(self._where(), t, "saved tensor %d of the layer (%s), modified in "
                                               "place later in its forward" % (i, self.entries[i].describe()),
                                               t._version, v)
        out_ptrs = set()
        for o in outputs:
            if isinstance(o, torch.Tensor) and o.device.type == self.device_type and o.numel():
                out_ptrs.add(_compat.storage_of(o)[0])
        outs = [r.index for ptr, r in self._by_storage.items() if ptr in out_ptrs]
        for r in self.regions:
            r.close()
        if self.plan is None:
            for i in outs:
                self.regions[i].selected = False
                self.regions[i].reason = "output"
            self._births(births if recorded else None, unrecorded)
            return []
        if len(self.entries) != len(self.plan.entries):
            raise Error(_capi.E_MISMATCH, "%d tensors saved where discovery saw %d"
                        % (len(self.entries), len(self.plan.entries)), self._where())
        plan_outs = [r.index for r in self.plan.regions if r.reason == "output"]
        if sorted(outs) != plan_outs:
            raise Error(_capi.E_MISMATCH, "the layer's outputs are saved regions %s where discovery saw %s"
                        % (sorted(outs), plan_outs), self._where())
        by_index = {r.index: ptr for ptr, r in self._by_storage.items()}
        return [(r, by_index[r.index]) for r in self.plan.regions if r.selected]

    def _births(self, births, unrecorded=None):
        """Which regions can be born at their fixed address: those whose storage
        an op of the pass allocated, and whose saved views cover (nearly) all of
        it; such a region grows to the whole storage."""
        for ptr, r in self._by_storage.items():
            r.views_hi = r.hi
            b = births.get(ptr) if births is not None else None
            if births is None:
                r.unplaced = "no record of the layer's ops (%s)" % unrecorded
            elif b is None or b.storage_nbytes != r.storage_nbytes:
                r.unplaced = "not allocated by an op of the layer's forward"
            elif b.offset != 0 or r.lo != 0:
                r.unplaced = "the saved views start %d bytes into their storage" % r.lo
            elif (r.storage_nbytes - r.hi) * PLACE_SLACK > r.storage_nbytes:
                r.unplaced = "the saved views cover %d of the storage's %d bytes" % (r.hi, r.storage_nbytes)
            else:
                r.hi = r.storage_nbytes
                r.birth = b

    def region_ptrs(self):
        """region index -> the storage pointer this pass saw for it."""
        return {r.index: ptr for ptr, r in self._by_storage.items()}

    def release(self):
        """Drop the originals (after their bytes are copied, or the pass failed)."""
        self._alive = []

    # ------------------------------------------------------- rebuilding
    def rebuild(self, i):
        """The i-th saved tensor, as a view over its region's fixed address."""
        e = self.plan.entries[i]
        r = self.plan.regions[e.region]
        if self.guard is not None:
            try:
                self.guard(i)
            except Error as err:
                self._fail(err)
        base = r.bases[e.dtype]
        item = base.element_size()
        return torch.as_strided(base, e.shape, e.stride, (e.offset - r.lo) // item)

    # ------------------------------------------------------ information
    def distinct_bytes(self, selected_only=True):
        return sum(r.nbytes for r in self.regions if r.selected or not selected_only)

    def view_bytes(self):
        return sum(_compat.span_elements(e.shape, e.stride) * torch.empty((), dtype=e.dtype).element_size()
                   for e in self.entries if e.kind == "view")


class _Hooks:
    def __init__(self, rec, mode=None):
        self.rec = rec
        self.mode = mode
        self.ctx = torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack)

    def __enter__(self):
        self.ctx.__enter__()
        if self.mode is not None:
            try:
                self.mode.__enter__()
            except BaseException:
                self.ctx.__exit__(None, None, None)
                raise
        return self.rec

    def __exit__(self, exc_type, exc, tb):
        try:
            if self.mode is not None:
                self.mode.__exit__(exc_type, exc, tb)
        finally:
            self.ctx.__exit__(exc_type, exc, tb)
        err = self.rec.error
        if exc is not None and err is not None and exc is not err:
            raise err from None
        return False


def original_error(exc, recs):
    """The vmmrt.Error one of recs' hooks raised, if exc is autograd's wrapping of it."""
    for rec in recs:
        if rec is not None and rec.error is not None and exc is not rec.error:
            return rec.error
    return None
