"""Argument checking: what a launch accepts, and the named error for what it does not.

The launch paths (``launching``'s generated code, ``bound``) check arguments on
their fast paths as cheaply as they can; when anything is off they call
:func:`diagnose_args`, which re-checks every argument slowly and raises an
``ArgumentError`` (a TypeError) or ``ArgumentValueError`` (a ValueError) naming
the entry and the parameter. It needs no GPU: ``Kernel.check_args`` uses it too.
"""

from __future__ import annotations

import operator
import struct
from typing import Any, Sequence

from khal_runtime.buffers import BadArgument, device_of, extractor_for
from khal_runtime.dtypes import SCALAR_TYPES, STRUCT_CODES, bf16_bits, dtype_info
from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.manifest import Entry, Param
from khal_runtime.uniforms import uniform_converter

__all__ = ["diagnose_args", "dim3", "thread_count"]


class _Short(Exception):
    """Internal: fast path noticed a problem; _diagnose names it."""


def dim3(v: int | Sequence[int], what: str = "grid") -> tuple[int, int, int]:
    """An int or a sequence of up to 3 ints (NumPy integers too; never floats) as (x, y, z)."""
    try:
        if isinstance(v, (str, bytes)):
            raise TypeError
        t = (operator.index(v), 1, 1) if not hasattr(v, "__len__") else \
            tuple(operator.index(x) for x in v) + (1,) * (3 - len(v))  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentError(f"{what}: expected an integer or up to 3 integers, got {v!r}") from None
    if len(t) != 3:
        raise ValueError(f"{what}: expected up to 3 dimensions, got {v!r}")
    if any(x < 1 for x in t):
        raise ValueError(f"{what}: every dimension must be >= 1, got {t}")
    return t  # type: ignore[return-value]


def thread_count(kernel: str, n: Any) -> int:
    """A launch's thread count as an int: ints and NumPy integers, never floats (no silent
    truncation), strings or None."""
    try:
        return operator.index(n)
    except TypeError:
        raise ArgumentError(
            f"{kernel}(): the first argument is the thread count, an integer >= 0; "
            f"got {n!r} ({type(n).__name__})"
        ) from None


def _param_desc(p: Param) -> str:
    if p.kind == "storage":
        shape = p.shape or "slice"
        extra = f"[{p.length}]" if shape == "array" and p.length else ""
        return f"storage {p.element_type}{extra}"
    if p.kind == "uniform":
        return f"uniform {p.element_type} ({p.element_size} bytes)"
    return f"scalar {p.element_type}"


def _dtype_ok(p: Param, key: Any) -> tuple[bool, str]:
    name, itemsize = dtype_info(key)
    if p.element_type in SCALAR_TYPES:
        return name == p.element_type, name
    # a struct element: any dtype of the same item size (structured dtypes, raw void)
    return itemsize == p.element_size and name not in SCALAR_TYPES, f"{name} ({itemsize} bytes)"


def diagnose_args(entry: Entry, args: Sequence[Any], exc: BaseException | None = None,
                  device: int | None = None) -> None:
    """Check ``args`` against ``entry`` without a GPU; raise ArgumentError/ArgumentValueError.
    With ``device`` (the launch's), an array known to be on another device is refused too:
    a kernel reading another device's memory fails with an illegal address, and that error
    ruins the context for every later call.

    Returns normally if every argument is acceptable."""
    params = entry.params
    where = f"{entry.name}()"
    if len(args) != len(params):
        sig = ", ".join(p.name for p in params)
        raise ArgumentError(
            f"{where} takes {len(params)} argument(s) ({sig}) after the thread count, got {len(args)}"
        )
    for p, obj in zip(params, args):
        arg = f"{where}: argument {p.name!r} ({_param_desc(p)})"
        if p.kind == "storage":
            try:
                ptr, count, key = extractor_for(obj)(obj)
            except BadArgument as bad:
                raise bad.cls(f"{arg} {bad}") from None
            on = device_of(obj) if device is not None else None
            if on is not None and on != device:
                raise ArgumentValueError(
                    f"{arg} is on device {on}, the launch is on device {device}: move it "
                    f"there, or launch on a stream of device {on}")
            ok, got = _dtype_ok(p, key)
            if not ok:
                if got == "<freed buffer>":
                    raise ArgumentValueError(f"{arg}: the DeviceBuffer was freed")
                raise ArgumentError(f"{arg}: expected element type {p.element_type} "
                                    f"({p.element_size} bytes), got {got}")
            if p.shape == "array" and p.length and count < p.length:
                raise ArgumentValueError(f"{arg}: needs {p.length} elements, got {count}")
            if p.shape == "value" and count < 1:
                raise ArgumentValueError(f"{arg}: needs 1 element, got an empty array")
        elif p.kind == "uniform":
            try:
                u = uniform_converter(obj)(obj)
            except BadArgument as bad:
                raise bad.cls(f"{arg}: {bad}") from None
            if isinstance(u, bytes):
                if len(u) != p.element_size:
                    raise ArgumentValueError(
                        f"{arg}: expected {p.element_size} bytes, got {len(u)} "
                        f"({type(obj).__name__})")
            elif u[1] < p.element_size:
                raise ArgumentValueError(
                    f"{arg}: the device buffer holds {u[1]} bytes, the struct needs {p.element_size}")
        else:
            code = STRUCT_CODES.get(p.element_type)
            if code is None:
                raise ArgumentError(f"{arg}: unsupported scalar type")
            if isinstance(obj, (bytes, str)) or not _is_number(obj):
                raise ArgumentError(f"{arg}: expected a number, got {type(obj).__name__}")
            if code in "bBhHiIqQ" and p.element_type != "bfloat16" and isinstance(obj, float):
                raise ArgumentError(f"{arg}: expected an integer, got float {obj!r}")
            try:
                struct.pack("<" + code, bf16_bits(obj) if p.element_type == "bfloat16" else obj)
            except (struct.error, OverflowError, TypeError, ValueError) as e:
                cls = ArgumentValueError if isinstance(e, (OverflowError,)) or "range" in str(e) \
                    or "format requires" in str(e) else ArgumentError
                raise cls(f"{arg}: cannot pass {obj!r}: {e}") from None
    if isinstance(exc, _Short):
        raise ArgumentError(f"{where}: the arguments do not match the entry's parameters")
    # nothing wrong with the arguments: the caller re-raises the original error


def _is_number(x: Any) -> bool:
    if isinstance(x, (int, float, bool)):
        return True
    return hasattr(x, "__index__") or hasattr(x, "__float__")
