# SPDX-License-Identifier: LGPL-2.1-or-later
"""A forward graph's outputs in a slot of the layer's own (vmmrt.torch.outputs),
whose life the memory plan learns from the step before it: in a chain, from
the layer's forward to the next layer's, so outputs of layers two apart share
bytes, where a graph pool would hold every layer's for good. A tensor over
them kept past that life is caught at the use that would write over it.

On the host backend over graphs that capture nothing (test_call_path's
harness): where the bytes lie and what the plan makes of them; the values
on the H200 (test_memplan_gpu.py)."""
import contextlib

import pytest
import torch

from test_call_path import _graphed_on_host, host_graphs  # noqa: F401 - a fixture
from vmmrt.torch import graphed, memplan, outputs

pytestmark = pytest.mark.skipif(not outputs.AVAILABLE, reason="torch without a storage use count (torch < 2)")


def _run(g, x, gy, keep=None, hold_last=False):
    """One step; ``keep``: a list that keeps layer 0's output through the
    step; ``hold_last``: the last layer's output returned (held by the
    caller, as a loop's variable does, into the next step)."""
    y = x
    for k, m in enumerate(g):
        y = m(y)
        if keep is not None and k == 0:
            keep.append(y)
    y.backward(gy)
    for m in g:
        for p in m.parameters():
            p.grad = None
    return y if hold_last else None


def _inputs():
    return torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32)


@contextlib.contextmanager
def _planned(steps):
    """Graphed layers with the memory plan on, ``steps`` steps run: (the
    callables, their Offload, the runners, an input and its gradient)."""
    g, off, runners = _graphed_on_host("none", "mapped")
    off.plan_memory(True)
    try:
        x, gy = _inputs()
        for _ in range(steps):
            _run(g, x, gy)
        yield g, off, runners, x, gy
    finally:
        graphed._close(off, runners)


def test_the_forwards_outputs_lie_in_their_slot_and_nothing_else_holds_them(host_graphs):  # noqa: F811
    g, off, runners = _graphed_on_host("none", "mapped")
    try:
        for r in runners:
            o = r.layer.outputs
            assert o is not None and o.landed == 1
            b = o.backing
            assert all(b.address <= t.data_ptr() < b.address + b.nbytes for t in r.static_outputs)
            assert b in off.backings and b.kept and b.mapped
            assert not o.alive()            # the graphs' own static outputs are the library's
        x, gy = _inputs()
        y = g[0](x)
        assert runners[0].layer.outputs.alive() and not runners[1].layer.outputs.alive()
        v = y[0].detach()                   # a view of it, not the tensor handed out
        del y
        assert runners[0].layer.outputs.alive()
        del v
        assert not runners[0].layer.outputs.alive()
        off.abort()
    finally:
        graphed._close(off, runners)


def test_the_plan_learns_the_chain_and_shares_the_outputs_of_layers_two_apart(host_graphs, monkeypatch):  # noqa: F811
    # (the layout of each slot on pages of its own: with the gradients on
    # their layers' resident pages, layer 0's outputs land on layer 2's)
    monkeypatch.setattr(memplan, "SHARE_GRADS", False)
    with _planned(4) as (g, off, runners, x, gy):
        plan = off.memplan.plan
        assert plan is not None
        by = plan.by_key()
        f = {r.name: plan.order.index((r.name, False)) for r in runners}
        for i, r in enumerate(runners[:-1]):
            life = by[(r.name, memplan.OUTPUTS)]
            # held by the caller until the next layer's forward has taken it
            assert (life.start, life.end) == (f[r.name], f[runners[i + 1].name])
        last = by[(runners[-1].name, memplan.OUTPUTS)]
        assert (last.start, last.end) == (f[runners[-1].name], plan.order.index((runners[0].name, True)))
        assert (runners[2].name, memplan.OUTPUTS) in plan.shares[(runners[0].name, memplan.OUTPUTS)]
        assert all(r.layer.outputs.backing.bound for r in runners)
        st = off.stats()
        assert st["plan_conflicts"] == 0
        assert off.maps_per_use() is False


def test_an_output_kept_past_its_learned_life_gets_a_conflict_not_an_alias(host_graphs, monkeypatch):  # noqa: F811
    monkeypatch.setattr(memplan, "SHARE_GRADS", False)      # (a layout where outputs share with outputs)
    with _planned(3) as (g, off, runners, x, gy):
        assert off.memplan.plan is not None and off.stats()["plan_conflicts"] == 0
        first = runners[0].layer.outputs.backing
        sharers = [e for e in off.memplan.entries if first in e.sharers]
        assert sharers
        kept = []
        _run(g, x, gy, keep=kept)           # layer 0's output held through the whole step
        assert off.stats()["plan_conflicts"] >= 1
        # what began its use over those bytes while it was held left the pages
        assert any(not e.backing.bound for e in sharers)
        # an outputs' slot off them is mapped before its forward returns (the
        # caller's copies of its outputs are checked when enqueued), not by
        # the stream later
        assert all(r.layer.outputs.backing.bound or not r.layer.outputs.backing._on_stream for r in runners)
        assert any(not r.layer.outputs.backing.bound for r in runners)
        del kept[:]


