# SPDX-License-Identifier: LGPL-2.1-or-later
"""memory_budget=: the planner's arithmetic (hand-computed cases), the budget's
parsing, the smallest budget of the no-fit error, recomputation against
torch.utils.checkpoint (bitwise, host backend) and the refusals."""
import contextlib
import json
import logging

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import vmmrt
import vmmrt.torch as vt
from vmmrt.torch import budget
from vmmrt.torch.budget import Budget, BudgetError, InvalidBudget, LayerCost


# ------------------------------------------------------------------ parsing
def test_parse_takes_bytes_shares_and_sizes():
    assert budget.parse(1 << 30) == 1 << 30
    assert budget.parse("80%", 1000) == 800
    assert budget.parse(" 100 % ", 1000) == 1000
    assert budget.parse("60GiB") == 60 << 30
    assert budget.parse("1.5 GB") == 1500 * 1000 ** 2
    assert budget.parse("512mib") == 512 << 20


@pytest.mark.parametrize("bad,why", [
    (True, "bool"), (1.5, "float"), (None, "NoneType"), (-1, "positive"), (0, "positive"),
    ("0%", "above 0%"), ("101%", "at most 100%"), ("abc", "not a budget"), ("5 parsecs", "unknown unit"),
    ("80", None), ("-5GiB", "not a budget")])
def test_parse_refuses_with_a_named_error(bad, why):
    if bad == "80":           # a bare number in a string is bytes
        assert budget.parse(bad) == 80
        return
    with pytest.raises(InvalidBudget) as e:
        budget.parse(bad, 1000)
    assert e.value.name == "VMMRT_E_INVALID_ARGUMENT" and why in str(e.value)
    assert isinstance(e.value, vmmrt.Error) and isinstance(e.value, ValueError)


def test_a_share_needs_the_device_total():
    with pytest.raises(InvalidBudget, match="total memory is not known"):
        budget.parse("50%")


# --------------------------------------------------------------- arithmetic
def _three():
    # decimal bytes: at 10 GB/s a copy moves 1e7 bytes per ms
    return [LayerCost("l%d" % i, 10.0, 20.0, [300_000_000, 100_000_000]) for i in range(3)]


def test_hand_plan_time_and_peak_by_hand():
    five = [LayerCost("l%d" % i, 10.0, 20.0, [300_000_000, 100_000_000]) for i in range(5)]
    p = budget.evaluate(five, [1.0, "recompute", 1.0, 1.0, "keep"], "pingpong", 1, static_bytes=1000, d2h_gbps=10,
                        margin=1.0)
    # layer 0 moves 400 MB: D2H 40 ms behind layer 1's 10 ms forward (30 exposed), H2D 40 ms behind
    # layer 1's backward, which recomputes (20 + 10 ms: 10 exposed); layer 1 recomputes: +10 ms; layers 2
    # and 3, the last two that move, stay in their banks (the tail's is the other one): no copy
    assert [c.action for c in p.layers] == ["offload", "recompute", "offload", "offload", "keep"]
    assert [c.exposed_ms for c in p.layers] == [pytest.approx(40.0), 0, 0, 0, 0]
    assert p.graph_ms == 150.0 and p.recompute_ms == 10.0
    assert p.predicted_ms == pytest.approx(200.0)
    # two banks of 400 MB; what stays: layer 4's 400 MB; recomputing layer 1 holds its 400 MB again in
    # the pool, which keeps it reserved beside the rest
    assert p.bank_bytes == 800_000_000 and p.inflight_bytes == 400_000_000 and p.timeline_bytes == 400_000_000
    assert p.peak_bytes == 1000 + 800_000_000 + 400_000_000 + 400_000_000
    q = budget.evaluate(five, [1.0, "recompute", 1.0, 1.0, "keep"], "remap", 2, static_bytes=1000, d2h_gbps=10,
                        margin=1.0)
    # remap, look-ahead 2: only the tail (layer 3) stays; the H2Ds hide behind two backwards (layer 0:
    # 30 + 20 ms, layer 2: 20 + 20), the D2Hs do not (30 ms each), each map costs REMAP_MS, and the
    # mapped groups are the 3 largest
    assert [c.exposed_ms for c in q.layers] == [pytest.approx(30.0 + budget.REMAP_MS), 0,
                                                pytest.approx(30.0 + budget.REMAP_MS), 0, 0]
    assert q.predicted_ms == pytest.approx(150.0 + 10.0 + 60.0 + 2 * budget.REMAP_MS)
    assert q.peak_bytes == 1000 + 1_200_000_000 + 400_000_000 + 400_000_000
    # a plan that moves two layers in ping-pong copies nothing: each stays in a bank of its own
    two = budget.evaluate(five, [1.0, "keep", 1.0, "keep", "keep"], "pingpong", 1, d2h_gbps=10)
    assert two.copy_ms == 0 and two.bank_bytes == 800_000_000


def test_recomputed_layer_holds_its_whole_set_in_the_pool_beside_what_stays():
    costs = [LayerCost("a", 1, 1, [100]), LayerCost("b", 1, 1, [100]), LayerCost("c", 1, 1, [500]),
             LayerCost("d", 1, 1, [100])]
    p = budget.evaluate(costs, ["keep", "keep", "recompute", "keep"], static_bytes=7)
    # c's 500 come back in its backward graph's pool, which keeps them reserved; a, b and d are kept
    assert p.peak_bytes == 7 + 500 + 300 and p.inflight_bytes == 500 and p.timeline_bytes == 300
    # the tail's regions go into its group as offload=fraction puts them (Offload.allocate): never copied
    # (no time), held by its bank, not by a resident slot
    t = budget.evaluate(costs, [0.0, 0.0, 0.0, 1.0])
    assert t.layers[3].action == "offload" and t.layers[3].exposed_ms == 0 and t.layers[3].resident == 0
    assert t.bank_bytes == 200 and t.timeline_bytes == 700          # a, b and c kept


def test_timeline_holds_residents_to_their_backward_and_gradients_from_theirs():
    # uses: f0 f1 f2 b2 b1 b0; a resident slot lives [forward - 1, backward], gradients from backward - 1
    costs = [LayerCost("a", 1, 1, [100], grads=10, fwd_work=5), LayerCost("b", 1, 1, [200], grads=20, bwd_work=50),
             LayerCost("c", 1, 1, [300], grads=40)]
    p = budget.evaluate(costs, ["keep"] * 3, static_bytes=7)
    # at b2: all three kept (600) + c's and b's gradients (60); the largest working set is b's backward
    assert p.timeline_bytes == 660 and p.inflight_bytes == 50 and p.peak_bytes == 7 + 50 + 660
    # mapped at the use itself: only c's gradients at b2
    assert budget.evaluate(costs, ["keep"] * 3, map_ahead=0).timeline_bytes == 640
    # c recomputed: its 300 are in the pool (working set); at b1, a and b kept and every gradient mapped
    q = budget.evaluate(costs, ["keep", "keep", "recompute"], static_bytes=7)
    assert q.inflight_bytes == 300 and q.timeline_bytes == 370 and q.peak_bytes == 7 + 300 + 370
    # from the last backward to the optimizer's step every gradient is mapped: the most when they dominate
    big = [c.but(grads=1000) for c in costs]
    assert budget.evaluate(big, ["recompute"] * 3).timeline_bytes == 3000


def test_in_the_persistent_loop_the_gradients_hold_memory_the_whole_step():
    # uses: f0 f1 f2 b2 b1 b0 (the costs above). With a persistent .grad the
    # gradients are there from the step before, beside the forwards'
    # activations: at b2 all three kept (600) and every gradient (70).
    costs = [LayerCost("a", 1, 1, [100], grads=10, fwd_work=5), LayerCost("b", 1, 1, [200], grads=20, bwd_work=50),
             LayerCost("c", 1, 1, [300], grads=40)]
    p = budget.evaluate(costs, ["keep"] * 3, static_bytes=7, persistent=True)
    assert p.timeline_bytes == 670 and p.peak_bytes == 7 + 50 + 670 and p.persistent
    assert "persistent .grad loop" in p.summary() and p.as_dict()["persistent"]
    # c recomputed: at b1, a and b kept (300) and every gradient (70), as before; at f2 (a, b, every gradient)
    # 370 as well: the same peak in both loops where the step's end holds every gradient anyway
    q = budget.evaluate(costs, ["keep", "keep", "recompute"], static_bytes=7, persistent=True)
    assert q.timeline_bytes == 370
    # a budget the set_to_none loop's plan keeps everything in is over it in the persistent loop: the search
    # plans for the loop it is told
    assert budget.search(costs, 7 + 50 + 660, static_bytes=7).counts()["keep"] == 3
    fit = budget.search(costs, 7 + 50 + 660, static_bytes=7, persistent=True)
    assert fit.counts()["keep"] < 3 and fit.peak_bytes <= 7 + 50 + 660
    assert Budget(10, loop="persistent").loop == "persistent" and Budget(10).loop == "set_to_none"
    with pytest.raises(InvalidBudget, match="loop="):
        Budget(10, loop="sometimes")


