"""DLPack objects (``__dlpack__`` / ``__dlpack_device__``) as storage arguments: the fallback.

The capsule is read through ctypes because DLPack is a C struct layout with no Python
accessor in the standard library; the producer's deleter runs when the capsule goes.
"""

from __future__ import annotations

import ctypes
from typing import Any, Hashable

from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.interop.registry import ArrayType, BadArgument, add_probe
from khal_runtime.interop.cai import c_contiguous

__all__ = ["probe"]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
    ]


_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


def extract(obj: Any) -> tuple[int, int, Hashable]:
    dev_type, _dev_id = obj.__dlpack_device__()
    if int(dev_type) not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        what = {1: "host memory (DLPack CPU)", 3: "pinned host memory (DLPack CUDAHost)"}.get(
            int(dev_type), f"not device memory (DLPack device type {int(dev_type)})")
        raise BadArgument(ArgumentError, f"is {what}")
    try:
        cap = obj.__dlpack__(stream=-1)
    except TypeError:
        cap = obj.__dlpack__()
    addr = _capsule_get(cap, b"dltensor")  # DLManagedTensor*: DLTensor is its first member
    t = _DLTensor.from_address(addr)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if any(d < 0 for d in shape):
        raise BadArgument(ArgumentValueError, f"has DLPack shape {shape}: a negative extent")
    count = 1
    for d in shape:
        count *= d
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    strides = tuple(t.strides[i] * itemsize for i in range(t.ndim)) if t.strides else None
    if count and not c_contiguous(shape, strides, itemsize):
        raise BadArgument(ArgumentValueError, f"is not C-contiguous (DLPack shape {shape})")
    ptr = (t.data or 0) + t.byte_offset
    if not ptr and count:
        raise BadArgument(ArgumentValueError, f"has a NULL data pointer for {count} elements")
    key = (int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes))
    del cap  # the capsule's destructor calls the producer's deleter; obj keeps the memory
    return ptr, count, key


def probe(obj: Any) -> ArrayType | None:
    tp = type(obj)
    if hasattr(tp, "__dlpack__") and hasattr(tp, "__dlpack_device__"):
        return ArrayType("DLPack", extract)
    return None


add_probe(probe, order=50)
