# SPDX-License-Identifier: LGPL-2.1-or-later
"""The saved-tensor hooks: what stays, what moves, one copy per storage region."""
import gc
import weakref

import pytest
import torch

import vmmrt
from vmmrt.torch import saved
from vmmrt.torch.saved import Recorder

from conftest import Zoo


def record(fn, *args, device_type="cpu", static=frozenset(), plan=None):
    rec = Recorder("L", device_type, static, plan=plan, keep_all=plan is None)
    with rec.hooks():
        out = fn(*args)
    return rec, out


def test_views_of_one_storage_are_one_region():
    w = torch.randn(8, 24)

    def f(x):
        q, k, v = (x @ w).chunk(3, -1)            # three views of one projection
        return (q * k).sum() + (v.t() * 2).sum() + (v * v).sum()  # v, then v twice

    x = torch.randn(4, 8, requires_grad=True)
    rec, _ = record(f, x)
    rec.finish()
    proj = [e for e in rec.entries if e.kind == "view" and e.shape == (4, 8)]
    assert len(proj) == 4                         # q, k, v, v (v * v saves v twice... as one view, once per use)
    assert len({e.region for e in proj}) == 1     # all on one region
    r = rec.regions[proj[0].region]
    assert r.nbytes == 4 * 24 * 4                 # the storage of the projection, once
    assert rec.view_bytes() > r.nbytes            # the views add up to more than what stands behind them


def test_transposed_view_is_rebuilt_with_its_strides():
    def f(x):
        t = x.t()                                 # non-contiguous
        return (t * t).sum()

    x = torch.randn(3, 5, requires_grad=True)
    y = x * 2
    rec, _ = record(f, y)
    rec.finish()
    e = [e for e in rec.entries if e.kind == "view"][0]
    assert e.shape == (5, 3) and e.stride == (1, 5)


def test_parameters_and_other_devices_and_empty_tensors_stay():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    rec, _ = record(lambda a: lin(a).sum() + (a[:, :0] * a[:, :0]).sum(), x, static={p.data_ptr() for p in lin.parameters()})
    kinds = {e.kind for e in rec.entries}
    assert "keep:static" in kinds or "keep:param" in kinds
    assert "keep:empty" in kinds
    rec2, _ = record(lambda a: (a * a).sum(), x, device_type="cuda")  # CPU tensors in a CUDA run
    assert {e.kind for e in rec2.entries} == {"keep:device"}


def test_marked_tensors_stay():
    x = torch.randn(4, 4, requires_grad=True)

    def f(a):
        h = a * 2
        vt_mark = vmmrt.torch.mark_not_offload
        vt_mark(h)
        with vmmrt.torch.no_offload():
            g = torch.exp(a)
        return (h * h).sum() + g.sum()

    rec, _ = record(f, x)
    # h twice (h * h) and exp's output; 2 itself is saved as a 0-dim tensor by a * 2
    assert [e.kind for e in rec.entries if e.shape == (4, 4)] == ["keep:marked"] * 3


def test_marking_a_quantized_tensor_marks_its_data():
    """TransformerEngine's quantized tensors hold their bytes in data tensors
    (get_data_tensors), which TE's own mark_not_offload marks: so does ours."""
    data, scale = torch.randn(4, 4), torch.randn(4)

    class Quantized:
        def get_data_tensors(self):
            return data, None, scale

    vmmrt.torch.mark_not_offload(Quantized())
    assert getattr(data, "_vmmrt_keep", False) and getattr(scale, "_vmmrt_keep", False)


def test_every_dtype_autograd_saves():
    x = torch.randn(2, 8, 32, requires_grad=True)
    rec, _ = record(lambda a: Zoo()(a).sum(), x)
    dtypes = {e.dtype for e in rec.entries if e.kind == "view"}
    assert {torch.bool, torch.int64, torch.bfloat16, torch.float32} <= dtypes


def test_pack_returns_an_alias_not_the_tensor():
    x = torch.randn(4, requires_grad=True)
    rec = Recorder("L", "cpu", keep_all=True)
    y = torch.exp(x)                              # exp saves its output
    p = rec.pack(y)
    assert p.alias is not y and p.alias.grad_fn is None and p.alias.data_ptr() == y.data_ptr()


