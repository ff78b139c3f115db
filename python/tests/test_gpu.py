# SPDX-License-Identifier: LGPL-2.1-or-later
"""The graph path on a CUDA device (skipped without one): gradients bitwise
equal to torch.cuda.make_graphed_callables' with deterministic (math)
attention, in every mode and look-ahead; memory proven with the driver's
numbers; capture errors named. Run on the H200 by python/tests/gpu_run.sh."""
import copy
import gc

import pytest
import torch

import vmmrt
import vmmrt.torch as vt
from vmmrt.torch import memory
from vmmrt.torch.bench import llama

pytestmark = pytest.mark.gpu

SMALL = dict(hidden=256, ffn=512, heads=4, kv_heads=2, seq=256, batch=2)


def layers_and_copy(n=4, attention="math", **shape):
    s = llama.Shape(**dict(SMALL, **shape))
    base = llama.torch_layers(n, s, "cuda", torch.bfloat16, attention)
    return s, base, copy.deepcopy(base)


def sample(s):
    return torch.randn(s.batch, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)


def through(seq, x):
    for m in seq:
        x = m(x)
    return x


def step(seq, layers, x, gy):
    for m in layers:
        m.zero_grad(set_to_none=True)
    x.grad = None
    y = through(seq, x)
    y.backward(gy)
    torch.cuda.synchronize()
    return y, [x.grad.clone()] + [p.grad.clone() for m in layers for p in m.parameters()]


def equal(a, b):
    return all(torch.equal(u, v) for u, v in zip(a, b)) and len(a) == len(b)


def steps_equal(s, g, base, gref, ref, iterations=4):
    """Steps of ``g`` over ``base`` and of ``gref`` over ``ref`` from the same
    inputs: outputs and gradients bitwise equal at each."""
    torch.manual_seed(3)
    for it in range(iterations):
        x = sample(s)
        gy = torch.randn_like(x)
        xr = x.detach().clone().requires_grad_()
        y, got = step(g, base, x, gy)
        yr, want = step(gref, ref, xr, gy)
        assert torch.equal(y, yr), "output, iteration %d" % it
        assert equal(got, want), "gradients, iteration %d" % it


def cleanup(*layer_lists):
    for ls in layer_lists:
        for m in ls:
            m.__dict__.pop("forward", None)
            m.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.synchronize()
    vt.empty_cache()


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
@pytest.mark.parametrize("lookahead", [1, 2])
def test_graphs_bitwise_equal_to_graph_only(mode, lookahead):
    s, base, ref = layers_and_copy()
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), mode=mode,
                                      lookahead=lookahead, offload=1.0)
        off = vt.offload_of(g[0])
        assert (off.saved_bytes()["moved"] > 0) == (mode != "none")
        steps_equal(s, g, base, gref, ref)
        off.sync()
        st = off.stats()
        if mode != "none":          # (none moves nothing: the library counts no iteration)
            assert st["iterations"] >= 3
        # (the memory plan, made once at the second step, waits once for the workers: vmmrt.torch.memplan)
        assert st["launch_thread_blocking"] <= 2 + sum(b.maps for b in off.backings) + (st["plan_bytes"] > 0)
    cleanup(base, ref)
    off.close()


@pytest.mark.parametrize("grads", ["mapped", "static", "accumulate"])
def test_gradient_accumulation_over_microbatches(grads):
    s, base, ref = layers_and_copy(n=3)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), grads=grads)
        xs = [sample(s) for _ in range(3)]
        gys = [torch.randn_like(x) for x in xs]
        for m in base:
            m.zero_grad(set_to_none=True)
        for x, gy in zip(xs, gys):           # three microbatches into .grad
            through(g, x).backward(gy)
        got = [p.grad.clone() for m in base for p in m.parameters()]
        # The reference: graph-only one microbatch at a time, summed by hand
        # (its own .grad aliases its static buffers, so it cannot accumulate).
        total = None
        for x, gy in zip(xs, gys):
            _, gr = step(gref, ref, x.detach().clone().requires_grad_(), gy)
            gr = gr[1:]
            total = [t.clone() for t in gr] if total is None else [t.add_(u) for t, u in zip(total, gr)]
        assert equal(got, total)
        if grads == "accumulate":
            ptrs = {p.grad.data_ptr() for m in base for p in m.parameters()}
            for m in base:
                m.zero_grad(set_to_none=True)
            through(g, xs[0]).backward(gys[0])
            assert {p.grad.data_ptr() for m in base for p in m.parameters()} == ptrs  # one .grad, reused
    cleanup(base, ref)
    vt.offload_of(g[0]).close()


