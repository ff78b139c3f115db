# SPDX-License-Identifier: LGPL-2.1-or-later
"""Pipeline schedules of one stage on the host backend: 1F1B with p = 2 and 4
microbatches in flight (and interleaved chunks) through the same layers, a
runner per (layer, microbatch), the order declared to libvmmrt; parameter
gradients, accumulated over the microbatches, bitwise those of the same
microbatches run one after another without offload, in every mode; a call
out of the order refused, naming the runner; abort mid-iteration, then an
iteration as any other."""
import copy

import pytest
import torch

import vmmrt
import vmmrt.torch as vt
from vmmrt.torch import pipeline

from conftest import Zoo

SHAPE = (2, 8, 32)


class MLP(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def stage(n=3, seed=0):
    """n small layers (an MLP, the layer that saves every kind of tensor, MLPs),
    and a copy with the same weights for the reference."""
    torch.manual_seed(seed)
    base = [Zoo(SHAPE[-1]) if i == 1 else MLP(SHAPE[-1]) for i in range(n)]
    return base, copy.deepcopy(base)


def graphed(base, order, mode="pingpong", lookahead=1, **kw):
    lay = pipeline.Layout(order, len(base), kw.get("layers_per_chunk"))
    samples = tuple((torch.randn(*SHAPE, requires_grad=True),) for _ in range(lay.n_runners))
    kw.setdefault("min_bytes", 0)
    if mode == "none":
        # what stays goes to resident slots of at least half a granule: small
        # granules, so that these small layers have them
        kw.setdefault("options", {"host_granularity": 4096})
    return vt.make_graphed_callables(tuple(base), samples, graphs=False, order=order, mode=mode,
                                     lookahead=lookahead, **kw)


def batches(m, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(*SHAPE, generator=g).requires_grad_() for _ in range(m)]
    gys = [torch.randn(*SHAPE, generator=g) for _ in range(m)]
    return xs, gys


class Pipe:
    """The training loop of one stage running an order: each chunk's output goes
    to the next chunk as a new leaf (as it would to the next stage), and a
    chunk's backward takes the gradient its successor left there."""

    def __init__(self, g, order, xs, gys, layers_per_chunk=None):
        self.runs = pipeline.split(g, order, layers_per_chunk)
        self.steps = pipeline.steps(order)
        self.xs, self.gys = xs, gys
        self.inp, self.out = {}, {}
        self.done = 0

    def step(self):
        backward, c, mb = self.steps[self.done]
        last = len(self.runs) - 1
        if not backward:
            x = self.xs[mb] if c == 0 else self.out[c - 1, mb].detach().requires_grad_()
            self.inp[c, mb] = x
            y = x
            for f in self.runs[c][mb]:
                y = f(y)
            self.out[c, mb] = y
        else:
            gy = self.gys[mb] if c == last else self.inp[c + 1, mb].grad
            self.out[c, mb].backward(gy)
        self.done += 1

    def run(self, n=None):
        for _ in range(len(self.steps) - self.done if n is None else n):
            self.step()


def sequential(ref, xs, gys):
    """The reference: the microbatches one after another, forward then backward,
    without offload; returns the inputs' gradients."""
    out = []
    for x, gy in zip(xs, gys):
        x = x.detach().clone().requires_grad_()
        y = x
        for m in ref:
            y = m(y)
        y.backward(gy)
        out.append(x.grad)
    return out


def param_grads(layers):
    return [p.grad for m in layers for p in m.parameters()]


def bitwise(a, b):
    return len(a) == len(b) and all(x is not None and y is not None and torch.equal(x, y) for x, y in zip(a, b))


def zero(*layer_lists):
    for ls in layer_lists:
        for m in ls:
            m.zero_grad(set_to_none=True)


# ------------------------------------------------------------ the orders

def test_1f1b_order_as_megatron_makes_it():
    assert vt.order_1f1b(4, in_flight=2) == [1, 1, -1, 1, -1, 1, -1, -1]
    assert vt.order_1f1b(4, warmup=1) == vt.order_1f1b(4, in_flight=2)
    assert vt.order_1f1b(3, in_flight=1) == [1, -1, 1, -1, 1, -1]
    assert vt.order_1f1b(3, in_flight=5) == [1, 1, 1, -1, -1, -1]        # p >= m: every forward first
    assert vt.order_1f1b(6, in_flight=4) == [1, 1, 1, 1, -1, 1, -1, 1, -1, -1, -1, -1]
    # Megatron's convert_schedule_table_to_order docstring: PP2, 5 microbatches, 2 chunks, groups of 3, warm-up 5
    assert vt.order_1f1b(5, warmup=5, chunks=2, group=3) == [
        1, 1, 1, 2, 2, 2, -2, 1, -2, 1, -2, 2, -1, 2, -1, -1, -2, -2, -1, -1]
    for bad in (dict(in_flight=0), dict(), dict(in_flight=2, warmup=1), dict(warmup=-1)):
        with pytest.raises(ValueError):
            vt.order_1f1b(4, **bad)


def test_layout_is_transformer_engines():
    order = vt.order_1f1b(4, warmup=2, chunks=2, group=2)
    lay = pipeline.Layout(order, 6)                           # 2 chunks of 3 layers, 4 microbatches
    assert (lay.chunks, lay.microbatches, lay.layers_per_chunk) == (2, 4, [3, 3])
    assert lay.index(0, 0, 0) == 0 and lay.index(0, 1, 0) == 3 and lay.index(1, 0, 0) == 12
    for i in range(lay.n_runners):
        c, mb, l, k = lay.where(i)
        assert lay.index(c, mb, l) == i and k == lay.prefix[c] + l
    uses = lay.uses()
    assert len(uses) == 2 * lay.n_runners and len(set(uses)) == len(uses)
    assert uses[:3] == [(False, 0), (False, 1), (False, 2)]   # chunk 1, microbatch 0, layers in order
    first_bwd = next(k for k, (b, _) in enumerate(uses) if b)
    assert [i for _, i in uses[first_bwd:first_bwd + 3]] == [14, 13, 12]  # chunk 2's layers in reverse
    assert pipeline.Layout(order, 5, layers_per_chunk=[2, 3]).prefix == [0, 2, 5]


@pytest.mark.parametrize("order,why", [([1, -1, -1, 1], "before its forward"),
                                       ([1, 1, -1], "forwards and"),
                                       ([1, 2, -1, -2, 2, -2], "chunk 1 has"),
                                       ([1, 0, -1], "non-zero")])
def test_orders_that_are_not_orders_are_refused(order, why):
    with pytest.raises(ValueError) as e:
        pipeline.Layout(order, 2)
    assert why in str(e.value)


# --------------------------------------------------- 1F1B, gradients bitwise

@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 6)])
@pytest.mark.parametrize("lookahead", [1, 2])
def test_1f1b_gradients_are_those_of_sequential_microbatches(mode, p, m, lookahead):
    base, ref = stage(3)
    order = vt.order_1f1b(m, in_flight=p)
    g = graphed(base, order, mode, lookahead)
    off = vt.offload_of(g[0])
    assert len(g) == 3 * m and off.schedule is not None
    for it in range(3):
        xs, gys = batches(m, seed=10 + it)
        Pipe(g, order, xs, gys).run()
        want_x = sequential(ref, xs, gys)
        assert bitwise([x.grad for x in xs], want_x), "input gradients, iteration %d" % it
        assert bitwise(param_grads(base), param_grads(ref)), "parameter gradients, iteration %d" % it
        zero(base, ref)
        if it == 0:
            off.sync()
            off.runtime.offload_stats_reset()      # the steady state from here
    off.sync()
    s = off.stats()
    every = 3 * m * off.runtime.info()["granularity"]          # every runner's group
    if mode == "none":
        # Nothing moves: every runner's saved tensors are born in its resident
        # slot, mapped for its forward and released after its backward.
        assert s["bytes_offloaded"] == 0 and sum(off.group_bytes()) == 0
        assert off.placement()["resident"] > 0 and off.placement()["pool"] == 0
    else:
        assert s["iterations"] == 3 and s["schedule_declared"] == 1 and s["aborts"] == 0
        assert s["bytes_offloaded"] > 0 and s["bytes_restored"] > 0
        assert s["activation_peak_bytes"] <= s["bound_bytes"] < every
    if mode == "pingpong":
        assert s["bank_conflicts"] == 0 and 2 <= s["banks"] < 3 * m   # the banks do not grow with p
    off.close()