def test_a_pass_leaks_nothing():
    """A pack hook that returned the tensor itself would keep every tensor saved
    as an op's output alive through a C++ cycle gc cannot see."""
    x = torch.randn(64, 64, requires_grad=True)
    refs = []
    for _ in range(3):
        rec = Recorder("L", "cpu", keep_all=True)
        with rec.hooks():
            y = torch.exp(torch.rsqrt(x * x + 1))
        rec.finish([y])
        rec.release()
        y.sum().backward()
        refs.append(weakref.ref(y))
        del y, rec
    gc.collect()
    assert all(r() is None for r in refs)


def test_regions_start_on_512_bytes_of_their_storage():
    base = torch.randn(1000)
    rec, _ = record(lambda a: (a[300:400] * a[300:400]).sum(), base.requires_grad_())
    rec.finish()
    r = rec.regions[0]
    assert r.lo % saved.REGION_ALIGN == 0 and r.lo <= 300 * 4 and r.hi == 400 * 4


def test_outputs_are_not_offloaded():
    x = torch.randn(8, requires_grad=True)
    rec, out = record(lambda a: torch.exp(a), x)
    rec.finish([out])
    assert [r.reason for r in rec.regions] == [None, "output"][-len(rec.regions):] or \
        any(r.reason == "output" for r in rec.regions)


def test_drift_from_discovery_is_a_named_mismatch():
    x = torch.randn(4, 6, requires_grad=True)
    plan, _ = record(lambda a: (a * 2).t().exp().sum(), x)
    plan.finish()
    # Same bytes, another view: the C library cannot see it, the signature does.
    with pytest.raises(vmmrt.Error) as e:
        record(lambda a: (a * 2).exp().sum(), x, plan=plan)
    assert e.value.name == "VMMRT_E_MISMATCH"
    assert "layer 'L'" in str(e.value) and "where discovery saw" in str(e.value)
    # One more tensor than discovery saw.
    with pytest.raises(vmmrt.Error) as e:
        record(lambda a: ((a * 2).t().exp() * a).sum(), x, plan=plan)
    assert e.value.name == "VMMRT_E_MISMATCH"


def test_in_place_change_after_saving_is_refused():
    x = torch.randn(4, requires_grad=True)
    rec = Recorder("L", "cpu", keep_all=True)
    with rec.hooks():
        y = x * 2
        z = y * y
        y.add_(1)                                 # autograd alone would refuse at backward
    with pytest.raises(RuntimeError) as e:         # autograd's own error, and a vmmrt.Error naming the layer
        rec.finish([z])
    assert isinstance(e.value, vmmrt.Error) and "layer 'L'" in str(e.value)
    assert "modified by an inplace operation" in str(e.value)


def test_originals_stay_alive_until_the_pass_ends():
    """A freed original's address could come back for the next tensor of the same
    shape and merge two regions discovery saw apart."""
    x = torch.randn(256, requires_grad=True)
    rec = Recorder("L", "cpu", keep_all=False, plan=None)
    rec.keep_all = True
    with rec.hooks():
        for _ in range(4):
            (torch.exp(x * 1.0) * 3).sum()        # each temporary dies at once without the recorder
    rec.finish()
    # exp saves its output: one region per iteration, none merged
    assert len([r for r in rec.regions if r.storage_nbytes == 256 * 4]) == 4


def test_a_mismatch_says_what_differs_even_the_storage_size_alone():
    # The same dtype, shape, strides and offset over a larger storage
    # (big[:4] against a tensor of its own): describe() is the same text
    # twice, so the message says what differs.
    x = torch.randn(4, 6, requires_grad=True)
    plan, _ = record(lambda a: (a * a).sum(), x)
    plan.finish()
    big = torch.randn(10, 6, requires_grad=True)
    with pytest.raises(vmmrt.Error) as e:
        record(lambda a: (a * a).sum(), big[:4], plan=plan)
    msg = str(e.value)
    assert e.value.name == "VMMRT_E_MISMATCH" and "storage size in bytes %d, not %d" % (10 * 6 * 4, 4 * 6 * 4) in msg
    with pytest.raises(vmmrt.Error) as e:
        record(lambda a: (a * a).sum(), big[1:5], plan=plan)
    assert "byte offset in its storage 24, not 0" in str(e.value)
    assert "storage size in bytes 240, not 96" in str(e.value)