@pytest.mark.parametrize("mode", ["pingpong", "none"])
def test_persistent_grad_is_eager_bitwise_and_held_once(mode):
    """A .grad kept across steps and zeroed in place (zero_grad(set_to_none=
    False)), two microbatches a step: gradients bitwise those of eager (torch's
    own graphed callables double them in this loop), the .grad the one tensor
    at its fixed address, and the memory behind it one copy."""
    s, base, ref = layers_and_copy(n=3)
    with llama.attention_backend("math"):
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), mode=mode)
        off = vt.offload_of(g[0])
        assert all(lay.grads is not None and lay.grads.mapped for lay in off.layers)
        nparam = sum(p.numel() * p.element_size() for m in base for p in m.parameters())
        torch.manual_seed(5)
        ptrs = None
        for it in range(3):
            for m in base + ref:
                m.zero_grad(set_to_none=False)
            for _ in range(2):
                x = sample(s)
                gy = torch.randn_like(x)
                through(g, x).backward(gy)
                through(ref, x.detach().clone().requires_grad_()).backward(gy)
            torch.cuda.synchronize()
            got = [p.grad for m in base for p in m.parameters()]
            want = [p.grad for m in ref for p in m.parameters()]
            assert equal(got, want), "iteration %d" % it
            now = [p.grad.data_ptr() for m in base for p in m.parameters()]
            assert ptrs is None or now == ptrs
            ptrs = now
            for lay in off.layers:
                for k, p in enumerate(lay.grads.params):
                    assert lay.grads.state(k, p) == "ours"
        off.sync()
        st = off.stats()
        # one copy of the gradients (granules rounded), the residents released,
        # or on the memory plan's pages (which hold no persistent gradient)
        assert st["slot_bytes"] <= 1.1 * nparam + 8 * 2 ** 21 + st["plan_bytes"]
    cleanup(base, ref)
    off.close()


def test_set_to_none_holds_no_gradient_memory_between_forward_and_backward():
    """Without the memory plan (memory_plan=False): the gradients' memory is
    mapped at their backward and released when zero_grad drops them. (The
    plan keeps it on its pages for good, shared with the resident memory:
    test_memplan_gpu.py.)"""
    s, base, ref = layers_and_copy(n=3)
    with llama.attention_backend("math"):
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), mode="pingpong",
                                      memory_plan=False)
        off = vt.offload_of(g[0])
        calls = []
        p0 = next(base[1].parameters())
        p0.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.clone()))
        for it in range(3):
            for m in base + ref:
                m.zero_grad(set_to_none=True)
            x = sample(s)
            gy = torch.randn_like(x)
            y = through(g, x)
            torch.cuda.synchronize()
            off.sync()
            assert off.stats()["slot_bytes"] == 0, "iteration %d: %d bytes held" % (it, off.stats()["slot_bytes"])
            y.backward(gy)
            yr = through(ref, x.detach().clone().requires_grad_())
            yr.backward(gy)
            torch.cuda.synchronize()
            assert equal([p.grad for m in base for p in m.parameters()], [p.grad for m in ref for p in m.parameters()])
            assert len(calls) == it + 1 and torch.equal(calls[-1], next(ref[1].parameters()).grad)
            assert off.stats()["slot_bytes"] > 0
    cleanup(base, ref)
    off.close()


def used_between(seq, layers, x, gy, offs=()):
    for m in layers:
        m.zero_grad(set_to_none=True)
    y = through(seq, x)
    torch.cuda.synchronize()
    for o in offs:
        o.sync()
    snap = memory.snapshot(offs)
    y.backward(gy)
    torch.cuda.synchronize()
    return snap


