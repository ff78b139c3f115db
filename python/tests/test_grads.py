# SPDX-License-Identifier: LGPL-2.1-or-later
"""grads="mapped" (vmmrt.torch.grads) on the CPU, with the host backend's
eager offload: each parameter's .grad lives at its fixed address in a slot
whose memory is mapped for the backward and released when the .grad is
freed; gradients bitwise as eager's in both training loops (set_to_none and
a persistent .grad), over microbatches; hooks run; the memory comes back."""
import copy
import time

import pytest
import torch

import vmmrt.torch as vt
from vmmrt.torch import place

from conftest import grads, same, samples, step, zoo_layers

pytestmark = pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")


def build(n=3, mode="pingpong", **kw):
    base = zoo_layers(n)
    ref = copy.deepcopy(base)
    kw.setdefault("min_bytes", 0)
    g = vt.make_graphed_callables(tuple(base), samples(n), graphs=False, mode=mode, **kw)
    return g, base, ref


def layer_grads(off):
    return [lay.grads for lay in off.layers]


def wait_state(slot, want, timeout=5.0):
    t0 = time.monotonic()
    while slot.state != want and time.monotonic() - t0 < timeout:
        time.sleep(0.002)
    return slot.state


def zero(layers, set_to_none):
    for m in layers:
        m.zero_grad(set_to_none=set_to_none)


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
def test_both_loops_are_bitwise_eager_and_grad_is_at_its_address(mode, set_to_none):
    g, base, ref = build(mode=mode)
    off = vt.offload_of(g[0])
    assert all(gr is not None and gr.mapped for gr in layer_grads(off)), [gr.describe() for gr in layer_grads(off)]
    torch.manual_seed(3)
    for it in range(3):
        zero(base + ref, set_to_none)
        for micro in range(2):                       # accumulation over microbatches
            x = torch.randn(2, 8, 32, requires_grad=True)
            gy = torch.randn(2, 8, 32)
            step(g, x, gy)
            step(ref, x.detach().clone().requires_grad_(), gy)
        assert same(grads(base), grads(ref)), (mode, set_to_none, it)
        for m, gr in zip(base, layer_grads(off)):
            for k, p in enumerate(m.parameters()):
                assert gr.state(k, p) == "ours", (k, p.shape)


def test_memory_comes_back_when_grad_is_freed_and_not_before():
    g, base, ref = build()
    off = vt.offload_of(g[0])
    x = torch.randn(2, 8, 32, requires_grad=True)
    step(g, x, torch.randn(2, 8, 32))
    gr = layer_grads(off)[0]
    assert gr.backing.live == 1 and wait_state(gr.backing.slot, "mapped") == "mapped"
    keep = next(base[0].parameters()).grad          # one .grad still referenced: the memory stays
    zero(base, True)
    off.sync()
    time.sleep(0.05)
    assert gr.backing.live == 1 and gr.backing.slot.state == "mapped"
    assert torch.isfinite(keep).all()
    del keep
    assert gr.backing.live == 0
    off.runtime.stream_synchronize(None)
    assert wait_state(gr.backing.slot, "reserved") == "reserved"
    # mapped again for the next backward, at the same address
    step(g, x, torch.randn(2, 8, 32))
    assert gr.backing.slot.state == "mapped"
    assert next(base[0].parameters()).grad.data_ptr() >= gr.backing.address


def test_a_grad_of_someone_elses_is_added_into_and_our_memory_goes():
    g, base, ref = build(n=2)
    off = vt.offload_of(g[0])
    mine = [torch.full_like(p, 0.5) for p in base[0].parameters()]
    for p, q, t in zip(base[0].parameters(), ref[0].parameters(), mine):
        p.grad = t                                   # as DDP's bucket views would be
        q.grad = t.clone()
    x = torch.randn(2, 8, 32, requires_grad=True)
    gy = torch.randn(2, 8, 32)
    step(g, x, gy)
    step(ref, x.detach().clone().requires_grad_(), gy)
    assert same(grads(base), grads(ref))
    for p, t in zip(base[0].parameters(), mine):
        assert p.grad is t                           # added into, in place, as AccumulateGrad does
    gr = layer_grads(off)[0]
    assert gr.backing.live == 0                      # ours was added and dropped


def test_gradient_hooks_see_each_backwards_gradient():
    g, base, ref = build(n=2)
    seen, want = [], []
    p0, q0 = next(base[1].parameters()), next(ref[1].parameters())
    p0.register_hook(lambda t: seen.append(t.clone()))
    q0.register_hook(lambda t: want.append(t.clone()))
    for _ in range(2):
        x = torch.randn(2, 8, 32, requires_grad=True)
        gy = torch.randn(2, 8, 32)
        step(g, x, gy)
        step(ref, x.detach().clone().requires_grad_(), gy)
    assert len(seen) == len(want) == 2 and same(seen, want)
    assert same(grads(base), grads(ref))


def test_static_keeps_the_old_contract():
    g, base, ref = build(grads="static")
    off = vt.offload_of(g[0])
    assert all(gr is None for gr in layer_grads(off))
    x = torch.randn(2, 8, 32, requires_grad=True)
    gy = torch.randn(2, 8, 32)
    step(g, x, gy)
    step(ref, x.detach().clone().requires_grad_(), gy)
    assert same(grads(base), grads(ref))


def test_close_leaves_every_grad_intact():
    g, base, ref = build(n=2)
    off = vt.offload_of(g[0])
    x = torch.randn(2, 8, 32, requires_grad=True)
    gy = torch.randn(2, 8, 32)
    step(g, x, gy)
    step(ref, x.detach().clone().requires_grad_(), gy)
    off.close()
    assert same(grads(base), grads(ref))             # copied out of the slots before they went


