# SPDX-License-Identifier: LGPL-2.1-or-later
"""The graphs' pool on a slot (vmmrt.torch.graphpool), what the CPU can
check of it: the range's size, when it is used, and whether a tensor handed
out from it is held (the storage's use count above the library's own). The
captures into it, its cut and its lending run on the H200
(test_memplan_gpu, test_optmem_gpu); the plan's side on the host backend
with a stand-in (test_optmem, test_memplan)."""
import types

import pytest
import torch

from vmmrt.torch import graphpool, poolplan

G = 2 << 20
needs_count = pytest.mark.skipif(graphpool._USE_COUNT is None, reason="torch without a storage use count")


def test_the_range_is_four_largest_layers_twice_the_inputs_and_slack_in_granules():
    M = 1 << 20
    g = 2 * M
    assert graphpool.bound([10 * M, 30 * M], [M, M], g) == 120 * M + 4 * M + graphpool.SLACK
    assert graphpool.bound([], [], g) == graphpool.SLACK
    assert graphpool.bound([1], [0], g) % g == 0


def test_why_not_is_named():
    off = types.SimpleNamespace(device_type="cpu")
    assert graphpool.available(off, None) == "not on CUDA"
    assert "pool of its own" in graphpool.available(off, (0, 1))


def _pool(base, used):
    gp = graphpool.GraphPool.__new__(graphpool.GraphPool)
    gp.backing = types.SimpleNamespace(address=base, nbytes=used, in_use=False)
    gp.used = used
    gp._storages, gp._baseline = [], []
    gp.off = types.SimpleNamespace(granularity=G)
    gp.live_peak = gp.place_why_not = gp._sealed = gp.never_freed = None
    gp.per_use, gp.mempools, gp.marks, gp.parts, gp._abs, gp._at = False, {}, [], None, None, 0
    gp.own_table = gp.own_bytes = gp._events_kept = gp._plug = None
    return gp


@needs_count
def test_a_tensor_handed_out_from_the_pool_is_seen_held_and_let_go():
    buf = torch.zeros(1 << 12, dtype=torch.uint8)
    other = torch.zeros(64)
    inside = buf[:1024]                    # a static output the graphs keep, in the pool
    gp = _pool(buf.data_ptr(), buf.numel())
    gp.settle([inside, other, None])
    assert len(gp._storages) == 1          # the tensor outside the range is not the pool's
    assert not gp.alive()
    kept = inside.detach()                 # what a call hands out, kept by the user
    assert gp.alive()
    del kept
    assert not gp.alive()
    # a reference of the build gone after settle lowers the library's own count
    del inside
    assert not gp.alive()
    view = buf[:8]
    assert gp.alive()
    del view
    gp.forget()
    assert not gp.alive()


@needs_count
def test_the_bytes_held_are_those_of_the_storages_held_and_all_while_in_use():
    """At the optimizer step the pool lends what no tensor handed out holds
    (a recomputed first layer's input gradient, kept as the input's .grad,
    lies in the pool): the ranges of the held storages, not the whole pool;
    all of it while a replay's use lasts."""
    buf = torch.zeros(1 << 14, dtype=torch.uint8)
    a, b = buf[1024:3072], buf[8192:9216]   # two static tensors in the pool, storages of their own
    a, b = a.clone(), b.clone()             # (on the host: stand-ins at addresses of their own)
    base = min(a.data_ptr(), b.data_ptr())
    gp = _pool(base, max(a.data_ptr() + 2048, b.data_ptr() + 1024) - base)
    gp.settle([a, b])
    assert gp.held_ranges() == []
    kept = b.detach()                       # handed out, held by the caller
    at = b.data_ptr() - base
    assert gp.held_ranges() == [(at, at + 1024)]
    gp.backing.in_use = True
    assert gp.held_ranges() is None
    gp.backing.in_use = False
    del kept
    assert gp.held_ranges() == []


@pytest.mark.skipif(not hasattr(torch._C, "_cuda_customAllocator"), reason="torch without a pluggable allocator")
def test_the_arenas_allocator_is_one_for_the_process_and_outlives_every_reference():
    # a MemPool (and every graph captured into it) keeps a raw pointer to
    # its allocator: freed before the last of them, a segment given back at
    # teardown calls through a dangling pointer
    import gc
    import weakref

    from vmmrt.torch import _arena
    a = _arena.allocator()
    assert _arena.allocator() is a
    w = weakref.ref(a)
    saved, _arena._allocator = _arena._allocator, None
    del a, saved
    gc.collect()
    try:
        assert w() is not None, "the arena's allocator was freed with the last reference the library had"
    finally:
        _arena._allocator = w()


