# SPDX-License-Identifier: LGPL-2.1-or-later
"""The README's example runs as written (on the CPU: eagerly, host backend)."""
import os
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def test_readme_example_runs():
    text = open(README).read()
    start = text.index("```python\nimport torch")
    code = text[start + len("```python\n"):text.index("```", start + 3)]
    if "import torch" not in code:
        pytest.fail("no example found in README.md")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "MiB offloaded in all" in r.stdout and "pingpong" in r.stdout
