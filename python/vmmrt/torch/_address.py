# SPDX-License-Identifier: LGPL-2.1-or-later
"""Tensors over memory the C library owns, at its fixed addresses.

Built once, right after allocation, while every slot is mapped: making a CUDA
tensor from a raw address asks the driver about the pointer, which an
unmapped remap slot would fail. Later uses are views of these tensors (no
driver call), which is also why nothing here runs during graph capture.
"""
import ctypes

import torch

from vmmrt.torch import _compat

# __cuda_array_interface__ typestrs by element size: the tensor is made with
# an integer type of the same size (types every PyTorch has), then viewed as
# the real dtype (bf16 and bool have no typestr of their own).
_TYPESTR = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}


class _CudaMemory:
    """The smallest object torch.as_tensor accepts for device memory it does not own."""

    def __init__(self, addr, count, itemsize):
        self.__cuda_array_interface__ = {
            "shape": (count,), "typestr": _TYPESTR[itemsize], "data": (addr, False),
            "strides": None, "version": 2,
        }


def tensor_at(addr, nbytes, dtype, device):
    """A 1-D tensor of dtype covering [addr, addr + nbytes) (whole elements only)."""
    return owned_tensor_at(addr, nbytes, dtype, device)[0]


def owned_tensor_at(addr, nbytes, dtype, device):
    """(tensor, owner): tensor_at's tensor, and the object its storage keeps
    alive until the storage dies (every view of it gone): a weakref.finalize
    on the owner runs then, which is how memory behind a tensor learns that
    nobody points at it any more."""
    itemsize = _compat.itemsize(dtype)
    count = nbytes // itemsize
    device = torch.device(device)
    if device.type == "cuda":
        if itemsize not in _TYPESTR:
            raise TypeError("no fixed-address tensor for %s (element size %d)" % (dtype, itemsize))
        owner = _CudaMemory(addr, count, itemsize)
        raw = torch.as_tensor(owner, device=device)
        return (raw if raw.dtype == dtype else raw.view(dtype)), owner
    if device.type == "cpu":
        # The host backend: device addresses are host addresses.
        if not count:
            return torch.empty(0, dtype=dtype), None
        owner = (ctypes.c_uint8 * (count * itemsize)).from_address(addr)
        return torch.frombuffer(owner, dtype=dtype, count=count), owner
    raise TypeError("no fixed-address tensors on device %s" % device)