@pytest.mark.parametrize("mode", ["pingpong", "remap"])
def test_offload_lowers_driver_level_memory(mode):
    # What earlier tests of the process left cached would be in both
    # readings unevenly (after test_memplan_gpu.py the pingpong reading was
    # 224 MiB over its bound on the H200; alone it passed by 1.4 GiB).
    gc.collect()
    torch.cuda.empty_cache()
    shape = dict(hidden=1024, ffn=2816, heads=8, kv_heads=4, seq=2048, batch=4)
    s, base, _ = layers_and_copy(n=6, attention="auto", **shape)
    x, gy = sample(s), None
    gy = torch.randn_like(x)
    g0 = torch.cuda.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base))
    for _ in range(2):
        used_between(g0, base, x, gy)
    ref = used_between(g0, base, x, gy)
    del g0
    cleanup(base)
    g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), mode=mode, lookahead=1)
    off = vt.offload_of(g[0])
    for _ in range(2):
        used_between(g, base, x, gy, [off])
    got = used_between(g, base, x, gy, [off])
    gran = off.runtime.info()["granularity"]
    big = max(off.group_bytes())
    banks = 2 * ((big + gran - 1) // gran * gran)
    moved = off.saved_bytes()["moved"]
    print("graph-only", memory.describe(ref), "| %s" % mode, memory.describe(got))
    assert got["vmmrt"] <= banks                        # two banks, or look-ahead + 1 = 2 groups
    assert got["used"] < ref["used"] - 0.5 * (moved - banks)
    cleanup(base)
    off.close()


def test_capture_unsafe_op_is_named_with_its_layer():
    class Syncs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64, device="cuda")

        def forward(self, x):
            h = self.lin(x)
            if h.sum().item() > 1e30:        # a host synchronization: not capturable
                h = h * 2
            return h.relu()

    m = Syncs()
    with pytest.raises(vmmrt.Error) as e:
        vt.make_graphed_callables(m, (torch.randn(8, 64, device="cuda", requires_grad=True),), names=["syncs"])
    assert e.value.name == "VMMRT_E_CAPTURE"
    assert "layer 'syncs'" in str(e.value) and "forward capture failed" in str(e.value)
    assert torch.ones(4, device="cuda").sum().item() == 4   # the process goes on


def test_bad_calls_are_refused_before_they_run():
    s, base, ref = layers_and_copy(n=2)
    with llama.attention_backend("math"):
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base))
        x = sample(s)
        with pytest.raises(vmmrt.Error) as e:
            g[0](torch.randn(s.batch, s.seq // 2, s.hidden, device="cuda", dtype=torch.bfloat16,
                             requires_grad=True))
        assert e.value.name == "VMMRT_E_MISMATCH" and "layer '0:DecoderLayer'" in str(e.value)
        y = g[0](x)
        g[0](x)                                   # a second forward before the first one's backward:
        with pytest.raises(vmmrt.Error) as e:     # it starts a new iteration (issue 23), the first one is gone
            through(g[1:], y).sum().backward()
        assert e.value.name == "VMMRT_E_INVALID_STATE" and "called again before the backward" in str(e.value)
        through(g, x).sum().backward()            # the next one completes, correctly
        with torch.no_grad():
            assert torch.allclose(through(g, x).float(), through(ref, x).float(), atol=0, rtol=0)
    cleanup(base, ref)
    vt.offload_of(g[0]).close()


def test_planner_offloads_part_and_keeps_gradients(monkeypatch):
    from vmmrt.torch import planner
    monkeypatch.setattr(planner, "COPY_FIXED_MS", 0.0)   # (layers this small would move nothing for it)
    # nor for their banks (2 MiB granules) against what they save: the plan
    # that hides, unweighed, is what this checks the gradients of
    monkeypatch.setattr(planner, "lightest", lambda layers, d2h, peak, granularity=1, **kw:
                        planner.plan(layers, d2h, **kw))
    s, base, ref = layers_and_copy(n=4)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), offload="auto")
        off = vt.offload_of(g[0])
        assert off.plan is not None and "offload plan" in off.plan.summary() and off.plan.fraction > 0
        x = sample(s)
        gy = torch.randn_like(x)
        for _ in range(2):
            _, got = step(g, base, x, gy)
            _, want = step(gref, ref, x.detach().clone().requires_grad_(), gy)
        assert equal(got, want)
    cleanup(base, ref)
    off.close()


