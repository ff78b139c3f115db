# SPDX-License-Identifier: LGPL-2.1-or-later
"""The optimizer step's allocations on the memory plan's free pages
(vmmrt.torch.optmem): the arithmetic of what is free, a caching allocator
snapshot's blocks in use, then the routing as the memory plan applies it
on the host backend, with a stand-in for PyTorch's pool that writes over
every byte it is lent during the step (the worst an optimizer's
temporaries can do): the training is bitwise the one without the plan; a
tensor the step leaves in the pages keeps its bytes; a step that raises
ends its routing; "slots" leaves the optimizer alone."""
import ctypes

import pytest
import torch

import vmmrt
import vmmrt.torch as vt
from conftest import run, samples, zoo_layers
from vmmrt.torch import optmem

G = 4096

# torch 2.0 on calls hooks around every optimizer's step; before it (the
# Debian torch of make check) the plan leaves the optimizer alone
routes = pytest.mark.skipif(optmem.hooks_missing() is not None, reason=str(optmem.hooks_missing()))


# ------------------------------------------------------------ arithmetic
def test_free_ranges_are_what_no_busy_range_touches():
    assert optmem.free_ranges(100, []) == [(0, 100)]
    assert optmem.free_ranges(100, [(10, 20), (50, 60)]) == [(0, 10), (20, 50), (60, 100)]
    # unsorted, overlapping, touching, out of bounds
    assert optmem.free_ranges(100, [(55, 70), (-5, 5), (50, 60), (60, 65), (90, 200)]) == [(5, 50), (70, 90)]
    assert optmem.free_ranges(100, [(0, 100)]) == []
    assert optmem.free_ranges(0, []) == []


def test_free_ranges_shrink_to_the_alignment():
    assert optmem.free_ranges(4096, [(100, 600)], 512) == [(1024, 4096)]
    assert optmem.free_ranges(4096, [(100, 600), (1100, 1500)], 512) == [(1536, 4096)]
    with pytest.raises(ValueError):
        optmem.free_ranges(10, [], 0)


def test_survivors_are_the_blocks_in_use():
    segs = [{"address": 1000, "blocks": [{"size": 100, "state": "inactive"},
                                         {"size": 50, "state": "active_allocated"},
                                         {"size": 30, "state": "active_pending_free"},
                                         {"size": 20, "state": "inactive"}]},
            {"address": 5000, "blocks": [{"address": 5000, "size": 64, "state": "inactive"}]}]
    assert optmem.survivors(segs) == [(1100, 1150), (1150, 1180)]
    assert optmem.survivors([]) == []


def test_overlaps():
    assert optmem.overlaps([(10, 20)], 19, 30)
    assert not optmem.overlaps([(10, 20)], 20, 30)
    assert not optmem.overlaps([], 0, 1)


# ------------------------------------------------- on the host backend
class FakePools:
    """PyTorch's side as optmem.TorchPools is, on the host backend: a pool is
    a name; while the step is routed, every byte lent is written over (the
    worst its temporaries could do); ``keep`` is what the next step leaves
    in use (the survivors), by pool."""

    made = []

    def __init__(self, off):
        self.off = off
        self.lent = []
        self.pools = 0
        self.routing = None
        self.keep = []              # the next routed step leaves these in use ([lo, hi) in the view)
        self.alive = {}             # pool -> blocks in use
        self.lends = 0
        self.pattern = 0x5A
        self.released = 0
        FakePools.made.append(self)

    def lend(self, ranges):
        self.lent = list(ranges)
        self.lends += bool(ranges)     # (close lends nothing)

    def new_pool(self):
        self.pools += 1
        return "pool%d" % self.pools

    def begin_routing(self, pool):
        assert self.routing is None, "routing begun twice"
        self.routing = pool
        for addr, n in self.lent:
            ctypes.memset(addr, 0xEE, n)
        if self.keep:
            self.alive[pool] = list(self.keep)
            for lo, hi in self.keep:
                ctypes.memset(lo, self.pattern, hi - lo)
            self.keep = []

    def end_routing(self, pool):
        assert self.routing == pool
        self.routing = None
        self.last = pool

    def blocks_in_use(self, pool):
        return list(self.alive.get(pool, ()))

    stuck = False                   # relocate finds no tensor over the blocks
    moved = ()                      # the bytes of the blocks relocate moved out, as they were then

    def relocate(self, roots, ranges):
        if self.stuck:
            return 0
        blocks = self.alive.get(self.last, [])
        out = [b for b in blocks if optmem.overlaps(ranges, *b)]
        self.moved = list(self.moved) + [ctypes.string_at(lo, hi - lo) for lo, hi in out]
        self.alive[self.last] = [b for b in blocks if b not in out]
        return len(out)

    def release_cache(self):
        # PyTorch's emptying of its cache asserts that no allocation is
        # routed to a pool (captures_underway.empty()): the process aborts
        assert self.routing is None, "the cache emptied while the step's allocations are routed: an abort"
        self.released += 1

    def arena_stats(self):
        return {"peak_used_bytes": sum(n for _, n in self.lent), "fallback_bytes": 0}

    def order_after(self, stream):
        return None

    def order_before(self, opt_stream, stream):
        pass


