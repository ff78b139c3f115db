# SPDX-License-Identifier: LGPL-2.1-or-later
"""The ctypes binding: loading, errors as exceptions, the C API's structs."""
import ctypes
import os
import subprocess
import sys

import pytest

import vmmrt
from vmmrt import _capi, _loader


def test_version_matches_the_abi():
    assert vmmrt.version()[:2] >= (0, 2)
    assert vmmrt.version_string() == "%d.%d.%d" % vmmrt.version()


def test_error_carries_status_name_and_message():
    with pytest.raises(vmmrt.Error) as e:
        vmmrt.Runtime({"backend": "host", "mode": "pingpog"})
    assert e.value.status == _capi.E_INVALID_OPTION
    assert e.value.name == "VMMRT_E_INVALID_OPTION"
    assert "pingpog" in str(e.value) and "mode" in str(e.value)


def test_unknown_option_name_is_an_error():
    with pytest.raises(vmmrt.Error) as e:
        vmmrt.Runtime({"backend": "host", "driver_worker": 2})
    assert e.value.name == "VMMRT_E_INVALID_OPTION"
    assert "driver_worker" in str(e.value)


def test_runtime_info_and_memory():
    with vmmrt.Runtime({"backend": "host"}) as rt:
        info = rt.info()
        assert info["backend"] == "host" and info["granularity"] > 0
        free, total = rt.mem_info()
        assert 0 < free <= total
        assert len(rt.driver_stats()) == _capi.DRIVER_CALLS


def test_group_life_cycle_and_named_errors():
    with vmmrt.Runtime({"backend": "host", "mode": "pingpong"}) as rt:
        g = rt.group("layer0")
        with pytest.raises(vmmrt.Error) as e:
            g.discover(g.desc(0))  # a 0-byte descriptor
        assert e.value.name == "VMMRT_E_INVALID_SIZE" and "layer0" in str(e.value)
        d = g.desc(1000, 3, (10, 100), (100, 1))
        g.discover(d)
        assert g.state == "discovering"
        rt.offload_allocate()
        assert g.state == "allocated" and g.address and g.nbytes == 1000
        g.begin_capture()
        addr = g.save(d)
        g.end_capture()
        assert addr == g.address and g.state == "ready"
        g.begin_capture()  # capture may begin again, and hands out the same address
        assert g.save(d) == addr
        with pytest.raises(vmmrt.Error) as e:
            g.save(d)
        assert e.value.name == "VMMRT_E_MISMATCH"
        stats = rt.offload_stats()
        assert stats["groups"] == 1 and stats["mode"] == "pingpong"


def test_group_replay_is_a_use_in_one_call():
    """Group.replay (vmmrt_group_replay): the hooks and, on the host backend,
    one of its own graphs between them; anything else is refused first."""
    with vmmrt.Runtime({"backend": "host", "mode": "pingpong"}) as rt:
        g = rt.group("layer0")
        d = g.desc(4096)
        g.discover(d)
        rt.offload_allocate()
        g.begin_capture()
        g.save(d)
        g.end_capture()
        s = rt.stream_create()
        rt.graph_begin_capture(s)
        graph = rt.graph_end_capture(s)
        with pytest.raises(TypeError):
            g.replay(0, graph, s)
        with pytest.raises(vmmrt.Error) as e:
            g.replay(True, graph, s)                # no forward yet
        assert e.value.name == "VMMRT_E_INVALID_STATE" and "vmmrt_group_replay" in str(e.value)
        with pytest.raises(vmmrt.Error) as e:
            g.replay(False, 12345, s)               # not a graph of the host backend's
        assert e.value.name == "VMMRT_E_NOT_SUPPORTED"
        g.replay(False, graph, s)
        g.replay(True, graph, s)
        g.replay(False, 0, s)                       # the hooks alone
        g.replay(True, 0, s)
        # copies after the begin hook (vmmrt_group_replay_copies): in, then out of the group
        src, out = rt.slot(4096), rt.slot(4096)
        src.map()
        out.map()
        rt.kernel_fill(src.address, 4096, 7, s)
        with pytest.raises(vmmrt.Error) as e:
            g.replay(False, graph, s, copies=[(g.address, g.address + 8, 64)])
        assert e.value.name == "VMMRT_E_INVALID_ARGUMENT" and "overlaps" in str(e.value)
        for bad in ([(g.address, src.address)], [(g.address, src.address, -1)], [(g.address, 1.5, 8)],
                    [(g.address, src.address, 1 << 64)], [None]):
            with pytest.raises(ValueError, match="non-negative ints"):
                g.replay(False, graph, s, copies=bad)
        g.replay(False, graph, s, copies=[(g.address, src.address, 4096)])
        g.replay(True, graph, s, copies=[(out.address, g.address, 4096)])
        rt.stream_synchronize(s)
        a, b = (ctypes.create_string_buffer(4096) for _ in range(2))
        rt.copy_to_host(ctypes.addressof(a), out.address, 4096)
        rt.copy_to_host(ctypes.addressof(b), src.address, 4096)
        assert a.raw == b.raw and a.raw != bytes(4096)
        assert rt.offload_stats()["iterations"] == 3
        rt.graph_destroy(graph)
        rt.stream_destroy(s)


