# SPDX-License-Identifier: LGPL-2.1-or-later
"""A layer's backward temporaries in its resident slot's bytes that the
backward has read for the last time (vmmrt.torch.reuse): the first-fit
arithmetic on made-up lives, the timeline discovery records, and on the
host backend over graphs that capture nothing (test_call_path's harness:
a capture runs its body, so its values are real) the gradients the
captures compute, bitwise those without reuse; a plan that would
overwrite a region still to be read is caught and captured again."""
import contextlib

import pytest
import torch

from test_call_path import _Graph, _graphed_on_host
from vmmrt import Error
from vmmrt.torch import graphed, place, reuse

pytestmark = pytest.mark.skipif(not reuse.AVAILABLE, reason="torch without TorchDispatchMode or storage weak refs")

A = 512


# ---------------------------------------------------------------- plan()

def test_a_temporary_born_after_a_regions_last_read_takes_its_bytes():
    # region [0, 4A) last read at op 3; a temporary of op 5..9 fits there
    assert reuse.plan(4 * A, [(0, 4 * A, 3)], [("t", 4 * A, 5, 9)]) == {"t": 0}


def test_a_temporary_born_at_or_before_the_last_read_does_not():
    assert reuse.plan(4 * A, [(0, 4 * A, 5)], [("t", 4 * A, 5, 9)]) == {}
    assert reuse.plan(4 * A, [(0, 4 * A, 5)], [("t", 4 * A, 2, 9)]) == {}


def test_temporaries_alive_together_take_distinct_bytes_and_ones_that_follow_share():
    regions = [(0, 8 * A, 0)]
    t = [("a", 4 * A, 1, 5), ("b", 4 * A, 3, 7), ("c", 4 * A, 6, 9), ("d", 4 * A, 4, 8)]
    where = reuse.plan(8 * A, regions, t)
    # a and b overlap in life: side by side; c follows a (dead at 5 < 6); d fits nowhere
    assert where == {"a": 0, "b": 4 * A, "c": 0}


def test_bytes_of_no_region_are_free_at_every_op_and_static_inputs_never_are():
    regions = [(2 * A, 4 * A, reuse.NEVER)]
    where = reuse.plan(6 * A, regions, [("a", 2 * A, 0, 1), ("b", 2 * A, 0, 1), ("c", A, 0, 1)])
    assert where == {"a": 0, "b": 4 * A}
    assert "c" not in where          # the slot is full: the gap is taken, the input never frees


def test_a_temporary_spans_several_dead_regions_and_sizes_round_to_the_alignment():
    regions = [(0, A, 1), (A, 2 * A, 2), (2 * A, 3 * A, 8)]
    assert reuse.plan(3 * A, regions, [("a", 2 * A - 7, 3, 4)]) == {"a": 0}
    assert reuse.plan(3 * A, regions, [("a", 2 * A + 1, 3, 4)]) == {}    # 3 granules: the last is live


# ------------------------------------------------------------ Timeline

def test_the_timeline_has_each_temporarys_life_and_each_saved_storages_last_read():
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, 64, requires_grad=True)
    with place.Mode("cpu") as fwd:
        h = torch.tanh(x @ w)            # saves x, w (mm) and h (tanh)
        y = (h * h).sum()
    tl = reuse.timeline_for(fwd)
    with place.Mode("cpu", observer=tl):
        y.backward()
    names = {k[0][0]: v for k, v in tl.born.items()}
    assert "aten.tanh_backward.default" in names and "aten.mm.default" in names
    tb = next(k for k in tl.born if k[0][0] == "aten.tanh_backward.default")
    # tanh's gradient is read by both mm's of matmul's backward, then freed
    assert tb in tl.died and tl.died[tb] > tl.born[tb][0]
    h_key = next(k for k in tl.last_use if k[0][0] == "aten.tanh.default")
    assert tl.last_use[h_key] <= tl.born[tb][0]      # h is read by tanh's backward, before its output exists
    # what outlives the backward (x.grad, w.grad) is no temporary
    assert all(bk in tl.died for bk, *_ in tl.transients(0))
    assert len(tl.transients(0)) < len(tl.born)


def test_an_output_at_the_address_of_a_storage_freed_since_the_last_op_is_a_birth(monkeypatch):
    """The caching allocator gives the block an op's input freed (the
    engine let it go after the op before) to the next output of its size:
    that output is a birth, and the freed storage died then. With the
    addresses the allocator picks, which vary with the process's history,
    such births went unrecorded (a temporary left in the pool, a gradient
    whose first write was unknown and shared nothing)."""
    class Storage:
        def __init__(self, ptr):
            self.ptr, self.dead = ptr, False

        def data_ptr(self):
            return self.ptr

        def nbytes(self):
            return 4 << 20

    class Tensor:
        def __init__(self, st):
            self.st = st

        def untyped_storage(self):
            return self.st

    class Ref:
        def __init__(self, st):
            self.st = st

        def expired(self):
            return self.st.dead

    monkeypatch.setattr(reuse, "StorageWeakRef", Ref)
    mm = torch.ops.aten.mm.default
    tl = reuse.Timeline({}, "cpu")
    a = Storage(0x10000)
    tl.after(0, ("aten.mm.default", 0), mm, [(0, Tensor(a))])
    a.dead = True                               # freed after op 0 ...
    b = Storage(0x10000)                        # ... and op 1's output takes its block
    tl.after(1, ("aten.mm.default", 1), mm, [(0, Tensor(b))])
    b.dead = True
    tl.after(2, ("aten.mm.default", 2), mm, [])
    a_key, b_key = (("aten.mm.default", 0), 0), (("aten.mm.default", 1), 0)
    assert tl.died[a_key] == 1
    assert tl.born[b_key][0] == 1 and tl.died[b_key] == 2
    assert [t[0] for t in tl.transients(0)] == [a_key, b_key]