N = 4


class FakeGraphPool:
    """The graphs' pool on a slot (graphpool.GraphPool) as the plan sees it,
    on the host backend: a kept slot that the "replays" write over (at each
    step's first forward: :func:`_train`; a part's granules at each use in
    its span: :func:`_replays_write_parts`); ``held``: a tensor handed out
    from it is alive."""

    def __init__(self, off, nbytes=8 * G, table=None, parts=None):
        from vmmrt.torch.backing import Backing
        self.backing = Backing(off, "graph pool", nbytes)
        # the page of each granule in one part at every use (None: in order),
        # or parts: (first use, last use, granules, the page of each)
        self.table = table
        self.parts = parts
        self.at, self.abs = 0, None
        self.backing.page_table = lambda at: self.abs
        self.backing.kept = True
        self.backing.ensure()
        self.backing.alive = lambda: self.held
        # the ranges a held tensor covers (GraphPool.held_ranges, as offsets in
        # the plan's pages); None: all of it
        self.backing.held = lambda: None if self.backing.in_use else self._translated()
        self.used = self.backing.nbytes
        self.held = False
        self.ranges = None
        off.backings.append(self.backing)

    def _parts(self):
        return self.parts or [(None, None, list(range(len(self.table))), self.table)] if self.table or self.parts \
            else None

    def planned_parts(self, order):
        ps = self._parts()
        if ps is None:
            return [(self.backing.nbytes, None, None)]
        return [((max(t) + 1) * G, s, e) for s, e, _, t in ps]

    def parts_at(self, offsets):
        self.at = offsets[0]
        ps = self._parts()
        if ps is not None:
            self.abs = [offsets[0]] * (self.backing.nbytes // G)
            for (_, _, ks, t), o in zip(ps, offsets):
                for k, p in zip(ks, t):
                    self.abs[k] = o + p * G

    def _translated(self):
        if self.ranges is None:
            return None
        if self.abs is None:
            return [(self.at + a, self.at + b) for a, b in self.ranges]
        return [(self.abs[a // G] + a % G, self.abs[a // G] + a % G + (b - a)) for a, b in self.ranges]

    def own_memory(self):
        self.backing.ensure()

    def held_bytes(self):
        return list(self.ranges or ())

    def planned_bytes(self):
        return self.backing.nbytes if self.table is None else (max(self.table) + 1) * G

    def stats(self):
        return {"graph_pool_bytes": self.used, "graph_pool_bound": self.used, "graph_pool_fallback_bytes": 0}

    def describe(self):
        return "graphs' pool: a stand-in"


def _build(plan=True, graph_pool=False, mode="none", **kw):
    g = vt.make_graphed_callables(tuple(zoo_layers(N)), samples(N), graphs=False, mode=mode, lookahead=1,
                                  min_bytes=0, options={"host_granularity": G}, memory_plan=plan, **kw)
    off = vt.offload_of(g[0])
    if graph_pool:
        off.graph_pool = FakeGraphPool(off, **graph_pool) if isinstance(graph_pool, dict) else \
            FakeGraphPool(off, table=graph_pool if isinstance(graph_pool, list) else None)
    if off.memplan is not None:
        off.memplan.optimizer_api = FakePools
    return g, off


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 8, 32, generator=gen, requires_grad=True), torch.randn(2, 8, 32, generator=gen)


def _train(plan, steps, set_to_none=True, at_step=None, fail_at=None, graph_pool=False, mode="none",
           before_step=None):
    """SGD steps; returns each step's gradients (read after the optimizer's
    step, which may have written over them), the parameters at the end,
    the stats and the routing's stand-in. ``at_step``: a function called
    with (step, offload, pools) before that step's forward; ``before_step``
    with (step, offload) before its optimizer step."""
    torch.manual_seed(0)
    g, off = _build(plan, graph_pool, mode)
    params = [p for m in g for p in m.parameters()]
    off.test_params = params
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    out = {"grads": []}
    try:
        for i in range(steps):
            opt.zero_grad(set_to_none=set_to_none)
            pools = off.memplan.optimizer.api if off.memplan and off.memplan.optimizer else None
            if at_step is not None:
                at_step(i, off, pools)
            if graph_pool and not off.graph_pool.parts:
                b = off.graph_pool.backing
                ctypes.memset(b.address, 0x11, b.nbytes)     # the replays' intermediates
            x, gy = _inputs(i)
            y = run(g, x)
            (y * gy).sum().backward()
            del y
            if before_step is not None:
                before_step(i, off)
            if fail_at == i:
                h = opt.register_step_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("a failing step")))
                with pytest.raises(RuntimeError, match="a failing step"):
                    opt.step()
                h.remove()
            else:
                opt.step()
            out["grads"].append([p.grad.clone() for p in params])
        out["params"] = [p.detach().clone() for p in params]
        out["stats"] = off.stats()
        out["describe"] = off.describe()
        out["plan_bytes"] = off.memplan.plan.total_bytes if off.memplan and off.memplan.plan else None
        out["pools"] = off.memplan.optimizer.api if off.memplan and off.memplan.optimizer else None
    finally:
        off.close()
    return out


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@routes
@pytest.mark.parametrize("set_to_none", [True, False])
def test_routed_steps_train_bitwise_as_without_the_plan(set_to_none):
    on = _train(True, 6, set_to_none)
    ref = _train(False, 6, set_to_none)
    st = on["stats"]
    # the plan is made at the second step's first forward: its optimizer
    # steps and those after are routed
    assert st["optimizer_routed_steps"] == 5
    assert st["optimizer_survivors"] == 0 and st["plan_conflicts"] == 0
    assert st["optimizer_lent_bytes"] > 0
    # the view maps the pages once more: no more memory
    assert st["slot_bytes"] == on["plan_bytes"]
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
    assert _same(on["params"], ref["params"])
    assert "optimizer step: its allocations in the pages' free bytes" in on["describe"]
    # a pool per lend; the free bytes change at most once (a slot whose own
    # memory was not released yet when the plan was made is bound at its
    # next use), then every step finds the same
    assert on["pools"].pools == on["pools"].lends <= 2
    # PyTorch's cache of the steps before the routing given back, once, and
    # the pools' segments at close
    assert on["pools"].released == 2


@routes
def test_what_is_lent_is_the_pages_but_the_gradients_at_the_step():
    """set_to_none: the gradients' slots are in the pages and in use at the
    step: never lent; the persistent loop's have their own memory: the
    whole pages are lent."""
    seen = {}

    def look(i, off, pools):
        if pools is not None and pools.lent:
            w = off.memplan
            base = w.optimizer.view.address
            seen["lent"] = [(a - base, a - base + n) for a, n in pools.lent]
            seen["size"] = w.pages.size
            # (a gradient slot partly on its layer's resident pages maps those
            # too: memplan.share_grads)
            seen["grads"] = [r for e in w.entries if e.backing.name.endswith("/grads") for r in e.pages_of()]
    _train(True, 4, True, at_step=look)
    assert seen["grads"]
    for lo, hi in seen["grads"]:
        assert not optmem.overlaps(seen["lent"], lo, hi)
    assert sum(hi - lo for lo, hi in seen["lent"]) > 0
    seen.clear()
    _train(True, 4, False, at_step=look)
    assert seen["grads"] == [] and seen["lent"] == [(0, seen["size"])]


@routes
def test_a_tensor_the_step_leaves_keeps_its_bytes_until_it_dies():
    state = {}

    def leave(i, off, pools):
        if i == 2:
            # the step of this iteration leaves a tensor over the first lent bytes
            addr, n = pools.lent[0]
            pools.keep = [(addr, addr + G)]
            state["at"] = addr
        if i == 4:
            # before step 4's forward: what step 2 left is intact
            state["intact"] = ctypes.string_at(state["at"], G) == bytes([pools.pattern]) * G
            state["conflicts"] = off.stats()["plan_conflicts"]
            pools.alive.clear()     # and now it dies
    on = _train(True, 7, True, at_step=leave)
    ref = _train(False, 7, True)
    st = on["stats"]
    assert state["intact"], "the forward wrote over a tensor the optimizer step left"
    assert state["conflicts"] > 0
    assert st["optimizer_survivors"] == 1
    # a new pool from then on; the training is still the reference's
    assert on["pools"].pools >= 2
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
    # once it died the bytes came back: the last steps lend what the first did
    assert on["pools"].lent == on["pools"].lent and not on["pools"].alive


@routes
def test_a_step_that_raises_ends_its_routing_at_the_next_use():
    on = _train(True, 5, True, fail_at=2)
    pools = on["pools"]
    assert pools.routing is None
    assert on["stats"]["optimizer_routed_steps"] == 4


@routes
def test_a_step_that_raises_just_before_close_ends_its_routing_first():
    # no forward comes after the failed step: close() itself ends the
    # routing, before it lends nothing and empties PyTorch's cache
    on = _train(True, 4, True, fail_at=3)
    pools = on["pools"]
    assert pools.routing is None and pools.lent == []
    assert on["stats"]["optimizer_routed_steps"] == 3


@routes
def test_close_ends_a_failed_steps_routing_before_anything_of_the_build_goes():
    # close()'s hooks drop the graphs' MemPool; PyTorch empties a pool nothing
    # holds in its destructor, which aborts the process while any routing is
    # under way: the routing the failed step left ends before the first hook
    seen, seen_hook = [], []

    def step(i, off, pools):
        if pools is not None and not seen_hook:
            seen_hook.append(True)      # (the plan's pools come with its first routed step)
            off._close_hooks.insert(0, lambda: seen.append(pools.routing))
    on = _train(True, 4, True, fail_at=3, at_step=step)
    assert seen == [None], seen
    assert on["stats"]["optimizer_routed_steps"] == 3


@routes
def test_vmmrt_empty_cache_ends_a_failed_steps_routing_first():
    seen = {}

    def step(i, off, pools):
        if i == 4:
            # step 3 raised; no forward since: emptying the cache now would
            # abort under PyTorch, so vmmrt.torch.empty_cache() ends the routing
            seen["routing"] = pools.routing
            vt.empty_cache()
            seen["after"] = pools.routing
    on = _train(True, 5, True, fail_at=3, at_step=step)
    assert seen == {"routing": "pool1", "after": None}, seen
    assert on["stats"]["optimizer_routed_steps"] == 4


@routes
def test_the_graphs_pool_is_lent_only_at_the_step_and_leaves_the_pages_for_what_the_step_left():
    """The graphs' pool on the pages (vmmrt.torch.graphpool): in use between
    the steps' first forward and their optimizer step, lent at the step
    unless a tensor handed out from it is held; a tensor the step leaves in
    its bytes sends it to memory of its own before the next replay."""
    seen = {"lent": {}, "busy": {}}

    def step(i, off, pools):
        gp, w = off.graph_pool, off.memplan
        e = w.pool_entry()
        if e is None:
            return
        lo, hi = e.life.offset, e.life.offset + e.life.nbytes
        if gp.backing.bound:
            seen["busy"][i] = gp.backing.busy
        if pools is not None and pools.lent:
            base = w.optimizer.view.address
            seen["lent"][i] = optmem.overlaps([(a - base, a - base + n) for a, n in pools.lent], lo, hi)
        gp.held = i == 2                    # step 2's optimizer step finds a tensor from the pool held
        if i == 4:
            # step 4's leaves a tensor in the pool's bytes (in the view)
            at = w.optimizer.view.address + lo
            pools.keep = [(at, at + G)]
            seen["at"] = at
        if i == 5:
            seen["conflicts"] = off.stats()["plan_conflicts"]
            seen["bound"] = gp.backing.bound
        if i == 6:
            seen["intact"] = ctypes.string_at(seen["at"], G) == bytes([pools.pattern]) * G
    on = _train(True, 7, True, at_step=step, graph_pool=True)
    ref = _train(False, 7, True)
    assert "graphs' pool" in on["describe"]
    # the plan from step 1 on: the pool in use whenever a step begins
    assert seen["busy"] and all(seen["busy"].values()), seen["busy"]
    # lent at steps 1, 3 (what step i+1 finds lent is step i's), not at step 2 (held)
    assert seen["lent"][2] and not seen["lent"][3] and seen["lent"][4], seen["lent"]
    assert seen["conflicts"] >= 1 and not seen["bound"], seen
    assert seen["intact"], "a replay wrote over the tensor the optimizer step left in the pool's bytes"
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
    assert _same(on["params"], ref["params"])


def _pool_entry(off):
    """(the stand-in pool, the plan's watcher, the pool's entry or None)."""
    return off.graph_pool, off.memplan, off.memplan.pool_entry()


@routes
def test_the_graphs_pool_lends_all_but_the_bytes_a_held_tensor_covers():
    """A tensor handed out from the graphs' pool held through the optimizer
    step (a recomputed first layer's input gradient kept as the input's
    .grad) keeps its own bytes, not the whole pool: the rest is lent, and
    the step's temporaries (the stand-in writes over every byte lent) leave
    the held bytes as they were."""
    seen = {}

    def step(i, off, pools):
        gp, w, e = _pool_entry(off)
        if e is None or pools is None:
            return
        lo = e.life.offset
        if i == 2:
            gp.held, gp.ranges = True, [(G, 2 * G)]
            seen["at"] = gp.backing.address + G
        if i == 3:
            # step 2's optimizer step ran with the tensor held
            base = w.optimizer.view.address
            lent = [(a - base, a - base + n) for a, n in pools.lent]
            seen["pool lent"] = optmem.overlaps(lent, lo, lo + gp.used)
            seen["held lent"] = optmem.overlaps(lent, lo + G, lo + 2 * G)
            seen["intact"] = ctypes.string_at(seen["at"], G) == seen["before"]
            gp.held, gp.ranges = False, None

    def before_step(i, off):
        if i == 2 and "at" in seen:
            seen["before"] = ctypes.string_at(seen["at"], G)
    on = _train(True, 5, True, at_step=step, graph_pool=True, before_step=before_step)
    ref = _train(False, 5, True)
    assert seen["pool lent"] and not seen["held lent"], seen
    assert seen["intact"], "the step's temporaries wrote over a held tensor's bytes in the graphs' pool"
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)