def test_describe_names_each_layers_gradients():
    g, base, ref = build(n=2)
    off = vt.offload_of(g[0])
    assert "gradients: mapped" in off.describe()


def test_bad_grads_and_map_ahead_are_refused_by_name():
    base = zoo_layers(1)
    for kw, word in ((dict(grads="mappd"), "grads="), (dict(map_ahead=-1), "map_ahead="),
                     (dict(map_ahead="1"), "map_ahead="), (dict(map_ahead=True), "map_ahead=")):
        with pytest.raises(ValueError) as e:
            vt.make_graphed_callables(tuple(base), samples(1), graphs=False, **kw)
        assert word in str(e.value) and "'mapped'" in str(e.value) or "whole number" in str(e.value)



def test_accumulate_with_ours_a_foreign_and_no_grad_in_one_callable():
    """The accumulate path (CUDA graphs only: driven here through the Grads
    hooks the graphed backward calls, on the host backend): some .grad ours
    (the last microbatch's, at the fixed address), one of someone else's (a
    DDP bucket view), one None. Before the accumulate graph, the foreign one
    is copied into the slot beside ours and the missing one zeroed; the graph
    adds this backward's gradient into each in place; after it, every .grad
    is set to None and the sums at the fixed addresses go back to autograd,
    whose AccumulateGrad takes them as .grad."""
    g, base, ref = build(n=2)
    off = vt.offload_of(g[0])
    lay = off.layers[0]
    gr = lay.grads
    step(g, torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32))
    params = list(base[0].parameters())
    assert len(params) >= 3 and all(gr.state(k, p) == "ours" for k, p in enumerate(params))
    bucket = torch.full_like(params[1], 0.25)
    params[1].grad = bucket
    params[2].grad = None
    before = [None if p.grad is None else p.grad.clone() for p in params]
    acc, src, states = gr.before_backward(None, "test", lay)
    assert acc and states[:3] == ["ours", "foreign", "none"] and set(states[3:]) <= {"ours"}
    # the accumulate graph: this backward's gradient added in place at each fixed address
    torch.manual_seed(6)
    new = [torch.randn_like(p) for p in params]
    for k, d in enumerate(new):
        gr.view(src, k).add_(d)
    out = gr.after_backward(acc, src, states)
    assert all(p.grad is None for p in params)
    for k, (o, b, d) in enumerate(zip(out, before, new)):
        assert torch.equal(o, d if b is None else b + d), k
        assert o.data_ptr() == gr.backing.address + gr.views[k][0]
    assert torch.equal(bucket, torch.full_like(bucket, 0.25))    # read, not written


def test_output_gradients_lie_in_a_slot_of_their_own():
    # With graphs, the backward graph reads the gradients of its outputs from
    # static tensors: laid out in the io slot (memory only from the backward
    # to the next use), each aligned, in the order the warm-up gave them,
    # not in the gradients' slot (which a persistent .grad keeps for good);
    # without graphs (outputs=False), none.
    from types import SimpleNamespace
    from vmmrt.torch import grads as G
    from vmmrt.torch.saved import REGION_ALIGN
    g, _, _ = build(n=1, mode="none")
    off = vt.offload_of(g[0])
    m = zoo_layers(1, seed=3)[0]
    params = tuple(m.parameters())
    x = torch.randn(2, 8, 32, requires_grad=True)
    y = m(x)
    outs = (y, y[:, :3].transpose(0, 1))     # a second output, not contiguous
    gos = tuple(torch.empty_like(o) for o in outs)
    wrt = (x,) + params
    mode = place.Mode("cpu")
    with mode:
        res = torch.autograd.grad(outs, wrt, gos)
    runner = SimpleNamespace(params=params, grads_seen=[])
    G.record_backward(runner, mode, wrt, res, gos)
    plain = G.Grads(off, "plain", params, runner.grads_seen)
    both = G.Grads(off, "both", params, runner.grads_seen, outputs=True)
    try:
        assert plain.gouts == [] and plain.gout(None, 0) is None and plain.io is None and plain.io_bytes == 0
        # the argument gradients in the io slot, the output gradients in one
        # of their own (read by the backward alone: they die with it)
        assert len(both.gouts) == 2 and both.outs is not None
        assert (both.io is not None) == any(both.gins)      # (x's here: in no slot, or in the io slot alone)
        lo = 0
        for (off_b, dt, shape, stride), go in zip(both.gouts, gos):
            assert off_b >= lo and off_b % REGION_ALIGN == 0
            assert (dt, shape, stride) == (go.dtype, tuple(go.shape), tuple(go.stride()))
            lo = off_b + G.storage_nbytes(dt, shape, stride)
        assert both.outs.nbytes == lo and both.io_bytes == (both.io.nbytes if both.io else 0) + lo
        assert both.backing.nbytes == plain.backing.nbytes      # the parameters' gradients alone
        assert plain.outs is None and plain.outs_base() is None
        t = both.outs_base()
        v = both.gout(t, 1)
        assert v.shape == gos[1].shape and v.stride() == gos[1].stride()
        assert v.data_ptr() == both.outs.address + both.gouts[1][0]
        del t, v
    finally:
        for gr in (plain, both):
            gr.drop()
        off.close()


def test_storage_nbytes_spans_the_layout():
    from vmmrt.torch.grads import storage_nbytes
    assert storage_nbytes(torch.float32, (2, 3), (3, 1)) == 24
    assert storage_nbytes(torch.bfloat16, (3, 2), (1, 3)) == 12       # a transpose spans the same
    assert storage_nbytes(torch.float32, (4,), (2,)) == 28            # strided: to the last element
    assert storage_nbytes(torch.float32, (0, 5), (5, 1)) == 0
