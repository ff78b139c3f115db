# SPDX-License-Identifier: LGPL-2.1-or-later
"""libvmmrt from Python: a thin ctypes binding of the C API (include/vmmrt.h).

The C library stays the single source of truth for addresses, fences and
driver workers; this module only turns its calls into Python ones and every
non-OK status into :class:`Error`. The PyTorch integration is
:mod:`vmmrt.torch`.

The library is loaded on first use (see :mod:`vmmrt._loader` for where it is
looked for), so ``import vmmrt`` works everywhere and a missing library is
reported, with every place tried, by the first call that needs it.
"""
from __future__ import annotations

import ctypes
import os
import re
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Callable, Iterable, Union

from vmmrt import _capi
from vmmrt._capi import GROUP_STATES, SLOT_STATES, STREAM_LEGACY, STREAM_PER_THREAD  # noqa: F401
from vmmrt._loader import LibraryNotFound, library_path, load as _load

__all__ = ["Error", "InvalidValue", "LibraryNotFound", "library_path", "Runtime", "Group", "Slot", "Pages", "Event",
           "library",
           "version", "version_string", "status_name", "options_table", "environment_options", "option_choices",
           "option_bounds", "fill_word", "checksum_host", "layer_checksum_host", "STREAM_LEGACY", "STREAM_PER_THREAD",
           "GROUP_STATES", "SLOT_STATES", "arena_stats", "arena_reset", "arena_library_path"]

_lib = None
_lib_lock = threading.Lock()


def library() -> ctypes.CDLL:
    """The loaded C library (a ctypes.CDLL with prototypes); loads it on first call."""
    global _lib
    if _lib is None:
        with _lib_lock:
            if _lib is None:
                _lib = _capi.declare(_load())
    return _lib


class Error(Exception):
    """A libvmmrt call failed.

    ``status`` is the vmmrt_status value, ``name`` its enumerator name
    ("VMMRT_E_MISMATCH"), ``detail`` the library's message, and ``where`` what
    was being done (the layer or group, the call), when known. ``str()`` says
    all of it on one line.
    """

    def __init__(self, status: int, detail: str = "", where: str | None = None) -> None:
        self.status = int(status)
        self.name = status_name(self.status)
        self.detail = detail
        self.where = where
        text = detail if detail.startswith(self.name) else "%s: %s" % (self.name, detail)
        super().__init__("%s: %s" % (where, text) if where else text)


class InvalidValue(Error, ValueError):
    """The library refused a value it was given (an option, an argument, a
    declared schedule): a :class:`Error` that is also a ValueError."""


# What the library refuses as a bad value rather than a failure of its own.
_VALUE_STATUSES = (_capi.E_INVALID_ARGUMENT, _capi.E_INVALID_OPTION)


def _decode(b):
    return b.decode("utf-8", "replace") if b else ""


def status_name(status: int) -> str:
    """A status's enumerator name, as the library gives it (vmmrt_status_name);
    without a library, the binding's own mirror of the header's numbers."""
    try:
        name = _decode(library().vmmrt_status_name(status))
    except (LibraryNotFound, AttributeError):   # no library, or one lacking a call the binding declares
        name = next(("VMMRT_" + k for k, v in vars(_capi).items()
                     if v == status and (k == "OK" or k.startswith("E_"))), "")
    return name if name and name != "VMMRT_E_UNKNOWN" else "VMMRT_STATUS_%d" % status


def check(status: int, where: str | None = None, value: bool = False) -> None:
    """Raise :class:`Error` for a non-OK status, with the thread's last message:
    an :class:`InvalidValue` for a refused option or argument, or for any
    refusal of a call whose arguments are the caller's values (``value``)."""
    if status == _capi.OK:
        return
    lib = library()
    detail = _decode(lib.vmmrt_last_error()) or _decode(lib.vmmrt_strerror(status))
    raise (InvalidValue if value or status in _VALUE_STATUSES else Error)(status, detail, where)


def version() -> tuple[int, int, int]:
    """The library's version as (major, minor, patch)."""
    v = library().vmmrt_version()
    return (v >> 16, (v >> 8) & 0xFF, v & 0xFF)


def version_string() -> str:
    return _decode(library().vmmrt_version_string())


def options_table() -> list[dict[str, str]]:
    """Every option of the C library: a list of dicts (name, env, default, range, doc)."""
    lib, rows, i = library(), [], 0
    while True:
        info = _capi.sized(_capi.OptionInfo)
        if lib.vmmrt_option_describe(i, ctypes.byref(info)) != _capi.OK:
            return rows
        rows.append({k: _decode(getattr(info, k)) for k in ("name", "env", "default_value", "range", "doc")})
        i += 1


_option_rows = None      # the library's option table, read once (it is constant)


def _option_row(name):
    global _option_rows
    if _option_rows is None:
        _option_rows = options_table()
    for row in _option_rows:
        if row["name"] == name:
            return row
    raise InvalidValue(_capi.E_INVALID_ARGUMENT, "no libvmmrt option %r (see vmmrt.options_table())" % (name,))


def option_choices(name: str) -> tuple[str, ...]:
    """The choices of one of the library's options that takes a word ("mode":
    ("pingpong", "remap", "none")), from its option table, in the order of
    their C enumerators."""
    rng = _option_row(name)["range"]
    if "|" not in rng or ".." in rng:
        raise InvalidValue(_capi.E_INVALID_ARGUMENT, "option %r takes %s, not one of a list of words" % (name, rng))
    return tuple(rng.split("|"))