def test_slots_leaves_the_optimizer_to_pytorch():
    on = _train("slots", 4, True)
    assert on["pools"] is None
    assert on["stats"]["optimizer_routed_steps"] == 0 and on["stats"]["plan_bytes"] > 0


def test_memory_plan_values():
    with pytest.raises(TypeError, match='True, False or "slots"'):
        vt.make_graphed_callables(tuple(zoo_layers(1)), samples(1), graphs=False, memory_plan="all")


# ------------------------------------------------------------ ping-pong's banks
def _banks(off):
    return sorted({(lay.group.address, lay.group.nbytes) for lay in off.layers if lay.moving()})


@routes
def test_pingpong_banks_are_lent_at_the_step_and_train_bitwise_as_without_the_plan():
    # the stand-in writes over every byte lent, the banks' too. (In the
    # persistent loop of these eager layers the plan has nothing on its
    # pages, so there is no routing at all; with graphs the static inputs
    # and the graphs' pool are there.)
    set_to_none = True
    seen = {}

    def look(i, off, pools):
        if pools is not None and pools.lent:
            seen["lent"] = list(pools.lent)
            seen["banks"] = _banks(off)
    on = _train(True, 6, set_to_none, at_step=look, mode="pingpong")
    ref = _train(False, 6, set_to_none, mode="pingpong")
    assert seen["banks"] and all(b in seen["lent"] for b in seen["banks"]), seen
    assert on["stats"]["optimizer_bank_bytes"] == sum(n for _, n in seen["banks"]) > 0
    assert on["stats"]["optimizer_relocated"] == 0
    assert "ping-pong's banks" in on["describe"]
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
    assert _same(on["params"], ref["params"])


