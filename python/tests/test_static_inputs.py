# SPDX-License-Identifier: LGPL-2.1-or-later
"""The graphs' static inputs in the layer's resident slot
(vmmrt.torch.static_inputs): held from the layer's forward to its backward,
as eager holds a layer's input, not for the graphs' life; the caller's
sample tensors not held at all once built. Run on the host backend over
graphs that capture nothing (test_call_path's harness): where the bytes
are, who holds the samples, and that a call copies its argument in once
the slot is mapped (on the host backend a copy into the slot before its
map writes over PROT_NONE memory)."""
import gc
import weakref

import pytest
import torch

from conftest import samples
from test_call_path import N, _graphed_on_host, host_graphs  # noqa: F401 - a fixture
from vmmrt.torch import graphed, place, static_inputs


def _build(sample, mode="none"):
    return _graphed_on_host(mode, "static", sample=sample, inputs=True)


def _inside(t, backing):
    return backing.address <= t.data_ptr() < backing.address + backing.nbytes


@pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")
def test_the_static_inputs_lie_in_the_resident_slot_and_the_samples_are_let_go(host_graphs):  # noqa: F811
    sample = samples(N)
    refs = [weakref.ref(s[0]) for s in sample]
    g, off, runners = _build(sample)
    try:
        del sample
        gc.collect()
        assert [r() for r in refs] == [None] * N, "the build holds the caller's sample tensors"
        for r in runners:
            lay = r.layer
            assert lay.resident is not None and lay.input_at is not None
            x = r.sample[0]
            assert _inside(x, lay.resident) and x.requires_grad and x.shape == (2, 8, 32)
            # past every saved region in the slot, and a static storage of the layer's
            assert lay.input_at[0] >= max((rg.resident + rg.nbytes for rg in lay.kept_resident()), default=0)
            assert x.data_ptr() in lay.static
            assert not any(a is not x and isinstance(a, torch.Tensor) for a in r.sample_args)
        assert "static inputs" in off.describe()
        # the ops given a moved input matched discovery's (its signature
        # token kept): what they save was born in the slot, not in the pool
        p = off.placement()
        assert p["pool"] == 0 and p["resident"] > 0, p["why"]
        for _ in range(3):
            x = torch.randn(2, 8, 32, requires_grad=True)
            y = g[0](x)
            # the call copied its argument in (after the slot's map: the host
            # backend's unmapped memory is PROT_NONE), where the graph reads it
            assert torch.equal(runners[0].sample[0].detach(), x.detach())
            for m in g[1:]:
                y = m(y)
            y.sum().backward()
            for m in g:
                m.zero_grad(set_to_none=True)
    finally:
        graphed._close(off, runners)


def test_only_dense_samples_of_their_own_storage_move():
    a = torch.randn(4, 8)
    base = torch.randn(16, 8)
    b, c = base[:8], base[8:]
    t = torch.randn(8, 4).t()
    assert static_inputs.sizes((a, b, c, t, torch.empty(0))) == (128, None, None, None, None)


@pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")
def test_a_recomputed_layers_inputs_are_its_slot_alone_from_its_forward_to_its_backward(host_graphs,  # noqa: F811
                                                                                        monkeypatch):
    """A recomputed layer saves nothing, but its backward graph runs the
    forward again from its static inputs: they lie in a resident slot of
    their own, mapped from its forward to its backward, not held by the
    graphs between steps (where the optimizer step's temporaries go)."""
    from test_recompute_graphs import without_cuda_rng
    from vmmrt.torch.budget import Budget
    without_cuda_rng(monkeypatch)
    from test_call_path import OPTIONS, zoo_layers
    layers = zoo_layers(N)
    _, runners, marks, uses, device = graphed._prepare_runners(tuple(layers), samples(N), None, None, None,
                                                               [], False, False, 1.0, None)
    off, mode = graphed._open_offload(runners, uses, device, "none", 1, OPTIONS, 0, 1, True)
    try:
        stream = graphed._warmup(runners, uses, off, 3, False)
        plan = Budget(layers=["recompute", "keep"] * (N // 2))
        off = graphed._allocate(runners, uses, off, None, "static", mode, 1.0, plan, marks, 0.9, True,
                                memory_plan=True)
        captured = graphed._capture_all(runners, off, stream, None, "global", False, "static", uses)
        g = graphed._finish(runners, graphed._calls(runners, off, captured), off, False)
        held = {}
        for r in runners[::2]:
            lay = r.layer
            assert r.recompute and lay.resident is not None, "a recomputed layer's inputs have no slot"
            assert not lay.kept_resident() and lay.input_at == (0,)
            assert _inside(r.sample[0], lay.resident)
        for _ in range(2):
            x = torch.randn(2, 8, 32, requires_grad=True)
            y = x
            for m in g:
                y = m(y)
                held[len(held)] = runners[0].layer.resident.mapped
            y.sum().backward()
            del y
            assert not runners[0].layer.resident.mapped, "the recomputed layer's inputs outlive its backward"
        # mapped from its forward on, through the other layers' forwards
        assert all(held.values()), held
    finally:
        graphed._close(off, runners)


@pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")
@pytest.mark.parametrize("raw", [False, True])
def test_in_pingpong_a_fully_offloaded_layers_inputs_move_with_its_bank(host_graphs, monkeypatch, raw):  # noqa: F811
    """Ping-pong moving everything a layer saves leaves it no resident slot:
    its static inputs are its group's (LayerOffload.inputs_move), at a fixed
    address in a bank, to the host after its forward and back before its
    backward with its saved regions, where the graphs held them all along.
    A call copies its argument in after the forward's begin hook: through
    the hooks and torch's copy, or (``raw``) in the library's one call,
    vmmrt_group_replay_copies. Each layer's static input holds the argument
    it was given after its call, and the first two layers' (the last to
    have their banks restored) again after the step: their bytes went to
    the host and came back."""
    if raw:
        from test_call_path import _raw_on_host
        _raw_on_host(monkeypatch)
    g, off, runners = _graphed_on_host("pingpong", "static", inputs=True)
    try:
        for r in runners:
            lay = r.layer
            ptr = r.sample[0].data_ptr()
            assert lay.inputs_move() and lay.resident is None and lay.input_at is None
            assert lay.input_addrs == (ptr,)
            assert lay.group.address <= ptr < lay.group.address + lay.group.nbytes
        assert "static inputs of %d layers" % N in off.describe()
        for step in range(3):
            x = torch.randn(2, 8, 32, requires_grad=True)
            args, y = [], x
            for k, m in enumerate(g):
                args.append(y.detach().clone())
                y = m(y)
                off.runtime.stream_synchronize(None)
                assert torch.equal(runners[k].sample[0].detach(), args[k]), (step, k)
            gy = 2 * y.detach()
            runners[-1].static_grad_outputs[0].zero_()      # (the graphs here replay nothing: y is the same)
            (y * y).sum().backward()        # a contiguous output gradient (a sum's alone is expanded)
            del y
            off.runtime.stream_synchronize(None)
            for k in (0, 1):
                assert torch.equal(runners[k].sample[0].detach(), args[k]), (step, k)
            # the last backward's output gradient copied in (by the one call); the others' are the
            # static input gradients of the layer after (static_grads.Aliases: nothing to copy)
            assert torch.equal(runners[-1].static_grad_outputs[0], gy), step
            for m in g:
                m.zero_grad(set_to_none=True)
        hows = set(off.stats()["graph_launches"])
        assert hows == ({"vmmrt_group_replay"} if raw else {"torch replay (host backend)"}), hows
        # every layer's inputs went to the host with its regions, but those of the last two, which stay
        # in their banks (the tail's is the other one)
        moved = sum(d.bytes for r in runners[:-2] for d in r.layer.input_descs)
        assert off.stats()["bytes_offloaded"] >= 3 * moved > 0
    finally:
        graphed._close(off, runners)
