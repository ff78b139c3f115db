# SPDX-License-Identifier: LGPL-2.1-or-later
"""grads="mapped" with graphs: the backward graph's output gradients (its
static inputs) and the gradients it makes for the layer's arguments (its
static outputs) lie in a slot of their own beside the gradients' (Grads.io),
which has memory only from the backward to the next use (on the memory
plan's pages, shared with the activations of the layers after), not in the
caching allocator and the graph pool for the life of the graphs, nor, in
the persistent loop, for good with the parameters' gradients. Run on the host backend over graphs that capture nothing
(test_call_path's harness): where the bytes are and who holds them is
checked here; the values on the H200 (test_memplan_gpu.py)."""
import gc

import pytest
import torch

from test_call_path import _graphed_on_host, host_graphs  # noqa: F401 - a fixture
from test_optmem import FakePools, routes
from vmmrt.torch import graphed, optmem, place

pytestmark = pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")


def _inside(t, backing):
    return backing.address <= t.data_ptr() < backing.address + backing.nbytes


def _slots(off):
    return [b for lay in off.layers if lay.grads is not None
            for b in (lay.grads.backing, lay.grads.io, lay.grads.outs) if b is not None]


def _data(g):
    """A step's input and output gradient for the Zoo layers, and the layers' parameters."""
    return torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32), [p for m in g for p in m.parameters()]


def _step(g, x, gy, hook=None, params=()):
    """One step; ``hook(k, y)`` after layer k's forward; ``params``' .grad
    dropped after it (zero_grad(set_to_none=True))."""
    y = x
    for k, m in enumerate(g):
        y = m(y)
        if hook is not None:
            hook(k, y)
    y.backward(gy)
    del y
    for p in params:
        p.grad = None


def test_the_backwards_static_tensors_lie_in_their_io_slot(host_graphs):  # noqa: F811
    g, off, runners = _graphed_on_host("none", "mapped")
    try:
        for r in runners:
            assert r.grad_mode == "mapped"
            b, o = r.grads.io, r.grads.outs
            assert b is not None and o is not None and len({id(b), id(o), id(r.grads.backing)}) == 3
            assert r.grads.io_bytes == b.nbytes + o.nbytes
            assert r.gouts_in_slot and r.grads.gouts_used
            assert all(_inside(t, o) for t in r.static_grad_outputs if t is not None)
            assert r.gin_where is not None and r.gin_where[0] is not None
            assert _inside(r.static_grad_inputs[0], b) and _inside(r.acc_grad_inputs[0], b)
            # the parameters' gradients are not in either
            assert not any(_inside(p.grad, s) for p in r.params if p.grad is not None for s in (b, o))
        assert "output gradient" in off.layers[0].grads.describe()
    finally:
        graphed._close(off, runners)


def test_a_leaf_arguments_grad_is_its_own_and_nothing_holds_the_slot_past_the_step(host_graphs):  # noqa: F811
    # The first layer's argument is a leaf that requires grad (a benchmark's
    # input): AccumulateGrad must copy its gradient out of the slot, or
    # x.grad would hold the slot (and the plan's pages under it) for good.
    g, off, runners = _graphed_on_host("none", "mapped")
    try:
        x, gy, params = _data(g)
        for _ in range(3):
            _step(g, x, gy)
            assert x.grad is not None and not any(_inside(x.grad, b) for b in _slots(off))
            assert off.gin_hold is not None          # the last backward's, until the next forward
            for p in params:
                p.grad = None
            g[0](x)                                    # a forward lets it go...
            assert off.gin_hold is None
            # ...and then nothing holds a gradient slot: its memory can go
            assert all(b.live == 0 for b in _slots(off)), [b.live for b in _slots(off)]
            off.abort()                                # (the forward alone: its iteration abandoned)
    finally:
        graphed._close(off, runners)


