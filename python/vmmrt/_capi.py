# SPDX-License-Identifier: LGPL-2.1-or-later
"""ctypes declarations of include/vmmrt.h: structs, enums and prototypes.

Kept in the header's order, so a change there is easy to mirror here.
"""
import ctypes
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int64,
                    c_size_t, c_ssize_t, c_uint, c_uint32, c_uint64, c_ulonglong, c_void_p)

# vmmrt_status, numbered as the header numbers it (the ABI); the names and
# texts are the library's (vmmrt_status_name, vmmrt_strerror).
(OK, E_INVALID_ARGUMENT, E_INVALID_SIZE, E_INVALID_STATE, E_INVALID_OPTION, E_OUT_OF_MEMORY,
 E_HOST_OUT_OF_MEMORY, E_NOT_PERMITTED, E_NOT_SUPPORTED, E_NO_DEVICE, E_DRIVER, E_TIMEOUT, E_BUSY,
 E_MISMATCH, E_CANCELLED, E_CORRUPTED, E_CAPTURE, E_FAULT) = range(18)

GROUP_STATES = ("discovering", "allocated", "capturing", "ready", "failed")
SLOT_STATES = ("reserved", "mapped", "pending", "failed")
MAX_DIMS = 8
DRIVER_CALLS = 5
STREAM_LEGACY = 1
STREAM_PER_THREAD = 2
EVENT_TIMING = 0x1

vmmrt_devptr = c_ulonglong
vmmrt_stream = c_void_p
status_t = c_int
handle = c_void_p


class OptionInfo(Structure):
    _fields_ = [("size", c_size_t), ("name", c_char_p), ("env", c_char_p),
                ("default_value", c_char_p), ("range", c_char_p), ("doc", c_char_p)]


class RuntimeInfo(Structure):
    _fields_ = [("size", c_size_t), ("backend", c_char_p), ("backend_note", c_char * 192),
                ("device", c_char * 96), ("device_ordinal", c_int), ("granularity", c_size_t),
                ("mode", c_int), ("driver_workers", c_uint), ("lookahead", c_uint)]


class DriverStats(Structure):
    _fields_ = [("size", c_size_t), ("name", c_char_p), ("count", c_uint64),
                ("p50_us", c_double), ("p99_us", c_double), ("max_us", c_double)]


class TensorDesc(Structure):
    _fields_ = [("bytes", c_size_t), ("dtype", c_uint32), ("ndim", c_uint32),
                ("shape", c_int64 * MAX_DIMS), ("stride", c_int64 * MAX_DIMS), ("align", c_size_t)]


class OffloadStats(Structure):
    _fields_ = [("size", c_size_t), ("iterations", c_uint64), ("bytes_offloaded", c_uint64),
                ("bytes_restored", c_uint64), ("activation_bytes", c_uint64),
                ("activation_peak_bytes", c_uint64), ("maps", c_uint64), ("releases", c_uint64),
                ("launch_thread_blocking", c_uint64), ("bank_conflicts", c_uint64),
                ("last_d2h_ms", c_double), ("last_h2d_ms", c_double),
                ("last_d2h_bytes", c_uint64), ("last_h2d_bytes", c_uint64),
                ("groups", c_uint32), ("mode", c_int), ("lookahead", c_uint32),
                ("schedule_recorded", c_uint32),
                # since 0.2.0
                ("schedule_declared", c_uint32), ("lookahead_in_force", c_uint32),
                ("banks", c_uint32), ("budget_groups", c_uint32), ("bound_bytes", c_uint64),
                ("aborts", c_uint64), ("retired_groups", c_uint32),
                ("slot_bytes", c_uint64), ("slot_peak_bytes", c_uint64)]


class ScheduleStep(Structure):
    """vmmrt_schedule_step: one use of an iteration, a group's forward (0) or backward (1)."""
    _fields_ = [("group", handle), ("backward", c_uint32)]


class ReplayCopy(Structure):
    """vmmrt_replay_copy: a device-to-device copy of vmmrt_group_replay_copies."""
    _fields_ = [("dst", vmmrt_devptr), ("src", vmmrt_devptr), ("bytes", c_size_t)]


class ArenaStats(Structure):
    """vmmrt_arena_stats (vmmrt_arena_lend(3))."""
    _fields_ = [("size", c_size_t), ("generation", c_uint64), ("lent_bytes", c_uint64),
                ("used_bytes", c_uint64), ("peak_used_bytes", c_uint64), ("segments", c_uint64),
                ("old_segments", c_uint64), ("fallback_segments", c_uint64), ("fallback_bytes", c_uint64),
                ("fallback_total", c_uint64), ("allocs", c_uint64), ("frees", c_uint64),
                ("bad_frees", c_uint64), ("errors", c_uint64)]


def sized(struct_type):
    """An output struct with its size member set, as every call that fills one wants."""
    s = struct_type()
    s.size = ctypes.sizeof(struct_type)
    return s


