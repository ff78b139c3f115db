# SPDX-License-Identifier: LGPL-2.1-or-later
"""The optimizer step's temporaries on the memory plan's free pages.

The memory plan (:mod:`vmmrt.torch.memplan`) keeps its pages mapped for the
whole step. Between the last backward of a step and the next step's first
forward, only some of their bytes are in use: with ``set_to_none`` the
gradients' slots, in the persistent loop none (its gradients have memory
of their own). The optimizer steps there. A foreach AdamW makes temporaries
about the parameters' size (3.3 GiB on 8 Llama-3-8B layers); eager PyTorch
puts them in the memory the activations have just given back, but the
caching allocator cannot take the pages' free bytes, so it gets new memory
from the driver for them, and the step's peak grows by as much.

So the optimizer step allocates from those bytes. The pages are mapped
once more, whole, at an address of their own (the *view*: one more
mapping of the same physical memory, no more of it); libvmmrt's arena
(vmmrt_arena_lend(3)) is lent the view's ranges whose bytes nothing holds
at the step; and a global optimizer-step pre-hook routes the calling
thread's allocations into a ``torch.cuda.MemPool`` whose allocator is that
arena, until the post-hook. The caching allocator caches what the arena
gave it in that pool, so the next steps make no call at all beyond the
routing.

What must hold, and how it is kept:

- The bytes lent are free for the whole step: the pre-hook lends only what
  no slot holds then (its use begun and not ended, or a tensor over it
  alive: :attr:`vmmrt.torch.backing.Backing.busy`). When that set changes
  (a saved tensor kept past its backward, a gradient kept across the next
  forward), the pool is retired (never allocated from again) and a new one
  is lent the new set: the old pool's cached segments may lie on bytes in
  use now.
- Nothing made in the pool outlives the step: the post-hook asks the
  caching allocator for the pool's blocks in use (a tensor the optimizer
  keeps, such as state made at a later step than the first). Such a
  *survivor* holds its bytes: a slot sharing them is used as when a slot
  it shares with is held (memplan's conflict: memory of its own for that
  use, counted in ``plan_conflicts``), the pool is retired, and the bytes
  come back once the survivors are gone (checked at each step).
  ``Offload.stats()["optimizer_survivors"]`` counts the steps that left one.
- Order on the device: the step runs after the backward's work on the
  current stream; when the optimizer's stream is another, it waits for
  the layers' stream first, and the next forward waits for the optimizer's.

Ping-pong's banks (mode "pingpong": two whole layers' saved bytes, or
more) hold nothing between a step's last backward and its next forward
either: what a forward wrote there was copied to the host, and each
restore was read by its backward. They are lent beside the pages' free
bytes when no layer's forward awaits its backward (an optimizer step run
in the middle of an iteration gets the pages only); the next forward that
writes a bank runs after the step in stream order. A tensor the step
leaves in a bank would be written over by that forward, and a bank cannot
take memory of its own as a planned slot can: its storage is moved out
(copied to memory of PyTorch's, and every tensor over it found in the
optimizer's state, or else among every tensor the garbage collector
tracks, set to the copy). One that cannot be found makes the step raise
a named error and the offload unusable, before any forward writes over
it (``optimizer_relocated`` counts the storages moved).

When the arena cannot fit a segment the caching allocator asks for, it
gets memory from the driver instead (counted as ``optimizer_fallback_bytes``):
the step never fails for want of pages.

Why this route, and not the two others (vmmrt(7) has the measurements):

- A capturable optimizer step graphed in the graphs' pool needs the user's
  optimizer to be capturable (``capturable=True``, its state on the device,
  its learning rate a tensor) and changes what the user runs; this route
  takes the optimizer as it is.
- The pages given back for the optimizer and created again before the next
  forward cost driver calls at every step (a create, map and set-access
  per granule), and the caching allocator keeps what it got for the
  temporaries in its cache, so the memory is held twice by the next step.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Sequence

log = logging.getLogger("vmmrt.torch")

# every routing Offload (its OptimizerMemory), for the global hooks
_live = weakref.WeakSet()
_hooks = None
_hooks_lock = threading.Lock()
_tls = threading.local()
# the memory plans still to be made, told which optimizers step (observe)
_observers = weakref.WeakSet()


# ------------------------------------------------------------ arithmetic
def free_ranges(size: int, busy: Iterable[tuple[int, int]], align: int = 1) -> list[tuple[int, int]]:
    """The intervals of [0, size) that no busy interval [lo, hi) touches,
    each shrunk to ``align`` (start rounded up, end down); empty ones
    dropped. Pure arithmetic (the pre-hook's, tested on its own)."""
    if size < 0 or align < 1:
        raise ValueError("size %d, align %d" % (size, align))
    out = []
    at = 0
    for lo, hi in sorted((max(0, lo), min(size, hi)) for lo, hi in busy if hi > lo):
        if lo > at:
            out.append((at, lo))
        at = max(at, hi)
    if at < size:
        out.append((at, size))
    aligned = []
    for lo, hi in out:
        lo = -(-lo // align) * align
        hi = hi // align * align
        if hi > lo:
            aligned.append((lo, hi))
    return aligned


def _group_bytes(group: dict, largest: bool = False) -> int:
    sizes = [p.numel() * p.element_size() for p in group.get("params", ())
             if getattr(p, "device", None) is not None and p.device.type != "cpu"]
    if not sizes:
        return 0
    return max(sizes) if largest else sum(sizes)


def step_need(optimizer: Any, fallback: int) -> int:
    """The device bytes an optimizer's step allocates for temporaries, from
    its settings (the memory plan keeps that much of its free bytes in
    whole segments at the step: memplan.place). A torch.optim optimizer
    with ``fused=True`` updates in place in one kernel per group: none.
    With ``foreach=False`` it steps one parameter at a time: the largest
    parameter's size. Otherwise (foreach, the default on CUDA) each group's
    lists of temporaries are about its parameters' size (AdamW's
    ``_foreach_sqrt`` of the second moments). The groups step one after
    the other, each freeing its temporaries: the largest group's need. An
    optimizer that is not torch.optim's, or has no param_groups, gets
    ``fallback``: its step is not known here."""
    import torch
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(optimizer, torch.optim.Optimizer) or not groups:
        return fallback
    need = 0
    for g in groups:
        if not g.get("fused"):
            need = max(need, _group_bytes(g, largest=g.get("foreach") is False))
    return need


def overlaps(ranges: Sequence[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether [lo, hi) shares a byte with one of ``ranges``."""
    return any(a < hi and lo < b for a, b in ranges)


def relocate(roots: Iterable[Any], ranges: Sequence[tuple[int, int]], scan_all: bool = True,
             device: Any = None) -> int:
    """Move out of ``ranges`` ([lo, hi) addresses) every storage whose first
    byte lies there: copied to new memory of PyTorch's (on the current
    stream), and every tensor over it set to the copy. The tensors are
    looked for in ``roots`` (containers: dicts, lists and tuples, three
    levels down), then, for a range none of them covers and with
    ``scan_all``, among every tensor the garbage collector tracks (on
    ``device``, when given). Returns how many storages moved."""
    import torch

    found = {}                  # storage address -> {id: tensor}

    def visit(o: Any, depth: int) -> None:
        if isinstance(o, torch.Tensor):
            if device is not None and o.device != device:
                return
            try:
                st = o.untyped_storage()
                p = st.data_ptr()
            except (RuntimeError, NotImplementedError):
                return      # no memory of its own (a FakeTensor of torch.compile's, a functional one)
            if st.nbytes() and overlaps(ranges, p, p + 1):
                found.setdefault(p, {})[id(o)] = o
        elif depth < 3 and isinstance(o, dict):
            for v in o.values():
                visit(v, depth + 1)
        elif depth < 3 and isinstance(o, (list, tuple)):
            for v in o:
                visit(v, depth + 1)

    for r in roots:
        visit(r, 0)
    if scan_all and any(not any(lo <= p < hi for p in found) for lo, hi in ranges):
        import gc
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # (isinstance on torch's deprecated module attributes)
            for o in gc.get_objects():
                if isinstance(o, torch.Tensor):
                    visit(o, 0)
    with torch.no_grad():
        for ts in found.values():
            ts = list(ts.values())
            old = ts[0].untyped_storage()
            new = torch.empty(old.nbytes(), dtype=torch.uint8, device=ts[0].device).untyped_storage()
            new.copy_(old)
            for t in ts:
                t.set_(new, t.storage_offset(), t.size(), t.stride())
    return len(found)


def survivors(segments: Sequence[dict]) -> list[tuple[int, int]]:
    """The blocks in use, as [address, address + size), of a caching
    allocator snapshot's segments (torch.cuda.memory_snapshot's shape:
    each segment's ``blocks`` with ``address`` (or the segment's address
    plus the sizes before it), ``size`` and ``state``)."""
    out = []
    for seg in segments:
        at = seg.get("address", 0)
        for b in seg.get("blocks", ()):
            addr = b.get("address", at)
            if b.get("state") == "active_allocated" or b.get("state") == "active_pending_free":
                out.append((addr, addr + b["size"]))
            at = addr + b["size"]
    return out


# ------------------------------------------------------------ the routing
class OptimizerMemory:
    """The optimizer step's routing for one Offload's memory plan
    (memplan.Watcher.optimizer). ``torch_api``: what it asks of PyTorch
    (:class:`TorchPools`; tests give a stand-in)."""

    def __init__(self, watcher: Any, torch_api: Any = None) -> None:
        self.watcher = watcher
        self.off = watcher.off
        self.api = torch_api
        self.view = None            # the pages mapped whole at an address of their own (a vmmrt Slot)
        self.pool = None            # the pool the arena serves now
        self.lent = None            # the page ranges lent to it ([lo, hi) offsets)
        self.banks = []             # the ping-pong banks lent with them ((address, bytes))
        self.banks_why_not = None   # why the banks are never lent again
        self._bank_list = None      # every bank, once known
        self.relocated = 0          # storages the steps left in a bank, moved out
        self.gen = None             # the arena's generation of that lend
        self.retired = []           # pools never allocated from again that still had blocks in use
        self.holds = []             # page ranges under survivors: [lo, hi)
        self.routed = 0             # steps whose allocations went to the pages
        self.survivor_steps = 0     # steps that left a block in use in the pool
        self.retirements = 0
        self.hook_s = 0.0           # the hooks' own time (the pool's blocks asked after each step)
        self.view_s = 0.0           # of it, mapping the view (once: a map per granule)
        self.released = False       # the cache of the steps before the routing given back (once)
        self.why_not = None         # why it does not route (once known for good)
        self._active = False
        self._stream = None         # the optimizer's stream while routing, then for the next forward
        _register(self)

    # ------------------------------------------------------------ state
    def ready(self) -> bool:
        w = self.watcher
        return self.why_not is None and w.pages is not None and bool(w.entries) and not self.off.runtime.closed

    def busy_ranges(self) -> list[tuple[int, int]]:
        """Page ranges in use now: a bound slot's (use begun or tensor over
        it: all its granules, or the bytes it says it holds), and the
        survivors'."""
        out = []
        for e in self.watcher.entries:
            if e.backing.busy:
                out.extend(e.page_ranges())
        return out + list(self.holds)

    def bank_ranges(self) -> list[tuple[int, int]]:
        """Ping-pong's banks, (address, bytes) each, if they can be lent now:
        no layer's forward awaits its backward."""
        off = self.off
        if off.mode != "pingpong" or self.banks_why_not is not None:
            return []
        from vmmrt.torch import _contracts
        if _contracts.in_flight(off):
            return []
        if self._bank_list is None:
            by = {}
            for lay in off.layers:
                if lay.in_group():
                    a = lay.group.address
                    by[a] = max(by.get(a, 0), lay.group.nbytes)
            self._bank_list = sorted(by.items())
        return self._bank_list

    def _in_banks(self, lo: int, hi: int) -> bool:
        return any(a < hi and lo < a + n for a, n in self.banks)

    def held(self, lo: int, hi: int) -> bool:
        """Whether survivors hold a byte of the page range [lo, hi)
        (memplan.Entry.begin_use: a slot sharing them is used as when one
        it shares with is held)."""
        return bool(self.holds) and overlaps(self.holds, lo, hi)

    # ------------------------------------------------------------ hooks
    def begin(self) -> bool:
        """The optimizer step begins (the global pre-hook): route the calling
        thread's allocations to the pages' free bytes, if any; returns
        whether it does."""
        if not self.ready() or self._active:
            return False
        t0 = time.perf_counter()
        try:
            return self._begin()
        finally:
            self.hook_s += time.perf_counter() - t0

    def _begin(self) -> bool:
        # the backward's argument gradients (Grads.after_backward) are
        # AccumulateGrad's by now: let go, so that their bytes can be lent
        self.off.gin_hold = None
        self._check_holds()
        # no graph replays until the post-hook: the graphs' pool's bytes are free too
        self.watcher.optimizer_begins()
        free = free_ranges(self.watcher.pages.size, self.busy_ranges(), 512)
        banks = self.bank_ranges()
        if not free and not banks:
            self.watcher.optimizer_ends(self.watcher.last_stream)
            return False
        try:
            if self.view is None:
                t0 = time.perf_counter()
                self._make_view()
                self.view_s = time.perf_counter() - t0
            if free != self.lent or banks != self.banks or not self._still_lent():
                self._relend(free, banks)
            self._stream = self.api.order_after(self.watcher.last_stream)
            self.api.begin_routing(self.pool)
        except Exception as e:  # noqa: B902 - no routing rather than a failed step
            self.why_not = "the optimizer's allocations could not be routed to the pages (%s)" % e
            log.warning("vmmrt: memory plan: %s: they take memory of their own", self.why_not)
            self.watcher.optimizer_ends(self.watcher.last_stream)
            return False
        self._active = True
        self.watcher.after_optimizer = True
        self.routed += 1
        return True

    def end(self, optimizer: Any = None) -> None:
        """The optimizer step ended (the global post-hook; ``optimizer``: the
        one that stepped, whose state is looked in first for a tensor the
        step left in a bank)."""
        if not self._active:
            return
        t0 = time.perf_counter()
        try:
            self._end(optimizer)
        finally:
            self.hook_s += time.perf_counter() - t0

    def _end(self, optimizer: Any) -> None:
        self._active = False
        self.api.end_routing(self.pool)
        alive = self.api.blocks_in_use(self.pool)
        try:
            alive = self._out_of_banks(alive, optimizer)
            self._after_routing(alive)
        finally:
            self.watcher.optimizer_ends(self.watcher.last_stream)

    def _out_of_banks(self, alive: Sequence[tuple[int, int]], optimizer: Any) -> Sequence[tuple[int, int]]:
        """The blocks the step left in a bank moved out (the next forward
        writes there); one that cannot be makes the offload unusable."""
        inb = [(lo, hi) for lo, hi in alive if self._in_banks(lo, hi)] if self.banks else []
        if not inb:
            return alive
        roots = [] if optimizer is None else [list(getattr(optimizer, "state", {}).values()),
                                              getattr(optimizer, "param_groups", [])]
        self.relocated += self.api.relocate(roots, inb)
        alive = self.api.blocks_in_use(self.pool)
        stuck = [(lo, hi) for lo, hi in alive if self._in_banks(lo, hi)]
        if stuck:
            from vmmrt import Error, _capi
            self.banks_why_not = "a tensor an optimizer step left there could not be moved out"
            why = ("the optimizer step left %d tensor(s) (%s) in a ping-pong bank's bytes that no tensor found in "
                   "the optimizer's state or by the garbage collector is over (held from C++ or by a view "
                   "elsewhere): the next forward would write over them" % (
                       len(stuck), _size(sum(hi - lo for lo, hi in stuck))))
            self.off.fail(why)
            raise Error(_capi.E_INVALID_STATE, why)
        return alive

    def _after_routing(self, alive: Sequence[tuple[int, int]]) -> None:
        if not alive and not self.released:
            # The steps before the plan made their temporaries in PyTorch's
            # cache, which keeps them reserved, unused from now on: given
            # back once (torch.cuda.empty_cache), or the routing would hold
            # the temporaries twice.
            self.released = True
            self.api.release_cache()
        if alive:
            self.survivor_steps += 1
            self._hold(alive)
            self.retired.append(self.pool)
            self.pool, self.lent = None, None
            if self.survivor_steps == 1:
                log.warning("vmmrt: memory plan: the optimizer step left %d tensor(s) (%s) in the pages' free "
                            "bytes (state made after the first step?): those bytes stay theirs while they live, "
                            "and the slots sharing them get memory of their own at their uses "
                            "(Offload.stats()['optimizer_survivors']); logged once", len(alive),
                            _size(sum(hi - lo for lo, hi in alive)))

    def end_left(self) -> bool:
        """The routing a step that raised left under way (its post-hook never
        ran) ended now, and this thread no longer takes it for its step in
        progress; returns whether there was one."""
        if not self._active:
            return False
        if getattr(_tls, "active", None) is self:
            _tls.active = None
        self.end()
        return True

    def after_step(self, stream: Any) -> None:
        """The first use after a routed step (memplan.Watcher.begin_uses):
        a step that raised never reached the post-hook, so its routing ends
        here; the use's stream waits for the optimizer's if it is another."""
        self.end_left()
        if self._stream is not None:
            self.api.order_before(self._stream, stream)
            self._stream = None

    # ------------------------------------------------------------ inside
    def _make_view(self) -> None:
        pages = self.watcher.pages
        view = self.off.runtime.slot(pages.size)
        try:
            view.map_pages(pages, 0)
        except Exception:
            view.destroy()
            raise
        self.view = view
        self.off._close_hooks.insert(0, self.close)

    def _relend(self, free: list[tuple[int, int]], banks: Sequence[tuple[int, int]] = ()) -> None:
        if self.pool is not None:
            self.retired.append(self.pool)
            self.retirements += 1
        self.pool = None
        base = self.view.address
        self.gen = self.api.lend([(base + lo, hi - lo) for lo, hi in free] + list(banks))
        self.pool = self.api.new_pool()
        self.lent = free
        self.banks = list(banks)

    def _still_lent(self) -> bool:
        """Whether the arena still serves this routing's ranges: a lend of
        another's (another build's routing, or a capture into a pool over a
        slot: vmmrt.torch.graphpool) replaced them, and a segment asked for
        now would come from its ranges."""
        gen = getattr(self.api, "generation", None)
        return gen is None or self.gen is None or gen() == self.gen

    def _in_view(self, alive: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Of blocks at addresses, those in the view, as page offsets (a
        block from the driver or in a bank is not the pages')."""
        base, size = self.view.address, self.watcher.pages.size
        return [(lo - base, hi - base) for lo, hi in alive if base <= lo < base + size]

    def _hold(self, alive: Sequence[tuple[int, int]]) -> None:
        self.holds += self._in_view(alive)

    def _check_holds(self) -> None:
        """Survivors gone give their bytes back; retired pools with nothing in
        use are dropped."""
        if not self.retired:
            return
        keep, holds = [], []
        for p in self.retired:
            alive = self.api.blocks_in_use(p)
            if alive:
                keep.append(p)
                holds += self._in_view(alive) if self.view is not None else []
        self.retired = keep
        self.holds = holds

    def close(self) -> None:
        """Before the pages go (Offload.close): no more routing; the view stays
        mapped while a survivor may be in it (the runtime waits for it)."""
        # a step that raised, and no use since to end its routing (after_step):
        # ended first, or emptying PyTorch's cache below (or anywhere later)
        # would abort the process
        self.end_left()
        _live.discard(self)
        self.why_not = self.why_not or "closed"
        if self.view is None:
            return
        self._check_holds()
        pools = ([self.pool] if self.pool is not None else []) + self.retired
        if any(self.api.blocks_in_use(p) for p in pools):
            # a tensor made in the step is still over the view: the
            # runtime (and the view, and the pages) last as long as it may
            self._let_go = self.off.runtime.hold()
            log.warning("vmmrt: memory plan: closed while a tensor the optimizer step made in the pages is alive: "
                        "their memory stays until the process ends")
            return
        self.api.lend([])
        # the pools' cached segments lie in the view: dropped with it (a pool
        # is never allocated from once its Offload is closed)
        self.pool, self.retired = None, []
        # a pool no one holds gives its cached segments back at the next
        # emptying of PyTorch's cache: now, before the view goes, so that
        # none outlives the addresses it lies at
        self.api.release_cache()
        self.view.destroy()
        self.view = None

    def stats(self) -> dict:
        st = self.api.arena_stats() if self.view is not None else {}
        return {"optimizer_routed_steps": self.routed, "optimizer_survivors": self.survivor_steps,
                "optimizer_lent_bytes": sum(hi - lo for lo, hi in self.lent or ()) + sum(n for _, n in self.banks),
                "optimizer_bank_bytes": sum(n for _, n in self.banks),
                "optimizer_relocated": self.relocated,
                "optimizer_peak_bytes": st.get("peak_used_bytes", 0),
                "optimizer_fallback_bytes": st.get("fallback_bytes", 0),
                "optimizer_hook_us": 1e6 * (self.hook_s - self.view_s) / self.routed if self.routed else 0.0,
                "optimizer_view_ms": 1e3 * self.view_s}

    def describe(self) -> str:
        if self.why_not is not None and self.why_not != "closed":
            return "optimizer step: in PyTorch's memory (%s)" % self.why_not
        if self.lent is None and not self.routed:
            return "optimizer step: its allocations go to the pages' free bytes from its next step"
        st = self.stats()
        return ("optimizer step: its allocations in the pages' free bytes%s (%s lent, %s at most used, %s from the "
                "driver when they did not fit; %d steps routed, %d left a tensor behind%s)"
                % (" and ping-pong's banks" if self.banks else "",
                   _size(st["optimizer_lent_bytes"]), _size(st["optimizer_peak_bytes"]),
                   _size(st["optimizer_fallback_bytes"]), self.routed, self.survivor_steps,
                   "" if not self.relocated else ", %d storages moved out of a bank" % self.relocated))


def _round_up(n: int, g: int) -> int:
    return -(-n // g) * g


def _size(n: int) -> str:
    from vmmrt.torch.memplan import size
    return size(n)


# ------------------------------------------------------------ PyTorch's side
class TorchPools:
    """What :class:`OptimizerMemory` asks of PyTorch and libvmmrt on CUDA:
    a MemPool over libvmmrt's arena, the routing of the thread's
    allocations into it, its blocks in use, and stream order."""

    def __init__(self, off: Any) -> None:
        import torch
        import vmmrt
        self.torch = torch
        self.vmmrt = vmmrt
        self.off = off
        self.device = torch.device(off.device).index or 0
        from vmmrt.torch import _arena
        self.allocator = _arena.allocator()

    def lend(self, ranges: Sequence[tuple[int, int]]) -> int:
        from vmmrt.torch import _arena
        return _arena.lend(self.off.runtime, list(ranges), self.device)

    def generation(self) -> int:
        return self.vmmrt.arena_stats(self.device)["generation"]

    def new_pool(self) -> Any:
        return self.torch.cuda.MemPool(self.allocator.allocator())

    def begin_routing(self, pool: Any) -> None:
        self.torch._C._cuda_beginAllocateCurrentThreadToPool(self.device, pool.id)

    def end_routing(self, pool: Any) -> None:
        self.torch._C._cuda_endAllocateToPool(self.device, pool.id)
        self.torch._C._cuda_releasePool(self.device, pool.id)

    def blocks_in_use(self, pool: Any) -> list[tuple[int, int]]:
        from vmmrt.torch import _compat
        return survivors(_compat.memory_segments(pool.id))

    def relocate(self, roots: Iterable[Any], ranges: Sequence[tuple[int, int]]) -> int:
        return relocate(roots, ranges, device=self.torch.device("cuda", self.device))

    def arena_stats(self) -> dict:
        return self.vmmrt.arena_stats(self.device)

    def release_cache(self) -> None:
        self.torch.cuda.empty_cache()

    def order_after(self, layers_stream: Any) -> Any:
        """The optimizer's stream, made to wait for the layers' if it is another."""
        cur = self.torch.cuda.current_stream(self.device)
        if layers_stream is not None and layers_stream != cur.cuda_stream:
            cur.wait_stream(self.torch.cuda.ExternalStream(layers_stream, device=self.device))
            return cur
        return None

    def order_before(self, opt_stream: Any, layers_stream: Any) -> None:
        if layers_stream is not None and layers_stream != opt_stream.cuda_stream:
            self.torch.cuda.ExternalStream(layers_stream, device=self.device).wait_stream(opt_stream)


def available(off: Any) -> str | None:
    """None when the optimizer step can be routed to the pages here, or why not."""
    if off.device_type != "cuda":
        return "not on CUDA"
    import torch
    import vmmrt
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda.memory, "CUDAPluggableAllocator") or \
            not hasattr(torch._C, "_cuda_beginAllocateCurrentThreadToPool"):
        return "this PyTorch has no MemPool with a pluggable allocator"
    why = hooks_missing()
    if why is not None:
        return why
    if torch.cuda.get_allocator_backend() != "native":
        return "PyTorch's allocator is %s, not its caching allocator" % torch.cuda.get_allocator_backend()
    if not hasattr(vmmrt, "arena_library_path"):
        return "this libvmmrt has no arena"
    return None


# ------------------------------------------------------------ global hooks
def hooks_missing() -> str | None:
    """None when this PyTorch calls hooks around every optimizer's step
    (torch 2.0 on), or why not."""
    try:
        import torch.optim.optimizer as opt
    except ImportError:  # pragma: no cover - torch < 1.0
        return "this PyTorch has no torch.optim.optimizer"
    if not hasattr(opt, "register_optimizer_step_pre_hook"):
        return "this PyTorch has no global optimizer step hooks (torch 2.0 on)"
    return None


def _ensure_hooks() -> None:
    global _hooks
    with _hooks_lock:
        if _hooks is None:
            import torch.optim.optimizer as opt
            _hooks = (opt.register_optimizer_step_pre_hook(_pre_hook), opt.register_optimizer_step_post_hook(_post_hook))


def _register(om: OptimizerMemory) -> None:
    _live.add(om)
    _ensure_hooks()


def observe(watcher: Any) -> bool:
    """Tell ``watcher.optimizer_seen(optimizer)`` of every optimizer step
    from now on, until :func:`unobserve` (the memory plan learns which
    optimizers step before it is made: :func:`step_need`); returns whether
    this PyTorch calls the hooks that tell it."""
    if hooks_missing() is not None:
        return False
    _observers.add(watcher)
    _ensure_hooks()
    return True


def unobserve(watcher: Any) -> None:
    _observers.discard(watcher)


def step_begins() -> OptimizerMemory | None:
    """The optimizer step begins: the routing Offload with the most free
    bytes takes this thread's allocations (one pool at a time per thread)."""
    if getattr(_tls, "active", None) is not None:
        return None       # a step inside a step (an optimizer that steps another): the outer one routes
    best = None
    for om in list(_live):
        if om.ready() and (best is None or om.watcher.pages.size > best.watcher.pages.size):
            best = om
    if best is not None and best.begin():
        _tls.active = best
        return best
    return None


def step_ends(optimizer: Any = None) -> None:
    om = getattr(_tls, "active", None)
    if om is not None:
        _tls.active = None
        om.end(optimizer)


def end_routing() -> bool:
    """This thread's routing, if a step that raised left one (its post-hook
    never ran), ended now; returns whether there was one. Emptying
    PyTorch's cache while it is under way aborts the process
    (captures_underway.empty()): vmmrt.torch.empty_cache() calls this
    first."""
    om = getattr(_tls, "active", None)
    return om is not None and om.end_left()


def _pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    for w in list(_observers):
        w.optimizer_seen(optimizer)
    step_begins()


def _post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    step_ends(optimizer)