@routes
@pytest.mark.parametrize("keep", [False, True])
def test_the_optimizer_step_may_use_their_bytes_unless_a_gradient_handed_out_is_kept(host_graphs, keep):  # noqa: F811
    # At the optimizer step the gradients' slots are busy (the parameters'
    # .grad): their bytes are not lent (vmmrt.torch.optmem), but the
    # io slots' output and argument gradients are dead by then, unless the
    # user kept an argument's gradient (a hook that stores it): then its
    # slot is busy and its bytes are not lent.
    g, off, runners = _graphed_on_host("none", "mapped")
    seen = []
    kept = []
    try:
        off.plan_memory(True)                 # (as make_graphed_callables does)
        off.memplan.optimizer_api = FakePools
        params = [p for m in g for p in m.parameters()]
        opt = torch.optim.SGD(params, lr=0.0)

        def look(*a):
            w = off.memplan
            if w.optimizer is None or not w.optimizer.api.lent:
                return
            base = w.optimizer.view.address
            lent = [(a_ - base, a_ - base + n) for a_, n in w.optimizer.api.lent]
            at = {id(e.backing): e.life.offset for e in w.entries}
            row = []
            for lay in off.layers:           # per layer: (its io slot busy, its bytes lent; its gradients' lent)
                gr = lay.grads
                o, io = at[id(gr.backing)], at[id(gr.io)]
                row.append((gr.io.busy, optmem.overlaps(lent, io, io + gr.io.nbytes),
                            optmem.overlaps(lent, o, o + gr.backing.nbytes)))
            seen.append(row)
        h = opt.register_step_post_hook(look)
        x, gy = torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32)
        for i in range(4):
            opt.zero_grad(set_to_none=True)
            y = g[0](x)
            if keep and i == 3:                              # (the plan made: at its second step)
                y.register_hook(lambda t: kept.append(t))    # layer 1's argument gradient
            for m in g[1:]:
                y = m(y)
            y.backward(gy)
            del y
            opt.step()
        h.remove()
        last = seen[-1]
        assert last and all(not params_lent for _, _, params_lent in last)
        # layer 1's io slot is held while the kept gradient lives, and none of its bytes lent
        assert [busy for busy, _, _ in last] == [keep and i == 1 for i in range(len(last))], last
        if keep:
            assert not last[1][1], last
        assert any(io_lent for _, io_lent, _ in last), last
    finally:
        kept.clear()
        graphed._close(off, runners)


def test_in_the_persistent_loop_the_io_slots_are_on_the_pages_and_the_gradients_their_own(host_graphs):  # noqa: F811
    # A persistent .grad keeps the gradients' slot for good; the backward's
    # output and argument gradients do not go with it: their io slot shares
    # the plan's pages with the slots whose lives do not meet its own (one
    # layer output's size twice per layer, 8 x 64 MiB on the Llama layers).
    from vmmrt.torch import memplan
    g, off, runners = _graphed_on_host("none", "mapped", plan=True)
    try:
        x, gy = torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32)
        for _ in range(4):
            _step(g, x, gy)                  # .grad kept: the persistent loop
        w = off.memplan
        assert w.plan is not None and w.conflicts == 0, w.describe()
        by = w.plan.by_key()
        order = {use: k for k, use in enumerate(w.order)}
        for lay in off.layers:
            gr = lay.grads
            lg, lio, lgo = by[(gr.name, memplan.GRADS)], by[(gr.name, memplan.IO)], by[(gr.name, memplan.GOUTS)]
            assert not lg.shared and not gr.backing.bound, w.describe()
            assert lio.shared and gr.io.bound and lgo.shared and gr.outs.bound, w.describe()
            b = order[(lay.name, True)]
            assert (lio.start, lio.end) == (b, min(b + 1, len(w.order))) and (lgo.start, lgo.end) == (b, b)
        assert any(w.plan.shares[(lay.grads.name, memplan.IO)] for lay in off.layers), w.describe()
        assert all(p.grad is not None for m in g for p in m.parameters())
        assert "argument gradients in a slot of their own" in off.layers[0].grads.describe()
    finally:
        graphed._close(off, runners)


@pytest.mark.parametrize("plan", [False, True])
def test_a_backwards_output_gradients_slot_is_done_with_once_it_has_run(host_graphs, plan):  # noqa: F811
    # The output gradients the call copies in are read by the backward
    # graph alone: their slot's use ends with that backward, while the
    # argument gradients' (io) lasts to the next use, which reads them.
    # Off the plan it is mapped for the backward and given back after; on
    # it, it shares the pages with what lives while it does not.
    from vmmrt.torch import memplan
    g, off, runners = _graphed_on_host("none", "mapped", plan=plan)
    try:
        x, gy, params = _data(g)
        seen = []

        def wanted(b):
            return b.busy or b.mapped

        def look(later):
            # run on layer k's output gradient: after layer k+1's backward,
            # before layer k's
            return lambda t: seen.append((wanted(later.outs), wanted(later.io)))
        for _ in range(4):
            _step(g, x, gy, lambda k, y: k + 1 < len(g) and y.register_hook(look(off.layers[k + 1].grads)), params)
        assert len(seen) == 4 * (len(g) - 1)
        assert not any(o for o, _ in seen), seen
        assert all(i for _, i in seen), seen
        if plan:
            w = off.memplan
            assert w.plan is not None and w.conflicts == 0, w.describe()
            for lay in off.layers:
                it = w.plan.by_key()[(lay.grads.name, memplan.GOUTS)]
                assert it.start == it.end and lay.grads.outs.bound, w.describe()
    finally:
        graphed._close(off, runners)