_P = POINTER
_PROTOTYPES = {
    "vmmrt_version": (c_uint, []),
    "vmmrt_version_string": (c_char_p, []),
    "vmmrt_strerror": (c_char_p, [status_t]),
    "vmmrt_status_name": (c_char_p, [status_t]),
    "vmmrt_last_error": (c_char_p, []),
    "vmmrt_options_create": (status_t, [_P(handle)]),
    "vmmrt_options_destroy": (None, [handle]),
    "vmmrt_options_set": (status_t, [handle, c_char_p, c_char_p]),
    "vmmrt_options_get": (status_t, [handle, c_char_p, c_char_p, c_size_t]),
    "vmmrt_options_apply_env": (status_t, [handle]),
    "vmmrt_option_describe": (status_t, [c_size_t, _P(OptionInfo)]),
    "vmmrt_runtime_create": (status_t, [handle, _P(handle)]),
    "vmmrt_runtime_destroy": (status_t, [handle]),
    "vmmrt_runtime_info_get": (status_t, [handle, _P(RuntimeInfo)]),
    "vmmrt_runtime_options_get": (status_t, [handle, handle]),
    "vmmrt_trace_span": (status_t, [handle, c_char_p, c_char_p, c_uint64, c_uint64]),
    "vmmrt_mem_info": (status_t, [handle, _P(c_size_t), _P(c_size_t)]),
    "vmmrt_driver_stats_get": (status_t, [handle, c_uint, _P(DriverStats)]),
    "vmmrt_driver_stats_reset": (status_t, [handle]),
    "vmmrt_slot_create": (status_t, [handle, c_size_t, _P(handle)]),
    "vmmrt_slot_map": (status_t, [handle]),
    "vmmrt_slot_unmap": (status_t, [handle]),
    "vmmrt_slot_destroy": (status_t, [handle]),
    "vmmrt_slot_address": (vmmrt_devptr, [handle]),
    "vmmrt_slot_size": (c_size_t, [handle]),
    "vmmrt_slot_truncate": (status_t, [handle, c_size_t]),
    "vmmrt_slot_get_state": (c_int, [handle]),
    "vmmrt_slot_error": (status_t, [handle]),
    "vmmrt_slot_map_async": (status_t, [handle]),
    "vmmrt_slot_wait": (status_t, [handle]),
    "vmmrt_slot_release_after": (status_t, [handle, vmmrt_stream]),
    "vmmrt_slot_map_after": (status_t, [handle, handle]),
    "vmmrt_slot_wait_stream": (status_t, [handle, vmmrt_stream]),
    "vmmrt_pages_create": (status_t, [handle, c_size_t, _P(handle)]),
    "vmmrt_pages_destroy": (status_t, [handle]),
    "vmmrt_pages_size": (c_size_t, [handle]),
    "vmmrt_slot_map_pages": (status_t, [handle, handle, c_size_t]),
    "vmmrt_slot_map_pages_table": (status_t, [handle, handle, _P(c_size_t), c_size_t]),
    "vmmrt_stream_create": (status_t, [handle, _P(vmmrt_stream)]),
    "vmmrt_stream_destroy": (status_t, [handle, vmmrt_stream]),
    "vmmrt_stream_synchronize": (status_t, [handle, vmmrt_stream]),
    "vmmrt_host_alloc": (status_t, [handle, c_size_t, _P(c_void_p)]),
    "vmmrt_host_free": (status_t, [handle, c_void_p]),
    "vmmrt_copy_to_device": (status_t, [handle, vmmrt_devptr, c_void_p, c_size_t]),
    "vmmrt_copy_to_host": (status_t, [handle, c_void_p, vmmrt_devptr, c_size_t]),
    "vmmrt_copy_to_device_async": (status_t, [handle, vmmrt_devptr, c_void_p, c_size_t, vmmrt_stream]),
    "vmmrt_copy_to_host_async": (status_t, [handle, c_void_p, vmmrt_devptr, c_size_t, vmmrt_stream]),
    "vmmrt_event_create": (status_t, [handle, c_uint, _P(handle)]),
    "vmmrt_event_destroy": (status_t, [handle, handle]),
    "vmmrt_event_record": (status_t, [handle, handle, vmmrt_stream]),
    "vmmrt_event_query": (status_t, [handle, handle, _P(c_int)]),
    "vmmrt_event_synchronize": (status_t, [handle, handle]),
    "vmmrt_event_elapsed_ms": (status_t, [handle, handle, handle, _P(c_float)]),
    "vmmrt_stream_wait_event": (status_t, [handle, vmmrt_stream, handle]),
    "vmmrt_kernel_fill": (status_t, [handle, vmmrt_stream, vmmrt_devptr, c_size_t, c_uint64]),
    "vmmrt_kernel_checksum": (status_t, [handle, vmmrt_stream, vmmrt_devptr, c_size_t, vmmrt_devptr]),
    "vmmrt_kernel_busy": (status_t, [handle, vmmrt_stream, c_uint64]),
    "vmmrt_kernel_layer": (status_t, [handle, vmmrt_stream, vmmrt_devptr, vmmrt_devptr, c_size_t,
                                      c_uint64, c_uint64]),
    "vmmrt_fill_word": (c_uint64, [c_uint64, c_uint64]),
    "vmmrt_checksum_host": (c_uint64, [c_void_p, c_size_t]),
    "vmmrt_layer_checksum_host": (c_uint64, [c_size_t, c_uint64, c_uint64]),
    "vmmrt_graph_begin_capture": (status_t, [handle, vmmrt_stream]),
    "vmmrt_graph_end_capture": (status_t, [handle, vmmrt_stream, _P(handle)]),
    "vmmrt_graph_launch": (status_t, [handle, handle, vmmrt_stream]),
    "vmmrt_graph_destroy": (status_t, [handle, handle]),
    "vmmrt_group_create": (status_t, [handle, c_char_p, _P(handle)]),
    "vmmrt_group_discover": (status_t, [handle, _P(TensorDesc)]),
    "vmmrt_offload_allocate": (status_t, [handle]),
    "vmmrt_group_begin_capture": (status_t, [handle]),
    "vmmrt_group_save": (status_t, [handle, _P(TensorDesc), vmmrt_devptr, vmmrt_stream,
                                    _P(vmmrt_devptr)]),
    "vmmrt_group_end_capture": (status_t, [handle]),
    "vmmrt_group_get_state": (c_int, [handle]),
    "vmmrt_group_address": (vmmrt_devptr, [handle]),
    "vmmrt_group_bytes": (c_size_t, [handle]),
    "vmmrt_group_stays": (c_int, [handle]),
    "vmmrt_group_error": (status_t, [handle]),
    "vmmrt_forward_begin": (status_t, [handle, vmmrt_stream]),
    "vmmrt_forward_end": (status_t, [handle, vmmrt_stream]),
    "vmmrt_backward_begin": (status_t, [handle, vmmrt_stream]),
    "vmmrt_backward_end": (status_t, [handle, vmmrt_stream]),
    "vmmrt_group_replay": (status_t, [handle, c_int, c_void_p, vmmrt_stream]),
    "vmmrt_group_replay_copies": (status_t, [handle, c_int, c_void_p, vmmrt_stream, _P(ReplayCopy), c_size_t]),
    "vmmrt_offload_set_schedule": (status_t, [handle, _P(ScheduleStep), c_size_t]),
    "vmmrt_offload_abort": (status_t, [handle]),
    "vmmrt_group_rediscover": (status_t, [handle]),
    "vmmrt_offload_release_retired": (status_t, [handle]),
    "vmmrt_offload_sync": (status_t, [handle]),
    "vmmrt_offload_stats_get": (status_t, [handle, _P(OffloadStats)]),
    "vmmrt_offload_stats_reset": (status_t, [handle]),
    "vmmrt_arena_lend": (status_t, [handle, c_int, _P(vmmrt_devptr), _P(c_size_t), c_size_t, _P(c_uint64)]),
    # PyTorch's pluggable allocator's signatures: (ssize_t size, int device, cudaStream_t stream)
    "vmmrt_arena_malloc": (c_void_p, [c_ssize_t, c_int, c_void_p]),
    "vmmrt_arena_free": (None, [c_void_p, c_ssize_t, c_int, c_void_p]),
    "vmmrt_arena_reset": (status_t, [c_int]),
    "vmmrt_arena_stats_get": (status_t, [c_int, _P(ArenaStats)]),
}


