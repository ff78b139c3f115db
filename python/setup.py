# SPDX-License-Identifier: LGPL-2.1-or-later
"""The wheel's build step: libvmmrt built by the project's own Autotools build.

pyproject.toml holds the metadata; this file only adds three commands to
setuptools (doc/install.md, "The manylinux wheel and the sdist", says why setuptools):

- build_py also runs ``./configure && make libvmmrt.la`` on a copy of the C
  sources (the checkout above python/, or csrc/ in an sdist) in a temporary
  directory, and puts ``libvmmrt.so.1`` in ``vmmrt/_lib/`` with the shared
  libraries it needs that a bare machine lacks (liburcu, ConcurrencyKit:
  Debian's static archives are not PIC), found through its ``$ORIGIN`` run
  path. The loader (vmmrt/_loader.py) tries ``vmmrt/_lib/`` first.
- sdist carries the C sources, with ``configure`` generated, in ``csrc/``.
- bdist_wheel tags the wheel ``py3-none-<platform>``: it holds a native
  library but no extension module, so one wheel serves every Python 3.

An editable install (``pip install -e ./python``) builds nothing: the loader
finds the checkout's own build, ``.libs/libvmmrt.so.1``.

``LIBVMMRT_CONFIGURE_FLAGS`` adds arguments to ``./configure`` (for example
``--with-cuda=/opt/cuda``).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "libvmmrt.so.1"
# What the wheel carries beside the library: everything but the C library
# itself and the loader, which every Linux has.
BUNDLED = re.compile(r"^lib(urcu[a-z-]*|ck)\.so")
NEEDS = ("a C compiler, make, pkg-config, liburcu-dev and libck-dev (Debian and Ubuntu: "
         "apt-get install build-essential pkg-config liburcu-dev libck-dev; from a git "
         "checkout also autoconf automake libtool; scripts/quickstart.sh installs them all)")


def c_source():
    """The C tree: csrc/ in an sdist, else the checkout python/ lives in."""
    for d in (os.path.join(HERE, "csrc"), os.path.dirname(HERE)):
        if os.path.exists(os.path.join(d, "configure.ac")) and os.path.exists(os.path.join(d, "src")):
            return d
    sys.exit("vmmrt: libvmmrt's C sources are not here (neither %s/csrc nor %s is a libvmmrt "
             "tree): build from a checkout of libvmmrt or from its sdist"
             % (HERE, os.path.dirname(HERE)))


def copy_source(src, dst):
    """Copy the C sources, without python/ and without any build output (a
    configured or built checkout would otherwise hand its objects, its
    Makefile and its options to this build)."""
    listed = None
    # A checkout with git: only its files (not what a build left there). Without
    # git (a machine that never installed it, a downloaded tree, an sdist's
    # csrc/), every file but the build outputs below.
    if os.path.exists(os.path.join(src, ".git")) and shutil.which("git") is not None:
        listed = subprocess.run(["git", "-C", src, "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True)
    if listed is not None and listed.returncode == 0:
        for rel in listed.stdout.decode().split("\0"):
            if not rel or rel.startswith("python/") or not os.path.isfile(os.path.join(src, rel)):
                continue
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(os.path.join(src, rel), os.path.join(dst, rel))
        return
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(
        "python", ".git", "*.o", "*.lo", "*.la", "*.a", ".libs", ".deps", "*.so*", "Makefile",
        "config.status", "config.log", "config.h", "libtool", "stamp-h1", "*_fatbin.c", "*.fatbin",
        "autom4te.cache", "*.log", "*.trs", "*.tar.gz", "*.whl"))


def run(cmd, cwd):
    print("vmmrt: %s" % " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = r.stdout.decode(errors="replace").splitlines()[-25:]
        sys.exit("\n".join(tail) + "\nvmmrt: `%s` failed (exit %d). Building libvmmrt needs %s."
                 % (" ".join(cmd), r.returncode, NEEDS))


def build_library(out):
    """Build libvmmrt.so.1 and put it, with what it needs, in ``out``."""
    for tool in ("make", "pkg-config"):
        if shutil.which(tool) is None:
            sys.exit("vmmrt: `%s` not found. Building libvmmrt needs %s." % (tool, NEEDS))
    src = c_source()
    out = os.path.abspath(out)
    with tempfile.TemporaryDirectory(prefix="vmmrt-build-") as work:
        tree = os.path.join(work, "libvmmrt")
        copy_source(src, tree)
        if not os.path.exists(os.path.join(tree, "configure")):
            if shutil.which("autoreconf") is None:
                sys.exit("vmmrt: a git checkout needs autoreconf to generate configure. "
                         "Building libvmmrt needs %s." % NEEDS)
            run(["autoreconf", "-fi"], tree)
        # \$$ORIGIN: make turns $$ into $, the shell the backslash into nothing.
        flags = ["--disable-static", "LDFLAGS=-Wl,-rpath,\\$$ORIGIN"]
        run(["./configure"] + flags + shlex.split(os.environ.get("LIBVMMRT_CONFIGURE_FLAGS", "")), tree)
        run(["make", "-j%d" % max(1, len(os.sched_getaffinity(0))), "libvmmrt.la"], tree)
        built = os.path.join(tree, ".libs", SONAME)
        os.makedirs(out, exist_ok=True)
        shutil.copyfile(built, os.path.join(out, SONAME))
        if shutil.which("strip"):
            run(["strip", "--strip-debug", os.path.join(out, SONAME)], out)
        for name, path in dependencies(built):
            shutil.copyfile(path, os.path.join(out, name))
            copyright_of(path, out)


def dependencies(lib):
    """The (soname, path) pairs ldd resolves for ``lib`` that the wheel carries."""
    r = subprocess.run(["ldd", lib], capture_output=True, text=True, check=True)
    deps = []
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m and BUNDLED.match(m.group(1)):
            deps.append((m.group(1), os.path.realpath(m.group(2))))
    return deps


def copyright_of(path, out):
    """The licence of a bundled library (<package>.copyright in ``out``), from its
    Debian package when dpkg knows it."""
    if shutil.which("dpkg") is None:
        return
    for p in (path, path.replace("/usr/lib/", "/lib/", 1)):
        r = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            pkg = r.stdout.split(":")[0]
            doc = "/usr/share/doc/%s/copyright" % pkg
            if os.path.exists(doc):
                shutil.copyfile(doc, os.path.join(out, pkg + ".copyright"))
            return


class BuildPy(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            build_library(os.path.join(self.build_lib, "vmmrt", "_lib"))


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        csrc = os.path.join(base_dir, "csrc")
        copy_source(c_source(), csrc)
        if not os.path.exists(os.path.join(csrc, "configure")):
            run(["autoreconf", "-fi"], csrc)
        shutil.rmtree(os.path.join(csrc, "autom4te.cache"), ignore_errors=True)


class BinaryDistribution(Distribution):
    """A native library inside: installed in platlib, a platform wheel."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    def get_tag(self):
        return ("py3", "none") + tuple(super().get_tag()[2:])


setup(distclass=BinaryDistribution,
      cmdclass={"build_py": BuildPy, "sdist": Sdist, "bdist_wheel": BdistWheel})
