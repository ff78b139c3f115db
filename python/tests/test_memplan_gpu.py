# SPDX-License-Identifier: LGPL-2.1-or-later
"""The memory plan (vmmrt.torch.memplan) under CUDA graphs (skipped without
a CUDA device): gradients bitwise those of memory_plan=False, no driver
call per step once the plan is made, in both loops, and a .grad kept
across the next forward intact. Run on the H200:

    /usr/bin/python3 -m pytest -q python/tests/test_memplan_gpu.py
"""
import copy

import pytest
import torch

import vmmrt.torch as vt
from conftest import close_graphed
from vmmrt.torch import graphpool
from vmmrt.torch.bench import llama

pytestmark = pytest.mark.gpu

# large enough that every layer has a resident slot (half a 2 MiB granule or more)
SHAPE = dict(hidden=256, ffn=512, heads=4, kv_heads=2, seq=1024, batch=2)
N = 4


def _train(layers, plan, mode, kw, set_to_none, steps=5, keep_at=None):
    s = llama.Shape(**SHAPE)
    g = vt.make_graphed_callables(tuple(layers), tuple((_sample(s, 100 + i),) for i in range(N)), mode=mode,
                                  memory_plan=plan, **kw)
    off = vt.offload_of(g[0])
    out = {"grads": [], "calls": []}
    try:
        for i in range(steps):
            kept = None
            if i == keep_at:
                kept = [p.grad for p in layers[0].parameters()]
                values = [t.clone() for t in kept]
            for m in layers:
                m.zero_grad(set_to_none=set_to_none)
            torch.cuda.synchronize()
            off.sync()
            before = off.stats()["driver_calls"]
            x = _sample(s, i)
            gy = torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=torch.Generator("cuda").manual_seed(i))
            y = x
            for m in g:
                y = m(y)
            if kept is not None:
                torch.cuda.synchronize()
                out["after_forward"] = [torch.equal(a, b) for a, b in zip(kept, values)]
            y.backward(gy)
            del y, kept
            torch.cuda.synchronize()
            off.sync()
            out["calls"].append(off.stats()["driver_calls"] - before)
            out["grads"].append([p.grad.clone() for m in layers for p in m.parameters()])
        out["stats"] = off.stats()
        out["describe"] = off.describe()
        out["residents"] = sum(1 for lay in off.layers if lay.resident is not None)
        out["planned"] = off.memplan.plan is not None
        out["predicted"] = off.memplan.plan.total_bytes if out["planned"] else None
    finally:
        close_graphed(layers, off)
    return out


def _sample(s, seed):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(s.batch, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16, generator=gen,
                       requires_grad=True)


def _both(mode, kw, set_to_none, keep_at=None):
    base = llama.torch_layers(N, llama.Shape(**SHAPE), "cuda", torch.bfloat16, "math")
    ref = copy.deepcopy(base)
    with llama.attention_backend("math"):
        on = _train(base, True, mode, kw, set_to_none, keep_at=keep_at)
        off = _train(ref, False, mode, kw, set_to_none, keep_at=keep_at)
    return on, off


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("mode,kw", [("none", {}), ("pingpong", {"offload": 0.5})])
def test_plan_is_bitwise_and_makes_no_driver_call(mode, kw, set_to_none):
    on, off = _both(mode, kw, set_to_none)
    print(on["describe"])
    print("driver calls per step: plan", on["calls"], "no plan", off["calls"])
    assert on["planned"]
    assert on["stats"]["plan_conflicts"] == 0
    assert on["residents"] > 0 or mode != "none"
    # the pages hold the residents, and in the set_to_none loop the gradients
    assert (on["stats"]["plan_bytes"] > 0) == (on["residents"] > 0 or set_to_none)
    assert on["stats"]["slot_bytes"] == on["predicted"]      # the pages, and persistent gradients' own
    assert on["calls"][2:] == [0] * (len(on["calls"]) - 2)
    for it, (a, b) in enumerate(zip(on["grads"], off["grads"])):
        assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b)), "gradients, step %d" % it


def test_a_grad_kept_across_the_next_forward_is_intact():
    on, off = _both("none", {}, True, keep_at=3)
    assert on["after_forward"] == [True] * len(on["after_forward"])
    assert on["stats"]["plan_conflicts"] >= 1
    for it, (a, b) in enumerate(zip(on["grads"], off["grads"])):
        assert all(torch.equal(u, v) for u, v in zip(a, b)), "gradients, step %d" % it


@pytest.mark.parametrize("hooked", [False, True])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_output_gradients_in_their_io_slot_train_as_eager(set_to_none, hooked):
    # The backward graphs read their output gradients from the io slot
    # beside the gradients' (memory from the backward to the next use, on
    # the plan's pages in both loops), each but the last layer's on the
    # pages of the layer after's argument gradients, which it is handed (no
    # copy: memplan.chain_gouts): the training is eager's, bitwise (math
    # attention). ``hooked``: at step 3 a hook hands layer 1's backward
    # twice its gradient and keeps the one it was given, which the copy in
    # must not write over (the slot takes memory of its own for that use).
    s = llama.Shape(**SHAPE)
    base = llama.torch_layers(N, s, "cuda", torch.bfloat16, "math")
    ref = copy.deepcopy(base)
    kept = []
    with llama.attention_backend("math"):
        g = vt.make_graphed_callables(tuple(base), tuple((_sample(s, 100 + i),) for i in range(N)), mode="none")
        off = vt.offload_of(g[0])
        try:
            assert all(lay.grads.gouts_used for lay in off.layers), off.describe()
            for i in range(5):
                for ms in (base, ref):
                    for m in ms:
                        m.zero_grad(set_to_none=set_to_none)
                got = []
                for seq in (g, ref):
                    x = _sample(s, i)
                    gy = torch.randn(x.shape, device="cuda", dtype=x.dtype,
                                     generator=torch.Generator("cuda").manual_seed(i))
                    y = x
                    for k, m in enumerate(seq):
                        y = m(y)
                        if hooked and i == 3 and k == 1:
                            y.register_hook(lambda t: kept.append((t, t.clone())) or t * 2)
                    y.backward(gy)
                    got.append([x.grad] + [p.grad for m in (base if seq is g else ref) for p in m.parameters()])
                torch.cuda.synchronize()
                assert all(torch.equal(a, b) for a, b in zip(*got)), "step %d" % i
                if kept:
                    assert all(torch.equal(t, c) for t, c in kept), "the kept gradient, step %d" % i
                    kept.clear()
            assert (off.stats()["plan_conflicts"] > 0) == hooked
            assert all(lay.grads.io is not None and lay.grads.io.bound for lay in off.layers), off.describe()
            assert all(lay.grads.backing.bound == set_to_none for lay in off.layers), off.describe()
            chained = [lay.grads.chain is not None and lay.grads.chain_skips > 0 for lay in off.layers]
            assert chained == [True] * (N - 1) + [False], off.describe()
        finally:
            close_graphed(base, off)


