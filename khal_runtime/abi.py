"""The kernel ABI: one table shared by the build hook and the runtime.

Everything both halves must agree on lives here and nowhere else:

* **scalar types** (:data:`SCALARS`): the element types of the ABI, their sizes, how the
  host packs them, how C and Slang spell them;
* **parameter kinds** (:data:`KINDS`): what the kernel receives for each binding, how the
  host packs it, how it is described in errors, traces and ``inspect``, and how an
  argument is checked;
* **arch strings** (:func:`parse_arch`), **symbol names** (:func:`symbol_for`) and the
  **entry hash** (:func:`entry_hash` over :func:`entry_signature`).

A new parameter kind is one :class:`ParamKind` in :data:`KINDS`; an unknown kind is an
error everywhere (:func:`kind`), never a scalar by default. This module is a leaf: it
imports nothing of the project, so every other module may import it.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import re
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple

__all__ = [
    "ABI_VERSION",
    "HASH_LEN",
    "KINDS",
    "MAX_BLOCK_THREADS",
    "SCALARS",
    "Arch",
    "ParamKind",
    "ScalarType",
    "Slot",
    "c_scalar",
    "describe_type_id",
    "entry_hash",
    "entry_signature",
    "indirect_symbol_for",
    "kind",
    "parse_arch",
    "probe_names",
    "prebuilt_env_var",
    "scalar",
    "scalar_value",
    "split_symbol",
    "symbol_for",
    "type_id",
    "type_id_scalar",
]

#: Version of the kernel ABI (how parameters are pushed).
ABI_VERSION = 1
#: Hex digits of an entry hash.
HASH_LEN = 16
#: Threads per block a CUDA device (and a WebGPU workgroup, at most) runs.
MAX_BLOCK_THREADS = 1024


# ---------------------------------------------------------------------------------------------
# scalar types
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScalarType:
    """One element type of the ABI."""

    name: str  # manifest spelling: "float32"
    size: int
    #: ``struct`` codes packing one value little-endian (bfloat16: its 16 raw bits as "H")
    code: str
    #: "int", "uint", "float", "bool" or "complex"
    family: str

    @property
    def align(self) -> int:
        return self.size // 2 if self.family == "complex" else self.size


SCALARS: dict[str, ScalarType] = {
    t.name: t
    for t in (
        ScalarType("int8", 1, "b", "int"), ScalarType("int16", 2, "h", "int"),
        ScalarType("int32", 4, "i", "int"), ScalarType("int64", 8, "q", "int"),
        ScalarType("uint8", 1, "B", "uint"), ScalarType("uint16", 2, "H", "uint"),
        ScalarType("uint32", 4, "I", "uint"), ScalarType("uint64", 8, "Q", "uint"),
        ScalarType("float16", 2, "e", "float"), ScalarType("bfloat16", 2, "H", "float"),
        ScalarType("float32", 4, "f", "float"), ScalarType("float64", 8, "d", "float"),
        ScalarType("bool", 1, "?", "bool"),
        ScalarType("complex64", 8, "ff", "complex"), ScalarType("complex128", 16, "dd", "complex"),
    )
}

#: C / CUDA spellings of the scalar types (``KHAL_SCALAR`` and storage element types).
C_SCALARS: dict[str, str] = {
    "int8_t": "int8", "int16_t": "int16", "int32_t": "int32", "int64_t": "int64",
    "uint8_t": "uint8", "uint16_t": "uint16", "uint32_t": "uint32", "uint64_t": "uint64",
    "int": "int32", "unsigned": "uint32", "float": "float32", "double": "float64",
    "bool": "bool", "__half": "float16", "half": "float16", "__nv_bfloat16": "bfloat16",
}


#: ``khal::type_id<T>`` (khal.h) encodes what the compiler says a type is as ``kind << 8 | sizeof``:
#: kind 0 is "not a scalar" (a struct, a class, anything else), then these.
TYPE_ID_KINDS: dict[str, int] = {"int": 1, "uint": 2, "float": 3, "bool": 4, "complex": 5, "bfloat": 6}


def type_id(t: ScalarType) -> int:
    """The ``khal::type_id`` value of an ABI scalar type (bfloat16 has a kind of its own)."""
    kind = TYPE_ID_KINDS["bfloat" if t.name == "bfloat16" else t.family]
    return kind << 8 | t.size


_BY_TYPE_ID: dict[int, ScalarType] = {}


def type_id_scalar(code: int) -> ScalarType | None:
    """The ABI scalar a ``khal::type_id`` value names; None for 0 (a struct) and for builtin
    types the ABI has no scalar for (a 16-byte ``long double``, ``__int128``)."""
    if not _BY_TYPE_ID:
        _BY_TYPE_ID.update({type_id(t): t for t in SCALARS.values()})
    return _BY_TYPE_ID.get(code)


def describe_type_id(code: int) -> str:
    """``a 16-byte float`` / ``a struct``: what a ``khal::type_id`` value says, in words."""
    kind, size = code >> 8, code & 0xFF
    names = {v: k for k, v in TYPE_ID_KINDS.items()}
    if kind == 0 or kind not in names:
        return "a struct"
    word = {"int": "signed integer", "uint": "unsigned integer", "bfloat": "bfloat"}.get(names[kind], names[kind])
    return f"a {size}-byte {word}"


def scalar(name: str) -> ScalarType:
    """The scalar type called ``name`` (manifest spelling); KeyError if it is none."""
    return SCALARS[name]


def c_scalar(ctype: str) -> ScalarType | None:
    """The scalar type a C spelling names (``int``, ``uint32_t``, ``__half``), else None."""
    name = C_SCALARS.get(ctype)
    return SCALARS[name] if name else None


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def bf16_bits(value: Any) -> int:
    """Round-to-nearest-even bfloat16 bits of a number (NaN stays NaN)."""
    bits: int = _U32.unpack(_F32.pack(float(value)))[0]
    if (bits & 0x7F800000) == 0x7F800000 and (bits & 0x007FFFFF):
        return ((bits >> 16) | 0x0040) & 0xFFFF
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def _is_bool(obj: Any) -> bool:
    tp = type(obj)
    return tp is bool or (tp.__module__ == "numpy" and tp.__name__ in ("bool", "bool_"))


def scalar_value(element_type: str, obj: Any) -> Any:
    """What to give ``struct`` for a scalar argument of ``element_type`` (a tuple of two
    floats for a complex), under the one set of rules every launch path uses:

    * ``bool``: a Python or NumPy bool only (never ``"false"``, ``None``, ``[]`` or ``2``);
    * integers: an int or anything with ``__index__`` (never a float or a string), in range;
    * floats (``bfloat16`` and ``float16`` too): an int, a float or a NumPy number (never a
      string, bytes, None or a bool);
    * complex: a number, ``complex`` or NumPy complex.

    Raises TypeError (wrong kind of value) or ValueError (out of range)."""
    t = SCALARS[element_type]
    fam = t.family
    tp = type(obj)
    if fam == "bool":
        if _is_bool(obj):
            return bool(obj)
        raise TypeError(f"expected a bool (True/False), got {tp.__name__} {obj!r}")
    if isinstance(obj, (str, bytes, bytearray)) or obj is None:
        raise TypeError(f"expected a number, got {tp.__name__} {obj!r}")
    if fam in ("int", "uint"):
        if isinstance(obj, float) or _is_bool(obj) and tp is not bool:
            raise TypeError(f"expected an integer, got {tp.__name__} {obj!r}")
        try:
            v = operator.index(obj)
        except TypeError:
            raise TypeError(f"expected an integer, got {tp.__name__} {obj!r}") from None
        bits = 8 * t.size
        lo, hi = (0, (1 << bits) - 1) if fam == "uint" else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        if not lo <= v <= hi:
            raise ValueError(f"{v} is out of range for {element_type} ({lo}..{hi})")
        return v
    if _is_bool(obj) and tp is not bool:
        raise TypeError(f"expected a number, got {tp.__name__} {obj!r}")
    if fam == "complex":
        try:
            c = complex(obj)
        except (TypeError, ValueError):
            raise TypeError(f"expected a complex number, got {tp.__name__} {obj!r}") from None
        return (c.real, c.imag)
    if isinstance(obj, complex) or getattr(obj, "dtype", None) is not None and \
            getattr(obj.dtype, "kind", "") == "c":
        raise TypeError(f"expected a real number, got {tp.__name__} {obj!r}")
    try:
        f = float(obj)
    except (TypeError, ValueError):
        raise TypeError(f"expected a number, got {tp.__name__} {obj!r}") from None
    return _float_in_range(element_type, f)


def _float_in_range(element_type: str, v: float) -> float | int:
    if element_type == "bfloat16":
        return bf16_bits(v)
    if element_type == "float32" and math.isfinite(v) and abs(v) > 3.4028234663852886e38:
        raise ValueError(f"{v!r} is out of range for float32")
    if element_type == "float16" and math.isfinite(v) and abs(v) >= 65520.0:
        raise ValueError(f"{v!r} is out of range for float16")
    return v


# ---------------------------------------------------------------------------------------------
# parameter kinds
# ---------------------------------------------------------------------------------------------
class Slot(NamedTuple):
    """One kernel parameter the ABI pushes for a binding."""

    what: str  # "pointer", "count" or "value": also the trace / error wording
    size: int
    align: int
    #: ``struct`` code(s) the host packs it with (little-endian)
    code: str


@dataclass(frozen=True)
class ParamKind:
    """How one kind of binding travels from host to kernel.

    ``reader`` names the host-side mechanism that reads an argument of this kind, a closed set
    the launch paths implement once each: ``"array"`` (a device array: pointer, element count,
    element type), ``"struct"`` (a small struct: host bytes or a device pointer) and
    ``"value"`` (a number passed by value)."""

    name: str
    reader: str
    #: the manifest's ``shape`` values this kind takes (None: it has none)
    shapes: tuple[str | None, ...]

    def slots(self, element_type: str, element_size: int, element_align: int) -> tuple[Slot, ...]:
        """The kernel parameters one binding of this kind takes, in order."""
        if self.reader == "array":
            return (Slot("pointer", 8, 8, "Q"), Slot("count", 8, 8, "Q"))
        if self.reader == "struct":
            return (Slot("pointer", 8, 8, "Q"),)
        t = SCALARS.get(element_type)
        if t is None:
            raise ValueError(f"scalar parameter of type {element_type!r}: not a scalar type of the ABI "
                             f"({', '.join(SCALARS)})")
        return (Slot("value", t.size, max(element_align, t.align), t.code),)

    def describe(self, element_type: str, element_size: int, shape: str | None = None,
                 length: int | None = None, writable: bool = False) -> str:
        """``storage float32``, ``storage Particle[4] rw``, ``uniform Params (16 bytes)``, ..."""
        if self.reader == "array":
            extra = f"[{length}]" if shape == "array" and length else ""
            single = " (one value)" if shape == "value" else ""
            return f"{self.name} {element_type}{extra}{single}{' rw' if writable else ''}"
        if self.reader == "struct":
            return f"{self.name} {element_type} ({element_size} bytes)"
        return f"{self.name} {element_type}"

    def validate(self, element_type: str, element_size: int, shape: str | None,
                 length: int | None, writable: bool) -> None:
        """Raise ValueError if a manifest parameter of this kind is inconsistent."""
        if shape not in self.shapes:
            raise ValueError(f"a {self.name} parameter has no shape {shape!r}")
        if self.reader == "array":
            if (shape == "array") != (length is not None) and not (shape == "value" and length == 1):
                raise ValueError(f"a {self.name} of shape {shape!r} has length {length!r}")
        elif length is not None:
            raise ValueError(f"a {self.name} parameter has no length")
        if writable and self.reader != "array":
            raise ValueError(f"a {self.name} parameter cannot be writable")
        t = SCALARS.get(element_type)
        if self.reader == "value" and t is None:
            raise ValueError(f"scalar type {element_type!r} is not one of the ABI's ({', '.join(SCALARS)})")
        if t is not None and element_size != t.size:
            raise ValueError(f"element type {element_type} is {t.size} bytes, not {element_size}")


KINDS: dict[str, ParamKind] = {
    k.name: k
    for k in (
        ParamKind("storage", "array", ("slice", "array", "value", None)),
        ParamKind("uniform", "struct", (None,)),
        ParamKind("scalar", "value", (None,)),
    )
}


def kind(name: str) -> ParamKind:
    """The parameter kind called ``name``; ValueError naming the known ones otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown parameter kind {name!r}; the ABI has {', '.join(KINDS)}") from None


