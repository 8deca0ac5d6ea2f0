"""The kernel ABI: one table shared by the build hook and the runtime.

Everything both halves must agree on lives here and nowhere else:

* **scalar types** (:data:`SCALARS`): the element types of the ABI, their sizes, how the
  host packs them, how C and Slang spell them;
* **parameter kinds** (:data:`KINDS`): what the kernel receives for each binding, how the
  host packs it, how it is described in errors, traces and ``inspect``, and how an
  argument is checked;
* **arch strings** (:func:`parse_arch`), **symbol names** (:func:`symbol_for`) and the
  **entry hash** (:func:`entry_hash` over :func:`entry_signature`).

A new parameter kind that reuses one of the :data:`READERS` is one :class:`ParamKind` in
:data:`KINDS` (its CUDA C++ markers, what the kernel receives, its binding, its stub type all
come from the table); an unknown kind is an error everywhere (:func:`kind`). A new reader is
one :class:`Reader` here plus one implementation in each path's :class:`ReaderTable`: a path
without one fails when its module is imported (:class:`ReaderTableError`), and a kind whose
reader a path lacks is refused by name (:func:`unknown_reader`), never taken for a scalar. This
module is a leaf: it imports nothing of the project, so every other module may import it.
"""

from __future__ import annotations

import collections.abc as _abc
import hashlib
import json
import math
import operator
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Literal, Mapping, NamedTuple, TypeVar

from khal_runtime import launch_attributes
from khal_runtime.errors import EnvVarError
# (the launch attributes' constants, read here by older callers)
from khal_runtime.launch_attributes import DEFAULT_DYNAMIC_SHARED as DEFAULT_DYNAMIC_SHARED
from khal_runtime.launch_attributes import MAX_PORTABLE_CLUSTER as MAX_PORTABLE_CLUSTER

__all__ = [
    "ABI_VERSION",
    "FALSE_VALUES",
    "TRUE_VALUES",
    "env_flag",
    "HASH_LEN",
    "KINDS",
    "READERS",
    "ReaderTable",
    "ReaderTableError",
    "MAX_BLOCK_THREADS",
    "SCALARS",
    "Arch",
    "Marker",
    "ParamKind",
    "Reader",
    "ScalarType",
    "Slot",
    "c_scalar",
    "describe_type_id",
    "entry_hash",
    "entry_signature",
    "indirect_symbol_for",
    "kind",
    "markers",
    "parse_arch",
    "probe_names",
    "reader",
    "prebuilt_env_var",
    "scalar",
    "integral",
    "scalar_value",
    "split_symbol",
    "symbol_for",
    "type_id",
    "type_id_scalar",
    "unknown_reader",
]

#: The values of a boolean ``KHAL_*`` environment variable, compared stripped and case-insensitively:
#: unset and these mean "off", :data:`TRUE_VALUES` mean "on", anything else is an
#: :class:`~khal_runtime.errors.EnvVarError` naming the accepted spellings (a typo such as
#: ``KHAL_SKIP_SPIRV=flase`` would otherwise turn the switch on). One rule for the build
#: (``KHAL_NO_CACHE``, ``KHAL_SKIP_SPIRV``) and the runtime (``KHAL_CUDA_ALLOC_TRACE``, the trace
#: switches, ``KHAL_EAGER_INIT``).
FALSE_VALUES = ("", "0", "false", "no", "off")
TRUE_VALUES = ("1", "true", "yes", "on")


def env_flag(value: str | None, name: str = "a boolean KHAL_* variable", extra: tuple[str, ...] = ()) -> bool:
    """Whether a boolean variable's value (``os.environ.get(name)``) means on: ``None``, ``""``, ``0``,
    ``false``, ``no``, ``off`` are off, ``1``, ``true``, ``yes``, ``on`` (and ``extra``, values of
    the variable's own that mean on) are on, in any case with blanks around; any other value
    raises :class:`~khal_runtime.errors.EnvVarError` naming ``name`` and the accepted spellings."""
    v = (value or "").strip().lower()
    if v in FALSE_VALUES:
        return False
    if v in TRUE_VALUES or v in extra:
        return True
    on = "/".join(TRUE_VALUES[:1] + extra + TRUE_VALUES[1:])
    raise EnvVarError(f"{name}={value!r} is not understood: use {on} (on) or 0/false/no/off "
                      f"(off; unset or empty is off too)", variable=name, value=value or "")


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


