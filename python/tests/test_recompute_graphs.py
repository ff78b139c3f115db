# SPDX-License-Identifier: LGPL-2.1-or-later
"""A recomputed layer's graphs, on the host backend's graphs (which capture
nothing and run each capture's body once): where torch's checkpoint takes
the graphs' route (vmmrt.torch.recompute.CHECKPOINTED), the forward is
captured under it and the backward as any layer's, so the recomputation
inside the backward's capture stops once the tensors the backward reads are
back; its gradients' statics lie in its slot and its outputs in theirs, as
any layer's."""
import contextlib

import pytest
import torch

from test_call_path import OPTIONS, _stepper, host_graphs  # noqa: F401 - a fixture
from vmmrt.torch import graphed, recompute
from vmmrt.torch.budget import Budget

N = 4


class Tail(torch.nn.Module):
    """The linear saves its input and weight; nothing after it saves: the
    Python after it runs in the forward and, without early stop, again in
    the backward's recomputation (``tails``)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32, bias=False)
        self.tails = 0

    def forward(self, x):
        h = self.lin(x)
        self.tails += 1
        return h * 2 + x


class NoRng:        # the host backend has no CUDA generators to clone
    gens, fwd, bwd, available = [], None, None, False

    def __init__(self, *a):
        pass

    def using(self, states):
        return contextlib.nullcontext()


def without_cuda_rng(monkeypatch):
    """Recomputed layers on the host backend: no generator states to clone,
    and no forward that draws random numbers."""
    monkeypatch.setattr(recompute, "_GraphRng", NoRng)
    monkeypatch.setattr(recompute, "draws_random", lambda r: False)


def _captured(grads, layers, mode="none"):
    sample = tuple((torch.randn(2, 8, 32, requires_grad=True),) for _ in layers)
    _, runners, marks, uses, device = graphed._prepare_runners(tuple(layers), sample, None, None, None,
                                                               [], False, False, 1.0, None)
    off, mode = graphed._open_offload(runners, uses, device, mode, 1, OPTIONS, 0, 1, True)
    try:
        stream = graphed._warmup(runners, uses, off, 3, False)
        off = graphed._allocate(runners, uses, off, None, grads, mode, 1.0, Budget(layers=["recompute"] * N),
                                marks, 0.9, True, memory_plan=True)
        before = [m.tails for m in layers]
        captured = graphed._capture_all(runners, off, stream, None, "global", False, grads, uses)
    except BaseException:
        graphed._close(off, runners)
        raise
    return off, runners, captured, [m.tails - b for m, b in zip(layers, before)]


@pytest.mark.parametrize("grads", ["static", "mapped"])
@pytest.mark.skipif(not recompute.CHECKPOINTED, reason="this torch's checkpoint has no context_fn")
def test_the_backwards_recomputation_stops_once_what_it_reads_is_back(host_graphs, monkeypatch,  # noqa: F811
                                                                      grads):
    without_cuda_rng(monkeypatch)
    layers = [Tail() for _ in range(N)]
    off, runners, captured, tails = _captured(grads, layers)
    try:
        assert all(r.recompute for r in runners)
        # the forward's capture ran the layer once; the backward's
        # recomputation stopped after the linear
        assert tails == [1] * N, tails
        for r in runners:
            assert r.static_grad_inputs[0] is not None and r.static_grad_inputs[0].shape == (2, 8, 32)
            # its output born in its outputs' slot, not the graphs' pool for good
            outs = r.layer.outputs
            assert outs is not None and outs.landed == 1, r.name
            assert r.static_outputs[0].data_ptr() == outs.backing.address
        if grads == "mapped":
            # its gradients and its input's placed at their addresses, in
            # its slot, as any layer's
            assert [r.grad_mode for r in runners] == ["mapped"] * N
            assert all(r.gin_where is not None and r.gin_where[0] is not None for r in runners), \
                [r.gin_where for r in runners]
            assert all(r.grads.io_bytes > 0 for r in runners), "a recomputed layer's statics not in its slot"
    finally:
        graphed._close(off, runners)


def test_without_the_route_the_backward_runs_the_whole_forward_again(host_graphs, monkeypatch):  # noqa: F811
    without_cuda_rng(monkeypatch)
    monkeypatch.setattr(recompute, "CHECKPOINTED", False)
    layers = [Tail() for _ in range(N)]
    off, runners, captured, tails = _captured("static", layers)
    try:
        assert tails == [2] * N, tails
    finally:
        graphed._close(off, runners)


@pytest.mark.parametrize("mode", ["pingpong", "none"])
def test_in_pingpong_a_recomputed_layers_checkpoint_moves_with_the_bank(host_graphs, monkeypatch, mode):  # noqa: F811
    # A recomputed layer keeps only its checkpoint, its graphs' static
    # inputs: in ping-pong they are its group's, at a fixed address in a
    # bank, copied to the host after its forward and back before its
    # backward as an offloaded layer's regions are; in mode none (nothing
    # moves) a resident slot holds them from its forward to its backward.
    without_cuda_rng(monkeypatch)
    layers = [Tail() for _ in range(N)]
    off, runners, captured, _ = _captured("mapped", layers, mode)
    try:
        for r in runners:
            lay = r.layer
            ptr = r.sample[0].data_ptr()
            if mode == "pingpong":
                assert lay.inputs_move() and lay.in_group() and lay.resident is None and lay.input_at is None
                assert lay.input_addrs == (ptr,)
                assert lay.group.address <= ptr < lay.group.address + lay.group.nbytes
                assert lay.group.nbytes >= 2 * 8 * 32 * 4
            else:
                assert not lay.inputs_move() and lay.input_addrs is None and lay.resident is not None
                assert lay.resident.address <= ptr < lay.resident.address + lay.resident.nbytes
        funcs = graphed._calls(runners, off, captured)
        g = graphed._finish(runners, funcs, off, False)
        step = _stepper(g)
        for _ in range(3):
            step()
        st = off.stats()
        if mode == "pingpong":
            # every layer's checkpoint but the tail's went to the host and came back, each step
            assert st["bytes_offloaded"] > 0 and off.saved_bytes()["copied"] > 0, st
        else:
            assert st["bytes_offloaded"] == 0
    finally:
        graphed._close(off, runners)
