"""Element types of the kernel ABI and how foreign dtypes map onto them.

Pure Python, no GPU: used by argument checking and the launch-plan builder.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Hashable, NamedTuple

from khal_runtime import abi

__all__ = [
    "SCALAR_TYPES",
    "STRUCT_CODES",
    "DtypeNamer",
    "ReadOnly",
    "add_dtype_namer",
    "bf16_bits",
    "byte_order_problem",
    "dtype_info",
    "element_type_of_numpy",
]

#: element type -> itemsize in bytes (:data:`khal_runtime.abi.SCALARS`).
SCALAR_TYPES: dict[str, int] = {name: t.size for name, t in abi.SCALARS.items()}

#: element type -> struct format code (little-endian standard sizes, used with '<').
#: bfloat16 is packed as its 16 raw bits (see :func:`bf16_bits`).
STRUCT_CODES: dict[str, str] = {name: t.code for name, t in abi.SCALARS.items()}

bf16_bits = abi.bf16_bits


class ReadOnly(NamedTuple):
    """The dtype key of an array whose memory the kernel must not write: what an extractor
    returns for a read-only ``__cuda_array_interface__`` (``data=(ptr, True)``) or a DLPack 1.0
    tensor flagged ``DLPACK_FLAG_BITMASK_READ_ONLY``. It fits read-only (const) storage
    bindings only. The flag rides in the dtype key so that the launch paths check it where they
    check the dtype already (a learned set per parameter): it costs the hot path nothing."""

    dtype: Hashable


#: dtype key -> (element type name, itemsize) for one array library's dtype objects (a torch
#: dtype), None for a key that is not one of them. Each library's record brings its own
#: (:class:`khal_runtime.interop.ArrayType`, ``dtype_name``).
DtypeNamer = Callable[[Any], "tuple[str, int] | None"]
_NAMERS: tuple[DtypeNamer, ...] = ()
_namers_lock = threading.Lock()


def add_dtype_namer(namer: DtypeNamer) -> None:
    """Teach :func:`dtype_info` one library's dtype objects (once per namer)."""
    global _NAMERS
    with _namers_lock:
        if namer not in _NAMERS:
            _NAMERS = (*_NAMERS, namer)


# DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool, 7.. the float8 kinds
# (DLPack 1.1: 10 float8_e4m3fn, 12 float8_e5m2, named as torch and ml_dtypes name them; no ABI
# scalar type is one: only a Triton pointer takes them, checked by name).
_DLPACK = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
           (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
           (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
           (4, 16): "bfloat16", (5, 64): "complex64", (5, 128): "complex128", (6, 8): "bool", (1, 1): "bool",
           (7, 8): "float8_e3m4", (8, 8): "float8_e4m3", (9, 8): "float8_e4m3b11fnuz", (10, 8): "float8_e4m3fn",
           (11, 8): "float8_e4m3fnuz", (12, 8): "float8_e5m2", (13, 8): "float8_e5m2fnuz", (14, 8): "float8_e8m0fnu"}


#: the byte-order character NumPy gives a dtype of the other byte order than this machine's
_OTHER_ORDER = ">" if sys.byteorder == "little" else "<"


def _foreign_part(dt: Any, path: str) -> tuple[str, Any] | None:
    """(field path, scalar dtype) of the first number in ``dt`` stored in the other byte order,
    at any depth: a field, a nested struct's field, a subarray's element."""
    if dt.fields is not None:
        for name in dt.names:
            found = _foreign_part(dt.fields[name][0], f"{path}.{name}" if path else name)
            if found is not None:
                return found
        return None
    if dt.subdtype is not None:
        return _foreign_part(dt.subdtype[0], path)
    return (path, dt) if dt.byteorder == _OTHER_ORDER else None


def _spelling(dt: Any) -> str:
    return dt.str if dt.fields is None and dt.subdtype is None else str(dt)


def byte_order_problem(dt: Any) -> str | None:
    """Why the device would misread a NumPy dtype's bytes, or None when every number in it is
    in this machine's byte order. The one rule for DeviceBuffer dtypes, ``__cuda_array_interface__``
    typestrs and descrs, and NumPy struct uniforms. NumPy's ``dtype.isnative`` is not enough: it is
    True for a struct whose only field is a big-endian subarray (``[('v', '>f4', (3,))]``). The
    message names the offending field and spells the native dtype."""
    found = _foreign_part(dt, "")
    if found is None:
        return None
    path, part = found
    order = "big" if _OTHER_ORDER == ">" else "little"
    if path:
        what = f"field {path!r} ({part.str}) of dtype {_spelling(dt)}"
    elif part is not dt:  # a subarray dtype: name its element
        what = f"dtype {_spelling(dt)} (elements {part.str})"
    else:
        what = f"dtype {_spelling(dt)}"
    return (f"{what} is {order}-endian, not in this machine's byte order; the device reads native "
            f"({sys.byteorder}-endian) numbers: use {_spelling(dt.newbyteorder('='))} "
            "(.astype(dtype.newbyteorder('=')))")


def element_type_of_numpy(dt: Any) -> tuple[str, int]:
    """(element type name or "struct"/"other", itemsize) of a NumPy dtype."""
    name = getattr(dt, "name", str(dt))
    size = int(getattr(dt, "itemsize", 0))
    if getattr(dt, "byteorder", "=") == _OTHER_ORDER and not getattr(dt, "fields", None):
        return f"{name} of non-native byte order ({dt.str})", size
    if getattr(dt, "fields", None) or name.startswith("void"):
        return "struct", size
    if name in SCALAR_TYPES:
        return name, size
    if name == "bfloat16":  # ml_dtypes
        return "bfloat16", size
    return name, size


def dtype_info(key: Hashable) -> tuple[str, int]:
    """Map a dtype key (element type name, NumPy/CuPy dtype, DLPack triple, or a dtype of a
    library that registered a namer, e.g. torch) to (element type name, itemsize).
    Unknown -> (repr, 0). A :class:`ReadOnly` key is named as the dtype it wraps."""
    if type(key) is ReadOnly:
        key = key.dtype
    if isinstance(key, str):
        if key in SCALAR_TYPES:
            return key, SCALAR_TYPES[key]
        try:
            import numpy as np  # lazy: dtype names only

            return element_type_of_numpy(np.dtype(key))
        except Exception:
            return key, 0
    if isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, int) for k in key):
        code, bits, lanes = key
        name = _DLPACK.get((code, bits))
        if name is None or lanes != 1:
            return f"dlpack(code={code}, bits={bits}, lanes={lanes})", (bits * lanes + 7) // 8
        return name, SCALAR_TYPES.get(name, bits // 8)
    for namer in _NAMERS:
        got = namer(key)
        if got is not None:
            return got
    if hasattr(key, "itemsize") and hasattr(key, "kind"):
        return element_type_of_numpy(key)
    return repr(key), 0
