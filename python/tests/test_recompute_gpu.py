# SPDX-License-Identifier: LGPL-2.1-or-later
"""Recomputed layers under graphs on a CUDA device (skipped without one): the
gradients bitwise equal to graphs that recompute nothing (math attention),
with the gradients mapped and static; and a layer that draws random numbers
recomputes the forward's numbers. Run on the H200 by python/tests/gpu_run.sh."""
import pytest
import torch

import vmmrt.torch as vt
from vmmrt.torch.bench import llama

from test_gpu import cleanup, layers_and_copy, sample, steps_equal

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("grads", ["mapped", "static"])
def test_recomputed_layers_are_bitwise_the_graphs_that_keep_everything(grads):
    s, base, ref = layers_and_copy()
    n = len(base)
    with llama.attention_backend("math"):
        gref = torch.cuda.make_graphed_callables(tuple(ref), tuple((sample(s),) for _ in ref))
        g = vt.make_graphed_callables(tuple(base), tuple((sample(s),) for _ in base), mode="pingpong",
                                      grads=grads, memory_budget=vt.Budget(layers=["recompute", "keep"] * (n // 2)))
        off = vt.offload_of(g[0])
        assert [lay.recompute for lay in off.layers] == [True, False] * (n // 2)
        steps_equal(s, g, base, gref, ref)
    cleanup(base, ref)
    off.close()


class Dropped(torch.nn.Module):
    """y = dropout(x * w) + x: w's gradient is sum(gy * (y - x)) / w, whatever
    the mask, if the backward uses the forward's mask."""

    def __init__(self, hidden):
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(hidden, device="cuda") + 0.5)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x * self.w) + x


def test_a_recomputed_layer_draws_its_forwards_numbers_again():
    hidden = 1024
    layers = [Dropped(hidden) for _ in range(4)]
    g = vt.make_graphed_callables(tuple(layers), tuple((torch.randn(8, hidden, device="cuda", requires_grad=True),)
                                                       for _ in layers),
                                  mode="pingpong", memory_budget=vt.Budget(layers=["recompute"] * 4))
    off = vt.offload_of(g[0])
    try:
        for it in range(3):
            x = torch.randn(8, hidden, device="cuda", requires_grad=True)
            ys, h = [], x
            for m in g:
                h = m(h)
                ys.append(h)
            gy = torch.randn_like(h)
            h.backward(gy)
            # the last layer: its input is ys[-2], its output gradient gy
            want = (gy * (ys[-1] - ys[-2])).sum(0) / layers[-1].w
            torch.testing.assert_close(layers[-1].w.grad, want, rtol=1e-4, atol=1e-4,
                                       msg="iteration %d: the recomputation drew other numbers" % it)
            for m in layers:
                m.w.grad = None
        st = off.describe()
        assert "recomputed" in st
    finally:
        off.close()
