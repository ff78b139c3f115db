# SPDX-License-Identifier: LGPL-2.1-or-later
"""Autograd's and make_graphed_callables' contracts, kept on the host backend
(graphs=False, the code the GPU runs too; test_gpu.py has the graphed half):
saved tensors changed in place refused with autograd's own error, inputs of
any layout accepted, a user's mistake leaving the offload usable, every
argument checked, an explicit argument beating a VMMRT_* variable."""
import copy

import warnings

import pytest
import torch

import vmmrt
import vmmrt.torch as vt
from vmmrt.torch import pipeline

from conftest import grads, same
from test_pipeline import MLP, Pipe, batches, bitwise, param_grads, sequential, zero

SHAPE = (4, 16, 64)
INPLACE = "modified by an inplace operation"


class Block(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)
        self.armed = False

    def forward(self, x):
        if self.armed:
            raise ValueError("armed")
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Exp(torch.nn.Module):
    """Saves its output (exp's backward reads it)."""

    def __init__(self, d=64):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x).exp()


def build(n=1, cls=Block, seed=0, **kw):
    torch.manual_seed(seed)
    base = [cls() for _ in range(n)]
    ref = copy.deepcopy(base)
    kw.setdefault("min_bytes", 0)
    g = vt.make_graphed_callables(tuple(base), tuple((torch.randn(*SHAPE, requires_grad=True),) for _ in base),
                                  graphs=False, **kw)
    return base, ref, g


def run(layers, x):
    for m in layers:
        x = m(x)
    return x


def batch(seed):
    torch.manual_seed(seed)
    return torch.randn(*SHAPE, requires_grad=True), torch.randn(*SHAPE)


def clean_step_matches(base, ref, g, seed=7):
    """After a mistake: an iteration runs and its gradients are eager's."""
    zero(base, ref)
    x, gy = batch(seed)
    (run(g, x) * gy).sum().backward()
    xr = x.detach().clone().requires_grad_()
    (run(ref, xr) * gy).sum().backward()
    return same(grads(base), grads(ref)) and torch.equal(x.grad, xr.grad)


# --------------------------------------------- 1. saved tensors' versions

@pytest.mark.parametrize("min_bytes", [0, 1 << 30], ids=["offloaded", "kept"])
def test_a_saved_input_changed_in_place_is_autograds_error(min_bytes):
    base, ref, g = build(2, min_bytes=min_bytes)
    x, gy = batch(1)
    h = x * 2
    y = run(ref, h)                                  # torch itself refuses it
    h.add_(1.0)
    with pytest.raises(RuntimeError, match=INPLACE):
        (y * gy).sum().backward()
    h = x * 2
    y = run(g, h)
    h.add_(1.0)
    with pytest.raises(RuntimeError) as e:
        (y * gy).sum().backward()
    assert INPLACE in str(e.value) and "layer '0:Block'" in str(e.value)
    assert isinstance(e.value, vmmrt.Error)
    assert clean_step_matches(base, ref, g)          # the iteration was abandoned, the next one is eager's
    assert vt.offload_of(g[0]).stats()["aborts"] == 1


@pytest.mark.parametrize("min_bytes", [0, 1 << 30], ids=["offloaded", "kept"])
def test_a_saved_output_changed_in_place_is_autograds_error(min_bytes):
    base, ref, g = build(1, cls=Exp, min_bytes=min_bytes)
    x, gy = batch(2)
    y = g[0](x)
    y.mul_(2.0)
    with pytest.raises(RuntimeError) as e:
        (y * gy).sum().backward()
    assert INPLACE in str(e.value) and "layer '0:Exp'" in str(e.value)
    assert clean_step_matches(base, ref, g)


def test_an_unchanged_saved_tensor_is_not_refused():
    """The check compares versions: reading a saved tensor, or changing a copy, is fine."""
    base, ref, g = build(2)
    x, gy = batch(3)
    h = x * 2
    y = run(g, h)
    h.clone().add_(1.0)
    (y * gy).sum().backward()
    (run(ref, (x * 2)) * gy).sum().backward()
    assert same(grads(base), grads(ref))


# ------------------------------------------------- 2. inputs of any layout