def test_eager_offload_on_the_gpu_is_bitwise():
    s, base, ref = layers_and_copy(n=3)
    with llama.attention_backend("math"):
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), graphs=False)
        x = sample(s)
        gy = torch.randn_like(x)
        for _ in range(3):
            y, got = step(g, base, x, gy)
            yr, want = step(ref, ref, x.detach().clone().requires_grad_(), gy)
            assert torch.equal(y, yr) and equal(got, want)
    off = vt.offload_of(g[0])
    off.sync()
    assert off.stats()["bytes_offloaded"] > 0
    cleanup(base, ref)
    off.close()


# ------------------------------------------------- pipeline schedules (1F1B)

class Stage:
    """One stage running an order over the runners make_graphed_callables(...,
    order=) returned, a step at a time; keeps each microbatch's output (cloned,
    before its backward)."""

    def __init__(self, g, order, xs, gys):
        from vmmrt.torch import pipeline
        self.runs = pipeline.split(g, order)[0]
        self.steps = pipeline.steps(order)
        self.xs, self.gys = xs, gys
        self.live, self.outs, self.done = {}, {}, 0

    def run(self, n=None):
        for _ in range(len(self.steps) - self.done if n is None else n):
            backward, _, mb = self.steps[self.done]
            if not backward:
                y = through(self.runs[mb], self.xs[mb])
                self.live[mb], self.outs[mb] = y, y.detach().clone()
            else:
                self.live.pop(mb).backward(self.gys[mb])
            self.done += 1
        torch.cuda.synchronize()
        return self


def sequential_graph_only(gref, ref, xs, gys):
    """The reference: torch.cuda.make_graphed_callables' layers, the microbatches one
    after another; the parameter gradients summed by hand in microbatch order, as
    .grad accumulates (graph-only's .grad aliases its static buffers)."""
    ys, gx, total = [], [], None
    for x, gy in zip(xs, gys):
        y, gr = step(gref, ref, x.detach().clone().requires_grad_(), gy)
        ys.append(y.detach().clone())
        gx.append(gr[0])
        total = [t.clone() for t in gr[1:]] if total is None else [t.add_(u) for t, u in zip(total, gr[1:])]
    return ys, gx, total


def graphed_1f1b(base, s, m, p, **kw):
    order = vt.order_1f1b(m, in_flight=p)
    return order, vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in range(len(base) * m)),
                                            order=order, **kw)


def microbatches(s, m):
    xs = [sample(s) for _ in range(m)]
    return xs, [torch.randn_like(x) for x in xs]


def param_grads(layers):
    return [q.grad.clone() for mod in layers for q in mod.parameters()]


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 6)])
def test_1f1b_graphs_bitwise_equal_to_sequential_microbatches(mode, p, m):
    s, base, ref = layers_and_copy(n=3)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        order, g = graphed_1f1b(base, s, m, p, mode=mode)
        off = vt.offload_of(g[0])
        assert len(g) == 3 * m and (off.saved_bytes()["moved"] > 0) == (mode != "none")
        torch.manual_seed(5)
        for it in range(3):
            xs, gys = microbatches(s, m)
            for mod in base:
                mod.zero_grad(set_to_none=True)
            st = Stage(g, order, xs, gys).run()
            want_y, want_x, want = sequential_graph_only(gref, ref, xs, gys)
            assert equal([st.outs[mb] for mb in range(m)], want_y), "outputs, iteration %d" % it
            assert equal([x.grad for x in xs], want_x), "input gradients, iteration %d" % it
            assert equal(param_grads(base), want), "parameter gradients, iteration %d" % it
        off.sync()
        stats = off.stats()
        if mode != "none":          # (none moves nothing: the library counts no iteration)
            assert stats["iterations"] == 3 and stats["schedule_declared"] == 1
        # the hooks never block, nor do the maps of gradient and resident
        # memory made on the stream (Offload.map_for_use); the others wait
        # for their worker on the host, by design
        assert sum(b.stream_maps for b in off.backings) > 0
        # (and the memory plan waits once for the workers, when it is made)
        assert stats["launch_thread_blocking"] <= 2 + sum(b.maps - b.stream_maps for b in off.backings) + \
            (stats["plan_bytes"] > 0)
        if mode == "pingpong":
            assert stats["bank_conflicts"] == 0 and stats["banks"] >= 2
        if mode != "none":
            assert stats["activation_bytes"] <= stats["bound_bytes"]
    cleanup(base, ref)
    off.close()


