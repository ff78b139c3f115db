# SPDX-License-Identifier: LGPL-2.1-or-later
"""The benchmark's own machinery on the CPU: the peak sampler, the two
training loops, the gradient comparison, and one whole run (--smoke) with its
JSON. The numbers it reports on a GPU are only as good as these."""
import json
import re
import threading
import time
import types
import weakref

import pytest
import torch

from vmmrt.torch import memory
from vmmrt.torch.bench import __main__ as bench
from vmmrt.torch.bench import loops, modes


def test_sampler_sees_a_spike_in_the_middle():
    """A reading that is high for 60 ms in the middle of 200 ms: only a thread
    that samples while the work runs sees it (start and stop read low)."""
    t0 = time.perf_counter()

    def read():
        t = time.perf_counter() - t0
        return 500 if 0.07 <= t < 0.13 else 100

    s = memory.PeakSampler(read=read, interval_s=50e-6)
    with s:
        time.sleep(0.2)
    assert s.start_bytes == 100 and s.end_bytes == 100
    assert s.peak == 500
    d = s.as_dict()
    assert d["samples"] >= 20 and d["rate_hz"] > 100
    assert 0 < d["max_gap_s"] < 0.06
    assert 0.2 <= d["duration_s"] < 5
    assert not any(t.name == "vmmrt-peak-sampler" for t in threading.enumerate())


def test_sampler_restarts_and_refuses_a_second_start():
    s = memory.PeakSampler(read=lambda: 7)
    s.start()
    with pytest.raises(RuntimeError):
        s.start()
    assert s.stop() == 7
    s.start()
    assert s.stop() == 7 and s.samples >= 2


def test_graph_pool_parts_say_what_its_captures_left_free():
    """A graph pool keeps the blocks its captures freed: the snapshot counts
    them apart, on made-up segments; the segments of the optimizer's pool
    over the memory plan's pages (vmmrt.torch.optmem) are the pages' bytes,
    not the pool's."""
    M = 1 << 20
    segs = [{"device": 0, "segment_pool_id": (0, 0), "total_size": 100 * M, "allocated_size": 10 * M},
            {"device": 0, "segment_pool_id": (0, 1), "total_size": 64 * M, "allocated_size": 4 * M},
            {"device": 0, "segment_pool_id": (0, 2), "total_size": 20 * M, "allocated_size": 20 * M},
            {"device": 1, "segment_pool_id": (0, 1), "total_size": 999 * M, "allocated_size": 0}]
    assert memory.pool_parts(segs, 0) == (84 * M, 60 * M, 100 * M)
    assert memory.pool_parts([{"device": 0, "total_size": M}], 0) == (None, None, M)    # pools not said
    view = [{"device": 0, "segment_pool_id": (0, 3), "total_size": 40 * M, "allocated_size": 0, "address": 5000 * M}]
    assert memory.pool_parts(segs + view, 0) == (124 * M, 100 * M, 100 * M)
    assert memory.pool_parts(segs + view, 0, [(4000 * M, 6000 * M)]) == (84 * M, 60 * M, 100 * M)
    # the ranges: the optimizer's view and the graphs' pool on the library's slot
    import types
    off = types.SimpleNamespace(memplan=types.SimpleNamespace(optimizer=types.SimpleNamespace(
        view=types.SimpleNamespace(address=4000 * M, size=2000 * M))),
        graph_pool=types.SimpleNamespace(backing=types.SimpleNamespace(address=9000 * M, nbytes=4640 * M)))
    assert memory._views([off]) == [(4000 * M, 6000 * M), (9000 * M, 13640 * M)]
    pool = [{"device": 0, "segment_pool_id": (0, 4), "total_size": 600 * M, "allocated_size": 0, "address": 9100 * M}]
    assert memory.pool_parts(segs + view + pool, 0, memory._views([off])) == (84 * M, 60 * M, 100 * M)
    snap = {"used": 300 * M, "graph_pool": 84 * M, "graph_pool_free": 60 * M, "allocator": 100 * M, "vmmrt": 0,
            "slots": None, "other": 116 * M}
    assert "graph pool 84 (60 free) + caching allocator 100" in memory.describe(snap)
    assert "graph pool 84 + caching" in memory.describe(dict(snap, graph_pool_free=0))
    # the default pool's bytes no tensor holds: its 90 free, not the view's
    # nor the graphs' pool's (the library's bytes, or the graph pool's)
    assert memory.allocator_free(segs + view + pool, 0, memory._views([off])) == 90 * M
    assert memory.allocator_free([{"device": 0, "total_size": M, "allocated_size": 0}], 0) == M   # pools not said
    assert "caching allocator 100 (90 free) + libvmmrt" in memory.describe(dict(snap, allocator_free=90 * M))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-op is for machines without CUDA")
def test_sampler_is_a_noop_without_cuda():
    with memory.PeakSampler() as s:
        pass
    assert not s.active
    assert s.peak is None and s.samples == 0 and s.rate_hz is None


class Tiny(torch.nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.a = torch.nn.Linear(d, 2 * d)
        self.b = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


def _setup(k, seed=0):
    torch.manual_seed(seed)
    layers = [Tiny(), Tiny()]
    xs = [torch.randn(3, 8, requires_grad=True) for _ in range(k)]
    gys = [torch.randn(3, 8) for _ in range(k)]
    return layers, xs, gys, (lambda x: layers[1](layers[0](x)))


def _grads(layers, xs):
    return [g.clone() for g in modes.grads_of(layers, xs)]


def test_persistent_loop_zeroes_in_place_and_accumulates_microbatches():
    layers, xs, gys, run = _setup(2)
    opt = loops.optimizer(modes.parameters(layers))
    loop = loops.Loop("persistent", 2)
    w0 = [p.detach().clone() for p in modes.parameters(layers)]
    loop.step(run, opt, xs, gys)
    held = [p.grad for p in modes.parameters(layers)] + [x.grad for x in xs]
    assert all(g is not None for g in held)
    assert any(not torch.equal(p, w) for p, w in zip(modes.parameters(layers), w0))  # AdamW stepped
    w = modes.Weights(layers)                       # the weights this step's gradients come from
    loop.step(run, opt, xs, gys)
    # the same tensors, zeroed in place and accumulated again
    assert all(a is b for a, b in zip(held, [p.grad for p in modes.parameters(layers)] + [x.grad for x in xs]))
    got = _grads(layers, xs)
    # the two microbatches' sum, each computed alone from the same weights
    w.restore()
    want = None
    for k in range(2):
        for p in modes.parameters(layers):
            p.grad = None
        xs[k].grad = None
        run(xs[k]).backward(gys[k])
        g = [p.grad.clone() for p in modes.parameters(layers)]
        want = g if want is None else [a + b for a, b in zip(want, g)]
    assert all(torch.allclose(a, b, rtol=0, atol=1e-6) for a, b in zip(got[2:], want))


def test_the_process_warm_up_runs_a_whole_step_and_leaves_the_model_as_it_was():
    """loops.warm_process: forward, backward and an AdamW step ran (its
    kernels are what a process loads once), and nothing of it is left: the
    weights (learning rate 0), no .grad, the input's neither."""
    layers, xs, gys, _ = _setup(1)
    params = modes.parameters(layers)
    w0 = [p.detach().clone() for p in params]
    seen = []
    hooks = [p.register_hook(lambda g: seen.append(g.shape)) for p in params]
    loops.warm_process(layers, xs[0], gys[0], "foreach")
    for h in hooks:
        h.remove()
    assert len(seen) == len(params)
    assert all(torch.equal(p, w) for p, w in zip(params, w0))
    assert all(p.grad is None for p in params) and xs[0].grad is None


def test_auto_s_prediction_against_moving_nothing_is_checked_against_mode_none():
    from vmmrt.torch.bench import frontrun
    fr = frontrun.Front.__new__(frontrun.Front)
    fr.loop = loops.Loop("persistent", 1)
    mib = 1 << 20
    none = {"label": "vmmrt none", "option": "none", "peak": 1000 * mib}
    auto = {"label": "vmmrt auto", "option": "planner", "peak": 700 * mib,
            "predicted_vs_nothing_bytes": {"set_to_none": 5 * mib, "persistent": -320 * mib}}
    fr.points = [none, auto]
    line = fr._against_none(auto)
    assert "persistent loop" in line and "predicted -320 MiB" in line and "measured -300 against vmmrt none" in line
    assert auto["measured_vs_none_bytes"] == -300 * mib
    # nothing to check it against: no line
    fr.points = [auto]
    assert fr._against_none(dict(auto)) == ""


def test_set_to_none_loop_makes_new_gradients():
    layers, xs, gys, run = _setup(1)
    opt = loops.optimizer(modes.parameters(layers))
    loop = loops.Loop("set_to_none", 1)
    seen = []

    def between():
        seen.append([p.grad for p in modes.parameters(layers)] + [xs[0].grad])
    loop.step(run, opt, xs, gys, between=between)
    first = [p.grad for p in modes.parameters(layers)]
    loop.step(run, opt, xs, gys, between=between)
    assert all(g is None for s in seen for g in s)          # no .grad between forward and backward
    assert all(a is not b for a, b in zip(first, [p.grad for p in modes.parameters(layers)]))


def test_references_follow_where_graph_only_is_right():
    assert loops.reference("set_to_none", 1) == "graph"
    assert loops.reference("set_to_none", 2) == "eager"
    assert loops.reference("persistent", 1) == "eager"
    with pytest.raises(ValueError):
        loops.Loop("sometimes")


def test_compare_tells_doubled_from_rounding():
    a = [torch.randn(100), torch.randn(5, 5)]
    same, ulp, norm = modes.compare([t.clone() for t in a], a)
    assert same and ulp == 0.0 and norm is None
    same, ulp, norm = modes.compare([2 * t for t in a], a)
    assert not same and ulp > 0 and abs(norm - 2.0) < 1e-9
    nudged = [t.clone() for t in a]
    nudged[0][3] = torch.nextafter(nudged[0][3], torch.tensor(float("inf")))
    same, ulp, norm = modes.compare(nudged, a)
    assert not same and ulp == pytest.approx(1.0) and abs(norm - 1.0) < 1e-6


def test_weights_restore_in_place():
    layers, xs, gys, run = _setup(1)
    w = modes.Weights(layers)
    before = [(p, p.data_ptr(), p.detach().clone()) for p in w.params]
    opt = loops.optimizer(w.params)
    loops.Loop("set_to_none").step(run, opt, xs, gys)
    w.restore()
    assert all(p.data_ptr() == ptr and torch.equal(p, v) for p, ptr, v in before)


class _Ticks(torch.autograd.Function):
    """Advances a fake clock by fwd ns in its forward, by bwd ns in its backward."""

    @staticmethod
    def forward(ctx, x, clock, fwd, bwd):
        ctx.clock, ctx.bwd = clock, bwd
        clock[0] += fwd
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        ctx.clock[0] += ctx.bwd
        return g, None, None, None


class _Ticking(Tiny):
    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def forward(self, x):
        return _Ticks.apply(super().forward(x), self.clock, 7000, 11000)


@pytest.mark.parametrize("n,k", [(3, 1), (6, 1), (3, 2)])
def test_launch_time_is_per_layer_per_call(n, k):
    """The launch thread's time, read on a fake clock that only the layers
    advance (7 us per layer forward, 11 us per layer backward): the figures
    are per layer and per call whatever the layers and microbatches, and
    their sum per layer per step counts the K microbatches."""
    from types import SimpleNamespace
    clock = [0]
    torch.manual_seed(0)
    layers = [_Ticking(clock) for _ in range(n)]
    xs = [torch.randn(3, 8, requires_grad=True) for _ in range(k)]
    gys = [torch.randn(3, 8) for _ in range(k)]
    built = modes.Built("eager", lambda x: modes._through(layers, x),
                        opt=loops.optimizer(modes.parameters(layers)))
    res, _ = modes.measure(built, layers, loops.Loop("set_to_none", k), xs, gys,
                           SimpleNamespace(warmup=1, iterations=3), modes.Weights(layers), clock=lambda: clock[0])
    assert res["launch_fwd_us_per_layer"] == 7.0
    assert res["launch_bwd_us_per_layer"] == 11.0
    assert res["launch_us_per_layer_step"] == 18.0 * k
    assert "driver_calls_per_step" not in res           # no offload, no driver


class _Queued(Tiny):
    """Its forward costs 70 us of the launch thread while the device is busy
    (the driver spinning for room in a full launch queue) and 7 us in a step
    begun with the device idle (modes._sync just before the step)."""

    def __init__(self, clock, state):
        super().__init__()
        self.clock, self.state = clock, state

    def forward(self, x):
        return _Ticks.apply(super().forward(x), self.clock, 7000 if self.state["idle"] else 70000, 11000)


def test_launch_time_is_read_from_steps_begun_with_the_device_idle(monkeypatch):
    from types import SimpleNamespace
    clock, state = [0], {"idle": False}
    monkeypatch.setattr(modes, "_sync", lambda: state.update(idle=True))
    step = loops.Loop.step

    def stepped(self, *a, **k):
        try:
            return step(self, *a, **k)
        finally:
            state["idle"] = False       # the next step starts busy unless synced just before
    monkeypatch.setattr(loops.Loop, "step", stepped)
    torch.manual_seed(0)
    layers = [_Queued(clock, state) for _ in range(3)]
    xs, gys = [torch.randn(3, 8, requires_grad=True)], [torch.randn(3, 8)]
    built = modes.Built("eager", lambda x: modes._through(layers, x), opt=loops.optimizer(modes.parameters(layers)))
    res, _ = modes.measure(built, layers, loops.Loop("set_to_none"), xs, gys,
                           SimpleNamespace(warmup=1, iterations=5), modes.Weights(layers), clock=lambda: clock[0])
    assert res["launch_fwd_us_per_layer"] == 7.0 and res["launch_us_per_layer_step"] == 18.0
    assert res["launch_queued_us_per_layer_step"] == 81.0     # the timed steps (one begun idle: the median)


def test_a_vmmrt_point_is_timed_after_its_memory_plan_is_bound():
    """Whatever --warmup says, a point with an offload warms up for the two
    steps that make and bind the memory plan; others as asked."""
    from types import SimpleNamespace
    off = object()
    assert modes.warmup_steps(SimpleNamespace(warmup=0), off) == modes.PLAN_STEPS == 2
    assert modes.warmup_steps(SimpleNamespace(warmup=1), off) == 2
    assert modes.warmup_steps(SimpleNamespace(warmup=5), off) == 5
    assert modes.warmup_steps(SimpleNamespace(warmup=0), None) == 0
    assert modes.warmup_steps(SimpleNamespace(warmup=1), None) == 1


def test_launch_time_of_a_backward_run_by_another_thread():
    """On CUDA autograd runs the layers' backwards on its device thread: the
    backward's time is the caller's plus that thread's from the hook on the
    output (the first thing it runs) to the return. A stand-in output whose
    backward runs its hook on a thread of its own, on per-thread fake clocks."""
    ticks = {}

    def clock():
        return ticks.setdefault(threading.get_ident(), 0)

    class Out:
        requires_grad = True

        def register_hook(self, h):
            self.hook = h

        def backward(self, gy):
            def worker():
                me = threading.get_ident()
                ticks[me] = 100         # before the backward: not counted
                self.hook(gy)
                ticks[me] += 5000       # the layers' backwards
            t = threading.Thread(target=worker)
            t.start()
            t.join()
            ticks[threading.get_ident()] += 300   # the caller's own part

    c = loops.LaunchClock(clock, clock_of=lambda ident: ticks[ident])
    c.backward(Out(), None)
    assert (c.bwd_ns, c.backwards, c.elsewhere) == (5300, 1, 1)


def test_launch_time_of_a_backward_on_the_cpu_is_the_callers():
    c = loops.LaunchClock()
    lin = torch.nn.Linear(8, 8)
    c.backward(lin(torch.randn(2, 8)), torch.randn(2, 8))
    assert (c.backwards, c.elsewhere) == (1, 0) and c.bwd_ns > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="autograd's device thread is CUDA's")