@pytest.mark.parametrize("mode", ["pingpong", "remap"])
def test_interleaved_chunks_on_one_stage(mode):
    base, ref = stage(4)
    order = vt.order_1f1b(4, warmup=2, chunks=2, group=2)   # chunk 1 = layers 0-1, chunk 2 = layers 2-3
    g = graphed(base, order, mode)
    for it in range(2):
        xs, gys = batches(4, seed=20 + it)
        Pipe(g, order, xs, gys).run()
        assert bitwise([x.grad for x in xs], sequential(ref, xs, gys))
        assert bitwise(param_grads(base), param_grads(ref)), "iteration %d" % it
        zero(base, ref)
    vt.offload_of(g[0]).close()


def test_the_runners_are_named_and_the_modules_kept():
    base, ref = stage(2)
    order = vt.order_1f1b(2, in_flight=2)
    g = graphed(base, order, names=["first", "second"])
    assert [f.vmmrt_runner for f in g] == ["first/mb0", "second/mb0", "first/mb1", "second/mb1"]
    assert "forward" not in base[0].__dict__                  # a module serves every microbatch: not replaced
    x = torch.randn(*SHAPE, requires_grad=True)
    with torch.no_grad():
        assert torch.equal(g[1](g[0](x)), ref[1](ref[0](x)))   # no backward to come: the layers themselves
    for m in base:
        m.eval()
    assert torch.equal(g[0](x), ref[0](x))                     # eval: the module's own forward
    for m in base:
        m.train()
    xs, gys = batches(2, seed=3)
    Pipe(g, order, xs, gys).run()                              # and training goes on, in the order
    sequential(ref, xs, gys)
    assert bitwise(param_grads(base), param_grads(ref))
    vt.offload_of(g[0]).close()