# ------------------------------------- a lending runtime outlives its segments
def test_a_runtime_that_lent_ranges_lives_until_pytorch_gives_their_segments_back(monkeypatch):
    """A runtime destroyed while PyTorch still holds a segment the arena served
    from its ranges frees addresses the caching allocator knows: the driver
    gave them to its next cudaMalloc on the H200, and a later free aborted
    the process ("invalid device pointer"). Held until PyTorch has none
    there (vmmrt.torch._arena), at close() and at collection alike."""
    import gc

    import vmmrt
    from vmmrt.torch import _arena
    M = 1 << 20
    vmmrt.arena_reset(0)
    try:
        lives = []
        for how in ("close", "collect"):
            rt = vmmrt.Runtime({"backend": "host"})
            s = rt.slot(2 * M)
            s.map()
            ranges = [(s.address, s.size)]
            _arena.lend(rt, ranges, 0)
            cached = [(s.address + 4096, M)]           # a segment of PyTorch's in the range
            monkeypatch.setattr(_arena, "segments", lambda: list(cached))
            life = rt._life
            assert _arena.sweep() >= 1 and life.rt is not None and _arena.held(life)   # not ended
            if how == "close":
                rt.close()
            else:
                del s, rt
                gc.collect()                             # the finalizer, then a full collection's sweep
            assert life.ended and life.rt is not None    # the destroy waits for the segment
            _arena.sweep()
            assert life.rt is not None and _arena.held(life)
            cached[:] = [(ranges[0][0] + ranges[0][1], M)]     # given back; another just past the range
            if how == "close":
                _arena.sweep()
            else:
                gc.collect()
            assert life.rt is None and not _arena.held(life), how
            lives.append(life)
        assert len(lives) == 2
    finally:
        vmmrt.arena_reset(0)


# ------------------------------------------------- the presized segment

def test_the_range_is_lent_as_a_front_for_small_segments_and_one_large_one():
    M = 1 << 20
    assert graphpool.layout(100 * M) == (graphpool.SMALL, 100 * M - graphpool.SMALL)
    assert graphpool.layout(2 * graphpool.SMALL - 1) is None


def test_the_high_water_is_the_end_of_the_highest_block_ever_handed_out():
    lo, hi = 1000, 1000 + 4096
    events = [
        {"action": "segment_alloc", "addr": lo, "size": 4096},      # the segment itself: no block
        {"action": "alloc", "addr": lo, "size": 512},
        {"action": "alloc", "addr": lo + 512, "size": 1024},       # reaches 1536 ...
        {"action": "free_completed", "addr": lo + 512, "size": 1024},  # ... and is merged away: still counted
        {"action": "alloc", "addr": lo + 512, "size": 512},
        {"action": "alloc", "addr": 50, "size": 1 << 20},            # another pool's block
        {"action": "alloc", "addr": hi, "size": 512},                # past the segment
    ]
    assert graphpool.high_water(events, lo, hi) == 1536
    assert graphpool.high_water([], lo, hi) == 0


def test_without_the_history_the_presized_segment_is_used_whole():
    M = 1 << 20
    large = (1 << 30, 100 * M)
    ev = [{"action": "alloc", "addr": large[0] + 3 * M, "size": M}]
    assert graphpool.reach(ev, large, 2 * M) == 4 * M
    assert graphpool.reach([], large, 2 * M) == 0          # nothing allocated there: the plug takes it all
    assert graphpool.reach(None, large, 2 * M) == 100 * M  # the history was not on: nothing says


def test_the_range_is_cut_where_the_presized_segments_blocks_reached():
    lo = 1 << 30
    small = [(lo, 2 << 20), (lo + (2 << 20), 2 << 20)]
    large = (lo + (8 << 20), 100 << 20)
    assert graphpool.cut_end(lo, small + [large], large, 30 << 20) == (8 + 30) << 20
    # a segment made beside it when it was full keeps its end
    assert graphpool.cut_end(lo, small + [large, (lo + (108 << 20), 4 << 20)], large, 30 << 20) == 112 << 20
    # without a presized one: the last segment's end
    assert graphpool.cut_end(lo, small, None, 0) == 4 << 20