def test_launch_time_of_a_cuda_backward_counts_autograds_device_thread():
    """What the backward figure assumes on CUDA: the layers' backwards run
    on another thread than the caller's, which the hook finds."""
    c = loops.LaunchClock()
    lin = torch.nn.Linear(8, 8).cuda()
    for _ in range(2):
        c.backward(lin(torch.randn(2, 8, device="cuda")), torch.randn(2, 8, device="cuda"))
    torch.cuda.synchronize()
    assert (c.backwards, c.elsewhere) == (2, 2) and c.bwd_ns > 0


@pytest.mark.parametrize("loop,k", [("both", 1), ("persistent", 2)])
def test_smoke_run_writes_every_loop(tmp_path, loop, k):
    out = tmp_path / "bench.json"
    argv = ["--smoke", "--device", "cpu", "--layer", "torch", "--modes", "eager,eager-pingpong", "--iterations", "2",
            "--loop", loop, "--microbatches", str(k), "--json", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    (s,) = doc["sets"]
    want = list(loops.LOOPS) if loop == "both" else [loop]
    assert sorted(s["loops"]) == sorted(want)
    for name in want:
        lp = s["loops"][name]
        assert lp["reference"] == "eager" and lp["microbatches"] == k
        rows = {r["mode"]: r for r in lp["rows"]}
        assert set(rows) == {"eager", "eager-pingpong"}
        r = rows["eager-pingpong"]
        for key in ("step_ms", "zero_ms", "fwd_bwd_ms", "opt_ms", "d2h_bytes_per_step", "offload_stats",
                    "driver_calls_per_step"):
            assert r[key] is not None, key
        assert r["driver_calls_per_step"] == sum(r["driver_calls_per_step_by_kind"].values())
        assert "driver_calls_per_step" not in rows["eager"]
        for m in rows.values():     # the real clock: present, positive, finite (never its size)
            for key in ("launch_fwd_us_per_layer", "launch_bwd_us_per_layer", "launch_us_per_layer_step"):
                assert 0 < m[key] < float("inf"), (m["mode"], key)
        assert r["iterations"] == 2 and r["loop"] == name
        # every mode starts from the same weights: the eager offload is bitwise
        assert r["grad_bitwise"] is True
        assert any(t["group"] == "whole step" and t["met"] and "gradients bitwise" in t["target"]
                   for t in lp["targets"])


def test_encoder_layer_offloads_eagerly_on_the_cpu(tmp_path):
    out = tmp_path / "enc.json"
    argv = ["--smoke", "--device", "cpu", "--layer", "encoder", "--modes", "eager,eager-pingpong",
            "--iterations", "1", "--loop", "set_to_none", "--json", str(out)]
    assert bench.main(argv) == 0
    (s,) = json.loads(out.read_text())["sets"]
    rows = {r["mode"]: r for r in s["loops"]["set_to_none"]["rows"]}
    assert s["layer"] == "encoder" and rows["eager-pingpong"]["grad_bitwise"] is True
    assert rows["eager-pingpong"]["d2h_bytes_per_step"] > 0


def test_preset_sets_the_issue_shape_and_options_win():
    a = bench.parse(["--preset", "encoder", "--device", "cpu"])
    assert (a.layer, a.layers, a.hidden, a.ffn, a.heads, a.seq) == (["encoder"], 6, 4096, 16384, 32, 4096)
    a = bench.parse(["--preset", "encoder", "--device", "cpu", "--layers", "2"])
    assert a.layers == 2 and a.ffn == 16384


def test_budget_sweep_runs_on_the_cpu(tmp_path):
    out = tmp_path / "sweep.json"
    argv = ["--smoke", "--device", "cpu", "--layer", "torch", "--budget-sweep", "--sweep-points", "3",
            "--iterations", "1", "--json", str(out)]
    assert bench.main(argv) == 0
    sw = json.loads(out.read_text())["sweep"]
    budgets = [p["budget"] for p in sw["points"]]
    # from keeping everything down to the smallest plan, the planner's choice fitting each
    assert budgets[0] == sw["keep"]["predicted_peak"] and budgets[-1] == sw["smallest_bytes"]
    assert budgets == sorted(budgets, reverse=True) and len(budgets) == 3
    for p in sw["points"]:
        m = p["planner"]
        assert m["predicted_peak"] <= p["budget"] and m["step_ms"] > 0 and m["grad_bitwise_vs_keep"] is True
        assert all(h["predicted_peak"] <= p["budget"] for h in p["hand"])
    assert sw["points"][-1]["planner"]["counts"]["recompute"] >= 1
    assert sw["pareto"] and sw["hand_predicted"]
    # attention "auto" (the default): gradients checked by their norm, and said so
    assert sw["grads_check"].startswith("norm ratio") and all(m["grads_ok"] for m in sw["measured"])


def test_budget_sweep_checks_gradients_bitwise_with_math_attention_by_norm_otherwise():
    from vmmrt.torch.bench import sweep
    assert sweep.grads_check((True, 0.0, None), True) == (True, "bitwise")
    assert sweep.grads_check((False, 3.0, 1.0), True)[0] is False           # math attention: bitwise or wrong
    assert sweep.grads_check((False, 40.0, 1.0 + 2e-6), False)[0] is True   # flash's run-to-run rounding
    assert sweep.grads_check((False, 1e6, 1.01), False)[0] is False         # a real difference
    assert sweep.grads_check((False, 1e6, 2.0), False)[0] is False          # a doubled gradient
    assert sweep.grads_check((False, 0.0, float("nan")), False)[0] is False
    assert sweep.grads_check((False, float("inf"), None), False)[0] is False  # a gradient missing
    row = {"grad_bitwise_vs_keep": False, "grads_ok": False, "grad_norm_ratio_vs_keep": 1.01}
    assert sweep._grads_cell(row).startswith("DIFFER")


def test_budget_sweep_compares_with_hand_made_choices_within_the_budget_itself(tmp_path, capsys):
    from vmmrt.torch.bench import sweep
    mib = 1 << 20

    def row(label, ms, peak):
        return {"label": label, "step_ms": ms, "peak": peak * mib, "predicted_peak": peak * mib,
                "predicted_ms": ms, "counts": {"keep": 1, "offload": 0, "recompute": 1},
                "plan": {"mode": "pingpong", "lookahead": 1}, "grad_bitwise_vs_keep": True, "grads_ok": True}
    planner = row("planner @ 1000 MiB", 110.0, 1000)
    over = row("offload 0.25", 100.0, 1007)        # 0.7 % over: within the planner's slack, not the budget
    within = row("checkpoint 4", 120.0, 900)
    keep = row("keep all", 95.0, 1200)
    doc = {"title": "t", "mode": "pingpong", "lookahead": 1, "reserve_bytes": 0, "calibration_bytes": 0,
           "smallest_bytes": 800 * mib, "graph": None, "keep": keep,
           "points": [{"budget": 1000 * mib, "planner": planner, "hand": [over]}],
           "measured": [keep, planner, over, within]}
    doc["pareto"] = sweep.pareto(doc["measured"])
    t = sweep.targets(doc)[0]
    # against checkpoint 4 (measured at another budget, within this one): met,
    # and the comparison with the one 0.7 % over said beside it
    assert t["met"] and "0.917x" in t["detail"] and "against checkpoint 4" in t["detail"], t
    assert "1.100x" in t["detail"] and "offload 0.25 at 1.007" in t["detail"], t
    assert "checkpoint 4" in sweep.table(doc, "t")
    # the same again from a run's JSON, without a device
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"sweep": doc}))
    assert sweep.main([str(path)]) == 0
    assert "against checkpoint 4" in capsys.readouterr().out
    assert sweep.main([str(tmp_path / "none.json"), "a", "b"]) == 2
    assert sweep.main([str(tmp_path / "none.json")]) == 2           # no such file: said, no traceback
    (tmp_path / "bad.json").write_text("[1, 2")
    assert sweep.main([str(tmp_path / "bad.json")]) == 2
    (tmp_path / "other.json").write_text("[1, 2]")
    assert sweep.main([str(tmp_path / "other.json")]) == 2          # JSON, but not a sweep's


