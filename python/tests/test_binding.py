# SPDX-License-Identifier: LGPL-2.1-or-later
"""The ctypes binding: loading, errors as exceptions, the C API's structs."""
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


def test_struct_sizes_are_set_by_the_binding():
    info = _capi.sized(_capi.OffloadStats)
    assert info.size == __import__("ctypes").sizeof(_capi.OffloadStats)


def test_loader_lists_every_place_it_tried(monkeypatch):
    monkeypatch.setenv("VMMRT_LIBRARY", "/nonexistent/libvmmrt.so.1")
    with pytest.raises(_loader.LibraryNotFound) as e:
        _loader.load()
    assert "VMMRT_LIBRARY=/nonexistent/libvmmrt.so.1: no such file" in str(e.value)
    monkeypatch.delenv("VMMRT_LIBRARY")
    places = [p for p, _ in _loader._candidates()]
    assert places[0] == "VMMRT_LIBRARY"
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
