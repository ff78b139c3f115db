# SPDX-License-Identifier: LGPL-2.1-or-later
"""Saved tensors born at their fixed address (vmmrt.torch.place), on the CPU
with the host backend's eager offload: the op that allocates a saved storage
writes it in the slot, the gradients stay bitwise, and what cannot be placed
is copied as before, with the reason."""
import copy
import time

import pytest
import torch

import vmmrt.torch as vt
from vmmrt.torch import _compat, place

from conftest import grads, same, samples, step, zoo_layers

pytestmark = pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")


def test_out_overloads_are_found_by_their_arguments():
    aten = torch.ops.aten
    assert place.out_overload(aten.mm.default)[0] is aten.mm.out
    assert place.out_overload(aten.add.Tensor) == (aten.add.out, ["out"])
    op, names = place.out_overload(aten.native_layer_norm.default)
    assert op is aten.native_layer_norm.out and names == ["out0", "out1", "out2"]
    assert place.out_overload(aten._to_copy.default) is None      # other arguments: the copy_ path
    assert place.out_overload(aten.t.default) is None             # a view allocates nothing


def test_an_out_overload_writes_at_the_target_only_with_the_devices_own_kernel():
    aten = torch.ops.aten
    assert place.writes_at_target(aten.mm.default, "cpu")
    assert place.writes_at_target(aten.mul.Tensor, "cpu")
    # generated out= overloads run the op into a temporary, then copy it
    assert not place.writes_at_target(aten.mul.Scalar, "cpu")
    assert not place.writes_at_target(aten.clone.default, "cpu")
    assert not place.writes_at_target(aten.t.default, "cpu")     # no out= at all


def test_births_are_the_ops_that_allocate():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with place.Mode("cpu") as m:
        h = x @ w
        v = h.t()                       # a view: no birth
        y = torch.relu(v)
    b = m.births[h.data_ptr()]
    assert b.key == ("aten.mm.default", 0) and b.shape == (4, 8) and b.out == 0
    assert m.births[y.data_ptr()].key == ("aten.relu.default", 0)
    assert len([k for k in m.by_key if k[0][0] == "aten.t.default"]) == 0