def test_the_optimizer_steps_temporaries_take_the_pages_free_at_the_step():
    # the costs above: at b2 the timeline holds 660, the largest working set is 50; every gradient is 70
    costs = [LayerCost("a", 1, 1, [100], grads=10, fwd_work=5), LayerCost("b", 1, 1, [200], grads=20, bwd_work=50),
             LayerCost("c", 1, 1, [300], grads=40)]
    # without the memory plan's pages the step's temporaries come beside everything
    p = budget.evaluate(costs, ["keep"] * 3, static_bytes=7, step_bytes=400)
    assert p.peak_bytes == 7 + 400 + 50 + 660 and p.step_peak_bytes is None
    # on them only the gradients are live at the step: 70 + 400 fit in the 690 the layers use (on the
    # pages nothing is mapped ahead: at c's backward the residents, 600, and c's gradients, 40; b's come
    # at its own backward, where c's resident bytes are gone)
    q = budget.evaluate(costs, ["keep"] * 3, static_bytes=7, step_bytes=400, pages=True)
    assert q.step_peak_bytes == 470 and q.timeline_bytes == 640 and q.peak_bytes == 7 + 50 + 640
    assert budget.evaluate(costs, ["keep"] * 3, static_bytes=7, step_bytes=400).timeline_bytes == 660
    assert "on the memory plan's pages beside the gradients (0 MiB at the step)" in q.summary()
    # a step larger than the free bytes adds what does not fit
    r = budget.evaluate(costs, ["keep"] * 3, static_bytes=7, step_bytes=1000, pages=True)
    assert r.peak_bytes == 7 + 70 + 1000
    # so a budget that holds the layers with the step in their pages keeps everything there; without
    # the pages nothing fits it (the temporaries alone leave 310 bytes for the layers)
    fit = budget.search(costs, 7 + 710, static_bytes=7, step_bytes=400, pages=True)
    assert fit.counts()["keep"] == 3 and fit.peak_bytes == 697
    with pytest.raises(BudgetError):
        budget.search(costs, 7 + 710, static_bytes=7, step_bytes=400)
    with pytest.raises(InvalidBudget):
        budget.evaluate(costs, ["keep"] * 3, step_bytes=-1)
    with pytest.raises(InvalidBudget, match="step=-5"):
        Budget(10, step=-5)


def test_static_inputs_live_in_a_resident_slot_or_all_along():
    # the costs above, each layer with 8 bytes of static inputs (vmmrt.torch.static_inputs)
    costs = [LayerCost("a", 1, 1, [100], grads=10, inputs=8), LayerCost("b", 1, 1, [200], grads=20, bwd_work=50,
                                                                          inputs=8),
             LayerCost("c", 1, 1, [300], grads=40, inputs=8)]
    # kept: in its resident slot, from its forward to its backward (at b2: 600 + 24 + 60 gradients)
    p = budget.evaluate(costs, ["keep"] * 3, static_bytes=7)
    assert p.timeline_bytes == 684 and p.inputs_bytes == 0 and p.peak_bytes == 7 + 50 + 684
    # recomputed, nothing moving (mode none, remap): the checkpoint alone in the slot; at the step only the
    # gradients (70) are live, and the step's temporaries take the rest of the pages: the inputs are not there
    for mode in ("none", "remap"):
        q = budget.evaluate(costs, ["recompute"] * 3, mode, static_bytes=7, step_bytes=1000, pages=True)
        assert q.inputs_bytes == 0 and q.bank_bytes == 0 and q.peak_bytes == 7 + 70 + 1000
        assert all(c.resident == 8 and not c.inputs_moved for c in q.layers)
    # in ping-pong the checkpoint moves through the banks (LayerOffload.inputs_move): two of 8, no slot,
    # no copy time for the tail, whose bank keeps it
    # (the banks are free at the step and lent with the pages: 16 of the temporaries' 1000 there)
    q = budget.evaluate(costs, ["recompute"] * 3, "pingpong", static_bytes=7, step_bytes=1000, pages=True)
    assert q.inputs_bytes == 0 and q.bank_bytes == 16 and q.peak_bytes == 7 + 16 + 70 + 1000 - 16
    assert "and in ping-pong's banks" in q.summary()
    assert all(c.resident == 0 and c.inputs_moved and c.moved == 8 for c in q.layers) and q.layers[-1].exposed_ms == 0
    assert "its checkpoint" in q.summary()
    # at 1 byte/ms, 8 bytes do not hide behind the next 1 ms forward at margin 0.9: charged as any copy
    slow = budget.evaluate(costs, ["recompute"] * 3, "pingpong", d2h_gbps=1e-6)
    assert slow.copy_ms > 0 and slow.layers[-1].exposed_ms == 0
    # everything a saves moved: in ping-pong its inputs move with it through the banks (LayerOffload.inputs_move:
    # no slot would hold them), copied with its regions; in remap (no slot either) they are held all along
    two = [costs[0].but(sizes=[60, 40])] + costs[1:]
    r = budget.evaluate(two, ["offload", "keep", "keep"], static_bytes=7)
    assert r.layers[0].resident == 0 and r.layers[0].inputs_moved and r.layers[0].moved == 108
    assert r.inputs_bytes == 0 and r.bank_bytes == 2 * 108
    assert r.peak_bytes == 7 + r.bank_bytes + r.inflight_bytes + r.timeline_bytes
    assert "offloads 0.0 MiB (2 regions and its static inputs)" in r.summary()
    # (three that move: the last two stay in their banks)
    slow = budget.evaluate([two[0]] * 3 + [two[2]], ["offload"] * 3 + ["keep"], d2h_gbps=1e-6)
    assert slow.layers[0].exposed_ms == pytest.approx(2 * (108 - 0.9))      # its inputs' bytes charged too
    rm = budget.evaluate(two, ["offload", "keep", "keep"], "remap", static_bytes=7)
    assert rm.layers[0].resident == 0 and not rm.layers[0].inputs_moved and rm.inputs_bytes == 8
    assert rm.layers[0].moved == 100
    assert rm.peak_bytes == 7 + 8 + rm.bank_bytes + rm.inflight_bytes + rm.timeline_bytes
    assert "+ static inputs" in rm.summary() and "+ static inputs" not in r.summary()
    # a layer with something kept has a slot, and its inputs in it
    part = budget.evaluate(two, [0.6, "keep", "keep"], static_bytes=7)
    assert part.layers[0].moved == 60 and part.layers[0].resident == 48 and part.inputs_bytes == 0
    assert not part.layers[0].inputs_moved
    with pytest.raises(InvalidBudget):
        budget.evaluate([costs[0].but(inputs=-1)], ["keep"])


def test_mode_auto_runs_a_hand_plan_that_moves_nothing_in_mode_none_where_that_holds_less():
    # 4 long-context-like layers recomputed: ping-pong holds two banks of a checkpoint (256) all along,
    # mode none one checkpoint at the first layer's backward beside every gradient
    costs = [LayerCost("l%d" % i, 1, 1, [5000], grads=418, bwd_work=900, inputs=256) for i in range(4)]
    kw = dict(static_bytes=7, step_bytes=100, pages=True)
    pp = budget.evaluate(costs, ["recompute"] * 4, "pingpong", **kw)
    nn = budget.evaluate(costs, ["recompute"] * 4, "none", **kw)
    assert pp.bank_bytes == 512 and nn.bank_bytes == 0 and nn.peak_bytes == pp.peak_bytes - 256
    p = budget.hand_plan(costs, ["recompute"] * 4, "pingpong", 1, budget.auto_strategies(), **kw)
    assert (p.mode, p.peak_bytes, p.bank_bytes) == ("none", nn.peak_bytes, 0)
    assert p.alternatives == [("pingpong", 1, pp.predicted_ms, pp.peak_bytes)]
    assert p.predicted_ms <= pp.predicted_ms
    # without mode="auto"'s strategies, the runtime's mode as before
    for strategies in (None, budget.STRATEGIES):
        q = budget.hand_plan(costs, ["recompute"] * 4, "pingpong", 1, strategies, **kw)
        assert q.mode == "pingpong" and q.peak_bytes == pp.peak_bytes and q.alternatives == []
    # many layers: every checkpoint is alive at the first backward, and the banks are the smaller
    many = [c.but(grads=10) for c in costs * 4]
    q = budget.hand_plan(many, ["recompute"] * 16, "pingpong", 1, budget.auto_strategies(), **kw)
    bank = budget.evaluate(many, ["recompute"] * 16, "pingpong", **kw)
    assert q.mode == "pingpong" and q.peak_bytes == bank.peak_bytes
    assert q.alternatives[0][0] == "none" and q.alternatives[0][3] > q.peak_bytes
    # a plan that offloads needs ping-pong (or remap): mode none is not offered it
    q = budget.hand_plan(costs, ["offload", "recompute", "recompute", "keep"], "pingpong", 1,
                         budget.auto_strategies(), **kw)
    assert q.mode == "pingpong" and q.alternatives == []
    assert budget.auto_strategies()[0] == ("none", 1) and set(budget.STRATEGIES) < set(budget.auto_strategies())