def test_1f1b_graphs_with_accumulated_grads():
    s, base, ref = layers_and_copy(n=3)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        order, g = graphed_1f1b(base, s, 4, 2, mode="pingpong", grads="accumulate")
        for it in range(2):
            xs, gys = microbatches(s, 4)
            for mod in base:
                mod.zero_grad(set_to_none=True)
            Stage(g, order, xs, gys).run()
            assert equal(param_grads(base), sequential_graph_only(gref, ref, xs, gys)[2]), "iteration %d" % it
    cleanup(base, ref)
    vt.offload_of(g[0]).close()


@pytest.mark.parametrize("mode", ["pingpong", "remap"])
def test_1f1b_graphs_abort_then_a_whole_iteration(mode):
    s, base, ref = layers_and_copy(n=3)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        order, g = graphed_1f1b(base, s, 6, 4, mode=mode)
        off = vt.offload_of(g[0])
        for it, until in enumerate([None, 6, None]):           # the second step given up after 6 of 12
            xs, gys = microbatches(s, 6)
            for mod in base:
                mod.zero_grad(set_to_none=True)
            Stage(g, order, xs, gys).run(until)
            if until is not None:
                off.abort()                                    # nothing captured again
                continue
            assert equal(param_grads(base), sequential_graph_only(gref, ref, xs, gys)[2]), "iteration %d" % it
        off.sync()
        assert off.stats()["aborts"] == 1 and off.stats()["iterations"] == 2
    cleanup(base, ref)
    off.close()


def test_1f1b_graphs_out_of_order_is_refused_naming_the_runner():
    s, base, ref = layers_and_copy(n=2)
    with llama.attention_backend("math"):
        order, g = graphed_1f1b(base, s, 4, 2, mode="pingpong")
        xs, gys = microbatches(s, 4)
        st = Stage(g, order, xs, gys).run(2)                   # the forwards of microbatches 0 and 1
        with pytest.raises(vmmrt.Error) as e:
            g[2 * 2](xs[2])                                    # microbatch 2 before microbatch 0's backward
        assert e.value.name == "VMMRT_E_MISMATCH"
        assert "'0:DecoderLayer/mb2'" in str(e.value) and "is '1:DecoderLayer/mb0'" in str(e.value)
        st.run()                                               # the iteration goes on
        vt.offload_of(g[0]).sync()
        assert vt.offload_of(g[0]).stats()["iterations"] == 1
    cleanup(base, ref)
    vt.offload_of(g[0]).close()


@pytest.mark.parametrize("mode", ["pingpong", "remap"])
def test_1f1b_driver_level_memory_against_none(mode):
    """p = 4 microbatches in flight: at the end of the warm-up forwards none holds
    the activations of every runner run so far, the offload its banks (or its
    remap budget), at the driver's count."""
    shape = dict(hidden=1024, ffn=2816, heads=8, kv_heads=4, seq=1024, batch=2)
    s, base, _ = layers_and_copy(n=3, attention="auto", **shape)
    used, acts = {}, {}
    for md in ("none", mode):
        order, g = graphed_1f1b(base, s, 6, 4, mode=md)
        off = vt.offload_of(g[0])
        for _ in range(2):
            xs, gys = microbatches(s, 6)
            for mod in base:
                mod.zero_grad(set_to_none=True)
            st = Stage(g, order, xs, gys).run(4)               # F0..F3: four microbatches in flight
            off.sync()
            used[md] = memory.snapshot([off])
            acts[md] = _activations(off)
            st.run()
        stats = off.stats()
        print(md, memory.describe(used[md]), "| banks %d, bound %.0f MiB" % (stats["banks"],
                                                                           stats["bound_bytes"] / 2**20))
        print(off.describe())
        off.close()
        # (the microbatches' input gradients come from the graphs' pool: held,
        # they would keep the runtime until they go, in the next mode's count)
        del g, off, st, xs, gys
        cleanup(base)
    # none's activations are in its resident slots, the offload's in its
    # banks or remap slots ("vmmrt") and what it keeps resident: counted
    # from the slots in use: the memory plan's pages ("slots") hold the
    # gradients' and the backwards' io slots beside them in both modes, and
    # are sized for the busiest use, not this one
    print("activations held: %s" % {md: "%.0f MiB" % (n / 2**20) for md, n in acts.items()})
    assert acts[mode] < acts["none"] / 2
    assert used[mode]["used"] < used["none"]["used"] - (acts["none"] - acts[mode]) / 2


