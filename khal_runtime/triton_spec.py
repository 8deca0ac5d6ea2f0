"""The specialisation Triton's JIT gives a call, argument by argument, with no Triton in the process.

Triton 3.6 keys its compiled kernels by what :func:`triton.runtime.jit.create_function_from_signature`'s
binder returns for each parameter: ``native_specialize_impl(backend, value, is_const, specialize,
align)`` (``python/src/specialize.cc``), or the annotation's type for an annotated parameter. This
module re-implements those rules (notes/triton-jit.md, "JIT specialisation"), so that the run time
can launch the variant the JIT would have compiled for a call; ``tests/build/test_triton_spec.py``
compares it with Triton's own function over many values.

* :func:`specialize_value` is ``native_specialize_impl``: ``(type, attr)``, attr ``"D"`` (16-byte
  aligned pointer, integer divisible by 16), ``""`` (specialisable, not divisible) or None (not
  specialised); ``("constexpr", v)`` for an int equal to 1 and for None;
* :func:`specialize_param` is the binder for one parameter (:class:`~khal_runtime.manifest.TritonParam`):
  constexprs, ``do_not_specialize``, ``do_not_specialize_on_alignment`` and annotations;
* :func:`pointer_type` the ``*fp32`` of a tensor's dtype (Triton's ``canonicalize_ptr_dtype``).
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["CANONICAL", "SpecError", "as_index", "int_type", "pointer_type", "specialize_param", "specialize_value",
           "spelling"]

#: a dtype's name (the last dotted part of ``str(dtype)``) -> Triton's type (Triton's
#: ``type_canonicalisation_dict``: the same names, the same answers)
CANONICAL: dict[str, str] = {
    "bool": "u1", "int1": "u1", "uint1": "u1", "i1": "u1",
    "float8e4nv": "fp8e4nv", "float8e5": "fp8e5", "float8e4b15": "fp8e4b15", "float8_e4m3fn": "fp8e4nv",
    "float8e4b8": "fp8e4b8", "float8_e4m3fnuz": "fp8e4b8", "float8_e5m2": "fp8e5", "float8e5b16": "fp8e5b16",
    "float8_e5m2fnuz": "fp8e5b16",
    "half": "fp16", "float16": "fp16", "bfloat16": "bf16", "float": "fp32", "float32": "fp32",
    "double": "fp64", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int": "i32", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "void": "void",
}
for _v in list(CANONICAL.values()):
    CANONICAL[_v] = _v
del _v

_I32 = (-(1 << 31), (1 << 31) - 1)
_I64_MIN, _I64_MAX, _U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


class SpecError(TypeError):
    """A value Triton's JIT cannot specialise (a string, an integer past 64 bits, ...)."""


#: a dtype object -> its pointer type, one ``str()`` per dtype object (Triton caches it the same way)
_ptr_types: dict[Any, str] = {}


def pointer_type(dtype: Any, is_const: bool = False) -> str:
    """``"*fp32"`` for a float32 dtype (torch's, NumPy's, CuPy's: by the last dotted part of its name),
    ``"*k..."`` for a ``const`` parameter. A dtype Triton has no type for is a :class:`SpecError`."""
    try:
        t = _ptr_types.get(dtype)
    except TypeError:  # an unhashable dtype object
        t = None
    if t is None:
        name = str(dtype).split(".")[-1]
        base = CANONICAL.get(name)
        if base is None:
            raise SpecError(f"a tensor of dtype {dtype} has no Triton type")
        t = "*" + base
        try:
            if len(_ptr_types) < 256:
                _ptr_types[dtype] = t
        except TypeError:
            pass
    return "*k" + t[1:] if is_const else t


def int_type(v: int) -> str:
    """Triton's type of an int by its range: ``i32``, ``i64`` or ``u64`` (past 64 bits: :class:`SpecError`)."""
    if _I32[0] <= v <= _I32[1]:
        return "i32"
    if _I64_MIN <= v <= _I64_MAX:
        return "i64"
    if 0 <= v <= _U64_MAX:
        return "u64"
    raise SpecError(f"integer {v} is too large for a 64-bit kernel argument")


def specialize_value(value: Any, specialize: bool = True, align: bool = True, is_const: bool = False
                     ) -> tuple[Any, Any]:
    """Triton 3.6's ``native_specialize_impl(CUDABackend, value, is_const, specialize, align)``."""
    t = type(value)
    if t is bool:
        return ("u1", None)
    if t is int or (isinstance(value, int) and t is not bool):
        v = int(value)
        if specialize and v == 1:
            return ("constexpr", value)
        ty = int_type(v)
        if not specialize:
            return (ty, None)
        return (ty, "D" if align and not v & 15 else "")
    if t is float or isinstance(value, float):
        return ("fp32", None)
    if value is None:
        return ("constexpr", None)
    if isinstance(value, tuple):
        raise SpecError("a tuple argument (Triton's tuple parameters are not supported by khal)")
    if _is_constexpr(value):
        return ("constexpr", value)
    data_ptr = getattr(value, "data_ptr", None)
    if data_ptr is not None:
        ty = pointer_type(getattr(value, "dtype", None), is_const)
        if not specialize:
            return (ty, None)
        return (ty, "D" if align and not int(data_ptr()) & 15 else "")
    raise SpecError(f"failed to specialize argument of type: {t.__module__}.{t.__qualname__}"
                    if t.__module__ != "builtins" else f"failed to specialize argument of type: {t.__name__}")


def _is_constexpr(value: Any) -> bool:
    """Triton's ``tl.constexpr`` (or the stand-in's): a value wrapped as a compile-time constant."""
    t = type(value)
    return t.__name__ == "constexpr" and hasattr(value, "value")


def _unsigned_float_or_bool(annotation: str) -> bool:
    return annotation == "u1" or annotation[:2] in ("fp", "bf")


def specialize_param(value: Any, param: Any) -> tuple[Any, Any]:
    """What Triton 3.6's binder gives parameter ``param`` (a :class:`~khal_runtime.manifest.TritonParam`:
    ``constexpr``, ``do_not_specialize``, ``do_not_specialize_on_alignment``, ``annotation``) for
    ``value``: ``("constexpr", value)`` for a constexpr; for an annotated parameter its type, with
    the value's attribute unless the type is a float or a bool (never specialised); else
    :func:`specialize_value`."""
    if param.constexpr:
        return ("constexpr", value)
    specialize = not param.do_not_specialize
    align = not param.do_not_specialize_on_alignment
    ann = param.annotation
    is_const = ann.startswith("*k")
    if ann:
        if _unsigned_float_or_bool(ann) or not specialize:
            return (ann, None)
        return (ann, specialize_value(value, specialize, align, is_const)[1])
    return specialize_value(value, specialize, align, is_const)


def as_index(value: Any) -> Any:
    """An integer-like argument (NumPy's, a 0-d torch integer tensor, an ``IntEnum``) as the int it
    is (``operator.index``); anything else as it is."""
    if type(value) is int or isinstance(value, (bool, float)) or value is None:
        return value
    index = getattr(type(value), "__index__", None)
    if index is None:
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def spelling(spec: tuple[Any, Any], base: str | None = None) -> str:
    """A runtime argument's specialisation in the lock file's spelling (notes/triton-jit.md):
    ``*fp32:16``, ``i32``, ``i32:1`` (an int equal to 1, compiled in), ``none``; ``base`` the
    type of an argument the JIT made ``("constexpr", 1)`` (default ``i32``)."""
    ty, attr = spec
    if ty == "constexpr":
        return "none" if attr is None else f"{base or 'i32'}:1"
    return f"{ty}:16" if attr == "D" else str(ty)