def test_mode_auto_builds_a_recomputed_plan_in_mode_none():
    ref, mine = _pair(3, seed=4)
    fs = _build(mine, mode="auto", memory_budget=Budget(layers=["recompute"] * 3))
    off = vt.offload_of(fs[0])
    try:
        # (no graphs: no static inputs to move, so the peaks tie and the plan that copies nothing wins)
        assert off.mode == "none" and off.plan.mode == "none" and off.plan.bank_bytes == 0
        assert off.plan.counts()["recompute"] == 3 and all(lay.offload is off for lay in off.layers)
        assert [a[0] for a in off.plan.alternatives] == ["pingpong"]
        # discovery's view of each layer came along to the plan's runtime,
        # as a build in mode none has it: its outputs' births (their slot)
        # and its backward's timelines (where this torch gives them)
        def seen(o):
            return [(len(lay.out_births), lay.timeline is None, lay.timeline_acc is None) for lay in o.layers]
        direct = vt.offload_of(_build(_pair(3, seed=4)[1], mode="none",
                                      memory_budget=Budget(layers=["recompute"] * 3))[0])
        try:
            assert seen(off) == seen(direct)
        finally:
            direct.close()
        _against_checkpoint(ref, fs, mine)
        assert off.stats()["bytes_offloaded"] == 0
    finally:
        off.close()
    # the mode a caller names stays the plan's
    fs = _build(_pair(3, seed=4)[1], mode="pingpong", memory_budget=Budget(layers=["recompute"] * 3))
    off = vt.offload_of(fs[0])
    try:
        assert off.mode == "pingpong" == off.plan.mode
    finally:
        off.close()


def test_every_attribute_of_a_layer_is_discovery_or_its_runtimes():
    # planner.adopt() carries LayerOffload.DISCOVERED over: an attribute in
    # neither list would be dropped at adoption or carried unexamined
    off = vt.Offload(mode="pingpong", device="cpu")
    try:
        lay = off.layer("a", static=[])
        found, disc, own = set(vars(lay)), set(lay.DISCOVERED), set(lay.OWN)
        assert not disc & own
        assert found == disc | own, "classify these in LayerOffload: %s" % sorted(found ^ (disc | own))
    finally:
        off.close()


def test_adopting_a_layer_carries_all_that_discovery_learned():
    # mode="auto": a layer discovered under ping-pong, then its plan's
    # runtime (mode none): what discovery saw of its outputs and backward
    # must come with it (on the H100, adopt once dropped out_births: the
    # outputs were then born in the graphs' pool, 248 MiB more on 8 Llama
    # layers, and the predicted peak never knew)
    from vmmrt.torch import planner

    class Runner:
        pass
    off = vt.Offload(mode="pingpong", device="cpu")
    runners, marks = [], {}
    for name in ("a", "b"):
        r = Runner()
        r.layer = off.layer(name, static=[])
        for k in r.layer.DISCOVERED:
            marks[name, k] = object()
            setattr(r.layer, k, marks[name, k])
        runners.append(r)
    uses = [(False, r) for r in runners] + [(True, r) for r in reversed(runners)]
    plan = budget.evaluate([LayerCost("a", 1, 1, [100]), LayerCost("b", 1, 1, [100])], ["recompute"] * 2,
                           mode="none")
    new = planner.adopt(off, plan, runners, uses)
    try:
        assert new is not off and new.mode == "none"
        for r, name in zip(runners, ("a", "b")):
            assert r.layer.offload is new and r.layer.name == name
            missing = [k for k in r.layer.DISCOVERED if getattr(r.layer, k) is not marks[name, k]]
            assert not missing, "not carried: %s" % missing
    finally:
        new.close()


def test_a_layers_working_set_is_the_larger_of_its_forward_and_backward():
    # the pool holds what one pass allocates at a time, not both passes' sum
    for fwd, bwd in ((30, 70), (70, 30)):
        costs = [LayerCost("a", 1, 1, [100], fwd_work=fwd, bwd_work=bwd), LayerCost("b", 1, 1, [100])]
        p = budget.evaluate(costs, ["keep", "keep"])
        assert p.inflight_bytes == 70 and p.layers[0].work == 70
        assert p.peak_bytes == 70 + 200
        # recomputed: the saved set again, over the larger of the two
        assert budget.evaluate(costs, ["recompute", "keep"]).layers[0].work == 70 + 100


def test_margin_scales_both_copy_windows():
    # layer 0 moves 100 MB: 10 ms each way at 10 GB/s; its D2H hides behind
    # layer 1's forward (16 ms), its H2D behind layer 1's backward (15 ms),
    # each scaled by the margin: at 0.5, 8 and 7.5 ms, so 2 + 2.5 exposed
    # (b and c move too: the last two that move stay in their banks, copied never)
    costs = [LayerCost("a", 10.0, 30.0, [100_000_000]), LayerCost("b", 16.0, 15.0, [1000]),
             LayerCost("c", 1.0, 1.0, [1000]), LayerCost("d", 1.0, 1.0, [1000])]
    plan = [1.0, 1.0, 1.0, "keep"]
    p = budget.evaluate(costs, plan, d2h_gbps=10, margin=0.5)
    assert p.layers[0].exposed_ms == pytest.approx(4.5)
    assert budget.evaluate(costs, plan, d2h_gbps=10, margin=1.0).layers[0].exposed_ms == 0.0
    # the search's options predict the same
    env = budget._Env(costs, 0, 10.0, 10.0, 0.5, 1, budget.REMAP_MS)
    opts = budget._options(costs[0], False, env, 15.0, 16.0, "pingpong")
    assert [o[1] for o in opts if o[2] == ("offload", [0])] == [pytest.approx(4.5)]


def test_granularity_rounds_the_banks():
    costs = [LayerCost("a", 1, 1, [3]), LayerCost("b", 1, 1, [1])]
    assert budget.evaluate(costs, [1.0, "keep"], granularity=4).bank_bytes == 8


def _four():
    # tiny regions: every copy hides (1000 bytes at 1 GB/s is a microsecond)
    return [LayerCost("l%d" % i, 10.0, 20.0, [1000]) for i in range(4)]


def test_search_keeps_everything_when_it_fits():
    p = budget.search(_four(), 4000, d2h_gbps=1)
    assert p.counts() == {"keep": 4, "offload": 0, "recompute": 0} and p.predicted_ms == 120.0
    assert p.peak_bytes == 4000 and "within the budget" in p.summary()


def test_search_offloads_what_hides_before_recomputing():
    # one layer offloaded makes two banks of its size: three must move to gain; then the tail, which stays
    # in its bank (no copy), fills it: 2000 in the banks, nothing kept
    p = budget.search(_four(), 3999, d2h_gbps=1)
    assert p.counts() == {"keep": 0, "offload": 4, "recompute": 0}
    assert p.peak_bytes == 2000 and p.predicted_ms == pytest.approx(120.0)
    assert p.copy_ms == 0


def test_search_moves_least_when_hidden_copies_cost_no_time():
    # Six layers whose copies all hide: offloading one costs no more time
    # than keeping it. 6000 kept; k offloaded hold 6000 - 1000 k + two banks
    # of 1000, so 3 fit 5000; offloading all 5 that may (the tail never
    # moves) fits too, at the same predicted time, but moves more (the hull
    # once dropped keep, and the greedy could not undo a layer back to it).
    # The last two layers then move too, into the banks they stay in with no copy (budget._fill_banks):
    # 1000 kept + the banks' 2000.
    costs = [LayerCost("l%d" % i, 10.0, 20.0, [1000]) for i in range(6)]
    p = budget.search(costs, 5000, d2h_gbps=1)
    assert [c.action for c in p.layers] == ["offload"] * 3 + ["keep"] + ["offload"] * 2, p.summary()
    assert p.peak_bytes == 3000 and p.predicted_ms == pytest.approx(180.0)
    # without the fill: the greedy's three, as few as fit
    env = budget._Env(costs, 0, 1.0, 1.0, 0.9, 1, budget.REMAP_MS)
    greedy = env.make([("offload", [0])] * 3 + [("keep", [])] * 3, "pingpong", 1, 5000)
    assert greedy.peak_bytes == 5000 and budget._fill_banks(env, greedy).peak_bytes == 3000
    # nothing moving, no banks to fill; remap has none
    none = env.make([("keep", [])] * 6, "pingpong", 1)
    assert budget._fill_banks(env, none) is none
    rm = env.make([("offload", [0])] * 3 + [("keep", [])] * 3, "remap", 1)
    assert budget._fill_banks(env, rm) is rm
    # the hull of one such layer starts at keep, whatever hides
    env = budget._Env(costs, 0, 1.0, 1.0, 0.9, 1, budget.REMAP_MS)
    hull = budget._hull(budget._options(costs[0], False, env, 20.0, 10.0, "pingpong"))
    assert hull[0][2][0] == "keep" and hull[1][2][0] == "offload" and hull[1][1] == 0.0


def test_search_recomputes_when_offload_cannot_fit():
    # k recomputed: one set of 1000 in the pool + 4 - k kept; offloading beside them adds banks
    p = budget.search(_four(), 2500, d2h_gbps=1)
    assert p.counts()["recompute"] == 3 and p.peak_bytes == 2000 and p.predicted_ms == pytest.approx(150.0)