def option_bounds(name: str) -> tuple[float, float]:
    """The (least, greatest) value of one of the library's numeric options
    ("lookahead": (0, 16)), from its option table."""
    rng = _option_row(name)["range"]
    m = re.search(r"(-?[0-9.e+]+)\.\.(-?[0-9.e+]+)$", rng)
    if m is None:
        raise InvalidValue(_capi.E_INVALID_ARGUMENT, "option %r takes %s, not a number in a range" % (name, rng))
    lo, hi = (float(v) for v in m.groups())
    return (int(lo), int(hi)) if lo.is_integer() and hi.is_integer() else (lo, hi)


def environment_options(environment: str | None = None) -> dict[str, str]:
    """The options the VMMRT_* environment sets, by option name, each value as
    the library reads it (vmmrt_options_apply_env on options the program left
    unset): every variable is parsed, so a malformed value (VMMRT_MODE=ping-pong,
    VMMRT_LOOKAHEAD=-3) or an unknown VMMRT_* name is an :class:`InvalidValue`
    with the library's message, as for any libvmmrt program, even where the
    program's own value of that option will win. ``environment``: the
    program's value of option "environment" (None: VMMRT_ENVIRONMENT's, else
    override); under "ignore" the environment is not read: {}."""
    lib = library()
    opts = ctypes.c_void_p()
    check(lib.vmmrt_options_create(ctypes.byref(opts)), "vmmrt_options_create")
    try:
        if environment is not None:
            check(lib.vmmrt_options_set(opts, b"environment", str(environment).encode()),
                  "option environment=%r" % (environment,), value=True)
        check(lib.vmmrt_options_apply_env(opts), "the VMMRT_* environment", value=True)
        buf = ctypes.create_string_buffer(4096)

        def get(name):
            check(lib.vmmrt_options_get(opts, name.encode(), buf, len(buf)), "vmmrt_options_get")
            return _decode(buf.value)
        if get("environment") == "ignore":
            return {}
        return {row["name"]: get(row["name"]) for row in options_table()
                if row["name"] != "environment" and row["env"] in os.environ}
    finally:
        lib.vmmrt_options_destroy(opts)


def __getattr__(name):
    # vmmrt.MODES, the offload strategies, is the library's (not in __all__:
    # "from vmmrt import *" loads no library)
    if name == "MODES":
        return option_choices("mode")
    raise AttributeError("module 'vmmrt' has no attribute %r" % (name,))


def fill_word(seed: int, index: int) -> int:
    """The built-in fill pattern's word at index (the host reference of vmmrt_kernel_fill)."""
    return library().vmmrt_fill_word(seed, index)


def checksum_host(ptr: int, nbytes: int) -> int:
    """The built-in checksum of nbytes of host memory at ptr."""
    return library().vmmrt_checksum_host(ctypes.c_void_p(ptr), nbytes)


def layer_checksum_host(nbytes: int, input_seed: int, layer_seed: int) -> int:
    return library().vmmrt_layer_checksum_host(nbytes, input_seed, layer_seed)


# A stream argument (see _stream): None, an int handle, or a torch.cuda.Stream.
Stream = Union[None, int, Any]


def _stream(s):
    """A stream argument: None (the legacy default stream), an int handle, or an object
    with ``cuda_stream`` (a torch.cuda.Stream)."""
    if s is None:
        return None
    s = getattr(s, "cuda_stream", s)
    return ctypes.c_void_p(int(s)) if int(s) else None


def _event(e):
    """An event argument: an :class:`Event`, or on the CUDA backend (where a vmmrt_event
    is the CUevent) an object with ``cuda_event`` (a recorded torch.cuda.Event) or an
    int handle."""
    if isinstance(e, Event):
        if e._e is None:
            raise ValueError("the event was destroyed")
        return e._e
    if e is None:
        return None
    h = int(getattr(e, "cuda_event", e))
    return ctypes.c_void_p(h) if h else None


class _Life:
    """When a runtime is destroyed: at close or collection, unless tensors over
    its slots are still alive (holds), then when the last of them goes. At
    interpreter exit a runtime still held is not destroyed: its memory goes
    back with the process (weakref.finalize runs no callback after exit, so
    the holds are never let go then). Not the Runtime itself, so that its
    finalizer does not keep it alive."""

    def __init__(self, lib, rt):
        self.lib = lib
        self.rt = rt
        self.lock = threading.Lock()
        self.holds = 0
        self.ended = False       # close() or the finalizer asked for the destroy
        self.deferred = False    # ... and it waits for the holds

    def hold(self):
        with self.lock:
            self.holds += 1
        done = []

        def let_go():
            if done:
                return
            done.append(True)
            with self.lock:
                self.holds -= 1
                last = self.ended and self.holds == 0 and self.rt is not None
                rt, self.rt = (self.rt, None) if last else (None, self.rt)
            if rt is not None:
                self.lib.vmmrt_runtime_destroy(rt)   # the deferred destroy: nobody to report a failure to
        return let_go

    def end(self):
        """The destroy's status, or None when it is deferred (or was done)."""
        with self.lock:
            self.ended = True
            if self.rt is None:
                return None
            if self.holds:
                self.deferred = True
                return None
            rt, self.rt = self.rt, None
        return self.lib.vmmrt_runtime_destroy(rt)


