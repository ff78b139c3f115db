# SPDX-License-Identifier: LGPL-2.1-or-later
"""What a new user meets installing the package: the build step needs no git,
and vmmrt.torch without torch says what to do."""
import os
import runpy
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(ROOT, "python", "setup.py")


def _setup_functions(monkeypatch):
    setuptools = pytest.importorskip("setuptools")
    monkeypatch.setattr(setuptools, "setup", lambda **kw: None)  # the functions, not a build
    return runpy.run_path(SETUP)


def test_the_sources_are_copied_without_git(tmp_path, monkeypatch):
    # A checkout (it has .git) on a machine without git: every source file,
    # no build output, no python/.
    src = tmp_path / "libvmmrt"
    for rel in (".git/HEAD", "configure.ac", "configure", "src/runtime.c", "src/runtime.o", "src/.libs/x.so.1",
                "Makefile", "Makefile.in", "config.status", "python/setup.py", "tests/unit/test-x.log"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("x")
    setup = _setup_functions(monkeypatch)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no git on it
    dst = tmp_path / "copy"
    setup["copy_source"](str(src), str(dst))
    copied = sorted(os.path.relpath(os.path.join(d, f), str(dst)) for d, _, fs in os.walk(str(dst)) for f in fs)
    assert copied == ["Makefile.in", "configure", "configure.ac", "src/runtime.c"]


def test_vmmrt_torch_without_torch_says_what_to_do():
    code = "import sys; sys.modules['torch'] = None\nimport vmmrt\nimport vmmrt.torch\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: vmmrt.torch needs PyTorch"), r.stderr
    assert sys.executable in last and "pip install torch" in last and "[torch]" in last
