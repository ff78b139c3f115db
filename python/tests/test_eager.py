# SPDX-License-Identifier: LGPL-2.1-or-later
"""Eager offload through the groups on the host backend: every saved tensor
goes to its fixed address, to pinned host memory and back, and gradients are
bitwise those of the same layers without offload."""
import pytest
import torch

import vmmrt.torch as vt

from conftest import grads, run, same, step


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
@pytest.mark.parametrize("lookahead", [1, 2])
def test_round_trip_is_bitwise(pair, mode, lookahead):
    g, ref, base = pair(n=4, mode=mode, lookahead=lookahead)
    off = vt.offload_of(g[0])
    assert off.mode == mode and off.lookahead == lookahead
    torch.manual_seed(1)
    for it in range(3):
        x = torch.randn(2, 8, 32, requires_grad=True)
        gy = torch.randn(2, 8, 32)
        xr = x.detach().clone().requires_grad_()
        y = step(g, x, gy)
        yr = step(ref, xr, gy)
        assert torch.equal(y, yr)
        assert torch.equal(x.grad, xr.grad)
        assert same(grads(base), grads(ref)), "iteration %d" % it
        for m in base + ref:
            m.zero_grad(set_to_none=True)
    off.sync()
    s = off.stats()
    if mode != "none":
        assert s["iterations"] == 3 and s["schedule_recorded"] == 1
        assert s["bytes_offloaded"] > 0 and s["bytes_restored"] > 0
    else:
        # nothing moves: what the layers save is born in their resident slots
        assert s["bytes_offloaded"] == 0 and off.placement()["resident"] > 0


def test_gradients_accumulate_over_microbatches(pair):
    g, ref, base = pair(n=3)
    torch.manual_seed(2)
    for _ in range(3):                         # three microbatches, no zero_grad in between
        x = torch.randn(2, 8, 32, requires_grad=True)
        gy = torch.randn(2, 8, 32)
        step(g, x, gy)
        step(ref, x, gy)
    assert same(grads(base), grads(ref))


def test_bytes_moved_are_the_distinct_bytes(pair):
    g, ref, base = pair(n=3, mode="pingpong")
    off = vt.offload_of(g[0])
    b = off.saved_bytes()
    assert b["views"] > b["distinct"] >= b["moved"] > 0
    x = torch.randn(2, 8, 32, requires_grad=True)
    step(g, x, torch.ones(2, 8, 32))
    off.sync()
    s = off.stats()
    assert s["bytes_offloaded"] == sum(off.group_bytes())  # the first iteration copies every group once
    assert sum(off.group_bytes()) < b["views"]


