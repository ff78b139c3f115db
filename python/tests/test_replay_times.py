# SPDX-License-Identifier: LGPL-2.1-or-later
"""The planners' layer times from graph replays, not from the eager warm-up
(vmmrt.torch.replay_times): the arithmetic and the build's use of it on the
host backend, with made-up replay times; on CUDA, a build with
offload="auto" times real graphs and leaves the layers' buffers as the
warm-up left them."""
import contextlib
import types

import pytest
import torch

import vmmrt.torch as vt
from conftest import samples, zoo_layers
from vmmrt.torch import graphed, replay_times

N = 4
OPTIONS = {"host_granularity": 4096}


def _runner(name, index, fwd, bwd):
    lay = types.SimpleNamespace(name=name, fwd_ms=list(fwd), bwd_ms=list(bwd), times_from="warm-up",
                                warmup_ms=None)
    return types.SimpleNamespace(layer=lay, callable_index=index)


def test_graph_times_replace_the_warm_ups_and_one_callable_is_timed_once():
    rs = [_runner("a", 0, [5.0, 4.0], [9.0, 8.0]), _runner("b", 1, [6.0], [7.0]),
          _runner("a/mb1", 0, [5.5], [8.5])]       # a pipeline's second microbatch of callable 0
    timed = []

    def time_one(r):
        timed.append(r.layer.name)
        return {"a": (0.8, 1.6, 40.0, None, 0.03, None), "b": (0.9, 1.7, 45.0, 30.0, 0.01, 0.02)}[r.layer.name]
    # the copies' bandwidth: the least any layer's compute left them, each
    # way; their contention: the most compute time a layer lost to them
    assert replay_times.measure(rs, time_one) == ({}, (40.0, 30.0), (0.03, 0.02))
    assert timed == ["a", "b"]
    assert [(r.layer.fwd_ms, r.layer.bwd_ms) for r in rs] == [([0.8], [1.6]), ([0.9], [1.7]), ([0.8], [1.6])]
    assert rs[0].layer.warmup_ms == (4.0, 8.0) and rs[2].layer.warmup_ms == (5.5, 8.5)
    assert all(r.layer.times_from == "graphs" for r in rs)


def test_a_layer_whose_graphs_cannot_be_timed_keeps_its_warm_up_times():
    rs = [_runner("a", 0, [5.0], [9.0]), _runner("b", 1, [6.0], [7.0])]

    def time_one(r):
        if r.layer.name == "a":
            raise RuntimeError("operation not permitted when stream is capturing")
        return (0.5, 1.0, None, None)
    failed, gbps, slow = replay_times.measure(rs, time_one)
    assert gbps == (None, None) and slow == (None, None)      # (a timer without the contention: none known)
    assert list(failed) == ["a"] and "not permitted" in failed["a"]
    assert (rs[0].layer.fwd_ms, rs[0].layer.bwd_ms) == ([5.0], [9.0])
    assert rs[0].layer.times_from.startswith("warm-up (its graphs could not be timed")
    assert (rs[1].layer.fwd_ms, rs[1].layer.times_from) == ([0.5], "graphs")


def _build_to_plan(monkeypatch, offload, memory_budget=None, made_up=(0.0, 0.0, None, None)):
    """make_graphed_callables' steps up to the allocation (graphs=True) on
    the host backend, the graphs' times made up; returns the Offload and the
    runners whose timing was asked for."""
    asked = []

    def timer(off, stream, allow_unused_input):
        return lambda r: asked.append(r.name) or made_up
    monkeypatch.setattr(replay_times, "timer", timer)
    _, runners, marks, uses, device = graphed._prepare_runners(tuple(zoo_layers(N)), samples(N), None, None, None,
                                                               [], False, False, 1.0, None)
    off, mode = graphed._open_offload(runners, uses, device, "pingpong", 1, OPTIONS, 0, 1, True)
    try:
        stream = graphed._warmup(runners, uses, off, 3, False)
        graphed._time_for_planning(uses, off, stream, False, True, offload, memory_budget)
        off = graphed._allocate(runners, uses, off, None, "static", mode, offload, memory_budget, marks, 0.9, False)
    except BaseException:
        graphed._close(off, runners)
        raise
    return off, runners, asked


def test_offload_auto_plans_from_the_graphs_times(monkeypatch):
    off, runners, asked = _build_to_plan(monkeypatch, "auto")
    try:
        assert asked == [r.name for r in runners]
        # the bandwidth planner read the made-up times, not the warm-up's
        assert [(p.fwd_ms, p.bwd_ms) for p in off.plan.layers] == [(0.0, 0.0)] * N
        # no compute hides no copy: nothing moves (behind the warm-up's
        # times, milliseconds on the host, the memcpy hides every region)
        assert off.plan.fraction == 0.0, off.plan.summary()
        text = off.describe()
        assert "the planner's layer times" in text and "graphs' replays, forward 0.000 ms" in text, text
        assert all(lay.warmup_ms is not None and lay.warmup_ms[0] > 0.0 for lay in off.layers)
    finally:
        graphed._close(off, runners)


