"""DLPack objects (``__dlpack__`` / ``__dlpack_device__``) as storage arguments: the fallback.

The capsule is read through ctypes because DLPack is a C struct layout with no Python
accessor in the standard library; the producer's deleter runs when the capsule goes. The
reader asks for DLPack 1.0 (``max_version=(1, 0)``), whose versioned capsule carries the
read-only flag (then the dtype key is a :class:`~khal_runtime.dtypes.ReadOnly`), and takes the
legacy capsule from older producers. A broken producer (``__dlpack__`` returning something
else than a capsule, a capsule already consumed, a shape past the address space) is refused
by name, never read.
"""

from __future__ import annotations

import ctypes
from typing import Any, Hashable

from khal_runtime.dtypes import ReadOnly
from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.interop.cai import c_contiguous, check_range
from khal_runtime.interop.registry import ArrayType, BadArgument, add_probe

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


class _DLManagedTensorVersioned(ctypes.Structure):
    """DLPack 1.0: the version, the producer's context and deleter, the flags, then the tensor."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
#: DLPACK_FLAG_BITMASK_READ_ONLY (DLPack 1.0): the consumer must not write the memory
_FLAG_READ_ONLY = 1
#: the newest DLPack this reader understands (asked for as ``max_version``)
MAX_VERSION = (1, 0)
_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def _capsule(obj: Any) -> Any:
    """``obj.__dlpack__(...)``: a versioned capsule where the producer speaks DLPack 1.0 (it
    carries the read-only flag), else the legacy one."""
    for kwargs in ({"stream": -1, "max_version": MAX_VERSION}, {"stream": -1}, {}):
        try:
            return obj.__dlpack__(**kwargs)
        except TypeError:  # an older producer: no max_version (or no stream) keyword
            if not kwargs:
                raise
        except Exception as exc:  # noqa: BLE001  (a producer's own refusal, named here)
            raise BadArgument(ArgumentError, f"__dlpack__() raised {type(exc).__name__}: {exc}") from None
    raise AssertionError("unreachable")


def extract(obj: Any) -> tuple[int, int, Hashable]:
    try:
        dev = obj.__dlpack_device__()
        dev_type = int(dev[0])
    except Exception as exc:  # noqa: BLE001  (a broken producer)
        raise BadArgument(ArgumentError, f"has a __dlpack_device__() that does not give (device type, device "
                          f"id) ({type(exc).__name__}: {exc}); its producer is broken") from None
    if dev_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        what = {1: "host memory (DLPack CPU)", 3: "pinned host memory (DLPack CUDAHost)"}.get(
            dev_type, f"not device memory (DLPack device type {dev_type})")
        raise BadArgument(ArgumentError, f"is {what}")
    try:
        cap = _capsule(obj)
    except TypeError as exc:
        raise BadArgument(ArgumentError, f"__dlpack__() raised TypeError: {exc}") from None
    if type(cap).__name__ != "PyCapsule":
        raise BadArgument(ArgumentError, f"__dlpack__() returned {type(cap).__name__} {cap!r:.60}, not a DLPack "
                          "capsule; its producer is broken")
    name = _capsule_name(cap) or b""
    if name.startswith(b"used_"):
        raise BadArgument(ArgumentValueError, f"__dlpack__() returned a capsule already consumed "
                          f"({name.decode(errors='replace')!r}): a DLPack capsule can be read once; its "
                          "producer must make a new one per call (pass the array itself)")
    read_only = False
    if name == b"dltensor_versioned":
        m = _DLManagedTensorVersioned.from_address(_capsule_get(cap, name))
        if m.major != MAX_VERSION[0]:
            raise BadArgument(ArgumentError, f"is a DLPack {m.major}.{m.minor} tensor; this runtime reads DLPack "
                              f"{MAX_VERSION[0]}.x (it asked for max_version={MAX_VERSION})")
        t = m.dl_tensor
        read_only = bool(m.flags & _FLAG_READ_ONLY)
    elif name == b"dltensor":
        t = _DLTensor.from_address(_capsule_get(cap, name))  # DLManagedTensor: DLTensor comes first
    else:
        raise BadArgument(ArgumentError, f"__dlpack__() returned a capsule named {name.decode(errors='replace')!r}, "
                          "not 'dltensor' or 'dltensor_versioned'; its producer is broken")
    if not 0 <= t.ndim <= 64 or (t.ndim and not t.shape):
        raise BadArgument(ArgumentValueError, f"has a DLPack tensor of {t.ndim} dimension(s) "
                          f"{'without a shape' if t.ndim > 0 else ''}; its producer is broken")
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
    check_range(ptr, count, itemsize, "DLPack data + byte_offset")
    key: Hashable = (int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes))
    del cap  # the capsule's destructor calls the producer's deleter; obj keeps the memory
    return ptr, count, ReadOnly(key) if read_only else key


def probe(obj: Any) -> ArrayType | None:
    tp = type(obj)
    if hasattr(tp, "__dlpack__") and hasattr(tp, "__dlpack_device__"):
        return ArrayType("DLPack", extract)
    return None


add_probe(probe, order=50)
