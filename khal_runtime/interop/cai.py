"""Anything with ``__cuda_array_interface__`` (v2/v3) as a storage argument: the generic
protocol, used for types no other record claims (Numba, JAX on CUDA, PyCUDA, ...)."""

from __future__ import annotations

import operator
import sys
from typing import Any, Hashable

from khal_runtime.dtypes import byte_order_problem
from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.interop.registry import ArrayType, BadArgument, add_probe

__all__ = ["c_contiguous", "native_typestr", "probe"]

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
    try:
        shape = tuple(operator.index(d) for d in raw)
    except TypeError:
        raise BadArgument(ArgumentValueError, f"has shape {raw!r}: not a tuple of integers") from None
    if any(d < 0 for d in shape):
        raise BadArgument(ArgumentValueError, f"has shape {shape}: a negative extent")
    return shape


def extract(obj: Any) -> tuple[int, int, Hashable]:
    cai = obj.__cuda_array_interface__
    if cai.get("mask") is not None:
        raise BadArgument(ArgumentValueError, "is a masked array (__cuda_array_interface__ mask)")
    shape = _shape(cai["shape"])
    typestr = cai["typestr"]
    native_typestr(typestr)
    count = 1
    for d in shape:
        count *= d
    strides = cai.get("strides")
    if strides is not None and count and not c_contiguous(shape, tuple(strides), _typestr_size(typestr)):
        raise BadArgument(ArgumentValueError, f"is not C-contiguous (shape {shape}, strides {tuple(strides)})")
    ptr = cai["data"][0]
    if not isinstance(ptr, int) and ptr is not None:
        raise BadArgument(ArgumentError, f"has data pointer {ptr!r}, not an integer")
    if not ptr and count:
        raise BadArgument(ArgumentValueError, f"has a NULL data pointer for {count} elements "
                          "(__cuda_array_interface__ data[0] is 0); pass an allocated array")
    key: Hashable = typestr
    if typestr[1:2] == "V" and cai.get("descr"):
        import numpy as np  # lazy: structured element types only

        descr = np.dtype([tuple(d) for d in cai["descr"]])
        _native(descr, "descr")
        key = descr
    return int(ptr or 0), count, key


def probe(obj: Any) -> ArrayType | None:
    if not hasattr(type(obj), "__cuda_array_interface__"):
        return None
    return ArrayType("__cuda_array_interface__", extract)


add_probe(probe, order=30)
