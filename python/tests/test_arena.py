# SPDX-License-Identifier: LGPL-2.1-or-later
"""The arena (vmmrt_arena_lend(3)) as PyTorch's CUDAPluggableAllocator calls it:
vmmrt_arena_malloc / vmmrt_arena_free through ctypes, over two slots this test
maps itself. Best fit at 512-byte aligned starts, coalescing,
re-lend semantics (an old generation's bytes are neither served again nor
returned), the fallback to plain device memory when full (usable through the
backend's copies), the statistics, and every misuse of the binding refused
loudly. Host backend, and a CUDA device where there is one."""
import ctypes
import os

import pytest

import vmmrt

KiB = 1 << 10
MiB = 1 << 20
BACKENDS = ["host", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def rt(request):
    vmmrt.arena_reset(0)
    r = vmmrt.Runtime({"backend": request.param})
    yield r
    r.close()
    vmmrt.arena_reset(0)


def malloc(n):
    """As PyTorch calls it: (ssize_t size, int device, cudaStream_t stream)."""
    return vmmrt.library().vmmrt_arena_malloc(n, 0, None) or 0


def free(p, n=0):
    vmmrt.library().vmmrt_arena_free(p, n, 0, None)


def put(rt, address, data):
    buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    rt.copy_to_device(address, ctypes.addressof(buf), len(data))


def get(rt, address, nbytes):
    buf = (ctypes.c_ubyte * nbytes)()
    rt.copy_to_host(ctypes.addressof(buf), address, nbytes)
    return bytes(buf)


def two_slots(rt):
    """Two mapped slots, lowest address first."""
    a, b = rt.slot(2 * MiB), rt.slot(2 * MiB)
    a.map()
    b.map()
    return sorted((a, b), key=lambda s: s.address)


def test_library_path_is_the_loaded_library():
    path = vmmrt.arena_library_path()
    assert os.path.isabs(path) and os.path.exists(path)
    assert os.path.samefile(path, vmmrt.library_path().path)
    lib = ctypes.CDLL(path)                        # what CUDAPluggableAllocator does with it
    assert lib.vmmrt_arena_malloc and lib.vmmrt_arena_free


def test_best_fit_aligned_and_coalescing(rt):
    lo, hi = two_slots(rt)
    # high first; the low range starts off alignment, and fits 300 bytes best
    gen = rt.arena_lend([(hi.address, 64 * KiB), (lo.address + 100, 1000)])
    s = vmmrt.arena_stats()
    assert s["generation"] == gen and s["lent_bytes"] == 64 * KiB + 1000
    a = malloc(300)                                # rounded to 512, at the first aligned byte
    assert a == lo.address + 512
    b = malloc(512)                                # 76 bytes left low: the high range
    assert b == hi.address
    c, d = malloc(4 * KiB), malloc(4 * KiB)
    assert (c, d) == (hi.address + 512, hi.address + 512 + 4 * KiB)
    assert all(p % 512 == 0 for p in (a, b, c, d))
    assert vmmrt.arena_stats()["used_bytes"] == 2 * 512 + 8 * KiB
    free(c)
    free(b)                                        # b and c: one hole of 4.5 KiB
    assert malloc(4 * KiB + 512) == hi.address
    s = vmmrt.arena_stats()
    assert s["fallback_total"] == 0 and s["segments"] == 3 and s["allocs"] == 5 and s["frees"] == 2
    free(a)
    free(d)
    free(hi.address)
    s = vmmrt.arena_stats()
    assert s["segments"] == 0 and s["used_bytes"] == 0 and s["bad_frees"] == 0


def test_relend_keeps_the_old_generation_out(rt):
    lo, _ = two_slots(rt)
    g1 = rt.arena_lend([(lo.address, 16 * KiB)])
    a, b = malloc(4 * KiB), malloc(4 * KiB)
    g2 = rt.arena_lend([(lo.address, 16 * KiB)])
    assert g2 > g1
    s = vmmrt.arena_stats()
    assert (s["segments"], s["old_segments"], s["used_bytes"]) == (2, 2, 0)
    assert malloc(4 * KiB) == lo.address + 8 * KiB         # a and b still held: not served twice
    free(a)                                                 # accepted, not given back
    assert vmmrt.arena_stats()["old_segments"] == 1
    assert malloc(4 * KiB) == lo.address + 12 * KiB
    f = malloc(4 * KiB)                                     # the range is spent: fallback
    assert f and not lo.address <= f < lo.address + 16 * KiB
    assert vmmrt.arena_stats()["fallback_segments"] == 1
    for p in (b, lo.address + 8 * KiB, lo.address + 12 * KiB, f):
        free(p)
    s = vmmrt.arena_stats()
    assert (s["segments"], s["old_segments"], s["fallback_segments"], s["bad_frees"]) == (0, 0, 0, 0)


def test_fallback_when_full_is_usable(rt):
    lo, _ = two_slots(rt)
    rt.arena_lend([(lo.address, 4 * KiB)])
    f = malloc(256 * KiB)
    assert f and not lo.address <= f < lo.address + 4 * KiB
    s = vmmrt.arena_stats()
    assert (s["fallback_segments"], s["fallback_bytes"], s["fallback_total"]) == (1, 256 * KiB, 1)
    data = bytes(range(256)) * (256 * KiB // 256)
    put(rt, f, data)
    assert get(rt, f, len(data)) == data
    free(f, 256 * KiB)
    s = vmmrt.arena_stats()
    assert (s["fallback_segments"], s["fallback_bytes"], s["fallback_total"], s["frees"]) == (0, 0, 1, 1)


def test_lent_bytes_are_the_slots(rt):
    lo, hi = two_slots(rt)
    rt.arena_lend([(lo.address, 2 * MiB), (hi.address, 2 * MiB)])
    p = malloc(MiB)
    assert p == lo.address
    put(rt, lo.address, b"\x5a" * 4096)                    # the slot's bytes are the segment's
    assert get(rt, p, 4096) == b"\x5a" * 4096
    free(p)


def test_errors_and_bad_frees_are_counted(rt):
    lo, _ = two_slots(rt)
    rt.arena_lend([(lo.address, 64 * KiB)])
    assert malloc(0) == 0 and malloc(-1) == 0
    free(0x1000)
    p = malloc(512)
    free(p)
    free(p)
    s = vmmrt.arena_stats()
    assert (s["errors"], s["bad_frees"], s["allocs"], s["frees"]) == (2, 2, 1, 1)


def test_misuse_is_refused(rt):
    lo, _ = two_slots(rt)
    gen = rt.arena_lend([(lo.address, 64 * KiB)])
    with pytest.raises(vmmrt.InvalidValue, match="overlap"):
        rt.arena_lend([(lo.address, 8 * KiB), (lo.address + 4 * KiB, 8 * KiB)])
    with pytest.raises(vmmrt.Error, match="INVALID_SIZE"):
        rt.arena_lend([(lo.address, 0)])
    with pytest.raises(vmmrt.InvalidValue):
        rt.arena_lend([(0, 4096)])
    with pytest.raises(vmmrt.InvalidValue):
        rt.arena_lend([(lo.address, 4096)], device=1)           # not the runtime's device
    for bad in ([(lo.address, -1)], [(lo.address,)], [(lo.address, 4096.0)], [(True, 4096)], "ab", 5):
        with pytest.raises(vmmrt.InvalidValue):
            rt.arena_lend(bad)
    with pytest.raises(vmmrt.InvalidValue):
        rt.arena_lend([(lo.address, 4096)], device="0")
    s = vmmrt.arena_stats()
    assert s["generation"] == gen and s["lent_bytes"] == 64 * KiB   # nothing changed
    with pytest.raises(vmmrt.InvalidValue):
        vmmrt.arena_stats(64)
    with pytest.raises(vmmrt.InvalidValue):
        vmmrt.arena_stats("0")
    with pytest.raises(vmmrt.InvalidValue):
        vmmrt.arena_reset(-1)


def test_empty_lend_falls_back_and_reset_forgets_the_runtime(rt):
    rt.arena_lend([])
    f = malloc(4 * KiB)
    assert f and vmmrt.arena_stats()["fallback_segments"] == 1
    vmmrt.arena_reset()
    assert malloc(4 * KiB) == 0                              # no runtime to fall back to
    assert vmmrt.arena_stats()["errors"] == 1
    free(f)                                                  # still valid, freed through its runtime
    assert vmmrt.arena_stats()["fallback_segments"] == 0


def test_fallback_outlives_the_runtime():
    vmmrt.arena_reset(0)
    r = vmmrt.Runtime({"backend": "host"})
    r.arena_lend([])
    f = malloc(64 * KiB)
    r.close()
    s = vmmrt.arena_stats()
    assert s["fallback_segments"] == 1 and s["lent_bytes"] == 0
    ctypes.memset(f, 0x33, 64 * KiB)                        # host backend: the address is host memory
    assert ctypes.string_at(f, 16) == b"\x33" * 16
    free(f)                                                  # the last one: the backend closes
    assert vmmrt.arena_stats()["fallback_segments"] == 0
    vmmrt.arena_reset(0)
