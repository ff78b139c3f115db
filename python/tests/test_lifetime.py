# SPDX-License-Identifier: LGPL-2.1-or-later
"""The memory under every tensor vmmrt.torch hands out (a .grad of
grads="mapped", a view over a slot) is given back only once the last tensor
over it is gone, whatever the user closes or drops: Offload.close(), the
callables' collection and interpreter exit defer the runtime's destroy
(vmmrt.Runtime.hold). Each case runs in a subprocess, where a read of freed
memory (a SIGSEGV on the host backend) fails the test instead of pytest."""
import os
import subprocess
import sys

import pytest
import torch

from test_call_path import host_graphs  # noqa: F401 - a fixture
from vmmrt.torch import place

pytestmark = pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")

_PROLOGUE = """
import gc, sys, torch
import vmmrt.torch as vt
from conftest import zoo_layers, samples
torch.manual_seed(0)
base = zoo_layers(2)
model = torch.nn.Sequential(*base)
g = vt.make_graphed_callables(tuple(base), samples(2), graphs=False, mode=%(mode)r, min_bytes=0)
off = vt.offload_of(g[0])
for it in range(2):
    x = torch.randn(2, 8, 32, requires_grad=True)
    model(x).pow(2).sum().backward()
p = next(base[0].parameters())
grad = p.grad
assert grad.data_ptr() == off.layers[0].grads.backing.address, "the .grad is not the one in the slot"
ref = grad.clone()
"""


def _run(body, mode="pingpong"):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    code = _PROLOGUE % {"mode": mode} + body
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)


def _check(r):
    assert r.returncode == 0, "exit status %d\n%s\n%s" % (r.returncode, r.stdout, r.stderr[-3000:])
    assert "Fatal Python error" not in r.stderr, r.stderr[-3000:]
    return r.stdout


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
def test_grad_kept_past_close_reads_and_writes_its_own_memory(mode):
    out = _check(_run("""
assert off.stats()["tensors_held"] >= 1
off.close()
print("read", torch.equal(grad, ref), flush=True)
grad.add_(1.0)
print("write", torch.equal(grad, ref + 1), torch.equal(p.grad, ref), flush=True)   # .grad became a copy
assert off.runtime.closed and off.runtime.destroy_deferred and off.runtime.holds >= 1
life = off.runtime._life
del grad
p.grad = None
gc.collect()
print("destroyed", life.rt is None and life.holds == 0, flush=True)
""", mode))
    assert "read True" in out and "write True True" in out and "destroyed True" in out, out


@pytest.mark.parametrize("mode", ["pingpong", "none"])
def test_grad_kept_past_the_callables_and_interpreter_exit(mode):
    # The callables dropped (the modules keep their parameters and the
    # .grad): the runtime is collected only once the tensors over it are,
    # and at exit not destroyed under them (nor is a DLPack tensor's deleter
    # gone when torch calls it in the last collection).
    out = _check(_run("""
del g, off
for m in base:
    del m.vmmrt_offload
gc.collect()
print("read", torch.equal(grad, ref), torch.equal(p.grad, ref), flush=True)
grad.mul_(2.0)
print("write", torch.equal(p.grad, 2 * ref), flush=True)
""", mode))
    assert "read True True" in out and "write True" in out, out


def test_closing_with_nothing_held_destroys_at_once():
    out = _check(_run("""
for m in base:
    m.zero_grad(set_to_none=True)
del grad
gc.collect()
off.close()
print("at once", off.runtime._life.rt is None, not off.runtime.destroy_deferred, flush=True)
"""))
    assert "at once True True" in out, out


