# SPDX-License-Identifier: LGPL-2.1-or-later
"""What a user meets first: which library the package loads and why (the
wheel's own first), a missing dependency named with its package, and the
benchmark's and examples' progress lines and tables."""
import os
import shutil
import subprocess
import sys

import pytest

import vmmrt
from vmmrt import _loader
from vmmrt.torch.bench import progress, report


def _python(args, env, cwd=None):
    return subprocess.run([sys.executable] + args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def _package_copy(tmp_path):
    """This package, copied to tmp_path/python/vmmrt (a checkout's place,
    without a checkout unless the test makes one), with the library this test
    run loads in its _lib/ (as the wheel has it)."""
    pkg = tmp_path / "python" / "vmmrt"
    if pkg.exists():
        shutil.rmtree(str(pkg))
    shutil.copytree(os.path.dirname(vmmrt.__file__), str(pkg),
                    ignore=shutil.ignore_patterns("__pycache__", "_config.py", "_lib"))
    (pkg / "_lib").mkdir()
    shutil.copyfile(vmmrt.library_path().path, str(pkg / "_lib" / _loader.SONAME))
    return pkg


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("VMMRT_LIBRARY", "PYTHONPATH")}
    env.update(kw)
    return env


def test_library_path_says_what_is_loaded_and_why():
    loaded = vmmrt.library_path()
    assert os.path.isabs(loaded.path) and os.path.exists(loaded.path)
    assert os.path.basename(loaded.path).startswith(_loader.SONAME)
    assert loaded.reason and str(loaded) == "%s (%s)" % (loaded.path, loaded.reason)


def test_the_bundled_library_comes_first(tmp_path):
    # Inside a checkout with a build of its own too: the package's library wins.
    pkg = _package_copy(tmp_path)
    (tmp_path / "configure.ac").write_text("")
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "vmmrt.h").write_text("")
    (tmp_path / ".libs").mkdir()
    shutil.copyfile(vmmrt.library_path().path, str(tmp_path / ".libs" / _loader.SONAME))
    r = _python(["-m", "vmmrt"], _env(PYTHONPATH=str(pkg.parent)), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "%s (bundled in the package)" % (pkg / "_lib" / _loader.SONAME) in r.stdout
    shutil.rmtree(str(pkg / "_lib"))
    r = _python(["-m", "vmmrt"], _env(PYTHONPATH=str(pkg.parent)), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "%s (the build of the checkout this package is in)" % (tmp_path / ".libs" / _loader.SONAME) in r.stdout
    _package_copy(tmp_path)
    # VMMRT_LIBRARY still wins: it is the user's explicit choice.
    r = _python(["-m", "vmmrt"], _env(PYTHONPATH=str(pkg.parent), VMMRT_LIBRARY=vmmrt.library_path().path),
                cwd=str(tmp_path))
    assert r.returncode == 0 and "(VMMRT_LIBRARY is set)" in r.stdout, r.stdout + r.stderr


def test_outside_a_checkout_the_in_tree_place_says_so(tmp_path):
    pkg = _package_copy(tmp_path)
    shutil.rmtree(str(pkg / "_lib"))
    code = ("from vmmrt import _loader\n"
            "for place, path, why in _loader._candidates():\n    print(place, '|', why)\n")
    r = _python(["-c", code], _env(PYTHONPATH=str(pkg.parent)), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "in-tree build | %s is not in a libvmmrt checkout" % pkg in r.stdout


def test_a_missing_dependency_is_named_with_its_package(tmp_path):
    # The real library, with one dependency renamed to a soname no system has:
    # the dynamic loader's own refusal, as on a machine without liburcu.
    data = open(vmmrt.library_path().path, "rb").read()
    if b"liburcu-bp.so.8\0" not in data:
        pytest.skip("this libvmmrt does not need liburcu-bp.so.8")
    broken = tmp_path / _loader.SONAME
    broken.write_bytes(data.replace(b"liburcu-bp.so.8\0", b"liburcu-bp.so.0\0"))
    r = _python(["-m", "vmmrt"], _env(VMMRT_LIBRARY=str(broken), PYTHONPATH=os.path.dirname(
        os.path.dirname(vmmrt.__file__))), cwd=str(tmp_path))
    assert r.returncode == 1
    assert "libvmmrt needs liburcu-bp.so.0, which this system lacks" in r.stderr, r.stderr
    assert "apt-get install liburcu8" in r.stderr


def test_progress_prints_a_line_as_each_part_starts_and_ends(capsys):
    with progress.Progress(2, "modes", bar=False) as p:
        p.start("eager")
        p.end("eager: 1.0 ms")
        p.start("pingpong")
        p.end()
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["[1/2] eager: started", "eager: 1.0 ms", "[2/2] pingpong: started"]
    assert out[3].startswith("[2/2] pingpong: done in ")


def test_table_leaves_out_columns_without_a_figure():
    rows = [{"mode": "eager", "step_ms": 10.0, "opt_ms": 1.0},
            {"mode": "eager-pingpong", "step_ms": 12.0, "opt_ms": 1.0, "d2h_bytes_per_step": 1 << 20,
             "h2d_bytes_per_step": 1 << 20, "d2h_gbps": 5.0, "h2d_gbps": 5.0}]
    head = report.table(rows, "t", 5.0, 5.0, ref_name="eager").splitlines()[1]
    assert "moved MiB" in head and "opt ms" in head
    # No graph-only ran: no ratio against it, and no copy bound (nothing to add the copies to).
    for gone in ("vs graph", "peak MiB", "bound ms", "/bound"):
        assert gone not in head
    rows[1]["head_tail_ms"] = 3.0
    assert "/bound" in report.table(rows, "t", 5.0, 5.0, ref_name="eager").splitlines()[1]