@pytest.mark.parametrize("checkpointed", [True, False])
def test_a_recomputed_layers_slot_has_its_statics_where_its_backward_is_any_layers(host_graphs, monkeypatch,  # noqa: F811
                                                                                   checkpointed):
    # Where torch's checkpoint takes the graphs' route (recompute.CHECKPOINTED),
    # a recomputed layer's backward is captured as any layer's: its statics
    # lie in its slot. Without it, its backward graph runs its forward again
    # and keeps its statics: made again once the budget planner chose it
    # (graphed._allocate), its slot has no room for them, and the slots made
    # before are gone.
    from vmmrt.torch import recompute
    monkeypatch.setattr(recompute, "CHECKPOINTED", checkpointed)
    g, off, runners = _graphed_on_host("none", "mapped")
    try:
        n = len(off.backings)
        assert all(r.grads.io_bytes > 0 for r in runners)
        runners[1].recompute = True
        graphed._make_grads(runners, off, True)
        assert [r.grads.io_bytes > 0 for r in runners] == [True, checkpointed, True, True]
        # (the slots made before are gone: a recomputed layer without the
        # graphs' route has no io slot, nor one for its output gradients)
        assert len(off.backings) == n - 2 * (not checkpointed)
        assert all(b in off.backings for r in runners for b in (r.grads.backing, r.grads.io, r.grads.outs)
                   if b is not None)
    finally:
        graphed._close(off, runners)


def test_the_budget_planner_counts_a_slots_parameters_gradients_only(host_graphs):  # noqa: F811
    # The planner counts the backward's statics with the graphs' static
    # bytes (planner.static_bytes), whether or not they lie in the slot (a
    # layer it recomputes has none there): its layer's gradients are the
    # parameters' alone, not counted twice.
    from vmmrt.torch import planner
    g, off, runners = _graphed_on_host("none", "mapped")
    try:
        rows = planner.layer_costs(off, None, runners)
        for row, r in zip(rows, runners):
            assert r.grads.io_bytes > 0
            assert row.grads == r.grads.backing.nbytes
    finally:
        graphed._close(off, runners)


def test_the_budget_planner_counts_the_static_inputs_with_their_layers(host_graphs):  # noqa: F811
    # With the static inputs in the resident slots (the memory plan), the
    # caller's sample tensors they replace are not static memory (the build
    # lets them go); each layer's are its LayerCost.inputs, which its plan
    # places in its slot or, where it has none, all along (test_budget).
    from vmmrt.torch import planner, static_inputs
    g, off, runners = _graphed_on_host("none", "mapped")     # (built without them in the slots)
    try:
        assert [row.inputs for row in planner.layer_costs(off, None, runners)] == [0] * len(runners)
        before = planner.static_bytes(off, runners, True, 0)
        for r in runners:           # as graphed._allocate sets them with the memory plan, before planning
            r.layer.input_bytes = static_inputs.sizes(r.sample)
        rows = planner.layer_costs(off, None, runners)
        sizes = [sum(t.numel() * t.element_size() for t in r.sample) for r in runners]
        assert [row.inputs for row in rows] == sizes and all(sizes)
        assert planner.static_bytes(off, runners, True, 0) == before - sum(sizes)
    finally:
        graphed._close(off, runners)


def test_an_argument_gradient_kept_past_the_next_use_is_never_written_over(host_graphs):  # noqa: F811
    # The io slot's life ends at the use after its backward; a user who keeps
    # an argument's gradient longer (a hook that stores it) keeps the slot
    # busy: a slot sharing its bytes that begins its use then (the next
    # step's forwards, whose static inputs are copied into their resident
    # slots) gets memory of its own, counted as a conflict, and the kept
    # gradient's bytes are left as they were.
    from vmmrt.torch import memplan
    g, off, runners = _graphed_on_host("none", "mapped", plan=True, inputs=True)
    kept = []
    k = None
    try:
        x, gy = torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32)
        for i in range(6):
            for m in g:
                for p in m.parameters():
                    p.grad = None
            if i == 3:                                       # (the plan made: at its second step)
                # the first layer after the first whose io slot shares bytes:
                # which do is the plan's layout, which the layers' reuse
                # timelines shape (one full run in several placed layer 1's alone)
                shares = off.memplan.plan.shares
                by_backing = {id(e.backing): e.life.key for e in off.memplan.entries}
                k = next(j for j in range(1, len(runners))
                         if shares.get(by_backing.get(id(runners[j].grads.io))))
            y = x
            for j, m in enumerate(g):
                if i == 3 and j == k:
                    y.register_hook(lambda t: kept.append(t))    # layer k's argument gradient
                y = m(y)
            y.backward(gy)
            del y
            off.runtime.offload_sync()       # (the workers' releases done: every slot binds at its next use)
            if i == 3:
                assert off.memplan.plan is not None
                io = runners[k].grads.io
                assert len(kept) == 1 and io.address <= kept[0].data_ptr() < io.address + io.nbytes
                assert io.bound and io.busy
                want = kept[0].clone()
        assert off.memplan.conflicts >= 1, off.memplan.describe()
        assert torch.equal(kept[0], want)
        kept.clear()                     # let go: the slots come back to the pages, the outputs' too
        gc.collect()
        for _ in range(3):
            _step(g, x, gy)
            for m in g:
                for p in m.parameters():
                    p.grad = None
            # (a slot off the pages binds at a use once the workers have
            # given its own memory back: waited for here, not left to timing)
            off.runtime.offload_sync()
        assert all(e.backing.bound for e in off.memplan.entries), off.memplan.describe()
        assert not any(e.backing.mapped for e in off.memplan.entries)     # (their own memory given back)
    finally:
        kept.clear()
        graphed._close(off, runners)