def integral(obj: Any) -> Any:
    """An integral scalar of another type than ``int`` (a NumPy integer, an ``IntEnum``, a 0-d
    integer tensor: anything with ``__index__``) as the int it stands for; anything else (an int,
    a bool, a float, a string) as it is, for the caller's own check to take or refuse. What a
    check of a value (Triton's ``:16`` / ``:1`` assumptions, an autotune key) reads, so that
    ``np.int64(1024)`` meets what ``1024`` meets."""
    if type(obj) is int or isinstance(obj, (float, str, bytes)) or _is_bool(obj):
        return obj
    try:
        return operator.index(obj)
    except TypeError:
        return obj


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
class Reader:
    """How the host reads one kind of argument and what the kernel receives for it: a closed set
    the launch paths implement once each (:data:`READERS`). Each path registers one
    implementation per reader in a :class:`ReaderTable`, checked when its module is imported;
    everything else about a reader is data here, so a new :class:`ParamKind` that reuses a reader
    is one entry in :data:`KINDS`.
    """

    #: ``"array"`` (a device array: pointer, element count, element type), ``"struct"`` (a small
    #: struct: host bytes or a device pointer) or ``"value"`` (a number passed by value)
    name: str
    #: a binding read this way may be written by the kernel (when its element type is not const)
    writable: bool
    #: the kernel receives a pointer (a ``__restrict__`` the author wrote applies to it)
    by_pointer: bool
    #: the CUDA C++ kernel parameters of one binding, one per slot; ``{t}`` is the entry
    #: function's parameter type, ``{p}`` the binding's name prefix, ``{restrict}`` is
    #: `` __restrict`` when the author wrote ``__restrict__``
    cuda_params: tuple[str, ...]
    #: the WGSL / SPIR-V binding of one parameter: ``"storage"`` (read-only or read-write by
    #: its writability), ``"uniform"``, or None: packed into the entry's scalar block
    binding: str | None
    #: the Python type a stub and a torch schema give the argument; None: the scalar's own type
    py_type: str | None
    #: appended to the parameter's description in a stub's docstring
    stub_note: str = ""
    #: a manifest parameter read this way may carry its struct's layout per target
    #: (``Param.layouts``: a uniform's, packed from a dict)
    struct_layouts: bool = False

    def access(self, writable: bool) -> Literal["read", "read_write", "uniform"] | None:
        """A WebGPU binding's access (``"read"``, ``"read_write"``, ``"uniform"``), None for a
        parameter packed into the scalar block."""
        if self.binding == "storage":
            return "read_write" if writable else "read"
        if self.binding == "uniform":
            return "uniform"
        if self.binding is None:
            return None
        raise ValueError(f"reader {self.name!r} has binding {self.binding!r}; WebGPU has storage and uniform")


READERS: dict[str, Reader] = {
    r.name: r
    for r in (
        Reader("array", True, True, ("::khal::element_t<{t}>*{restrict} {p}_ptr", "unsigned long long {p}_len"),
               "storage", "DeviceArray"),
        Reader("struct", False, True, ("const ::khal::value_t<{t}>* {p}_ptr",), "uniform", "Uniform",
               struct_layouts=True),
        Reader("value", False, False, ("::khal::value_t<{t}> {p}",), None, None, " (by value)"),
    )
}


def reader(name: str) -> Reader:
    """The reader called ``name``; ValueError naming the known ones otherwise."""
    try:
        return READERS[name]
    except KeyError:
        raise ValueError(f"unknown parameter reader {name!r}; the launch paths implement "
                         f"{', '.join(READERS)}") from None


_T = TypeVar("_T")


class ReaderTableError(ValueError):
    """A path's :class:`ReaderTable` does not implement exactly the declared :data:`READERS`:
    raised where the table is made (the import of its module), never at a launch."""