# --front: the arithmetic on made-up fronts, then one smoke run on the CPU.

def _pt(label, family, ms, mib, **kw):
    return dict(label=label, family=family, step_ms=ms, peak=mib << 20, **kw)


def _made_up():
    return [_pt("eager", "torch", 100.0, 1000), _pt("ckpt 2", "torch", 115.0, 800), _pt("graphs", "torch", 95.0, 1050),
            # wrong gradients (graph-only's in the persistent loop): no option at all
            _pt("graphs persistent", "torch", 50.0, 500, grads_ok=False),
            # faster than ckpt 2 (the fastest within its peak) only by holding more: not ahead
            _pt("between", "vmmrt", 105.0, 900),
            # faster than eager, which holds as much: ahead
            _pt("ahead", "vmmrt", 98.0, 1000),
            # below every PyTorch option's peak: only vmmrt fits
            _pt("small", "vmmrt", 200.0, 700),
            _pt("slow", "vmmrt", 96.0, 1100),      # graphs holds less and is faster
            _pt("tie", "vmmrt", 95.0, 1050),       # ties count for PyTorch
            # 0.5 % faster than eager, which holds as much: within the noise, a tie
            _pt("noise", "vmmrt", 99.5, 1000),
            _pt("failed", "vmmrt", float("nan"), 0, error="RuntimeError: boom"),
            _pt("wrong", "vmmrt", 10.0, 10, grads_ok=False)]


def test_front_verdicts_on_made_up_fronts():
    from vmmrt.torch.bench import front
    pts = _made_up()
    v = front.verdict(pts)
    by = {j["label"]: j for j in v["judged"]}
    assert set(by) == {"between", "ahead", "small", "slow", "tie", "noise"}   # failed and wrong take no part
    assert by["between"]["verdict"] == front.BETWEEN and by["between"]["answer"] == "ckpt 2"
    assert by["between"]["ratio"] == pytest.approx(105.0 / 115.0)
    assert by["ahead"]["verdict"] == front.AHEAD and by["ahead"]["beats"] == "eager"
    assert by["small"]["verdict"] == front.ONLY and by["small"]["answer"] is None
    assert by["slow"]["verdict"] == front.DOMINATED and by["slow"]["answer"] == "graphs"
    assert by["tie"]["verdict"] == front.DOMINATED
    assert by["noise"]["verdict"] == front.DOMINATED and by["noise"]["answer"] == "eager"
    assert front.verdict(pts, tie=0.0)["judged"][[j["label"] for j in v["judged"]].index("noise")]["verdict"] \
        == front.AHEAD                          # without the margin it beats eager
    assert (v["levels"], v["ahead"], v["only"], v["dominated"], v["between"]) == (6, 2, 1, 3, 1)
    assert v["line"] == ("vmmrt ahead at 2 of 6 memory levels (1 where no PyTorch option fits); dominated at 3; "
                         "in between at 1")
    assert [p["label"] for p in front.pareto([p for p in pts if p["family"] == "torch"])] == \
        ["ckpt 2", "eager", "graphs"]
    text, _ = front.report(pts, "graphs", "made up")
    assert "verdict (made up): vmmrt ahead at 2 of 6" in text and "FAILED: RuntimeError: boom" in text


def test_front_never_calls_ahead_a_point_holding_more_than_the_option_it_beats():
    """Random fronts: every "ahead" beats an option holding at least as much
    (or none fits), none within its peak is as fast; every "dominated" has
    such an option; nothing else is called ahead."""
    import random
    from vmmrt.torch.bench import front
    rng = random.Random(5)
    for _ in range(300):
        pts = [_pt("t%d" % i, "torch", rng.uniform(50, 150), rng.randint(500, 1500)) for i in range(rng.randint(0, 8))]
        pts += [_pt("v%d" % i, "vmmrt", rng.uniform(50, 150), rng.randint(400, 1600)) for i in range(6)]
        torch_pts = [p for p in pts if p["family"] == "torch"]
        bylabel = {p["label"]: p for p in pts}
        for j in front.verdict(pts)["judged"]:
            v = bylabel[j["label"]]
            within = [t for t in torch_pts if t["peak"] <= v["peak"]]
            tie = 0.99      # faster: by more than 1 %
            if j["verdict"] == front.AHEAD:
                b = bylabel[j["beats"]]
                assert b["peak"] >= v["peak"] and v["step_ms"] < b["step_ms"] * tie
                assert all(v["step_ms"] < t["step_ms"] * tie for t in within)
            elif j["verdict"] == front.ONLY:
                assert not within
            elif j["verdict"] == front.DOMINATED:
                assert any(v["step_ms"] >= t["step_ms"] * tie for t in within)
            else:
                assert j["verdict"] == front.BETWEEN
                assert within and all(v["step_ms"] < t["step_ms"] * tie for t in within)
                assert not any(t["peak"] >= v["peak"] and v["step_ms"] < t["step_ms"] * tie for t in torch_pts)


def test_front_k_values_spread_over_the_layers():
    from vmmrt.torch.bench import frontrun
    assert frontrun.k_values(8, 5) == [1, 3, 4, 6, 8]
    assert frontrun.k_values(16, 5) == [1, 5, 8, 12, 16]
    assert frontrun.k_values(4, 5) == [1, 2, 3, 4] and frontrun.k_values(6, 1) == [6]
    ks = frontrun.k_values(6, 5)
    assert len(ks) == 5 and ks[0] == 1 and ks[-1] == 6


def test_alone_check_compares_within_the_tolerance():
    from types import SimpleNamespace
    from vmmrt.torch.bench import alone
    assert alone.agree({"step_ms": 100.0, "peak": 1000}, {"step_ms": 102.9, "peak": 1029})[0]
    assert not alone.agree({"step_ms": 100.0, "peak": 1000}, {"step_ms": 103.5, "peak": 1000})[0]
    assert not alone.agree({"step_ms": 100.0, "peak": 1000}, {"step_ms": 100.0, "peak": 968})[0]
    assert alone.agree({"step_ms": 100.0, "peak": None}, {"step_ms": 101.0, "peak": None})[0]   # the CPU: time only
    doc = {"fronts": [{"title": "t", "loop": "set_to_none", "shape": {"name": "llama"}, "points": [
        _pt("eager", "torch", 100.0, 1000, option="eager", param=None),
        _pt("ckpt 2", "torch", 120.0, 800, option="ckpt", param=2),
        _pt("vmmrt none", "vmmrt", 90.0, 1000, option="none"),
        _pt("vmmrt recompute all", "vmmrt", 110.0, 700, option="recompute"),
        _pt("vmmrt pingpong", "vmmrt", 300.0, 600, option="pingpong"),
        _pt("budget 900 MiB", "vmmrt", 105.0, 850, option="budget", param=900 << 20)]}]}
    args = SimpleNamespace(microbatches=1, optimizer="foreach", iterations=3, warmup=1, attention="auto",
                           dtype="bf16", device="cuda", smoke=False, check_tolerance=0.03, check_repeats=0)
    asked = []

    def runner(argv):
        asked.append(argv)
        k = argv[argv.index("--option") + 1]
        return {"step_ms": 100.5, "peak": 1000 << 20} if k == "eager" else \
            {"step_ms": 90.2, "peak": 1010 << 20} if k == "vmmrt-none" else {"step_ms": 130.0, "peak": 800 << 20}
    out = alone.check(doc, args, runner)
    # vmmrt's none and recompute all alone too (a budget and ping-pong not:
    # no option of the module's), the parameter of a vmmrt point no --k
    options = [a[a.index("--option") + 1] for a in asked]
    assert options == ["eager", "ckpt", "vmmrt-none", "vmmrt-recompute"]
    assert asked[1][asked[1].index("--k") + 1] == "2" and not any("--k" in a for a in asked[2:])
    assert (out["agree"], out["disagree"]) == (2, 2) and "2 of 4 points" in out["line"]


def test_alone_check_tells_the_options_own_spread_from_a_front_error():
    """A point that differs is run alone again: the front's figures inside
    the spread of those fresh processes (widened by the tolerance) are said
    to be, and not counted as agreeing; outside it, they differ."""
    from types import SimpleNamespace
    from vmmrt.torch.bench import alone
    assert alone.spread_covers({"step_ms": 115.0, "peak": 1000}, [{"step_ms": 100.0, "peak": 990},
                                                                   {"step_ms": 120.0, "peak": 1010}])[0]
    assert not alone.spread_covers({"step_ms": 130.0, "peak": 1000}, [{"step_ms": 100.0, "peak": 1000},
                                                                       {"step_ms": 120.0, "peak": 1000}])[0]
    ok, ts, ps = alone.spread_covers({"step_ms": 100.0, "peak": 1100}, [{"step_ms": 100.0, "peak": 1000},
                                                                         {"step_ms": 101.0, "peak": 1050}])
    assert not ok and abs(ts - 0.01) < 1e-9 and abs(ps - 0.05) < 1e-9
    doc = {"fronts": [{"title": "t", "loop": "set_to_none", "shape": {"name": "launch"}, "points": [
        _pt("eager", "torch", 100.0, 1000, option="eager", param=None),
        _pt("ckpt 2", "torch", 120.0, 800, option="ckpt", param=2)]}]}
    args = SimpleNamespace(microbatches=1, optimizer="foreach", iterations=3, warmup=1, attention="auto",
                           dtype="bf16", device="cuda", smoke=False, check_tolerance=0.03, check_repeats=2)
    eager = iter([110.0, 95.0, 105.0])          # differs once; its own runs span the front's 100

    def runner(argv):
        if argv[argv.index("--option") + 1] == "eager":
            return {"step_ms": next(eager), "peak": 1000 << 20}
        return {"step_ms": 150.0, "peak": 800 << 20}   # always 25 % off: a front error
    out = alone.check(doc, args, runner)
    eager_row, ckpt_row = out["rows"]
    assert not eager_row["agree"] and eager_row["within_spread"] and len(eager_row["alone_runs"]) == 3
    assert not ckpt_row["agree"] and not ckpt_row["within_spread"]
    assert (out["agree"], out["within_spread"], out["disagree"]) == (0, 1, 1)
    assert "1 more lie within the spread of 3 fresh processes" in out["line"]


