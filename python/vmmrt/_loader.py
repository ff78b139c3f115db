# SPDX-License-Identifier: LGPL-2.1-or-later
"""Find and load libvmmrt (the C library) with ctypes.

The places tried, in order:

1. ``$VMMRT_LIBRARY``: a path to the shared library (the C library reserves
   this variable name for exactly this use); when set, nothing else is tried;
2. the library the wheel carries, ``vmmrt/_lib/libvmmrt.so.1`` (built by
   ``pip install ./python``, with liburcu and ConcurrencyKit beside it);
3. the in-tree build of the checkout this package lives in
   (``<checkout>/.libs/libvmmrt.so.1``: tests run from the source tree, an
   editable install);
4. the libdir recorded by ``make install`` in ``vmmrt/_config.py``;
5. the system's search: ``ctypes.util.find_library("vmmrt")``, then
   ``libvmmrt.so.1`` through the dynamic loader's own path.

If none loads, :class:`LibraryNotFound` lists every place and why it failed,
naming a shared library libvmmrt needs that the system lacks.
:func:`library_path` says which one was loaded and why.
"""
import collections
import ctypes
import ctypes.util
import os
import re

SONAME = "libvmmrt.so.1"
# The ABI this binding is written against: (major << 16) | (minor << 8).
ABI_MAJOR, ABI_MINOR = 0, 2


class LibraryNotFound(ImportError):
    """libvmmrt could not be loaded; ``tried`` holds (place, reason) pairs."""

    def __init__(self, tried):
        self.tried = list(tried)
        lines = ["libvmmrt could not be loaded; tried:"]
        lines += ["  %s: %s" % (place, why) for place, why in self.tried]
        lines.append("install the package with the library inside it (pip install ./python), "
                     "set VMMRT_LIBRARY to the path of %s, or install libvmmrt (make install) "
                     "where the dynamic loader finds it" % SONAME)
        super().__init__("\n".join(lines))


# The Debian/Ubuntu package of each shared library libvmmrt links.
_PACKAGES = (("liburcu", "liburcu8"), ("libck", "libck0"))


class Loaded(collections.namedtuple("Loaded", "path reason")):
    """Which libvmmrt is loaded (``path``, resolved) and why (``reason``: the place it came from)."""

    def __str__(self):
        return "%s (%s)" % self


def _checkout():
    """The source checkout this package lives in (python/vmmrt/ of a libvmmrt tree), or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.normpath(os.path.join(here, "..", ".."))
    if os.path.exists(os.path.join(top, "configure.ac")) and os.path.exists(os.path.join(top, "include", "vmmrt.h")):
        return top
    return None


def _candidates():
    """(place, path, why) for each place in order: path None, why says what is
    missing; else why says what the place is, for :func:`library_path`."""
    env = os.environ.get("VMMRT_LIBRARY")
    if env:
        yield "VMMRT_LIBRARY=%s" % env, env, "VMMRT_LIBRARY is set"
        return
    yield "VMMRT_LIBRARY", None, "not set"
    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, "_lib", SONAME)
    yield "bundled %s" % bundled, bundled, "bundled in the package"
    top = _checkout()
    if top:
        tree = os.path.join(top, ".libs", SONAME)
        yield "in-tree build %s" % tree, tree, "the build of the checkout this package is in"
    else:
        yield "in-tree build", None, "%s is not in a libvmmrt checkout" % here
    try:
        from vmmrt import _config  # written by make install
        libdir = getattr(_config, "LIBDIR", None)
    except ImportError:
        libdir = None
    if libdir:
        path = os.path.join(libdir, SONAME)
        yield "installed libdir %s" % path, path, "the libdir make install recorded (vmmrt/_config.py)"
    else:
        yield "installed libdir", None, "no vmmrt/_config.py (not installed by make install)"
    found = ctypes.util.find_library("vmmrt")
    yield ("ctypes.util.find_library('vmmrt') -> %r" % found, found,
           "found by ctypes.util.find_library" if found else "nothing found")
    yield ("dynamic loader search for %s" % SONAME, SONAME,
           "the dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache)")


def _why_not_loaded(err):
    """dlerror's text, and the package to install when it names a missing dependency."""
    text = str(err)
    m = re.match(r"(lib[\w.+-]+\.so[.\d]*): cannot open shared object file", text)
    if m and not m.group(1).startswith("libvmmrt"):
        pkg = next((p for prefix, p in _PACKAGES if m.group(1).startswith(prefix)), None)
        text += ("; libvmmrt needs %s, which this system lacks: install it%s, or use the wheel, "
                 "which carries it" % (m.group(1), " (Debian/Ubuntu: apt-get install %s)" % pkg if pkg else ""))
    return text


def _resolved(lib, path):
    """The file the dynamic loader mapped for ``lib``: the path given, or for a
    bare soname the mapping of this process that holds one of its functions
    (/proc/self/maps; read, not asked of the loader: dladdr through ctypes
    kills processes that run under AddressSanitizer)."""
    if os.sep in path:
        return os.path.realpath(path)
    addr = ctypes.cast(lib.vmmrt_version, ctypes.c_void_p).value
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                f = line.split()
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                if lo <= addr < hi and len(f) >= 6:
                    return f[5]
    except (OSError, ValueError):
        pass
    return path


_loaded = None


def library_path():
    """Which libvmmrt is loaded and why: a :class:`Loaded` (path, reason); loads it if needed."""
    if _loaded is None:
        import vmmrt
        vmmrt.library()
    return _loaded


def load():
    """Load the C library; raise :class:`LibraryNotFound` naming each place tried."""
    global _loaded
    tried = []
    for place, path, why in _candidates():
        explicit = place.startswith("VMMRT_LIBRARY=")
        if path is None:
            tried.append((place, why))
            continue
        if os.sep in path and not os.path.exists(path):
            tried.append((place, "no such file"))
            if explicit:
                # An explicit path that is wrong is an error, not a hint.
                raise LibraryNotFound(tried)
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append((place, _why_not_loaded(e)))
            if explicit:
                raise LibraryNotFound(tried) from None
            continue
        bad = _check_abi(lib)
        if bad:
            tried.append((place, bad))
            if explicit:
                raise LibraryNotFound(tried)
            continue
        lib._vmmrt_path = _resolved(lib, path)
        _loaded = Loaded(lib._vmmrt_path, why)
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