@pytest.mark.parametrize("layout", ["transposed", "view-into-larger", "channels_last"])
def test_inputs_of_any_layout_are_taken_as_torch_takes_them(layout):
    base, ref, g = build(2)
    torch.manual_seed(4)
    if layout == "transposed":
        x = torch.randn(SHAPE[0], SHAPE[2], SHAPE[1]).transpose(1, 2)
    elif layout == "view-into-larger":
        x = torch.randn(SHAPE[0] + 1, *SHAPE[1:])[1:]
    else:
        x = torch.randn(*SHAPE).unsqueeze(0).contiguous(memory_format=torch.channels_last)[0]
    x.requires_grad_()
    gy = torch.randn(*SHAPE)
    for _ in range(2):
        (run(g, x) * gy).sum().backward()
    # torch's make_graphed_callables copies it into its static input: the sample's layout
    xr = x.detach().contiguous().requires_grad_()
    for _ in range(2):
        (run(ref, xr) * gy).sum().backward()
    assert same(grads(base), grads(ref)) and torch.equal(x.grad, xr.grad)


@pytest.mark.parametrize("what", ["dtype", "shape", "device"])
def test_another_dtype_shape_or_device_names_the_argument_and_the_sample(what):
    base, ref, g = build(1)
    if what == "dtype":
        x, want = torch.randn(*SHAPE, dtype=torch.float64, requires_grad=True), "float64"
    elif what == "shape":
        x, want = torch.randn(2, *SHAPE[1:], requires_grad=True), "[2, 16, 64]"
    else:
        x, want = torch.randn(*SHAPE, device="meta", requires_grad=True), "meta"
    with pytest.raises(vmmrt.Error) as e:
        g[0](x)
    msg = str(e.value)
    assert e.value.name == "VMMRT_E_MISMATCH" and "layer '0:Block'" in msg
    assert "argument 0 ('x')" in msg and want in msg and "float32 [4, 16, 64] on cpu" in msg and what in msg
    assert clean_step_matches(base, ref, g)


def test_a_keyword_argument_is_named_by_its_keyword():
    class Masked(Block):
        def forward(self, x, mask=None):
            return super().forward(x) * mask

    torch.manual_seed(0)
    m = Masked()
    g = vt.make_graphed_callables(m, (torch.randn(*SHAPE, requires_grad=True),), graphs=False, min_bytes=0,
                                  sample_kwargs={"mask": torch.ones(*SHAPE)})
    with pytest.raises(vmmrt.Error) as e:
        g(torch.randn(*SHAPE, requires_grad=True), mask=torch.ones(*SHAPE, dtype=torch.float64))
    assert "keyword 'mask' is float64" in str(e.value) and "the sample was float32" in str(e.value)


# ----------------------------------------------------------- 3. recovery

def test_an_exception_inside_a_forward_abandons_the_iteration_only():
    base, ref, g = build(3)
    x, gy = batch(5)
    y0 = g[0](x)
    base[1].armed = True
    with pytest.raises(ValueError, match="armed"):
        g[1](y0)
    base[1].armed = False
    with pytest.raises(vmmrt.Error) as e:            # the abandoned iteration is gone, and says why
        y0.sum().backward()
    assert e.value.name == "VMMRT_E_INVALID_STATE" and "layer '1:Block'" in str(e.value)
    assert "ValueError: armed" in str(e.value)
    assert clean_step_matches(base, ref, g)


def test_an_exception_inside_a_backward_abandons_the_iteration_only():
    class Fails(torch.autograd.Function):
        armed = False

        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            if Fails.armed:
                raise ArithmeticError("backward armed")
            return g

    class Odd(Block):
        def forward(self, x):
            return Fails.apply(super().forward(x))

    base, ref, g = build(2, cls=Odd)
    x, gy = batch(6)
    Fails.armed = True
    with pytest.raises(ArithmeticError, match="backward armed"):
        (run(g, x) * gy).sum().backward()
    Fails.armed = False
    assert clean_step_matches(base, ref, g)