def test_no_fit_gives_the_smallest_budget_and_it_fits():
    with pytest.raises(BudgetError) as e:
        budget.search(_four(), 999, d2h_gbps=1)
    # all four recomputed: one saved set at a time, in the pool; keeping all is 4000
    assert e.value.smallest == 1000 and e.value.budget == 999 and e.value.name == "VMMRT_E_OUT_OF_MEMORY"
    assert "1000 bytes" in str(e.value) and e.value.keep == 4000
    p = budget.search(_four(), e.value.smallest, d2h_gbps=1)
    assert p.peak_bytes == 1000 and p.counts()["recompute"] == 4 and p.predicted_ms == pytest.approx(160.0)
    assert (p.smallest_bytes, p.keep_bytes) == (1000, 4000)
    with pytest.raises(BudgetError) as e:
        budget.search(_four(), 2500, d2h_gbps=1, recompute=False)
    assert e.value.smallest == 3000


def test_search_picks_the_faster_strategy():
    # large copies: remap at look-ahead 2 hides the H2D behind two backwards
    costs = [LayerCost("l%d" % i, 10.0, 10.0, [150_000_000]) for i in range(6)]
    p = budget.search(costs, 700_000_000, d2h_gbps=10, margin=1.0, strategies=budget.STRATEGIES, recompute=False)
    # each copy takes 15 ms, a forward 10: 5 ms of D2H exposed per copied layer. Ping-pong (banks 300 MB)
    # fits 4 layers moved, of which the last two stay in their banks (H2D 5 ms exposed for the two others):
    # 120 + 2 * 10 ms. Remap at look-ahead 2 (the 3 largest groups mapped, 450 MB) fits 5 moved, the last
    # one staying mapped, the others' H2D hidden behind two backwards and 0.4 ms per map: 120 + 4 * 5.4 ms
    assert (p.mode, p.lookahead) == ("pingpong", 1) and p.fits
    assert p.predicted_ms == pytest.approx(140.0)
    assert ("remap", 2, pytest.approx(141.6), 600_000_000) in [tuple(a) for a in p.alternatives]
    assert p.alternatives and all(ms >= p.predicted_ms for _, _, ms, _ in p.alternatives)
    # with backwards of 8 ms ping-pong's H2D shows 7 ms a copied layer, remap's hides behind two: remap
    # wins (129.6 ms against 132)
    shorter = [c.but(bwd_ms=8.0) for c in costs]
    r = budget.search(shorter, 700_000_000, d2h_gbps=10, margin=1.0, strategies=budget.STRATEGIES, recompute=False)
    assert (r.mode, r.lookahead) == ("remap", 2) and r.predicted_ms == pytest.approx(129.6)
    assert all(ms >= r.predicted_ms for _, _, ms, _ in r.alternatives), r.alternatives


def test_refusals_are_named():
    with pytest.raises(InvalidBudget, match="not both"):
        Budget(layers=[("recompute", 0.5)])
    with pytest.raises(InvalidBudget, match="not a choice"):
        Budget(layers=["sometimes"])
    marked = [LayerCost("a", 1, 1, [10], recompute=True), LayerCost("b", 1, 1, [10])]
    with pytest.raises(InvalidBudget, match="marked for recomputation"):
        budget.evaluate(marked, [1.0, "keep"])
    with pytest.raises(InvalidBudget):
        budget.search(marked, 10, margin=0)
    with pytest.raises(InvalidBudget):
        Budget()


# ------------------------------------------------------- recompute, on the CPU
class Block(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)
        self.drop = torch.nn.Dropout(0.25)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.nn.functional.gelu(self.up(self.norm(x)))
        att = torch.nn.functional.softmax(h @ h.transpose(-1, -2) / 8.0, -1) @ h    # math attention
        return x + self.drop(self.down(att))


def _pair(n=4, seed=0):
    torch.manual_seed(seed)
    ref = [Block() for _ in range(n)]
    mine = [Block() for _ in range(n)]
    for a, b in zip(ref, mine):
        b.load_state_dict(a.state_dict())
    return ref, mine


def _grads_in_slots(off, mine):
    """Every parameter's .grad is at its fixed address in its layer's gradient slot."""
    for lay, m in zip(off.layers, mine):
        b = lay.grads.backing
        for p in m.parameters():
            assert b.address <= p.grad.data_ptr() < b.address + b.nbytes, (lay.name, lay.recompute)


def _against_checkpoint(ref, fs, mine, steps=2, shape=(2, 16, 32), check=None):
    x0 = torch.randn(*shape)
    gy = torch.randn(*shape)
    for it in range(steps):
        torch.manual_seed(100 + it)
        x = x0.clone().requires_grad_()
        y = x
        for m in ref:
            y = checkpoint(m, y)
        (y * gy).sum().backward()
        gx_ref = x.grad
        torch.manual_seed(100 + it)
        x = x0.clone().requires_grad_()
        y = x
        for f in fs:
            y = f(y)
        (y * gy).sum().backward()
        assert torch.equal(x.grad, gx_ref), it
        for a, b in zip(ref, mine):
            for p, q in zip(a.parameters(), b.parameters()):
                assert torch.equal(p.grad, q.grad), it
        if check is not None:
            check()
        for m in ref + mine:
            m.zero_grad(set_to_none=True)


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
def test_recompute_is_bitwise_torch_checkpoint(mode, caplog):
    ref, mine = _pair()
    plan = ["recompute", 1.0, "recompute", "keep"] if mode != "none" else ["recompute", "keep", "recompute", "keep"]
    fs = vt.make_graphed_callables(tuple(mine), tuple((torch.randn(2, 16, 32, requires_grad=True),) for _ in mine),
                                   graphs=False, mode=mode, min_bytes=1024, memory_budget=Budget(layers=plan))
    off = vt.offload_of(fs[0])
    try:
        assert [c.action for c in off.plan.layers][0::2] == ["recompute", "recompute"]
        # a recomputed layer moves nothing and keeps no resident slot
        assert off.layers[0].saved_bytes()["moved"] == 0 and off.layers[0].resident is None
        # its gradients are mapped as the others' are (no static buffers held for the life of the graphs)
        assert off.layers[0].grads.mapped and off.layers[1].grads.mapped
        before = [m.calls for m in mine]
        with caplog.at_level(logging.WARNING, logger="vmmrt.torch"):
            _against_checkpoint(ref, fs, mine, check=lambda: _grads_in_slots(off, mine))
        # each recomputed backward ends its part of the iteration: no step is abandoned
        assert not [r.message for r in caplog.records if "abandoned" in r.message]
        # two steps: a recomputed layer's forward runs again in each backward, the others' once
        assert [m.calls - b for m, b in zip(mine, before)] == [4 if p == "recompute" else 2 for p in plan]
        if mode != "none":
            assert off.stats()["bytes_offloaded"] > 0     # layer 1 did offload
    finally:
        off.close()


def test_recomputed_graph_bodies_write_and_accumulate_in_the_slot(monkeypatch):
    """recompute.capture_mapped's write and accumulate bodies, run eagerly on
    the host backend in place of captures: the write pass leaves each
    parameter's gradient in the callable's slot, the accumulate pass adds
    the same into it (2x, exactly), and both give the input's gradient in
    one tensor, bitwise checkpoint's."""
    from vmmrt.torch import _callables, graphed, recompute
    from vmmrt.torch.offload import Offload

    class Graph:
        def register_generator_state(self, st):
            pass

    class NoRng:
        available, fwd, bwd = False, None, None

        def using(self, st):
            return contextlib.nullcontext()
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    ref, mine = _pair(3, seed=4)
    for m in ref + mine:
        m.drop.p = 0.0
    _, runners = _callables.prepare(tuple(mine), tuple((torch.randn(2, 16, 32, requires_grad=True),)
                                                       for _ in mine), None)
    off = Offload(mode="none", device="cpu", min_bytes=1024)
    try:
        for r in runners:
            r.generators, r.retain_graph = (), False
            r.layer = off.layer(r.name, static=r.params + r.buffers + r.sample)
        off.set_order([(r.layer, False) for r in runners] + [(r.layer, True) for r in reversed(runners)])
        _callables.warmup(runners, 3, False)
        graphed._make_grads(runners, off, True)
        for r in runners:
            r.recompute = r.layer.recompute = True
            r.recompute_rng = NoRng()
        off.allocate(plan=budget.evaluate([LayerCost(r.name, 1, 1, [1]) for r in runners], ["recompute"] * 3))
        for b in off.backings:
            b.ensure()
        for r, m in zip(runners, ref):
            recompute.after_forward(r, recompute.forward_body(r)())
            r.grad_mode = "mapped"
            r.static_grad_outputs[0].normal_()
            acc = recompute.capture_mapped(r, Graph(), False, lambda what, gr, body: body())
            assert isinstance(acc, Graph) and r.grad_mode == "mapped" and r.acc_shared
            x = r.sample[0].detach().clone().requires_grad_()
            checkpoint(m, x, use_reentrant=False).backward(r.static_grad_outputs[0])
            base = r.grads.backing.tensor(None, counted=False)
            for k, p in enumerate(m.parameters()):
                assert torch.equal(r.grads.view(base, k), 2 * p.grad), (r.name, k)
            assert torch.equal(r.static_grad_inputs[0], x.grad) and torch.equal(r.acc_grad_inputs[0], x.grad)
            assert all(g is None for g in r.static_grad_inputs[1:])
            # the argument's gradient is not in the slot: a recomputed layer's
            # call hands it out as a static buffer, which must outlive the slot
            b = r.grads.backing
            assert not b.address <= r.static_grad_inputs[0].data_ptr() < b.address + b.nbytes
    finally:
        off.close()