def test_alone_measures_one_option_on_the_cpu():
    from vmmrt.torch.bench import alone
    got = alone.measure(alone._parser().parse_args(["--shape", "launch", "--smoke", "--device", "cpu", "--option",
                                                     "ckpt", "--k", "2", "--iterations", "1", "--warmup", "0"]))
    assert got["step_ms"] > 0 and got["k"] == 2 and got["peak"] is None
    # --k only where layers are checkpointed, never ignored
    for option in ("eager", "vmmrt-none", "vmmrt-recompute"):
        with pytest.raises(SystemExit, match="--k goes with"):
            alone.measure(alone._parser().parse_args(["--shape", "launch", "--smoke", "--device", "cpu",
                                                      "--option", option, "--k", "2"]))
    # vmmrt's options capture CUDA graphs, as torch's graphed ones: CUDA only
    for option in ("vmmrt-none", "vmmrt-auto", "vmmrt-recompute", "graph"):
        with pytest.raises(SystemExit, match="needs CUDA"):
            alone.measure(alone._parser().parse_args(["--shape", "launch", "--smoke", "--device", "cpu",
                                                      "--option", option]))


def test_alone_makes_vmmrts_options_as_a_user_does(monkeypatch):
    """vmmrt's options alone: vmmrt.torch.make_graphed_callables with the
    library's defaults but the mode, offload="auto", or a hand plan that
    recomputes every layer with the optimizer's memory reserved as the
    front reserves it (AdamW's two states; foreach's temporary), in the
    mode the planner chooses for it as the front's point is made."""
    from types import SimpleNamespace
    import vmmrt.torch as vt
    from vmmrt.torch.bench import alone
    seen = []
    monkeypatch.setattr(vt, "make_graphed_callables", lambda layers, samples, **kw: seen.append(kw) or list(layers))
    layers = [torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)]
    samples = tuple((torch.randn(2, 4),) for _ in layers)
    for option, optimizer in (("vmmrt-none", "fused"), ("vmmrt-auto", "fused"), ("vmmrt-recompute", "foreach"),
                              ("vmmrt-recompute", "fused")):
        alone._vmmrt_callables(option, layers, samples, SimpleNamespace(optimizer=optimizer, loop="persistent"),
                               torch.device("cpu"))
    none, auto, rec_foreach, rec_fused = seen
    assert none == {"mode": "none", "graphs": False} and auto == {"mode": "pingpong", "offload": "auto",
                                                                  "graphs": False}
    pb = 2 * 16 * 4
    for kw, step in ((rec_foreach, pb), (rec_fused, 0)):
        b = kw["memory_budget"]
        # (the planner's mode: ping-pong's banks or mode none's slots for the checkpoints, budget.hand_plan)
        assert kw["mode"] == "auto" and b.layers == ["recompute", "recompute"]
        assert (b.reserve, b.step, b.loop) == (2 * pb, step, "persistent")


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU does")
def test_without_a_gpu_the_bench_runs_the_smoke_shape(capsys):
    a = bench.parse([])
    assert a.device == "cpu" and a.smoke and a.no_gpu_smoke
    assert not bench.parse(["--device", "cpu"]).smoke       # told otherwise
    with pytest.raises(SystemExit):
        bench.parse(["--optimizer", "fused", "--device", "cpu"])
    with pytest.raises(SystemExit):
        bench.parse(["--front", "--shape", "llama,nope"])
    with pytest.raises(SystemExit):
        bench.parse(["--check-alone"])
    with pytest.raises(SystemExit):
        bench.parse(["--front", "--check-alone", "--check-repeats", "-1"])
    assert bench.parse(["--front", "--check-alone", "--check-repeats", "0"]).check_repeats == 0


def test_front_smoke_runs_every_shape_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "front.json"
    argv = ["--front", "--smoke", "--device", "cpu", "--shape", "all", "--front-ks", "2", "--front-budgets", "1",
            "--iterations", "1", "--warmup", "0", "--json", str(out)]
    assert bench.main(argv) == 0
    text = capsys.readouterr().out
    assert "issue" not in text and "{'" not in text             # the user's words, no raw dict
    doc = json.loads(out.read_text())
    fronts = {d["shape"]["name"]: d for d in doc["fronts"]}
    assert set(fronts) == {"llama", "launch", "encoder", "hf", "megatron", "long"}
    for name in ("llama", "launch", "encoder"):
        d = fronts[name]
        labels = [p["label"] for p in d["points"]]
        n = d["shape"]["layers"]
        assert labels[:5] == ["eager", "ckpt 1", "ckpt %d" % n, "save_on_cpu", "vmmrt eager-pingpong"], labels
        assert "vmmrt recompute all" in labels and any(x.startswith("budget ") for x in labels), labels
        assert d["reference"] == "eager" and d["loop"] == "set_to_none"
        for p in d["points"]:
            assert not p.get("error") and p["step_ms"] > 0 and p["grads_ok"], p
            assert 0 < p["launch_us_per_layer_step"] < float("inf"), p
            assert (p["driver_calls_per_step"] is not None) == (p["family"] == "vmmrt"), p
        assert d["verdict"]["line"].startswith("no verdict")        # no peak on the CPU
        assert "verdict (%s, set_to_none loop)" % name in text
    for name in ("hf", "megatron"):     # installed or said why not
        d = fronts[name]
        assert d.get("verdict") or d["error"].startswith("Unavailable"), d
    # the same again from the JSON, without running anything
    from vmmrt.torch.bench import front
    assert front.main([str(out)]) == 0
    again = capsys.readouterr().out
    assert "front: llama, set_to_none loop" in again and "vmmrt recompute all" in again
    assert "us/L/stp" in again and "drv/step" in again
    assert front.main([str(tmp_path / "none.json")]) == 2
    (tmp_path / "other.json").write_text("[1]")
    assert front.main([str(tmp_path / "other.json")]) == 2


def test_front_options_and_graphs_of_checkpointed_layers(monkeypatch):
    """The options on CUDA (without a device: their list), and a graphed
    checkpointed build that torch refuses with the default RNG handling is
    made again without it and says so (make_graphed_callables stood in)."""
    from types import SimpleNamespace
    from vmmrt.torch.bench import frontrun
    labels = [o.label for o in frontrun.options(8, True, [1, 4, 8], ["torch", "vmmrt"])]
    assert labels == ["eager", "ckpt 1", "ckpt 4", "ckpt 8", "graphs", "graphs+ckpt 1", "graphs+ckpt 4",
                      "graphs+ckpt 8", "save_on_cpu", "vmmrt none", "vmmrt auto", "vmmrt pingpong", "vmmrt remap",
                      "vmmrt recompute all"]
    calls = []

    def fake(mods, samples):
        calls.append([getattr(m, "preserve_rng_state", None) for m in mods])
        if any(getattr(m, "preserve_rng_state", False) for m in mods):
            raise RuntimeError("Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture")
        return mods
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    layers = [Tiny(), Tiny(), Tiny()]
    args = SimpleNamespace(optimizer="foreach")
    built = frontrun.build(frontrun.Option("graphs+ckpt 2", "torch", "graph-ckpt", 2), layers,
                           lambda: torch.randn(3, 8, requires_grad=True), args, 0, False)
    assert calls == [[True, True, None], [False, False, None]]
    assert built.note.startswith("preserve_rng_state=False") and "current_seed" in built.note
    x = torch.randn(3, 8, requires_grad=True)
    assert torch.equal(built.run(x), layers[2](layers[1](layers[0](x))))


def test_front_budget_below_the_builds_smallest_is_given_its_smallest(monkeypatch):
    """The lowest budget is chosen from one build's costs; the build that
    runs it may plan a few MiB above: it is given its own smallest plan and
    says so (on the H200 the launch shape's last point failed 4 MiB short)."""
    from types import SimpleNamespace
    import vmmrt.torch as vt
    from vmmrt.torch.bench import frontrun
    asked = []

    left = []

    class _Graphs:
        pass

    loops = []

    def fake(mods, samples, memory_budget=None, **kw):
        asked.append(memory_budget.limit)
        loops.append(memory_budget.loop)
        # a build starts clean: no gradient of an earlier one, whose graphs
        # are gone (a failed build's traceback holds them while it is handled)
        assert not any(p.grad is not None for m in mods for p in m.parameters())
        assert all(r() is None for r in left)
        graphs = _Graphs()
        for m in mods:
            m(torch.randn(3, 8)).sum().backward()        # its warm-up's gradients
        if memory_budget.limit < 3639 << 20:
            left.append(weakref.ref(graphs))
            raise vt.BudgetError("too small", budget=memory_budget.limit, smallest=3639 << 20)
        return mods
    monkeypatch.setattr(vt, "make_graphed_callables", fake)
    monkeypatch.setattr(vt, "offload_of", lambda c: None)
    layers = [Tiny(), Tiny()]
    args = SimpleNamespace(optimizer="foreach", front_budget_mode="auto", lookahead=1, margin=0.9)
    built = frontrun.build(frontrun.Option("budget 3635 MiB", "vmmrt", "budget", 3635 << 20), layers,
                           lambda: torch.randn(3, 8, requires_grad=True), args, 0, False)
    assert asked == [3635 << 20, 3639 << 20]
    assert "3639 MiB" in built.note and "3635 MiB asked" in built.note
    # far below the smallest (more than 2 %): a planner fault, not rounding: it fails
    asked.clear()
    left.clear()
    for m in layers:
        m.zero_grad(set_to_none=True)
    with pytest.raises(vt.BudgetError):
        frontrun.build(frontrun.Option("budget 3000 MiB", "vmmrt", "budget", 3000 << 20), layers,
                       lambda: torch.randn(3, 8, requires_grad=True), args, 0, False)
    # the budget plans for the front's loop: the persistent loop's gradients hold memory all step
    assert set(loops) == {"set_to_none"}
    for m in layers:
        m.zero_grad(set_to_none=True)
    frontrun.build(frontrun.Option("budget 3640 MiB", "vmmrt", "budget", 3640 << 20), layers,
                   lambda: torch.randn(3, 8, requires_grad=True), args, 0, False, loop="persistent")
    assert loops[-1] == "persistent"


def test_alone_check_runs_the_option_in_a_fresh_process():
    """The arguments the check passes are the ones alone takes: one
    checkpointed point of the launch shape, smoke, on the CPU."""
    from types import SimpleNamespace
    from vmmrt.torch.bench import alone
    doc = {"fronts": [{"title": "launch, set_to_none loop", "loop": "set_to_none", "shape": {"name": "launch"},
                       "points": [_pt("ckpt 2", "torch", 5.0, 0, option="ckpt", param=2)]}]}
    doc["fronts"][0]["points"][0]["peak"] = None
    args = SimpleNamespace(microbatches=1, optimizer="foreach", iterations=1, warmup=0, attention="auto",
                           dtype="fp32", device="cpu", smoke=True, check_tolerance=0.03)
    out = alone.check(doc, args)
    (row,) = out["rows"]
    assert "error" not in row, row
    assert row["alone_step_ms"] > 0 and row["alone_peak"] is None and row["peak_ratio"] is None


def test_front_plot_has_a_panel_per_front(tmp_path):
    pytest.importorskip("matplotlib")
    from vmmrt.torch.bench import front
    docs = [{"points": _made_up(), "describe": "made up", "loop": "set_to_none"},
            {"points": [_pt("eager", "torch", 1.0, 1, peak_note="")], "describe": "one", "loop": "persistent"},
            {"points": [], "describe": "no peaks"}]
    path = front.plot_all(docs, str(tmp_path / "f.png"))
    assert path and (tmp_path / "f.png").stat().st_size > 1000
    assert front.plot_all([{"points": []}], str(tmp_path / "g.png")) is None