# ---------------------------------------------------------------------------------------------
# archs
# ---------------------------------------------------------------------------------------------
class Arch(NamedTuple):
    """``sm_90a`` -> Arch("sm", 9, 0, "a"); ``compute_120`` -> Arch("compute", 12, 0, "")."""

    kind: str  # "sm" (a cubin) or "compute" (PTX)
    major: int
    minor: int
    suffix: str  # "", "a" or "f"

    @property
    def number(self) -> int:
        return self.major * 10 + self.minor

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def __str__(self) -> str:
        return f"{self.kind}_{self.number}{self.suffix}"


_ARCH_RE = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")


def parse_arch(arch: str, kinds: Iterable[str] = ("sm", "compute")) -> Arch:
    """Parse an arch string; ValueError saying what an arch looks like otherwise."""
    m = _ARCH_RE.match(arch) if isinstance(arch, str) else None
    if m is None or m.group(1) not in kinds:
        like = " or ".join({"sm": "'sm_90'", "compute": "'compute_75'"}[k] for k in kinds)
        raise ValueError(f"{arch!r} is not an arch like {like}")
    digits = m.group(2)
    return Arch(m.group(1), int(digits[:-1]), int(digits[-1]), m.group(3))


# ---------------------------------------------------------------------------------------------
# symbols and hashes
# ---------------------------------------------------------------------------------------------
_SYMBOL_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*?)_khal_(?P<hash>[0-9a-f]{16})$")