def test_copies_that_slow_the_layers_compute_move_less(monkeypatch):
    """The same layer times and bandwidth; the timer also says the graphs
    ran slower while a copy did (replay_times.copy_under): the Offload keeps
    it, the plan charges it (vmmrt.torch.planner.plan's contention) and
    moves less, and describe() says it. (Made up: the zoo's tens of
    kilobytes at 0.1 GB/s hide behind 2 ms layers; half the copy's time lost
    to the compute leaves 3 kilobytes within 1 % of a layer's 4 ms.)"""
    free, runners, _ = _build_to_plan(monkeypatch, "auto", made_up=(2.0, 2.0, 0.1, 0.1, 0.0, 0.0))
    try:
        moved_free = free.plan.fraction
        assert moved_free > 0 and free.copy_contention == (0.0, 0.0)
    finally:
        graphed._close(free, runners)
    slow, runners, _ = _build_to_plan(monkeypatch, "auto", made_up=(2.0, 2.0, 0.1, 0.1, 0.5, 0.5))
    try:
        assert slow.copy_contention == (0.5, 0.5) and slow.plan.contention == (0.5, 0.5)
        assert slow.plan.fraction < moved_free, (slow.plan.summary(), moved_free)
        assert "50.0 % (D2H) and 50.0 % (H2D) slower while a copy runs" in slow.describe()
        assert "slower while they copy" in slow.plan.summary()
    finally:
        graphed._close(slow, runners)
    # the budget planner is given it too
    held, runners, _ = _build_to_plan(monkeypatch, 1.0, memory_budget=vt.Budget(1 << 40),
                                      made_up=(2.0, 2.0, 0.1, 0.1, 0.5, 0.25))
    try:
        assert held.plan.contention == (0.5, 0.25), held.plan.summary()
    finally:
        graphed._close(held, runners)


def test_a_fixed_offload_times_nothing(monkeypatch):
    warm, runners, _ = _build_to_plan(monkeypatch, "auto", made_up=(50.0, 50.0, None, None))
    try:
        # the same layers with times behind which the copies hide: they move
        assert warm.plan.fraction > 0.5, warm.plan.summary()
    finally:
        graphed._close(warm, runners)
    off, runners, asked = _build_to_plan(monkeypatch, 1.0)
    try:
        assert asked == []
        assert all(lay.times_from == "warm-up" for lay in off.layers)
        assert "the planner's layer times" not in off.describe()
    finally:
        graphed._close(off, runners)


def test_copies_slowed_by_the_layers_compute_hide_less(monkeypatch):
    """The same layer times; the copies' bandwidth under the graphs a
    millionth of another run's: the plan moves less, and describe() says
    what it planned with. (Both made up: the idle bandwidth the build
    measures on the host is this machine's, and a thousandth of it still
    hid the zoo's few kilobytes on a fast one.)"""
    fast, runners, _ = _build_to_plan(monkeypatch, "auto", made_up=(2.0, 2.0, 1000.0, 1000.0))
    try:
        moved_fast = fast.plan.fraction
    finally:
        graphed._close(fast, runners)
    slow, runners, _ = _build_to_plan(monkeypatch, "auto", made_up=(2.0, 2.0, 0.001, 0.001))
    try:
        assert slow.plan.d2h_gbps == pytest.approx(0.001) and slow.plan.h2d_gbps == pytest.approx(0.001)
        assert slow.plan.fraction < moved_fast, (slow.plan.summary(), moved_fast)
        assert "copies under the layers' graphs at D2H" in slow.describe()
    finally:
        graphed._close(slow, runners)


def test_the_host_backend_has_no_graphs_to_time():
    off = vt.Offload(mode="none", device="cpu", options=OPTIONS)    # the host backend on a GPU machine too
    try:
        assert replay_times.timer(off, None, False) is None
    finally:
        off.close()


