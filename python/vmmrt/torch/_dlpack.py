# SPDX-License-Identifier: LGPL-2.1-or-later
"""A tensor over an address whose memory may not be mapped yet.

:func:`vmmrt.torch._address.owned_tensor_at` makes a CUDA tensor through
``__cuda_array_interface__``, and torch asks the driver which device the
pointer is on (cudaPointerGetAttributes), which fails on a slot that is
reserved but not mapped. A stream-ordered map (vmmrt_slot_map_after, then
vmmrt_slot_wait_stream) is made only once the GPU gets near the use, after
the launch thread has built the use's tensors, so those are made from a
DLPack capsule instead: it names the device itself and torch takes the
pointer as it is. The capsule's deleter runs when the storage dies, which
lets the owner go, as the array interface's owner goes with its storage.
"""
import ctypes
import threading

import torch
import torch.utils.dlpack

_KDL_CPU, _KDL_CUDA = 1, 2
_KDL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

_lock = threading.Lock()
_alive = {}  # address of a managed tensor -> (it, its shape, the owner): until torch lets go


class Owner:
    """What the tensor's storage keeps alive (a weakref.finalize on it runs
    when every view is gone)."""

    __slots__ = ("__weakref__",)


def _deleted_py(managed, _lock=_lock, _alive=_alive, _addressof=ctypes.addressof):
    # torch calls this (holding the GIL) when the storage dies, which may be
    # in the interpreter's last garbage collection, after this module's
    # globals are gone: what it needs comes as defaults.
    with _lock:
        _alive.pop(_addressof(managed.contents), None)


_deleted = _DELETER(_deleted_py)

# A tensor still alive at interpreter exit dies in its last collection, or
# after: the managed tensors it points at and the deleter torch calls must
# outlive every one of them. The module's dict is cleared at exit and the
# cycle (deleter -> its defaults -> _alive -> a managed tensor -> deleter)
# would be collected: one reference more keeps them for good.
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_alive))
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_deleted))


def owned_tensor_at(addr, nbytes, device):
    """(tensor, owner): a 1-D uint8 tensor over [addr, addr + nbytes) on
    ``device`` (cuda or cpu), made without reading the memory or asking the
    driver about it; the owner lives as long as the tensor's storage."""
    device = torch.device(device)
    if device.type == "cuda":
        kind, index = _KDL_CUDA, device.index if device.index is not None else torch.cuda.current_device()
    elif device.type == "cpu":
        kind, index = _KDL_CPU, 0
    else:
        raise TypeError("no fixed-address tensors on device %s" % device)
    m = _DLManagedTensor()
    shape = (ctypes.c_int64 * 1)(nbytes)
    m.dl_tensor = _DLTensor(ctypes.c_void_p(addr), _DLDevice(kind, index), 1, _DLDataType(_KDL_UINT, 8, 1),
                            shape, None, 0)
    m.deleter = _deleted
    owner = Owner()
    with _lock:
        _alive[ctypes.addressof(m)] = (m, shape, owner)
    try:
        t = torch.utils.dlpack.from_dlpack(_new_capsule(ctypes.addressof(m), b"dltensor", None))
    except BaseException:
        with _lock:
            _alive.pop(ctypes.addressof(m), None)
        raise
    return t, owner