def test_a_temporary_whose_out_overload_only_copies_is_left_in_the_pool():
    """mul.Scalar's out= is generated (the op into a temporary, then a copy):
    placing it would add a kernel to the graph and save nothing. (pow's
    backward is grad * (2 * x): a mul.Scalar.)"""
    x = torch.randn(64, 64, requires_grad=True)
    with place.Mode("cpu") as fwd:
        y = torch.tanh(x).pow(2).sum()
    tl = reuse.timeline_for(fwd)
    with place.Mode("cpu", observer=tl):
        y.backward()
    ok = {k[0][0]: v[2] for k, v in tl.born.items()}
    assert ok["aten.tanh_backward.default"]
    assert ok["aten.mul.Scalar"] is False
    assert all(k[0][0] != "aten.mul.Scalar" for k, *_ in tl.transients(0))


def _everywhere():
    """A Guard over every address: each op's fresh output is a temporary."""
    return reuse.Guard(0, 1 << 64)


def test_the_view_matmul_makes_of_a_temporary_reads_that_temporary():
    """matmul over a 3-D input returns aten._unsafe_view of its mm's output,
    a view with no ``_base``: megatron-core's backward reads one
    (grad_output.matmul(weight)), and the guard took it for other bytes
    over the temporary's and dropped every layer's plan (H100)."""
    a = torch.randn(2, 8, 16)
    w = torch.randn(16, 16)
    g = _everywhere()
    with place.Mode("cpu", observer=g):
        y = torch.matmul(a, w)          # mm's output: the temporary; y: its alias
        assert y._base is None
        z = y * 2                       # reads the temporary through the alias
        v = y.view(16, 16)              # a view of the alias
        s = v.sum()
    assert g.violation is None
    assert torch.equal(z, (a @ w) * 2) and s.item() == pytest.approx((a @ w).sum().item(), rel=1e-5)


def test_other_bytes_over_a_temporarys_are_still_caught():
    """A tensor over a temporary's bytes that is not one of its views (a
    saved region the temporary overwrote) reads what was overwritten."""
    a = torch.randn(2, 8, 16)
    w = torch.randn(16, 16)
    g = _everywhere()
    with pytest.raises(reuse.Overwritten):
        with place.Mode("cpu", observer=g):
            y = torch.matmul(a, w)
            other = torch.empty(0).set_(y.untyped_storage(), 0, (256,), (1,))
            other + 1
    assert g.violation is not None


# ------------------------------------------ the captures, on the host backend

@pytest.fixture
def host(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(reuse, "MIN_BYTES", 0)       # the test layers' temporaries are small
    # the backward graphs' output gradients: known values, not the slot's zeros
    real = graphed._grad_outputs

    def seeded(r, g, base):
        out, fits = real(r, g, base)
        gen = torch.Generator().manual_seed(100 + r.index)
        for t in out:
            if t is not None:
                t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype))
        return out, fits
    monkeypatch.setattr(graphed, "_grad_outputs", seeded)
    # A capture here runs its ops: the write graph's temporaries would be in
    # the regions when the accumulate graph's capture reads them. On the
    # device a capture runs nothing, and a forward comes before each
    # backward: each backward capture finds the regions as the forward left them.
    real_capture = graphed._capture

    def capture(r, what, graph, pool, stream, error_mode, body, guard=None):
        res = r.layer.resident
        keep = res.tensor(None, counted=False).clone() if res is not None and what.startswith("backward") else None
        try:
            out = real_capture(r, what, graph, pool, stream, error_mode, body, guard)
            if what.startswith("backward"):
                # what it computed, as it computed it: the slots go after the captures
                grads = [p.grad for p in r.params] if "accumulate" in what else []
                _COMPUTED[(r.index, what)] = [t.clone() for t in tuple(out) + tuple(grads) if t is not None]
            return out
        finally:
            if keep is not None:
                res.tensor(None, counted=False).copy_(keep)
    monkeypatch.setattr(graphed, "_capture", capture)
    return monkeypatch


_COMPUTED = {}