def test_an_output_kept_over_a_gradients_resident_pages_sends_both_slots_off_them(host_graphs):  # noqa: F811
    # with the gradients on their layers' resident pages (memplan.share_grads),
    # a kept output that shares those pages sends both slots off them
    with _planned(3) as (g, off, runners, x, gy):
        first = runners[0].layer.outputs.backing
        split = [e for e in off.memplan.entries if e.table is not None and first in e.sharers]
        assert split, off.memplan.describe()
        kept = []
        y = x
        for k, m in enumerate(g):
            y = m(y)
            if k == 0:
                kept.append(y)
                want = y.detach().clone()
        y.backward(gy)
        del y
        assert torch.equal(kept[0].detach(), want)
        assert off.stats()["plan_conflicts"] >= 1
        assert all(not e.backing.bound for e in split)
        del kept[:]


def test_an_output_held_while_the_plan_is_learned_gets_the_longer_life(host_graphs):  # noqa: F811
    with _planned(0) as (g, off, runners, x, gy):
        kept = []
        _run(g, x, gy, keep=kept)           # the step the plan learns from (the first after the build)
        del kept[:]
        _run(g, x, gy, keep=kept)           # (the plan is made at its first forward)
        life = off.memplan.plan.by_key()[(runners[0].name, memplan.OUTPUTS)]
        # held until the step's last use (its own backward: the step's end here)
        assert (life.start, life.end) == (0, off.memplan.plan.order.index((runners[0].name, True)))
        del kept[:]
        _run(g, x, gy, keep=kept)
        assert off.stats()["plan_conflicts"] == 0


def test_the_last_output_held_by_the_loop_into_the_next_step_keeps_its_memory(host_graphs):  # noqa: F811
    # A training loop's `y = model(x)` holds the last layer's output until
    # the next step's forward has returned: nothing may share its bytes.
    g, off, runners = _graphed_on_host("none", "mapped")
    off.plan_memory(True)
    try:
        x, gy = _inputs()
        ys = []
        for step in range(6):
            y = _run(g, x, gy, hold_last=True)
            ys.append(y.detach().clone())
            assert torch.equal(y, ys[-1])
            if step >= 3:       # the one of the step before, written over by no use of this one
                assert torch.equal(prev, ys[-2])
            prev = y
        plan = off.memplan.plan
        last = plan.by_key()[(runners[-1].name, memplan.OUTPUTS)]
        assert (last.start, last.end) == (0, len(plan.order)) and last.offset is None
        assert not any((runners[-1].name, memplan.OUTPUTS) == e.life.key for e in off.memplan.entries)
        assert off.stats()["plan_conflicts"] == 0
        assert all(r.layer.outputs.backing.bound for r in runners[:-1])
        del prev, y
        off.abort()
    finally:
        graphed._close(off, runners)


def test_lives_of_outputs():
    order = [("a", False), ("b", False), ("c", False), ("c", True), ("b", True), ("a", True)]
    items = memplan.lives(order, {}, [], {"a": (100, 1), "b": (100, None), "c": (100, 6)})
    by = {it.key[0]: it for it in items}
    assert (by["a"].start, by["a"].end) == (0, 1)        # taken by b's forward
    assert (by["b"].start, by["b"].end) == (1, 1)        # held by nothing after its forward
    assert (by["c"].start, by["c"].end) == (0, 6)        # still held at the next step's first use
    assert not by["c"].shared and by["a"].shared          # (memory of its own, off the pages)
    items = memplan.lives(order, {}, [], {"c": (100, 0)})  # held at the first use: from the step before
    assert (items[0].start, items[0].end) == (0, 6) and not items[0].shared
    plan = memplan.Plan(order, memplan.lives(order, {}, [], {"a": (4096, 1), "b": (4096, 2), "c": (4096, 3)}), 4096)
    # a and c never overlap: two granules hold the three
    assert plan.pages_bytes == 2 * 4096


def test_no_outputs_slot_for_recomputed_or_eager_layers():
    class L:
        out_births = []
        recompute = False
        outputs = None
    from vmmrt.torch.layer import LayerOffload
    lay = L()
    LayerOffload.plan_outputs(lay)          # nothing discovered: nothing made
    assert lay.outputs is None


def test_teardown_lets_the_runtime_go_once_no_output_handed_out_is_held(host_graphs):  # noqa: F811
    # The outputs' base is the library's own; a finalizer holding what holds
    # it would never run, and every build would keep its runtime (its pages)
    # for the life of the process. An output a user keeps defers the
    # destroy until it is dropped, never frees under it.
    import gc
    g, off, runners = _graphed_on_host("none", "mapped")
    off.plan_memory(True)
    x, gy = _inputs()
    for _ in range(3):
        _run(g, x, gy)
    kept = g[0](x).detach()
    off.abort()
    rt = off.runtime
    graphed._close(off, runners)
    del g, off, runners
    gc.collect()
    assert rt.holds == 1 and rt.destroy_deferred
    kept.add_(1.0)                          # its memory is still there
    del kept
    gc.collect()
    assert rt.holds == 0


def test_a_reference_of_the_build_that_goes_later_does_not_hide_an_output_handed_out(host_graphs):  # noqa: F811
    g, off, runners = _graphed_on_host("none", "mapped")
    try:
        o = runners[0].layer.outputs
        extra = runners[0].static_outputs[0].detach()     # as if the build had kept one more
        o.settle()
        del extra                                        # ...and let it go since
        assert not o.alive()
        x, _ = _inputs()
        y = g[0](x)
        assert o.alive()                                 # the one handed out is seen
        del y
        assert not o.alive()
        off.abort()
    finally:
        graphed._close(off, runners)