@pytest.mark.gpu
def test_offload_auto_times_graphs_and_leaves_the_buffers_as_the_warm_up_did():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")

    def model():
        torch.manual_seed(3)
        return [torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256), torch.nn.GELU()).cuda()
                for _ in range(3)]

    def sample():
        return tuple((torch.randn(64, 256, device="cuda", requires_grad=True),) for _ in range(3))
    built = {}
    for offload in ("auto", 0.0):
        layers = model()
        torch.manual_seed(5)
        g = vt.make_graphed_callables(tuple(layers), sample(), mode="pingpong", offload=offload)
        off = vt.offload_of(g[0])
        built[offload] = ([lay.times_from for lay in off.layers],
                          [b.detach().clone() for m in layers for b in m.buffers()], off.copy_gbps,
                          off.copy_contention)
        off.close()
    assert built["auto"][0] == ["graphs"] * 3, built["auto"][0]
    assert built[0.0][0] == ["warm-up"] * 3
    # the copies timed under the layers' graphs, each way
    assert built["auto"][2] is not None and all(g > 0 for g in built["auto"][2]), built["auto"][2]
    assert built[0.0][2] is None
    # and what the copies cost the compute beside them: measured, 0 or more
    slow = built["auto"][3]
    assert slow is not None and all(c is not None and 0 <= c < 10 for c in slow), slow
    assert built[0.0][3] is None
    # a replay updates BatchNorm's running statistics: the timing puts them back
    for a, b in zip(built["auto"][1], built[0.0][1]):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_remap_map_is_timed_on_the_device():
    """planner.measure_remap on CUDA: each cycle makes memory (a release
    still queued when the map is asked would be cancelled, and the time
    read would be the stream's alone), and the time read is the stream
    waiting for a driver worker's map, tens of microseconds at least."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from vmmrt.torch import planner
    off = vt.Offload(mode="remap")
    try:
        before = off.stats()["driver_calls_by_kind"]["cuMemCreate"]
        ms = planner.measure_remap(off, 64 << 20)
        st = off.stats()
        assert st["driver_calls_by_kind"]["cuMemCreate"] - before >= planner.REMAP_REPEATS + 2
        assert 0.01 < ms < 1000, ms
        assert st["slot_bytes"] == 0
    finally:
        off.close()


class _Clock:
    """The device's clock as the stand-ins see it: a replay advances it."""
    now = 0.0


class _Event:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = _Clock.now

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.t - self.t


class _TimedGraph:
    """A graph whose capture runs its body eagerly; each replay takes
    ``costs`` ms in turn, and one (the
    backward's) also writes over the module's buffers, as a replay of
    BatchNorm's forward updates its running statistics."""
    made = []

    def __init__(self):
        self.costs = None
        self.buffers = ()
        _TimedGraph.made.append(self)

    def register_generator_state(self, g):
        pass

    def replay(self):
        _Clock.now += self.costs.pop(0) if len(self.costs) > 1 else self.costs[0]
        for b in self.buffers:
            b.add_(1)


def test_graph_timing_takes_the_least_replay_and_puts_buffers_and_rng_back(monkeypatch):
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(8))
    x = torch.randn(2, 8, 32, requires_grad=True)
    _, (r,) = graphed._callables.prepare(m, (x,), None)
    before = [b.clone() for b in m.buffers()]
    rng = []
    _TimedGraph.made = []
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _TimedGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 9))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: "the state before")
    monkeypatch.setattr(torch.cuda, "set_rng_state", rng.append)
    monkeypatch.setattr(replay_times, "copy_under", lambda replay, ms, stream, d2h: (20.0, 0.04) if d2h else (30.0, 0.01))
    made = _TimedGraph.__init__

    def init(self):
        made(self)
        # forward: 1 ms untimed, then 3, 2, 4; backward: 0.5 untimed, then 5,
        # 6, 7 (the untimed pair made fastest here: were it counted, it would
        # be the least)
        self.costs = [1.0, 3.0, 2.0, 4.0] if len(_TimedGraph.made) == 1 else [0.5, 5.0, 6.0, 7.0]
        self.buffers = tuple(m.buffers()) if len(_TimedGraph.made) == 2 else ()
    monkeypatch.setattr(_TimedGraph, "__init__", init)
    got = replay_times.time_graphs(r, types.SimpleNamespace(device="cpu"), False)
    assert got == (2.0, 5.0, 20.0, 30.0, 0.04, 0.01)
    # the capture (eager here) and the replays changed the statistics: put back
    for a, b in zip(m.buffers(), before):
        assert torch.equal(a, b)
    assert rng == ["the state before"]


