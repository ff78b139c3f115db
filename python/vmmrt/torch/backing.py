# SPDX-License-Identifier: LGPL-2.1-or-later
"""Device memory that exists only while it is used, at an address that never
changes: a libvmmrt slot (vmmrt_slot_create) whose physical memory the
driver workers map on request and release stream-ordered
(vmmrt_slot_map_async, vmmrt_slot_wait, vmmrt_slot_release_after).

Two users, two lifetimes:

- gradients (:mod:`vmmrt.torch.grads`): mapped before a layer's first
  backward of a step, released when the last tensor over them dies (the
  ``.grad`` set to None, or dropped): :meth:`Backing.tensor` counts the
  storages it made and releases when the count falls to zero;
- resident activations (what a layer saves and does not offload): mapped
  before its forward, released after its backward (:meth:`Backing.release`),
  as eager frees them, so that the gradients of the layers before can use
  the memory.

A release goes to the worker only once the stream reaches it: the GPU work
still reading the memory (an optimizer step, a backward graph) finishes
first. A map requested before the release ran cancels it (the memory and its
bytes stay), so asking ahead is never wrong. Nothing here runs while a CUDA
graph is being captured: a release that falls due then waits for the next
:meth:`Backing.flush`.

A map is made one of two ways. :meth:`Backing.ensure` waits on the host
until the worker has mapped (capture, setup, and eager ops on CUDA, which
the driver checks when they are enqueued). :meth:`Backing.map_on_stream`
waits for nobody: the worker maps once an event has completed
(vmmrt_slot_map_after) and the stream waits on the device for the map
(vmmrt_slot_wait_stream), so the launch thread keeps running ahead of the
GPU; the tensors of such a use are made over the address alone
(:mod:`vmmrt.torch._dlpack`).

Once the step's timeline is known, the memory plan (:mod:`vmmrt.torch.memplan`)
may bind the slot to an offset of pages it shares with slots whose lives do
not overlap its own (:meth:`Backing.bind`): the memory then stays mapped, and
map and release are no-ops (no driver call per step) that only track whether
the slot is in use, which the plan checks before another slot over the same
bytes begins its use. An unbound Backing behaves as it always did.
"""
import logging
import threading
import weakref

import torch

from vmmrt.torch import _address, _compat, _dlpack

log = logging.getLogger("vmmrt.torch")

# Holds let go while a CUDA graph was being captured: the last one of a closed
# runtime destroys it, whose driver calls would invalidate the capture (of
# another build: this one's runtime is open). The next flush lets them go.
_late = []
_late_lock = threading.Lock()


def flush_late():
    """Let go the holds that fell due during a capture (Offload.flush)."""
    if _compat.is_capturing():
        return
    with _late_lock:
        late = list(_late)
        del _late[:]
    for let_go in late:
        let_go()


USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)    # (torch 1.13 has none)


class Held:
    """Whether a tensor over ``base``'s storage other than the library's own
    is alive: the storage's use count above the library's, counted when it
    holds all it keeps over the storage (its bases over a slot on the plan's
    pages: vmmrt.torch.outputs, vmmrt.torch.grads). A count found below it
    means something the library held has gone since (a build's leftovers):
    that count is its own from then on, so no tensor handed out hides in
    the difference."""

    __slots__ = ("_cdata", "_baseline")

    def __init__(self, base):
        st = base.untyped_storage()
        self._cdata = st._cdata
        del st
        self._baseline = USE_COUNT(self._cdata)

    def __call__(self):
        n = USE_COUNT(self._cdata)
        if n < self._baseline:
            self._baseline = n
        return n > self._baseline


def alive_by(owner, backing):
    """``backing.alive`` is its owner's to set, to its Held (or None) as it
    makes and drops the bases the Held counts: the memory plan asks each
    slot sharing its bytes at every planned use (memplan.Entry), so the test
    is the Held itself, one Python call, not a method of the owner's. Never
    a reference to the owner: a storage the owner holds has a finalizer
    that holds the Backing (Backing.tensor), which would then never run.
    The test goes with the owner (a Held reads its storage by address, which
    the owner's bases keep), through a weak reference to the Backing too: a
    finalizer is held by a global registry, and the Backing reaches its
    Offload and so the owner, which then could never be collected."""
    backing.alive = None
    weakref.finalize(owner, _no_test, weakref.ref(backing))