def symbol_for(entry: str, entry_hash: str) -> str:
    """The binary symbol of an entry: ``<entry>_khal_<hash>``."""
    return f"{entry}_khal_{entry_hash}"


def indirect_symbol_for(entry: str, entry_hash: str) -> str:
    """The symbol of an entry's persistent-grid (indirect dispatch) variant."""
    return symbol_for(f"{entry}_indirect", entry_hash)


#: added to every type probe: a struct's ``khal::type_id`` is 0, and a zero global has no
#: initialiser in a binary to read back
TYPE_PROBE_BIAS = 1 << 32


def probe_names(entry: str, index: int) -> tuple[str, str, str]:
    """The globals holding the compiler's sizeof, alignof and ``khal::type_id`` (+
    :data:`TYPE_PROBE_BIAS`) of parameter ``index``'s element type in a CUDA C++ crate."""
    return f"khal_sizeof_{entry}_{index}", f"khal_alignof_{entry}_{index}", f"khal_typeid_{entry}_{index}"


def split_symbol(symbol: str) -> tuple[str, str] | None:
    """``saxpy_khal_0123...`` -> ``("saxpy", "0123...")``; None if not a khal symbol."""
    m = _SYMBOL_RE.match(symbol)
    return (m.group("name"), m.group("hash")) if m else None