def test_bad_pipeline_arguments_are_refused():
    base, _ = stage(2)
    order = vt.order_1f1b(2, in_flight=2)
    one = tuple((torch.randn(*SHAPE, requires_grad=True),) for _ in range(2))
    with pytest.raises(ValueError) as e:
        vt.make_graphed_callables(tuple(base), one, graphs=False, order=order)      # one per layer only
    assert "one per layer and microbatch" in str(e.value)
    four = one + one
    with pytest.raises(ValueError) as e:
        vt.make_graphed_callables(tuple(base), four, graphs=False, order=order, offload="auto")
    assert "offload='auto'" in str(e.value)
    with pytest.raises(ValueError):
        vt.make_graphed_callables(tuple(base), one, graphs=False, layers_per_chunk=1)
    with pytest.raises(TypeError):
        vt.make_graphed_callables(base[0], one[0], graphs=False, order=order)
    with pytest.raises(TypeError) as e:
        vt.make_graphed_callables(tuple(base), four, graphs=False, oder=order)
    assert "did you mean 'order'" in str(e.value)


# ----------------------------------------------------- the order is checked

def test_a_call_out_of_the_order_is_refused_naming_the_runner():
    base, ref = stage(3)
    order = vt.order_1f1b(4, in_flight=2)
    g = graphed(base, order)
    xs, gys = batches(4, seed=5)
    pipe = Pipe(g, order, xs, gys)
    pipe.run(2)                                   # the forwards of microbatches 0 and 1
    with pytest.raises(vmmrt.Error) as e:
        g[2 * 3](xs[2])                           # the forward of microbatch 2 before microbatch 0's backward
    assert e.value.name == "VMMRT_E_MISMATCH"
    assert "'0:MLP/mb2'" in str(e.value)                              # the runner called
    assert "backward of group" in str(e.value) and "is '2:MLP/mb0'" in str(e.value)   # and the one expected
    with pytest.raises(vmmrt.Error) as e:
        pipe.out[0, 1].backward(gys[1])           # microbatch 1's backward before microbatch 0's
    assert e.value.name == "VMMRT_E_MISMATCH" and "'2:MLP/mb1'" in str(e.value)
    pipe.run()                                    # refused calls change nothing: the iteration goes on
    sequential(ref, xs, gys)
    assert bitwise(param_grads(base), param_grads(ref))
    s = vt.offload_of(g[0]).stats()
    assert s["iterations"] == 1 and s["aborts"] == 0
    vt.offload_of(g[0]).close()


# ------------------------------------------------------------------ abort

@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
@pytest.mark.parametrize("where", [1, 5, 9])      # a forward in, the steady state, among the last backwards
def test_abort_mid_iteration_then_an_iteration_as_any_other(mode, where):
    base, ref = stage(3)
    order = vt.order_1f1b(6, in_flight=4)
    g = graphed(base, order, mode)
    off = vt.offload_of(g[0])
    for it in range(3):
        xs, gys = batches(6, seed=30 + it)
        pipe = Pipe(g, order, xs, gys)
        if it == 1:                               # a step given up (a NaN loss, say) part-way
            pipe.run(where)
            off.abort()
            done = [mb for (c, mb) in pipe.out if pipe.steps.index((True, c, mb)) >= where]
            if done:
                with pytest.raises(vmmrt.Error) as e:
                    pipe.out[0, done[0]].backward(gys[done[0]])   # the abandoned iteration is gone
                assert e.value.name == "VMMRT_E_INVALID_STATE" and "abandoned" in str(e.value)
            zero(base)
            continue
        pipe.run()
        want_x = sequential(ref, xs, gys)
        assert bitwise([x.grad for x in xs], want_x), "input gradients, iteration %d" % it
        assert bitwise(param_grads(base), param_grads(ref)), "parameter gradients, iteration %d" % it
        zero(base, ref)
    off.sync()
    s = off.stats()
    if mode != "none":                 # (none moves nothing: the library has no iteration to count)
        assert s["aborts"] == 1 and s["iterations"] == 2
    off.close()


