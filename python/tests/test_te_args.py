# SPDX-License-Identifier: LGPL-2.1-or-later
"""TransformerEngine's make_graphed_callables arguments (as Megatron-LM passes
them) on the host backend, without graphs: keyword sample arguments, non-tensor
outputs, TE's names of order=, the warm-up hooks, and the refusals."""
import pytest
import torch

import vmmrt
import vmmrt.torch as vt


class KwLayer(torch.nn.Module):
    """A layer called as Megatron's TransformerBlock calls its layers: every
    argument by keyword, most of them None, returning (hidden_states, None)."""

    def __init__(self, d=32):
        super().__init__()
        self.fc = torch.nn.Linear(d, d)
        self.calls = 0

    def forward(self, hidden_states=None, attention_mask=None, rotary_pos_emb=None, context=None):
        self.calls += 1
        assert attention_mask is None and context is None
        h = torch.tanh(self.fc(hidden_states) * rotary_pos_emb)
        return hidden_states + h * h, None


def sample(d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 2, d, generator=g).requires_grad_()
    rope = torch.randn(4, 1, d, generator=g)
    return {"hidden_states": x, "attention_mask": None, "rotary_pos_emb": rope, "context": None}


def layers(n=3, seed=0):
    torch.manual_seed(seed)
    return [KwLayer() for _ in range(n)]


def make(n=3, **kw):
    base = layers(n)
    import copy
    ref = copy.deepcopy(base)
    g = vt.make_graphed_callables(tuple(base), tuple(() for _ in base),
                                  sample_kwargs=tuple(sample() for _ in base), graphs=False, **kw)
    return g, ref, base


def run(ls, kw, gy):
    h = kw["hidden_states"]
    for layer in ls:
        h, ctx = layer(hidden_states=h, attention_mask=None, rotary_pos_emb=kw["rotary_pos_emb"], context=None)
        assert ctx is None
    h.backward(gy)
    return h


def test_keyword_samples_and_none_outputs_are_bitwise_eager():
    g, ref, base = make()
    for it in range(3):
        kw = sample(seed=10 + it)
        kr = dict(kw, hidden_states=kw["hidden_states"].detach().clone().requires_grad_())
        gy = torch.randn(4, 2, 32)
        y = run(g, kw, gy)
        yr = run(ref, kr, gy)
        assert torch.equal(y, yr)
        assert torch.equal(kw["hidden_states"].grad, kr["hidden_states"].grad)
        for a, b in zip(base, ref):
            assert torch.equal(a.fc.weight.grad, b.fc.weight.grad), "iteration %d" % it
            a.zero_grad(set_to_none=True)
            b.zero_grad(set_to_none=True)
    vt.offload_of(g[0]).close()


def test_keywords_must_be_the_samples():
    g, _, _ = make(n=1)
    kw = sample()
    with pytest.raises(vmmrt.Error, match=r"missing rotary_pos_emb") as e:
        g[0](hidden_states=kw["hidden_states"], attention_mask=None, context=None)
    assert e.value.name == "VMMRT_E_MISMATCH" and "layer '0:KwLayer'" in str(e.value)
    with pytest.raises(vmmrt.Error, match=r"not in the sample: extra"):
        g[0](**kw, extra=1)
    with pytest.raises(vmmrt.Error, match=r"keyword attention_mask is a tensor where the sample's was None"):
        g[0](**dict(kw, attention_mask=torch.ones(1)))
    # TE's FP8 weight-caching flag is taken and ignored
    y, ctx = g[0](**kw, is_first_microbatch=True)
    assert ctx is None
    y.sum().backward()
    vt.offload_of(g[0]).close()


def test_te_names_of_order():
    base = layers(2)
    order = vt.order_1f1b(2, in_flight=2)
    mb = len(order) // 2
    kws = tuple(sample(seed=s) for s in range(2 * mb))
    g = vt.make_graphed_callables(tuple(base), tuple(() for _ in kws), sample_kwargs=kws, _order=order,
                                  _num_layers_per_chunk=2, graphs=False, offload=0.5)
    assert len(g) == 2 * mb
    vt.offload_of(g[0]).close()
    with pytest.raises(TypeError, match="order= and _order= are the same"):
        vt.make_graphed_callables(tuple(base), tuple(() for _ in kws), sample_kwargs=kws, _order=order,
                                  order=order, graphs=False)


def test_warmup_hooks_run_around_the_warmup():
    base = layers(2)
    seen = []
    g = vt.make_graphed_callables(tuple(base), ((), ()), sample_kwargs=(sample(), sample()), graphs=False,
                                  num_warmup_iters=3,
                                  pre_warmup_hook=lambda: seen.append(("pre", [m.calls for m in base])),
                                  post_warmup_hook=lambda: seen.append(("post", [m.calls for m in base])))
    assert [s[0] for s in seen] == ["pre", "post"]
    assert seen[0][1] == [0, 0] and min(seen[1][1]) >= 3
    vt.offload_of(g[0]).close()