def _dropped(ref, stream, let_go):
    """A counted tensor's finalizer (Backing.tensor): runs on whichever thread
    let go of the last view (the autograd engine's, the optimizer's); never
    raises."""
    b = ref()
    try:
        if b is not None:
            b._count_down(stream)
    except Exception as e:  # pragma: no cover - reported, the memory stays mapped
        log.error("vmmrt: %s: release failed: %s", b.name, e)
    finally:
        _let_go(let_go)


def _no_test(ref):
    b = ref()
    if b is not None:
        b.alive = None


def _let_go(let_go):
    """A runtime's hold let go (Runtime.hold): after a close(), the last one
    destroys the runtime, which is not for a capture: then at the next flush."""
    try:
        capturing = _compat.is_capturing()
    except Exception:  # pragma: no cover - no answer: as if capturing, the next flush lets it go
        capturing = True
    if capturing:
        with _late_lock:
            _late.append(let_go)
    else:
        let_go()


class Backing:
    """One slot of ``nbytes`` whose memory comes and goes. ``stream_of()``
    gives the stream a release is ordered on (the current stream, or the
    host backend's)."""

    def __init__(self, offload, name, nbytes):
        self.offload = offload
        self.name = name
        self.slot = offload.runtime.slot(nbytes)
        self.address = self.slot.address
        self.nbytes = nbytes
        self._lock = threading.Lock()
        # Read on every planned use (memplan.Watcher.begin_uses asks each slot
        # that shares its bytes): plain attributes, not properties, as a
        # property is a Python call; only this class writes them.
        self.live = 0             # storages made by tensor() still alive
        self._wanted = False      # a map asked for, and no release since
        self._due = None          # a release that fell due during a capture: its stream
        self._on_stream = False   # the map asked for is stream-ordered: not known made on the host
        self.maps = 0
        self.stream_maps = 0      # of maps, those made by map_on_stream
        self.releases = 0
        self._pinned = False      # static buffers live in it (pin): never released
        self.planned = None       # memplan.Entry, once the memory plan counts this slot in
        self.held = None          # its owner's ranges of the bytes it holds when busy (held_ranges)
        self.bound = False        # on the memory plan's pages (bind): map and release are no-ops
        self._in_use = False      # bound, and its use begun and not released since
        # Found not busy by the memory plan's last look (memplan.Entry), and
        # nothing since that could make it busy: a use begun, a tensor made
        # over it (tensor()), a bind. A tensor over a slot is made by the
        # library, in a use or by tensor(); whatever else holds its bytes
        # derives from one of those, alive when it looked. So a use asks
        # the slots sharing its bytes that are not quiet only (once each
        # after their use, not every slot at every use).
        self.quiet = False
        self.kept = False         # off the pages, mapped for good once mapped (a forward's outputs: vmmrt.torch.outputs)
        self.alive = None         # its owner's test of whether a tensor it handed out over the slot is held
        self.page_table = None    # its owner's page of each granule, given the slot's offset in the pages (or None: in order)
        self._own = None          # pages of its own it is mapped onto (map_own), off the plan

    # ------------------------------------------------------------ state
    @property
    def mapped(self):
        """Mapped, or asked to be (the worker may still be at it), by the map
        and release path, or onto pages of its own (:meth:`map_own`); a slot
        on the memory plan's pages is :attr:`bound` instead."""
        return self._wanted or self._own is not None

    def held_ranges(self):
        """The bytes a busy slot holds, as [lo, hi) offsets in it: None, all of
        its granules; its owner may say fewer (``held``: the graphs' pool,
        the storages handed out from it that are held, graphpool.GraphPool)."""
        return self.held() if self.held is not None else None

    @property
    def in_use(self):
        """Its use begun and not released, or a tensor made by :meth:`tensor`
        over it alive: all of its bytes wanted, whatever its owner says."""
        return self._in_use or self.live > 0

    def handed_out(self):
        """Whether a tensor its owner handed out over the slot is held (its
        ``alive``; False where it hands out none, or has let its bases go)."""
        return self.alive is not None and self.alive()

    @property
    def busy(self):
        """Bound, and its bytes wanted: its use has begun and not been
        released, or a tensor made over it is alive (:meth:`handed_out`,
        written out: the memory plan asks this at every planned use; its
        Watcher.begin_uses writes this out in turn: change both)."""
        return self.bound and (self._in_use or self.live > 0 or (self.alive is not None and self.alive()))

    # ------------------------------------------------------ memory plan
    def bind(self, pages, offset):
        """Put the slot on ``pages`` at ``offset`` for good, if its own memory
        is gone (released, and the release run by the worker) and nothing
        is over it; returns whether it did. One driver map, set access, per
        granule. Its granules in order, or where its owner's ``page_table``
        puts them (the graphs' pool: vmmrt.torch.poolplan)."""
        with self._lock:
            if self.bound:
                return True
            if self._own is not None and not self.live and not self.handed_out():
                self._drop_own()        # (the plan was made between steps: nothing runs over it)
            if self._wanted or self.live or self._pinned or self.slot.state != "reserved":
                return False
            table = self.page_table(offset) if self.page_table is not None else None
            if table is None:
                self.slot.map_pages(pages, offset)
            else:
                self.slot.map_pages_table(pages, table)
            self.bound = True
            self._in_use = False
            self.quiet = False
            return True

    def map_own(self, pages, table):
        """Mapped granule by granule onto ``pages`` (at the byte offsets of
        ``table``), pages its owner made for it alone, now: the graphs' pool
        on pages fewer than its addresses (vmmrt.torch.graphpool), off the
        plan. The slot keeps the pages until it is bound to the plan's, or
        mapped onto others; nothing may run over it meanwhile."""
        with self._lock:
            if self.bound or self._wanted or self.live:
                raise RuntimeError("%s: its own pages while it is mapped" % self.name)
            if self._own is not None:
                self._drop_own()
            self.slot.map_pages_table(pages, table)
            self._own = pages

    def _drop_own(self):
        self.slot.unmap()
        pages, self._own = self._own, None
        pages.destroy()

    def unbind(self):
        """Off the pages (the caller has waited for the work that used them
        through this slot): the next map is memory of its own again."""
        with self._lock:
            if self.bound:
                self.slot.unmap()
                self.bound = False
                self._in_use = False

    def begin_use(self):
        """Bound: the use begins (map_for_use), no driver call. (memplan's
        Watcher.begin_uses writes this out: change both.)"""
        self._in_use = True
        self.quiet = False

    def end_use(self):
        """An abandoned iteration (Offload.abort) will not release it."""
        with self._lock:
            if self.bound and not self.live:
                self._in_use = False

    # ------------------------------------------------------- map, release
    def _prefetch(self):
        self._due = None
        if not self._wanted and not self.bound and self._own is None:
            self.slot.map_async()
            self._wanted = True
            self.maps += 1

    def ensure(self):
        """Mapped when this returns (waiting for the worker if it is not done)."""
        with self._lock:
            self._prefetch()
            if self.bound or self._own is not None:
                return
        self.slot.wait()
        self._on_stream = False

    def map_on_stream(self, after, stream):
        """Mapped for the work enqueued on ``stream`` from now on, the host
        waiting for nothing: the worker maps once the work ``after`` (a
        recorded event) captures now has completed, and the stream waits
        for that map on the device."""
        with self._lock:
            self._due = None
            if self.bound:
                return
            if not self._wanted:
                self.slot.map_after(after)
                self._wanted = True
                self._on_stream = True
                self.maps += 1
                self.stream_maps += 1
            self.slot.wait_stream(stream)   # never blocks: under the lock, as a release is

    def release(self, stream):
        """Give the memory back once ``stream`` gets here (a no-op if it is not
        mapped). During a capture, it waits for :meth:`flush`."""
        if self.bound:
            # on the plan's pages (every use of a planned step): the use ends,
            # the pages stay. No lock: this only clears the use flag, as
            # bind(), unbind() and end_use() do under it; only begin_use,
            # earlier in this use, sets it.
            self._in_use = False
            return
        with self._lock:
            self._release(stream)

    def pin(self):
        """Keep the memory mapped for good: a runner whose gradients did not
        land at their addresses has its static gradient buffers in this slot
        (graphed.py), which its graphs write at every replay, whoever else
        drops the last tensor over the slot."""
        with self._lock:
            self._pinned = True

    def _release(self, stream, kept_too=False):
        if self.bound:
            self._in_use = False     # the plan's pages stay
            return
        if not self._wanted or self._pinned or (self.kept and not kept_too):
            return
        if self.offload.capturing or _compat.is_capturing():
            self._due = stream
            self.offload._due.add(self)
            return
        self.slot.release_after(stream)
        self._wanted = False
        self._on_stream = False
        self._due = None
        self.releases += 1

    def shrink(self, nbytes):
        """A kept slot reserved larger than its use turned out (the graphs'
        pool: vmmrt.torch.graphpool), before anything ran over it: its memory
        given back, the slot cut to ``nbytes`` (vmmrt_slot_truncate), mapped
        again at that size. Driver calls; the host waits."""
        with self._lock:
            if self.bound or self.live or self._on_stream:
                raise RuntimeError("%s: shrink of a slot in use" % self.name)
            if self._wanted:
                self.slot.wait()
                self.slot.unmap()
                self._wanted = False
            self.slot.truncate(nbytes)
            self.nbytes = self.slot.size
        self.ensure()

    def let_go(self, stream):
        """A kept slot's own memory given back (once ``stream`` gets here), so
        that the plan can bind it: only while nothing over it is held."""
        with self._lock:
            if self.bound or not self._wanted or self.handed_out():
                return False
            self._release(stream, kept_too=True)
            return not self._wanted

    def flush(self):
        """A release that fell due during a capture, now."""
        with self._lock:
            if self._due is not None and self.live == 0:
                self._release(self._due)

    # ---------------------------------------------------------- tensors
    def tensor(self, stream, counted=True):
        """A new 1-D uint8 tensor over the whole slot, mapped. ``counted``: the
        memory is released (ordered on ``stream``) once every storage made
        this way has died; otherwise its life is the caller's (release).
        Either way the runtime is not destroyed under it (Runtime.hold):
        Offload.close(), its collection and interpreter exit wait for the
        tensor to die (at exit, the process's end takes the memory)."""
        self.quiet = False
        if self._on_stream or self.bound:
            # The memory may not be there yet (or is for good, on the plan's
            # pages): the address is all it needs.
            t, owner = _dlpack.owned_tensor_at(self.address, self.nbytes, self.offload.device)
        else:
            self.ensure()
            t, owner = _address.owned_tensor_at(self.address, self.nbytes, torch.uint8, self.offload.device)
        if owner is not None:
            let_go = self.offload.runtime.hold()
            if counted:
                with self._lock:
                    self.live += 1
            # Not at exit: a release then would free the memory under a tensor
            # something may still read while the interpreter goes. The
            # finalizer (a global) holds the runtime's hold, and the Backing
            # only weakly: what refers to it may keep the tensor (an Outputs'
            # base; the Offload's argument gradients, Offload.hold_gins), and
            # a global reaching that would keep it, and its runtime, for the
            # process's life. Collected first, the Backing has nothing left
            # to release: the runtime's destroy, once the hold goes, frees it.
            fin = weakref.finalize(owner, _dropped, weakref.ref(self), stream, let_go) if counted else \
                weakref.finalize(owner, _let_go, let_go)
            fin.atexit = False
        return t

    def _count_down(self, stream):
        """A storage made by tensor(counted=True) died: the last one releases
        the slot."""
        with self._lock:
            self.live -= 1
            if self.live == 0 and not self.offload.runtime.closed:
                self._release(stream)

    def destroy(self):
        self.slot.destroy()
        if self._own is not None:
            pages, self._own = self._own, None
            pages.destroy()