def _mid_iteration(plan):
    """At step 3 the optimizer steps between the forward and the backward
    (what the layers saved is in the banks then)."""
    torch.manual_seed(0)
    g, off = _build(plan, False, "pingpong")
    params = [p for m in g for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.05)
    grads, lent = [], []
    try:
        for i in range(5):
            opt.zero_grad(set_to_none=True)
            x, gy = _inputs(i)
            y = run(g, x)
            if i == 3:
                opt.step()
                pools = off.memplan.optimizer.api if off.memplan and off.memplan.optimizer else None
                lent.append(list(pools.lent) if pools is not None else None)
            (y * gy).sum().backward()
            grads.append([p.grad.clone() for p in params])
            if i != 3:
                opt.step()
    finally:
        off.close()
    return grads, lent, _banks(off)


@routes
def test_an_optimizer_step_inside_an_iteration_is_not_lent_the_banks():
    on, lent, banks = _mid_iteration(True)
    ref, _, _ = _mid_iteration(False)
    assert lent[0] is not None and not any(b in lent[0] for b in banks), (lent, banks)
    for a, b in zip(on, ref):
        assert _same(a, b)


@routes
def test_a_tensor_the_step_leaves_in_a_bank_is_moved_out_before_a_forward_writes_there():
    state = {}

    def leave(i, off, pools):
        if i == 3:
            addr = _banks(off)[0][0]
            pools.keep = [(addr, addr + G)]
    on = _train(True, 6, True, at_step=leave, mode="pingpong")
    ref = _train(False, 6, True, mode="pingpong")
    pools = on["pools"]
    assert on["stats"]["optimizer_relocated"] == 1
    assert pools.moved == [bytes([pools.pattern]) * G], "what the step left was not moved out as it was"
    assert "1 storages moved out of a bank" in on["describe"]
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
    del state