# Calls a library of the same ABI major may lack (added in a later minor): a
# missing one is replaced by a function that says so (VMMRT_E_NOT_SUPPORTED),
# so the rest of the binding still loads.
_SINCE = {name: "0.2.0" for name in ("vmmrt_offload_set_schedule", "vmmrt_offload_abort",
                                     "vmmrt_group_rediscover", "vmmrt_offload_release_retired",
                                     "vmmrt_slot_map_async", "vmmrt_slot_wait", "vmmrt_slot_release_after",
                                     "vmmrt_slot_map_after", "vmmrt_slot_wait_stream",
                                     "vmmrt_pages_create", "vmmrt_pages_destroy", "vmmrt_pages_size",
                                     "vmmrt_slot_map_pages", "vmmrt_slot_map_pages_table",
                                     "vmmrt_arena_lend", "vmmrt_arena_malloc",
                                     "vmmrt_arena_free", "vmmrt_arena_reset", "vmmrt_arena_stats_get")}


class _Missing:
    def __init__(self, name):
        self.name = name
        self.restype = self.argtypes = None

    def __call__(self, *args):
        raise NotImplementedError("%s: this libvmmrt has no such call (it appeared in %s)"
                                  % (self.name, _SINCE[self.name]))


def declare(lib):
    """Give every function of the library its prototype (ctypes defaults to int)."""
    for name, (res, args) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            if name not in _SINCE:
                raise
            setattr(lib, name, _Missing(name))
            continue
        fn.restype = res
        fn.argtypes = args
    return lib
