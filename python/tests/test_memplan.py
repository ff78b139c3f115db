# SPDX-License-Identifier: LGPL-2.1-or-later
"""The memory plan (vmmrt.torch.memplan): its arithmetic on made-up
timelines (the lives of the resident and gradient slots, where each lands in
the pages, what shares with what, the predicted size), then the plan as
make_graphed_callables applies it on the host backend (no driver call in
steady state, gradients bitwise as without it, a .grad kept past its life)."""
import random

import pytest
import torch

import vmmrt.torch as vt
from conftest import run, runner_step, samples, zoo_layers
from vmmrt.torch import memplan, reuse

G = 4096


def default_order(names):
    return [(n, False) for n in names] + [(n, True) for n in reversed(names)]


def three(persistent=False, res=4 * G, grad=2 * G):
    names = ["a", "b", "c"]
    order = default_order(names)
    items = memplan.lives(order, {n: res for n in names}, [(n, [n], grad, persistent) for n in names])
    return memplan.Plan(order, items, G)


def key(name, kind):
    return (name, kind)


def bytes_of(plan, k):
    it = plan.by_key()[k]
    return set(range(it.offset // G, (it.offset + it.nbytes + G - 1) // G))


def test_lives_follow_the_order():
    # a_f=0 b_f=1 c_f=2 c_b=3 b_b=4 a_b=5, the step's end 6
    p = three()
    life = {k: (it.start, it.end) for k, it in p.by_key().items()}
    assert life[key("a", "resident")] == (0, 5)
    assert life[key("b", "resident")] == (1, 4)
    assert life[key("c", "resident")] == (2, 3)
    assert life[key("c", "grads")] == (3, 6)
    assert life[key("a", "grads")] == (5, 6)


def test_pipeline_gradients_start_at_their_first_runners_backward():
    # two microbatch runners of one callable: its gradients are written from the
    # first of their backwards
    order = [("l/mb0", False), ("l/mb1", False), ("l/mb0", True), ("l/mb1", True)]
    items = memplan.lives(order, {"l/mb0": G, "l/mb1": G}, [("l", ["l/mb0", "l/mb1"], G, False)])
    by = {it.key: it for it in items}
    assert (by[("l", "grads")].start, by[("l", "grads")].end) == (2, 4)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_backwards_io_slot_lives_to_the_next_use_and_shares_in_either_loop(persistent):
    # The output and argument gradients of a backward graph (Grads.io): the
    # layer before reads the argument gradients at its backward, so they
    # live from the layer's backward to the next use, the last one to the
    # step's end; in the persistent loop too, where the parameters'
    # gradients keep their own memory for good.
    names = ["a", "b", "c"]
    order = default_order(names)     # a_f=0 b_f=1 c_f=2 c_b=3 b_b=4 a_b=5, the step's end 6
    items = memplan.lives(order, {n: 4 * G for n in names}, [(n, [n], 2 * G, persistent) for n in names],
                          io=[(n, [n], G) for n in names])
    p = memplan.Plan(order, items, G)
    life = {k: (it.start, it.end) for k, it in p.by_key().items()}
    assert life[key("c", "io")] == (3, 4) and life[key("b", "io")] == (4, 5) and life[key("a", "io")] == (5, 6)
    for n in names:
        assert p.by_key()[key(n, "io")].offset is not None
        assert p.by_key()[key(n, "grads")].shared is not persistent
    # laid out at the busiest use (what the slots alive then hold), sharing
    # bytes only between lives that do not meet
    assert p.pages_bytes == memplan.busiest([it for it in items if it.shared], G)
    assert any(p.shares[key(n, "io")] for n in names)
    for n in names:
        for k in p.shares[key(n, "io")]:
            assert not p.by_key()[k].overlaps(p.by_key()[key(n, "io")])
    # two microbatch runners of one callable: from the first backward to the use after the last
    order = [("l/mb0", False), ("l/mb1", False), ("l/mb0", True), ("l/mb1", True)]
    by = {it.key: it for it in memplan.lives(order, {}, [], io=[("l", ["l/mb0", "l/mb1"], G)])}
    assert (by[("l", "io")].start, by[("l", "io")].end) == (2, 4)
    with pytest.raises(ValueError):
        memplan.lives(order, {}, [], io=[("l", ["z"], G)])


def test_a_backwards_output_gradients_live_at_its_backward_alone():
    # The output gradients a backward graph reads (Grads.outs): the call
    # copies them in, the graph reads them, and nothing after needs them.
    # In the io slot they lived to the next use, so the layer before's
    # backward held the layer after's beside its own: on 4 layers at seq
    # 32768 (H100) the busiest use, the first layer's backward, held 1024
    # MiB of io slots where eager holds one gradient per layer boundary.
    names = ["a", "b", "c"]
    order = default_order(names)     # a_f=0 b_f=1 c_f=2 c_b=3 b_b=4 a_b=5, the step's end 6
    residents, grads = {n: G for n in names}, [(n, [n], 2 * G, False) for n in names]
    items = memplan.lives(order, residents, grads, io=[(n, [n], G) for n in names],
                          gouts=[(n, [n], G) for n in names])
    p = memplan.Plan(order, items, G)
    by = p.by_key()
    assert [(by[key(n, "output grads")].start, by[key(n, "output grads")].end) for n in names] == \
        [(5, 5), (4, 4), (3, 3)]
    # at a's backward: a's io and output gradients, b's io (a reads its
    # argument gradients), and no output gradients but a's
    at = [it.key for it in items if it.start <= 5 <= it.end and it.kind in ("io", "output grads")]
    assert sorted(at) == sorted([key("a", "io"), key("a", "output grads"), key("b", "io")])
    assert "read by its graph alone" in p.summary()
    # the busiest use (a's backward: every gradient mapped) holds one output
    # gradient less than with them in the io slot
    merged = memplan.Plan(order, memplan.lives(order, residents, grads, io=[(n, [n], 2 * G) for n in names]), G)
    assert p.pages_bytes == memplan.busiest([it for it in items if it.shared], G) == 10 * G
    assert merged.pages_bytes == 11 * G
    order = [("l/mb0", False), ("l/mb1", False), ("l/mb0", True), ("l/mb1", True)]
    lv = {it.key: it for it in memplan.lives(order, {}, [], gouts=[("l", ["l/mb0", "l/mb1"], G)])}
    assert (lv[("l", "output grads")].start, lv[("l", "output grads")].end) == (2, 3)
    with pytest.raises(ValueError, match="output gradients"):
        memplan.lives(order, {}, [], gouts=[("l", ["z"], G)])


def test_a_backwards_output_gradients_lie_on_the_argument_gradients_the_layer_after_hands_it():
    # A chain: c's backward makes b's output gradient (c's argument
    # gradient, in c's io slot) and b's backward reads it. Eager hands the
    # one tensor on; the plan maps b's output gradients' slot on c's io
    # pages, at the gradient's offset there, so that the bytes it would
    # copy in are there already: one gradient per layer boundary.
    names = ["a", "b", "c"]
    order = default_order(names)     # a_f=0 b_f=1 c_f=2 c_b=3 b_b=4 a_b=5, the step's end 6
    residents, grads = {n: G for n in names}, [(n, [n], 2 * G, False) for n in names]

    def made(links, io=2 * G, gout=G):
        items = memplan.lives(order, residents, grads, io=[(n, [n], io) for n in names],
                              gouts=[(n, [n], gout) for n in names])
        left, chained = memplan.chain_gouts(items, links, G)
        return items, memplan.Plan(order, left, G, chained=chained)
    items, apart = made({})
    _, p = made({"b": ("c", 0), "a": ("b", G)})
    by = p.by_key()
    assert sorted(p.chained) == [key("a", "output grads"), key("b", "output grads")]
    assert by[key("b", "output grads")].offset == by[key("c", "io")].offset
    assert by[key("a", "output grads")].offset == by[key("b", "io")].offset + G
    assert key("b", "output grads") in [k for it in p.items for k in it.mapped_by]
    assert "on c's argument gradients' pages" in p.summary()
    # at b's and a's backwards one output gradient less; the pages smaller
    assert p.pages_bytes == memplan.busiest(p.items, G) < apart.pages_bytes
    for t in (4, 5):
        assert sum(memplan.alive_at(apart.items, t, G).values()) - sum(memplan.alive_at(p.items, t, G).values()) == G
    # the statics the plan holds count them still (planner.StepModel takes them off the estimate's)
    assert p.graph_bytes == apart.graph_bytes
    # not where the offset is not a whole granule, the slot does not fit from
    # there, it outlives the io slot, a second slot asks the same io slot, or
    # one of them keeps memory of its own
    assert not made({"b": ("c", G // 2)})[1].chained
    assert not made({"b": ("c", G)}, gout=2 * G)[1].chained
    assert not made({"c": ("a", 0)})[1].chained          # c's backward (3) before a's io lives (5, 6)
    assert not made({"c": ("c", 0)})[1].chained         # its own backward writes the io slot as it reads
    # two slots within one io slot's life (its callable's two runners': to the use after the last)
    order2 = [("x", False), ("z", False), ("y", False), ("y", True), ("z", True), ("x", True)]
    two = memplan.lives(order2, {}, [], io=[("yz", ["y", "z"], 2 * G)], gouts=[("x", ["x"], G), ("w", ["z"], G)])
    assert len(memplan.chain_gouts(two, {"x": ("yz", 0), "w": ("yz", 0)}, G)[1]) == 1
    items = memplan.lives(order, residents, grads, io=[(n, [n], 2 * G) for n in names],
                          gouts=[(n, [n], G) for n in names])
    next(it for it in items if it.key == key("c", "io")).shared = False
    assert not memplan.chain_gouts(items, {"b": ("c", 0)}, G)[1]


def test_persistent_gradients_live_the_whole_step_and_are_never_shared():
    p = three(persistent=True)
    for n in "abc":
        it = p.by_key()[key(n, "grads")]
        assert (it.start, it.end) == (0, 6)
        assert it.offset is None and p.shares[it.key] == []
        assert not any(it.key in s for s in p.shares.values())
    # the residents nest (each forward before, its backward after the next
    # layer's): none shares; the gradients are their own memory beside
    assert p.pages_bytes == 12 * G
    assert p.own_bytes == 6 * G
    assert p.total_bytes == 18 * G


def test_gradients_of_the_first_layer_land_on_resident_memory_of_later_layers():
    p = three()
    # the first layer's gradients begin at the last backward: every resident
    # but its own is free by then
    ga = bytes_of(p, key("a", "grads"))
    later = bytes_of(p, key("b", "resident")) | bytes_of(p, key("c", "resident"))
    assert ga and ga <= later
    assert key("a", "grads") in [k for k2 in (key("b", "resident"), key("c", "resident")) for k in p.shares[k2]]


def test_overlapping_lives_never_share_a_byte():
    p = three()
    items = p.items
    for a in items:
        for b in items:
            if a is not b and a.overlaps(b):
                assert not (bytes_of(p, a.key) & bytes_of(p, b.key)), (a, b)
    # a layer's resident and its own gradients meet at its backward
    assert not bytes_of(p, key("c", "resident")) & bytes_of(p, key("c", "grads"))


def test_predicted_size_is_the_busiest_use():
    # at c's backward: three residents and c's gradients, 4 + 4 + 4 + 2 granules
    p = three()
    assert p.unplanned_peak == 14 * G
    assert p.pages_bytes == 14 * G
    assert p.total_bytes == 14 * G
    assert all(it.offset % G == 0 for it in p.items)
    # and the summary says where, and what is alive there
    assert p.busiest_use() == (3, {"resident": 12 * G, "grads": 2 * G})
    assert "the busiest use: c's backward, resident 48.0 KiB, grads 8.0 KiB" in p.summary()


def test_random_timelines_place_without_overlap_and_within_the_sum():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 6)
        names = ["l%d" % i for i in range(n)]
        order = default_order(names)
        res = {m: rng.randint(1, 5 * G) for m in names if rng.random() < 0.8}
        grads = [(m, [m], rng.randint(1, 3 * G), rng.random() < 0.2) for m in names if rng.random() < 0.8]
        if not res and not grads:
            continue
        items = memplan.lives(order, res, grads)
        p = memplan.Plan(order, items, G)
        for a in items:
            for b in items:
                if a is not b and a.offset is not None and b.offset is not None and a.overlaps(b):
                    assert not (bytes_of(p, a.key) & bytes_of(p, b.key)), (a, b)
        shared = [it for it in items if it.shared]
        assert p.pages_bytes >= max([sum(-(-it.nbytes // G) * G for it in shared if it.start <= t <= it.end)
                                     for t in range(len(order) + 1)] or [0])
        assert p.pages_bytes <= sum(-(-it.nbytes // G) * G for it in shared)


def test_one_f_one_b_residents_of_microbatches_share():
    # 1F1B over one layer and three microbatches with one in flight: the
    # residents of mb0 and mb1 never live at once, so they share
    order = [("x/mb0", False), ("x/mb0", True), ("x/mb1", False), ("x/mb1", True), ("x/mb2", False), ("x/mb2", True)]
    items = memplan.lives(order, {"x/mb%d" % i: 3 * G for i in range(3)}, [])
    p = memplan.Plan(order, items, G)
    assert p.pages_bytes == 3 * G
    assert sorted(p.shares[key("x/mb0", "resident")]) == [key("x/mb1", "resident"), key("x/mb2", "resident")]


# -------------------------- gradients on their own layer's read resident pages

def _split_lives(persistent=False, pairs=None, grad=6 * G):
    names = ["a", "b"]
    order = default_order(names)
    items = memplan.lives(order, {n: 4 * G for n in names}, [(n, [n], grad, persistent) for n in names])
    pairs = {"a": ("a", {0: 3, 2: 2})} if pairs is None else pairs
    return order, items, memplan.share_grads(items, pairs, G)


def test_a_gradient_slot_takes_the_resident_granules_its_layer_has_read():
    # a_f=0 b_f=1 b_b=2 a_b=3, the step's end 4; a's gradient granules 0 and 2
    # on its resident granules 3 and 2
    order, before, (items, splits) = _split_lives()
    by = {it.key: it for it in items}
    assert len(splits) == 1 and splits[0].pairs == {0: 3, 2: 2}
    # the granules both map live from a's forward to the gradients' end;
    # the rest of each slot keeps its life
    assert (by[("a", memplan.SHARED)].nbytes, by[("a", memplan.SHARED)].start, by[("a", memplan.SHARED)].end) == \
        (2 * G, 0, 4)
    assert (by[("a", "resident")].nbytes, by[("a", "resident")].start, by[("a", "resident")].end) == (2 * G, 0, 3)
    assert (by[("a", "grads")].nbytes, by[("a", "grads")].start, by[("a", "grads")].end) == (4 * G, 3, 4)
    assert by[("a", memplan.SHARED)].mapped_by == [("a", "resident"), ("a", "grads")]
    # b, not in the pairs, as it was
    assert [(it.key, it.nbytes) for it in items if it.key[0] == "b"] == \
        [(it.key, it.nbytes) for it in before if it.key[0] == "b"]
    plan = memplan.Plan(order, items, G)
    at = {k: plan.by_key()[k].offset for k in (("a", "resident"), ("a", "grads"), ("a", memplan.SHARED))}
    res, grads = splits[0].tables(at, G)
    # a gradient granule on the page of the resident granule it was paired with
    assert grads[0] == res[3] and grads[2] == res[2]
    # and no two granules of one slot on one page
    assert len(set(res)) == 4 and len(set(grads)) == 6
    assert res[0] == at[("a", "resident")] and res[1] == at[("a", "resident")] + G
    assert grads[1] == at[("a", "grads")] and grads[3] == at[("a", "grads")] + G
    # no layout shares a byte between lives that overlap
    for x in plan.items:
        for y in plan.items:
            if x is not y and x.overlaps(y):
                assert not bytes_of(plan, x.key) & bytes_of(plan, y.key), (x, y)
    # and the busiest use (a's backward: every gradient, a's resident) holds
    # the shared granules once
    alone = memplan.Plan(order, before, G)
    assert plan.pages_bytes == alone.pages_bytes - 2 * G
    assert "a grads on resident: 8.0 KiB" in plan.summary() and "shares with a resident, a grads" in plan.summary()


def test_a_whole_slot_taken_leaves_no_part_of_its_own():
    order, _, (items, splits) = _split_lives(pairs={"a": ("a", {0: 1, 1: 0, 2: 3})}, grad=3 * G)
    keys = {it.key for it in items if it.key[0] == "a"}
    assert keys == {("a", "resident"), ("a", memplan.SHARED)}       # a resident granule is left, no gradient one
    assert splits[0].own is None and splits[0].head == ("a", "resident")
    _, _, (items, splits) = memplan.lives(default_order(["a"]), {"a": 2 * G}, [("a", ["a"], 2 * G, False)]), None, \
        memplan.share_grads(memplan.lives(default_order(["a"]), {"a": 2 * G}, [("a", ["a"], 2 * G, False)]),
                            {"a": ("a", {0: 1, 1: 0})}, G)
    assert [it.key for it in items] == [("a", memplan.SHARED)] and splits[0].head is None and splits[0].own is None
    plan = memplan.Plan(default_order(["a"]), items, G)
    at = {("a", memplan.SHARED): plan.items[0].offset}
    res, grads = splits[0].tables(at, G)
    assert res == [at[("a", memplan.SHARED)], at[("a", memplan.SHARED)] + G] and grads == [res[1], res[0]]


def test_gradients_are_shared_only_in_the_pages_and_from_their_layers_backward():
    # a persistent .grad keeps memory of its own
    _, before, (items, splits) = _split_lives(persistent=True)
    assert not splits and items == before
    # gradients written by several layers' backwards begin at the first of
    # them: not the paired layer's, whose bytes another backward may write
    order = default_order(["a", "b"])
    items0 = memplan.lives(order, {"a": 4 * G, "b": 4 * G}, [("ab", ["a", "b"], 3 * G, False)])
    items, splits = memplan.share_grads(items0, {"ab": ("a", {0: 0})}, G)
    assert not splits and items == items0
    # nothing paired: nothing split
    _, before, (items, splits) = _split_lives(pairs={"a": ("a", {})})
    assert not splits and items == before


def test_pairs_that_do_not_fit_their_slots_are_refused():
    for bad in ({0: 1, 1: 1}, {6: 0}, {0: 4}):
        with pytest.raises(ValueError, match="do not fit"):
            _split_lives(pairs={"a": ("a", bad)})


def test_bad_timelines_are_refused():
    order = default_order(["a"])
    with pytest.raises(ValueError, match="not in the order"):
        memplan.lives(order, {"b": G}, [])
    with pytest.raises(ValueError, match="twice"):
        memplan.lives(order + [("a", True)], {}, [])
    with pytest.raises(ValueError, match="backward"):
        memplan.lives(order, {}, [("g", ["z"], G, False)])


def test_summary_says_what_shares_with_what():
    text = three().summary()
    assert "memory plan: 56.0 KiB predicted: 56.0 KiB of pages for 6 slots" in text
    assert "a grads" in text and "shares with" in text


# ------------------------------------------------- on the host backend
# The plan as make_graphed_callables applies it (graphs=False: the host
# backend emulates the GPU on host memory, and the same hooks run).

N = 4


def _build(plan=True, mode="none", **kw):
    g = vt.make_graphed_callables(tuple(zoo_layers(N)), samples(N), graphs=False, mode=mode, lookahead=1,
                                  min_bytes=0, options={"host_granularity": 4096}, memory_plan=plan, **kw)
    return g, vt.offload_of(g[0])


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 8, 32, generator=gen, requires_grad=True), torch.randn(2, 8, 32, generator=gen)


def _settle(off):
    # the releases after each backward are ordered on the host backend's
    # stream and then go to the workers (test_driver_calls.py)
    off.runtime.stream_synchronize(None)
    off.sync()


def _train(plan, steps, set_to_none=True, mode="none", keep_at=None, **kw):
    """Steps of the set_to_none (or persistent .grad) loop; returns the
    gradients after each step, the driver calls each step made, the stats
    and describe() at the end, and (keep_at) what a kept .grad held."""
    g, off = _build(plan, mode, **kw)
    params = [p for m in g for p in m.parameters()]
    out = {"grads": [], "calls": []}
    try:
        for i in range(steps):
            kept = None
            if set_to_none:
                if i == keep_at:
                    # the user keeps the first layer's gradients across the
                    # next forward
                    kept = [p.grad for p in g[0].parameters()]
                    values = [t.clone() for t in kept]
                for m in g:
                    m.zero_grad(set_to_none=True)
            before = off.stats()["driver_calls"]
            x, gy = _inputs(i)
            y = run(g, x)
            if kept is not None:
                out["after_forward"] = [torch.equal(a, b) for a, b in zip(kept, values)]
            (y * gy).sum().backward()
            del y, kept
            _settle(off)
            out["calls"].append(off.stats()["driver_calls"] - before)
            out["grads"].append([p.grad.clone() for p in params])
        out["stats"] = off.stats()
        out["describe"] = off.describe()
        out["plan"] = off.memplan.plan
        out["first_grads"] = off.layers[0].grads.name
    finally:
        off.close()
    return out


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("mode,kw", [("none", {}), ("pingpong", {"offload": 0.5})])
def test_set_to_none_loop_shares_pages_and_makes_no_driver_call(mode, kw):
    on = _train(True, 5, mode=mode, **kw)
    off = _train(False, 5, mode=mode, **kw)
    # the plan is made at the second step's first forward: from the third
    # step on, nothing is mapped or released
    assert on["calls"][2:] == [0, 0, 0], on["calls"]
    assert all(c > 0 for c in off["calls"]), off["calls"]
    assert on["stats"]["plan_bytes"] == on["plan"].pages_bytes > 0
    assert on["stats"]["plan_conflicts"] == 0
    # what the runtime holds for its slots is what the plan predicted
    assert on["stats"]["slot_bytes"] == on["plan"].total_bytes
    # gradients at their layers' backward land on resident memory of the
    # layers whose backward came before
    # (or on their own layer's, once it has read them: memplan.share_grads)
    mine = [k for k in on["plan"].shares if k[0] == on["first_grads"] and k[1] in ("grads", memplan.SHARED)]
    assert any(k[1] == memplan.SHARED for k in mine) or \
        any(k[1] in ("resident", memplan.SHARED) for m in mine for k in on["plan"].shares[m])
    # (a shared life's bytes are mapped by two slots)
    assert on["plan"].pages_bytes < sum(it.nbytes * (2 if it.kind == memplan.SHARED else 1) for it in on["plan"].items)
    for a, b in zip(on["grads"], off["grads"]):
        assert _same(a, b)
    assert "memory plan:" in on["describe"] and "shares with" in on["describe"]
    assert "memory plan: off (memory_plan=False)" in off["describe"]


@pytest.mark.skipif(not reuse.AVAILABLE, reason="torch without TorchDispatchMode or storage weak refs: no "
                    "backward timeline to pair the gradients by")
def test_gradients_on_their_layers_read_resident_pages_are_bitwise_as_apart(monkeypatch):
    """set_to_none: each layer's gradient granules that its backward writes
    after it has read the resident granules paired with them lie on those
    pages (memplan.share_grads): fewer pages, the same gradients bitwise,
    still no driver call in steady state."""
    shared = _train(True, 5)
    monkeypatch.setattr(memplan, "SHARE_GRADS", False)
    apart = _train(True, 5)
    st = shared["stats"]
    assert st["plan_grad_share_bytes"] > 0 and apart["stats"]["plan_grad_share_bytes"] == 0
    assert st["plan_grad_share_bytes"] <= st["grad_share_bytes"]
    assert shared["plan"].pages_bytes < apart["plan"].pages_bytes
    assert shared["calls"][2:] == [0, 0, 0] and st["plan_conflicts"] == 0
    assert st["slot_bytes"] == shared["plan"].total_bytes
    for a, b in zip(shared["grads"], apart["grads"]):
        assert _same(a, b)
    assert "grads on resident" in shared["describe"] and "lie there" in shared["describe"]


@pytest.mark.skipif(not reuse.AVAILABLE, reason="torch without TorchDispatchMode or storage weak refs: no "
                    "backward timeline to pair the gradients by")
def test_a_gradient_granule_and_its_resident_granule_are_one_page():
    import ctypes
    g, off = _build(True)
    try:
        for i in range(3):
            for m in g:
                m.zero_grad(set_to_none=True)
            x, gy = _inputs(i)
            (run(g, x) * gy).sum().backward()
            _settle(off)
        w = off.memplan
        assert w.splits and all(e.backing.bound for e in w.entries)
        lays = {lay.name: lay for lay in off.layers}
        for sp in w.splits:
            res, grads = lays[sp.layer].resident, lays[sp.layer].grads.backing
            assert res.planned.table is not None and grads.planned.table is not None
            for k, j in sp.pairs.items():
                # written through the gradient's address, read at the resident's
                at = ctypes.string_at(grads.address + k * G, G)
                assert ctypes.string_at(res.address + j * G, G) == at
                assert grads.planned.table[k] == res.planned.table[j]
            # the optimizer step and a use's check see every page it maps
            assert sorted(grads.planned.page_ranges()) == sorted(grads.planned.pages_of())
            assert sum(hi - lo for lo, hi in grads.planned.pages_of()) == grads.slot.size
    finally:
        off.close()


def test_persistent_grads_keep_their_own_memory():
    on = _train(True, 4, set_to_none=False)
    off = _train(False, 4, set_to_none=False)
    assert on["calls"][2:] == [0, 0]
    grads = [it for it in on["plan"].items if it.kind == "grads"]
    assert grads and all(it.offset is None and not it.shared for it in grads)
    assert all(not on["plan"].shares[it.key] for it in on["plan"].items if it.kind == "grads")
    assert on["plan"].own_bytes > 0 and on["stats"]["slot_bytes"] == on["plan"].total_bytes
    for a, b in zip(on["grads"], off["grads"]):
        assert _same(a, b)


@pytest.mark.parametrize("said,set_to_none,warned", [("set_to_none", False, True), ("persistent", True, True),
                                                       ("persistent", False, False), (None, False, False)])
def test_the_plan_warns_when_the_loop_it_learns_is_not_the_one_given(caplog, said, set_to_none, warned):
    # loop= is what offload="auto" weighed its plan for; the memory plan
    # learns the loop at the second step and says so when it differs
    with caplog.at_level("WARNING", logger="vmmrt.torch"):
        on = _train(True, 3, set_to_none=set_to_none, loop=said)
    learned = "set_to_none" if set_to_none else "persistent"
    hits = [r for r in caplog.records if "loop=%r was given" % (said,) in r.getMessage()]
    assert bool(hits) == warned, [r.getMessage() for r in caplog.records]
    if warned:
        assert "runs the %s loop" % learned in hits[0].getMessage()
    assert on["plan"] is not None


def test_a_grad_kept_across_the_next_forward_keeps_its_values():
    """The plan assumes zero_grad drops the gradients before the next
    forward; a .grad kept past it is found at the use that would write over
    it: the layer's resident slot gets memory of its own for that step."""
    on = _train(True, 6, keep_at=3)
    off = _train(False, 6, keep_at=3)
    # (or on their own layer's, once it has read them: memplan.share_grads)
    mine = [k for k in on["plan"].shares if k[0] == on["first_grads"] and k[1] in ("grads", memplan.SHARED)]
    assert any(k[1] == memplan.SHARED for k in mine) or \
        any(k[1] in ("resident", memplan.SHARED) for m in mine for k in on["plan"].shares[m])
    assert on["after_forward"] == [True] * len(on["after_forward"])
    assert on["stats"]["plan_conflicts"] >= 1
    assert off["stats"]["plan_conflicts"] == 0
    # the step after the conflict puts the slot back on the pages, then
    # nothing more
    assert on["calls"][5] == 0, on["calls"]
    for a, b in zip(on["grads"], off["grads"]):
        assert _same(a, b)


def test_memory_plan_must_be_a_bool():
    with pytest.raises(TypeError, match="memory_plan"):
        vt.make_graphed_callables(tuple(zoo_layers(1)), samples(1), graphs=False, memory_plan="yes")


def _pipeline_run(plan, steps=4):
    from test_pipeline import Pipe, batches, graphed, stage
    order = vt.order_1f1b(4, in_flight=2)
    base, _ = stage()
    g = graphed(base, order, mode="none", memory_plan=plan)
    off = vt.offload_of(g[0])
    out = {"grads": [], "calls": []}
    try:
        for i in range(steps):
            for m in base:
                m.zero_grad(set_to_none=True)
            before = off.stats()["driver_calls"]
            xs, gys = batches(4, i)
            Pipe(g, order, xs, gys).run()
            _settle(off)
            out["calls"].append(off.stats()["driver_calls"] - before)
            out["grads"].append([p.grad.clone() for m in base for p in m.parameters()])
        out["plan"] = off.memplan.plan
        out["stats"] = off.stats()
    finally:
        off.close()
    return out


def test_a_1f1b_pipeline_shares_residents_between_microbatches():
    """1F1B with two microbatches in flight: a runner per (layer,
    microbatch), the gradients of a layer shared by its runners from the
    first of their backwards; residents of microbatches whose lives do not
    overlap share pages."""
    on, off = _pipeline_run(True), _pipeline_run(False)
    assert on["calls"][2:] == [0, 0], on["calls"]
    p = on["plan"]
    res = [it for it in p.items if it.kind == "resident"]
    assert any(k[1] == "resident" for it in res for k in p.shares[it.key])
    assert on["stats"]["slot_bytes"] == p.total_bytes and on["stats"]["plan_conflicts"] == 0
    for a, b in zip(on["grads"], off["grads"]):
        assert _same(a, b)


def test_a_step_abandoned_after_a_forward_leaves_nothing_held():
    """One microbatch in flight: the resident slots of the microbatches
    share pages. A step abandoned (Offload.abort) after a forward whose
    backward never came must not leave that resident counted as in use,
    or the next step's first forward would find its bytes held."""
    from test_pipeline import Pipe, batches, graphed, stage
    order = vt.order_1f1b(3, in_flight=1)
    base, _ = stage()
    g = graphed(base, order, mode="none")
    off = vt.offload_of(g[0])
    try:
        for i in range(5):
            for m in base:
                m.zero_grad(set_to_none=True)
            xs, gys = batches(3, i)
            pipe = Pipe(g, order, xs, gys)
            if i == 3:
                pipe.run(3)                  # microbatch 0's forward and backward, microbatch 1's forward
                off.abort()
                continue
            pipe.run()
            _settle(off)
        p = off.memplan.plan
        assert any(k[1] == "resident" for it in p.items if it.kind == "resident" for k in p.shares[it.key])
        assert off.stats()["plan_conflicts"] == 0
    finally:
        off.close()


def test_a_slot_the_driver_will_not_put_on_the_pages_leaves_no_pages_behind(monkeypatch):
    """A driver that refuses to map the pages (the H200's refused a handle
    mapped from an offset): no plan, and its pages given back at once, not
    held beside every slot's own memory; the step goes on without it."""
    import vmmrt
    made = []
    pages = vmmrt.Runtime.pages

    def tracked(self, nbytes):
        made.append(pages(self, nbytes))
        return made[-1]

    def refused(self, pages, offset=0):
        raise vmmrt.Error(vmmrt._capi.E_NOT_SUPPORTED, "made up for the test", "vmmrt_slot_map_pages")
    def refused_table(self, pages, offsets):
        refused(self, pages)
    monkeypatch.setattr(vmmrt.Runtime, "pages", tracked)
    monkeypatch.setattr(vmmrt.Slot, "map_pages", refused)
    monkeypatch.setattr(vmmrt.Slot, "map_pages_table", refused_table)
    on = _train(True, 4)
    off = _train(False, 4)
    assert made and all(p.destroyed for p in made)
    # given back when the plan gave up, not at close: the runtime's slot
    # memory after the last step is what it is without a plan
    assert on["stats"]["slot_bytes"] == off["stats"]["slot_bytes"], (on["stats"]["slot_bytes"], made[0].size)
    assert on["stats"]["plan_bytes"] == 0 and on["stats"]["plan_binds"] == 0
    assert "could not be put on its pages" in on["describe"] and "made up for the test" in on["describe"]
    # the whole step's model keeps its estimate: no pages to take the bytes of
    assert "from the memory plan's pages" not in on["describe"]
    assert all(c > 0 for c in on["calls"])
    for a, b in zip(on["grads"], off["grads"]):
        assert _same(a, b)


def test_pages_that_cannot_be_made_leave_the_slots_as_without_a_plan(monkeypatch):
    """No device memory for the pages (or any failure to make them): the
    step goes on, each slot mapped and released around its use, and
    describe() says why."""
    import vmmrt

    def refused(self, nbytes):
        raise vmmrt.Error(vmmrt._capi.E_OUT_OF_MEMORY, "made up for the test", "vmmrt_pages_create")
    monkeypatch.setattr(vmmrt.Runtime, "pages", refused)
    on = _train(True, 4)
    off = _train(False, 4)
    assert on["plan"] is not None and on["stats"]["plan_bytes"] == 0 and on["stats"]["plan_binds"] == 0
    assert "could not be made" in on["describe"] and "made up for the test" in on["describe"]
    # (how many per step varies with the workers' timing: a release not run
    # yet is cancelled by the next map)
    assert all(c > 0 for c in on["calls"])
    for a, b in zip(on["grads"], off["grads"]):
        assert _same(a, b)


def test_a_framework_driving_its_own_runners_plans_them_too():
    """Offload.plan_memory() after allocation, as make_graphed_callables
    calls it: the resident slots of runners a framework drives itself go on
    the pages once a step has run."""
    import copy
    mods = zoo_layers(3)
    ref = copy.deepcopy(mods)
    off = vt.Offload(mode="none", device="cpu", min_bytes=0, options={"host_granularity": 4096})
    lays = [off.layer("runner%d" % i, static=list(m.parameters())) for i, m in enumerate(mods)]
    x0 = torch.randn(2, 8, 32, requires_grad=True)
    for lay, m in zip(lays, mods):
        with lay.discovering() as p:
            p.outputs = m(x0)
        p.outputs.sum().backward()
    off.allocate(offload=0.0)
    off.plan_memory()
    calls = []
    try:
        for i in range(4):
            for m in mods + ref:
                m.zero_grad(set_to_none=True)
            before = off.stats()["driver_calls"]
            x = _inputs(i)[0].detach()
            runner_step(lays, mods, x)
            _settle(off)
            calls.append(off.stats()["driver_calls"] - before)
            run(ref, x.clone().requires_grad_()).backward(torch.ones(2, 8, 32))
            assert _same([p.grad for m in mods for p in m.parameters()], [p.grad for m in ref for p in m.parameters()])
        assert all(lay.resident is not None and lay.resident.bound for lay in lays)
        assert calls[2:] == [0, 0], calls
        assert "memory plan:" in off.describe()
    finally:
        off.close()


@pytest.mark.parametrize("mode", ["none", "pingpong"])
def test_the_graphed_call_path_on_the_plan_makes_no_driver_call(monkeypatch, mode):
    """The graphs=True call path (vmmrt.torch._call: the hooks around each
    replay, the gradients of grads="mapped" through Grads.before_backward),
    driven on the host backend with graphs that capture nothing
    (test_call_path.py's harness): once the plan is made, no step maps or
    releases anything, and every slot is on the pages."""
    import contextlib
    import test_call_path as cp
    monkeypatch.setattr(torch.cuda, "CUDAGraph", cp._Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    g, off, _ = cp._graphed_on_host(mode, "mapped")
    off.plan_memory()           # as make_graphed_callables does after the captures
    try:
        step = cp._stepper(g)
        calls = []
        for _ in range(4):
            before = off.stats()["driver_calls"]
            step()
            _settle(off)
            calls.append(off.stats()["driver_calls"] - before)
        assert calls[2:] == [0, 0], calls
        assert all(e.backing.bound for e in off.memplan.entries) and off.memplan.entries
        assert any(it.kind == "grads" and it.shared for it in off.memplan.plan.items)
        assert off.stats()["plan_conflicts"] == 0
    finally:
        off.close()


def _raw_when_free(monkeypatch):
    """The CUDA path's launch decision on the host backend: where only the
    host backend keeps torch's replay, a graph gets the executable handle of
    an empty host graph of the library's own (as torch gives a CUDA graph's),
    unless memory is mapped per use (vmmrt.torch._launch)."""
    from vmmrt.torch import _launch
    decide = _launch.Launcher._decide

    def d(self):
        decide(self)
        if self.how != "torch replay (host backend)":
            return
        if self.off.maps_per_use():
            self.how = _launch.MAPPED
            return
        rt = self.off.runtime
        s = rt.stream_create()
        rt.graph_begin_capture(s)
        h = rt.graph_end_capture(s)
        self.off._close_hooks.append(lambda: (rt.graph_destroy(h), rt.stream_destroy(s)))
        self.exec, self.how = -h.value, _launch.PROBING
    monkeypatch.setattr(_launch.Launcher, "_decide", d)


@pytest.mark.parametrize("grads", ["static", "mapped"])
def test_the_plan_lets_each_graph_launch_in_one_call(monkeypatch, grads):
    """Memory mapped per use keeps torch's replay (the hooks and the graph
    apart); once the plan has put every slot on its pages, the graphs
    launch in one library call each (vmmrt_group_replay), no driver call,
    no torch replay. A .grad kept across the next forward still keeps its
    values: the layer's resident slot leaves the pages at the one-call
    forward too, and the graphs go back to the hooks."""
    import contextlib
    import test_call_path as cp
    from vmmrt.torch import _launch
    monkeypatch.setattr(torch.cuda, "CUDAGraph", cp._Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    _raw_when_free(monkeypatch)
    g, off, _ = cp._graphed_on_host("none", grads)
    off.plan_memory()
    params = [p for m in g for p in m.parameters()]
    x, gy = torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32)

    def run():
        y = x
        for m in g:
            y = m(y)
        y.backward(gy)
    try:
        assert off.maps_per_use() and set(off.stats()["graph_launches"]) == {_launch.MAPPED}
        step = cp._stepper(g)
        for _ in range(4):
            step()
            _settle(off)
        hows = off.stats()["graph_launches"]
        # every forward and backward graph; grads="mapped"'s accumulating
        # backwards wait for their first use (the set_to_none loop has none)
        assert hows.get(_launch.RAW) == 2 * len(g), hows
        assert set(hows) == ({_launch.RAW} if grads == "static" else {_launch.RAW, _launch.PROBING}), hows
        before, replays = off.stats()["driver_calls"], cp._Graph.replays
        step()
        _settle(off)
        assert cp._Graph.replays == replays     # not one torch replay: the library launched every graph
        assert off.stats()["driver_calls"] == before and off.stats()["plan_conflicts"] == 0
        # each backward ended its resident slot's use (a pipeline's
        # microbatches share those bytes: still in use would be a conflict)
        assert not any(lay.resident.busy for lay in off.layers if lay.resident is not None)
        if grads == "static":
            return
        run()
        kept = [p.grad for p in params]
        values = [k.clone() for k in kept]
        for p in params:
            p.grad = None
        run()                                       # its forwards find the kept gradients' bytes held
        _settle(off)
        assert off.stats()["plan_conflicts"] >= 1
        assert all(torch.equal(k, v) for k, v in zip(kept, values))
        assert _launch.MAPPED in off.stats()["graph_launches"]
    finally:
        off.close()


def test_the_accumulating_backward_launches_in_one_call_too(monkeypatch):
    """grads="mapped" in the persistent .grad loop: the backward that adds
    into a .grad already at its address (the accumulate graph) is launched
    in one library call once the plan is made, as the others; no torch
    replay, no driver call per step."""
    import contextlib
    import test_call_path as cp
    from vmmrt.torch import _launch
    monkeypatch.setattr(torch.cuda, "CUDAGraph", cp._Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    _raw_when_free(monkeypatch)
    g, off, _ = cp._graphed_on_host("none", "mapped")
    off.plan_memory()
    params = [p for m in g for p in m.parameters()]
    x, gy = torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32)

    def step():                 # zero_grad(set_to_none=False): .grad stays, zeroed
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        y = x
        for m in g:
            y = m(y)
        y.backward(gy)
    try:
        for _ in range(5):
            step()
            _settle(off)
        # forwards and accumulating backwards; the writing backwards wait
        # for a first use (.grad is never None again in this loop)
        ways = {k: l.how for k, l in off.launchers.items()}
        assert all(how == _launch.RAW for (_, kind), how in ways.items() if kind in (False, "accumulate")), ways
        assert {how for (_, kind), how in ways.items() if kind is True} == {_launch.PROBING}, ways
        before, replays = off.stats()["driver_calls"], cp._Graph.replays
        step()
        _settle(off)
        assert cp._Graph.replays == replays and off.stats()["driver_calls"] == before
        assert all(p.grad is not None for p in params)
    finally:
        off.close()


@pytest.mark.parametrize("asked,planned", [(None, True), (True, True), (False, False)])
def test_memory_budget_plans_on_the_pages_unless_turned_off(asked, planned):
    """With memory_budget= the memory plan is on unless memory_plan=False
    turns it off, as without one (the budget planner predicts the pages:
    test_budget)."""
    from vmmrt.torch.budget import Budget
    kw = {} if asked is None else {"memory_plan": asked}
    g = vt.make_graphed_callables(tuple(zoo_layers(2)), samples(2), graphs=False, mode="pingpong", min_bytes=0,
                                  options={"host_granularity": 4096}, memory_budget=Budget(layers=["keep", 0.5]), **kw)
    off = vt.offload_of(g[0])
    try:
        assert off.memplan.enabled is planned
        # the host backend routes no optimizer step to the pages: predicted beside them
        assert off.plan.pages is False
    finally:
        off.close()
    g = vt.make_graphed_callables(tuple(zoo_layers(2)), samples(2), graphs=False, mode="pingpong", min_bytes=0,
                                  options={"host_granularity": 4096}, **kw)
    off = vt.offload_of(g[0])
    try:
        assert off.memplan.enabled is (asked is not False)     # without a budget: on unless turned off
    finally:
        off.close()


def test_the_layout_leaves_the_optimizer_whole_segments_where_slots_are_small():
    # 16 layers of a few MiB each (hidden 1024, seq 1024 on the H200): the
    # smallest layout leaves 27 MiB runs between the gradients' slots at the
    # step's end, where foreach AdamW's 20 MiB segments fit one each (124
    # MiB from the driver at the step); the layout chosen costs a granule
    # more of pages and leaves the driver 24 MiB (a layout with the
    # gradients together, 58 MiB more of pages, would leave it none).
    M = 1 << 20
    L = 16
    order = [("l%d" % i, False) for i in range(L)] + [("l%d" % i, True) for i in reversed(range(L))]

    def items():
        return memplan.lives(order, {"l%d" % i: 56 * M for i in range(L)},
                             [("l%d" % i, ["l%d" % i], 29 * M, False) for i in range(L)])
    need = L * 29 * M

    def driver(p):
        offs = {it.key: it.offset for it in p.items}
        runs = memplan.free_runs(p.items, offs, p.pages_bytes, len(order), 2 * M)
        return max(0, need - sum(r - r % memplan.SEGMENT for r in runs))
    small = memplan.Plan(order, items(), 2 * M)
    planned = memplan.Plan(order, items(), 2 * M, optimizer_need=need)
    assert planned.pages_bytes > small.pages_bytes
    assert driver(planned) < driver(small)
    assert planned.pages_bytes + driver(planned) < small.pages_bytes + driver(small)
    assert planned.pages_bytes + driver(planned) < small.pages_bytes + 58 * M
    # with no temporaries to place, the smallest
    assert memplan.Plan(order, items(), 2 * M, optimizer_need=0).pages_bytes == small.pages_bytes


def test_a_plan_that_recomputes_layers_is_laid_out_at_its_busiest_use():
    # 8 Llama-3-8B layers, layers 1 and 6 recomputed (no resident slot): the
    # graphs' pool (1400 MiB), six resident slots (832) and eight gradients'
    # slots (480). The first fit by size, by start or by end left the pages
    # 736 MiB above the busiest use (7736 MiB); no layout can be below it.
    M = 1 << 20
    names = ["layer%d" % i for i in range(8)]
    order = [(n, False) for n in names] + [(n, True) for n in reversed(names)]
    items = memplan.lives(order, {n: 832 * M for i, n in enumerate(names) if i not in (1, 6)},
                          [(n, [n], 480 * M, False) for n in names], pool=1400 * M)
    p = memplan.Plan(order, items, 2 * M)
    assert memplan.busiest(items, 2 * M) == 7000 * M == p.unplanned_peak
    assert p.pages_bytes == 7000 * M
    # with the optimizer step's temporaries (foreach AdamW: the gradients'
    # size) to serve at the step's end, the pages and what they leave the
    # driver cost no more than the best layout by key (7128 MiB of pages,
    # 48 MiB from the driver)
    need = 3328 * M
    q = memplan.Plan(order, items, 2 * M, optimizer_need=need)
    offs = {it.key: it.offset for it in q.items}
    runs = memplan.free_runs(q.items, offs, q.pages_bytes, len(order), 2 * M)
    driver = max(0, need - sum(r - r % memplan.SEGMENT for r in runs))
    assert q.pages_bytes >= 7000 * M and q.pages_bytes + driver <= (7128 + 48) * M
    for a in p.items + q.items:         # and each is a layout: no byte shared by two lives at once
        for b in (p.items if a in p.items else q.items):
            if a is not b and a.overlaps(b):
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset


def test_the_graphs_pool_lives_the_step_but_its_end_and_serves_the_optimizer_there():
    # The graphs' pool on a slot (vmmrt.torch.graphpool): every replay uses it,
    # so its life is the step's first use to its last; at the step's end its
    # bytes are free, and the optimizer's temporaries fit there instead of
    # more pages.
    M = 1 << 20
    order = [("a", False), ("b", False), ("b", True), ("a", True)]
    res = {"a": 40 * M, "b": 40 * M}
    grads = [("a", ["a"], 20 * M, False), ("b", ["b"], 20 * M, False)]
    items = memplan.lives(order, res, grads, pool=60 * M)
    pool = next(it for it in items if it.kind == memplan.POOL)
    assert (pool.start, pool.end, pool.nbytes) == (0, 3, 60 * M)
    need = 40 * M                   # the gradients' size: foreach AdamW's temporaries
    with_pool = memplan.Plan(order, items, 2 * M, optimizer_need=need)
    offs = {it.key: it.offset for it in with_pool.items}
    runs = memplan.free_runs(with_pool.items, offs, with_pool.pages_bytes, len(order), 2 * M)
    assert sum(r - r % memplan.SEGMENT for r in runs) >= need
    # no more pages than the busiest use needs: the temporaries cost nothing
    assert with_pool.pages_bytes == with_pool.unplanned_peak
    assert "graphs pool" in with_pool.summary()


def test_the_graphs_pools_parts_live_at_their_uses_and_positions_outside_the_step_are_refused():
    M = 1 << 20
    order = [("a", False), ("b", False), ("b", True), ("a", True)]
    res = {"a": 40 * M, "b": 40 * M}
    parts = [(30 * M, 2, 2), (4 * M, None, None), (10 * M, 0, 3)]
    items = memplan.lives(order, res, [], pool=parts)
    got = [(it.key, it.start, it.end, it.nbytes) for it in items if it.kind == memplan.POOL]
    assert got == [(memplan.POOL_KEY + (0,), 2, 2, 30 * M), (memplan.POOL_KEY + (1,), 0, 3, 4 * M),
                   (memplan.POOL_KEY + (2,), 0, 3, 10 * M)]
    # a part at one use says which
    assert "b's backward" in items[2].why
    for bad in [(M, 3, 4), (M, -1, 0), (M, 2, 1)]:
        with pytest.raises(ValueError, match="not the step's"):
            memplan.lives(order, res, [], pool=[bad])


def test_a_slot_found_free_is_asked_again_once_a_tensor_is_made_over_it():
    """A use asks only the slots sharing its bytes that are not quiet
    (Backing.quiet: found free when last asked, nothing since that could
    hold them): a tensor made over one (Backing.tensor) makes it asked
    again, and the use sees its bytes held."""
    g, off = _build(True)
    params = [p for m in g for p in m.parameters()]
    try:
        for i in range(4):
            for p in params:
                p.grad = None
            x, gy = _inputs(i)
            (run(g, x) * gy).sum().backward()
            _settle(off)
        for p in params:
            p.grad = None
        entries = [e for e in off.memplan.entries if getattr(e, "sharers", None)]
        assert entries and all(e.backing.bound for e in entries)
        for e in entries:
            assert not e._held()
        quiet = [(e, o) for e in entries for o in e.sharers if o.quiet]
        assert quiet, "a steady step leaves the slots it asked quiet"
        e, o = quiet[0]
        t = o.tensor(None)
        assert not o.quiet
        # the per-hook check (Watcher.begin_uses) asks it again: held
        assert off.memplan.begin_uses((e.backing,), None) == 0
        assert o in e._held()
        del t
        assert not e._held()
        assert off.memplan.begin_uses((e.backing,), None) == 1
        e.backing.release(None)
    finally:
        off.close()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_the_whole_step_model_takes_the_plans_bytes_in_the_loop_the_plan_learned(set_to_none):
    """Offload.step_model predicts from the budget planner's estimate until
    the memory plan is made; then (StepModel.planned) its loop's peak is
    the plan's pages and own memory in place of the estimated activations,
    gradients and working set, and describe() says so."""
    from vmmrt.torch import budget
    g, off = _build(True, "pingpong", offload=0.5)
    m = off.step_model
    R, S = 3 << 20, 1 << 20
    loop, other = ("set_to_none", "persistent") if set_to_none else ("persistent", "set_to_none")
    try:
        assert m is not None and m.made is None
        before = {x: m.peak(R, S, x) for x in (loop, other)}
        for i in range(3):
            if set_to_none:
                for mod in g:
                    mod.zero_grad(set_to_none=True)
            x, gy = _inputs(i)
            y = run(g, x)
            (y * gy).sum().backward()
            del y
            _settle(off)
        plan = off.memplan.plan
        assert plan is not None and m.made["loop"] == loop and m.made["total"] == plan.total_bytes
        p = budget.predict(m.costs, m.chosen, persistent=not set_to_none, static_bytes=m.static_bytes + R,
                           step_bytes=S, **m.kw)
        assert p.peak_bytes == before[loop]
        # the host backend has no graphs' pool: the working set beside the
        # pages; the optimizer's temporaries in the pages' free bytes and the banks
        want = (m.static_bytes + R + p.inputs_bytes + p.bank_bytes + plan.total_bytes
                + max(0, S - plan.free_at_end - p.bank_bytes) + p.inflight_bytes)
        assert m.peak(R, S, loop) == want != before[loop]
        assert m.peak(R, S, other) == before[other]
        assert "the %s loop's from the memory plan's pages" % loop in off.describe()
    finally:
        off.close()


def test_a_step_model_that_fails_at_the_plan_leaves_the_plan_applied(monkeypatch, caplog):
    """The model's failure to take the plan's bytes is logged and the model
    dropped; the plan is applied and the steps go on without driver calls."""
    from vmmrt.torch import planner

    def broken(self, *a, **k):
        raise RuntimeError("made up for the test")
    monkeypatch.setattr(planner.StepModel, "planned", broken)
    with caplog.at_level("WARNING", logger="vmmrt.torch"):
        out = _train(True, 4)
    assert "could not take the memory plan" in caplog.text and "made up for the test" in caplog.text
    assert out["plan"] is not None and out["stats"]["plan_binds"] > 0 and out["calls"][-1] == 0
    assert "whole step, predicted" not in out["describe"]