def test_struct_sizes_are_set_by_the_binding():
    info = _capi.sized(_capi.OffloadStats)
    assert info.size == __import__("ctypes").sizeof(_capi.OffloadStats)


def test_loader_lists_every_place_it_tried(monkeypatch):
    monkeypatch.setenv("VMMRT_LIBRARY", "/nonexistent/libvmmrt.so.1")
    with pytest.raises(_loader.LibraryNotFound) as e:
        _loader.load()
    assert "VMMRT_LIBRARY=/nonexistent/libvmmrt.so.1: no such file" in str(e.value)
    monkeypatch.delenv("VMMRT_LIBRARY")
    places = [c[0] for c in _loader._candidates()]
    assert places[0] == "VMMRT_LIBRARY"
    assert places[1].startswith("bundled ")
    assert any(p.startswith("in-tree build") for p in places)
    assert any(p.startswith("installed libdir") for p in places)
    assert any("find_library" in p for p in places)
    assert places[-1].startswith("dynamic loader search")


def _python(code, env):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_missing_library_is_a_clear_error_at_first_use():
    env = dict(os.environ, VMMRT_LIBRARY="/nonexistent/libvmmrt.so.1")
    r = _python("import vmmrt, vmmrt.torch\n"
                "try:\n    vmmrt.Runtime()\n"
                "except vmmrt.LibraryNotFound as e:\n    print('NOTFOUND', e)\n", env)
    assert r.returncode == 0, r.stderr
    assert "NOTFOUND libvmmrt could not be loaded" in r.stdout
    assert "VMMRT_LIBRARY=/nonexistent/libvmmrt.so.1: no such file" in r.stdout


@pytest.mark.parametrize("order", ["torch first", "vmmrt first"])
def test_loads_whether_torch_was_imported_before_or_after(order):
    code = {"torch first": "import torch, vmmrt\nrt = vmmrt.Runtime({'backend': 'host'})\n",
            "vmmrt first": "import vmmrt\nrt = vmmrt.Runtime({'backend': 'host'})\nimport torch, vmmrt.torch\n"}
    r = _python(code[order] + "print(rt.info()['backend'])\nrt.close()\n", dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "host"


HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "include")


def _c_layout(struct, fields):
    """sizeof and offsetof of a header struct, from a C compiler (None without one)."""
    import shutil
    import tempfile
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not os.path.exists(os.path.join(HEADER, "vmmrt.h")):
        return None
    body = "".join('printf("%%zu\\n", offsetof(%s, %s));\n' % (struct, f) for f in fields)
    src = ("#include <stddef.h>\n#include <stdio.h>\n#include <vmmrt.h>\nint main(void) {\n"
           'printf("%%zu\\n", sizeof(%s));\n%sreturn 0;\n}\n' % (struct, body))
    with tempfile.TemporaryDirectory() as d:
        c, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
        open(c, "w").write(src)
        r = subprocess.run([cc, "-I", HEADER, c, "-o", exe], capture_output=True, text=True)
        if r.returncode != 0:
            return None
        out = [int(v) for v in subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split()]
    return out[0], out[1:]