@routes
def test_a_tensor_left_in_a_bank_that_cannot_be_moved_fails_the_step_and_the_offload():
    torch.manual_seed(0)
    g, off = _build(True, False, "pingpong")
    params = [p for m in g for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.05)
    try:
        for i in range(5):
            opt.zero_grad(set_to_none=True)
            pools = off.memplan.optimizer.api if off.memplan and off.memplan.optimizer else None
            x, gy = _inputs(i)
            (run(g, x) * gy).sum().backward()
            if pools is not None and pools.lent:
                addr = _banks(off)[0][0]
                pools.keep, pools.stuck = [(addr, addr + G)], True
                with pytest.raises(vmmrt.Error) as e:
                    opt.step()
                assert e.value.name == "VMMRT_E_INVALID_STATE" and "ping-pong bank" in str(e.value)
                with pytest.raises(vmmrt.Error, match="earlier failure"):
                    run(g, x)
                return
            opt.step()
        pytest.fail("no step was routed")
    finally:
        off.close()


@routes
def test_relocate_moves_a_storage_and_every_tensor_over_it():
    a = torch.arange(64, dtype=torch.float32)
    b = a[8:16]                                     # a view: the same storage
    c = torch.ones(4)
    state = {"p": {"exp_avg": a, "view": b}, "other": c}
    lo = a.untyped_storage().data_ptr()
    ranges = [(lo, lo + a.untyped_storage().nbytes())]
    assert optmem.relocate([state], ranges, scan_all=False) == 1
    assert a.untyped_storage().data_ptr() != lo and b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    assert torch.equal(a, torch.arange(64, dtype=torch.float32)) and torch.equal(b, a[8:16])
    assert c.untyped_storage().data_ptr() not in [r[0] for r in ranges]
    # one not in the roots: found among the tensors the garbage collector tracks
    d = torch.full((16,), 3.0)
    lo = d.untyped_storage().data_ptr()
    assert optmem.relocate([state], [(lo, lo + 64)]) == 1
    assert d.untyped_storage().data_ptr() != lo and torch.equal(d, torch.full((16,), 3.0))