class _Mlp(torch.nn.Module):
    def __init__(self, d=32, drop=0.1):
        super().__init__()
        self.up, self.down, self.drop = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d), torch.nn.Dropout(drop)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.drop(self.down(torch.nn.functional.gelu(self.up(x))))


class _Outer(torch.nn.Module):
    """A layer with a sub-block (its MLP) that may be marked for recomputation."""

    def __init__(self, ck=False):
        super().__init__()
        self.norm, self.mlp, self.ck = torch.nn.LayerNorm(32), _Mlp(), ck

    def forward(self, x):
        h = self.norm(x)
        return x + (checkpoint(self.mlp, h, use_reentrant=False) if self.ck else self.mlp(h))


@pytest.mark.parametrize("graphs_budget", [None, Budget(layers=[1.0, "keep"])])
def test_marked_sub_block_is_recomputed_bitwise_checkpoint_and_saves_less(graphs_budget):
    torch.manual_seed(6)
    ref = [_Outer(ck=True) for _ in range(2)]
    mine, plain = [_Outer() for _ in range(2)], [_Outer() for _ in range(2)]
    for a, b, c in zip(ref, mine, plain):
        b.load_state_dict(a.state_dict())
        c.load_state_dict(a.state_dict())
    vt.mark_recompute(*[m.mlp for m in mine])
    kw = dict(min_bytes=1024, memory_budget=graphs_budget)
    fs = _build(mine, **kw)
    fp = _build(plain, **kw)
    off, offp = vt.offload_of(fs[0]), vt.offload_of(fp[0])
    try:
        # the MLP's intermediates are not saved: only its input, as a tensor of the layer
        assert off.saved_bytes()["distinct"] < offp.saved_bytes()["distinct"]
        before = [m.mlp.calls for m in mine]
        _against_checkpoint(ref, fs, mine, steps=2)
        assert [m.mlp.calls - b for m, b in zip(mine, before)] == [4, 4]     # forward and backward, twice
        if graphs_budget is not None:
            assert off.stats()["bytes_offloaded"] > 0
    finally:
        off.close()
        offp.close()


def test_marked_sub_block_refuses_what_it_cannot_recompute():
    m = _Outer()
    vt.mark_recompute(m.mlp)
    fs = _build([m])
    try:
        with pytest.raises(TypeError, match="positional arguments only"):
            m.mlp(torch.randn(2, 16, 32, requires_grad=True), scale=2)
    finally:
        vt.offload_of(fs[0]).close()


def test_marked_layers_are_recomputed_without_a_budget():
    ref, mine = _pair(3, seed=1)
    vt.mark_recompute(mine[0], mine[1])
    fs = vt.make_graphed_callables(tuple(mine), tuple((torch.randn(2, 16, 32, requires_grad=True),) for _ in mine),
                                   graphs=False)
    off = vt.offload_of(fs[0])
    try:
        assert [c.action for c in off.plan.layers] == ["recompute", "recompute", "keep"]
        _against_checkpoint(ref, fs, mine, steps=1)
    finally:
        off.close()


def test_marked_layer_offloaded_by_a_hand_plan_is_refused():
    _, mine = _pair(2)
    vt.mark_recompute(mine[0])
    with pytest.raises(InvalidBudget, match="not both"):
        vt.make_graphed_callables(tuple(mine), tuple((torch.randn(2, 16, 32, requires_grad=True),) for _ in mine),
                                  graphs=False, memory_budget=Budget(layers=[1.0, "keep"]))


def _build(mine, shape=(2, 16, 32), **kw):
    return vt.make_graphed_callables(tuple(mine), tuple((torch.randn(*shape, requires_grad=True),) for _ in mine),
                                     graphs=False, **kw)


@pytest.mark.parametrize("grads", ["mapped", "static"])
def test_mapped_gradients_are_in_the_timeline_static_ones_in_static(grads):
    _, mine = _pair(3)
    params = sum(p.numel() * p.element_size() for m in mine for p in m.parameters())
    samples = 3 * 2 * 16 * 32 * 4
    fs = _build(mine, grads=grads, memory_budget=Budget(layers=["keep"] * 3, reserve=5))
    off = vt.offload_of(fs[0])
    try:
        p = off.plan
        if grads == "mapped":
            # the host backend: the parameters and samples, no gradient (each callable's come and go)
            assert p.static_bytes == params + samples + 5
            assert [c.grads for c in p.layers] == [lay.grads.backing.nbytes for lay in off.layers]
            assert all(c.grads >= sum(q.numel() * 4 for q in m.parameters()) for c, m in zip(p.layers, mine))
        else:
            assert p.static_bytes == 2 * params + samples + 5 and all(c.grads == 0 for c in p.layers)
        assert p.peak_bytes == p.static_bytes + p.bank_bytes + p.inflight_bytes + p.timeline_bytes
    finally:
        off.close()


def test_budget_too_small_names_the_smallest_and_that_one_builds():
    _, mine = _pair(4)
    with pytest.raises(BudgetError) as e:
        _build(mine, memory_budget=1000)
    smallest = e.value.smallest
    assert smallest > 1000 and "%d bytes" % smallest in str(e.value)
    fs = _build(mine, memory_budget=smallest)
    off = vt.offload_of(fs[0])
    try:
        assert off.plan.peak_bytes <= smallest and off.plan.counts()["recompute"] >= 1
        x = torch.randn(2, 16, 32, requires_grad=True)
        y = x
        for f in fs:
            y = f(y)
        y.sum().backward()
        assert x.grad is not None
    finally:
        off.close()


def test_mode_auto_builds_in_the_strategy_the_planner_chose(monkeypatch):
    ref, mine = _pair(5, seed=2)
    monkeypatch.setattr(budget, "STRATEGIES", (("remap", 2),))
    # granules of 4 KiB, so that offloading these small layers beats keeping them
    kw = dict(mode="auto", min_bytes=1024, options={"host_granularity": 4096})
    with pytest.raises(BudgetError) as e:
        _build(mine, **kw, memory_budget=Budget(1, recompute=False))
    fs = _build(mine, **kw, memory_budget=Budget(e.value.smallest, recompute=False))
    off = vt.offload_of(fs[0])
    try:
        # the discovery moved to a runtime in the chosen mode, and what moves goes through it
        assert (off.plan.mode, off.plan.lookahead) == ("remap", 2) == (off.mode, off.lookahead)
        assert off.plan.counts()["offload"] == 4 and all(lay.offload is off for lay in off.layers)
        _against_checkpoint(ref, fs, mine)
        assert off.stats()["bytes_offloaded"] > 0
    finally:
        off.close()
    with pytest.raises(ValueError, match="'auto' with memory_budget="):
        _build(mine, mode="auto")


def test_remap_is_charged_what_its_map_was_timed_at(monkeypatch):
    """The budget planner charges remap the map's measured cost, timed once
    per Offload (a stream-ordered map of the largest group), not an assumed
    one: at 50 ms a map, remap loses to ping-pong and says what it would
    cost; where remap is not among the strategies nothing is timed."""
    from vmmrt.torch import planner
    calls = []

    def timed(off, nbytes, repeats=planner.REMAP_REPEATS):
        calls.append(nbytes)
        return 50.0
    monkeypatch.setattr(planner, "measure_remap", timed)
    monkeypatch.setattr(budget, "STRATEGIES", (("pingpong", 1), ("remap", 2)))
    _, mine = _pair(5, seed=2)
    kw = dict(mode="auto", min_bytes=1024, options={"host_granularity": 4096})
    with pytest.raises(BudgetError) as e:
        _build(mine, **kw, memory_budget=Budget(1, recompute=False))
    assert len(calls) == 1 and calls[0] > 0
    fs = _build(mine, **kw, memory_budget=Budget(e.value.smallest, recompute=False))
    off = vt.offload_of(fs[0])
    try:
        p = off.plan
        assert len(calls) == 2 and p.remap_ms == 50.0 and off.remap_ms == (50.0, calls[1])
        assert p.mode == "pingpong" and p.counts()["offload"] >= 1, p.summary()
        # remap's smallest plan pays 50 ms a layer it offloads
        kw = dict(strategies=[("remap", 2)], static_bytes=p.static_bytes, d2h_gbps=p.d2h_gbps, h2d_gbps=p.h2d_gbps,
                  margin=p.margin, granularity=p.granularity, remap_ms=p.remap_ms, recompute=False,
                  map_ahead=p.map_ahead)
        with pytest.raises(BudgetError) as r:
            budget.search(p.costs, 1, **kw)
        q = budget.search(p.costs, r.value.smallest, **kw)
        # (the last layer that moves stays mapped: its backward comes next)
        assert q.copy_ms >= 50.0 * (q.counts()["offload"] - 1) > 0
        assert "remap's cost per offloaded layer, as the budget planner charged it: 50.000 ms" in off.describe()
    finally:
        off.close()
    fs = _build(_pair(5, seed=2)[1], mode="pingpong", min_bytes=1024, memory_budget=Budget(layers=["keep"] * 5))
    vt.offload_of(fs[0]).close()
    assert len(calls) == 2          # a hand plan in ping-pong: no remap to predict