def test_front_records_either_planners_plan():
    """offload="auto"'s plan (vmmrt auto) predicts no peak itself (its
    whole-step model does: model_fields); memory_budget='s does."""
    from vmmrt.torch import planner
    from vmmrt.torch.bench import frontrun
    auto = planner.Plan([], 50.0, 50.0, 0.9)       # not weighed: a plan made without lightest()
    auto.summary = lambda: "auto's plan"
    assert frontrun.plan_fields(auto) == {"plan": "auto's plan"}
    costs = [budget_cost("l%d" % i) for i in range(2)]
    from vmmrt.torch import budget
    p = budget.evaluate(costs, ["recompute", "keep"], "pingpong", 1, static_bytes=10, d2h_gbps=50.0)
    got = frontrun.plan_fields(p)
    assert got["predicted_peak_bytes"] == p.peak_bytes and got["plan"] == p.summary()
    assert frontrun.plan_fields(None) == {}


def test_a_plan_without_a_budget_is_predicted_with_the_fronts_optimizer_memory():
    """mode none's and offload="auto"'s points: the plan's whole-step model
    told the optimizer's states and temporaries as the budget points are,
    in the loop the front runs; a budget plan's own prediction is left as
    plan_fields reads it."""
    from vmmrt.torch.bench import frontrun
    told = []

    class Model:
        def peak(self, reserve, step, loop):
            told.append((reserve, step, loop))
            return 1000 + reserve + step
    off = types.SimpleNamespace(plan=None, step_model=Model())
    assert frontrun.model_fields(off, 64, 32, "persistent") == {"predicted_peak_bytes": 1096}
    assert told == [(64, 32, "persistent")]
    off.plan = types.SimpleNamespace(peak_bytes=5)
    assert frontrun.model_fields(off, 64, 32, "persistent") == {}
    off.plan, off.step_model = None, None
    assert frontrun.model_fields(off, 64, 32, "persistent") == {} and frontrun.model_fields(None, 1, 1, "x") == {}
    # a point run alone in a fresh process: its prediction, made there, comes back with its figures
    got = frontrun.alone_point({"label": "vmmrt none", "family": "vmmrt", "option": "none"},
                               types.SimpleNamespace(microbatches=1, optimizer="foreach", iterations=3, warmup=1,
                                                     attention="auto", dtype="bf16", device="cuda", smoke=False),
                               "launch", "persistent",
                               lambda argv: {"step_ms": 5.0, "peak": 1, "peak_abs": 2, "predicted_peak_bytes": 3})
    assert got["predicted_peak_bytes"] == 3


def test_alone_predicts_a_vmmrt_options_whole_step_as_the_front_does():
    """bench/alone.py's vmmrt options: the plan's whole step told AdamW's
    states (twice the parameters) and foreach's temporaries (once), as
    the front's model_fields and budget points tell them."""
    import vmmrt.torch as vt
    from vmmrt.torch.bench import alone
    layers = [torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
              for _ in range(3)]
    params = [p for m in layers for p in m.parameters()]
    pb = sum(p.numel() * p.element_size() for p in params)
    mods = vt.make_graphed_callables(tuple(layers), tuple((torch.randn(4, 32, requires_grad=True),) for _ in layers),
                                     graphs=False, mode="none")
    off = vt.offload_of(mods[0])
    try:
        for opt, step in (("foreach", pb), ("fused", 0)):
            a = types.SimpleNamespace(optimizer=opt, loop="persistent")
            assert alone._predicted(mods, params, a) == off.step_model.peak(2 * pb, step, "persistent")
        assert alone._predicted(mods, params, types.SimpleNamespace(optimizer="fused", loop="set_to_none")) \
            == off.step_model.peak(2 * pb, 0, "set_to_none")
        off.step_model = None
        assert alone._predicted(mods, params, a) is None
    finally:
        off.close()


def budget_cost(name):
    from vmmrt.torch.budget import LayerCost
    return LayerCost(name, 1.0, 2.0, [1 << 20, 1 << 19], fixed=1 << 10)


@pytest.mark.parametrize("argv", [["--option", "ckpt"], ["--option", "ckpt", "--k", "9"], ["--option", "eager",
                                                                                          "--iterations", "0"],
                                  ["--option", "eager", "--shape", "nope"]])
def test_alone_refuses_what_it_cannot_run(argv):
    from vmmrt.torch.bench import alone
    with pytest.raises(SystemExit):
        alone.measure(alone._parser().parse_args(["--smoke", "--device", "cpu"] + argv))


def test_front_points_keep_their_gradient_words_in_the_json(tmp_path):
    """report.dump drops the tables' "grads" (tensors): the front's words
    travel under another key and a re-rendered table shows them."""
    import json
    from vmmrt.torch.bench import front, report
    pt = _pt("eager", "torch", 5.0, 1 << 30)
    pt["grads_ok"], pt["grads_text"] = True, "bitwise"
    path = tmp_path / "run.json"
    report.dump(str(path), {"fronts": [{"title": "t", "points": [pt]}]})
    back = json.loads(path.read_text())["fronts"][0]["points"][0]
    assert back["grads_text"] == "bitwise"
    text, _ = front.report([back], "eager", "t")
    assert "bitwise" in text


def test_front_runs_graphs_of_checkpointed_megatron_layers_alone(monkeypatch):
    """torch's graphs of checkpointed Megatron layers (an option whose failed
    capture leaves the process unfit for any later point) run alone in a
    fresh process: their figures, or their error, come from there, and the
    front goes on; other options and other layers run in the process."""
    from types import SimpleNamespace
    from vmmrt.torch.bench import frontrun, loops, shapes

    class Tracked(torch.nn.Module):
        rng_tracked = True
    gc_opt = frontrun.Option("graphs+ckpt 1", "torch", "graph-ckpt", 1)
    assert frontrun.isolated(gc_opt, [Tracked()])
    assert not frontrun.isolated(gc_opt, [Tiny()])
    assert frontrun.isolated(frontrun.Option("graphs", "torch", "graph"), [Tracked()])
    assert not frontrun.isolated(frontrun.Option("graphs", "torch", "graph"), [Tiny()])
    assert not frontrun.isolated(frontrun.Option("vmmrt none", "vmmrt", "none"), [Tracked()])
    # the set_to_none loop's reference (graphs) run alone keeps no gradients: eager is the reference
    opts = frontrun.options(2, True, [1], ["torch", "vmmrt"])
    assert frontrun.reference_kind("graph", opts, [Tiny()]) == "graph"
    assert frontrun.reference_kind("graph", opts, [Tracked()]) == "eager"
    assert frontrun.reference_kind("graph", [o for o in opts if o.kind != "eager"], [Tracked()]) is None
    args = SimpleNamespace(microbatches=1, optimizer="foreach", iterations=3, warmup=1, attention="auto",
                           dtype="bf16", device="cuda", smoke=False)
    asked = []

    def ok(argv):
        asked.append(argv)
        return {"step_ms": 55.0, "peak": 12 << 30, "peak_abs": 13 << 30, "iterations": 3}

    def fails(argv):
        raise RuntimeError("exit status 1: operation would make the legacy stream depend on a capturing stream")
    pt = {"label": gc_opt.label, "family": "torch", "option": "graph-ckpt", "param": 1}
    got = frontrun.alone_point(pt, args, "megatron", "set_to_none", ok)
    assert got["step_ms"] == 55.0 and got["peak"] == 12 << 30 and "fresh process" in got["note"]
    assert asked[0][asked[0].index("--option") + 1] == "graph-ckpt" and "--k" in asked[0]
    bad = frontrun.alone_point(pt, args, "megatron", "set_to_none", fails)
    assert "legacy stream" in bad["error"] and bad["peak"] is None
    # the front's own point: routed there, nothing built in the process
    monkeypatch.setattr(frontrun, "alone_point", lambda pt, a, shape, loop: {"step_ms": 55.0, "peak": 1 << 30,
                                                                             "build_s": float("nan")})
    monkeypatch.setattr(frontrun, "build", lambda *a, **k: pytest.fail("built in the process"))
    f = frontrun.Front(args, shapes.SHAPES["launch"].smoke("cpu"), loops.Loop("set_to_none"),
                       torch.device("cpu"), torch.float32)
    f.on_point = lambda doc: None
    bar = SimpleNamespace(n=1, start=lambda label: None, end=lambda line: None)
    f._point(gc_opt, [Tracked()], None, None, None, None, bar, False)
    assert f.points == [dict(pt, step_ms=55.0, peak=1 << 30, build_s=f.points[0]["build_s"])]


def test_front_only_runs_the_options_named(tmp_path, capsys):
    out = tmp_path / "front.json"
    argv = ["--front", "--smoke", "--device", "cpu", "--shape", "launch", "--front-ks", "2", "--front-budgets", "1",
            "--iterations", "1", "--warmup", "0", "--front-only", "eager,vmmrt eager-pingpong", "--json", str(out)]
    assert bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert [p["label"] for p in doc["fronts"][0]["points"]] == ["eager", "vmmrt eager-pingpong"]   # no budgets
    # a vmmrt plan made without a budget predicts the whole step by its model (Offload.step_model)
    eager, mine = doc["fronts"][0]["points"]
    assert "predicted_peak_bytes" not in eager and mine["predicted_peak_bytes"] > doc["fronts"][0]["reserve_bytes"]
    from vmmrt.torch.bench import frontrun
    with pytest.raises(ValueError, match="no option 'graphs'"):
        frontrun.only(frontrun.options(4, False, [1], ["torch", "vmmrt"]), "eager,graphs")
    with pytest.raises(SystemExit):
        bench.parse(["--front-only", "eager"])          # without --front: refused, not ignored
    assert "--front-only goes with --front" in capsys.readouterr().err