class ReaderTable(Generic[_T]):
    """One path's implementation per reader (reader name -> function or strategy object), checked
    when it is made against :data:`READERS`, as a plugin's hooks are checked against their specs:
    a reader declared without an implementation here is a :class:`ReaderTableError` naming the
    path and the reader. Paths look up once per entry or plan (:meth:`of`), never per launch."""

    def __init__(self, where: str, impls: Mapping[str, _T]) -> None:
        missing = [r for r in READERS if r not in impls]
        extra = [r for r in impls if r not in READERS]
        if missing or extra:
            raise ReaderTableError(
                f"{where}: its reader table " + "; ".join(
                    ([f"implements no {', '.join(map(repr, missing))}"] if missing else [])
                    + ([f"implements {', '.join(map(repr, extra))}, which abi.READERS does not declare"]
                       if extra else []))
                + f" (abi.READERS declares {', '.join(READERS)})")
        self.where = where
        self.impls: dict[str, _T] = dict(impls)

    def __getitem__(self, reader_name: str) -> _T:
        return self.impls[reader_name]

    def of(self, kind_name: str, where: str | None = None) -> _T:
        """The implementation for kind ``kind_name``'s reader (ValueError for an unknown kind;
        :func:`unknown_reader`'s error for a reader this table lacks, e.g. a kind changed since)."""
        k = KINDS.get(kind_name) or kind(kind_name)  # (inline: first-call frame budget)
        impl = self.impls.get(k.reader)
        if impl is None:
            raise unknown_reader(kind_name, k.reader, where or self.where)
        return impl

    def get(self, reader_name: str, kind_name: str, where: str | None = None) -> _T:
        """The implementation of reader ``reader_name`` (of kind ``kind_name``, for the error)."""
        impl = self.impls.get(reader_name)
        if impl is None:
            raise unknown_reader(kind_name, reader_name, where or self.where)
        return impl


def unknown_reader(kind_name: str, reader_name: str, where: str) -> ValueError:
    """The error a branch on readers raises for one it does not implement (never a scalar by
    default)."""
    return ValueError(f"{where}: parameter kind {kind_name!r} has reader {reader_name!r}, which this "
                      f"path does not implement (it implements {', '.join(READERS)})")


@dataclass(frozen=True)
class Marker:
    """How a CUDA C++ author declares a parameter of a kind: ``KHAL_STORAGE_ARRAY(T, N, name)``.

    The hook's scanner reads the markers (:mod:`hatch_khal.entries`) and the generated
    translation unit defines them (:mod:`hatch_khal.codegen`) from this table;
    ``include/khal.h`` repeats them for editors and for compiles outside the hook (a test
    checks they agree)."""

    macro: str
    #: the manifest ``shape`` a parameter declared so has
    shape: str | None
    #: the C++ declaration in the entry function the marker expands to, over its arguments
    #: ``T``, ``name`` and, if ``sized``, ``N``
    declares: str
    #: the argument the generated kernel passes to the entry function, from its slots
    #: (``{t}``: the entry function's parameter type, ``{p}``: the slots' name prefix)
    passes: str
    #: the marker takes a length ``N`` before the name (``KHAL_STORAGE_ARRAY(T, N, name)``)
    sized: bool = False
    #: the fixed length a parameter declared so has (``KHAL_STORAGE_VALUE``: 1)
    length: int | None = None

    @property
    def args(self) -> tuple[str, ...]:
        """The macro's arguments, in order."""
        return ("T", "N", "name") if self.sized else ("T", "name")

    def define(self) -> str:
        """``#define KHAL_SCALAR(T, name) T name``: the C preprocessor definition."""
        return f"#define {self.macro}({', '.join(self.args)}) {self.declares}"

    def call_arg(self, param_type: str, prefix: str) -> str:
        """The argument passed to the entry function (placeholders filled without
        ``str.format``, so the templates spell C++ braces plainly)."""
        return self.passes.replace("{t}", param_type).replace("{p}", prefix)