def test_the_front_records_where_its_planners_times_came_from():
    from vmmrt.torch.bench import frontrun

    def lay(name, src, warm=None):
        return types.SimpleNamespace(name=name, times_from=src, fwd_ms=[0.5], bwd_ms=[1.0], warmup_ms=warm)
    off = types.SimpleNamespace(layers=[lay("a", "warm-up"), lay("b", "warm-up")], copy_gbps=None)
    assert frontrun.timing_fields(off) == {} and frontrun.timing_fields(None) == {}
    off = types.SimpleNamespace(layers=[lay("a", "graphs", (2.0, 4.0)), lay("b", "warm-up (its graphs could not "
                                                                               "be timed: X)")],
                                copy_gbps=(40.0, 35.0))
    got = frontrun.timing_fields(off)
    assert got["copy_gbps_under_compute"] == (40.0, 35.0)
    assert [(r["layer"], r["from"][:7], r["fwd_ms"], r["warmup_ms"]) for r in got["planner_times"]] == \
        [("a", "graphs", 0.5, (2.0, 4.0)), ("b", "warm-up", 0.5, None)]


class _Device:
    """Two streams run at once, as a GPU runs a compute stream and a copy
    stream: a replay takes ``replay_ms``, a copy ``copy_ms``; while both run,
    the copy goes at ``share`` of its speed and the compute at 1 - ``lost``
    of its own. Events are read once synchronize() has run the queues."""

    def __init__(self, replay_ms, copy_ms, share, lost):
        self.replay_ms, self.copy_ms, self.share, self.lost = replay_ms, copy_ms, share, lost
        self.queues, self.current = {}, None
        self.copies = []          # per run: the copies it made

    def enqueue(self, kind, what=None):
        self.queues.setdefault(id(self.current), []).append((kind, what))

    def run(self, dt=0.0005):
        # each stream: (its queue, the index of its item, the work left in it)
        state = {s: [q, 0, None] for s, q in self.queues.items()}
        self.copies.append(sum(1 for q in self.queues.values() for kind, _ in q if kind == "copy"))
        t = 0.0
        while any(st[1] < len(st[0]) for st in state.values()):
            busy = {}
            for s, st in state.items():
                while st[1] < len(st[0]) and st[0][st[1]][0] == "event":
                    st[0][st[1]][1].t = t
                    st[1] += 1
                if st[1] < len(st[0]):
                    kind = st[0][st[1]][0]
                    if st[2] is None:
                        st[2] = self.replay_ms if kind == "replay" else self.copy_ms
                    busy[s] = kind
            both = len(set(busy.values())) == 2
            for s, kind in busy.items():
                st = state[s]
                st[2] -= dt * ((self.share if kind == "copy" else 1 - self.lost) if both else 1.0)
                if st[2] <= 1e-12:
                    st[1], st[2] = st[1] + 1, None
            t += dt
        self.queues = {}


@pytest.mark.parametrize("replay_ms,copy_ms", [(0.3, 2.0), (10.0, 0.5)])
def test_a_copy_is_timed_with_what_it_costs_the_compute_beside_it(monkeypatch, replay_ms, copy_ms):
    """copy_under on a simulated device: a 64 MiB copy beside the replays
    goes at 80 % of its speed, and the replays lose 3 % of theirs while it
    runs: the bandwidth under compute and the compute lost per ms of copy
    come out as such, in either direction, for replays shorter than the
    copy and for a long layer's (copies back to back beside it)."""
    dev = _Device(replay_ms=replay_ms, copy_ms=copy_ms, share=0.8, lost=0.03)

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self, stream=None):
            dev.enqueue("event", self)

        def elapsed_time(self, other):
            return other.t - self.t

    class Buf:
        def copy_(self, other, non_blocking=False):
            dev.enqueue("copy")

    @contextlib.contextmanager
    def on(stream):
        before, dev.current = dev.current, stream
        try:
            yield
        finally:
            dev.current = before
    monkeypatch.setattr(torch, "empty", lambda *a, **k: Buf())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: object())
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: dev.run())
    compute = types.SimpleNamespace(device="cuda:0")
    for d2h in (True, False):
        gbps, slow = replay_times.copy_under(lambda: dev.enqueue("replay"), replay_ms, compute, d2h)
        assert gbps == pytest.approx((64 << 20) / (copy_ms / 0.8 * 1e-3) / 1e9, rel=0.01)
        assert slow == pytest.approx(0.03, abs=0.003)
    # the copies span half the replays or more (at least twice the copy alone):
    # what they cost the compute is most of what is read
    n = max(2, -(-2 * copy_ms // replay_ms))
    assert max(dev.copies) * copy_ms / 0.8 >= 0.5 * n * replay_ms, (dev.copies, n)
    # no contention: none measured, the bandwidth the copy's own
    dev.share, dev.lost = 1.0, 0.0
    gbps, slow = replay_times.copy_under(lambda: dev.enqueue("replay"), replay_ms, compute, True)
    assert gbps == pytest.approx((64 << 20) / (copy_ms * 1e-3) / 1e9, rel=0.01)
    assert slow == pytest.approx(0.0, abs=0.002)