@pytest.mark.parametrize("keep", [False, True])
def test_a_backwards_output_gradient_is_read_where_the_layer_after_wrote_it(host_graphs, monkeypatch, keep):  # noqa: F811
    # A chain hands layer k's backward the argument gradient layer k+1's
    # backward made in its io slot: the plan maps layer k's output
    # gradients' slot on those pages (one gradient per layer boundary, as
    # eager holds, not two) and the call copies nothing in. Either loop;
    # the last layer's (the caller's gradient) keeps a slot of its own.
    from vmmrt.torch import memplan
    sizes = {}
    for chain in (True, False):
        monkeypatch.setattr(memplan, "CHAIN_GOUTS", chain)
        g, off, runners = _graphed_on_host("none", "mapped", plan=True)
        try:
            x, gy, params = _data(g)
            for _ in range(4):
                _step(g, x, gy, params=() if keep else params)
            w = off.memplan
            assert w.plan is not None and w.conflicts == 0, w.describe()
            by = w.plan.by_key()
            # what the pages hold at the second backward (where layer 2's
            # argument gradient is layer 1's output gradient)
            t = w.order.index((off.layers[-2].name, True))
            sizes[chain] = memplan.alive_at(w.plan.items, t, off.granularity)
            grads = [lay.grads for lay in off.layers]
            if not chain:
                assert not w.plan.chained and all(gr.chain is None and gr.chain_skips == 0 for gr in grads)
                continue
            assert sorted(w.plan.chained) == sorted((gr.name, memplan.GOUTS) for gr in grads[:-1]), w.describe()
            assert grads[-1].chain is None and grads[-1].outs.bound
            for gr, after in zip(grads, grads[1:]):
                assert gr.chain[0] is after.io and gr.outs.bound and after.io.bound
                assert by[(gr.name, memplan.GOUTS)].offset == by[(after.name, memplan.IO)].offset, w.describe()
                assert gr.chain_skips == 3, gr.describe()       # (the steps from the plan on: 2, 3, 4)
                assert "copies skipped" in gr.describe()
                # one memory under both addresses
                io, outs = after.io_base(), gr.outs_base()
                io[:64] = torch.arange(64, dtype=torch.uint8)
                assert torch.equal(outs[:64], io[:64])
                io[:64] = 0
                assert not outs[:64].any()
        finally:
            graphed._close(off, runners)
    assert sum(sizes[False].values()) - sum(sizes[True].values()) == sizes[False][memplan.GOUTS] > 0, sizes


def test_an_output_gradient_that_is_not_the_layer_afters_is_copied_off_its_pages(host_graphs):  # noqa: F811
    # A hook that hands layer 1's backward another tensor than layer 2's
    # argument gradient (7s: the graphs on the host write none), which it
    # keeps: the copy in would write over the kept tensor's bytes (its
    # pages are the output gradients' slot's), so that slot takes memory
    # of its own for the use (a conflict, counted), and goes back on the
    # pages after.
    g, off, runners = _graphed_on_host("none", "mapped", plan=True)
    try:
        x, gy, params = _data(g)
        kept = []

        def step(hook):
            _step(g, x, gy, lambda k, y: hook and k == 1 and y.register_hook(
                lambda t: kept.append((t, t.clone())) or torch.full_like(t, 7.0)), params)
        for _ in range(3):
            step(False)
        w, gr = off.memplan, off.layers[1].grads
        assert w.plan is not None and gr.chain is not None and w.conflicts == 0, w.describe()
        skips = gr.chain_skips
        step(True)
        (t, before), = kept
        assert t.data_ptr() == gr.chain[1]              # the layer after's argument gradient, kept
        assert torch.equal(t, before)                   # not written over by the copy of the 7s
        assert w.conflicts >= 1 and not gr.outs.bound and gr.chain_skips == skips
        del t, before
        kept.clear()
        n = w.conflicts
        for _ in range(3):
            step(False)
        assert gr.outs.bound and gr.chain_skips > skips and w.conflicts == n, w.describe()
    finally:
        graphed._close(off, runners)