def _captured(enabled):
    """The gradients each backward capture computed (the write graph's, then
    the accumulate graph's: its sum into them), by runner and capture, and
    each layer's plan."""
    reuse.ENABLED = enabled
    _COMPUTED.clear()
    try:
        g, off, runners = _graphed_on_host("none", "mapped", inputs=True)
    finally:
        reuse.ENABLED = True
    try:
        _captured.stats, _captured.text = off.stats(), off.describe()
        _captured.acc = [r.layer.reuse_acc for r in runners]
        _captured.params = [{(b.key, b.out) for b, _ in r.grads.regions} for r in runners]
        return dict(_COMPUTED), [r.layer.reuse for r in runners]
    finally:
        graphed._close(off, runners)


def _same(a, b):
    return a.keys() == b.keys() and all(len(a[k]) == len(b[k]) and all(torch.equal(x, y) for x, y in zip(a[k], b[k]))
                                         for k in a)


def test_the_captured_backward_with_its_temporaries_in_the_slot_computes_bitwise_the_same(host):
    ref, none = _captured(False)
    got, plans = _captured(True)
    assert all(p is None for p in none)
    assert all(p is not None and p.placed_bytes > 0 and p.fallback is None for p in plans)
    st = _captured.stats
    acc = _captured.acc     # the accumulate graph's: the parameters' gradients are temporaries there too
    assert all(p is not None and p.placed_bytes == p.nbytes > 0 for p in acc)
    assert all(any((b.key, b.out) in keys for b, _, _ in p.items) for p, keys in zip(acc, _captured.params))
    assert st["reuse_bytes"] == sum(p.placed_bytes for p in plans + acc) and st["reuse_layers"] == len(plans)
    assert st["reuse_fallbacks"] == 0 and "the backwards' temporaries" in _captured.text
    assert 0 < st["reuse_peak_bytes"] <= max(p.nbytes for p in plans + acc)
    assert len(ref) == 8 and all(any(x.abs().sum() > 0 for x in v) for v in ref.values())
    assert _same(got, ref)


_PLAN = reuse.plan


def _greedy(slot_bytes, regions, transients, align=reuse.REGION_ALIGN):
    """reuse.plan with every region counted dead from the start: plans that
    take bytes of regions the backward still reads."""
    return _PLAN(slot_bytes, [(s, e, -1 if lu != reuse.NEVER else lu) for s, e, lu in regions], transients, align)


def _overwriting(monkeypatch):
    monkeypatch.setattr(reuse, "plan", _greedy)


def test_a_plan_that_overwrites_a_region_still_read_is_caught_and_captured_again_without_it(host):
    ref, _ = _captured(False)
    _overwriting(host)
    got, plans = _captured(True)
    assert any(p is not None and p.fallback for p in plans)
    assert _captured.stats["reuse_fallbacks"] == sum(1 for p in plans if p is not None and p.fallback)
    assert "captured again without it" in _captured.text
    assert _same(got, ref)


def test_without_the_guard_that_plan_computes_other_gradients(host):
    """The test above can fail: unguarded, the same plans change the values."""
    ref, _ = _captured(False)
    _overwriting(host)
    host.setattr(reuse.Guard, "before", lambda self, i, tensors: None)
    try:
        got, plans = _captured(True)
    except Error as e:          # an index read from overwritten bytes (the layers gather)
        assert "out of bounds" in str(e)
        return
    assert all(p is None or p.fallback is None for p in plans)
    assert not _same(got, ref)


def test_an_accumulate_capture_stopped_by_its_guard_is_made_again_from_the_same_graph(host):
    """The accumulate graph's capture runs after the write graph's: stopped
    half-way, it must not have freed what both captures made again read."""
    ref, _ = _captured(False)
    real_targets = graphed._reuse_targets
    calls = {}

    def targets(r, reusing):
        calls[r.index] = calls.get(r.index, 0) + 1
        if reusing and calls[r.index] == 2:         # the accumulate graph's, with the first plan only
            reuse.plan = _greedy
            try:
                reusing = reuse.layer_plan(r.layer, *r.layer.timeline)
            finally:
                reuse.plan = _PLAN
        return real_targets(r, reusing)
    host.setattr(graphed, "_reuse_targets", targets)
    got, plans = _captured(True)
    assert any(p is not None and p.fallback for p in plans)
    assert _same(got, ref)


def test_a_target_with_an_op_index_is_placed_at_that_index_only():
    """Placed.at holds in a Mode with no observer too: the index is counted
    whenever a target names one (in-place ops share the next op's)."""
    a = torch.randn(256, 256)

    def f():
        h = torch.mm(a, a)
        h.add_(1.0)
        return torch.mm(h, a)
    tl = reuse.Timeline({}, "cpu")
    with place.Mode("cpu", observer=tl) as disc:
        ref = f()
    key = (("aten.mm.default", 1), 0)
    assert tl.born[key][0] == 1          # the add_ took no index of its own
    birth = disc.by_key[key]
    for at, placed in ((1, True), (2, False)):
        slot = torch.zeros(birth.storage_nbytes, dtype=torch.uint8)
        p = place.Placed(birth, place.tensor_over(slot, birth.dtype, birth.shape, birth.stride, birth.offset))
        p.at, p.copy = at, False
        with place.Mode("cpu", [p], disc.by_key):
            out = f()
        assert (p.how == "placed") == placed
        assert (out.data_ptr() == slot.data_ptr()) == placed and torch.equal(out, ref)