def test_front_budgets_at_pytorch_options_peaks(capsys):
    """--front-budgets-at puts the planner's budget points at the measured
    peaks of the PyTorch options named (the planner against each at its own
    memory level), not spread from graphs' peak down; an option without a
    peak gets none, a level no plan fits is said, not measured."""
    from vmmrt.torch import budget
    from vmmrt.torch.bench import frontrun
    MiB = 1 << 20
    costs = [budget.LayerCost("l%d" % i, 1.0, 2.0, [30 * MiB, 20 * MiB], fixed=2 * MiB, fwd_work=8 * MiB,
                              bwd_work=16 * MiB) for i in range(4)]
    plan = budget.evaluate(costs, ["recompute"] * 4, "pingpong", 1, static_bytes=1000 * MiB)
    f = frontrun.Front.__new__(frontrun.Front)
    f.args = types.SimpleNamespace(front_budget_mode="pingpong", lookahead=1)
    f.doc, f.reserve = {}, 0
    f.plan_of_recompute = (plan, plan.peak_bytes)      # measured as predicted: no calibration
    f.points = [{"label": "graphs", "option": "graph", "peak_abs": 1300 * MiB},
                {"label": "ckpt 4", "option": "ckpt", "peak_abs": 1120 * MiB},
                {"label": "graphs+ckpt 4", "option": "graph-ckpt", "peak_abs": 1200 * MiB},
                {"label": "eager", "option": "eager", "peak_abs": None},
                {"label": "save_on_cpu", "option": "save_on_cpu", "peak_abs": 900 * MiB}]
    opts = f._budget_options(4, 4, ["ckpt 4", "graphs+ckpt 4", "eager", "save_on_cpu"])
    assert [(o.label, o.param) for o in opts] == [("budget 1120 MiB (ckpt 4's peak)", 1120 * MiB),
                                                  ("budget 1200 MiB (graphs+ckpt 4's peak)", 1200 * MiB)]
    out = capsys.readouterr().out
    assert "eager: no peak measured; no budget at it" in out
    m = re.search(r"memory_budget=900 MiB \(save_on_cpu's peak\): no plan fits \(the smallest plan predicts "
                  r"(\d+) MiB, (\d+) over\); not measured", out)
    assert m and int(m.group(1)) == round(f.doc["smallest_plan_bytes"] / MiB)
    assert int(m.group(2)) == int(m.group(1)) - 900
    assert f.doc["budgets"] == [1120 * MiB, 1200 * MiB, 900 * MiB]
    assert f.doc["budgets_at"] == ["ckpt 4", "graphs+ckpt 4", "save_on_cpu"]
    assert "budgets_missed" not in f.doc       # recompute all measured above 900 MiB: memory, not the model
    # a level the model misses while recompute all measured within it: said, and kept in the JSON
    f.doc, f.reserve = {}, 0
    f.plan_of_recompute = (plan, 880 * MiB)    # measured under its prediction (no calibration then)
    f._budget_options(4, 4, ["save_on_cpu"])
    out = capsys.readouterr().out
    assert re.search(r"memory_budget=900 MiB \(save_on_cpu's peak\): no plan fits \(the smallest plan predicts "
                     r"\d+ MiB, \d+ over; measured as recompute all it is 880 MiB, within it: the model's "
                     r"\+\d+\.\d % missed it\); not measured", out), out
    assert f.doc["budgets_missed"] == [[900 * MiB, 880 * MiB, f.doc["smallest_plan_bytes"]]]
    # without: spread from graphs' peak down to the smallest plan
    f.doc, f.reserve = {}, 0
    spread = f._budget_options(4, 2)
    assert spread[0].param == min(1300 * MiB, budget.evaluate(costs, ["keep"] * 4, "pingpong", 1,
                                                            **frontrun.sweep._inputs(plan)).peak_bytes)
    assert all("peak)" not in o.label for o in spread)


def test_front_budgets_at_is_checked_before_anything_runs(capsys):
    from vmmrt.torch.bench import frontrun
    assert frontrun.budget_levels("ckpt 16, graphs+ckpt 16") == ["ckpt 16", "graphs+ckpt 16"]
    for bad, why in [("vmmrt none", "PyTorch's options only"), ("", "one PyTorch option's label or more")]:
        with pytest.raises(ValueError, match=why):
            frontrun.budget_levels(bad)
    with pytest.raises(ValueError, match="needs both families"):
        frontrun.budget_levels("ckpt 16", families=["torch"])
    with pytest.raises(ValueError, match="it needs 'vmmrt recompute all' among the options"):
        frontrun.budget_levels("ckpt 16", "eager,ckpt 16")
    assert frontrun.budget_levels("ckpt 16", "ckpt 16,vmmrt recompute all") == ["ckpt 16"]
    with pytest.raises(SystemExit):
        bench.parse(["--front-budgets-at", "ckpt 16"])      # without --front: refused
    assert "--front-budgets-at goes with --front" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse(["--front", "--front-budgets-at", "ckpt 16", "--front-only", "ckpt 16"])
    assert "vmmrt recompute all" in capsys.readouterr().err


def test_front_budgets_at_runs_on_the_cpu(tmp_path, capsys):
    """On the CPU no peak is measured: the run goes on and says there is no
    budget at it; a label that is no option of the run is an error."""
    out = tmp_path / "front.json"
    argv = ["--front", "--smoke", "--device", "cpu", "--shape", "launch", "--front-ks", "1", "--iterations", "1",
            "--warmup", "0", "--front-only", "eager,ckpt 4,vmmrt recompute all", "--front-budgets-at", "ckpt 4",
            "--json", str(out)]
    assert bench.main(argv) == 0
    assert "ckpt 4: no peak measured; no budget at it" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert [p["label"] for p in doc["fronts"][0]["points"]] == ["eager", "ckpt 4", "vmmrt recompute all"]
    bad = ["--front", "--smoke", "--device", "cpu", "--shape", "launch", "--front-ks", "1", "--iterations", "1",
           "--warmup", "0", "--front-budgets-at", "ckpt 3"]      # no such option in this run: the front fails, said
    assert bench.main(bad) != 0
    assert "--front-budgets-at: no option 'ckpt 3' here" in capsys.readouterr().out
    argv[-3] = "ckpt 3"             # --front-budgets-at's, not in --front-only: refused before anything runs
    with pytest.raises(SystemExit):
        bench.main(argv)
    assert "it needs 'ckpt 3' among the options" in capsys.readouterr().err


def test_teardown_drops_the_samples_gradients():
    """The last step's input gradient (the first layer's, in the graphs' pool
    or a gradient slot) would hold that memory under the next build's
    static memory: teardown lets it go with the build."""
    x = torch.randn(2, 3, requires_grad=True)
    x.sum().backward()

    class Built:
        offload = run = opt = None
    modes.teardown(Built(), [torch.nn.Linear(3, 3)], inputs=[x])
    assert x.grad is None


def test_front_point_line_shows_the_pages_and_the_graphs_pool():
    """A point on the memory plan's pages says how much they hold and how
    much of it is the graphs' pool, where a peak above eager's comes from."""
    from vmmrt.torch.bench import frontrun
    f = frontrun.Front.__new__(frontrun.Front)
    f.loop = loops.Loop("set_to_none")
    f.points = []
    MiB = 1 << 20
    pt = {"label": "vmmrt none", "build_s": 1.0, "step_ms": 2.0, "peak": 3 * MiB,
          "pages": {"plan_bytes": 8248 * MiB, "graph_pool_bytes": 806 * MiB, "plan_conflicts": 0}}
    line = f._line(1, 1, pt)
    assert "pages 8248 MiB (graphs' pool 806)" in line and "conflicts" not in line
    pt["pages"]["plan_conflicts"] = 2
    assert "(graphs' pool 806, 2 conflicts)" in f._line(1, 1, pt)
    # what sizes the pages: the busiest use, by kind of slot, the largest first
    pt["pages"]["busiest"] = {"use": "layer0's backward", "bytes": {"grads": 1672 * MiB, "pool": 9480 * MiB,
                                                                    "io": 512 * MiB}}
    assert "the pages' busiest use, layer0's backward: pool 9480, grads 1672, io 512 MiB" in f._line(1, 1, pt)
    assert "could lie on resident bytes" not in f._line(1, 1, pt)
    # of that backward's gradients, those that could lie on bytes it has read
    # (vmmrt.torch.gradshare), in the loop whose gradients are on the pages
    pt["pages"]["busiest_grad_share"] = 120 * MiB
    pt["pages"]["busiest_grad_share_bound"] = 306 * MiB
    assert "; of its gradients, 120 MiB could lie on resident bytes its backward has read, 306 with its " \
           "temporaries placed around them" in f._line(1, 1, pt)
    # and what the memory plan maps so (memplan.share_grads)
    assert "the plan maps 0 MiB of the step's gradients so" in f._line(1, 1, pt)
    pt["pages"]["plan_grad_share_bytes"] = 700 * MiB
    assert "the plan maps 700 MiB of the step's gradients so" in f._line(1, 1, pt)
    f.loop = loops.Loop("persistent")
    assert "could lie on resident bytes" not in f._line(1, 1, pt)
    f.loop = loops.Loop("set_to_none")
    pt["pages"] = {"plan_bytes": 0, "graph_pool_bytes": 0, "plan_conflicts": 0}     # no plan: nothing said
    assert "pages" not in f._line(1, 1, pt)


def test_front_point_line_checks_the_predicted_whole_step_peak():
    """A point whose plan predicts the step's peak (memory_budget=, recompute
    all) says it beside the measured one, and whether it is off by more than
    the 2 % the memory plan and the planner aim at; a point whose plan
    predicts none says nothing of it."""
    from vmmrt.torch.bench import frontrun
    f = frontrun.Front.__new__(frontrun.Front)
    f.loop = loops.Loop("set_to_none")
    f.points = []
    MiB = 1 << 20
    pt = {"label": "vmmrt recompute all", "option": "recompute", "build_s": 1.0, "step_ms": 2.0, "peak": 900 * MiB,
          "peak_abs": 1000 * MiB, "predicted_peak_bytes": 990 * MiB}
    line = f._line(1, 1, pt)
    assert "predicted peak 990 MiB (-1.0 % of the measured, 1000 MiB in all)" in line
    pt["predicted_peak_bytes"] = 970 * MiB
    assert "predicted peak 970 MiB (-3.0 % of the measured, 1000 MiB in all, off by more than 2 %)" \
        in f._line(1, 1, pt)
    pt["predicted_peak_bytes"] = 1030 * MiB
    assert "(+3.0 % of the measured, 1000 MiB in all, off by more than 2 %)" in f._line(1, 1, pt)
    pt["option"] = "budget"
    assert "recompute all's excess reserved" in f._line(1, 1, pt)
    del pt["predicted_peak_bytes"]
    assert "predicted" not in f._line(1, 1, pt)
    pt["predicted_peak_bytes"], pt["peak_abs"] = 990 * MiB, None     # nothing sampled: nothing compared
    assert "predicted" not in f._line(1, 1, pt)


def test_front_point_line_shows_the_memory_by_owner():
    """A point's line says where its memory is between forward and backward
    (graphs' pool, caching allocator, libvmmrt, other): the part in which
    a peak above another point's lies."""
    from vmmrt.torch.bench import frontrun
    f = frontrun.Front.__new__(frontrun.Front)
    f.loop = loops.Loop("set_to_none")
    f.points = []
    MiB = 1 << 20
    pt = {"label": "vmmrt none", "build_s": 1.0, "step_ms": 2.0, "peak": 3 * MiB,
          "memory": {"used": 18522 * MiB, "total": 80000 * MiB, "graph_pool": 0, "graph_pool_free": 0,
                     "allocator": 10540 * MiB, "vmmrt": 0, "slots": 7658 * MiB, "other": 324 * MiB}}
    line = f._line(1, 1, pt)
    assert line.splitlines()[1].strip() == ("between forward and backward: used 18522 MiB = graph pool 0 + caching "
                                            "allocator 10540 + libvmmrt 0 + libvmmrt's other slots 7658 + other 324")
    # what the process held before the point's build (the model, the inputs,
    # what earlier points left): the same at every point unless one leaves some
    pt["before_build"] = 14124 * MiB
    assert f._line(1, 1, pt).splitlines()[1].endswith("other 324; before its build 14124 MiB over the memory "
                                                      "before the model")
    del pt["memory"]
    assert len(f._line(1, 1, pt).splitlines()) == 1
    # the part of the step whose reading was the peak, and PyTorch's allocator's share then
    pt["peak_where"] = {"phase": "backward", "allocator": 2 * MiB}
    assert "peak 3 MiB over the memory before the model (in its backward, PyTorch's allocator holding 2)" in \
        f._line(1, 1, pt)
    # a peak that was the step's first reading: every cache full before the
    # step, the phase of that reading says nothing (the H100's fronts of
    # 2026-12-06 all read "in its zeroing")
    pt["peak_at_start"] = frontrun._peak_at_start({"peak": 3 * MiB, "start": 3 * MiB})
    assert "peak 3 MiB over the memory before the model (held from the step's start, PyTorch's allocator " \
        "holding 2)" in f._line(1, 1, pt)
    assert not frontrun._peak_at_start({"peak": 3 * MiB, "start": 2 * MiB}) and not frontrun._peak_at_start(None)
    # saved bytes computed elsewhere and copied into their slots each step
    # (an op without an out= overload): said with the largest reasons
    assert "copied into" not in f._line(1, 1, pt)

    class Off:
        def __init__(self, p):
            self.p = p

        def placement(self):
            return self.p
    assert frontrun.placement_fields(Off({"placed": 5 * MiB, "copied": 0, "copy": 0, "why": {}})) == {}
    pt.update(frontrun.placement_fields(Off({"placed": 5 * MiB, "copied": 64 * MiB, "copy": 2 * MiB, "resident": 0,
                                             "pool": 0, "why": {"aten._safe_softmax has no out= variant": 64 * MiB,
                                                                "end of forward": 2 * MiB}})))
    assert "copied into their slots 66 MiB a step (aten._safe_softmax has no out= variant: 64 MiB; end of " \
        "forward: 2 MiB)" in f._line(1, 1, pt)