def test_no_presizing_without_a_memory_history_of_the_captures_own(monkeypatch):
    if not hasattr(torch.cuda.memory, "use_mem_pool"):
        pytest.skip("torch without use_mem_pool")
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: True, raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda *a, **k: None, raising=False)
    assert "records" in graphpool._history_why_not()
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: False)
    assert graphpool._history_why_not() is None
    monkeypatch.delattr(torch._C, "_cuda_isHistoryEnabled")
    assert "no memory history" in graphpool._history_why_not()


def test_describe_says_how_the_pool_got_its_segments():
    gp = _pool(1 << 30, 488 << 20)
    gp.backing.bound = True
    gp.bound, gp.fallback = 3908 << 20, 0
    gp.large, gp.presize_why_not = ((1 << 30) + graphpool.SMALL, 3900 << 20), None
    text = gp.describe()
    assert "488.0 MiB" in text and "one segment made before the captures" in text
    gp.large, gp.presize_why_not = None, "the caller records PyTorch's memory history"
    assert "as the captures asked: the caller records" in gp.describe()
    gp.large, gp.presize_why_not = ((1 << 30) + graphpool.SMALL, 3900 << 20), "no history"
    assert "kept whole: no history" in gp.describe()


@needs_count
def test_with_parts_the_bytes_held_are_at_their_granules_pages():
    """A held storage's bytes, granule by granule, where the parts put them
    in the plan's pages: the optimizer step is lent the rest."""
    buf = torch.zeros(4 * G, dtype=torch.uint8)
    base = buf.data_ptr()
    held = buf[G + G // 2:G + G // 2 + G].clone()   # a stand-in at an address of its own
    gp = _pool(base, 4 * G)
    gp.backing.address = held.data_ptr() - (G + G // 2)   # over granules 1 and 2 of the pool
    gp.parts = [poolplan.Part(None, None, [0, 1, 3], [0, 1, 0], 2), poolplan.Part(3, 3, [2], [0], 1)]
    gp.parts_at([10 * G, 20 * G])
    gp.settle([held])
    kept = held.detach()
    assert gp.held_ranges() == [(11 * G + G // 2, 12 * G), (20 * G, 20 * G + G // 2)]
    assert gp.page_table(0) == [10 * G, 11 * G, 20 * G, 10 * G]
    assert gp.held_bytes() == [(G + G // 2, 2 * G + G // 2)]
    del kept
    assert gp.held_ranges() == []


def _history(lo):
    """A: 2 granules born and freed at use 0; B: 2 granules born at use 0,
    freed at use 1; C: 4 born at use 1 after A is freed, freed there."""
    ev = [{"action": "alloc", "addr": lo, "size": 2 * G}, {"action": "alloc", "addr": lo + 2 * G, "size": 2 * G},
          {"action": "free_requested", "addr": lo, "size": 2 * G},
          {"action": "free_completed", "addr": lo, "size": 2 * G},
          {"action": "alloc", "addr": lo + 4 * G, "size": 4 * G},
          {"action": "free_requested", "addr": lo + 2 * G, "size": 2 * G},
          {"action": "free_completed", "addr": lo + 2 * G, "size": 2 * G},
          {"action": "free_requested", "addr": lo + 4 * G, "size": 4 * G},
          {"action": "free_completed", "addr": lo + 4 * G, "size": 4 * G}]
    return ev, [(("a", False), 0, 4), (("b", False), 4, 9)]


def test_a_block_made_after_the_captures_puts_the_granules_back_in_order(monkeypatch):
    lo = 1 << 30
    gp = _pool(lo, 8 * G)
    gp.per_use = True
    gp._events_kept, gp.marks = _history(lo)
    gp._sealed = {(lo + G, 512)}
    monkeypatch.setattr(gp, "_blocks_in_use", lambda: [(lo + G, 512)])
    order = [("a", False), ("b", False), ("b", True), ("a", True)]
    assert len(gp.planned_parts(order)) == 3
    monkeypatch.setattr(gp, "_blocks_in_use", lambda: [(lo + G, 512), (lo + 3 * G, 4096)])
    assert gp.planned_parts(order) == [(8 * G, None, None)]
    assert gp.parts is None and "1 blocks were made in it after the captures" in gp.place_why_not
    gp.parts_at([0])
    assert gp.page_table(0) is None
    gp.backing.bound, gp.bound, gp.fallback, gp.large, gp.presize_why_not = True, 8 * G, 0, None, "no history"
    assert "in order: 1 blocks" in gp.describe()


def test_describe_says_where_the_granules_went():
    gp = _pool(1 << 30, 488 << 20)
    gp.backing.bound = True
    gp.bound, gp.fallback, gp.large, gp.presize_why_not = 3908 << 20, 0, None, "no history"
    gp.parts = [poolplan.Part(None, None, [0], [0], 100), poolplan.Part(2, 3, [1], [0], 100)]
    gp.live_peak = 390 << 20
    gp.off.granularity = 2 << 20
    text = gp.describe()
    assert "its granules on 400.0 MiB of pages in 2 parts by when their blocks are alive (400.0 MiB apart), 1 of " \
        "them at some uses only (390.0 MiB alive at once" in text, text
    # placed on the plan: the distinct pages under them (parts alive at different uses share)
    gp._abs = [0] * 100 + [2 << 20] * 144
    assert "its granules on 4.0 MiB of pages in 2 parts by when their blocks are alive (400.0 MiB apart)" \
        in gp.describe()
    assert gp.stats()["graph_pool_pages_bytes"] == 4 << 20


def test_place_keeps_the_history_and_the_parts_follow_the_steps_order(monkeypatch):
    lo = 1 << 30
    ev, marks = _history(lo)
    gp = _pool(lo, 8 * G)
    gp.marks = marks
    monkeypatch.setattr(gp, "_blocks_in_use", lambda: [])
    monkeypatch.setattr(gp, "_stop_history", lambda: ev)
    gp.place()
    assert gp.live_peak == 6 * G
    order = [("a", False), ("b", False), ("b", True), ("a", True)]
    # one pool: in use at every position, on pages of its own
    assert gp.planned_parts(order) == [(8 * G, None, None)] and gp.parts is None
    # per use: A's granules at use 0 alone; B's from 0 to 1; C's at 1: C's
    # first half shares A's page inside no part (their parts are apart), so 3 parts
    gp.per_use = True
    got = gp.planned_parts(order)
    assert got == [(2 * G, 0, 0), (2 * G, 0, 1), (4 * G, 1, 1)], got
    # a use the step's order does not have: every granule at every use
    assert gp.planned_parts([("a", False), ("a", True)]) == [(6 * G, None, None)]
    # no history (the captures did not turn it on): in order, and why
    gp = _pool(lo, 8 * G)
    gp.presize_why_not = "the caller records PyTorch's memory history"
    monkeypatch.setattr(gp, "_stop_history", lambda: None)
    gp.place()
    assert gp.planned_parts(order) == [(8 * G, None, None)]
    assert gp.place_why_not == "the caller records PyTorch's memory history"


def test_one_pool_says_what_its_captures_left_in_use(monkeypatch):
    # Megatron-core's recomputed layers (H100): a 5306 MiB pool for a
    # working set planned at 2134. Whether blocks left in use pile up over
    # the captures, or one capture needs that much, is told apart by the
    # bytes the captures never freed: here B is never freed (2 granules),
    # and a block freed whose birth the history missed (no death over its
    # bytes before it to bound that birth) is in use for good too.
    lo = 1 << 30
    ev, _ = _history(lo)
    ev = [e for e in ev if e.get("addr") != lo + 2 * G or e["action"] == "alloc"]
    ev += [{"action": "free_requested", "addr": lo + 8 * G, "size": G},
           {"action": "free_completed", "addr": lo + 8 * G, "size": G}]
    gp = _pool(lo, 10 * G)
    monkeypatch.setattr(gp, "_blocks_in_use", lambda: [])
    monkeypatch.setattr(gp, "_stop_history", lambda: ev)
    gp.place()
    assert gp.never_freed == 3 * G
    assert gp.live_peak == 7 * G        # (A freed before C: B, C and the unseen birth at once)
    gp.backing.bound, gp.bound, gp.fallback, gp.large, gp.presize_why_not = True, 10 * G, 0, None, "no history"
    gp._abs = [0] * 5
    assert gp.stats()["graph_pool_never_freed_bytes"] == 3 * G
    assert "its blocks: 14.0 MiB alive at once at most, 6.0 MiB left in use by the captures" in gp.describe()
    # everything freed: none left
    gp = _pool(lo, 8 * G)
    monkeypatch.setattr(gp, "_blocks_in_use", lambda: [])
    monkeypatch.setattr(gp, "_stop_history", lambda: _history(lo)[0])
    gp.place()
    assert gp.never_freed == 0


def test_the_plug_over_the_presized_segments_tail_is_no_block_of_the_captures(monkeypatch):
    # The tensor taking the tail beyond the cut may begin in the range's last
    # granule: it is neither alive at once with the captures' blocks nor in
    # use at every use.
    lo = 1 << 30
    at = lo + 7 * G + 512
    ev, marks = _history(lo)
    plug = {"action": "alloc", "addr": at, "size": 300 * G}

    def placed(events):
        gp = _pool(lo, 8 * G)
        gp.marks = marks
        gp._plug = types.SimpleNamespace(data_ptr=lambda: at)
        monkeypatch.setattr(gp, "_blocks_in_use", lambda: [])
        monkeypatch.setattr(gp, "_stop_history", lambda: events)
        gp.place()
        return gp
    gp = placed(ev + [plug])
    assert gp.live_peak == 6 * G
    order = [("a", False), ("b", False), ("b", True), ("a", True)]
    assert gp.planned_parts(order) == [(8 * G, None, None)]     # (one pool: whole, planned_parts)
    # only the plug's own alloc goes: a block of the captures at its address
    # before it keeps its birth (and is no block born unseen)
    early = [{"action": "alloc", "addr": at, "size": 512}, {"action": "free_requested", "addr": at, "size": 512},
             {"action": "free_completed", "addr": at, "size": 512}]
    assert placed(early + ev + [plug])._events_kept == early + ev


def test_segments_are_read_without_trace_entries_where_torch_can(monkeypatch):
    # Every reading of the allocator's segments (the pool's cut, its blocks
    # in use, the optimizer's pool, the arena's sweep, memory()) asks for no
    # trace entries (a full snapshot converts the whole memory history), and
    # a PyTorch whose snapshot has no include_traces (before 2.11) is still
    # asked, pool id and all.
    from vmmrt.torch import _arena, _compat
    seg = {"address": 4 * G, "total_size": G, "blocks": []}
    calls = []

    def new(mempool_id=None, include_traces=True):
        calls.append((mempool_id, include_traces))
        return [seg]

    def old(mempool_id=None):
        calls.append((mempool_id, "old"))
        return [seg]

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    for snap, want in ((new, [(None, False), ((0, 7), False)]), (old, [(None, "old"), ((0, 7), "old")])):
        calls.clear()
        monkeypatch.setattr(torch.cuda, "memory_snapshot", snap)
        assert _arena._torch_segments() == [(4 * G, G)]
        assert _compat.memory_segments((0, 7)) == [seg]
        assert calls == want


def test_one_pool_marks_no_use_and_reads_no_history():
    # The uses' marks place per-use parts; one pool (the default) places
    # none, and each mark would read the whole memory history so far.
    gp = _pool(64 * G, 8 * G)
    gp.marks, gp._tracing, gp.per_use = [], True, False

    def read():
        raise AssertionError("the history was read")
    gp._events = read
    assert gp.mark(("0", False)) is None and gp.mark(("0", False), 3) is None and gp.marks == []
    gp.per_use = True
    gp._events = lambda: [{}] * 5
    assert gp.mark(("0", False)) == 5 and gp.mark(("0", False), 2) == 5 and gp.marks == [(("0", False), 2, 5)]


def test_a_diagnosis_marks_every_use_with_one_pool_too(monkeypatch):
    # bench.poolcheck sets graphpool.DIAGNOSE: each capture's span of the
    # history is marked (one pool marks none otherwise: two snapshots a use)
    from vmmrt.torch import graphpool

    class Pool:
        _tracing, per_use = True, False

    p = Pool()
    p.marks = []
    p._events = lambda: [{}] * 5
    assert graphpool.GraphPool.mark(p, ("a", False)) is None and p.marks == []
    monkeypatch.setattr(graphpool, "DIAGNOSE", True)
    first = graphpool.GraphPool.mark(p, ("a", False))
    p._events = lambda: [{}] * 9
    graphpool.GraphPool.mark(p, ("a", False), first)
    assert first == 5 and p.marks == [(("a", False), 5, 9)]