# ------------------------------------------------- the step's temporaries
def _meta_adamw(sizes, **kw):
    # parameters on the meta device: sized as on a GPU, no memory (a CPU
    # parameter's temporaries are host memory: not counted)
    params = [torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="meta")) for n in sizes]
    return torch.optim.AdamW(params, **kw), params


def test_step_need_follows_the_optimizers_implementation():
    opt, _ = _meta_adamw([1000, 3000, 500])
    # foreach (the default off the CPU): about the parameters' size
    assert optmem.step_need(opt, fallback=7) == 2 * 4500
    opt.param_groups[0]["foreach"] = False
    assert optmem.step_need(opt, fallback=7) == 2 * 3000       # one parameter at a time
    opt.param_groups[0]["fused"] = True
    assert optmem.step_need(opt, fallback=7) == 0              # in place, one kernel
    # groups step one after the other: the largest group's
    a = torch.nn.Parameter(torch.empty(100, device="meta"))
    b = torch.nn.Parameter(torch.empty(900, device="meta"))
    two = torch.optim.AdamW([{"params": [a]}, {"params": [b]}])
    assert optmem.step_need(two, fallback=7) == 4 * 900
    # parameters in host memory take no device memory for temporaries
    cpu = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1000))])
    assert optmem.step_need(cpu, fallback=7) == 0
    # not torch.optim's: not known, the fallback
    class Mine:
        param_groups = two.param_groups
    assert optmem.step_need(Mine(), fallback=7) == 7