def test_a_dropped_output_starts_a_new_iteration():
    base, ref, g = build(2)
    x, gy = batch(8)
    old = run(g, x)                                  # never backpropagated (a NaN loss, say)
    x2, gy2 = batch(9)
    (run(g, x2) * gy2).sum().backward()              # "forward of group '0:Block' twice" before
    (run(ref, x2.detach().clone().requires_grad_()) * gy2).sum().backward()
    assert same(grads(base), grads(ref))
    with pytest.raises(vmmrt.Error) as e:
        old.sum().backward()
    assert e.value.name == "VMMRT_E_INVALID_STATE" and "abandoned" in str(e.value)
    assert "called again before the backward of its previous call" in str(e.value)
    assert clean_step_matches(base, ref, g)


def test_a_refused_call_mid_iteration_changes_nothing():
    base, ref, g = build(2)
    x, gy = batch(10)
    y0 = g[0](x)
    with pytest.raises(vmmrt.Error):
        g[1](torch.randn(2, 16, 64, requires_grad=True))
    (g[1](y0) * gy).sum().backward()                 # the iteration goes on
    (run(ref, x.detach().clone().requires_grad_()) * gy).sum().backward()
    assert same(grads(base), grads(ref))


def test_after_a_refused_call_the_next_iteration_may_start_over():
    base, ref, g = build(3)
    x, gy = batch(14)
    y1 = g[1](g[0](x))
    with pytest.raises(vmmrt.Error):
        g[2](torch.randn(2, 16, 64, requires_grad=True))
    assert clean_step_matches(base, ref, g, seed=15)   # from layer 0 again: the iteration in flight is abandoned
    with pytest.raises(vmmrt.Error) as e:
        y1.sum().backward()
    assert "abandoned" in str(e.value)


def test_after_a_call_out_of_the_order_the_next_iteration_may_start_over():
    torch.manual_seed(0)
    base = [MLP(32) for _ in range(2)]
    ref = copy.deepcopy(base)
    order = vt.order_1f1b(4, in_flight=2)
    lay = pipeline.Layout(order, 2, None)
    g = vt.make_graphed_callables(tuple(base), tuple((torch.randn(2, 8, 32, requires_grad=True),)
                                                     for _ in range(lay.n_runners)), order=order, graphs=False,
                                  min_bytes=0)
    xs, gys = batches(4, seed=16)
    Pipe(g, order, xs, gys).run(2)
    with pytest.raises(vmmrt.Error) as e:
        g[2 * 2](xs[2])                               # microbatch 2 before microbatch 0's backward
    assert e.value.name == "VMMRT_E_MISMATCH"
    zero(base)
    xs, gys = batches(4, seed=17)
    Pipe(g, order, xs, gys).run()                     # the first runner again: a new iteration
    sequential(ref, xs, gys)
    assert bitwise(param_grads(base), param_grads(ref))


def test_a_drifted_layer_abandons_its_iteration_eagerly():
    class Drift(Block):
        flip = False

        def forward(self, x):
            h = self.up(x)
            e = h.transpose(-1, -2).exp().transpose(-1, -2) if self.flip else h.exp()   # other strides saved
            return x + self.down(e)

    base, ref, g = build(1, cls=Drift)
    base[0].flip = True
    with pytest.raises(vmmrt.Error) as e:
        g[0](batch(11)[0])
    assert e.value.name == "VMMRT_E_MISMATCH" and "where discovery saw" in str(e.value)
    base[0].flip = False
    assert clean_step_matches(base, ref, g)


# ---------------------------------------------------------- 4. arguments

@pytest.mark.parametrize("kw, err, words", [
    (dict(lookahead="2"), TypeError, "lookahead='2'"),
    (dict(lookahead=True), TypeError, "lookahead=True"),
    (dict(num_warmup_iters=1.5), TypeError, "num_warmup_iters"),
    (dict(allow_unused_input=1), TypeError, "allow_unused_input"),
    (dict(graphs="no"), TypeError, "graphs="),
    (dict(names="a"), TypeError, "names="),
    (dict(options=[("mode", "remap")]), TypeError, "options="),
    (dict(min_bytes=-1), TypeError, "min_bytes"),
    (dict(margin="0.9"), TypeError, "margin"),
    (dict(capture_error_mode="bogus"), ValueError, "'global', 'thread_local', 'relaxed'"),
    (dict(pool=(0, 1)), ValueError, "graphs=False"),
    (dict(capture_error_mode="relaxed"), ValueError, "graphs=False"),
    (dict(grads="accumulate"), ValueError, "graphs=False"),
])
def test_every_argument_is_checked(kw, err, words):
    torch.manual_seed(0)
    with pytest.raises(err) as e:
        vt.make_graphed_callables(Block(), (torch.randn(*SHAPE, requires_grad=True),), graphs=kw.pop("graphs", False),
                                  **kw)
    assert words in str(e.value)