def test_remap_map_is_timed_on_the_runtime_and_leaves_nothing_mapped():
    from vmmrt.torch import planner
    from vmmrt.torch.offload import Offload
    off = Offload(mode="remap", device="cpu", options={"host_granularity": 4096})
    try:
        before = off.stats()["driver_calls_by_kind"]["cuMemCreate"]
        ms = planner.measure_remap(off, 3 << 20)
        assert 0 < ms < 1e4
        st = off.stats()
        assert st["slot_bytes"] == 0
        # every cycle really made memory (the first map, the untimed cycle,
        # the timed ones): a release still queued when the map is asked for
        # is cancelled, and the "map" then timed nothing
        assert st["driver_calls_by_kind"]["cuMemCreate"] - before == planner.REMAP_REPEATS + 2
        for bad in (dict(nbytes=-1), dict(nbytes=1.5), dict(nbytes=True), dict(nbytes=1, repeats=0),
                    dict(nbytes=1, repeats=2.0)):
            with pytest.raises(ValueError, match="measure_remap"):
                planner.measure_remap(off, **bad)
    finally:
        off.close()


def test_a_hand_plan_over_its_limit_is_refused():
    _, mine = _pair(2)
    with pytest.raises(BudgetError, match="hand plan's predicted peak"):
        _build(mine, memory_budget=Budget(1, layers=["keep", "keep"]))


def test_check_plan_reads_the_callers_steps_against_the_plans_peak():
    """vt.check_plan: the caller's whole steps run while the used memory is
    sampled (here a reading of the test's: the steps raise it, the reading
    after the last one is always taken, so the peak does not depend on
    when the sampler's thread runs), and the plan's predicted peak beside
    it, kept on the Offload and printed by describe()."""
    _, mine = _pair(2)
    fs = _build(mine, memory_budget=Budget(layers=["keep", "recompute"]))
    off = vt.offload_of(fs[0])
    try:
        used = [off.plan.peak_bytes // 2]
        x = torch.randn(2, 16, 32, requires_grad=True)
        ran = []

        def step():
            y = x
            for f in fs:
                y = f(y)
            y.sum().backward()
            ran.append(1)
            used[0] += off.plan.peak_bytes // 4          # two steps: 1.0x the prediction at the end
        c = vt.check_plan(fs[1], step, steps=2, read=lambda: used[0])
        assert len(ran) == 2 and off.plan_check is c
        assert c.predicted == off.plan.peak_bytes and c.measured == used[0] and c.samples >= 2
        assert abs(c.ratio - off.plan.peak_bytes / used[0]) < 1e-12
        assert "plan check over 2 step(s)" in off.describe() and "predicted" in c.describe()
        assert json.dumps(c.as_dict())
        # no device and no reading: the steps run, nothing is measured
        c = vt.check_plan(off, step, steps=1)
        assert len(ran) == 3 and c.measured is None and c.ratio is None and "nothing sampled" in c.describe()
        with pytest.raises(ValueError, match="steps=0"):
            vt.check_plan(off, step, steps=0)
        with pytest.raises(TypeError, match="training step"):
            vt.check_plan(off, None)
        with pytest.raises(TypeError, match="read="):
            vt.check_plan(off, step, read=5)
        for bad in (0, -1e-3, "1", True, float("nan")):
            with pytest.raises(ValueError, match="interval_s="):
                vt.check_plan(off, step, interval_s=bad)
        assert len(ran) == 3                # refused before any step ran
        with pytest.raises(ValueError, match="did not come from"):
            vt.check_plan(lambda t: t, step)
    finally:
        off.close()
    # a plan that predicts no peak (no layer has warm-up times to model): the measurement alone
    fs = _build(_pair(2)[1], offload=0.5, mode="pingpong")
    off = vt.offload_of(fs[0])
    try:
        off.step_model = None
        c = vt.check_plan(off, lambda: None, steps=1, read=lambda: 123)
        assert c.predicted is None and c.measured == 123 and "predicts no peak" in c.describe()
    finally:
        off.close()


@pytest.mark.parametrize("mode,offload,choice", [("none", 1.0, "keep"), ("pingpong", 0.5, 0.5),
                                                 ("pingpong", 1.0, 1.0)])
@pytest.mark.parametrize("loop", ["set_to_none", "persistent"])
def test_a_plan_made_without_a_budget_predicts_its_whole_step_as_the_budget_planner_would(mode, offload, choice,
                                                                                           loop):
    """Mode none, a fraction (and offload="auto", whose plan is a bandwidth
    plan's regions: test_graphed_budget) predict the whole step by the
    budget planner's model (Offload.step_model): told the optimizer's
    states and temporaries, the same peak as the hand plan of the same
    choices given them as Budget(reserve=, step=, loop=)."""
    n, reserve, step = 3, 5 << 20, 3 << 20
    # (every saved region a candidate: a fraction then moves some of a layer's)
    fs = _build(_pair(n)[1], mode=mode, offload=offload, min_bytes=1)
    off = vt.offload_of(fs[0])
    try:
        m = off.step_model
        assert m is not None and getattr(off.plan, "peak_bytes", None) is None
        # what the model moves is what the allocation moved, the tail's too (in its group, never copied)
        moved = [sum(c.sizes[i] for i in ch) for c, ch in zip(m.costs, m.chosen)]
        assert moved == [lay.saved_bytes()["moved"] for lay in off.layers]
        assert (0 < moved[0] < sum(m.costs[0].sizes)) == (offload == 0.5)
        want = _build(_pair(n)[1], mode=mode, min_bytes=1,
                      memory_budget=Budget(layers=[choice] * n, reserve=reserve, step=step, loop=loop))
        hand = vt.offload_of(want[0])
        try:
            assert m.peak(reserve, step, loop) == hand.plan.peak_bytes
            assert [list(c.chosen) for c in hand.plan.layers] == m.chosen
        finally:
            hand.close()
        assert m.peak(reserve, step, loop) - m.peak(0, step, loop) == reserve
        assert "the plan's whole step, predicted" in off.describe()
        c = vt.check_plan(off, lambda: None, steps=1, read=lambda: m.peak(reserve, step, loop), reserve=reserve,
                          step_bytes=step, loop=loop)
        assert c.predicted == m.peak(reserve, step, loop) and c.ratio == 1.0 and loop in c.describe()
        assert not c.left_out
        # not told the optimizer: the larger loop's, and what was left out named when the step holds more
        c = vt.check_plan(off, lambda: None, steps=1, read=lambda: 2 * m.peak(reserve, step, loop))
        assert c.predicted == max(m.peak(0, 0, x) for x in ("set_to_none", "persistent"))
        assert "check_plan(reserve=)" in c.describe() and "check_plan(step_bytes=)" in c.describe()
        for bad in (dict(reserve=-1), dict(step_bytes=1.5), dict(reserve=True), dict(loop="always")):
            with pytest.raises(ValueError, match="check_plan"):
                vt.check_plan(off, lambda: None, steps=1, read=lambda: 1, **bad)
        with pytest.raises(vt.InvalidBudget, match="reserve="):
            m.peak(-1)
    finally:
        off.close()


def test_offload_autos_whole_step_is_what_its_plan_weighed_over_the_static_bytes():
    """offload="auto" weighs its candidate plans by the model's peak over
    the static bytes in each loop (planner.lightest): its whole-step model
    is that, the regions its plan moves, plus the static bytes."""
    fs = _build(_pair(3)[1], mode="pingpong", offload="auto", min_bytes=1)
    off = vt.offload_of(fs[0])
    try:
        m = off.step_model
        assert m.chosen == [list(p.chosen) for p in off.plan.layers]
        assert tuple(m.peak(loop=x) - m.static_bytes for x in off.plan.weighed_labels) == off.plan.weighed_peak
        assert m.static_bytes > 0
        # describe() prints the plan and its prediction
        text = off.describe()
        assert off.plan.summary() in text and m.describe() in text
    finally:
        off.close()


def test_a_whole_step_model_that_fails_leaves_the_build_working_and_says_why(monkeypatch, caplog):
    from vmmrt.torch import planner

    def broken(*a, **k):
        raise RuntimeError("the device's memory could not be read")
    monkeypatch.setattr(planner, "static_bytes", broken)
    x = torch.randn(2, 16, 32, requires_grad=True)
    with caplog.at_level("WARNING", logger="vmmrt.torch"):
        fs = _build(_pair(2)[1], mode="none")
    off = vt.offload_of(fs[0])
    try:
        assert off.step_model is None and "could not be read" in caplog.text
        y = fs[1](fs[0](x))
        y.sum().backward()
        assert x.grad is not None
    finally:
        off.close()


def test_check_plan_refuses_the_optimizer_for_a_plan_given_its_own():
    fs = _build(_pair(2)[1], memory_budget=Budget(layers=["keep", "recompute"], reserve=1 << 20))
    off = vt.offload_of(fs[0])
    ran = []
    try:
        with pytest.raises(ValueError, match="Budget"):
            vt.check_plan(off, lambda: ran.append(1), steps=1, read=lambda: 1, reserve=1 << 20)
        assert not ran
        # describe() prints the budget plan with its predicted peak, and no second model's
        text = off.describe()
        assert off.plan.summary() in text and "predicted peak" in text and "whole step, predicted" not in text
    finally:
        off.close()


@pytest.mark.parametrize("told", [{}, {"reserve": 1 << 20}, {"reserve": 1 << 20, "step": 1 << 20}])
def test_check_plan_names_the_optimizer_memory_the_plan_was_not_told_of(told):
    """A step above the prediction, from a plan given no Budget(reserve=) or
    step=: the reading names what the plan did not count (on the H200 a
    hand plan without them predicted 2065 MiB of launch-shape layers whose
    step with foreach AdamW held 3449, its states and temporaries 1392).
    Within the tolerance, or told both, it names nothing."""
    _, mine = _pair(2)
    fs = _build(mine, memory_budget=Budget(layers=["keep", "recompute"], **told))
    off = vt.offload_of(fs[0])
    try:
        assert off.plan.reserve_bytes == told.get("reserve", 0)
        over = vt.check_plan(off, lambda: None, steps=1, read=lambda: int(off.plan.peak_bytes * 1.5))
        near = vt.check_plan(off, lambda: None, steps=1, read=lambda: int(off.plan.peak_bytes * 1.01))
        assert ("reserve= (the optimizer's states)" in over.left_out) == ("reserve" not in told)
        assert ("step= (the optimizer step's temporaries)" in over.left_out) == ("step" not in told)
        assert ("was given no" in over.describe()) == (len(told) < 2)
        assert "was given no" not in near.describe()
    finally:
        off.close()


def test_a_share_of_the_device_is_planned_against_its_total():
    _, mine = _pair(2)
    fs = _build(mine, memory_budget="50%")
    off = vt.offload_of(fs[0])
    try:
        assert off.plan.budget == off.runtime.mem_info()[1] // 2
        assert off.plan.counts()["keep"] == 2          # everything fits: nothing traded
        assert json.dumps(off.plan.as_dict())
    finally:
        off.close()


@pytest.mark.parametrize("kw,err", [
    (dict(memory_budget="lots"), InvalidBudget), (dict(memory_budget=1.5), InvalidBudget),
    (dict(memory_budget="80%", offload="auto"), ValueError), (dict(memory_budget=-3), InvalidBudget)])
def test_bad_memory_budget_is_refused_before_any_work(kw, err):
    _, mine = _pair(1)
    with pytest.raises(err):
        _build(mine, **kw)


def test_offload_allocate_takes_a_budget():
    torch.manual_seed(0)
    m = Block()
    off = vt.Offload(mode="pingpong", device="cpu")
    try:
        lay = off.layer("b", static=m.parameters())
        x = torch.randn(2, 16, 32, requires_grad=True)
        for _ in range(2):
            with lay.discovering() as p:
                y = m(x)
                p.outputs = y
            lay.fwd_ms.append(1.0)
            lay.bwd_ms.append(2.0)
            del y, p
        off.allocate(memory_budget=Budget(layers=["recompute"]))
        assert lay.recompute and off.plan.counts()["recompute"] == 1
    finally:
        off.close()


# ------------------------------------------------------ under graphs, on a GPU
def _llama(n=4, **shape):
    import copy
    from vmmrt.torch.bench import llama
    s = llama.Shape(**dict(dict(hidden=256, ffn=512, heads=4, kv_heads=2, seq=256, batch=2), **shape))
    base = llama.torch_layers(n, s, "cuda", torch.bfloat16, "math")
    return s, base, copy.deepcopy(base)


def _gpu_step(seq, layers, x, gy):
    for m in layers:
        m.zero_grad(set_to_none=True)
    x.grad = None
    y = x
    for f in seq:
        y = f(y)
    y.backward(gy)
    torch.cuda.synchronize()
    return y, [x.grad.clone()] + [p.grad.clone() for m in layers for p in m.parameters()]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["pingpong", "remap"])