def test_the_sampler_keeps_where_the_step_was_at_its_peak():
    """where() is asked at each new peak, right after its reading (the
    readings here are a fixed sequence: no timing)."""
    seq = [10, 30, 20, 50, 40, 50, 5]
    k = [0]

    def read():
        v = seq[k[0]] if k[0] < len(seq) else 0
        k[0] += 1
        return v
    s = memory.PeakSampler(read=read, interval_s=0, where=lambda: "reading %d" % k[0])
    s.start()
    while k[0] < len(seq) + 1:
        time.sleep(0.001)
    s.stop()
    assert s.peak == 50 and s.peak_where == "reading 4"     # the first 50: a tie is no new peak
    assert s.as_dict()["where"] == "reading 4"


def test_the_measured_step_names_its_parts_for_the_peak():
    marks, between, where = modes._phases(torch.device("cpu"))
    seen = [where()["phase"]]
    for m in marks[:2]:
        m()
        seen.append(where()["phase"])
    between()
    seen.append(where()["phase"])
    for m in marks[2:]:
        m()
        seen.append(where()["phase"])
    assert seen == ["zeroing", "zeroing", "forward", "backward", "optimizer step", "end of the step"]
    assert where()["allocator"] is None


def test_the_persistent_loop_makes_grads_first_for_torchs_graphed_callables():
    # torch.cuda.make_graphed_callables's backward hands AccumulateGrad a
    # static buffer's detach, which it keeps as .grad where there is none;
    # the next replay rewrites the buffer, and adding it in doubles the
    # gradient. On the CPU, a Function that does the same.
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    buf = torch.empty(4)

    class Static(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x)
            return x * w

        @staticmethod
        def backward(ctx, gy):
            x, = ctx.saved_tensors
            buf.copy_(gy * x)               # the replay's static gradient output
            return None, buf.detach()

    x = torch.full((4,), 3.0)
    gy = torch.ones(4)
    opt = torch.optim.SGD([w], lr=0.0)

    def grads(loop):
        w.grad = None
        for _ in range(3):
            loop.step(lambda v: Static.apply(v, w), opt, [x], [gy])
        return w.grad.clone()

    assert torch.equal(grads(loops.Loop("set_to_none")), torch.full((4,), 3.0))
    assert torch.equal(grads(loops.Loop("persistent")), torch.full((4,), 6.0))   # what the module's words say
    made = loops.Loop("persistent").made_first()
    assert made.grads_first and torch.equal(grads(made), torch.full((4,), 3.0))
    assert loops.Loop("set_to_none").made_first().grads_first is False
    with pytest.raises(ValueError, match="grads_first"):
        loops.Loop("set_to_none", grads_first=True)


def test_a_budget_plans_inputs_predict_it_again():
    """The sweep and the front plan other budgets from a plan's own inputs
    (sweep._inputs): given them, the same choices predict the same time and
    peak, the copies' contention included."""
    from vmmrt.torch import budget
    from vmmrt.torch.bench import sweep
    costs = [budget.LayerCost("l%d" % i, 1.5, 3.0, [100_000_000], grads=10) for i in range(6)]
    choices = ["offload"] * 4 + ["keep"] * 2
    p = budget.evaluate(costs, choices, "pingpong", 1, static_bytes=1000, d2h_gbps=100, margin=0.9,
                        contention=(0.05, 0.02), step_bytes=7, persistent=True)
    assert p.copy_ms > 0
    q = budget.evaluate(costs, choices, p.mode, p.lookahead, **sweep._inputs(p))
    assert (q.predicted_ms, q.peak_bytes, q.contention) == (p.predicted_ms, p.peak_bytes, p.contention)


def test_front_runs_the_graph_free_options_before_any_graph():
    """The process's first capture keeps ~70 MiB for good: eager, ckpt k and
    save_on_cpu run before the first graphed point (the reference next), so
    none of them is charged it; on the CPU eager, the reference, leads."""
    from vmmrt.torch.bench import frontrun
    opts = frontrun.options(4, True, [1, 4], ["torch", "vmmrt"])
    got = [o.label for o in frontrun.order(opts, "graph")]
    assert got[:5] == ["eager", "ckpt 1", "ckpt 4", "save_on_cpu", "graphs"]
    assert got[5:] == ["graphs+ckpt 1", "graphs+ckpt 4", "vmmrt none", "vmmrt auto", "vmmrt pingpong",
                       "vmmrt remap", "vmmrt recompute all"]
    got = [o.label for o in frontrun.order(opts, "eager")]
    assert got[0] == "eager" and got.index("save_on_cpu") < got.index("graphs")
    cpu = [o.label for o in frontrun.order(frontrun.options(4, False, [2], ["torch", "vmmrt"]), "eager")]
    assert cpu == ["eager", "ckpt 2", "save_on_cpu", "vmmrt eager-pingpong", "vmmrt eager-remap",
                   "vmmrt recompute all"]


def test_front_compares_points_run_before_the_reference_once_it_has_run(monkeypatch):
    """A point measured before the reference keeps its gradients until the
    reference's are there, then is judged against them (a wrong one too);
    where the reference fails, they say they were not compared."""
    from types import SimpleNamespace
    from vmmrt.torch.bench import frontrun
    grads = {"eager": [torch.ones(3)], "ckpt 1": [torch.full((3,), 2.0)], "graphs": [torch.ones(3)]}
    monkeypatch.setattr(frontrun, "build", lambda o, *a, **k: SimpleNamespace(label=o.label, offload=None))
    row = {"step_ms": 1.0, "step_ms_min": 1.0, "step_ms_max": 1.0, "iterations": 1, "fwd_bwd_ms": 1.0,
           "opt_ms": 0.0, "build_s": 0.0}

    def measure(built, *a):
        if built.label == "broken":
            raise RuntimeError("capture failed")
        return row, [g.clone() for g in grads[built.label]]
    monkeypatch.setattr(frontrun.modes, "measure", measure)
    monkeypatch.setattr(frontrun.modes, "teardown", lambda *a, **k: None)

    def front(ref_label):
        f = frontrun.Front.__new__(frontrun.Front)
        f.args = SimpleNamespace(attention="auto")
        f.cuda, f.dev, f.base, f.points, f.doc = False, torch.device("cpu"), None, [], {}
        f.reserve, f.step, f.loop = 0, 0, SimpleNamespace(name="set_to_none")
        f.on_point = lambda doc: None
        f.ref, f.spread, f.plan_of_recompute = None, None, None
        f.ref_kind, f.ref_done, f.pending = "graph", False, []
        bar = SimpleNamespace(n=3, start=lambda label: None, end=lambda line: None)
        for label, kind in (("eager", "eager"), ("ckpt 1", "ckpt"), (ref_label, "graph")):
            f._point(frontrun.Option(label, "torch", kind), [], None, None, None, None, bar, kind == "graph")
        f._compare_pending()
        return {p["label"]: p for p in f.points}
    pts = front("graphs")
    assert pts["eager"]["grads_ok"] is True and pts["eager"]["grad_bitwise"] is True
    assert pts["ckpt 1"]["grads_ok"] is False and pts["ckpt 1"]["grads_text"].startswith("WRONG")
    assert pts["graphs"]["grads_text"].startswith("reference")
    pts = front("broken")
    assert "error" in pts["broken"] and "grads_ok" not in pts["eager"]
    # where it failed comes with it (a device run sends back its JSON)
    assert "in measure" in pts["broken"]["traceback"] and "capture failed" in pts["broken"]["traceback"]
    assert pts["eager"]["grads_text"] == "not compared (the reference did not run)"


def test_auto_loop_tells_the_planner_the_loop_it_runs():
    told = bench.parse(["--auto-loop"])
    plain = bench.parse([])
    assert modes._vmmrt_kwargs("planner", told, "persistent")["loop"] == "persistent"
    assert "loop" not in modes._vmmrt_kwargs("planner", plain, "persistent")
    assert "loop" not in modes._vmmrt_kwargs("none", told, "persistent")     # (auto's alone)
    assert "loop" not in modes._vmmrt_kwargs("planner", told)


def test_the_new_arguments_are_refused_loudly():
    layers, xs, gys, _ = _setup(1)
    with pytest.raises(ValueError):
        loops.warm_process(layers, xs[0], gys[0], "adam")
    with pytest.raises(TypeError):
        memory.PeakSampler(read=lambda: 1, where="phase")


def test_a_failing_where_leaves_the_sampler_its_peak():
    seq = [1, 3, 2]
    k = [0]

    def read():
        k[0] += 1
        return seq[k[0] - 1] if k[0] <= len(seq) else 0

    def where():
        raise RuntimeError("no device")
    s = memory.PeakSampler(read=read, interval_s=0, where=where)
    s.start()
    while k[0] < len(seq) + 1:
        time.sleep(0.001)
    s.stop()
    assert s.peak == 3 and "RuntimeError: no device" in s.peak_where["error"]