def test_a_fraction_moves_part_of_each_layer(pair):
    g, ref, base = pair(n=3, offload=0.3)
    off = vt.offload_of(g[0])
    for lay in off.layers:
        sb = lay.saved_bytes()
        cand = sum(r.nbytes for r in lay.regions if r.reason in (None, "budget"))
        assert 0 < sb["moved"] <= 0.3 * cand
    x = torch.randn(2, 8, 32, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    gy = torch.randn(2, 8, 32)
    assert torch.equal(step(g, x, gy), step(ref, xr, gy))
    assert same(grads(base), grads(ref))


def test_nothing_moves_with_offload_zero(pair):
    g, ref, base = pair(n=2, offload=0.0)
    off = vt.offload_of(g[0])
    assert off.saved_bytes()["moved"] == 0
    x = torch.randn(2, 8, 32, requires_grad=True)
    step(g, x, torch.ones(2, 8, 32))
    step(ref, x, torch.ones(2, 8, 32))
    assert same(grads(base), grads(ref))


def test_the_planner_chooses_and_says_so(pair):
    g, ref, base = pair(n=3, offload="auto")
    off = vt.offload_of(g[0])
    assert off.plan is not None and len(off.plan.layers) == 3
    assert "offload plan" in off.plan.summary()
    x = torch.randn(2, 8, 32, requires_grad=True)
    step(g, x, torch.ones(2, 8, 32))
    step(ref, x, torch.ones(2, 8, 32))
    assert same(grads(base), grads(ref))


def test_no_grad_and_eval_run_the_layer_itself(pair):
    g, ref, base = pair(n=2)
    x = torch.randn(2, 8, 32, requires_grad=True)
    with torch.no_grad():
        assert torch.equal(run(g, x), run(ref, x))
    for m in g:
        m.eval()
    assert torch.equal(run(g, x), run(ref, x))  # eval: the module's own forward, no offload
    for m in g:
        m.train()
    step(g, x, torch.ones(2, 8, 32))             # and training goes on
    step(ref, x, torch.ones(2, 8, 32))
    assert same(grads(base), grads(ref))


def test_functions_as_well_as_modules():
    w = torch.randn(16, 16, requires_grad=True)

    def f(x):
        return torch.tanh(x @ w) * x

    gf = vt.make_graphed_callables(f, (torch.randn(4, 16, requires_grad=True),), graphs=False, min_bytes=0)
    x = torch.randn(4, 16, requires_grad=True)
    y = gf(x)
    y.sum().backward()
    assert w.grad is None                        # like torch's: a function's closure is not an input
    xr = x.detach().clone().requires_grad_()
    f(xr).sum().backward()
    assert torch.equal(x.grad, xr.grad)


@pytest.mark.parametrize("mode,lookahead,staying", [("pingpong", 1, 2), ("remap", 1, 1), ("remap", 3, 2)])
def test_describe_and_stats_tell_the_same_story(pair, mode, lookahead, staying):
    """What describe() says moves is what stats() counts: every offloaded
    region in the first iteration (which records the order), then all but
    the layers libvmmrt keeps on the device, whose backward comes within the
    look-ahead of their forward (the last one; at look-ahead 3, the last two
    of four), and in ping-pong the one whose bank no other takes between its
    forward and its backward (the one before the last)."""
    g, ref, base = pair(n=4, mode=mode, lookahead=lookahead)
    off = vt.offload_of(g[0])
    stay = off.staying()
    assert [l.name for l in stay] == [l.name for l in off.layers[-staying:]]
    b = off.saved_bytes()
    stayed = sum(l.saved_bytes()["moved"] for l in stay)
    # what libvmmrt copies of a group: its regions and the alignment between them
    groups = [l.group.nbytes for l in off.layers]
    assert sum(groups) >= b["moved"] > stayed > 0
    assert b["copied"] == sum(groups[:-staying])
    n = 4
    for it in range(n):
        step(g, torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32))
        for m in base:
            m.zero_grad(set_to_none=True)
    off.sync()
    st = off.stats()
    assert st["iterations"] == n
    # the library's answer, once it has the order (vmmrt_group_stays), is what was predicted before it
    assert [l.name for l in off.staying()] == [l.name for l in stay]
    assert st["bytes_offloaded"] == sum(groups) + (n - 1) * b["copied"]
    assert st["last_d2h_bytes"] == b["copied"]
    text = off.describe()
    mib = float(1 << 20)
    assert "%.1f MiB offloaded (%.1f MiB copied to the host and back per iteration" % (
        b["moved"] / mib, b["copied"] / mib) in text, text
    assert all(repr(l.name) in text for l in stay), text


@pytest.mark.parametrize("view", ["head", "tail", "transposed"])
def test_an_input_over_a_larger_storage_is_taken_like_any_other(pair, view):
    """big[:2] has the sample's offset and strides over a larger storage,
    big[1:] another offset: each goes in as a copy in the sample's layout
    (what the saved tensors were discovered over), gradients as eager's."""
    g, ref, base = pair(n=2)
    torch.manual_seed(5)
    for it in range(2):
        big = torch.randn(5, 8, 32)
        x = {"head": lambda: big[:2], "tail": lambda: big[3:],
             "transposed": lambda: big[:2].transpose(0, 1).contiguous().transpose(0, 1)}[view]()
        x = x.detach().requires_grad_()
        xr = x.detach().clone().requires_grad_()
        gy = torch.randn(2, 8, 32)
        assert torch.equal(step(g, x, gy), step(ref, xr, gy))
        assert torch.equal(x.grad, xr.grad) and same(grads(base), grads(ref))
        for m in base + ref:
            m.zero_grad(set_to_none=True)
