# SPDX-License-Identifier: LGPL-2.1-or-later
"""The per-runner API (Offload, LayerOffload) as a framework with its own
runners uses it: discovery passes, allocation, then each forward through its
group and each backward bracketed by the hooks (eagerly, on the host backend)."""
import copy

import pytest
import torch

import vmmrt
import vmmrt.torch as vt

from conftest import runner_step, zoo_layers


def test_a_framework_driving_its_own_runners():
    mods = zoo_layers(3)
    ref = copy.deepcopy(mods)
    off = vt.Offload(mode="pingpong", lookahead=1, device="cpu", min_bytes=0)
    lays = [off.layer("runner%d" % i, static=list(m.parameters())) for i, m in enumerate(mods)]
    x0 = torch.randn(2, 8, 32, requires_grad=True)
    for lay, m in zip(lays, mods):                      # discovery: eager warm-up passes
        with lay.discovering() as p:
            p.outputs = m(x0)
        p.outputs.sum().backward()
    off.allocate(offload=1.0)
    assert all(lay.group.state == "ready" for lay in lays)  # addresses learned
    for m in mods:
        m.zero_grad(set_to_none=True)

    for _ in range(3):
        x = torch.randn(2, 8, 32)
        gx = runner_step(lays, mods, x)   # forward through the groups, backward bracketed by the hooks
        xr = x.clone().requires_grad_()
        h = xr
        for m in ref:
            h = m(h)
        h.backward(torch.ones_like(h))
        assert torch.equal(gx, xr.grad)
        for a, b in zip(mods, ref):
            for p, q in zip(a.parameters(), b.parameters()):
                assert torch.equal(p.grad, q.grad)
                p.grad = q.grad = None
    off.sync()
    assert off.stats()["iterations"] == 3
    off.close()


def test_the_order_of_a_pass_is_enforced():
    off = vt.Offload(mode="pingpong", device="cpu")
    lay = off.layer("only")
    with pytest.raises(vmmrt.Error) as e:
        with lay.offloading(None):
            pass
    assert e.value.name == "VMMRT_E_INVALID_STATE" and "before Offload.allocate" in str(e.value)
    with pytest.raises(vmmrt.Error) as e:
        off.allocate()
    assert "never discovered" in str(e.value)
    with pytest.raises(ValueError):
        off.layer("only")
    off.close()
