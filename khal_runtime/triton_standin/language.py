"""The stand-in's ``triton.language`` values a host module reads at import or at a call: the
``tl.dtype`` objects with Triton's names, ``tl.pointer_type`` and ``tl.constexpr``.

Written from Triton's documented behaviour (3.6), not copied: ``tl.float32.name == "fp32"``,
``str(tl.float32) == "fp32"``, ``repr(tl.float32) == "triton.language.float32"``; a dtype equals
another of its name. ``tests/runtime/test_triton_standin.py`` compares every dtype here with the
installed Triton's where there is one.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DTYPES", "constexpr", "dtype", "pointer_type"]

#: Triton's dtype names by kind, as ``triton.language.dtype`` sorts them
SINT_TYPES = ("int8", "int16", "int32", "int64")
UINT_TYPES = ("int1", "uint8", "uint16", "uint32", "uint64")
FP_TYPES = ("fp8e4b15", "fp8e4nv", "fp8e4b8", "fp8e5", "fp8e5b16", "fp16", "bf16", "fp32", "fp64")
OTHER_TYPES = ("void",)

_BITS = {"int1": 1, "void": 0}


def _bitwidth(name: str) -> int:
    if name in _BITS:
        return _BITS[name]
    if name.startswith("fp8"):
        return 8
    digits = "".join(ch for ch in name if ch.isdigit())
    return int(digits)


class dtype:  # noqa: N801 - Triton's name
    """A Triton scalar type, by Triton's name (``"fp32"``, ``"bf16"``, ``"fp8e4nv"``, ``"int8"``)."""

    SINT_TYPES = SINT_TYPES
    UINT_TYPES = UINT_TYPES
    FP_TYPES = FP_TYPES
    OTHER_TYPES = OTHER_TYPES

    def __init__(self, name: str) -> None:
        if name not in SINT_TYPES + UINT_TYPES + FP_TYPES + OTHER_TYPES:
            raise ValueError(f"triton.language.dtype: unknown type name {name!r} (khal's Triton stand-in knows "
                             f"{', '.join(SINT_TYPES + UINT_TYPES + FP_TYPES + OTHER_TYPES)})")
        self.name = name
        self.primitive_bitwidth = _bitwidth(name)

    # the predicates Triton's dtype answers
    def is_floating(self) -> bool:
        return self.name in FP_TYPES

    def is_int_signed(self) -> bool:
        return self.name in SINT_TYPES

    def is_int_unsigned(self) -> bool:
        return self.name in UINT_TYPES

    def is_int(self) -> bool:
        return self.name in SINT_TYPES + UINT_TYPES

    def is_bool(self) -> bool:
        return self.name == "int1"

    def is_fp8(self) -> bool:
        return self.name.startswith("fp8")

    def is_fp16(self) -> bool:
        return self.name == "fp16"

    def is_bf16(self) -> bool:
        return self.name == "bf16"

    def is_fp32(self) -> bool:
        return self.name == "fp32"

    def is_fp64(self) -> bool:
        return self.name == "fp64"

    def is_void(self) -> bool:
        return self.name == "void"

    def is_ptr(self) -> bool:
        return False

    @property
    def scalar(self) -> dtype:
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, dtype) and type(other) is type(self) and other.name == self.name

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name))

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"triton.language.{_ATTR.get(self.name, self.name)}"


class pointer_type(dtype):  # noqa: N801 - Triton's name
    """``tl.pointer_type(tl.float32)``: named ``pointer<fp32>``, as Triton names it."""

    def __init__(self, element_ty: dtype, address_space: int = 1, const: bool = False) -> None:
        if not isinstance(element_ty, dtype):
            raise TypeError(f"triton.language.pointer_type: element_ty must be a dtype, not {element_ty!r}")
        self.element_ty = element_ty
        self.address_space = address_space
        self.const = const
        self.name = f"pointer<{element_ty.name}>" if not const else f"const_pointer<{element_ty.name}>"

    def is_ptr(self) -> bool:
        return True

    def is_floating(self) -> bool:
        return False

    def is_int(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, pointer_type) and other.element_ty == self.element_ty
                and other.address_space == self.address_space and other.const == self.const)

    def __hash__(self) -> int:
        return hash(("pointer_type", self.name, self.address_space))

    def __repr__(self) -> str:
        return self.name


class constexpr:  # noqa: N801 - Triton's name
    """A compile-time constant: the annotation ``BLOCK: tl.constexpr`` and values ``tl.constexpr(0)``
    (module-level constants kernels read). ``.value`` holds the value; it compares, hashes and
    converts as its value does."""

    value: Any

    def __init__(self, value: Any) -> None:
        self.value = value.value if isinstance(value, constexpr) else value

    def __repr__(self) -> str:
        return f"constexpr[{self.value}]"

    def __eq__(self, other: object) -> bool:
        return bool(self.value == (other.value if isinstance(other, constexpr) else other))

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __index__(self) -> int:
        return int(self.value.__index__())

    def __float__(self) -> float:
        return float(self.value)


#: ``triton.language`` attribute -> Triton's dtype name, the whole list of Triton 3.6's dtype values
DTYPES: dict[str, str] = {
    "int1": "int1", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float8e4b15": "fp8e4b15", "float8e4nv": "fp8e4nv", "float8e4b8": "fp8e4b8", "float8e5": "fp8e5",
    "float8e5b16": "fp8e5b16", "float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
    "void": "void",
}
_ATTR = {v: k for k, v in DTYPES.items()}

#: the values themselves (one object per name, shared by every import of the stand-in)
VALUES: dict[str, Any] = {attr: dtype(name) for attr, name in DTYPES.items()}
VALUES["pi32_t"] = pointer_type(VALUES["int32"])