def test_graphs_recompute_is_bitwise_graph_only_and_checkpoint(mode):
    from vmmrt.torch.bench import llama
    s, base, ref = _llama()

    def sample():
        return torch.randn(s.batch, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(),) for _ in ref))
        g = vt.make_graphed_callables(tuple(base), tuple((sample(),) for _ in base), mode=mode,
                                      memory_budget=Budget(layers=["recompute", 1.0, "recompute", "keep"]))
        off = vt.offload_of(g[0])
        try:
            assert off.plan.counts() == {"keep": 1, "offload": 1, "recompute": 2}
            torch.manual_seed(3)
            for it in range(3):
                x = sample()
                gy = torch.randn_like(x)
                y, got = _gpu_step(g, base, x, gy)
                # the recomputed layers' gradients too are in their slots (no static pool buffers)
                _grads_in_slots(off, base)
                yr, want = _gpu_step(gref, ref, x.detach().clone().requires_grad_(), gy)
                assert torch.equal(y, yr) and all(torch.equal(a, b) for a, b in zip(got, want)), it
            # a second backward into the .grad there: the accumulate graphs (g + g is 2g exactly)
            x.grad = None
            y = x
            for f in g:
                y = f(y)
            y.backward(gy)
            torch.cuda.synchronize()
            _grads_in_slots(off, base)
            twice = [p.grad for m in base for p in m.parameters()]
            assert all(torch.equal(a, 2 * b) for a, b in zip(twice, got[1:]))
        finally:
            off.close()
        # and, eagerly on the same device, against torch.utils.checkpoint itself
        for m in base + ref:
            m.__dict__.pop("forward", None)
        ge = vt.make_graphed_callables(tuple(base), tuple((sample(),) for _ in base), mode=mode, graphs=False,
                                       memory_budget=Budget(layers=["recompute", 1.0, "recompute", "keep"]))
        try:
            x = sample()
            gy = torch.randn_like(x)
            _, got = _gpu_step(ge, base, x, gy)
            ck = [lambda t, m=m: checkpoint(m, t, use_reentrant=False) for m in ref]
            _, want = _gpu_step(ck, ref, x.detach().clone().requires_grad_(), gy)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        finally:
            vt.offload_of(ge[0]).close()


class _Drop(torch.nn.Module):
    """y = dropout(x) * w: the output shows the mask, so the gradient tells
    whether the recomputation drew the forward's numbers."""

    def __init__(self, d):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(d, device="cuda"))

    def forward(self, x):
        return torch.nn.functional.dropout(x, 0.5, True) * self.w


@pytest.mark.gpu
def test_graphs_recompute_draws_the_forwards_random_numbers():
    layers = [_Drop(1024) for _ in range(3)]
    sample = [torch.randn(64, 1024, device="cuda", requires_grad=True) for _ in layers]
    g = vt.make_graphed_callables(tuple(layers), tuple((s,) for s in sample),
                                  memory_budget=Budget(layers=["recompute", "keep", "recompute"]))
    off = vt.offload_of(g[0])
    try:
        for it in range(4):
            x = torch.randn(64, 1024, device="cuda", requires_grad=True)
            y0 = g[0](x)
            if it == 2:                       # an abandoned forward: the states are set back in step
                off.abort()
                y0 = g[0](x)
            y1 = g[1](y0)
            y = g[2](y1)
            gy = torch.randn_like(y)
            y.backward(gy)
            torch.cuda.synchronize()
            masks = [(t != 0).float() for t in (y0, y1, y)]
            # d y / d x = mask2 * 2 * mask1 * 2 * mask0 * 2 (w = 1)
            want = gy * masks[0] * masks[1] * masks[2] * 8
            assert torch.equal(x.grad, want), it
            for m in layers:
                m.zero_grad(set_to_none=True)
    finally:
        off.close()


