"""Anything with ``__cuda_array_interface__`` (v2/v3) as a storage argument: the generic
protocol, used for types no other record claims (Numba, JAX on CUDA, PyCUDA, ...).

Everything in the dict is checked before it is believed (a producer can be broken): a dict
with shape, typestr and data, ``data`` a ``(pointer, read_only)`` pair, the pointer and the
bytes after it inside the 64-bit address space. A read-only array (``data=(ptr, True)``: JAX,
read-only CuPy / Numba views) has a :class:`~khal_runtime.dtypes.ReadOnly` dtype key, which fits
read-only bindings only."""

from __future__ import annotations

import operator
import sys
from typing import Any, Hashable

from khal_runtime.dtypes import ReadOnly, byte_order_problem
from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.interop.registry import ADDRESS_SPACE, ArrayType, BadArgument, add_probe

__all__ = ["c_contiguous", "check_range", "native_typestr", "probe"]

_TYPESTR_SIZE: dict[str, int] = {}
#: the byte-order character of a typestr of the other byte order than this machine's
_OTHER = ">" if sys.byteorder == "little" else "<"


def _typestr_size(typestr: str) -> int:
    n = _TYPESTR_SIZE.get(typestr)
    if n is None:
        import numpy as np  # lazy: only for arrays described by a typestr

        n = np.dtype(typestr).itemsize
        _TYPESTR_SIZE[typestr] = n
    return n


def native_typestr(typestr: str) -> None:
    """Refuse a typestr of the other byte order (``>f4`` on a little-endian host): the kernel
    would read its bytes as native numbers (the rule is :func:`khal_runtime.dtypes.byte_order_problem`)."""
    if len(typestr) < 3 or typestr[0] not in "<>|=":
        raise BadArgument(ArgumentError, f"has typestr {typestr!r}, not a __cuda_array_interface__ typestr")
    if typestr[0] == _OTHER:  # only then can a number in it be of the other byte order
        import numpy as np  # lazy: only for a typestr of the other byte order

        try:
            dt = np.dtype(typestr)
        except TypeError:
            raise BadArgument(ArgumentError, f"has typestr {typestr!r}, not a __cuda_array_interface__ "
                              "typestr") from None
        _native(dt, f"typestr {typestr!r}")


def _native(dt: Any, what: str) -> None:
    problem = byte_order_problem(dt)
    if problem is not None:
        raise BadArgument(ArgumentError, f"has {what}: {problem}")


def c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _shape(raw: Any) -> tuple[int, ...]:
    if isinstance(raw, (str, bytes)):
        raise BadArgument(ArgumentValueError, f"has shape {raw!r}: not a tuple of integers")
    try:
        shape = tuple(operator.index(d) for d in raw)
    except TypeError:
        raise BadArgument(ArgumentValueError, f"has shape {raw!r}: not a tuple of integers") from None
    if any(d < 0 for d in shape):
        raise BadArgument(ArgumentValueError, f"has shape {shape}: a negative extent")
    return shape


def check_range(ptr: int, count: int, itemsize: int, what: str) -> None:
    """Refuse a pointer outside the 64-bit address space, or ``count`` elements of ``itemsize``
    bytes that would run past its end (a shape of 2**70 elements, a negative pointer): the
    launch would pack them modulo 2**64, or fail inside ``struct`` with no parameter named."""
    if not 0 <= ptr < ADDRESS_SPACE:
        raise BadArgument(ArgumentValueError, f"has data pointer {ptr} ({what}), outside the 64-bit "
                          "address space; pass a real device array")
    if count * max(itemsize, 1) > ADDRESS_SPACE - ptr:
        raise BadArgument(ArgumentValueError, f"says it holds {count} elements of {itemsize} bytes from "
                          f"0x{ptr:x} ({what}), more than the 64-bit address space; its shape is wrong")


_REQUIRED = ("shape", "typestr", "data")


def extract(obj: Any) -> tuple[int, int, Hashable]:
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise BadArgument(ArgumentError, f"has a __cuda_array_interface__ of type {type(cai).__name__}, not a "
                          "dict (shape, typestr, data, ...); its producer is broken")
    missing = [k for k in _REQUIRED if k not in cai]
    if missing:
        raise BadArgument(ArgumentError, f"has a __cuda_array_interface__ without {', '.join(map(repr, missing))} "
                          f"(it needs {', '.join(_REQUIRED)}); its producer is broken")
    if cai.get("mask") is not None:
        raise BadArgument(ArgumentValueError, "is a masked array (__cuda_array_interface__ mask)")
    shape = _shape(cai["shape"])
    typestr = cai["typestr"]
    if not isinstance(typestr, str):
        raise BadArgument(ArgumentError, f"has typestr {typestr!r}, not a __cuda_array_interface__ typestr")
    native_typestr(typestr)
    try:
        itemsize = _typestr_size(typestr)
    except TypeError:
        raise BadArgument(ArgumentError, f"has typestr {typestr!r}, not a __cuda_array_interface__ "
                          "typestr") from None
    count = 1
    for d in shape:
        count *= d
    strides = cai.get("strides")
    if strides is not None:
        try:
            strides = tuple(operator.index(s) for s in strides)
        except TypeError:
            raise BadArgument(ArgumentValueError, f"has strides {strides!r}: not None or a tuple of "
                              "integers") from None
        if len(strides) != len(shape):
            raise BadArgument(ArgumentValueError, f"has strides {strides} for shape {shape}")
        if count and not c_contiguous(shape, strides, itemsize):
            raise BadArgument(ArgumentValueError, f"is not C-contiguous (shape {shape}, strides {strides})")
    data = cai["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise BadArgument(ArgumentError, f"has data {data!r}: __cuda_array_interface__ data is "
                          "(pointer, read_only)")
    ptr, read_only = data
    if ptr is not None and (not isinstance(ptr, int) or isinstance(ptr, bool)):
        raise BadArgument(ArgumentError, f"has data pointer {ptr!r}, not an integer")
    ptr = int(ptr or 0)
    if not ptr and count:
        raise BadArgument(ArgumentValueError, f"has a NULL data pointer for {count} elements "
                          "(__cuda_array_interface__ data[0] is 0); pass an allocated array")
    check_range(ptr, count, itemsize, "__cuda_array_interface__ data[0]")
    key: Hashable = typestr
    if typestr[1:2] == "V" and cai.get("descr"):
        import numpy as np  # lazy: structured element types only

        try:
            descr = np.dtype([tuple(d) for d in cai["descr"]])
        except (TypeError, ValueError) as exc:
            raise BadArgument(ArgumentError, f"has descr {cai['descr']!r}, not a NumPy descr: {exc}") from None
        _native(descr, "descr")
        key = descr
    return ptr, count, ReadOnly(key) if read_only else key


def probe(obj: Any) -> ArrayType | None:
    if not hasattr(type(obj), "__cuda_array_interface__"):
        return None
    return ArrayType("__cuda_array_interface__", extract)


add_probe(probe, order=30)
