"""Uniform arguments on the host: what a launch accepts for a struct parameter.

A uniform parameter receives a pointer to a struct of ``element_size`` bytes. A host value
(a ctypes ``Structure``, a NumPy structured scalar / 0-d array, ``bytes``) is turned into its
bytes here, in the struct's C layout; the backend uploads them (a content-addressed cache:
same bytes, same device memory). A device array already holding the struct (anything the
interop registry reads) is passed through as (pointer, bytes).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable

from khal_runtime import interop
from khal_runtime.dtypes import byte_order_problem, dtype_info
from khal_runtime.errors import ArgumentError
from khal_runtime.interop import BadArgument

__all__ = ["UniformConverter", "is_converter", "to_uniform", "uniform_converter"]

#: obj -> bytes (a host struct) or (device pointer, nbytes) (a device buffer)
UniformConverter = Callable[[Any], "bytes | tuple[int, int]"]


def _c_bytes(obj: Any) -> bytes:
    return obj  # type: ignore[no-any-return]


def _c_buffer(obj: Any) -> bytes:
    return bytes(obj)


def _c_ctypes(obj: Any) -> bytes:
    return bytes(obj)  # buffer protocol: sizeof(obj) bytes


def _c_numpy(obj: Any) -> bytes:
    dt = obj.dtype
    if dt.fields is None:
        raise BadArgument(ArgumentError, f"is a NumPy {dt} value, not a struct: pass a NumPy "
                          "structured scalar, a ctypes Structure or the struct's bytes")
    problem = byte_order_problem(dt)
    if problem is not None:
        raise BadArgument(ArgumentError, f"is a NumPy struct whose {problem}")
    if getattr(obj, "ndim", 0) and obj.size != 1:
        raise BadArgument(ArgumentError, f"is a NumPy array of {obj.size} elements; a uniform is one struct")
    return obj.tobytes()  # type: ignore[no-any-return]


def _c_device(obj: Any) -> tuple[int, int]:
    ptr, count, key = interop.extract(obj)
    _, itemsize = dtype_info(key)
    return ptr, count * itemsize


_CONVERTERS: dict[type, UniformConverter] = {bytes: _c_bytes, bytearray: _c_buffer, memoryview: _c_buffer}
#: ctypes structures of the other byte order (their bytes are not what the device reads)
_SWAPPED = tuple(getattr(ctypes, n) for n in (
    ("BigEndianStructure", "BigEndianUnion") if sys.byteorder == "little" else ("LittleEndianStructure", "LittleEndianUnion"))
    if hasattr(ctypes, n))


def _choose(obj: Any) -> UniformConverter:
    if isinstance(obj, (ctypes.Structure, ctypes.Union, ctypes.Array)):
        if isinstance(obj, _SWAPPED):
            order = "big" if sys.byteorder == "little" else "little"
            raise BadArgument(ArgumentError, f"is a {order}-endian ctypes structure; the device reads "
                              "native numbers: use ctypes.Structure")
        return _c_ctypes
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, (np.void, np.generic, np.ndarray)):
        return _c_numpy
    rec = interop.array_type(obj)
    if rec.name not in ("not an array", "host"):
        return _c_device
    tp = type(obj)
    raise BadArgument(
        ArgumentError,
        f"expected a uniform struct (ctypes Structure, NumPy structured scalar, bytes, or a "
        f"device buffer holding it), got {tp.__module__}.{tp.__qualname__}",
    )


def uniform_converter(obj: Any) -> UniformConverter:
    """The converter for ``type(obj)`` (chosen on first sight, then cached)."""
    fn = _CONVERTERS.get(type(obj))
    if fn is None:
        fn = _choose(obj)
        _CONVERTERS[type(obj)] = fn
    return fn


def is_converter(fn: Any, kind: str) -> bool:
    """Whether ``fn`` is the converter of ``kind``: "ctypes", "buffer" or "device"."""
    return fn is {"ctypes": _c_ctypes, "buffer": _c_buffer, "device": _c_device}[kind]


def cached_converter(tp: type) -> UniformConverter | None:
    """The converter already chosen for ``tp``, if any (no lookup, no side effects)."""
    return _CONVERTERS.get(tp)


def to_uniform(obj: Any) -> bytes | tuple[int, int]:
    return uniform_converter(obj)(obj)