def test_abort_in_the_first_iteration():
    base, ref = stage(2)
    order = vt.order_1f1b(4, in_flight=2)
    g = graphed(base, order, "remap")
    off = vt.offload_of(g[0])
    xs, gys = batches(4, seed=40)
    Pipe(g, order, xs, gys).run(3)
    off.abort()
    zero(base)
    xs, gys = batches(4, seed=41)
    Pipe(g, order, xs, gys).run()
    sequential(ref, xs, gys)
    assert bitwise(param_grads(base), param_grads(ref))
    off.close()


def test_abort_needs_an_allocated_offload():
    off = vt.Offload(device="cpu")
    with pytest.raises(vmmrt.Error) as e:
        off.abort()
    assert e.value.name == "VMMRT_E_INVALID_STATE"
    off.close()


# --------------------------------------------- the per-runner API's schedule

def test_set_schedule_checks_the_order_and_goes_to_the_library():
    off = vt.Offload(mode="pingpong", device="cpu", min_bytes=0)
    m = MLP()
    lay = [off.layer("l%d/mb%d" % (l, mb), static=list(m.parameters())) for mb in range(2) for l in range(2)]
    with pytest.raises(ValueError) as e:
        off.set_schedule([(lay[0], True), (lay[0], False)])
    assert "before its forward" in str(e.value)
    with pytest.raises(ValueError) as e:
        off.set_schedule([(lay[0], False), (lay[0], True)])
    assert "leaves out" in str(e.value) and "'l1/mb0'" in str(e.value)
    with pytest.raises(TypeError):
        off.set_schedule([("l0/mb0", False)])
    steps = [(lay[k], False) for k in range(4)] + [(lay[k], True) for k in (1, 0, 3, 2)]
    off.set_schedule(steps)
    x = torch.randn(*SHAPE, requires_grad=True)
    for k in range(4):                            # discovery
        with lay[k].discovering() as p:
            p.outputs = m(x)
    off.allocate()
    s = off.stats()
    assert s["schedule_declared"] == 1 and s["banks"] >= 2
    with pytest.raises(vmmrt.Error):
        off.set_schedule(steps)                   # after allocation
    off.close()


def test_the_example_runs():
    """On the host backend (CPU tensors) and, on a GPU machine, with graphs."""
    import os
    import subprocess
    import sys
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_1f1b.py")
    if not os.path.exists(example):
        pytest.skip("no examples/torch_1f1b.py next to the package")
    r = subprocess.run([sys.executable, example, "--layers", "3", "--microbatches", "4", "--in-flight", "2",
                        "--steps", "3", "--nan-step", "1"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()            # the table's rows
            if line.startswith(("pingpong ", "remap "))}
    assert set(rows) == {"pingpong", "remap"} and all("bitwise equal" in v for v in rows.values())
    for mode in ("none", "pingpong", "remap"):                 # and eager, on a GPU
        assert r.stdout.count("  %s step 1: a loss is not finite: step abandoned (Offload.abort)" % mode) == 1


def test_one_gradient_slot_per_callable_not_per_microbatch():
    """Under order=, the (layer, microbatch) runners of one callable share its
    parameters, so one gradient slot: its microbatches accumulate into the
    one .grad at its fixed address (a slot per runner would hold m times the
    gradients, and each microbatch's gradient would land elsewhere)."""
    base, ref = stage(3)
    m = 4
    order = vt.order_1f1b(m, in_flight=2)
    g = graphed(base, order)
    off = vt.offload_of(g[0])
    per_layer = [lay.grads for lay in off.layers]
    assert len(per_layer) == 3 * m and all(gr is not None and gr.mapped for gr in per_layer)
    assert len({id(gr) for gr in per_layer}) == 3
    slots = [b for b in off.backings if b.name.endswith("/grads")]
    assert len(slots) == 3 and sorted(b.name for b in slots) == sorted("%s/grads" % n for n in
                                                                      {gr.name for gr in per_layer})
    xs, gys = batches(m, seed=21)
    Pipe(g, order, xs, gys).run()
    sequential(ref, xs, gys)
    assert bitwise(param_grads(base), param_grads(ref))
    for mod in base:
        gr = next(gr for gr in per_layer if gr.params[0] is next(mod.parameters()))
        for p in mod.parameters():                               # in the callable's one slot
            assert gr.backing.address <= p.grad.data_ptr() < gr.backing.address + gr.backing.nbytes
