# SPDX-License-Identifier: LGPL-2.1-or-later
"""On a GPU (python/tests/gpu_run.sh): a graphed call that launches its
graphs through the library (vmmrt_group_replay, vmmrt.torch._launch) gives
bitwise the gradients torch's replay gives, and a graph that draws random
numbers keeps torch's replay (a raw launch would repeat them)."""
import pytest
import torch
import vmmrt.torch as vt
from vmmrt.torch import _launch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or not hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"):
    pytest.skip("needs CUDA and torch.cuda.CUDAGraph.raw_cuda_graph_exec", allow_module_level=True)

N, B, D = 3, 512, 1024


def _layers(dropout=0.0):
    torch.manual_seed(0)
    mid = (lambda: torch.nn.Dropout(dropout)) if dropout else torch.nn.Identity
    return [torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(), mid(),
                                torch.nn.Linear(4 * D, D)).cuda() for _ in range(N)]


def _run(monkeypatch, raw, dropout=0.0, steps=3):
    """The gradients of `steps` steps (x's and the parameters'), the
    offload's graph_launches and the last two steps' outputs."""
    if not raw:
        init = _launch.Launcher.__init__

        def replay(self, graph, off, generators, recomputed=False):
            init(self, graph, off, generators, recomputed)
            self.exec, self.how = 0, "torch replay (forced by the test)"
        monkeypatch.setattr(_launch.Launcher, "__init__", replay)
    layers = _layers(dropout)
    samples = tuple((torch.randn(B, D, device="cuda", requires_grad=True),) for _ in layers)
    g = vt.make_graphed_callables(tuple(layers), samples, mode="pingpong", grads="static", lookahead=1)
    off = vt.offload_of(g[0])
    try:
        assert not off.maps_per_use(), "these layers map nothing per use (host backend, graphs=False: no backing)"
        torch.manual_seed(1)
        x = torch.randn(B, D, device="cuda", requires_grad=True)
        gy = torch.randn(B, D, device="cuda")
        grads, outs = [], []
        for _ in range(steps):
            y = x
            for m in g:
                y = m(y)
            y.backward(gy)
            outs.append(y.detach().clone())
            grads.append([x.grad.clone()] + [p.grad.clone() for m in g for p in m.parameters()])
            x.grad = None
            for m in g:
                for p in m.parameters():
                    p.grad = None
        torch.cuda.synchronize()
        return grads, off.stats()["graph_launches"], outs
    finally:
        off.close()
        monkeypatch.undo()


def test_raw_launch_gives_the_gradients_of_torchs_replay(monkeypatch):
    raw, hows, _ = _run(monkeypatch, True)
    assert "vmmrt_group_replay" in hows, hows
    ref, ref_hows, _ = _run(monkeypatch, False)
    assert "vmmrt_group_replay" not in ref_hows, ref_hows
    for step, (a, b) in enumerate(zip(raw, ref)):
        for i, (ga, gb) in enumerate(zip(a, b)):
            assert torch.equal(ga, gb), "step %d, gradient %d" % (step, i)


def test_a_graph_with_dropout_keeps_torchs_replay(monkeypatch):
    _, hows, outs = _run(monkeypatch, True, dropout=0.5)
    # every forward draws (dropout); the backward graphs use the saved masks
    assert hows.get("torch replay (the graph draws random numbers)", 0) >= N, hows
    assert not torch.equal(outs[-1], outs[-2]), "dropout drew the same numbers at two steps"
