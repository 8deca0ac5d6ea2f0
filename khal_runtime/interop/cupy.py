"""CuPy arrays as storage arguments (recognised by module name; CuPy is never imported).

``.data.ptr``, many times cheaper than the interface dict (benchmarks/RESULTS.md). A ``cupy.ndarray``'s
``data``, ``size``, ``dtype`` and ``_c_contiguous`` are read-only, set in ``__init__`` (an
in-place shape change keeps a contiguous array contiguous): its memo policy is "stable".
``cupy.cuda.Stream`` objects are ``stream=`` arguments through :func:`stream_handle`; CuPy's
dtypes are NumPy's. It registers itself when :mod:`khal_runtime.interop` imports it.
"""

from __future__ import annotations

from typing import Any, Hashable

from khal_runtime.errors import ArgumentValueError
from khal_runtime.interop.registry import ArrayType, BadArgument, add_probe

__all__ = ["probe", "stream_handle"]

_NONCONTIG = "is a non-contiguous CuPy array; pass cupy.ascontiguousarray(a)"


def extract_fast(a: Any) -> tuple[int, int, Hashable]:
    if a._c_contiguous:
        return a.data.ptr, a.size, a.dtype
    raise BadArgument(ArgumentValueError, _NONCONTIG)


def extract(a: Any) -> tuple[int, int, Hashable]:
    if a.flags.c_contiguous:
        return a.data.ptr, a.size, a.dtype
    raise BadArgument(ArgumentValueError, _NONCONTIG)


def device(a: Any) -> int | None:
    return int(a.device.id)


INLINE_FAST = (
    "if not {a}._c_contiguous or {a}.device.id != {d}: raise Short()",
    "p{i} = {a}.data.ptr; c{i} = {a}.size; k{i} = {a}.dtype",
)
INLINE = (
    "if not {a}.flags.c_contiguous or {a}.device.id != {d}: raise Short()",
    "p{i} = {a}.data.ptr; c{i} = {a}.size; k{i} = {a}.dtype",
)


def probe(obj: Any) -> ArrayType | None:
    tp = type(obj)
    if not (tp.__module__ or "").startswith("cupy") or not hasattr(obj, "data") or not hasattr(obj, "size"):
        return None
    try:
        obj._c_contiguous
    except AttributeError:
        return ArrayType("cupy", extract, device, None, None, None, INLINE, stream_handle)
    if tp.__name__ == "ndarray":
        return ArrayType("cupy.ndarray", extract_fast, device, "stable", None, None, INLINE_FAST, stream_handle)
    return ArrayType("cupy.ndarray", extract_fast, device, None, None, None, INLINE_FAST, stream_handle)


def stream_handle(obj: Any) -> tuple[int, int | None] | None:
    """(CUstream handle, device) of a ``cupy.cuda.Stream``, else None."""
    if not (type(obj).__module__ or "").startswith("cupy") or not hasattr(obj, "ptr"):
        return None
    dev = getattr(obj, "device_id", None)
    return int(obj.ptr), (int(dev) if dev is not None and dev >= 0 else None)


# before __cuda_array_interface__, which a CuPy array also has (its attributes are cheaper)
add_probe(probe, order=20, stream=stream_handle)