@pytest.mark.parametrize("kw, err, match", [
    ({"fp8_enabled": True}, vmmrt.Error, "fp8_enabled=True: FP8 is TransformerEngine's"),
    ({"fp8_enabled": (False, True)}, vmmrt.Error, "fp8_enabled"),
    ({"fp8_recipe": object()}, vmmrt.Error, "fp8_recipe="),
    ({"fp8_weight_caching": True}, vmmrt.Error, "fp8_weight_caching"),
    ({"_reuse_graph_input_output_buffers": True}, vmmrt.Error, "_reuse_graph_input_output_buffers"),
    ({"retain_graph_in_backward": "yes"}, TypeError, "retain_graph_in_backward"),
    ({"pre_warmup_hook": 3}, TypeError, "pre_warmup_hook"),
    ({"generators": [3]}, TypeError, "generators="),
    ({"fp8_enable": False}, TypeError, "did you mean 'fp8_enabled'"),
])
def test_refused_by_name(kw, err, match):
    base = layers(1)
    with pytest.raises(err, match=match):
        vt.make_graphed_callables(base[0], (), sample_kwargs=sample(), graphs=False, **kw)


def test_no_fp8_values_are_accepted():
    base = layers(2)
    g = vt.make_graphed_callables(tuple(base), ((), ()), sample_kwargs=(sample(), sample()), graphs=False,
                                  fp8_enabled=(False, False), fp8_recipe=None, fp8_weight_caching=False,
                                  retain_graph_in_backward=True)
    y, _ = g[1](**sample())
    y.sum().backward()
    vt.offload_of(g[0]).close()


def test_non_tensor_outputs_come_back_in_place():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)

    def f(x):
        return None, {"y": lin(x).relu(), "n": 7}

    x = torch.randn(3, 8, requires_grad=True)
    g = vt.make_graphed_callables(f, (x,), graphs=False)
    a, b = g(x)
    assert a is None and b["n"] == 7 and b["y"].shape == (3, 8)
    b["y"].sum().backward()
    assert x.grad is not None
    vt.offload_of(g).close()


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_graphed_keyword_samples_match_eager_on_gpu():
    import copy
    torch.manual_seed(0)
    base = [KwLayer(64).cuda() for _ in range(3)]
    ref = copy.deepcopy(base)

    def kw(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return {"hidden_states": torch.randn(8, 2, 64, device="cuda", generator=g).requires_grad_(),
                "attention_mask": None, "rotary_pos_emb": torch.randn(8, 1, 64, device="cuda", generator=g),
                "context": None}

    g = vt.make_graphed_callables(tuple(base), ((),) * 3, sample_kwargs=tuple(kw(s) for s in range(3)),
                                  mode="pingpong", min_bytes=0)
    for it in range(3):
        a = kw(10 + it)
        b = dict(a, hidden_states=a["hidden_states"].detach().clone().requires_grad_())
        gy = torch.randn(8, 2, 64, device="cuda")
        assert torch.equal(run(g, a, gy), run(ref, b, gy))
        assert torch.equal(a["hidden_states"].grad, b["hidden_states"].grad)
        for x, y in zip(base, ref):
            assert torch.equal(x.fc.weight.grad, y.fc.weight.grad)
            x.zero_grad(set_to_none=True)
            y.zero_grad(set_to_none=True)
    assert vt.offload_of(g[0]).stats()["bytes_offloaded"] > 0
    vt.offload_of(g[0]).close()


class Noisy(torch.nn.Module):
    """Random numbers from a generator of the user's own, as Megatron's RNG
    tracker keeps them."""

    def __init__(self, gen):
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)
        self.gen = gen

    def forward(self, x):
        keep = torch.rand(x.shape, device=x.device, generator=self.gen) > 0.1
        return self.fc(x) * keep


@cuda
def test_generators_are_registered_and_set_back():
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    layer = Noisy(gen).cuda()
    with pytest.raises(vmmrt.Error, match="generators="):
        vt.make_graphed_callables(Noisy(gen).cuda(), (x,), mode="none")
    gen.manual_seed(5)
    before = gen.get_state()
    g = vt.make_graphed_callables(layer, (x,), mode="none", generators=[gen])
    assert torch.equal(gen.get_state(), before), "warm-up and capture must not shift the user's generator"
    y1 = g(x)
    y1.sum().backward()
    y1 = y1.clone()         # the graph's static output: the next replay rewrites it
    y2 = g(x)
    y2.sum().backward()
    assert not torch.equal(y1, y2), "each replay draws new numbers from the registered generator"
    vt.offload_of(g).close()