@pytest.mark.parametrize("history", [False, True])
def test_the_graphs_pool_is_one_segment_cut_where_its_blocks_reached(history, monkeypatch):
    # One pool for every use (graphpool.PER_USE off): the captures' blocks
    # come from one segment made before them, and the range is cut where
    # they reached (read from the memory history the captures turn on and
    # off). A caller recording that history already keeps it on, and the
    # pool makes its segments as it goes.
    monkeypatch.setattr(graphpool, "PER_USE", False)
    s = llama.Shape(**SHAPE)
    layers = llama.torch_layers(N, s, "cuda", torch.bfloat16, "math")
    if history:
        torch.cuda.memory._record_memory_history(enabled="all", context=None)
    off = None
    try:
        with llama.attention_backend("math"):
            g = vt.make_graphed_callables(tuple(layers), tuple((_sample(s, 100 + i),) for i in range(N)),
                                          mode="none")
            off = vt.offload_of(g[0])
            gp = off.graph_pool
            assert torch._C._cuda_isHistoryEnabled() == history
            lo = gp.backing.address
            segs = [(seg["address"] - lo, seg["total_size"]) for seg in torch.cuda.memory_snapshot(gp.id)]
            print(gp.describe(), gp.presize_why_not, segs)
            if history:
                assert gp.large is None and "records" in gp.presize_why_not
            else:
                assert gp.presize_why_not is None
                assert gp.large == (lo + graphpool.SMALL, gp.bound - graphpool.SMALL)
                assert (graphpool.SMALL, gp.large[1]) in segs
                assert all(a + n <= graphpool.SMALL for a, n in segs if a != graphpool.SMALL)
                assert graphpool.SMALL < gp.used < gp.bound
                assert gp.backing.nbytes >= gp.used
            for i in range(3):
                for m in layers:
                    m.zero_grad(set_to_none=True)
                y = _sample(s, i)
                for m in g:
                    y = m(y)
                y.sum().backward()
            torch.cuda.synchronize()
            assert all(torch.isfinite(p.grad).all() for m in layers for p in m.parameters())
    finally:
        if history:
            torch.cuda.memory._record_memory_history(enabled=None)
        if off is not None:
            close_graphed(layers, off)


@pytest.mark.parametrize("per_use", [True, False])
@pytest.mark.parametrize("recompute", [False, True])
def test_the_graphs_pools_granules_share_pages_and_train_as_torchs_graphs(recompute, per_use, monkeypatch):
    # The pool's granules go on the plan's pages by when the captures' blocks
    # are alive (vmmrt.torch.poolplan's parts): fewer pages than addresses,
    # per use parts at some uses only, on pages of slots in use at others;
    # the training bitwise that of torch's graphed callables, steps making
    # no driver call.
    from test_gpu import cleanup, layers_and_copy, sample, steps_equal
    monkeypatch.setattr(graphpool, "PER_USE", per_use)
    s, base, ref = layers_and_copy(seq=1024)
    n = len(base)
    kw = {"memory_budget": vt.Budget(layers=["recompute"] * n)} if recompute else {}
    off = None
    try:
        with llama.attention_backend("math"):
            gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
            g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), mode="none", **kw)
            off = vt.offload_of(g[0])
            gp = off.graph_pool
            steps_equal(s, g, base, gref, ref, iterations=5)
            off.sync()
            st = off.stats()
            print(gp.describe(), {k: v for k, v in st.items() if k.startswith("graph_pool")})
            print(off.memplan.plan.summary())
            assert off.memplan.plan is not None and gp.backing.bound, off.describe()
            assert gp.per_use == per_use and (gp.parts if per_use else gp.parts is None), gp.place_why_not
            if per_use:
                assert st["graph_pool_live_peak_bytes"] <= st["graph_pool_pages_bytes"]
                assert st["graph_pool_pages_bytes"] < st["graph_pool_bytes"]
                plan = off.memplan.plan
                spans = [k for k in plan.shares if k[0] == "graphs" and plan.by_key()[k].start > 0]
                assert spans, plan.summary()
                # a backward's temporaries on the pages of slots in use elsewhere
                assert any(k2[0] != "graphs" for k in spans for k2 in plan.shares[k]), plan.summary()
            assert st["plan_conflicts"] == 0
            before = off.stats()["driver_calls"]
            steps_equal(s, g, base, gref, ref, iterations=2)
            off.sync()
            assert off.stats()["driver_calls"] == before
    finally:
        cleanup(base, ref)
        if off is not None:
            off.close()
