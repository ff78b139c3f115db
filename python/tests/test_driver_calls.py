# SPDX-License-Identifier: LGPL-2.1-or-later
"""The driver's VMM calls per step, counted by Offload.stats() (the C
library's vmmrt_driver_stats_get counts, on the host backend as on CUDA):
without the memory plan the baseline, with it (the default) none in steady
state ([hot-path] 3)."""
import pytest
import torch

import vmmrt.torch as vt
from conftest import samples, zoo_layers

N = 3
KINDS = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease")


def _per_step(mode, warmup=2, steps=3, **kw):
    """The calls of each kind made by each step after ``warmup`` steps
    (the Zoo layers, graphs=False, everything above 0 bytes offloadable,
    4 KiB granules so that resident slots exist for these small layers)."""
    g = vt.make_graphed_callables(tuple(zoo_layers(N)), samples(N), graphs=False, mode=mode, lookahead=1,
                                  min_bytes=0, options={"host_granularity": 4096}, **kw)
    off = vt.offload_of(g[0])
    x, gy = torch.randn(2, 8, 32, requires_grad=True), torch.randn(2, 8, 32)
    out = []
    try:
        prev = off.stats()
        for i in range(warmup + steps):
            y = x
            for m in g:
                y = m(y)
            y.backward(gy)
            del y
            # The releases after each backward are ordered on the host
            # backend's stream and only then go to the workers: wait for
            # both, or a release late past the reading is sometimes
            # cancelled by the next step's map (a step of 2 creates and
            # the one before of 2 releases, about one run in 25).
            off.runtime.stream_synchronize(None)
            off.sync()
            cur = off.stats()
            assert cur["driver_calls"] == sum(cur["driver_calls_by_kind"].values())
            assert tuple(cur["driver_calls_by_kind"]) == KINDS
            if i >= warmup:
                out.append({k: cur["driver_calls_by_kind"][k] - prev["driver_calls_by_kind"][k] for k in KINDS}
                           | {"total": cur["driver_calls"] - prev["driver_calls"]})
            prev = cur
    finally:
        off.close()
    return out


def test_remap_maps_and_unmaps_every_step():
    """remap releases the offloaded slots' memory and maps it again each
    step (measured here: 4 or 5 maps per step over 3 layers, as the workers
    take the requests)."""
    for s in _per_step("remap"):
        assert s["total"] > 0 and s["cuMemMap"] > 0
        assert s["cuMemMap"] == s["cuMemSetAccess"] == s["cuMemUnmap"], s


def test_pingpong_fully_offloaded_makes_no_driver_call_after_warm_up():
    """Every saved tensor offloaded: the two banks are mapped once (the
    first step) and nothing more."""
    assert _per_step("pingpong") == [dict.fromkeys(KINDS + ("total",), 0)] * 3


@pytest.mark.parametrize("mode,kw", [("pingpong", {"offload": 0.5}), ("none", {})])
def test_resident_slots_without_the_memory_plan_are_made_and_released_every_step(mode, kw):
    """memory_plan=False (the baseline before [hot-path] 3, measured on the
    host backend): what stays on the device goes to a resident slot per
    layer that is created, mapped, given access, unmapped and released
    again every step, one call of each kind per layer per step (5 * 3 = 15
    calls per step over 3 layers), in mode "none" and in "pingpong" with
    half offloaded."""
    assert _per_step(mode, memory_plan=False, **kw) == [dict.fromkeys(KINDS, N) | {"total": 5 * N}] * 3


@pytest.mark.parametrize("mode,kw", [("pingpong", {"offload": 0.5}), ("none", {})])
def test_resident_slots_on_the_memory_plan_make_no_driver_call_after_warm_up(mode, kw):
    """The memory plan (the default) is made at the second step's first
    forward: from the third step on the resident slots sit on its pages
    for good (vmmrt.torch.memplan), and no step makes a driver call."""
    assert _per_step(mode, **kw) == [dict.fromkeys(KINDS + ("total",), 0)] * 3