@routes
def test_the_plan_learns_which_optimizer_steps():
    g, off = _build(True)
    try:
        w = off.memplan
        assert w.stepped is not None and len(w.stepped) == 0
        params = [p for m in g for p in m.parameters()]
        opt = torch.optim.SGD(params, lr=0.05)
        fused, _ = _meta_adamw([64], fused=True)
        for i in range(3):
            x, gy = _inputs(i)
            (run(g, x) * gy).sum().backward()
            opt.step()
            opt.zero_grad()
            if i == 0:
                assert set(w.stepped) == {opt}
                # (meta parameters cannot step: told as the global hook tells)
                w.optimizer_seen(fused)
                assert set(w.stepped) == {opt, fused}
        # the plan is made: no longer told (nothing to learn), and the
        # optimizers it was made for are kept only weakly
        assert w.plan is not None and w not in set(optmem._observers)
        # on the host backend the parameters are host memory: no need
        assert w.optimizer_need(10 ** 6) == 0
    finally:
        off.close()


@routes
def test_the_graphs_pool_on_a_page_table_takes_only_its_pages():
    """A pool whose granules share pages (vmmrt.torch.poolplan: eight granules
    on four) is planned at its pages' size and mapped granule by granule:
    granule 4 is granule 0's page, and what is lent to the optimizer step
    is counted in pages."""
    seen = {}

    def step(i, off, pools):
        gp, w = off.graph_pool, off.memplan
        e = w.pool_entry()
        if e is None or not gp.backing.bound:
            return
        seen["life"] = e.life.nbytes
        b = gp.backing
        ctypes.memset(b.address, 0x5A, G)
        ctypes.memset(b.address + 5 * G, 0xA5, G)
        seen["alias"] = (ctypes.string_at(b.address + 4 * G, 16) == b"\x5a" * 16 and
                         ctypes.string_at(b.address + G, 16) == b"\xa5" * 16 and
                         ctypes.string_at(b.address + 2 * G, 16) != b"\xa5" * 16)

    on = _train(True, 5, True, at_step=step, graph_pool=[0, 1, 2, 3, 0, 1, 2, 3])
    ref = _train(False, 5, True)
    assert seen["life"] == 4 * G
    assert seen["alias"]
    assert on["stats"]["slot_bytes"] == on["plan_bytes"]
    assert on["stats"]["plan_conflicts"] == 0
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
    assert _same(on["params"], ref["params"])


# A pool in three parts over the zoo's order (forwards 0-3, backwards 7-4):
# two granules in use at layer 1's forward, three at layer 2's backward, one
# at every use.
PARTS = [(1, 1, [0, 1], [0, 1]), (5, 5, [2, 3, 4], [0, 1, 2]), (None, None, [5], [0])]


def _replays_write_parts(off, also=None):
    """Each use writes the granules of the pool's parts in use there, as a
    replay writes its temporaries (before the plan, on the pool's own
    memory; on the plan, on pages it shares with slots used elsewhere);
    ``also(layer, backward)`` is called first."""
    gp, orig = off.graph_pool, off.use_started
    pos = {use: k for k, use in enumerate(off.memplan.order)}
    end = len(off.memplan.order)

    def use_started(lay, backward, current=None):
        if also is not None:
            also(lay, backward)
        p = pos[(lay.name, bool(backward))]
        # (a write to an unmapped range would end the process, not the test)
        assert gp.backing.mapped or gp.backing.bound, "a replay of the pool found it unmapped"
        for s, e, ks, _ in gp.parts:
            if (0 if s is None else s) <= p <= (end - 1 if e is None else e):
                for k in ks:
                    ctypes.memset(gp.backing.address + k * G, 0x11 + p, G)
        return orig(lay, backward, current)
    off.use_started = use_started


@routes
@pytest.mark.parametrize("set_to_none", [True, False])
def test_the_graphs_pools_parts_share_pages_with_slots_used_at_other_uses(set_to_none):
    """The pool's parts in use at one use each go on pages of slots in use at
    others (a resident read already, gradients not yet written): the plan
    is smaller than with the pool whole, and training is bitwise as without
    a plan although every use's "replay" writes its parts."""
    seen = {}

    def step(i, off, pools):
        if i == 0:
            _replays_write_parts(off)
        if i == 2:
            plan = off.memplan.plan
            seen["shares"] = {k[2]: v for k, v in plan.shares.items() if k[0] == "graphs"}
            seen["bytes"] = plan.pages_bytes
    on = _train(True, 5, set_to_none, at_step=step, graph_pool=dict(parts=PARTS))
    whole = _train(True, 5, set_to_none, at_step=lambda i, off, pools: i == 2 and seen.setdefault(
        "whole", off.memplan.plan.pages_bytes), graph_pool=True)
    ref = _train(False, 5, set_to_none)
    assert seen["shares"][0] and seen["shares"][1], seen
    assert not seen["shares"][2]        # in use at every use: shares with nothing
    assert seen["bytes"] < seen["whole"], seen
    assert on["stats"]["plan_conflicts"] == 0
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
    assert _same(on["params"], ref["params"])
    assert whole["stats"]["plan_conflicts"] == 0


