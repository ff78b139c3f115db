# SPDX-License-Identifier: LGPL-2.1-or-later
"""README.md works as written: its PyTorch example runs (on the CPU: eagerly,
host backend), and every shell command it gives works after the Quick start.

"After the Quick start" is: the tree built (make check runs this), the
package installed in the venv ~/venv and nowhere else (no PYTHONPATH, no
VMMRT_LIBRARY). The venv is stood in for by a ~/venv/bin/python, in a HOME
of the test's own, that runs this python over this package and this build.
A command then fails the test when its program does not exist, a path it
names does not exist, or a module it runs with `python -m` is not importable
by the python it names (a `python3 -m vmmrt...` where only the venv has the
package fails so). The cheap ones (`--help`, `python -m vmmrt`, the C
examples) are run and must exit 0; the others (builds, installs) are only
resolved.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

import vmmrt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(vmmrt.__file__)))


def _blocks(lang):
    """The fenced blocks of one language, also those indented in a list."""
    found = re.findall(r"^([ \t]*)```%s\n(.*?)^[ \t]*```" % lang, open(README).read(), re.S | re.M)
    return [textwrap.dedent(body) for _, body in found]


def _build_dirs():
    """Where built programs are: the build tree of the library this run loads
    (make check's, also a VPATH one), the current directory, the source tree."""
    dirs = []
    lib = os.environ.get("VMMRT_LIBRARY") or vmmrt.library_path().path
    if os.path.basename(os.path.dirname(lib)) == ".libs":
        dirs.append(os.path.dirname(os.path.dirname(lib)))
    for d in (os.getcwd(), ROOT):
        if d not in dirs:
            dirs.append(d)
    return dirs


def test_readme_example_runs():
    code = [b for b in _blocks("python") if b.startswith("import torch")]
    if not code:
        pytest.fail("no PyTorch example (a ```python block starting with import torch) in README.md")
    env = dict(os.environ, PYTHONPATH=PKG_PARENT, VMMRT_LIBRARY=vmmrt.library_path().path)
    r = subprocess.run([sys.executable, "-c", code[0]], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "MiB offloaded in all" in r.stdout and "pingpong" in r.stdout


def commands(text):
    """The commands of ```sh blocks: (line, [words]) per simple command, and
    each $(...) inside as one more; comments dropped, continuations joined."""
    out = []
    for block in text:
        for line in block.replace("\\\n", " ").splitlines():
            subs = re.findall(r"\$\(([^()]*)\)", line)
            line = re.sub(r"\$\([^()]*\)", "SUBSTITUTED", line)
            for src in [line] + subs:
                lex = shlex.shlex(src, posix=True, punctuation_chars=True)
                lex.whitespace_split = True
                words = []
                for tok in list(lex) + [";"]:
                    if tok in ("&&", "||", ";", "|", "&"):
                        if words:
                            out.append((src.strip(), words))
                        words = []
                    else:
                        words.append(tok)
    return out


class AfterQuickStart:
    """The state README's commands assume, with a stand-in venv."""

    def __init__(self, home):
        self.home = str(home)
        venv_bin = os.path.join(self.home, "venv", "bin")
        os.makedirs(venv_bin)
        self.venv_python = os.path.join(venv_bin, "python")
        with open(self.venv_python, "w") as f:
            f.write("#!/bin/sh\nPYTHONPATH=%s VMMRT_LIBRARY=%s exec %s \"$@\"\n" % (
                shlex.quote(PKG_PARENT), shlex.quote(vmmrt.library_path().path), shlex.quote(sys.executable)))
        os.chmod(self.venv_python, 0o755)
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "VMMRT_LIBRARY", "VIRTUAL_ENV") and not k.startswith("VMMRT_")}
        self.env["HOME"] = self.home
        self.dirs = _build_dirs()

    def expand(self, word):
        return self.home + word[1:] if word.startswith("~/") else word

    def where(self, rel):
        """The first directory in which the relative path exists."""
        for d in self.dirs:
            if os.path.lexists(os.path.join(d, rel)):
                return d
        return None

    def program(self, word, sudo):
        word = self.expand(word)
        if "/" in word:
            if os.path.isabs(word):
                return word if os.access(word, os.X_OK) else None
            d = self.where(word)
            return os.path.join(d, word) if d and os.access(os.path.join(d, word), os.X_OK) else None
        path = self.env.get("PATH", os.defpath)
        if sudo:  # root's programs: ldconfig
            path += ":/usr/local/sbin:/usr/sbin:/sbin"
        return shutil.which(word, path=path)

    def importable(self, python, module):
        r = subprocess.run([python, "-c", "import importlib.util, sys; "
                            "sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 1)", module],
                           env=self.env, capture_output=True, text=True, timeout=120)
        return r.returncode == 0, r.stderr.strip().splitlines()[-1:] or ["not found"]


