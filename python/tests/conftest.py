# SPDX-License-Identifier: LGPL-2.1-or-later
"""Shared pieces of the Python tests: small layers that save every kind of
tensor autograd saves, and runners for the eager-offload path on the host
backend (CPU tensors at libvmmrt's emulated device addresses)."""
import copy
import os

import pytest
import torch

import vmmrt
import vmmrt.torch as vt

# The python3 processes some tests start import the same package and helpers
# as this one, whether from the checkout (pytest.ini's pythonpath) or installed.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(vmmrt.__file__))), os.path.dirname(os.path.abspath(__file__))]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def pytest_report_header(config):
    try:
        where = str(vmmrt.library_path())
    except vmmrt.LibraryNotFound as e:
        where = "not found: %s" % e
    return "vmmrt: package %s, library %s" % (os.path.dirname(vmmrt.__file__), where)


class Zoo(torch.nn.Module):
    """A layer whose forward saves, for its backward: views of one storage
    (q, k, v of one projection), a transposed (non-contiguous) view, a bool
    mask, int64 indices, bf16 tensors, the same tensor twice, a 0-size tensor,
    parameters and an op's output (softmax, rsqrt)."""

    def __init__(self, d=32):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.w = torch.nn.Parameter(torch.randn(d))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        s = q @ k.transpose(-1, -2)
        mask = s > 0
        s = torch.where(mask, s, s * 0.5)
        idx = s.argmax(-1, keepdim=True).expand(-1, -1, v.shape[-1])
        g = torch.gather(v, -2, idx)
        h = torch.softmax(s, -1) @ v + g
        hb = (h.bfloat16() * self.w.bfloat16()).float()
        sq = hb * hb
        z = (x[..., :0] * x[..., :0]).sum()
        r = torch.rsqrt(sq.pow(2).mean(-1, keepdim=True) + 1.0)
        return x + self.proj(sq * r) + z


def zoo_layers(n=4, d=32, seed=0):
    torch.manual_seed(seed)
    return [Zoo(d) for _ in range(n)]


def samples(n, shape=(2, 8, 32)):
    return tuple((torch.randn(*shape, requires_grad=True),) for _ in range(n))


def run(layers, x):
    y = x
    for m in layers:
        y = m(y)
    return y


def step(layers, x, gy):
    """One forward and backward; the loss weights y with gy so every output element matters."""
    y = run(layers, x)
    (y * gy).sum().backward()
    return y


def runner_step(lays, mods, x):
    """One training step through the per-runner API, as a framework with its
    own runners drives it: each forward in its group (LayerOffload.offloading),
    each backward bracketed by the hooks, in reverse, with the gradient of
    the output all ones. Returns the gradient of x."""
    outs, ins = [], []
    h = x
    for lay, m in zip(lays, mods):
        h = h.detach().requires_grad_()
        ins.append(h)
        with lay.offloading(None) as p:
            h = p.outputs = m(h)
        outs.append(h)
    g = torch.ones_like(h)
    for i in reversed(range(len(mods))):
        lays[i].backward_begin(None)
        torch.autograd.backward(outs[i], g)
        lays[i].backward_end(None)
        g = ins[i].grad
    return g


def grads(layers):
    return [p.grad.clone() if p.grad is not None else None for m in layers for p in m.parameters()]


def same(a, b):
    return len(a) == len(b) and all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
                                    for x, y in zip(a, b))


@pytest.fixture
def pair():
    """(offloaded layers, reference layers, their originals): the same weights twice."""
    def make(n=4, mode="pingpong", lookahead=1, **kw):
        base = zoo_layers(n)
        ref = copy.deepcopy(base)
        kw.setdefault("min_bytes", 0)
        if mode == "none":
            # what stays goes to resident slots of at least half a granule:
            # small granules, so that these small layers have them
            kw.setdefault("options", {"host_granularity": 4096})
        g = vt.make_graphed_callables(tuple(base), samples(n), graphs=False, mode=mode, lookahead=lookahead, **kw)
        return g, ref, base
    return make


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def close_graphed(layers, off):
    """The graphed layers of a GPU test and their Offload gone, and the device
    idle, before the next build in the same process."""
    import gc
    for m in layers:
        m.__dict__.pop("forward", None)
        # the module's own reference to the Offload, which holds the graphs
        # and so their pool's segments (8 left on the arena in
        # test_optmem_gpu while the caller kept its layers)
        m.__dict__.pop("vmmrt_offload", None)
        m.zero_grad(set_to_none=True)
    off.close()
    gc.collect()
    torch.cuda.synchronize()