def _activations(off):
    """The bytes of activations ``off`` holds now: its banks or remap slots,
    and its resident slots in use (mapped, or busy on the memory plan's
    pages)."""
    return off.device_bytes() + sum(lay.resident.nbytes for lay in off.layers if lay.resident is not None and
                                    (lay.resident.mapped or lay.resident.busy))


# ------------------------------------------- issue 23's contracts, with graphs

class ExpOut(torch.nn.Module):
    """Saves its output (exp's backward reads it) and its input (the Linear's)."""

    def __init__(self, d=256):
        super().__init__()
        self.lin = torch.nn.Linear(d, d, device="cuda")

    def forward(self, x):
        return self.lin(x).exp()


def exp_layers(n=2, seed=5):
    torch.manual_seed(seed)
    base = [ExpOut() for _ in range(n)]
    return base, copy.deepcopy(base)


def exp_sample():
    return torch.randn(8, 64, 256, device="cuda", requires_grad=True)


@pytest.mark.parametrize("what", ["input", "output"])
def test_graphs_a_saved_tensor_changed_in_place_is_autograds_error(what):
    base, ref = exp_layers()
    gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((exp_sample(),) for _ in ref))
    g = vt.make_graphed_callables(tuple(base), tuple((exp_sample(),) for _ in base))
    off = vt.offload_of(g[0])
    x = exp_sample()
    h = x * 0.5
    y0 = g[0](h)
    y = g[1](y0)
    if what == "input":
        h.add_(1.0)                               # layer 0 saved it (its Linear's input)
        layer = "0:ExpOut"
    else:
        y.mul_(0.5)                               # layer 1 saved it (exp's output)
        layer = "1:ExpOut"
    with pytest.raises(RuntimeError) as e:
        y.sum().backward()
    assert "modified by an inplace operation" in str(e.value) and "layer '%s'" % layer in str(e.value)
    torch.cuda.synchronize()
    assert off.stats()["aborts"] == 1             # abandoned; the next iteration is graph-only's, bitwise
    gy = torch.randn(8, 64, 256, device="cuda")
    _, got = step(g, base, x, gy)
    _, want = step(gref, ref, x.detach().clone().requires_grad_(), gy)
    assert equal(got, want)
    cleanup(base, ref)
    off.close()


def test_graphs_inputs_of_another_layout_are_copied_like_torch():
    s, base, ref = layers_and_copy(n=2)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base))
        x = torch.randn(s.batch, s.hidden, s.seq, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        x.requires_grad_()
        gy = torch.randn(s.batch, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):
            _, got = step(g, base, x, gy)
            _, want = step(gref, ref, x.detach().clone().requires_grad_(), gy)
            assert equal(got, want)
        with pytest.raises(vmmrt.Error) as e:
            g[0](sample(s).float().detach().requires_grad_())
        assert e.value.name == "VMMRT_E_MISMATCH" and "argument 0 ('x')" in str(e.value)
        assert "bfloat16" in str(e.value) and "float32" in str(e.value)
        _, got = step(g, base, x, gy)             # refused before it ran: nothing changed
        _, want = step(gref, ref, x.detach().clone().requires_grad_(), gy)
        assert equal(got, want)
    cleanup(base, ref)
    vt.offload_of(g[0]).close()


@pytest.mark.parametrize("mode", ["pingpong", "remap"])
def test_graphs_abort_mid_iteration_then_bitwise(mode):
    """Abort with graphs, without an order: an exception between two layers
    (the user's code), a dropped output, then abort(); each time the next
    iteration is graph-only's, bitwise, and nothing is captured again."""
    s, base, ref = layers_and_copy(n=4)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), mode=mode)
        off = vt.offload_of(g[0])
        torch.manual_seed(9)
        for it in range(3):
            x = sample(s)
            gy = torch.randn_like(x)
            if it == 0:
                through(g[:2], x)                 # the user's code raises here: abort() gives the step up
                off.abort()
            elif it == 1:
                through(g, x)                     # dropped: the next forward starts a new iteration
            _, got = step(g, base, x, gy)
            _, want = step(gref, ref, x.detach().clone().requires_grad_(), gy)
            assert equal(got, want), "iteration %d" % it
        off.sync()
        assert off.stats()["aborts"] == 2
    cleanup(base, ref)
    off.close()