class Runtime:
    """One opened device (vmmrt_runtime): backend, options, driver workers, groups.

    ``options`` maps C option names ("mode", "lookahead", "backend", ...; see
    :func:`options_table`) to values; each is validated by the library, so a
    typo is an :class:`Error` (VMMRT_E_INVALID_OPTION) naming it. The VMMRT_*
    environment overrides them, as for any libvmmrt program.
    """

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        lib = library()
        self._lib = lib
        opts = ctypes.c_void_p()
        check(lib.vmmrt_options_create(ctypes.byref(opts)), "vmmrt_options_create")
        try:
            for k, v in (options or {}).items():
                if isinstance(v, bool):
                    v = int(v)
                check(lib.vmmrt_options_set(opts, str(k).encode(), str(v).encode()),
                      "option %s=%r" % (k, v))
            rt = ctypes.c_void_p()
            check(lib.vmmrt_runtime_create(opts, ctypes.byref(rt)), "vmmrt_runtime_create")
        finally:
            lib.vmmrt_options_destroy(opts)
        self._rt = rt
        self._groups = []
        self._life = _Life(lib, rt)
        self._finalizer = weakref.finalize(self, self._life.end)
        info = self.info()
        self.backend = info["backend"]
        self.mode = info["mode"]
        self.lookahead = info["lookahead"]

    # -- lifetime
    def close(self) -> None:
        """Destroy the runtime (drains copies, joins workers, frees every slot),
        or, while tensors over its memory are alive (:meth:`hold`), once the
        last of them is gone: closed now for every use, it keeps its memory
        until then."""
        if self._finalizer.alive:
            self._finalizer.detach()
            self._rt = None
            status = self._life.end()
            if status is not None:
                check(status, "vmmrt_runtime_destroy")

    @property
    def closed(self) -> bool:
        return self._rt is None

    def hold(self) -> Callable[[], None]:
        """Keep the runtime's memory while something outside it points into its
        slots (a tensor made over a slot's address): :meth:`close`, the
        runtime's garbage collection and interpreter exit defer the destroy
        until every hold is let go. Returns the function that lets this one
        go (call it once, from any thread; it never raises)."""
        self._handle()
        return self._life.hold()

    @property
    def holds(self) -> int:
        """Holds not let go yet (:meth:`hold`)."""
        return self._life.holds

    @property
    def destroy_deferred(self) -> bool:
        """Closed, and destroyed only once the last hold is let go."""
        return self._life.deferred

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _handle(self):
        if self._rt is None:
            raise Error(_capi.E_INVALID_STATE, "the runtime was closed", "vmmrt.Runtime")
        return self._rt

    # -- information
    def info(self) -> dict[str, Any]:
        i = _capi.sized(_capi.RuntimeInfo)
        check(self._lib.vmmrt_runtime_info_get(self._handle(), ctypes.byref(i)), "vmmrt_runtime_info_get")
        return {"backend": _decode(i.backend), "backend_note": _decode(i.backend_note),
                "device": _decode(i.device), "device_ordinal": i.device_ordinal,
                "granularity": i.granularity, "mode": option_choices("mode")[i.mode],
                "driver_workers": i.driver_workers, "lookahead": i.lookahead}

    def options(self) -> dict[str, str]:
        """The options in force, by name: the program's with the environment
        applied (a VMMRT_* variable may have replaced what was asked)."""
        lib = self._lib
        opts = ctypes.c_void_p()
        check(lib.vmmrt_options_create(ctypes.byref(opts)), "vmmrt_options_create")
        try:
            check(lib.vmmrt_runtime_options_get(self._handle(), opts), "vmmrt_runtime_options_get")
            out = {}
            buf = ctypes.create_string_buffer(4096)
            for row in options_table():
                check(lib.vmmrt_options_get(opts, row["name"].encode(), buf, len(buf)), "vmmrt_options_get")
                out[row["name"]] = _decode(buf.value)
            return out
        finally:
            lib.vmmrt_options_destroy(opts)

    def trace_span(self, track: str, name: str, t0_ns: int, t1_ns: int) -> None:
        """A span on the runtime's trace (CLOCK_MONOTONIC ns; nothing when tracing is off)."""
        check(self._lib.vmmrt_trace_span(self._handle(), track.encode(), name.encode(), t0_ns, t1_ns),
              "vmmrt_trace_span")

    def mem_info(self) -> tuple[int, int]:
        """Driver-level (free, total) device bytes (cuMemGetInfo)."""
        f, t = ctypes.c_size_t(), ctypes.c_size_t()
        check(self._lib.vmmrt_mem_info(self._handle(), ctypes.byref(f), ctypes.byref(t)), "vmmrt_mem_info")
        return f.value, t.value

    def driver_stats(self) -> list[dict[str, Any]]:
        out = []
        for call in range(_capi.DRIVER_CALLS):
            s = _capi.sized(_capi.DriverStats)
            check(self._lib.vmmrt_driver_stats_get(self._handle(), call, ctypes.byref(s)), "vmmrt_driver_stats_get")
            out.append({"name": _decode(s.name), "count": s.count, "p50_us": s.p50_us,
                        "p99_us": s.p99_us, "max_us": s.max_us})
        return out

    def driver_stats_reset(self) -> None:
        check(self._lib.vmmrt_driver_stats_reset(self._handle()), "vmmrt_driver_stats_reset")

    # -- device helpers
    def stream_create(self) -> int:
        s = ctypes.c_void_p()
        check(self._lib.vmmrt_stream_create(self._handle(), ctypes.byref(s)), "vmmrt_stream_create")
        return s.value

    def stream_destroy(self, stream: Stream) -> None:
        check(self._lib.vmmrt_stream_destroy(self._handle(), _stream(stream)), "vmmrt_stream_destroy")

    def stream_synchronize(self, stream: Stream = None) -> None:
        check(self._lib.vmmrt_stream_synchronize(self._handle(), _stream(stream)), "vmmrt_stream_synchronize")

    def synchronizer(self) -> "tuple[Callable[..., int], Any]":
        """(vmmrt_stream_synchronize, this runtime's handle), for a caller that
        makes the call itself (``fn(handle, stream handle)`` returns a status,
        which :func:`check` raises), as vmmrt.torch's per-call path does."""
        return self._lib.vmmrt_stream_synchronize, self._handle()

    def copy_to_device(self, dst: int, src_ptr: int, nbytes: int) -> None:
        check(self._lib.vmmrt_copy_to_device(self._handle(), dst, ctypes.c_void_p(src_ptr), nbytes),
              "vmmrt_copy_to_device")

    def copy_to_host(self, dst_ptr: int, src: int, nbytes: int) -> None:
        check(self._lib.vmmrt_copy_to_host(self._handle(), ctypes.c_void_p(dst_ptr), src, nbytes),
              "vmmrt_copy_to_host")

    def copy_to_device_async(self, dst: int, src_ptr: int, nbytes: int, stream: Stream = None) -> None:
        check(self._lib.vmmrt_copy_to_device_async(self._handle(), dst, ctypes.c_void_p(src_ptr), nbytes,
                                                   _stream(stream)), "vmmrt_copy_to_device_async")

    def copy_to_host_async(self, dst_ptr: int, src: int, nbytes: int, stream: Stream = None) -> None:
        check(self._lib.vmmrt_copy_to_host_async(self._handle(), ctypes.c_void_p(dst_ptr), src, nbytes,
                                                 _stream(stream)), "vmmrt_copy_to_host_async")

    def host_alloc(self, nbytes: int) -> int:
        """Pinned host memory (an address); free it with :meth:`host_free`."""
        p = ctypes.c_void_p()
        check(self._lib.vmmrt_host_alloc(self._handle(), nbytes, ctypes.byref(p)), "vmmrt_host_alloc")
        return p.value

    def host_free(self, ptr: int) -> None:
        check(self._lib.vmmrt_host_free(self._handle(), ctypes.c_void_p(ptr)), "vmmrt_host_free")

    def event(self, timing: bool = False) -> Event:
        return Event(self, timing)

    def stream_wait_event(self, stream: Stream, event: Event) -> None:
        check(self._lib.vmmrt_stream_wait_event(self._handle(), _stream(stream), event._e), "vmmrt_stream_wait_event")

    def kernel_fill(self, dst: int, nbytes: int, seed: int, stream: Stream = None) -> None:
        check(self._lib.vmmrt_kernel_fill(self._handle(), _stream(stream), dst, nbytes, seed), "vmmrt_kernel_fill")

    def kernel_checksum(self, src: int, nbytes: int, result: int, stream: Stream = None) -> None:
        check(self._lib.vmmrt_kernel_checksum(self._handle(), _stream(stream), src, nbytes, result),
              "vmmrt_kernel_checksum")

    def kernel_busy(self, nanoseconds: int, stream: Stream = None) -> None:
        check(self._lib.vmmrt_kernel_busy(self._handle(), _stream(stream), nanoseconds), "vmmrt_kernel_busy")

    def kernel_layer(self, dst: int, src: int, nbytes: int, seed: int, nanoseconds: int,
                     stream: Stream = None) -> None:
        check(self._lib.vmmrt_kernel_layer(self._handle(), _stream(stream), dst, src, nbytes, seed, nanoseconds),
              "vmmrt_kernel_layer")

    # -- graphs of the library's own streams (the C API's; PyTorch's are torch.cuda.CUDAGraph)
    def graph_begin_capture(self, stream: Stream) -> None:
        check(self._lib.vmmrt_graph_begin_capture(self._handle(), _stream(stream)), "vmmrt_graph_begin_capture")

    def graph_end_capture(self, stream: Stream) -> ctypes.c_void_p:
        g = ctypes.c_void_p()
        check(self._lib.vmmrt_graph_end_capture(self._handle(), _stream(stream), ctypes.byref(g)),
              "vmmrt_graph_end_capture")
        return g

    def graph_launch(self, graph: ctypes.c_void_p, stream: Stream = None) -> None:
        check(self._lib.vmmrt_graph_launch(self._handle(), graph, _stream(stream)), "vmmrt_graph_launch")

    def graph_destroy(self, graph: ctypes.c_void_p) -> None:
        check(self._lib.vmmrt_graph_destroy(self._handle(), graph), "vmmrt_graph_destroy")

    # -- slots
    def slot(self, nbytes: int) -> Slot:
        """A fixed-VA slot of nbytes (rounded up to the granularity), nothing mapped."""
        return Slot(self, nbytes)

    def pages(self, nbytes: int) -> Pages:
        """Physical memory of nbytes (rounded up to the granularity) that several slots
        can map at once (:meth:`Slot.map_pages`): tensors whose lives do not overlap
        share it with no driver call per step (vmmrt_pages_create(3))."""
        return Pages(self, nbytes)

    def arena_lend(self, ranges: Sequence[tuple[int, int]], device: int | None = None) -> int:
        """Lend device ranges, (address, nbytes) pairs that do not overlap, to the
        arena of ``device`` (default: this runtime's device), replacing the ranges
        of any earlier lend (an empty sequence lends none: every allocation falls
        back to plain device memory through this runtime). Returns the new
        generation. The arena serves PyTorch's
        ``torch.cuda.memory.CUDAPluggableAllocator(vmmrt.arena_library_path(),
        "vmmrt_arena_malloc", "vmmrt_arena_free")`` (vmmrt_arena_lend(3))."""
        where = "vmmrt_arena_lend"
        if device is None:
            device = self.info()["device_ordinal"]
        if isinstance(device, bool) or not isinstance(device, int):
            raise InvalidValue(_capi.E_INVALID_ARGUMENT, "device must be an int, not %r" % (device,), where)
        if isinstance(ranges, (str, bytes)) or not isinstance(ranges, Sequence):
            raise InvalidValue(_capi.E_INVALID_ARGUMENT,
                               "ranges must be a sequence of (address, nbytes) pairs, not %r" % (ranges,), where)
        n = len(ranges)
        addrs = (_capi.vmmrt_devptr * max(1, n))()
        sizes = (ctypes.c_size_t * max(1, n))()
        for k, r in enumerate(ranges):
            if (not isinstance(r, (tuple, list)) or len(r) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in r)):
                raise InvalidValue(_capi.E_INVALID_ARGUMENT,
                                   "range %d: %r is not an (address, nbytes) pair of non-negative ints" % (k, r),
                                   where)
            addrs[k], sizes[k] = r
        gen = ctypes.c_uint64()
        check(self._lib.vmmrt_arena_lend(self._handle(), device, addrs, sizes, n, ctypes.byref(gen)), where)
        return gen.value

    # -- offload
    def group(self, name: str) -> Group:
        """A new offload group (create them in forward order, before :meth:`offload_allocate`)."""
        g = Group(self, name)
        self._groups.append(g)
        return g

    @property
    def groups(self) -> tuple[Group, ...]:
        return tuple(self._groups)

    def offload_set_schedule(self, steps: Iterable[tuple[Group, bool]]) -> None:
        """Declare one iteration's order before :meth:`offload_allocate`
        (vmmrt_offload_set_schedule): ``steps`` is a sequence of (group,
        backward) pairs, the forward (False) and the backward (True) of every
        group with tensors once each, each forward before its backward. Ping-pong
        then makes the banks the order needs; every iteration must follow it
        (VMMRT_E_MISMATCH otherwise). An empty sequence forgets it."""
        steps = list(steps)
        arr = (_capi.ScheduleStep * max(1, len(steps)))()
        for k, (g, backward) in enumerate(steps):
            if not isinstance(g, Group):     # the library refuses a group of another runtime
                raise TypeError("schedule step %d: %r is not a vmmrt.Group" % (k, g))
            arr[k].group = g._g
            arr[k].backward = 1 if backward else 0
        check(self._lib.vmmrt_offload_set_schedule(self._handle(), arr, len(steps)), "vmmrt_offload_set_schedule")

    def offload_allocate(self) -> None:
        check(self._lib.vmmrt_offload_allocate(self._handle()), "vmmrt_offload_allocate")

    def offload_abort(self) -> None:
        """Abandon the iteration under way (vmmrt_offload_abort): waits for what is
        in flight and puts every group back where an iteration starts; addresses,
        and so the captured graphs, stay valid."""
        check(self._lib.vmmrt_offload_abort(self._handle()), "vmmrt_offload_abort")

    def offload_release_retired(self) -> None:
        """Free the old allocations of re-discovered groups (vmmrt_offload_release_retired):
        the graphs captured over their old addresses must never run again."""
        check(self._lib.vmmrt_offload_release_retired(self._handle()), "vmmrt_offload_release_retired")

    def offload_sync(self) -> None:
        check(self._lib.vmmrt_offload_sync(self._handle()), "vmmrt_offload_sync")

    def offload_stats(self) -> dict[str, Any]:
        s = _capi.sized(_capi.OffloadStats)
        check(self._lib.vmmrt_offload_stats_get(self._handle(), ctypes.byref(s)), "vmmrt_offload_stats_get")
        d = {name: getattr(s, name) for name, _ in _capi.OffloadStats._fields_ if name != "size"}
        d["mode"] = option_choices("mode")[d["mode"]]
        return d

    def offload_stats_reset(self) -> None:
        check(self._lib.vmmrt_offload_stats_reset(self._handle()), "vmmrt_offload_stats_reset")