@pytest.mark.parametrize("plan", [False, True])
def test_graphed_close_lets_the_runtime_go_once_what_was_handed_out_is_gone(host_graphs, plan):
    """With graphs (the host backend's stand-in for them), close() while the
    callables live: the library's own static tensors over its slots (the
    backward's buffers, the outputs' base, the gradient slots' bases on the
    plan's pages: ``plan``) hold nothing after it; a .grad
    kept holds the runtime until it goes (the H200 kept the runtime for the
    callables' life: test_cuda_grad_kept_past_close)."""
    import gc

    from test_call_path import _graphed_on_host, _stepper
    g, off, runners = _graphed_on_host("none", "mapped", plan=plan)
    for _ in range(3 if plan else 1):
        _stepper(g)()
    from vmmrt.torch import backing as vmmrt_backing
    assert not plan or vmmrt_backing.USE_COUNT is None or all(r.grads._bases is not None for r in runners)
    x, gy = torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32)
    out = x
    for f in g:
        out = f(out)
    out.backward(gy)
    p = next(p for r in runners for p in r.params if p.grad is not None)
    grad, ref = p.grad, p.grad.clone()
    off.close()
    life = off.runtime._life
    assert off.runtime.destroy_deferred and life.rt is not None
    assert torch.equal(grad, ref)
    del grad
    for r in runners:
        for q in r.params:
            q.grad = None
    del out, x
    gc.collect()
    assert life.rt is None and life.holds == 0, "%d holds left with the callables alive" % life.holds
    assert g is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_grad_kept_past_close():
    """On a GPU: a .grad kept past close() reads its gradient (the H200 read
    0.0, the memory given back) and an in-place add writes into it, not into
    memory that has gone to another allocation."""
    import copy

    import vmmrt.torch as vt

    class Block(torch.nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.up = torch.nn.Linear(d, 4 * d)
            self.down = torch.nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    torch.manual_seed(0)
    dev = torch.device("cuda")
    base = [Block().to(dev) for _ in range(2)]
    model = torch.nn.Sequential(*base)
    ref_model = copy.deepcopy(model)
    g = vt.make_graphed_callables(tuple(base), tuple((torch.randn(2, 8, 32, device=dev, requires_grad=True),)
                                                     for _ in base), min_bytes=0)
    off = vt.offload_of(g[0])
    x = torch.randn(2, 8, 32, device=dev, requires_grad=True)
    model(x).pow(2).sum().backward()
    ref_model(x.detach().clone().requires_grad_()).pow(2).sum().backward()
    p = next(base[0].parameters())
    grad = p.grad
    gr = off.layers[0].grads
    assert gr.mapped, gr.describe()
    assert gr.backing.address <= grad.data_ptr() < gr.backing.address + gr.backing.nbytes
    want = next(ref_model[0].parameters()).grad.clone()
    before = grad.clone()
    torch.cuda.synchronize()
    off.close()
    assert off.runtime.destroy_deferred
    # Other allocations that would take the memory had it gone back.
    junk = [torch.full((1 << 20,), 7.0, device=dev) for _ in range(16)]
    torch.cuda.synchronize()
    assert torch.equal(grad, before)
    torch.testing.assert_close(grad, want)
    grad.add_(1.0)
    torch.cuda.synchronize()
    assert torch.equal(grad, before + 1)
    assert all(bool((j == 7.0).all()) for j in junk)
    life = off.runtime._life
    del grad
    p.grad = None
    import gc
    gc.collect()
    # x.grad may be the first layer's argument gradient itself (autograd
    # keeps the tensor it is handed for a leaf without one), a view over
    # that layer's io slot: handed out, it holds the runtime until it goes.
    io = off.layers[0].grads.io
    if io is not None and io.address <= x.grad.data_ptr() < io.address + io.nbytes:
        assert life.rt is not None, "the runtime went with x.grad over its io slot"
        x.grad.add_(0.0)
        torch.cuda.synchronize()
    want_x = x.grad.clone()
    junk = [torch.full((1 << 20,), 7.0, device=dev) for _ in range(16)]
    assert torch.equal(x.grad, want_x)
    x.grad = None
    gc.collect()
    # Nothing handed out holds it now. What may: the graphs' pool on the
    # library's arena (vmmrt.torch._arena), whose segments PyTorch keeps
    # while the graphs captured into it live (the callables here): freed
    # under PyTorch they would be a fault at its pool's teardown (H100,
    # 2026-12-06: one hold left, the arena's). It goes with the callables.
    from vmmrt.torch import _arena
    lent = 1 if _arena.held(life) else 0
    assert life.holds == lent, "%d holds left with the callables alive, %d of them the arena's" % (life.holds, lent)
    del g, off, gr, io, base, model, p
    gc.collect()
    vt.empty_cache()
    assert life.rt is None and life.holds == 0, "%d holds left once the callables went" % life.holds


@pytest.mark.parametrize("plan", [False, True])
def test_dropped_callables_let_their_offload_and_runtime_go_without_close(host_graphs, plan):
    """A benchmark or a user that drops its graphed callables without
    close(): once collected, nothing of the library's keeps the Offload,
    and the runtime (its slots, the memory plan's pages) is destroyed. A
    global (a finalizer's registry) that reached a Backing, and through it
    the Offload, kept every slot mapped for the process's life (H100,
    2026-12-05: the next front point began 4 GiB over the ones before)."""
    import gc
    import weakref

    from test_call_path import _graphed_on_host, _stepper

    def trained():
        g, off, runners = _graphed_on_host("none", "mapped", plan=plan)
        for _ in range(3 if plan else 1):
            _stepper(g)()       # (its last backward's argument gradients: held by the Offload)
            for r in runners:
                for q in r.params:
                    q.grad = None
        return off.runtime._life, weakref.ref(off)
    life, gone = trained()
    gc.collect()
    assert gone() is None
    assert life.rt is None