def test_callables_and_offload_arguments_are_checked():
    m = [Block(), Block()]
    with pytest.raises(TypeError, match="callables is a list: pass a tuple"):
        vt.make_graphed_callables(m, tuple((torch.randn(*SHAPE, requires_grad=True),) for _ in m), graphs=False)
    with pytest.raises(TypeError, match="callable 1 is a int"):
        vt.make_graphed_callables((m[0], 3), tuple((torch.randn(*SHAPE, requires_grad=True),) for _ in m),
                                  graphs=False)
    with pytest.raises(TypeError, match="lookahead='2'"):
        vt.Offload(device="cpu", lookahead="2")
    with pytest.raises(TypeError, match="min_bytes"):
        vt.Offload(device="cpu", min_bytes=None)


def test_the_same_module_twice_is_refused_naming_both():
    m = Block()
    with pytest.raises(ValueError) as e:
        vt.make_graphed_callables((m, Block(), m), tuple((torch.randn(*SHAPE, requires_grad=True),) for _ in range(3)),
                                  graphs=False, names=["a", "b", "c"])
    assert "callables 0 ('a') and 2 ('c') are the same module" in str(e.value)


def test_an_explicit_argument_beats_the_environment(monkeypatch):
    monkeypatch.setenv("VMMRT_MODE", "remap")
    monkeypatch.setenv("VMMRT_LOOKAHEAD", "3")
    _, _, g = build(1, mode="pingpong", lookahead=0)
    off = vt.offload_of(g[0])
    assert off.mode == "pingpong" and off.lookahead == 0
    assert off.runtime.info()["mode"] == "pingpong"
    off.close()
    # what the package leaves unset, the environment still fills
    monkeypatch.setenv("VMMRT_HOST_GRANULARITY", "8K")
    _, _, g = build(1)
    assert vt.offload_of(g[0]).granularity == 8192
    vt.offload_of(g[0]).close()
    # and the library's own precedence, when asked for
    _, _, g = build(1, mode="pingpong", options={"environment": "override"})
    assert vt.offload_of(g[0]).mode == "remap"


@pytest.mark.parametrize("var,value,says", [
    ("VMMRT_MODE", "ping-pong", "mode (VMMRT_MODE): 'ping-pong' is not one of pingpong, remap, none"),
    ("VMMRT_MODE", "off", "mode (VMMRT_MODE): 'off' is not one of"),
    ("VMMRT_LOOKAHEAD", "-3", "lookahead (VMMRT_LOOKAHEAD): '-3'"),
])
@pytest.mark.parametrize("given", [{}, {"mode": "pingpong", "lookahead": 1}])
def test_a_malformed_variable_is_the_librarys_error_even_beside_an_argument(monkeypatch, var, value, says, given):
    """As the C tools refuse it (the library parses every VMMRT_* variable),
    whether or not an argument would have won over it."""
    monkeypatch.setenv(var, value)
    with pytest.raises(vmmrt.InvalidValue) as e:
        build(1, **given)
    assert e.value.name == "VMMRT_E_INVALID_OPTION" and says in str(e.value), str(e.value)
    with pytest.raises(vmmrt.InvalidValue, match=var):
        vt.Offload(device="cpu", **given)
    # "ignore" reads nothing, not even to check it
    _, _, g = build(1, options={"environment": "ignore"}, **given)
    vt.offload_of(g[0]).close()


