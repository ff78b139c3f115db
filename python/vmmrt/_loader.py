# SPDX-License-Identifier: LGPL-2.1-or-later
"""Find and load libvmmrt (the C library) with ctypes.

The places tried, in order:

1. ``$VMMRT_LIBRARY``: a path to the shared library (the C library reserves
   this variable name for exactly this use);
2. the in-tree build next to this package (``<repo>/.libs/libvmmrt.so.1``),
   for tests run from a source checkout;
3. the libdir recorded by ``make install`` in ``vmmrt/_config.py``;
4. the system's search: ``ctypes.util.find_library("vmmrt")``, then
   ``libvmmrt.so.1`` through the dynamic loader's own path.

If none loads, :class:`LibraryNotFound` lists every place and why it failed.
"""
import ctypes
import ctypes.util
import os

SONAME = "libvmmrt.so.1"
# The ABI this binding is written against: (major << 16) | (minor << 8).
ABI_MAJOR, ABI_MINOR = 0, 2


class LibraryNotFound(ImportError):
    """libvmmrt could not be loaded; ``tried`` holds (place, reason) pairs."""

    def __init__(self, tried):
        self.tried = list(tried)
        lines = ["libvmmrt could not be loaded; tried:"]
        lines += ["  %s: %s" % (place, why) for place, why in self.tried]
        lines.append("set VMMRT_LIBRARY to the path of %s, or install libvmmrt "
                     "(make install) where the dynamic loader finds it" % SONAME)
        super().__init__("\n".join(lines))


def _candidates():
    env = os.environ.get("VMMRT_LIBRARY")
    if env:
        yield "VMMRT_LIBRARY=%s" % env, env
    else:
        yield "VMMRT_LIBRARY", None
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.normpath(os.path.join(here, "..", "..", ".libs", SONAME))
    yield "in-tree build %s" % tree, tree
    try:
        from vmmrt import _config  # written by make install
        libdir = getattr(_config, "LIBDIR", None)
    except ImportError:
        libdir = None
    if libdir:
        path = os.path.join(libdir, SONAME)
        yield "installed libdir %s" % path, path
    else:
        yield "installed libdir", None
    found = ctypes.util.find_library("vmmrt")
    yield "ctypes.util.find_library('vmmrt') -> %r" % found, found
    yield "dynamic loader search for %s" % SONAME, SONAME


def _reason_missing(place):
    if place == "VMMRT_LIBRARY":
        return "not set"
    if place == "installed libdir":
        return "no vmmrt/_config.py (not installed by make install)"
    return "nothing found"


def load():
    """Load the C library; raise :class:`LibraryNotFound` naming each place tried."""
    tried = []
    for place, path in _candidates():
        if path is None:
            tried.append((place, _reason_missing(place)))
            continue
        if os.sep in path and not os.path.exists(path):
            tried.append((place, "no such file"))
            if place.startswith("VMMRT_LIBRARY="):
                # An explicit path that is wrong is an error, not a hint.
                raise LibraryNotFound(tried)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append((place, str(e)))
            if place.startswith("VMMRT_LIBRARY="):
                raise LibraryNotFound(tried) from None
            continue
        why = _check_abi(lib)
        if why:
            tried.append((place, why))
            if place.startswith("VMMRT_LIBRARY="):
                raise LibraryNotFound(tried)
            continue
        lib._vmmrt_path = path
        return lib
    raise LibraryNotFound(tried)


def _check_abi(lib):
    try:
        fn = lib.vmmrt_version
    except AttributeError:
        return "no vmmrt_version(): a libvmmrt older than 0.2 (this binding needs its ABI)"
    fn.restype = ctypes.c_uint
    fn.argtypes = []
    v = fn()
    if (v >> 16) != ABI_MAJOR or ((v >> 8) & 0xFF) < ABI_MINOR:
        return "version %d.%d.%d, this binding needs %d.%d or a later %d.x" % (
            v >> 16, (v >> 8) & 0xFF, v & 0xFF, ABI_MAJOR, ABI_MINOR, ABI_MAJOR)
    return None