@pytest.mark.parametrize("ctype,struct", [(_capi.OffloadStats, "vmmrt_offload_stats"),
                                          (_capi.ScheduleStep, "vmmrt_schedule_step"),
                                          (_capi.RuntimeInfo, "vmmrt_runtime_info"),
                                          (_capi.DriverStats, "vmmrt_driver_stats"),
                                          (_capi.TensorDesc, "vmmrt_tensor_desc"),
                                          (_capi.OptionInfo, "vmmrt_option_info")])
def test_structs_match_the_header(ctype, struct):
    """Every field at the header's offset, and the same size (a C compiler says)."""
    import ctypes
    names = [n for n, _ in ctype._fields_]
    got = _c_layout(struct, names)
    if got is None:
        pytest.skip("no C compiler, or no include/vmmrt.h next to the package")
    size, offsets = got
    assert ctypes.sizeof(ctype) == size
    assert [getattr(ctype, n).offset for n in names] == offsets


def _two_microbatches(rt):
    """Groups for 2 layers x 2 microbatches, each with one 4 KiB tensor, and 1F1B
    with 2 in flight: F0 F1 (each over both layers), B0, B1."""
    g = {(mb, l): rt.group("l%d/mb%d" % (l, mb)) for mb in range(2) for l in range(2)}
    d = vmmrt.Group.desc(4096)
    for x in g.values():
        x.discover(d)
    order = ([(g[0, 0], 0), (g[0, 1], 0), (g[1, 0], 0), (g[1, 1], 0)] +
             [(g[0, 1], 1), (g[0, 0], 1), (g[1, 1], 1), (g[1, 0], 1)])
    return g, d, order


def _capture(groups, d):
    for x in groups:
        x.begin_capture()
        x.save(d)
        x.end_capture()


def _use(x, backward):
    if backward:
        x.backward_begin()
        x.backward_end()
    else:
        x.forward_begin()
        x.forward_end()


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
def test_declared_schedule_is_followed_and_checked(mode):
    with vmmrt.Runtime({"backend": "host", "mode": mode}) as rt:
        g, d, order = _two_microbatches(rt)
        rt.offload_set_schedule(order)
        rt.offload_allocate()
        _capture(g.values(), d)
        for x, b in order:
            _use(x, b)
        s = rt.offload_stats()
        assert s["schedule_declared"] == 1 and s["schedule_recorded"] == 1 and s["iterations"] == 1
        if mode == "pingpong":
            assert s["banks"] >= 2 and s["bank_conflicts"] == 0
        _use(g[0, 0], 0)
        _use(g[0, 1], 0)
        with pytest.raises(vmmrt.Error) as e:
            _use(g[0, 1], 1)             # a backward where the order has the forward of microbatch 1
        assert e.value.name == "VMMRT_E_MISMATCH"
        assert "group 'l1/mb0'" in str(e.value) and "is 'l0/mb1'" in str(e.value)
        for x, b in order[2:]:          # a refused hook changes nothing: the iteration goes on
            _use(x, b)
        rt.offload_sync()
        assert rt.offload_stats()["iterations"] == 2


