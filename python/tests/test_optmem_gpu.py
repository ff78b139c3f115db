# SPDX-License-Identifier: LGPL-2.1-or-later
"""The optimizer step's allocations on the memory plan's free pages
(vmmrt.torch.optmem) with PyTorch's caching allocator and libvmmrt's arena
(skipped without a CUDA device): AdamW foreach and fused train bitwise as
with memory_plan="slots" (the optimizer in PyTorch's own memory), the
steps after the plan is made are routed, nothing is left behind; a state
tensor an optimizer makes late stays intact while the layers run over the
bytes around it. Run on the H200:

    /usr/bin/python3 -m pytest -q python/tests/test_optmem_gpu.py
"""
import copy
import gc

import pytest
import torch

import vmmrt
import vmmrt.torch as vt
from conftest import close_graphed
from vmmrt.torch import optmem
from vmmrt.torch.bench import llama

pytestmark = pytest.mark.gpu

SHAPE = dict(hidden=256, ffn=512, heads=4, kv_heads=2, seq=1024, batch=2)
N = 4


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


class LateState(torch.optim.SGD):
    """SGD that makes a state tensor at its fourth step (in the step, so in
    the routed pool) and adds it to the first parameter from then on."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.n = 0
        self.late = None

    @torch.no_grad()
    def step(self, closure=None):
        self.n += 1
        if self.n == 4:
            p = self.param_groups[0]["params"][0]
            self.late = torch.full_like(p, 1e-3)
        out = super().step(closure)
        if self.late is not None:
            self.param_groups[0]["params"][0].add_(self.late)
        return out


def _train(layers, plan, make_opt, steps=6, set_to_none=True):
    s = llama.Shape(**SHAPE)
    g = vt.make_graphed_callables(tuple(layers), tuple((_sample(s, 100 + i),) for i in range(N)), mode="none",
                                  memory_plan=plan)
    off = vt.offload_of(g[0])
    opt = make_opt([p for m in layers for p in m.parameters()])
    out = {}
    try:
        for i in range(steps):
            opt.zero_grad(set_to_none=set_to_none)
            x = _sample(s, i)
            gy = torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=torch.Generator("cuda").manual_seed(i))
            y = x
            for m in g:
                y = m(y)
            y.backward(gy)
            del y
            opt.step()
        torch.cuda.synchronize()
        out["params"] = [p.detach().clone() for m in layers for p in m.parameters()]
        out["stats"] = off.stats()
        out["describe"] = off.describe()
        out["late"] = opt.late.clone() if getattr(opt, "late", None) is not None else None
        out["late_intact"] = bool((opt.late == 1e-3).all()) if getattr(opt, "late", None) is not None else None
    finally:
        # the optimizer (and a state it made in the pages) goes before the
        # Offload: a close with such a tensor alive keeps the pages for it;
        # the graphs too, which keep the segments of their pool (on the
        # arena: vmmrt.torch.graphpool) while they live; and the last
        # sample, whose .grad the first layer's backward graph wrote in that
        # pool (it rightly keeps the pool's segment, and the runtime)
        del opt, g
        x = gy = None
        gc.collect()
        close_graphed(layers, off)
    # the pools' segments go back to the arena with the Offload and the
    # graphs (which its launchers hold), once PyTorch's cache is emptied
    # (vmmrt.torch.graphpool)
    del off
    gc.collect()
    torch.cuda.empty_cache()
    out["arena_segments"] = vmmrt.arena_stats(torch.cuda.current_device())["segments"]
    return out


def _sample(s, seed):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(s.batch, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16, generator=gen,
                       requires_grad=True)


def _both(make_opt, set_to_none=True):
    base = llama.torch_layers(N, llama.Shape(**SHAPE), "cuda", torch.bfloat16, "math")
    ref = copy.deepcopy(base)
    with llama.attention_backend("math"):
        on = _train(base, True, make_opt, set_to_none=set_to_none)
        off = _train(ref, "slots", make_opt, set_to_none=set_to_none)
    return on, off


def test_this_pytorch_can_route():
    assert optmem.available(vt.offload_of(vt.make_graphed_callables(
        torch.nn.Linear(8, 8).cuda(), (torch.randn(2, 8, device="cuda", requires_grad=True),), mode="none"))) \
        is None


@pytest.mark.parametrize("kind", ["foreach", "fused"])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_adamw_trains_bitwise_with_its_temporaries_in_the_pages(kind, set_to_none):
    on, off = _both(lambda ps: torch.optim.AdamW(ps, lr=1e-3, **{kind: True}), set_to_none)
    st = on["stats"]
    assert st["optimizer_routed_steps"] >= 3, on["describe"]
    assert st["optimizer_survivors"] == 0 and st["plan_conflicts"] == 0
    assert st["optimizer_lent_bytes"] > 0
    if kind == "foreach":
        # its temporaries took bytes of the pages
        assert st["optimizer_peak_bytes"] > 0
    assert off["stats"]["optimizer_routed_steps"] == 0
    for a, b in zip(on["params"], off["params"]):
        assert torch.equal(a, b)
    stats = vmmrt.arena_stats(torch.cuda.current_device())
    assert stats["bad_frees"] == 0
    assert on["arena_segments"] == 0


def test_a_state_made_late_keeps_its_bytes():
    on, off = _both(lambda ps: LateState(ps, lr=1e-6))
    st = on["stats"]
    assert st["optimizer_survivors"] >= 1
    assert on["late_intact"], "the layers wrote over a tensor the optimizer step made"
    assert on["arena_segments"] == 0
    for a, b in zip(on["params"], off["params"]):
        assert torch.equal(a, b)


RAISING_STEP = r"""
import torch, vmmrt.torch as vt
layers = [torch.nn.Linear(256, 256).cuda() for _ in range(3)]
g = vt.make_graphed_callables(tuple(layers), tuple((torch.randn(64, 256, device="cuda", requires_grad=True),)
                                                   for _ in range(3)), mode="none")
off = vt.offload_of(g[0])
opt = torch.optim.AdamW([p for m in layers for p in m.parameters()], lr=1e-3, foreach=True)
for i in range(5):
    opt.zero_grad(set_to_none=True)
    y = torch.randn(64, 256, device="cuda", requires_grad=True)
    for m in g:
        y = m(y)
    y.sum().backward()
    if i == 4:
        h = opt.register_step_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("a failing step")))
        try:
            opt.step()
        except RuntimeError as e:
            print("raised:", e)
        h.remove()
    else:
        opt.step()
print("routed steps", off.stats()["optimizer_routed_steps"])
vt.empty_cache()          # the failed step's routing ended first
off.close()
torch.cuda.empty_cache()
print("alive after empty_cache")
"""


def test_emptying_the_cache_after_a_step_that_raised_does_not_abort():
    """A routed step that raises leaves this thread's allocations routed
    (its post-hook never runs); vmmrt.torch.empty_cache() and close() end
    that before PyTorch empties its cache, which would otherwise abort the
    process: run in a child process."""
    import os
    import subprocess
    import sys
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    p = subprocess.run([sys.executable, "-c", RAISING_STEP], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
    assert "raised: a failing step" in p.stdout and "alive after empty_cache" in p.stdout, p.stdout