def test_a_valid_variable_applies_when_the_argument_is_left_out(monkeypatch):
    monkeypatch.setenv("VMMRT_MODE", "remap")
    monkeypatch.setenv("VMMRT_LOOKAHEAD", "2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # nothing to warn about
        _, _, g = build(1)
        off = vt.offload_of(g[0])
        assert (off.mode, off.lookahead) == ("remap", 2) and off.runtime.info()["mode"] == "remap"
        off.close()
        off = vt.Offload(device="cpu")
        assert (off.mode, off.lookahead) == ("remap", 2)
        off.close()
        # an argument the variable agrees with: nothing to say either
        _, _, g = build(1, mode="remap")
        vt.offload_of(g[0]).close()
    monkeypatch.delenv("VMMRT_MODE")
    monkeypatch.delenv("VMMRT_LOOKAHEAD")
    off = vt.Offload(device="cpu")
    assert (off.mode, off.lookahead) == ("pingpong", 1)       # the defaults
    off.close()


def test_an_argument_against_a_variable_is_one_warning_naming_both(monkeypatch):
    monkeypatch.setenv("VMMRT_MODE", "remap")
    monkeypatch.setenv("VMMRT_LOOKAHEAD", "2")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, _, g = build(1, mode="none", lookahead=0)
    msgs = [str(x.message) for x in w if issubclass(x.category, UserWarning)]
    assert len(msgs) == 1, msgs
    assert "VMMRT_MODE=remap and mode='none'" in msgs[0] and "VMMRT_LOOKAHEAD=2 and lookahead=0" in msgs[0], msgs
    assert "the argument applies" in msgs[0]
    off = vt.offload_of(g[0])
    assert (off.mode, off.lookahead) == ("none", 0)
    off.close()
    with pytest.warns(UserWarning, match="VMMRT_MODE=remap and mode='pingpong': the variable applies"):
        off = vt.Offload(device="cpu", mode="pingpong", options={"environment": "override"})
    assert off.mode == "remap"
    off.close()


def test_transformer_engines_and_megatrons_marks_keep_a_tensor():
    class Marked(Block):
        how = "te"

        def forward(self, x):
            h = self.up(x)
            if self.how == "te":
                h._TE_do_not_offload = True              # transformer_engine.pytorch.mark_not_offload
            else:
                h.offloading_activation = False          # Megatron's mark_not_offloadable
            return x + self.down(torch.sin(h))      # sin saves h

    for how in ("te", "megatron"):
        Marked.how = how
        base, ref, g = build(1, cls=Marked)
        lay = vt.offload_of(g[0]).layers[0]
        assert [e.kind for e in lay.plan.entries if e.shape == (SHAPE[0], SHAPE[1], 128)] == ["keep:marked"], how
        assert clean_step_matches(base, ref, g)


# ------------------------------------ 5. edges that crashed (empty schedules)

@pytest.mark.parametrize("kw", [dict(offload=0.0), dict(min_bytes=1 << 30)], ids=["offload-0", "all-small"])
def test_an_order_where_nothing_moves(kw):
    torch.manual_seed(0)
    base = [MLP(32) for _ in range(2)]
    ref = copy.deepcopy(base)
    order = vt.order_1f1b(2, in_flight=2)
    g = vt.make_graphed_callables(tuple(base), tuple((torch.randn(2, 8, 32, requires_grad=True),) for _ in range(4)),
                                  order=order, graphs=False, **kw)
    xs, gys = batches(2, seed=3)
    Pipe(g, order, xs, gys).run()
    sequential(ref, xs, gys)
    assert bitwise(param_grads(base), param_grads(ref))


# ------------------------------------------ 6. behaviours tested nowhere else

class Tail(torch.nn.Module):
    """Saves a view that starts `start` elements into its storage (h[..., start:])."""
    start = 256

    def __init__(self, d=64):
        super().__init__()
        self.up = torch.nn.Linear(d, 512)
        self.down = torch.nn.Linear(512 - self.start, d)

    def forward(self, x):
        h = self.up(x)
        return x + self.down(torch.sin(h[..., self.start:]))


@pytest.mark.parametrize("start", [256, 200])   # its region starts at the view (1024 bytes in) / 288 bytes before
def test_a_saved_view_past_its_regions_start_is_rebuilt_at_its_offset(start, monkeypatch):
    monkeypatch.setattr(Tail, "start", start)
    base, ref, g = build(1, cls=Tail)
    lay = vt.offload_of(g[0]).layers[0]
    views = [(e, lay.plan.regions[e.region]) for e in lay.plan.entries if e.kind == "view" and e.offset > 0]
    assert views and all(r.selected and r.lo > 0 for e, r in views)
    assert all((e.offset - r.lo) == (288 if start == 200 else 0) for e, r in views)
    for seed in (12, 13):
        assert clean_step_matches(base, ref, g, seed)


def test_the_planners_fraction_is_what_moved():
    base, ref, g = build(3, offload="auto")
    off = vt.offload_of(g[0])
    plan = off.plan
    total = sum(p.total for p in plan.layers)
    for p, lay in zip(plan.layers, off.layers):          # the plan's regions are the layer's candidates
        assert sorted(p.sizes) == sorted(r.nbytes for r in lay.regions if r.reason in (None, "budget"))
    assert plan.fraction == off.saved_bytes()["moved"] / total
    for p, lay in zip(plan.layers, off.layers):
        assert p.moved == lay.saved_bytes()["moved"], p.name
    assert "%.1f%%" % (100 * off.saved_bytes()["moved"] / total) in plan.summary()
    assert clean_step_matches(base, ref, g)


class Bias(torch.nn.Module):
    """Saves nothing (an addition needs none of its inputs)."""

    def __init__(self, d=32):
        super().__init__()
        self.b = torch.nn.Parameter(torch.randn(d))

    def forward(self, x):
        return x + self.b


@pytest.mark.parametrize("mode", ["pingpong", "remap"])
def test_a_pipeline_order_with_a_layer_that_saves_nothing(mode):
    torch.manual_seed(0)
    base = [MLP(32), Bias(32), MLP(32)]
    ref = copy.deepcopy(base)
    order = vt.order_1f1b(4, in_flight=2)
    lay = pipeline.Layout(order, 3, None)
    g = vt.make_graphed_callables(tuple(base), tuple((torch.randn(2, 8, 32, requires_grad=True),)
                                                     for _ in range(lay.n_runners)),
                                  order=order, graphs=False, mode=mode, min_bytes=0)
    off = vt.offload_of(g[0])
    assert any(not l.regions for l in off.layers) and any(l.moving() for l in off.layers)
    for it in range(2):
        xs, gys = batches(4, seed=20 + it)
        Pipe(g, order, xs, gys).run()
        sequential(ref, xs, gys)
        assert bitwise(param_grads(base), param_grads(ref)), it
        zero(base, ref)


def test_auto_weighs_its_plan_by_the_peaks_it_predicts(monkeypatch):
    # copies that hide everything, for no fixed cost: the bandwidth plan
    # moves what it can, then the memory model weighs it against less
    from vmmrt.torch import planner
    monkeypatch.setattr(planner, "copy_bandwidth", lambda off: (1e6, 1e6))
    monkeypatch.setattr(planner, "COPY_FIXED_MS", 0.0)
    seen = []
    real = planner.lightest

    def spy(layers, d2h, peak, granularity=1, **kw):
        p = real(layers, d2h, peak, granularity, **kw)
        seen.append((peak, p))
        return p
    monkeypatch.setattr(planner, "lightest", spy)
    base, ref, g = build(3, offload="auto")
    off = vt.offload_of(g[0])
    (peak, p), = seen
    assert off.plan is p and peak.labels == ("set_to_none", "persistent") and off.loop is None
    assert len(p.weighed) >= 2 and p.weighed[0][0] == 0 and p.weighed[-1][0] > 0    # nothing, ..., all that hides
    nothing = p.weighed[0][1]
    assert all(a <= b for a, b in zip(p.weighed_peak, nothing))
    assert [x.moved for x in p.layers] == [lay.saved_bytes()["moved"] for lay in off.layers]
    assert "weighed by the peaks" in p.summary()
    assert clean_step_matches(base, ref, g)


def test_auto_told_its_loop_predicts_that_loop_alone(monkeypatch):
    from vmmrt.torch import planner
    seen = []
    real = planner.lightest
    monkeypatch.setattr(planner, "lightest", lambda layers, d2h, peak, granularity=1, **kw:
                        seen.append(peak) or real(layers, d2h, peak, granularity, **kw))
    for loop in ("persistent", "set_to_none"):
        base, ref, g = build(3, offload="auto", loop=loop)
        off = vt.offload_of(g[0])
        assert off.loop == loop and seen[-1].labels == (loop,)
        assert len(off.plan.weighed[0][1]) == 1
        off.close()
    with pytest.raises(ValueError, match="loop="):
        build(1, offload="auto", loop="sometimes")
    with pytest.raises(ValueError, match="Budget"):
        build(1, memory_budget=vt.Budget(1 << 40), loop="persistent")