def prebuilt_env_var(crate: str) -> str:
    """``CUDA_OXIDE_SHADERS_PTX_<CRATE>``: khal-builder's name for a crate's prebuilt binary
    (upper-cased, ``-`` to ``_``)."""
    return "CUDA_OXIDE_SHADERS_PTX_" + crate.upper().replace("-", "_")


def entry_signature(name: str, block_size: Iterable[int], params: Iterable[Mapping[str, Any] | Any], *,
                    grid_dims: int = 1, fixed_block: bool = True, launch_bounds: int | None = None,
                    template: str | None = None, template_args: Iterable[str] = ()) -> dict[str, Any]:
    """What of an entry its hash covers besides the crate's content: the name, the block size
    and, per parameter, what the manifest records of it (name, kind, element type, shape,
    length, writability). Computable from a manifest alone, so that a loader can check that
    a manifest agrees with itself. ``params`` are manifest ``Param`` objects or mappings.

    A parameter with a ``ctype`` (CUDA C++ entries: the type as the marker spells it) is hashed
    by that spelling instead of its element type: the element type is what the compiler made of
    the spelling, known only once the binary (whose symbols carry the hash) exists; the build
    and the loader check it against the binary's own type probes instead. The launch shape
    (``grid_dims``, a block that is not fixed, its launch bounds) and a template instantiation
    are hashed when they differ from the defaults, so entries without them hash as before."""

    def field(p: Any, key: str) -> Any:
        return p.get(key) if isinstance(p, Mapping) else getattr(p, key, None)

    out_params = []
    for p in params:
        d = {k: field(p, k) for k in ("name", "kind", "element_type", "shape", "length", "writable")}
        ctype = field(p, "ctype")
        if ctype is not None:
            del d["element_type"]
            d["ctype"] = ctype
        out_params.append(d)
    sig: dict[str, Any] = {"name": name, "block_size": [int(b) for b in block_size], "params": out_params}
    if grid_dims != 1:
        sig["grid_dims"] = int(grid_dims)
    if not fixed_block:
        sig["fixed_block"] = False
        sig["launch_bounds"] = launch_bounds
    if template is not None:
        sig["template"] = [template, list(template_args)]
    return sig


def canonical(obj: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces): what every hash of the project is over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def entry_hash(content_hash: str, signature: Mapping[str, Any]) -> str:
    """16 hex digits: changes with the entry's signature or any input of its crate."""
    return hashlib.sha256(canonical({"crate": content_hash, "entry": dict(signature)})).hexdigest()[:HASH_LEN]