@routes
def test_a_grad_kept_across_the_next_forward_leaves_a_pool_parts_pages_with_its_values():
    """A .grad kept past zero_grad(set_to_none=True) into the next forward
    sits on pages a part of the pool uses at layer 1's forward: before that
    use, the gradients' slot moves to memory of its own with its bytes
    (counted as a conflict); the kept tensors read what they held at the
    next backward, and training goes on bitwise as without the plan."""
    seen = {"kept": None}

    def check(lay, backward):
        if seen["kept"] is not None and lay.name == "3:Zoo" and backward:
            seen["intact"] = all(torch.equal(a, b) for a, b in zip(*seen["kept"]))
            seen["kept"] = None

    def step(i, off, pools):
        if i == 0:
            _replays_write_parts(off, check)

    def keep(i, off):
        if i == 2:
            grads = [p.grad for p in off.test_params]
            seen["kept"] = (grads, [x.clone() for x in grads])
    on = _train(True, 5, True, at_step=step, graph_pool=dict(parts=PARTS), before_step=keep)
    held = seen.pop("intact", None)
    ref = _train(False, 5, True, before_step=keep)
    assert held is True, "a replay wrote over a .grad kept across the next forward"
    assert on["stats"]["plan_conflicts"] >= 1
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
    assert _same(on["params"], ref["params"])


@routes
def test_the_graphs_pool_leaving_the_pages_takes_the_bytes_of_a_held_tensor_with_it():
    """The optimizer step leaves a tensor in the pool's bytes while a tensor
    handed out from the pool is held: the pool moves to memory of its own
    before the next replay, and the held tensor's bytes go with it."""
    seen = {}

    def step(i, off, pools):
        gp, w, e = _pool_entry(off)
        if e is None or pools is None:
            return
        if i == 4:
            at = w.optimizer.view.address + e.life.offset + 5 * G
            pools.keep = [(at, at + G)]          # step 4's optimizer step leaves it
        if i == 5:
            seen["moved"] = not gp.backing.bound
            seen["intact"] = ctypes.string_at(gp.backing.address + 2 * G, G) == b"\xc3" * G
            gp.held, gp.ranges = False, None

    def before_step(i, off):
        gp = off.graph_pool
        if i == 4 and gp.backing.bound:
            ctypes.memset(gp.backing.address + 2 * G, 0xC3, G)     # what the held tensor reads
            gp.held, gp.ranges = True, [(2 * G, 3 * G)]
    on = _train(True, 6, True, at_step=step, graph_pool=True, before_step=before_step)
    assert seen.get("moved") and on["stats"]["plan_conflicts"] >= 1, seen
    assert seen["intact"], "the held tensor's bytes were lost when the pool left the pages"


@routes
@pytest.mark.parametrize("refuse", ["map", "pages"])
def test_a_plan_that_gives_up_leaves_the_graphs_pool_mapped_for_its_replays(refuse, monkeypatch):
    """The plan gives up after the pool's own memory went (a driver that
    will not map the pages by a table, or no memory for the pages): no use
    maps the pool, so it goes back to memory of its own at once, and the
    replays (each writing its parts) train as without a plan."""
    def refused(*a, **k):
        raise vmmrt.Error(vmmrt._capi.E_NOT_SUPPORTED, "made up for the test", "vmmrt_slot_map_pages_table")
    if refuse == "map":
        monkeypatch.setattr(vmmrt.Slot, "map_pages_table", refused)
    else:
        monkeypatch.setattr(vmmrt.Runtime, "pages", refused)
    seen = {}

    def step(i, off, pools):
        if i == 0:
            _replays_write_parts(off)
        if i == 3:
            seen["mapped"] = off.graph_pool.backing.mapped and not off.graph_pool.backing.bound
    on = _train(True, 5, True, at_step=step, graph_pool=dict(parts=PARTS))
    ref = _train(False, 5, True)
    assert seen["mapped"]
    assert "made up for the test" in on["describe"]
    for a, b in zip(on["grads"], ref["grads"]):
        assert _same(a, b)