def test_slot_mapped_after_a_torch_event_with_its_tensor_made_first():
    """A tensor over a slot whose memory is not there yet (made without asking
    the driver about the pointer), the map after a torch event, the stream
    waiting for it on the device: the launch thread waits for nothing, and
    the kernel after the wait finds the memory."""
    import time
    from vmmrt.torch import _dlpack
    with vmmrt.Runtime({"backend": "cuda", "device": torch.cuda.current_device()}) as rt:
        s = rt.slot(64 << 20)
        t, owner = _dlpack.owned_tensor_at(s.address, s.size, "cuda")
        assert t.data_ptr() == s.address and t.numel() == s.size
        stream = torch.cuda.current_stream()
        torch.cuda._sleep(200 * 1000 * 1000)         # ~0.1 s of the GPU's
        ev = torch.cuda.Event()
        ev.record(stream)
        s.map_after(ev)
        s.wait_stream(stream.cuda_stream)
        t.fill_(7)
        ok = (t == 7).all()
        assert s.state == "pending" and not ev.query()  # the host is ahead of the GPU
        torch.cuda.synchronize()
        assert bool(ok) and s.state == "mapped"
        del t, ok
        gc.collect()
        s.release_after(stream.cuda_stream)
        t0 = time.monotonic()
        while s.state == "pending" and time.monotonic() - t0 < 5:
            time.sleep(0.002)
        assert s.state == "reserved" and rt.offload_stats()["slot_bytes"] == 0
        del owner
        s.destroy()


_WORKSPACES = r'''
import sys
import torch
import vmmrt.torch as vt
from vmmrt.torch.bench import llama

which = sys.argv[1]
s = llama.Shape(hidden=4096, ffn=14336, heads=32, kv_heads=8, seq=2048, batch=1)
layers = llama.torch_layers(2, s, "cuda", torch.bfloat16, "math")
x = torch.randn(1, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
gy = torch.randn_like(x)
samples = tuple((x.detach().clone().requires_grad_(),) for _ in layers)
if which == "torch":
    g = torch.cuda.make_graphed_callables(tuple(layers), samples)
else:
    g = vt.make_graphed_callables(tuple(layers), samples, mode="none")


def step():
    for m in layers:
        m.zero_grad(set_to_none=True)
    y = x
    for m in g:
        y = m(y)
    y.backward(gy)
    torch.cuda.synchronize()
    return [p.grad.clone() for m in layers for p in m.parameters()]


for _ in range(3):           # (vmmrt's memory plan is made at the second step)
    before = step()
# what torch.compile's CUDA graph trees do around each recording, and the
# caches emptied: every cuBLAS workspace given back
torch._C._cuda_clearCublasWorkspaces()
torch.cuda.empty_cache()
junk = torch.full((256 << 20,), 7, dtype=torch.uint8, device="cuda")
after = step()
assert all(torch.equal(a, b) for a, b in zip(before, after)), "the gradients changed"
assert bool((junk == 7).all()), "a replay wrote over memory PyTorch has handed out since"
print("ok")
'''


@pytest.mark.parametrize("which", ["torch", "vmmrt"])
def test_graphs_outlive_a_clear_of_cublas_workspaces(which):
    """A captured cuBLAS call keeps the address of the workspace it was
    captured with. torch's graphed callables capture on a stream of their
    own, whose workspace the capture allocates in the graphs' pool; the
    library captures on the stream it warmed up on, whose workspace was the
    caching allocator's (session 70's --one-time run faulted, `unspecified
    launch failure`, in a vmmrt step after the bench emptied the workspaces
    and the cache between the build and its steps), so it gives every
    workspace back before its captures and after them
    (graphed._blas_workspaces_given_back). In a process of its own: a fault
    ends the process."""
    import subprocess
    import sys
    if not hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        pytest.skip("this torch cannot clear the cuBLAS workspaces")
    p = subprocess.run([sys.executable, "-c", _WORKSPACES, which], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.stdout[-2000:], p.stderr[-4000:])