@pytest.mark.gpu
def test_graphs_builds_torn_down_give_back_all_they_took():
    """A budget sweep builds dozens of times in one process and each build
    plans against the static memory it measures: whatever one build leaves
    behind shrinks every later one's budget. The first build may leave what
    any first use leaves (cuBLAS workspaces, kernels); the later ones leave
    nothing at the driver (a new warm-up stream per build left 64 MiB each
    on the H200: cuBLAS workspaces per stream)."""
    import gc
    s, base, _ = _llama(2)

    def sample():
        return torch.randn(s.batch, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def build_step_close():
        g = vt.make_graphed_callables(tuple(base), tuple((sample(),) for _ in base))
        off = vt.offload_of(g[0])
        x = sample()
        _gpu_step(g, base, x, torch.randn_like(x))
        for m in base:
            m.__dict__.pop("forward", None)
            m.__dict__.pop("vmmrt_offload", None)
            m.zero_grad(set_to_none=True)
        off.close()
        del g, off, x
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        return total - free

    used = [build_step_close() for _ in range(4)]
    assert used[3] - used[1] < (4 << 20), ["%.1f MiB" % (u / 2 ** 20) for u in used]


@pytest.mark.gpu
def test_graphs_budget_between_keep_and_smallest_fits_and_is_bitwise():
    from vmmrt.torch.bench import llama
    # activations of ~50 MB a layer: the range from keeping all to the smallest plan is hundreds of MB,
    # far more than what one planning may find beside the other (a cuBLAS workspace for a new stream)
    s, base, ref = _llama(6, seq=1024, hidden=512, ffn=1024)

    def sample():
        return torch.randn(s.batch, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with llama.attention_backend("math"):
        # graph-only first: what it holds is on the device for every planning below
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(),) for _ in ref))
        # the planner's own range, from one planning: keeping all down to the smallest plan
        with pytest.raises(BudgetError) as e:
            vt.make_graphed_callables(tuple(base), tuple((sample(),) for _ in base), memory_budget=1)
        for m in base:
            m.__dict__.pop("forward", None)
        assert e.value.smallest < e.value.keep
        b = (e.value.keep + e.value.smallest) // 2
        g = vt.make_graphed_callables(tuple(base), tuple((sample(),) for _ in base), memory_budget=b)
        off = vt.offload_of(g[0])
        try:
            print(off.plan.summary())
            # the warm-up measured every layer's working sets
            assert all(lay.fwd_work and lay.bwd_work for lay in off.layers)
            assert min(max(lay.fwd_work) + max(lay.bwd_work) for lay in off.layers) > 0
            # this build's own measurements put b in the same range
            assert off.plan.smallest_bytes <= b < off.plan.keep_bytes
            assert off.plan.peak_bytes <= b and off.plan.counts()["keep"] < 6
            x = sample()
            gy = torch.randn_like(x)
            y, got = _gpu_step(g, base, x, gy)
            yr, want = _gpu_step(gref, ref, x.detach().clone().requires_grad_(), gy)
            assert torch.equal(y, yr) and all(torch.equal(a, b) for a, b in zip(got, want))
        finally:
            off.close()


def _outers(n, drop):
    torch.manual_seed(8)
    mine = [_Outer().cuda() for _ in range(n)]
    ref = [_Outer().cuda() for _ in range(n)]
    for a, b in zip(mine, ref):
        b.load_state_dict(a.state_dict())
        if drop:
            a.mlp.drop.p = b.mlp.drop.p = drop
        else:
            a.mlp.drop = b.mlp.drop = torch.nn.Identity()
    vt.mark_recompute(*[m.mlp for m in mine])
    return mine, ref


@pytest.mark.gpu
def test_graphs_marked_sub_block_is_bitwise_graph_only():
    mine, ref = _outers(3, 0.0)

    def sample():
        return torch.randn(2, 16, 32, device="cuda", requires_grad=True)
    gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(),) for _ in ref))
    g = vt.make_graphed_callables(tuple(mine), tuple((sample(),) for _ in mine), min_bytes=1024)
    off = vt.offload_of(g[0])
    try:
        before = [m.mlp.calls for m in mine]
        for it in range(2):
            x = sample()
            gy = torch.randn_like(x)
            y, got = _gpu_step(g, mine, x, gy)
            yr, want = _gpu_step(gref, ref, x.detach().clone().requires_grad_(), gy)
            assert torch.equal(y, yr) and all(torch.equal(a, b) for a, b in zip(got, want)), it
        assert [m.mlp.calls for m in mine] == before      # replays: the captured forward and recomputation
    finally:
        off.close()


@pytest.mark.gpu
def test_graphs_marked_sub_block_that_draws_random_numbers_is_refused():
    mine, _ = _outers(2, 0.5)
    with pytest.raises(vmmrt.Error, match="draws random numbers"):
        vt.make_graphed_callables(tuple(mine), tuple((torch.randn(2, 16, 32, device="cuda", requires_grad=True),)
                                                     for _ in mine))


def test_copies_that_slow_the_compute_cost_the_plan_even_where_they_hide():
    # Layers long enough that every copy hides (400 MB at 10 GB/s: 40 ms,
    # behind 50 ms forwards and 100 ms backwards); the compute loses 5 % of
    # a D2H's time and 2 % of an H2D's beside it (Offload.copy_contention).
    five = [LayerCost("l%d" % i, 50.0, 100.0, [300_000_000, 100_000_000]) for i in range(5)]
    plan = [1.0, 1.0, 1.0, 1.0, "keep"]
    free = budget.evaluate(five, plan, "pingpong", 1, d2h_gbps=10, margin=1.0)
    slow = budget.evaluate(five, plan, "pingpong", 1, d2h_gbps=10, margin=1.0, contention=(0.05, 0.02))
    assert [c.exposed_ms for c in free.layers] == [0] * 5 and free.copy_ms == 0
    # layers 0 and 1 copy (2 and 3 stay in their banks): 40 ms each way each
    assert [c.shared_ms for c in slow.layers] == [pytest.approx(0.05 * 40 + 0.02 * 40)] * 2 + [0] * 3
    assert slow.predicted_ms == pytest.approx(free.predicted_ms + 2 * 2.8)
    assert "slowing the compute" in slow.summary() and "of compute slowed by its copies" in slow.summary()
    assert slow.as_dict()["contention"] == [0.05, 0.02]
    # the search weighs it: 100 MB regions that hide behind 1.5 ms layers at
    # 100 GB/s (1 ms a copy) move for free, or for 1.8 ms each where the
    # compute loses 90 % of a copy's time, more than recomputing (1.5 ms)
    six = [LayerCost("l%d" % i, 1.5, 3.0, [100_000_000]) for i in range(6)]
    limit = budget.evaluate(six, ["keep"] * 6, "pingpong", 1, d2h_gbps=100).peak_bytes - 1
    moved = budget.search(six, limit, d2h_gbps=100, margin=1.0)
    assert moved.counts()["offload"] > 0 and moved.counts()["recompute"] == 0 and moved.copy_ms == 0
    p = budget.search(six, limit, d2h_gbps=100, margin=1.0, contention=(0.9, 0.9))
    assert p.counts()["recompute"] > 0 and p.counts()["offload"] == 0, p.summary()
    for bad in ((-1.0, 0.0), (0.1,), (True, 0.0), (float("inf"), 0.0), 0.5):
        with pytest.raises(budget.InvalidBudget):
            budget.evaluate(five, plan, d2h_gbps=10, contention=bad)


def test_the_step_model_puts_the_memory_plans_bytes_in_place_of_its_estimate():
    """Once the memory plan is made (StepModel.planned), the peak in the
    loop it learned is the static part (less the graphs' static tensors the
    pages hold), the optimizer's states, the banks and the static inputs
    outside the pages, the plan's own bytes, the optimizer's temporaries
    the pages' free bytes at the step's end cannot take (all of them where
    the step is not routed there) and the working set where the graphs'
    pool is not on the pages; the other loop keeps the estimate."""
    import types
    from vmmrt.torch import planner
    M = 1 << 20
    costs = [budget.LayerCost("l%d" % i, 1.0, 2.0, [8 * M, 4 * M], fixed=M, grads=6 * M, fwd_work=5 * M,
                              bwd_work=7 * M) for i in range(3)]
    kw = dict(mode="pingpong", lookahead=1, granularity=1, map_ahead=0, pages=True)
    m = planner.StepModel(costs, [[0], [0], []], 100 * M, kw, graph_bytes=9 * M)
    est = {x: m.peak(20 * M, 10 * M, x) for x in ("set_to_none", "persistent")}
    p = budget.predict(costs, m.chosen, static_bytes=120 * M, step_bytes=10 * M, **kw)
    assert est["set_to_none"] == p.peak_bytes and p.bank_bytes == 16 * M and p.inflight_bytes == 7 * M
    plan = types.SimpleNamespace(total_bytes=30 * M, free_at_end=4 * M, graph_bytes=3 * M, has_pool=True)
    m.planned(plan, "set_to_none", True)
    base = 100 * M - 3 * M + 20 * M + 16 * M + 30 * M
    # 4 of the 30 in the pages' free bytes, 16 in the banks (ping-pong's are lent too)
    assert m.peak(20 * M, 30 * M, "set_to_none") == base + 10 * M
    assert m.peak(20 * M, 10 * M, "set_to_none") == base                    # all of them
    assert m.peak(20 * M, 10 * M, "persistent") == est["persistent"]        # the other loop: the estimate
    m.planned(plan, "set_to_none", False)                                   # not routed: all from PyTorch
    assert m.peak(20 * M, 10 * M, "set_to_none") == base + 10 * M
    # remap's slots are not lent: only the pages' free bytes
    r = planner.StepModel(costs, [[0], [0], []], 100 * M, dict(kw, mode="remap"), graph_bytes=9 * M)
    r.planned(plan, "set_to_none", True)
    rb = r.peak(20 * M, 0, "set_to_none")
    assert r.peak(20 * M, 10 * M, "set_to_none") == rb + 6 * M
    m.planned(types.SimpleNamespace(total_bytes=30 * M, free_at_end=0, graph_bytes=50 * M, has_pool=False), None,
              True)
    # no gradient slot on the pages: both loops; the pool not on them: its working set beside;
    # the graphs' statics counted once (no more than the static part counted)
    for x in ("set_to_none", "persistent"):
        assert m.peak(20 * M, 0, x) == 100 * M - 9 * M + 20 * M + 16 * M + 30 * M + 7 * M
    assert "from the memory plan's pages (30 MiB)" in m.describe()