def _arena_device(device, where):
    if isinstance(device, bool) or not isinstance(device, int):
        raise InvalidValue(_capi.E_INVALID_ARGUMENT, "device must be an int, not %r" % (device,), where)
    return device


def arena_stats(device: int = 0) -> dict[str, int]:
    """The arena of a CUDA device ordinal: vmmrt_arena_stats as a dict (vmmrt_arena_lend(3))."""
    s = _capi.sized(_capi.ArenaStats)
    check(library().vmmrt_arena_stats_get(_arena_device(device, "vmmrt_arena_stats_get"), ctypes.byref(s)),
          "vmmrt_arena_stats_get")
    return {name: getattr(s, name) for name, _ in _capi.ArenaStats._fields_ if name != "size"}


def arena_reset(device: int = 0) -> None:
    """Drop the arena's ranges and runtime and restart its counters; segments
    still outstanding stay valid until freed (vmmrt_arena_reset)."""
    check(library().vmmrt_arena_reset(_arena_device(device, "vmmrt_arena_reset")), "vmmrt_arena_reset")


def arena_library_path() -> str:
    """The absolute path of the loaded libvmmrt shared object: what
    torch.cuda.memory.CUDAPluggableAllocator loads to find vmmrt_arena_malloc
    and vmmrt_arena_free (the same file, so the same arenas)."""
    return os.path.abspath(library_path().path)