@dataclass(frozen=True)
class ParamKind:
    """How one kind of binding travels from host to kernel: the manifest's ``kind``.

    ``reader`` names its :class:`Reader` (:data:`READERS`), the host-side mechanism the launch
    paths implement; ``markers`` are how a CUDA C++ author writes one (none: not written in
    CUDA C++, only reflected from another language)."""

    name: str
    reader: str
    #: the manifest's ``shape`` values this kind takes (None: it has none)
    shapes: tuple[str | None, ...]
    markers: tuple[Marker, ...] = ()

    @property
    def strategy(self) -> Reader:
        """The :class:`Reader` of this kind; ValueError if ``reader`` names none."""
        r = READERS.get(self.reader)
        if r is None:
            raise unknown_reader(self.name, self.reader, "the ABI table")
        return r

    def marker(self, shape: str | None) -> Marker:
        """The marker declaring a parameter of this kind and ``shape``; ValueError if none."""
        for m in self.markers:
            if m.shape == shape:
                return m
        raise ValueError(f"no CUDA C++ marker declares a {self.name} parameter of shape {shape!r}")

    def cuda_params(self, param_type: str, prefix: str, restrict: bool) -> list[str]:
        """The CUDA C++ kernel parameters of one binding (:attr:`Reader.cuda_params`)."""
        r = " __restrict" if restrict else ""
        return [t.replace("{t}", param_type).replace("{p}", prefix).replace("{restrict}", r)
                for t in self.strategy.cuda_params]

    def slots(self, element_type: str, element_size: int, element_align: int) -> tuple[Slot, ...]:
        """The kernel parameters one binding of this kind takes, in order."""
        fixed = _SLOTS.impls.get(self.reader)  # (no calls: it runs per parameter on a first call)
        if fixed is None:
            raise unknown_reader(self.name, self.reader, "kernel slots")
        if fixed:
            return fixed
        t = SCALARS.get(element_type)
        if t is None:
            raise ValueError(f"scalar parameter of type {element_type!r}: not a scalar type of the ABI "
                             f"({', '.join(SCALARS)})")
        return (Slot("value", t.size, max(element_align, t.align), t.code),)

    def describe(self, element_type: str, element_size: int, shape: str | None = None,
                 length: int | None = None, writable: bool = False) -> str:
        """``storage float32``, ``storage Particle[4] rw``, ``uniform Params (16 bytes)``, ..."""
        how = _DESCRIBE.get(self.reader, self.name, "parameter description")
        return f"{self.name} {element_type}{how(element_size, shape, length, writable)}"

    def validate(self, element_type: str, element_size: int, shape: str | None,
                 length: int | None, writable: bool) -> None:
        """Raise ValueError if a manifest parameter of this kind is inconsistent."""
        r = self.strategy
        if shape not in self.shapes:
            raise ValueError(f"a {self.name} parameter has no shape {shape!r}")
        _VALIDATE[r.name](self.name, element_type, shape, length)
        if writable and not r.writable:
            raise ValueError(f"a {self.name} parameter cannot be writable")
        t = SCALARS.get(element_type)
        if t is not None and element_size != t.size:
            raise ValueError(f"element type {element_type} is {t.size} bytes, not {element_size}")


#: the kernel parameters of one binding per reader; empty: one slot, the scalar passed by value
_SLOTS: ReaderTable[tuple[Slot, ...]] = ReaderTable("abi.ParamKind.slots", {
    "array": (Slot("pointer", 8, 8, "Q"), Slot("count", 8, 8, "Q")),
    "struct": (Slot("pointer", 8, 8, "Q"),),
    "value": (),
})

#: what follows ``<kind> <element type>`` in a description, from (size, shape, length, writable)
_DESCRIBE: ReaderTable[Callable[[int, str | None, int | None, bool], str]] = ReaderTable(
    "abi.ParamKind.describe", {
    "array": lambda size, shape, length, w: ((f"[{length}]" if shape == "array" and length else "")
                                             + (" (one value)" if shape == "value" else "")
                                             + (" rw" if w else "")),
    "struct": lambda size, shape, length, w: f" ({size} bytes)",
    "value": lambda size, shape, length, w: "",
})


def _validate_array(kind_name: str, element_type: str, shape: str | None, length: int | None) -> None:
    if (shape == "array") != (length is not None) and not (shape == "value" and length == 1):
        raise ValueError(f"a {kind_name} of shape {shape!r} has length {length!r}")


def _validate_struct(kind_name: str, element_type: str, shape: str | None, length: int | None) -> None:
    if length is not None:
        raise ValueError(f"a {kind_name} parameter has no length")


def _validate_value(kind_name: str, element_type: str, shape: str | None, length: int | None) -> None:
    _validate_struct(kind_name, element_type, shape, length)
    if element_type not in SCALARS:
        raise ValueError(f"scalar type {element_type!r} is not one of the ABI's ({', '.join(SCALARS)})")


