# SPDX-License-Identifier: LGPL-2.1-or-later
"""A capture the driver invalidates leaves the caching allocator routing to
the capture's pool (capture_end raises before it ends that routing), and
every later torch.cuda.empty_cache() of the process then aborts it
(captures_underway.empty()). vmmrt.torch ends that routing after a failed
capture (_compat.end_abandoned_pool). Driven on the CPU with stand-ins for
the allocator's entry points and for torch.cuda.graph; the GPU test runs a
real failed capture and then empties the cache in a child process."""
import os
import subprocess
import sys
import types

import pytest
import torch

from vmmrt import Error
from vmmrt.torch import _compat, graphed

POOL = (0, 7)


class _Allocator:
    """torch._C's begin/end-allocate-to-pool bookkeeping, as the caching
    allocator keeps it: end raises when the pool is not being recorded to."""

    def __init__(self, underway=()):
        self.underway = list(underway)
        self.released = []

    def end(self, device, pool):
        if pool not in self.underway:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.underway.remove(pool)

    def release(self, device, pool):
        self.released.append(pool)


def _stand_in(monkeypatch, alloc):
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", alloc.end, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", alloc.release, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_a_routing_left_under_way_is_ended_and_its_reference_given_back(monkeypatch):
    alloc = _Allocator([POOL])
    _stand_in(monkeypatch, alloc)
    assert _compat.end_abandoned_pool(POOL) is True
    assert alloc.underway == [] and alloc.released == [POOL]


def test_nothing_is_released_where_no_routing_was_under_way(monkeypatch):
    # capture_end got past its routing's end (or capture_begin failed before
    # it): a release here would free a pool its graphs still use
    alloc = _Allocator()
    _stand_in(monkeypatch, alloc)
    assert _compat.end_abandoned_pool(POOL) is False
    assert _compat.end_abandoned_pool(None) is False
    assert alloc.released == []


class _Graph:
    """torch.cuda.graph as a stand-in: begins the routing to ``pool`` on
    entry; on exit, a driver-invalidated capture raises before the routing
    ends (as CUDAGraph.capture_end does), a valid one ends it."""

    def __init__(self, alloc, invalidate):
        self.alloc, self.invalidate = alloc, invalidate

    def __call__(self, graph, pool=None, stream=None, capture_error_mode=None):
        self.pool = pool
        return self

    def __enter__(self):
        self.alloc.underway.append(self.pool)
        return self

    def __exit__(self, *exc):
        if self.invalidate:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        self.alloc.end(0, self.pool)
        return False


def _runner():
    failed = []
    layer = types.SimpleNamespace(last_rec=None, offload=types.SimpleNamespace(fail=failed.append))
    return types.SimpleNamespace(name="layer0", generators=[], layer=layer), failed


@pytest.mark.parametrize("invalidate", [True, False])
def test_a_failed_capture_leaves_no_routing_under_way(monkeypatch, invalidate):
    alloc = _Allocator()
    _stand_in(monkeypatch, alloc)
    monkeypatch.setattr(torch.cuda, "graph", _Graph(alloc, invalidate))
    monkeypatch.setattr(_compat, "end_abandoned_capture", lambda stream=None: None)
    r, failed = _runner()

    def body():
        raise RuntimeError("an op the capture refused")
    with pytest.raises(Error) as e:
        graphed._capture(r, "forward", object(), POOL, None, "global", body)
    assert "layer0" in str(e.value) and failed
    assert alloc.underway == []
    # the pool's reference is given back only where the capture's own end did not run
    assert alloc.released == ([POOL] if invalidate else [])


CHILD = r"""
import torch, vmmrt.torch as vt

class Syncs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        y = self.lin(x)
        if y.sum().item() > 1e30:   # a host sync: the driver invalidates the capture
            y = y * 2
        return y

m = Syncs().cuda()
try:
    vt.make_graphed_callables(m, (torch.randn(8, 64, device="cuda", requires_grad=True),), mode="none")
except vt.Error as e:
    print("refused:", str(e).splitlines()[0][:120])
torch.cuda.empty_cache()
vt.empty_cache()
print("alive after empty_cache")
"""


@pytest.mark.gpu
def test_the_process_survives_emptying_the_cache_after_a_failed_capture():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
    assert "refused:" in p.stdout and "alive after empty_cache" in p.stdout, p.stdout


def test_the_sweep_ends_every_routing_left_under_way_whoever_captured(monkeypatch):
    # a capture torch.cuda.make_graphed_callables made (a shared pool, (0, k))
    # and a graph's own pool ((k, 0)) whose ids nobody kept: both ended, and
    # only they are given back
    alloc = _Allocator([(0, 3), (5, 0)])
    _stand_in(monkeypatch, alloc)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 9))
    assert sorted(_compat.end_abandoned_pools(margin=0)) == [(0, 3), (5, 0)]
    assert alloc.underway == [] and sorted(alloc.released) == [(0, 3), (5, 0)]
    # ids past the newest handle (a second counter) are covered by the margin
    alloc = _Allocator([(12, 0)])
    _stand_in(monkeypatch, alloc)
    assert _compat.end_abandoned_pools(margin=4) == [(12, 0)]
    assert alloc.underway == []


def test_the_sweep_releases_nothing_where_nothing_was_left(monkeypatch):
    alloc = _Allocator()
    _stand_in(monkeypatch, alloc)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, 9))
    assert _compat.end_abandoned_pools() == []
    assert alloc.released == []