class _Seen(place.TorchDispatchMode if place.AVAILABLE else object):
    """The ops a Mode's placements dispatch (it sits below the Mode)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_clone_is_placed_as_the_copy_it_is_not_through_its_generated_out_overload():
    """clone's out= overload is PyTorch's generated one (a clone into a
    temporary, then a copy): placed through it, each forward carried a
    device copy more (repeat_interleave's k and v on the Llama layers). A
    clone is placed as a copy_ into its target, as _to_copy is."""
    x = torch.randn(4, 1, 8)
    with place.Mode("cpu") as m:
        y = x.expand(4, 3, 8).clone()
        z = x.to(torch.float64)
    births = [m.births[y.data_ptr()], m.births[z.data_ptr()]]
    assert [b.key[0] for b in births] == ["aten.clone.default", "aten._to_copy.default"]
    targets = [place.Placed(b, torch.empty_strided(b.shape, b.stride, dtype=b.dtype)) for b in births]
    where = [t.target.data_ptr() for t in targets]
    with _Seen() as seen:
        with place.Mode("cpu", targets, m.by_key, record=False):
            y2 = x.expand(4, 3, 8).clone()
            z2 = x.to(torch.float64)
    assert [t.how for t in targets] == ["placed", "placed"]
    assert (y2.data_ptr(), z2.data_ptr()) == tuple(where)
    assert torch.equal(y2, y) and torch.equal(z2, z)
    assert "aten.clone.out" not in seen.ops and seen.ops.count("aten.copy_.default") == 2


def test_a_relu_is_placed_as_the_clamp_min_it_is():
    """relu's out= overload is generated too (a relu into a temporary,
    then a copy: the encoder's 128 MiB FFN activation a layer a forward);
    relu is clamp_min(self, 0), whose out= is the device's kernel: the
    same bits (NaN and -0.0 too), at the target, and no relu.out."""
    x = torch.randn(6, 8)
    x[0, 0], x[0, 1], x[0, 2] = float("nan"), -0.0, float("-inf")
    with place.Mode("cpu") as m:
        y = torch.relu(x)
    b = m.births[y.data_ptr()]
    t = place.Placed(b, torch.empty_strided(b.shape, b.stride, dtype=b.dtype))
    where = t.target.data_ptr()
    with _Seen() as seen:
        with place.Mode("cpu", [t], m.by_key, record=False):
            y2 = torch.relu(x)
    assert t.how == "placed" and y2.data_ptr() == where
    assert torch.equal(y2.view(torch.int32), y.view(torch.int32))
    assert "aten.relu.out" not in seen.ops and "aten.clamp_min.out" in seen.ops


def _composite_safe_softmax():
    has = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    return hasattr(torch.ops.aten, "_safe_softmax") and has is not None and \
        has("aten::_safe_softmax", "CompositeExplicitAutograd")


@pytest.mark.skipif(not _composite_safe_softmax(), reason="no aten._safe_softmax as PyTorch's composite here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_safe_softmax_is_placed_as_the_ops_it_is(dtype):
    """sdpa's math backend saves aten._safe_softmax's output, an op with no
    out= overload: computed in the pool and copied into its slot, 64 MiB a
    layer a forward on the launch-bound layers (none at 1.046x graphs'
    time with math attention, H100). PyTorch computes it as softmax, then
    where(a row all -inf, 0, softmax): those ops, the where by its out=
    kernel at the target, give the same bits, a masked row's zeros too."""
    x = torch.randn(2, 3, 5, 7).to(dtype)
    x[0, 1, 2, :] = float("-inf")                   # a row every input of which is masked
    x[1, 0, :, 3] = float("-inf")
    with place.Mode("cpu") as m:
        y = torch.ops.aten._safe_softmax(x, -1)
    b = m.births[y.data_ptr()]
    assert b.key == ("aten._safe_softmax.default", 0)
    t = place.Placed(b, torch.empty_strided(b.shape, b.stride, dtype=b.dtype))
    where = t.target.data_ptr()
    with _Seen() as seen:
        with place.Mode("cpu", [t], m.by_key, record=False):
            y2 = torch.ops.aten._safe_softmax(x, -1)
    assert t.how == "placed" and y2.data_ptr() == where
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(y2.view(bits), y.view(bits)) and not y2[0, 1, 2].any()
    assert "aten.where.self_out" in seen.ops and "aten.copy_.default" not in seen.ops


def test_an_unsafe_view_is_no_birth_its_mm_is_placed():
    """matmul over a 3-D input (a Linear) views its mm's output with
    aten._unsafe_view, whose schema has no alias annotation: taken for the
    storage's birth, it hid the mm, and the saved output was computed in
    the pool and copied into its slot (Llama's gate and up projections,
    112 MiB each a layer a forward). The mm is the birth, and is placed."""
    x = torch.randn(8, 4)
    w = torch.randn(4, 6)

    def fwd():
        return torch.ops.aten._unsafe_view(torch.mm(x, w), (2, 4, 6))
    with place.Mode("cpu") as m:
        y = fwd()
    b = m.births[_compat.storage_of(y)[0]]
    assert b.key == ("aten.mm.default", 0)
    assert not any(k[0][0].startswith("aten._unsafe_view") for k in m.by_key)
    t = place.Placed(b, torch.empty_strided(b.shape, b.stride, dtype=b.dtype))
    where = t.target.data_ptr()
    with place.Mode("cpu", [t], m.by_key, record=False):
        y2 = fwd()
    assert t.how == "placed" and y2.data_ptr() == where and torch.equal(y2, y)


def _eager(layers, mode="pingpong", shape=(2, 8, 32), **kw):
    kw.setdefault("min_bytes", 0)
    if mode == "none":
        kw.setdefault("options", {"host_granularity": 4096})   # resident slots for small layers
    return vt.make_graphed_callables(tuple(layers), samples(len(layers), shape), graphs=False, mode=mode, **kw)


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
def test_saved_tensors_are_born_in_their_slots_and_gradients_stay_bitwise(mode):
    base = zoo_layers(3)
    ref = copy.deepcopy(base)
    g = _eager(base, mode)
    x = torch.randn(2, 8, 32, requires_grad=True)
    gy = torch.randn(2, 8, 32)
    for _ in range(2):
        for m in base + ref:
            m.zero_grad(set_to_none=True)
        step(g, x, gy)
        step(ref, x.detach().clone().requires_grad_(), gy)
        assert same(grads(base), grads(ref))
    off = vt.offload_of(g[0])
    p = off.placement()
    moved = off.saved_bytes()["moved"]
    assert p["placed"] + p["copied"] + p["copy"] == moved
    st = off.stats()
    assert (st["placed_bytes"], st["copy_bytes"], st["resident_bytes"]) == (p["placed"], p["copy"], p["resident"])
    if mode == "none":
        # nothing moves: what the layers save is born in their resident slots
        assert moved == 0 and p["resident"] > 0.85 * off.saved_bytes()["distinct"]
        return
    # Each layer's input was allocated before the layer ran (and a scalar
    # made from a Python number, outside the dispatcher): the only copies.
    assert p["placed"] > 0.85 * moved
    for name, lp in p["layers"].items():
        assert set(lp["why"]) <= {"not allocated by an op of the layer's forward"}, (name, lp["why"])


class Flaky(torch.nn.Module):
    """Runs an extra op of a kind the layer runs anyway at some calls: the op
    that discovery saw at that place now comes later, so the region is
    copied, as before, and the gradients do not change."""

    def __init__(self, d=32):
        super().__init__()
        self.a = torch.nn.Linear(d, d)
        self.b = torch.nn.Linear(d, d)
        self.extra = False

    def forward(self, x):
        h = torch.tanh(self.a(x))
        if self.extra:
            with torch.no_grad():
                self.b(x).sum()    # an extra linear, nothing saved: the same kinds of op, once more
        return self.b(h) * h


def test_a_pass_with_other_ops_falls_back_to_the_copy():
    torch.manual_seed(1)
    m = Flaky()
    ref = copy.deepcopy(m)
    g = _eager([m], shape=(4, 32))[0]
    x = torch.randn(4, 32, requires_grad=True)
    g(x).sum().backward()
    ref(x.detach().clone().requires_grad_()).sum().backward()
    assert same(grads([m]), grads([ref]))
    off = vt.offload_of(g)
    assert off.placement()["copy"] < off.saved_bytes()["moved"]
    m.extra = ref.extra = True
    for q in (m, ref):
        q.zero_grad(set_to_none=True)
    g(x).sum().backward()
    ref(x.detach().clone().requires_grad_()).sum().backward()
    assert same(grads([m]), grads([ref]))
    why = off.placement()["why"]
    # the extra linear has the same weight and input shapes: it took the
    # slot, the region was copied over it, as the reason says
    assert any("another output" in w for w in why), why


class Partial(torch.nn.Module):
    """Saves a small slice of a large tensor: placing the whole storage would
    move bytes no backward needs, so it is copied."""

    def forward(self, x):
        big = x.repeat(1, 16)               # 8 x 512
        s = big[:2]                          # a quarter of it, saved by the mul
        return x + (s * s).sum() + x.exp()   # exp saves its output: born in the slot


def test_a_storage_saved_in_part_is_copied_and_says_why():
    g = _eager([Partial()], shape=(8, 32))[0]
    g(torch.randn(8, 32, requires_grad=True)).sum().backward()
    off = vt.offload_of(g)
    p = off.placement()
    assert p["placed"] == 8 * 32 * 4
    assert any("cover 4096 of the storage's 16384 bytes" in w for w in p["why"]), p["why"]
    assert "born there" in off.describe()


def test_kept_tensors_live_in_a_resident_slot_only_from_forward_to_backward():
    """What stays on the device (mode "none" here; the planner's or the
    fraction's leftovers alike) is born in the layer's resident slot, mapped
    for the forward and given back after the backward, as eager frees it
    (without the memory plan, and before it is made: test_memplan.py)."""
    base = zoo_layers(2)
    ref = copy.deepcopy(base)
    g = _eager(base, "none", memory_plan=False)
    off = vt.offload_of(g[0])
    res = [lay.resident for lay in off.layers]
    assert all(b is not None for b in res)
    x = torch.randn(2, 8, 32, requires_grad=True)
    gy = torch.randn(2, 8, 32)
    for it in range(2):
        y = g[1](g[0](x))
        assert all(b.slot.state == "mapped" for b in res)
        (y * gy).sum().backward()
        step(ref, x.detach().clone().requires_grad_(), gy)
        assert same(grads(base), grads(ref)), it
        off.runtime.stream_synchronize(None)
        t0 = time.monotonic()
        while any(b.slot.state != "reserved" for b in res) and time.monotonic() - t0 < 5:
            time.sleep(0.002)
        assert all(b.slot.state == "reserved" for b in res), [b.slot.state for b in res]
        for m in base + ref:
            m.zero_grad(set_to_none=True)


def test_an_op_that_returns_more_than_tensors_is_not_placeable():
    assert place.placeable(torch.ops.aten.mul.Tensor)
    assert place.placeable(torch.ops.aten.native_layer_norm.default)         # three tensors
    assert not place.placeable(torch.ops.aten.split.Tensor)                  # a list of them
    flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None)
    if flash is not None:                                                    # tensors, then sizes and seeds
        assert not place.placeable(flash.default)


@pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")
def test_a_region_its_op_cannot_place_takes_no_bytes_of_the_resident_slot(monkeypatch):
    """A kept region whose op cannot write it in the resident slot (SDPA's
    flash and cuDNN kernels on a GPU; here the mul ops, said to be such) stays
    where its op allocated it: the slot holds the others alone, instead of
    reserving bytes nothing is born in, and the gradients stay right."""
    base = zoo_layers(2)
    ref = copy.deepcopy(base)
    g0 = _eager(copy.deepcopy(base), "none", memory_plan=False)
    whole = [lay.resident.nbytes for lay in vt.offload_of(g0[0]).layers]
    vt.offload_of(g0[0]).close()
    real = place.placeable
    monkeypatch.setattr(place, "placeable", lambda f: f is not torch.ops.aten.mul.Tensor and real(f))
    g = _eager(base, "none", memory_plan=False)
    off = vt.offload_of(g[0])
    try:
        for lay, n in zip(off.layers, whole):
            muls = [r for r in lay.regions if r.birth is not None and not r.birth.placeable]
            assert muls and all(r.resident is None for r in muls)
            assert lay.resident is None or lay.resident.nbytes < n
            slot = sum(r.nbytes for r in lay.kept_resident())
            assert slot and all(r.birth.placeable for r in lay.kept_resident())
        x = torch.randn(2, 8, 32, requires_grad=True)
        gy = torch.randn(2, 8, 32)
        for it in range(2):
            (g[1](g[0](x)) * gy).sum().backward()
            step(ref, x.detach().clone().requires_grad_(), gy)
            assert same(grads(base), grads(ref)), it
            for m in base + ref:
                m.zero_grad(set_to_none=True)
    finally:
        off.close()