def _is_python(prog):
    return re.match(r"^python(3(\.\d+)?)?$", os.path.basename(prog)) is not None


def _cheap(words, prog):
    """Commands quick enough to run: help, which library, the C examples."""
    if words[-1] == "--help":
        return True
    if _is_python(prog) and words[1:] == ["-m", "vmmrt"]:
        return True
    return os.path.basename(prog) in ("vmmrt-example", "vmmrt-offload")


def check(state, line, words):
    """None when the command works as written, else why not."""
    words = [w for w in words]
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)  # VAR=value before the program
    sudo = bool(words) and words[0] == "sudo"
    if sudo:
        words.pop(0)
    if not words or words == ["SUBSTITUTED"]:
        return None
    prog = state.program(words[0], sudo)
    if prog is None:
        return "%r: no program %s" % (line, words[0])
    # Every path it names exists (a relative one in the tree or the build).
    paths = []
    for w in words[1:]:
        w = state.expand(re.sub(r"\[[^]]*\]$", "", w))  # ./python[torch]: the path
        if w.startswith("-") or w == "SUBSTITUTED" or "://" in w or "=" in w:
            continue
        if "/" not in w and not re.search(r"\.(c|h|py|sh|md|whl|gz)$", w):
            continue  # a word, not a path
        if os.path.isabs(w):
            if not os.path.lexists(w):
                return "%r: no %s" % (line, w)
        else:
            if state.where(w) is None:
                return "%r: no %s in %s" % (line, w, " or ".join(state.dirs))
            paths.append(w)
    if os.path.basename(prog) == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w] or ["all"]
        mk = [os.path.join(d, "Makefile") for d in state.dirs if os.path.exists(os.path.join(d, "Makefile"))]
        if not mk:
            return "%r: no Makefile (the Quick start configures one)" % line
        text = open(mk[0]).read()
        for t in targets:
            if not re.search(r"^%s:" % re.escape(t), text, re.M):
                return "%r: no make target %s" % (line, t)
    cwd = next((d for d in state.dirs if all(os.path.lexists(os.path.join(d, p)) for p in paths)), ROOT)
    if _cheap(words, prog):
        r = subprocess.run([prog] + words[1:], cwd=cwd, env=state.env, capture_output=True, text=True,
                           timeout=180)
        if r.returncode != 0:
            return "%r: exit %d: %s" % (line, r.returncode, (r.stderr or r.stdout).strip()[-800:])
        return None
    if _is_python(prog) and len(words) > 2 and words[1] == "-m":
        module = words[2]
        if module == "pip" and prog == state.venv_python:
            return None  # every venv has pip; the stand-in is not a real one
        ok, why = state.importable(prog, module)
        if not ok:
            return "%r: %s cannot import %s (%s)" % (line, words[0], module, why[0])
    return None


def test_readme_commands_work_after_the_quick_start(tmp_path):
    cmds = commands(_blocks("sh"))
    assert len(cmds) >= 5, "README.md gives fewer shell commands than expected: %r" % cmds
    state = AfterQuickStart(tmp_path / "home")
    failures = [why for why in (check(state, line, words) for line, words in cmds) if why]
    assert not failures, "README.md's commands that do not work after the Quick start:\n" + "\n".join(failures)


def test_the_check_catches_what_does_not_work(tmp_path):
    # The check itself: each kind of broken command is caught.
    state = AfterQuickStart(tmp_path / "home")
    broken = ["no-such-program --help", "cc -o x examples/no-such-file.c", "cc -o train train.c", "make no-such-target",
              "python3 -m no_such_module_here", "~/venv/bin/python -m vmmrt.no_such_module --help",
              "./examples/no-such-example", "~/venv/bin/python examples/no_such_example.py --help"]
    for text in broken:
        (line, words), = commands([text + "\n"])
        assert check(state, line, words), "not caught: %s" % text
    # Only the venv has the package: python3 -m vmmrt ... is refused unless
    # python3 itself has it installed.
    (line, words), = commands(["python3 -m vmmrt.torch.bench --help\n"])
    r = subprocess.run(["python3", "-c", "import vmmrt"], env=state.env, capture_output=True, cwd=str(tmp_path))
    if r.returncode != 0:
        assert check(state, line, words)