def test_one_time_stages_count_what_each_leaves():
    """--one-time's accounting (bench/onetime.py) on a made-up device: each
    stage's build, steps and what it leaves, against the reading before it,
    with what an earlier stage left not charged to a later one."""
    from vmmrt.torch.bench import onetime
    MB = 1 << 20
    dev = {"used": 100 * MB, "cache": 0, "settles": 0}

    def used():
        return dev["used"] + dev["cache"]

    def settle():
        dev["settles"] += 1
        dev["cache"] = 0            # PyTorch's caches emptied: gone from the reading

    def take(n, cached=0):
        dev["used"] += n * MB
        dev["cache"] += cached * MB

    stages = [
        # builds 40, its steps 10 more (and 5 of cache that settling gives back),
        # and tearing down gives 42 back: 8 left for good
        onetime.Stage("graphs", lambda: take(40), lambda b: take(5, cached=5), lambda b: take(-42), 2),
        # leaves nothing
        onetime.Stage("empty", lambda: take(3), None, lambda b: take(-3)),
        # built twice: the first leaves 6, the second 0
        onetime.Stage("again", lambda: take(6), None, None),
        onetime.Stage("again2", lambda: take(6), None, lambda b: take(-6)),
    ]
    rows = onetime.measure(stages, used, settle)
    got = [(r["stage"], r["build"] // MB, r["steps"] // MB, r["left"] // MB, r["left_total"] // MB) for r in rows]
    assert got == [("graphs", 40, 10, 8, 8), ("empty", 3, 0, 0, 8), ("again", 6, 0, 6, 14), ("again2", 6, 0, 0, 14)]
    assert dev["settles"] >= 1 + 3 * len(stages)
    text = "\n".join(onetime.lines(rows))
    assert "graphs" in text and "left in all" in text
    # each stage named as it starts, before its build: a fault inside one
    # (the H200's, session 70) says which
    said = []

    def build():
        said.append("built")
    onetime.measure([onetime.Stage("a", build), onetime.Stage("b", build)], used, settle, said.append)
    assert said == ["[1/2] a: started", "built", "[2/2] b: started", "built"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU does")
def test_one_time_is_a_run_of_its_own_on_cuda():
    with pytest.raises(SystemExit):
        bench.parse(["--one-time", "--device", "cpu"])
    with pytest.raises(SystemExit):
        bench.parse(["--one-time", "--front"])
    with pytest.raises(SystemExit):
        bench.parse(["--one-time", "--launch-ab", "4"])


def test_fresh_loops_runs_each_later_loop_in_a_process_of_its_own(tmp_path, capfd):
    """--fresh-loops: the persistent loop's front comes from a fresh process
    given the same arguments for that shape and loop, its front in the
    JSON beside the first loop's; a process that brings none back leaves a
    front that says so, and the run fails."""
    from vmmrt.torch.bench import frontrun
    assert frontrun.loop_argv(["--front", "--loop", "both", "--shape=all", "--json", "x.json", "--fresh-loops",
                               "--iterations", "1", "--loop=both"], "launch", "persistent", "y.json") == [
        "--front", "--iterations", "1", "--shape", "launch", "--loop", "persistent", "--json", "y.json"]
    out = tmp_path / "front.json"
    argv = ["--front", "--smoke", "--device", "cpu", "--shape", "launch", "--front-ks", "1", "--front-budgets", "0",
            "--iterations", "1", "--warmup", "0", "--front-only", "eager,vmmrt eager-pingpong", "--loop", "both",
            "--fresh-loops", "--json", str(out)]
    assert bench.main(argv) == 0
    text = capfd.readouterr().out
    assert "persistent loop, in a fresh process (--fresh-loops)" in text
    doc = json.loads(out.read_text())
    assert [d["loop"] for d in doc["fronts"]] == ["set_to_none", "persistent"]
    assert all([p["label"] for p in d["points"]] == ["eager", "vmmrt eager-pingpong"] for d in doc["fronts"])
    assert text.count("verdict (launch") >= 3      # the child's own summary line, then both of this run's
    # a fresh process that fails: a front that says so, and the run's status says it too
    args = bench.parse(argv)
    args.argv = argv
    docs = []
    frontrun.fresh_loop(args, frontrun.shapes.SHAPES["launch"], "persistent", docs, runner=lambda av: 3)
    assert docs[0]["error"] == "its fresh process (exit status 3) brought no front back" and not docs[0]["points"]
    # without a front, or with one loop: refused, not ignored
    for bad in (["--fresh-loops"], ["--front", "--loop", "persistent", "--fresh-loops"], ["--front", "--fresh-loops"]):
        with pytest.raises(SystemExit):
            bench.parse(bad)
        assert "--fresh-loops goes with --front and --loop both" in capfd.readouterr().err


def test_poolcheck_tells_a_capture_s_frees_it_could_reuse_from_those_it_could_not():
    # a free with no other stream's use completes at once; one recorded on another stream
    # (record_stream) completes after the capture, or never in the history; an alloc at an
    # address whose free was never seen is named too; blocks out of [lo, hi) are not counted
    from vmmrt.torch.bench import poolcheck

    def ev(action, a, n, stream=7):
        return {"action": action, "addr": a, "size": n, "stream": stream}
    events = [ev("alloc", 100, 10), ev("alloc", 200, 20), ev("alloc", 300, 30, stream=8),
              ev("free_requested", 100, 10), ev("free_completed", 100, 10),         # at once
              ev("free_requested", 200, 20), ev("alloc", 400, 4),                   # deferred
              ev("free_requested", 300, 30),                                        # never completed
              ev("alloc", 9000, 1), ev("free_requested", 9000, 1), ev("free_completed", 9000, 1),
              ev("alloc", 500, 5), ev("alloc", 500, 6),                             # 500 given again unfreed
              ev("free_requested", 600, 8), ev("free_completed", 600, 8),           # its alloc not in the history
              ev("free_completed", 200, 20)]                                        # index 15: after the span
    marks = [(("a", True), 0, 15)]
    (use, c, streams), = poolcheck.frees(events, marks, 0, 1000)
    assert use == ("a", True)
    assert c == {"at once": [1, 10], "later in the capture": [0, 0], "after the capture": [1, 20],
                 "never": [1, 30], "given again unfreed": [1, 5], "its alloc unseen": [1, 8]}
    assert streams == {7, 8}
    # completed before the span ends: later, but inside it
    (_, c, _), = poolcheck.frees(events, [(("a", True), 0, 16)], 0, 1000)
    assert c["later in the capture"] == [1, 20] and c["after the capture"] == [0, 0]
    assert poolcheck.describe_frees(c).startswith("1 at once (0 MiB), 1 later in the capture (0 MiB)")
    assert poolcheck.describe_frees({k: [0, 0] for k in poolcheck.FREE_KINDS}) == "no frees"


def test_poolcheck_reads_a_kept_history_without_a_gpu(tmp_path, capsys):
    # --trace keeps the captures' history; --read reports it again on any machine, as the GPU run did
    from vmmrt.torch.bench import poolcheck

    def ev(action, a, n):
        return {"action": action, "addr": a, "size": n, "stream": 3, "frames": []}
    events = [ev("alloc", 1000, 64 << 20), ev("alloc", 1000 + (64 << 20), 32 << 20),
              ev("free_requested", 1000, 64 << 20), ev("free_completed", 1000, 64 << 20),
              ev("alloc", 1000, 16 << 20), ev("alloc", 9, 1)]
    marks = [(("0:L", True), 0, 6)]
    path = tmp_path / "trace.json.gz"
    poolcheck.dump_trace(str(path), events, 1000, 128 << 20, marks)
    evs, lo, hi, got = poolcheck.read_trace(str(path))
    assert (lo, hi, got) == (1000, 1000 + (128 << 20), marks)
    assert [e["action"] for e in evs] == [e["action"] for e in events] and evs[1]["size"] == 32 << 20
    out = tmp_path / "out.json"
    capsys.readouterr()
    assert poolcheck.main(["--read", str(path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "the graphs' pool 128 MiB (its blocks reached 96); 96 MiB alive at once" in text
    assert "in the capture of 0:L's backward" in text and "0:L's backward: 1 at once (64 MiB)" in text
    doc = json.loads(out.read_text())
    assert doc["pool_alive"] == 96 << 20 and doc["pool_reached"] == 96 << 20
    assert doc["pool_frees"][0][1]["at once"] == [1, 64 << 20]
    (tmp_path / "bad").write_text("no")
    with pytest.raises(SystemExit, match="not a history --trace kept"):
        poolcheck.main(["--read", str(tmp_path / "bad")])


def test_poolcheck_finds_the_blocks_alive_at_the_busiest_moment():
    from vmmrt.torch.bench import poolcheck

    def alloc(a, n):
        return {"action": "alloc", "addr": a, "size": n}

    def free(a, n):
        return [{"action": "free_requested", "addr": a, "size": n}, {"action": "free_completed", "addr": a, "size": n}]
    def events(x):
        # a 10 and a 20 alive together; the 10's bytes freed before a 5 takes them; the 20 freed before
        # an x is born; a block out of [lo, hi) not counted
        return [alloc(100, 10), alloc(200, 20)] + free(100, 10) + [alloc(100, 5)] + free(200, 20) + \
            [alloc(300, x), alloc(9000, 999)]
    top, at, live = poolcheck.alive_at_peak(events(24), 0, 1000)
    assert (top, at) == (30, 1) and sorted((a, n) for a, n, _, _ in live) == [(100, 10), (200, 20)]
    assert poolcheck.by_size(live) == [(20, 1), (10, 1)]
    top, at, live = poolcheck.alive_at_peak(events(30), 0, 1000)
    assert (top, at) == (35, 7) and sorted(n for _, n, _, _ in live) == [5, 30]
    # a block freed whose birth the history missed, with no death over its
    # bytes before, is alive from the history's start on (poolplan.block_lives)
    before = [{"action": "free_requested", "addr": 50, "size": 8}, {"action": "free_completed", "addr": 50, "size": 8}]
    top, _, live = poolcheck.alive_at_peak(before + events(24), 0, 1000)
    assert top == 38 and sorted(n for _, n, _, _ in live) == [8, 10, 20]
    assert poolcheck.describe(3 << 20, [(0, 1 << 20, 0, None)] * 3) == "3 MiB alive at once: 3 x 1.0"
    assert poolcheck.alive_at_peak([], 0, 1000) == (0, None, [])
    assert poolcheck.by_size([(0, 4, 0, None), (8, 4, 1, None), (16, 10, 2, None)]) == [(10, 1), (4, 2)]
    # of the blocks alive at eager's busiest moment, the gradients' storages (by address)
    assert poolcheck.gradients_in([(0, 4, 0, None), (8, 4, 1, None), (16, 10, 2, 9)], [8, 16, 99]) == 14
    assert poolcheck.gradients_in([(0, 4, 0, None)], []) == 0
    # per capture (graphpool marks each use's span with DIAGNOSE): a block born before the span
    # counts from its start, one freed after it to its end
    ev = events(24)
    caps = poolcheck.capture_peaks(ev, [(("a", False), 0, 4), (("a", True), 4, 8)], 0, 1000)
    assert [(u, n) for u, n, *_ in caps] == [(("a", False), 30), (("a", True), 29)]
    assert sorted(n for _, n, _, _ in caps[1][2]) == [5, 24]
    # of its busiest bytes, those the capture before left (born before its span, alive then),
    # and the top of the blocks it was handed (its allocs only)
    assert [(carried, reach) for *_, carried, reach in caps] == [(0, 220), (0, 324)]
    other = poolcheck.capture_peaks(ev, [(("a", False), 0, 2), (("a", True), 2, 8)], 0, 1000)
    assert [(n, carried, reach) for _, n, _, carried, reach in other] == [(30, 0, 220), (30, 30, 324)]
    other = poolcheck.capture_peaks(events(1), [(("a", False), 0, 4), (("a", True), 4, 8)], 0, 1000)
    assert [(n, carried) for _, n, _, carried, _ in other] == [(30, 0), (25, 20)]
    # each size named by the first frame of vmmrt's code at its block's birth
    ev[7]["frames"] = [{"filename": "/x/torch/nn/functional.py", "line": 9},
                       {"filename": "/x/vmmrt/torch/bench/llama.py", "line": 42}]
    assert poolcheck.describe(29 << 20, caps[1][2], ev).endswith("1 x 0.0 (llama.py:42), 1 x 0.0")
    # what it is asked is checked before anything is built (with or without a GPU)
    for bad in (["--shape", "nope"], ["--layers", "0"], ["--shape", "long", "--layers", "5"]):
        with pytest.raises(SystemExit, match="unknown shape|--layers"):
            poolcheck.main(bad)
