# SPDX-License-Identifier: LGPL-2.1-or-later
"""Bad input: each a clear error naming the layer and the cause; the process
keeps running and no gradient is silently wrong."""
import copy

import pytest
import torch

import vmmrt
import vmmrt.torch as vt

from conftest import grads, same, samples, step, zoo_layers


def test_shape_change_between_calls_is_named_and_harmless(pair):
    g, ref, base = pair(n=2)
    with pytest.raises(vmmrt.Error) as e:
        step(g, torch.randn(2, 9, 32, requires_grad=True), torch.ones(2, 9, 32))
    msg = str(e.value)
    assert e.value.name == "VMMRT_E_MISMATCH"
    assert "layer '0:Zoo'" in msg and "[2, 9, 32]" in msg and "[2, 8, 32]" in msg
    x = torch.randn(2, 8, 32, requires_grad=True)  # refused before anything ran: training goes on
    step(g, x, torch.ones(2, 8, 32))
    step(ref, x.detach().clone().requires_grad_(), torch.ones(2, 8, 32))
    assert same(grads(base), grads(ref))


class Moody(torch.nn.Module):
    """Saves a transposed view or the tensor itself depending on a flag: the same
    bytes, another view, which only the Python signature can tell apart."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.flip = False

    def forward(self, x):
        h = self.lin(x)
        t = h.t() if self.flip else h
        return x + (t.exp() if not self.flip else t.exp().t())


def test_saved_tensors_that_drift_from_discovery_are_refused():
    m = Moody()
    ref = copy.deepcopy(m)
    g = vt.make_graphed_callables(m, (torch.randn(16, 16, requires_grad=True),), graphs=False, min_bytes=0)
    x = torch.randn(16, 16, requires_grad=True)
    g(x).sum().backward()
    m.flip = True
    with pytest.raises(vmmrt.Error) as e:
        g(torch.randn(16, 16, requires_grad=True))
    assert e.value.name == "VMMRT_E_MISMATCH"
    assert "layer '0:Moody'" in str(e.value) and "where discovery saw" in str(e.value)
    m.flip = False                                  # eagerly, the iteration was abandoned: the next one runs
    for p in m.parameters():
        p.grad = None
    x = torch.randn(16, 16, requires_grad=True)
    g(x).sum().backward()
    ref(x.detach().clone().requires_grad_()).sum().backward()
    assert same([p.grad for p in m.parameters()], [p.grad for p in ref.parameters()])
    assert vt.offload_of(g).stats()["aborts"] == 1


def test_a_layer_that_fails_is_named_with_its_cause():
    class Boom(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.armed = False

        def forward(self, x):
            if self.armed:
                raise RuntimeError("operation not permitted when stream is capturing")
            return self.lin(x).tanh()

    b = Boom()
    g = vt.make_graphed_callables(b, (torch.randn(4, 8, requires_grad=True),), graphs=False, min_bytes=0,
                                  names=["boom"])
    b.armed = True
    with pytest.raises(RuntimeError, match="not permitted"):
        g(torch.randn(4, 8, requires_grad=True))
    b.armed = False                                 # the iteration was abandoned, the offload stays usable
    g(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert vt.offload_of(g).stats()["aborts"] == 1


def test_option_typos():
    layers = zoo_layers(1)
    with pytest.raises(TypeError, match="lookahead"):
        vt.make_graphed_callables(tuple(layers), samples(1), graphs=False, lookahed=2)
    with pytest.raises(ValueError, match="pingpong"):
        vt.make_graphed_callables(tuple(layers), samples(1), graphs=False, mode="pingpog")
    with pytest.raises(ValueError, match="fraction"):
        vt.make_graphed_callables(tuple(layers), samples(1), graphs=False, offload=1.5)
    with pytest.raises(vmmrt.Error) as e:
        vt.make_graphed_callables(tuple(layers), samples(1), graphs=False, options={"driver_worker": 2})
    assert e.value.name == "VMMRT_E_INVALID_OPTION" and "driver_worker" in str(e.value)
    with pytest.raises(vmmrt.Error) as e:
        vt.make_graphed_callables(tuple(layers), samples(1), graphs=False, options={"timeout_ms": 0})
    assert e.value.name == "VMMRT_E_INVALID_OPTION" and "timeout_ms" in str(e.value)


def test_graphs_need_cuda_tensors():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the graph path is tested in test_gpu.py")
    with pytest.raises(ValueError, match="graphs=False"):
        vt.make_graphed_callables(tuple(zoo_layers(1)), samples(1))


def test_modules_with_hooks_are_refused_as_torch_does():
    m = zoo_layers(1)[0]
    m.register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match="hooks"):
        vt.make_graphed_callables(m, samples(1)[0], graphs=False)


def test_backward_twice_is_refused(pair):
    g, ref, base = pair(n=1)
    x = torch.randn(2, 8, 32, requires_grad=True)
    y = g[0](x)
    y.sum().backward(retain_graph=True)
    with pytest.raises(Exception) as e:
        y.sum().backward()
    assert "layer '0:Zoo'" in str(e.value) or "twice" in str(e.value)


def test_a_saved_tensor_used_outside_its_backward_is_refused():
    """A view at a fixed address read after the layer's backward let go of it
    would read whatever the bank holds next: refused."""
    m = copy.deepcopy(zoo_layers(1)[0])
    g = vt.make_graphed_callables(m, samples(1)[0], graphs=False, min_bytes=0)
    off = vt.offload_of(g)
    lay = off.layers[0]
    x = torch.randn(2, 8, 32, requires_grad=True)
    y = g(x)
    y.sum().backward()
    with pytest.raises(vmmrt.Error) as e:
        lay.last_rec.rebuild(next(i for i, en in enumerate(lay.plan.entries) if en.kind == "view"))
    assert e.value.name == "VMMRT_E_INVALID_STATE" and "outside the layer's backward" in str(e.value)
