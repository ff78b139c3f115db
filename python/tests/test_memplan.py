# SPDX-License-Identifier: LGPL-2.1-or-later
"""The memory plan's arithmetic (vmmrt.torch.memplan) on made-up timelines:
the lives of the resident and gradient slots, where each lands in the
pages, what shares with what, and the predicted size."""
import random

import pytest

from vmmrt.torch import memplan

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
    assert "memory plan: 56.0 KiB of pages for 6 slots" in text
    assert "a grads" in text and "shares with" in text