#: the reader's own checks of a manifest parameter (its length; a scalar type for a value)
_VALIDATE: ReaderTable[Callable[[str, str, str | None, int | None], None]] = ReaderTable(
    "abi.ParamKind.validate", {
    "array": _validate_array, "struct": _validate_struct, "value": _validate_value})


KINDS: dict[str, ParamKind] = {
    k.name: k
    for k in (
        ParamKind("storage", "array", ("slice", "array", "value", None), (
            Marker("KHAL_STORAGE", "slice", "::khal::Storage<T> name", "{t}{{p}_ptr, {p}_len}"),
            Marker("KHAL_STORAGE_ARRAY", "array", "T (&name)[N]", "::khal::array_ref<{t}>::from({p}_ptr)",
                   sized=True),
            Marker("KHAL_STORAGE_VALUE", "value", "T& name", "*{p}_ptr", length=1),
        )),
        ParamKind("uniform", "struct", (None,), (Marker("KHAL_UNIFORM", None, "const T& name", "*{p}_ptr"),)),
        ParamKind("scalar", "value", (None,), (Marker("KHAL_SCALAR", None, "T name", "{p}"),)),
    )
}


def kind(name: str) -> ParamKind:
    """The parameter kind called ``name``; ValueError naming the known ones otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown parameter kind {name!r}; the ABI has {', '.join(KINDS)}") from None


def markers() -> dict[str, tuple[ParamKind, Marker]]:
    """Every CUDA C++ parameter marker of :data:`KINDS`, by macro name."""
    return {m.macro: (k, m) for k in KINDS.values() for m in k.markers}


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


#: matched whole (fullmatch: a "$" accepts a trailing newline); no leading zero ("sm_090" is no arch)
_ARCH_RE = re.compile(r"(sm|compute)_([1-9]\d{1,2})([af]?)")


def parse_arch(arch: str, kinds: Iterable[str] = ("sm", "compute")) -> Arch:
    """Parse an arch string; ValueError saying what an arch looks like otherwise."""
    m = _ARCH_RE.fullmatch(arch) if isinstance(arch, str) else None
    if m is None or m.group(1) not in kinds:
        like = " or ".join({"sm": "'sm_90'", "compute": "'compute_75'"}[k] for k in kinds)
        raise ValueError(f"{arch!r} is not an arch like {like}")
    digits = m.group(2)
    return Arch(m.group(1), int(digits[:-1]), int(digits[-1]), m.group(3))


# ---------------------------------------------------------------------------------------------
# symbols and hashes
# ---------------------------------------------------------------------------------------------
_SYMBOL_RE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*?)_khal_(?P<hash>[0-9a-f]{16})")  # fullmatch


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
    m = _SYMBOL_RE.fullmatch(symbol)
    return (m.group("name"), m.group("hash")) if m else None


#: the prefix of khal-builder's variables naming a crate's prebuilt binary
PREBUILT_ENV_PREFIX = "CUDA_OXIDE_SHADERS_PTX_"


def prebuilt_env_var(crate: str) -> str:
    """``CUDA_OXIDE_SHADERS_PTX_<CRATE>``: khal-builder's name for a crate's prebuilt binary
    (upper-cased, ``-`` to ``_``)."""
    return PREBUILT_ENV_PREFIX + crate.upper().replace("-", "_")


def attributes_signature(attributes: Any) -> dict[str, Any]:
    """The launch attributes (a manifest ``LaunchAttributes``, a mapping or None) that differ from
    their defaults, as the entry hash sees them (empty: hashed as no attributes at all): one row
    each, :data:`khal_runtime.launch_attributes.ATTRIBUTES`."""
    return launch_attributes.signature(attributes)


def _getter(p: Any) -> Callable[[str], Any]:
    def get(key: str) -> Any:
        return getattr(p, key, None)
    return get


def _field(p: Any, key: str) -> Any:
    # (collections.abc's Mapping: ``isinstance`` against typing's alias costs microseconds, and a
    # manifest's load reads a field of every parameter of every entry)
    return p.get(key) if type(p) is dict or isinstance(p, _abc.Mapping) else getattr(p, key, None)


def _layout(layout: Any) -> dict[str, Any]:
    """A struct layout (a manifest ``StructLayout`` or its JSON) as the hash sees it: every
    field's name, type, offset, size, shape, strides and nested fields, defaults spelled out, so
    a model and its JSON hash alike."""

    def fields(fs: Any) -> list[dict[str, Any]]:
        out = []
        for f in fs or ():
            d = {"name": _field(f, "name"), "type": _field(f, "type"), "offset": int(_field(f, "offset")),
                 "size": int(_field(f, "size")), "shape": [int(n) for n in _field(f, "shape") or ()],
                 "strides": [int(n) for n in _field(f, "strides") or ()]}
            if _field(f, "fields") is not None:
                d["fields"] = fields(_field(f, "fields"))
            out.append(d)
        return out

    return {"size": int(_field(layout, "size")), "fields": fields(_field(layout, "fields"))}


def entry_signature(name: str, block_size: Iterable[int], params: Iterable[Mapping[str, Any] | Any], *,
                    grid_dims: int = 1, fixed_block: bool = True, launch_bounds: int | None = None,
                    template: str | None = None, template_args: Iterable[str] = (),
                    layouts: bool = True, attributes: Any = None,
                    triton: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What of an entry its hash covers besides the crate's content: the name, the block size
    and, per parameter, what the manifest records of it (name, kind, element type, shape,
    length, writability). Computable from a manifest alone, so that a loader can check that
    a manifest agrees with itself. ``params`` are manifest ``Param`` objects or mappings.

    A parameter with a ``ctype`` (CUDA C++ entries: the type as the marker spells it) is hashed
    by that spelling instead of its element type: the element type is what the compiler made of
    the spelling, known only once the binary (whose symbols carry the hash) exists; the build
    and the loader check it against the binary's own type probes instead. The launch shape
    (``grid_dims``, a block that is not fixed, its launch bounds) and a template instantiation
    are hashed when they differ from the defaults, so entries without them hash as before; so are
    the launch attributes (:mod:`khal_runtime.launch_attributes`).

    A uniform's CUDA struct layout (``layouts["cuda"]``, Slang crates: how the host packs a dict or
    reads a C struct's bytes on every backend) is hashed too (Slang reflects it before the entry
    is named); ``layouts=False`` gives the signature without it, which entries built before
    hatch-khal hashed it have (:func:`khal_runtime.verify.check_manifest` accepts either). The
    WebGPU layouts are known only after the entry point is named with the hash: the runtime
    re-derives those from the WGSL / SPIR-V instead (:mod:`khal_runtime.shaders`). ``triton``: a Triton instance's record
    (:class:`khal_runtime.manifest.TritonFacts`), hashed whole."""
    out_params = []
    for p in params:
        # (one type test per parameter, not per field)
        field: Callable[[str], Any] = p.get if type(p) is dict or isinstance(p, _abc.Mapping) else _getter(p)
        d = {k: field(k) for k in ("name", "kind", "element_type", "shape", "length", "writable")}
        ctype = field("ctype")
        if ctype is not None:
            del d["element_type"]
            d["ctype"] = ctype
        cuda = (field("layouts") or {}).get("cuda") if layouts else None
        if cuda is not None:
            d["cuda_layout"] = _layout(cuda)
        out_params.append(d)
    sig: dict[str, Any] = {"name": name, "block_size": [int(b) for b in block_size], "params": out_params}
    if grid_dims != 1:
        sig["grid_dims"] = int(grid_dims)
    if not fixed_block:
        sig["fixed_block"] = False
        sig["launch_bounds"] = launch_bounds
    if template is not None:
        sig["template"] = [template, list(template_args)]
    attrs = attributes_signature(attributes)
    if attrs:  # launch attributes (launch_attributes.ATTRIBUTES): only those that are not defaults
        sig["attributes"] = attrs
    if triton is not None:  # a Triton instance: its kernel, specialisations and compile facts
        sig["triton"] = dict(triton)
    return sig


def canonical(obj: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces): what every hash of the project is over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def entry_hash(content_hash: str, signature: Mapping[str, Any]) -> str:
    """16 hex digits: changes with the entry's signature or any input of its crate."""
    return hashlib.sha256(canonical({"crate": content_hash, "entry": dict(signature)})).hexdigest()[:HASH_LEN]