@pytest.mark.parametrize("shape", ["llama", "launch"])
def test_the_bench_layers_place_every_saved_output_without_a_copy_of_its_own(shape, monkeypatch):
    """Each placement of the benchmark's torch-ops layers goes by a kernel of
    the op's own out= overload, or as the copy_ or clamp_min the op is: no
    generated out= (a temporary, then a copy), no output computed and then
    copied in. Those copies were invisible in placement() ("placed") and
    cost Llama's forward 288 MiB of device copies a layer (clone.out,
    _unsafe_view). Attention stays out: its CPU kernel returns tensors
    alone and is copied here, the CUDA ones are not placeable."""
    from vmmrt.torch.bench import shapes
    spec = shapes.SHAPES[shape].smoke("cpu")
    layers, dims = shapes.build(spec, "cpu", torch.float32)
    g = vt.make_graphed_callables(tuple(layers), tuple((torch.randn(*dims, requires_grad=True),) for _ in layers),
                                  graphs=False, mode="none", min_bytes=0, options={"host_granularity": 4096})
    routes = []
    real = place.Mode._place

    def watched(self, func, key, args, kwargs, want, sig):
        out = real(self, func, key, args, kwargs, want, sig)
        routes.append((func, kwargs, [p.how for p in want], any(p.birth.dtype.is_floating_point for p in want)))
        return out
    monkeypatch.setattr(place.Mode, "_place", watched)
    x = torch.randn(*dims, requires_grad=True)
    y = x
    for m in g:
        y = m(y)
    y.sum().backward()
    assert routes
    # (torch 1.13's repeat_interleave makes its index with an op of its own: integers, not activations)
    bad = [(str(f), hows) for f, kw, hows, act in routes if act and "scaled_dot_product" not in str(f) and not (
        place.writer(f, kw) is not None or place.writes_at_target(f, "cpu"))]
    assert not bad, bad