def test_a_schedule_is_refused_when_it_is_not_an_order():
    with vmmrt.Runtime({"backend": "host"}) as rt:
        g, d, order = _two_microbatches(rt)
        with pytest.raises(vmmrt.Error) as e:
            rt.offload_set_schedule([(g[0, 0], 1), (g[0, 0], 0)])   # a backward before its forward
        assert e.value.name == "VMMRT_E_INVALID_STATE"
        with pytest.raises(TypeError):
            rt.offload_set_schedule([("l0", 0)])
        rt.offload_set_schedule(order[:4] + order[4:-1] + order[-1:])
        rt.offload_allocate()
        with pytest.raises(vmmrt.Error) as e:
            rt.offload_set_schedule(order)                           # after allocation
        assert e.value.name == "VMMRT_E_INVALID_STATE"


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
def test_abort_mid_iteration_and_start_again(mode):
    with vmmrt.Runtime({"backend": "host", "mode": mode}) as rt:
        g, d, order = _two_microbatches(rt)
        with pytest.raises(vmmrt.Error) as e:
            rt.offload_abort()
        assert e.value.name == "VMMRT_E_INVALID_STATE"      # nothing allocated: no iteration to abort
        rt.offload_set_schedule(order)
        rt.offload_allocate()
        _capture(g.values(), d)
        for x, b in order[:5]:                               # up to the first backward
            _use(x, b)
        g[0, 0].backward_begin()                             # and a backward begun, never ended
        rt.offload_abort()
        for _ in range(2):                                   # then whole iterations, from the start
            for x, b in order:
                _use(x, b)
        rt.offload_sync()
        s = rt.offload_stats()
        assert s["aborts"] == 1 and s["iterations"] == 2


def test_rediscover_a_group_and_release_its_old_memory():
    with vmmrt.Runtime({"backend": "host", "mode": "pingpong"}) as rt:
        g, d, order = _two_microbatches(rt)
        rt.offload_allocate()                                # the order recorded by the first iteration
        _capture(g.values(), d)
        for x, b in order:
            _use(x, b)
        x = g[1, 1]
        old = x.address
        x.rediscover()
        assert x.state == "discovering"
        big = vmmrt.Group.desc(3 * 4096)
        x.discover(big)
        rt.offload_allocate()                                # the re-discovered group only
        assert x.nbytes == 3 * 4096 and g[0, 0].state == "ready"
        x.begin_capture()
        assert x.save(big) != old or x.address != old
        x.end_capture()
        assert rt.offload_stats()["retired_groups"] == 1
        for x_, b in order:
            _use(x_, b)
        rt.offload_release_retired()
        assert rt.offload_stats()["retired_groups"] == 0


def test_slot_stream_ordered_backing():
    """map_async, wait and release_after on the host backend: the release waits for its
    stream, a map before it ran cancels it, the memory goes back, and the stats follow."""
    import ctypes
    import time
    with vmmrt.Runtime({"backend": "host", "handle_pool": 4}) as rt:
        s = rt.slot(1 << 20)
        stream = rt.stream_create()
        free0, _ = rt.mem_info()
        s.map_async()
        s.wait()
        assert s.state == "mapped" and rt.offload_stats()["slot_bytes"] == s.size
        rt.kernel_fill(s.address, s.size, 3, stream)
        rt.kernel_busy(200 * 1000 * 1000, stream)  # 200 ms
        s.release_after(stream)
        assert s.state == "pending" and rt.mem_info()[0] == free0 - s.size
        s.map_async()  # needed again before the GPU got there: the release is cancelled
        rt.stream_synchronize(stream)
        for _ in range(5000):
            if s.state != "pending":
                break
            time.sleep(0.001)
        word = ctypes.c_uint64()
        rt.copy_to_host(ctypes.addressof(word), s.address, 8)
        assert s.state == "mapped" and word.value == vmmrt.fill_word(3, 0)
        s.release_after(stream)
        for _ in range(5000):
            if s.state != "pending":
                break
            time.sleep(0.001)
        assert s.state == "reserved" and rt.mem_info()[0] == free0  # to the driver, not the pool
        stats = rt.offload_stats()
        assert stats["slot_bytes"] == 0 and stats["slot_peak_bytes"] == s.size
        with pytest.raises(vmmrt.Error) as e:
            s.release_after(stream)
        assert e.value.name == "VMMRT_E_INVALID_STATE" and "neither mapped" in str(e.value)
        s.destroy()
        rt.stream_destroy(stream)
