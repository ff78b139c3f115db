# SPDX-License-Identifier: LGPL-2.1-or-later
"""vmmrt.Pages and Slot.map_pages, on the host backend and, where there is one,
on a CUDA device: slots bound to the same pages see each other's bytes, an
offset picks the bytes, every misuse is refused loudly, an unbound slot maps
memory of its own again, and the driver calls are those of the C API
(vmmrt_slot_map_pages(3))."""
import ctypes

import pytest

import vmmrt

MiB = 1 << 20
BACKENDS = ["host", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def runtime(backend):
    rt = vmmrt.Runtime({"backend": backend})
    assert rt.info()["granularity"] == 2 * MiB     # what the sizes below are made of (the H200's too)
    return rt


def put(rt, address, nbytes, byte):
    buf = (ctypes.c_ubyte * nbytes)(*([byte] * nbytes))
    rt.copy_to_device(address, ctypes.addressof(buf), nbytes)


def get(rt, address, nbytes):
    buf = (ctypes.c_ubyte * nbytes)()
    rt.copy_to_host(ctypes.addressof(buf), address, nbytes)
    return bytes(buf)


def counts(rt):
    return {s["name"]: s["count"] for s in rt.driver_stats()}


def test_two_slots_share_the_pages_bytes(backend):
    with runtime(backend) as rt:
        p = rt.pages(3 * MiB)
        assert p.size == 4 * MiB                      # rounded to the granularity
        a, b = rt.slot(4 * MiB), rt.slot(4 * MiB)
        a.map_pages(p)
        b.map_pages(p, 0)
        assert a.state == b.state == "mapped"
        put(rt, a.address + 4096, 64, 0x5A)
        assert get(rt, b.address + 4096, 64) == b"\x5a" * 64
        put(rt, b.address, 16, 0x11)
        assert get(rt, a.address, 16) == b"\x11" * 16
        a.destroy()
        b.destroy()
        p.destroy()
        p.destroy()                                   # once is enough: nothing more


def test_an_offset_picks_the_bytes(backend):
    with runtime(backend) as rt:
        p = rt.pages(6 * MiB)
        whole, hi = rt.slot(6 * MiB), rt.slot(2 * MiB)
        whole.map_pages(p)
        hi.map_pages(p, offset=4 * MiB)
        put(rt, whole.address + 4 * MiB, 32, 0x77)
        put(rt, whole.address, 32, 0x01)
        assert get(rt, hi.address, 32) == b"\x77" * 32


def test_misuse_is_refused(backend):
    with runtime(backend) as rt, runtime(backend) as other:
        p, q = rt.pages(4 * MiB), other.pages(2 * MiB)
        s = rt.slot(2 * MiB)
        with pytest.raises(vmmrt.InvalidValue) as e:
            s.map_pages(p, MiB)                       # not a multiple of the granularity
        assert e.value.name == "VMMRT_E_INVALID_ARGUMENT" and "granularity" in str(e.value)
        with pytest.raises(vmmrt.InvalidValue) as e:
            s.map_pages(p, 4 * MiB)                   # past the end
        assert e.value.name == "VMMRT_E_INVALID_SIZE"
        with pytest.raises(vmmrt.InvalidValue) as e:
            s.map_pages(q)
        assert "different runtimes" in str(e.value)
        for bad in (-2 * MiB, 1.0, True, None):
            with pytest.raises(vmmrt.InvalidValue):
                s.map_pages(p, bad)
        with pytest.raises(TypeError):
            s.map_pages("pages")
        for bad in (0, -1, 2.0 * MiB, True):
            with pytest.raises(vmmrt.InvalidValue):
                rt.pages(bad)
        assert s.state == "reserved"
        s.map()
        with pytest.raises(vmmrt.Error) as e:
            s.map_pages(p)                            # mapped with its own memory
        assert e.value.name == "VMMRT_E_INVALID_STATE" and not isinstance(e.value, ValueError)
        s.unmap()
        s.map_pages(p)
        with pytest.raises(vmmrt.Error) as e:
            s.release_after()                         # the memory is the pages'
        assert e.value.name == "VMMRT_E_INVALID_STATE" and "unbinds" in str(e.value)
        p.destroy()
        with pytest.raises(vmmrt.Error) as e:
            s.map_pages(p)
        assert e.value.name == "VMMRT_E_INVALID_STATE" and "destroyed" in str(e.value)


def test_unbind_then_own_memory_and_driver_calls(backend):
    with runtime(backend) as rt:
        rt.driver_stats_reset()
        p = rt.pages(2 * MiB)
        a, b = rt.slot(2 * MiB), rt.slot(2 * MiB)
        a.map_pages(p)
        b.map_pages(p)
        put(rt, b.address, 8, 0x42)
        a.map_async()                                 # bound: mapped, nothing queued
        a.wait()
        assert counts(rt) == {"cuMemCreate": 1, "cuMemMap": 2, "cuMemSetAccess": 2, "cuMemUnmap": 0,
                              "cuMemRelease": 0}
        a.unmap()                                     # unbinds: the pages keep their memory
        assert a.state == "reserved"
        assert counts(rt)["cuMemRelease"] == 0
        a.map()                                       # its own memory now
        put(rt, a.address, 8, 0x24)
        assert get(rt, b.address, 8) == b"\x42" * 8
        a.unmap()
        assert counts(rt)["cuMemCreate"] == counts(rt)["cuMemRelease"] + 1 == 2


def test_pages_outlive_their_destroy_while_bound_and_the_runtime_takes_the_rest(backend):
    rt = runtime(backend)
    p = rt.pages(2 * MiB)
    a = rt.slot(2 * MiB)
    a.map_pages(p)
    put(rt, a.address, 8, 0x33)
    p.destroy()                                       # a still maps it: the bytes stay
    assert get(rt, a.address, 8) == b"\x33" * 8
    left = rt.pages(2 * MiB)
    rt.slot(2 * MiB).map_pages(left)
    rt.close()                                        # destroys the slots, then the pages: no leak
    left.destroy()                                    # gone with the runtime: nothing to do
    with pytest.raises(vmmrt.Error):
        a.map_pages(left)


def test_a_table_maps_granule_by_granule(backend):
    with runtime(backend) as rt:
        g = 2 * MiB
        p = rt.pages(3 * g)
        pool, third, whole = rt.slot(4 * g), rt.slot(g), rt.slot(3 * g)
        rt.driver_stats_reset()
        pool.map_pages_table(p, [2 * g, 0, 2 * g, g])   # more granules than the pages have
        assert pool.state == "mapped"
        assert counts(rt) == {"cuMemCreate": 0, "cuMemMap": 4, "cuMemSetAccess": 4, "cuMemUnmap": 0,
                              "cuMemRelease": 0}
        third.map_pages(p, 2 * g)
        whole.map_pages(p)
        put(rt, whole.address, 16, 0x01)                # the pages' granule 0
        put(rt, whole.address + g, 16, 0x02)            # their granule 1
        put(rt, pool.address, 16, 0x03)                 # the pool's granule 0: the pages' granule 2
        assert get(rt, pool.address + 2 * g, 16) == b"\x03" * 16
        assert get(rt, third.address, 16) == b"\x03" * 16
        assert get(rt, pool.address + g, 16) == b"\x01" * 16
        assert get(rt, pool.address + 3 * g, 16) == b"\x02" * 16
        pool.unmap()                                    # one unmap a granule; the pages keep their bytes
        assert counts(rt)["cuMemUnmap"] == 4 and counts(rt)["cuMemRelease"] == 0
        pool.map_pages_table(p, (g, g, 0, 0))           # another table (any sequence)
        assert get(rt, pool.address, 16) == b"\x02" * 16
        assert get(rt, pool.address + 3 * g, 16) == b"\x01" * 16


def test_a_bad_table_is_refused(backend):
    with runtime(backend) as rt, runtime(backend) as other:
        g = 2 * MiB
        p, q = rt.pages(2 * g), other.pages(g)
        s = rt.slot(2 * g)
        for table, name, text in [
                ([0], "VMMRT_E_INVALID_SIZE", "one per granule"),          # not one offset per granule
                ([0, 0, 0], "VMMRT_E_INVALID_SIZE", "one per granule"),
                ([], "VMMRT_E_INVALID_SIZE", "one per granule"),
                ([0, MiB], "VMMRT_E_INVALID_ARGUMENT", "offsets[1]"),      # not a multiple of the granularity
                ([2 * g, 0], "VMMRT_E_INVALID_SIZE", "offsets[0]"),        # its granule past the end
                ([0, (1 << 64) - g], "VMMRT_E_INVALID_SIZE", "offsets[1]")]:  # aligned: + g would wrap
            with pytest.raises(vmmrt.InvalidValue) as e:
                s.map_pages_table(p, table)
            assert e.value.name == name and text in str(e.value), (table, str(e.value))
        for bad in ([0, -g], [0, 1.0], [0, True], [0, None], [0, 1 << 64], "ab", b"ab", 5, None, {0, g}):
            with pytest.raises(vmmrt.InvalidValue) as e:
                s.map_pages_table(p, bad)
            assert e.value.name == "VMMRT_E_INVALID_ARGUMENT", bad
        with pytest.raises(vmmrt.InvalidValue) as e:
            s.map_pages_table(q, [0, 0])
        assert "different runtimes" in str(e.value)
        with pytest.raises(TypeError):
            s.map_pages_table("pages", [0, 0])
        assert s.state == "reserved"                    # no refusal mapped anything
        s.map_pages_table(p, [g, g])
        with pytest.raises(vmmrt.Error) as e:
            s.map_pages_table(p, [0, 0])                # bound already
        assert e.value.name == "VMMRT_E_INVALID_STATE" and not isinstance(e.value, ValueError)
        s.unmap()
        p.destroy()
        with pytest.raises(vmmrt.Error) as e:
            s.map_pages_table(p, [0, 0])
        assert e.value.name == "VMMRT_E_INVALID_STATE" and "destroyed" in str(e.value)
