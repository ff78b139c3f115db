# SPDX-License-Identifier: LGPL-2.1-or-later
"""torch.compile'd layers (vmmrt.torch._compiled): their forward runs with no
saved-tensor hooks and no dispatch mode, so that Dynamo runs the compiled
code, and their saved tensors are handed to the offload after it, from the
autograd nodes the forward made. Gradients are then bitwise those of the
compiled layers run alone, and the saved bytes still move."""
import pytest
import torch

import vmmrt.torch as vt
from vmmrt.torch import _compiled

from conftest import grads, same, step, zoo_layers

HAS_COMPILE = _compiled.OptimizedModule is not None


def _round_trips(g, ref, base, iters=3, shape=(2, 8, 32)):
    torch.manual_seed(1)
    for it in range(iters):
        x = torch.randn(*shape, requires_grad=True)
        gy = torch.randn(*shape)
        xr = x.detach().clone().requires_grad_()
        y = step(g, x, gy)
        yr = step(ref, xr, gy)
        assert torch.equal(y, yr), "iteration %d: outputs differ" % it
        assert torch.equal(x.grad, xr.grad), "iteration %d: input gradients differ" % it
        assert same(grads(base), grads(ref)), "iteration %d: parameter gradients differ" % it
        for m in list(base) + list(ref):
            m.zero_grad(set_to_none=True)


@pytest.mark.parametrize("mode", ["pingpong", "remap"])
def test_saved_tensors_reached_after_the_forward_move_bitwise(pair, monkeypatch, mode):
    """The route of compiled layers on plain ones (any torch): every saved
    tensor found from the nodes, offloaded, restored, gradients bitwise."""
    monkeypatch.setattr(_compiled, "is_compiled", lambda fn: True)
    g, ref, base = pair(n=3, mode=mode)
    off = vt.offload_of(g[0])
    assert all(lay.compiled for lay in off.layers)
    _round_trips(g, ref, base)
    off.sync()
    s = off.stats()
    assert s["bytes_offloaded"] > 0 and s["bytes_offloaded"] == s["bytes_restored"]
    # nothing is born in a slot: the layer's ops were not watched
    assert off.placement()["placed"] == 0
    assert _compiled.UNSEEN in off.describe()


def test_walk_stops_at_the_inputs_nodes():
    """A forward's saved tensors, not those of what made its input."""
    a = torch.randn(4, 4, requires_grad=True)
    x = (a * 2).sin()                  # MulBackward's and SinBackward's saved tensors: not this forward's
    w = torch.randn(4, 4, requires_grad=True)
    y = (x @ w).exp()                  # MmBackward saves x and w, ExpBackward its result
    mine = _compiled.saved_tensors([y], [x])
    every = _compiled.saved_tensors([y])
    assert len(mine) == 3
    assert len(every) > len(mine) and every[:3] == mine


def _compiled_or_skip(layers):
    if not HAS_COMPILE:
        pytest.skip("torch %s has no torch.compile" % torch.__version__)
    compiled = [torch.compile(m) for m in layers]
    try:
        x = torch.randn(2, 8, 32, requires_grad=True)
        step(compiled, x, torch.ones(2, 8, 32))
    except Exception as e:  # no C++ compiler for inductor, an unsupported platform
        pytest.skip("torch.compile does not run here: %s" % str(e).splitlines()[0][:200])
    for m in layers:
        m.zero_grad(set_to_none=True)
    return compiled


@pytest.mark.parametrize("mode", ["pingpong", "none"])
def test_compiled_layers_are_bitwise_the_compiled_code(mode):
    """vmmrt.torch over torch.compile'd layers computes what they compute
    alone: their compiled kernels, not their Python op by op."""
    import copy
    base = zoo_layers(3)
    ref = copy.deepcopy(base)
    plain = copy.deepcopy(base)
    compiled_ref = _compiled_or_skip(ref)
    # what the layers compute uncompiled: if it is the compiled result too, the
    # comparison below could not tell the two apart
    x = torch.randn(2, 8, 32)
    if torch.equal(compiled_ref[0](x), plain[0](x)):
        pytest.skip("the compiled layer computes bitwise what the plain one does: nothing to tell apart")
    compiled = [torch.compile(m) for m in base]
    kw = {"options": {"host_granularity": 4096}} if mode == "none" else {}
    g = vt.make_graphed_callables(tuple(compiled), tuple((torch.randn(2, 8, 32, requires_grad=True),)
                                                         for _ in compiled),
                                  graphs=False, mode=mode, min_bytes=0, **kw)
    off = vt.offload_of(g[0])
    assert all(lay.compiled for lay in off.layers)
    _round_trips(g, compiled_ref, base)
    off.close()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["none", "pingpong"])
def test_graphed_compiled_layers_are_bitwise_torchs_graphs(mode):
    """On CUDA: vmmrt's graphs of compiled layers against
    torch.cuda.make_graphed_callables of the same compiled layers."""
    import copy
    from vmmrt.torch.bench import llama
    shape = llama.Shape(hidden=256, ffn=704, heads=4, kv_heads=2, seq=256)
    dev = torch.device("cuda")
    base = llama.torch_layers(2, shape, dev, torch.bfloat16, "math")
    ref = copy.deepcopy(base)
    if not HAS_COMPILE:
        pytest.skip("torch %s has no torch.compile" % torch.__version__)
    dims = (1, shape.seq, shape.hidden)

    def samples():
        return tuple((torch.randn(*dims, device=dev, dtype=torch.bfloat16, requires_grad=True),) for _ in base)
    with llama.attention_backend("math"):
        tg = torch.cuda.make_graphed_callables(tuple(torch.compile(m) for m in ref), samples())
        g = vt.make_graphed_callables(tuple(torch.compile(m) for m in base), samples(), mode=mode)
        torch.manual_seed(3)
        for it in range(3):
            x = torch.randn(*dims, device=dev, dtype=torch.bfloat16, requires_grad=True)
            gy = torch.randn(*dims, device=dev, dtype=torch.bfloat16)
            xr = x.detach().clone().requires_grad_()
            y = step(g, x, gy)
            yr = step(tg, xr, gy)
            torch.cuda.synchronize()
            assert torch.equal(y, yr), "iteration %d" % it
            assert torch.equal(x.grad, xr.grad), "iteration %d" % it
            assert same(grads(base), grads(ref)), "iteration %d" % it
            for m in base + ref:
                m.zero_grad(set_to_none=True)
    vt.offload_of(g[0]).close()