class Slot:
    """One fixed virtual-address range (vmmrt_slot); the address never changes."""

    def __init__(self, rt, nbytes):
        self._rt = rt
        lib = rt._lib
        s = ctypes.c_void_p()
        check(lib.vmmrt_slot_create(rt._handle(), nbytes, ctypes.byref(s)), "vmmrt_slot_create")
        self._s = s
        self.address = lib.vmmrt_slot_address(s)
        self.size = lib.vmmrt_slot_size(s)

    def map(self):
        check(self._rt._lib.vmmrt_slot_map(self._s), "vmmrt_slot_map")

    def unmap(self):
        check(self._rt._lib.vmmrt_slot_unmap(self._s), "vmmrt_slot_unmap")

    # -- stream-ordered backing (vmmrt_slot_map_async(3)): none waits for the GPU
    def map_async(self):
        """Queue a map on the slot's driver worker and return; nothing if it is mapped
        or a map is queued. A release not run yet is cancelled (memory and bytes stay)."""
        check(self._rt._lib.vmmrt_slot_map_async(self._s), "vmmrt_slot_map_async")

    def wait(self):
        """Wait (bounded by the runtime's timeout) for the maps queued so far; raises their failure."""
        check(self._rt._lib.vmmrt_slot_wait(self._s), "vmmrt_slot_wait")

    def release_after(self, stream=None):
        """Release the memory, to the driver, once the work enqueued on stream so far has
        completed (a stream-ordered free); returns at once."""
        check(self._rt._lib.vmmrt_slot_release_after(self._s, _stream(stream)), "vmmrt_slot_release_after")

    def map_after(self, event: Any) -> None:
        """map_async, but the worker maps only once the work ``event`` captures now has
        completed (an :class:`Event`, or on CUDA a recorded torch.cuda.Event; recorded again
        or destroyed afterwards, it changes nothing). Returns at once."""
        check(self._rt._lib.vmmrt_slot_map_after(self._s, _event(event)), "vmmrt_slot_map_after")

    def wait_stream(self, stream: Stream = None) -> None:
        """Make ``stream`` wait, on the device, for the maps queued so far (nothing if they
        ended); returns at once. A map that fails lets the stream go on without the memory
        and is this slot's error (vmmrt_slot_wait_stream(3))."""
        check(self._rt._lib.vmmrt_slot_wait_stream(self._s, _stream(stream)), "vmmrt_slot_wait_stream")

    def map_pages(self, pages: Pages, offset: int = 0) -> None:
        """Map the slot's whole range onto ``pages``' bytes [offset, offset + size) and
        wait (vmmrt_slot_map_pages(3)): other slots may map the same bytes, the caller
        keeps their uses apart. :meth:`unmap` unbinds it (the pages keep their memory);
        :meth:`release_after` is refused while it is bound."""
        if not isinstance(pages, Pages):
            raise TypeError("map_pages: %r is not a vmmrt.Pages" % (pages,))
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidValue(_capi.E_INVALID_ARGUMENT, "offset must be a non-negative int, not %r" % (offset,),
                               "vmmrt_slot_map_pages")
        st = self._rt._lib.vmmrt_slot_map_pages(self._s, pages._handle(), offset)
        check(st, "vmmrt_slot_map_pages", value=st == _capi.E_INVALID_SIZE)   # the offset: a bad value

    def map_pages_table(self, pages: Pages, offsets: Sequence[int]) -> None:
        """Map the slot granule by granule and wait (vmmrt_slot_map_pages_table(3)):
        granule ``i`` (the slot's bytes from ``i * g`` on, ``g`` the granularity) onto
        ``pages``' bytes [offsets[i], offsets[i] + g). One offset per granule, each a
        multiple of ``g`` inside the pages; they may repeat (the caller keeps the uses of
        granules on the same bytes apart). Otherwise as :meth:`map_pages`."""
        if not isinstance(pages, Pages):
            raise TypeError("map_pages_table: %r is not a vmmrt.Pages" % (pages,))
        if isinstance(offsets, (str, bytes)) or not isinstance(offsets, Sequence):
            raise InvalidValue(_capi.E_INVALID_ARGUMENT, "offsets must be a sequence of ints, not %r" % (offsets,),
                               "vmmrt_slot_map_pages_table")
        limit = 1 << (8 * ctypes.sizeof(ctypes.c_size_t))     # a size_t holds it; ctypes would wrap it silently
        for i, off in enumerate(offsets):
            if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off < limit:
                raise InvalidValue(_capi.E_INVALID_ARGUMENT, "offsets[%d] must be a non-negative int that a "
                                   "size_t holds, not %r" % (i, off), "vmmrt_slot_map_pages_table")
        table = (ctypes.c_size_t * max(len(offsets), 1))(*offsets)   # the library copies it
        st = self._rt._lib.vmmrt_slot_map_pages_table(self._s, pages._handle(), table, len(offsets))
        check(st, "vmmrt_slot_map_pages_table", value=st == _capi.E_INVALID_SIZE)   # the table: a bad value

    def truncate(self, nbytes: int) -> None:
        """Map only the first ``nbytes`` (rounded up to the granularity) from now on:
        for a slot with nothing mapped and no request in flight; the address
        and the whole reservation stay (vmmrt_slot_truncate(3))."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise InvalidValue(_capi.E_INVALID_SIZE, "nbytes must be a non-negative int, not %r" % (nbytes,),
                               "vmmrt_slot_truncate")
        lib = self._rt._lib
        st = lib.vmmrt_slot_truncate(self._s, nbytes)
        check(st, "vmmrt_slot_truncate", value=st == _capi.E_INVALID_SIZE)
        self.size = lib.vmmrt_slot_size(self._s)

    def destroy(self):
        if self._s is not None:
            check(self._rt._lib.vmmrt_slot_destroy(self._s), "vmmrt_slot_destroy")
            self._s = None

    @property
    def state(self):
        return _capi.SLOT_STATES[self._rt._lib.vmmrt_slot_get_state(self._s)]


class Pages:
    """Physical device memory that several slots map at once (vmmrt_pages).

    :meth:`destroy` gives the handle back at once; the memory stays while a slot
    is bound to it (until its unmap or destroy). The runtime's close destroys
    the pages left.
    """

    def __init__(self, rt: Runtime, nbytes: int) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise InvalidValue(_capi.E_INVALID_SIZE, "nbytes must be a positive int, not %r" % (nbytes,),
                               "vmmrt_pages_create")
        self._rt = rt
        p = ctypes.c_void_p()
        check(rt._lib.vmmrt_pages_create(rt._handle(), nbytes, ctypes.byref(p)), "vmmrt_pages_create")
        self._p = p
        self.size: int = rt._lib.vmmrt_pages_size(p)

    def _handle(self) -> ctypes.c_void_p:
        self._rt._handle()      # the runtime's close destroyed its pages
        if self._p is None:
            raise Error(_capi.E_INVALID_STATE, "the pages were destroyed", "vmmrt.Pages")
        return self._p

    @property
    def destroyed(self) -> bool:
        return self._p is None

    def destroy(self) -> None:
        """Destroy the pages (nothing if destroyed already, or by the runtime's close)."""
        if self._p is not None and not self._rt.closed:
            check(self._rt._lib.vmmrt_pages_destroy(self._p), "vmmrt_pages_destroy")
        self._p = None


class Event:
    """A device event (vmmrt_event): record on a stream, query, wait, time."""

    def __init__(self, rt, timing=False):
        self._rt = rt
        e = ctypes.c_void_p()
        check(rt._lib.vmmrt_event_create(rt._handle(), _capi.EVENT_TIMING if timing else 0, ctypes.byref(e)),
              "vmmrt_event_create")
        self._e = e

    def record(self, stream=None):
        check(self._rt._lib.vmmrt_event_record(self._rt._handle(), self._e, _stream(stream)), "vmmrt_event_record")

    def query(self):
        done = ctypes.c_int()
        check(self._rt._lib.vmmrt_event_query(self._rt._handle(), self._e, ctypes.byref(done)), "vmmrt_event_query")
        return bool(done.value)

    def synchronize(self):
        check(self._rt._lib.vmmrt_event_synchronize(self._rt._handle(), self._e), "vmmrt_event_synchronize")

    def elapsed_ms(self, end):
        """Milliseconds from this event's record to end's (both timing events)."""
        ms = ctypes.c_float()
        check(self._rt._lib.vmmrt_event_elapsed_ms(self._rt._handle(), self._e, end._e, ctypes.byref(ms)),
              "vmmrt_event_elapsed_ms")
        return ms.value

    def destroy(self):
        if self._e is not None:
            check(self._rt._lib.vmmrt_event_destroy(self._rt._handle(), self._e), "vmmrt_event_destroy")
            self._e = None


class Group:
    """The tensors one runner saves for its backward (vmmrt_group).

    Life cycle: :meth:`discover` per tensor, :meth:`Runtime.offload_allocate`,
    then :meth:`begin_capture` / :meth:`save` / :meth:`end_capture`, then the
    four replay hooks around every graph launch. Errors name the group.
    """

    def __init__(self, rt, name):
        self._rt = rt
        self._lib = rt._lib
        self.name = name
        g = ctypes.c_void_p()
        check(self._lib.vmmrt_group_create(rt._handle(), name.encode(), ctypes.byref(g)),
              "group %r: vmmrt_group_create" % name)
        self._g = g

    def _where(self, call):
        return "group %r: %s" % (self.name, call)

    @staticmethod
    def desc(nbytes, dtype=0, shape=(), stride=(), align=0):
        """A vmmrt_tensor_desc: bytes, a dtype tag (compared, not interpreted), shape, stride."""
        if len(shape) > _capi.MAX_DIMS or len(stride) != len(shape):
            raise ValueError("a descriptor takes up to %d dimensions with one stride each" % _capi.MAX_DIMS)
        d = _capi.TensorDesc()
        d.bytes, d.dtype, d.ndim, d.align = nbytes, dtype, len(shape), align
        for i, (n, s) in enumerate(zip(shape, stride)):
            d.shape[i], d.stride[i] = n, s
        return d

    def discover(self, desc):
        check(self._lib.vmmrt_group_discover(self._g, ctypes.byref(desc)), self._where("vmmrt_group_discover"))

    def begin_capture(self):
        check(self._lib.vmmrt_group_begin_capture(self._g), self._where("vmmrt_group_begin_capture"))

    def save(self, desc, src=0, stream=None):
        """The next tensor's fixed address; with src, a D2D copy from src on stream."""
        addr = _capi.vmmrt_devptr()
        check(self._lib.vmmrt_group_save(self._g, ctypes.byref(desc), src, _stream(stream), ctypes.byref(addr)),
              self._where("vmmrt_group_save"))
        return addr.value

    def end_capture(self):
        check(self._lib.vmmrt_group_end_capture(self._g), self._where("vmmrt_group_end_capture"))

    @property
    def state(self):
        return _capi.GROUP_STATES[self._lib.vmmrt_group_get_state(self._g)]

    @property
    def address(self):
        return self._lib.vmmrt_group_address(self._g)

    @property
    def nbytes(self):
        return self._lib.vmmrt_group_bytes(self._g)

    @property
    def stays(self) -> bool:
        """Whether the schedule in force keeps its bytes on the device from
        its forward to its backward, copied neither way (vmmrt_group_stays):
        False until the schedule is known."""
        return bool(self._lib.vmmrt_group_stays(self._g))

    def error(self):
        """Raise the group's first asynchronous failure, if any (and clear it)."""
        check(self._lib.vmmrt_group_error(self._g), self._where("vmmrt_group_error"))

    def rediscover(self):
        """Discover the group again for a new shape (vmmrt_group_rediscover), between
        iterations: then :meth:`discover`, :meth:`Runtime.offload_allocate` and capture
        again. Its old memory stays until :meth:`Runtime.offload_release_retired`."""
        check(self._lib.vmmrt_group_rediscover(self._g), self._where("vmmrt_group_rediscover"))

    def _hook(self, fn, call, stream):
        status = fn(self._g, _stream(stream))
        if status == _capi.OK:
            return
        try:
            check(status, self._where(call))
        except Error as e:
            raise _name_expected(e, self._rt) from None

    def forward_begin(self, stream=None):
        self._hook(self._lib.vmmrt_forward_begin, "vmmrt_forward_begin", stream)

    def forward_end(self, stream=None):
        self._hook(self._lib.vmmrt_forward_end, "vmmrt_forward_end", stream)

    def backward_begin(self, stream=None):
        self._hook(self._lib.vmmrt_backward_begin, "vmmrt_backward_begin", stream)

    def backward_end(self, stream=None):
        self._hook(self._lib.vmmrt_backward_end, "vmmrt_backward_end", stream)

    def replay(self, backward: bool, graph_exec: int = 0, stream=None, copies=()) -> None:
        """One use in one call (vmmrt_group_replay): the begin hook, the
        executable graph ``graph_exec`` launched on ``stream`` (a
        cudaGraphExec_t as an int, torch's CUDAGraph.raw_cuda_graph_exec();
        on the host backend a graph of its own, from
        :meth:`Runtime.graph_end_capture`; 0: none), the end hook.
        ``copies``: (dst, src, bytes) device-to-device copies made on
        ``stream`` between the begin hook and the graph
        (vmmrt_group_replay_copies), where writing the group's bytes is safe."""
        if not isinstance(backward, bool):
            raise TypeError("backward: a bool, not %r" % (backward,))
        if isinstance(graph_exec, ctypes.c_void_p):
            graph_exec = graph_exec.value or 0
        if not copies:
            self.replay_failed(self._lib.vmmrt_group_replay(self._g, int(backward), int(graph_exec) or None,
                                                             _stream(stream)))
            return
        rows = []
        for c in copies:
            if not isinstance(c, (tuple, list)) or len(c) != 3 or \
                    not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64 for v in c):
                raise ValueError("copies: (dst, src, bytes) of non-negative ints each, not %r" % (c,))
            rows.append(_capi.ReplayCopy(*c))
        arr = (_capi.ReplayCopy * len(rows))(*rows)
        self.replay_failed(self._lib.vmmrt_group_replay_copies(self._g, int(backward), int(graph_exec) or None,
                                                                _stream(stream), arr, len(copies)))

    def replayer(self):
        """(the C function, this group's handle) for a caller that makes the
        call itself, as vmmrt.torch's per-call path does: ``fn(handle,
        backward, graph_exec, stream handle)`` returns a status, which
        :meth:`replay_failed` raises."""
        return self._lib.vmmrt_group_replay, self._g

    def copier(self):
        """(the C function, this group's handle) of vmmrt_group_replay_copies,
        as :meth:`replayer`: ``fn(handle, backward, graph_exec, stream
        handle, array of _capi.ReplayCopy, count)``."""
        return self._lib.vmmrt_group_replay_copies, self._g

    def replay_failed(self, status: int) -> None:
        if status == _capi.OK:
            return
        try:
            check(status, self._where("vmmrt_group_replay"))
        except Error as e:
            raise _name_expected(e, self._rt) from None


_EXPECTED = re.compile(r"(forward|backward) of group (\d+) was expected next")


def _name_expected(e, rt):
    """A hook out of the schedule's order: the library names the group it expected by
    its index (creation order); say its name too."""
    m = _EXPECTED.search(e.detail) if e.status == _capi.E_MISMATCH else None
    groups = rt._groups
    if m is None or int(m.group(2)) >= len(groups):
        return e
    detail = "%s (group %s is %r)" % (e.detail, m.group(2), groups[int(m.group(2))].name)
    return Error(e.status, detail, e.where)
