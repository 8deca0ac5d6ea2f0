"""Argument packing by layout: uniform structs per target (CUDA, WGSL, SPIR-V), and loose scalars.
Pure Python (``struct``), no GPU: every rule here is unit-tested without an adapter.

Uniform structs. A user passes what the CUDA path takes, the struct in its C layout
(``Param.layouts["cuda"]``): a ctypes Structure, a NumPy structured scalar or 0-d array, or
``bytes`` of exactly the C size; or, on every backend, a ``dict`` of field names (nested dicts
for nested structs; lists, tuples or NumPy arrays for vectors and arrays). WGSL and SPIR-V lay
the same struct out differently (``{float a; float3 v; float arr[2]; uint n;}`` is 28 bytes
in C and 80 in std140), so both layouts are flattened into leaves (path, scalar type, offset)
and the bytes are moved leaf by leaf: :class:`Repacker` (C bytes -> target bytes, one
``struct`` unpack and one pack, bit-exact), :func:`pack_dict` (a dict -> any layout; each value
converted by :func:`khal_runtime.abi.scalar_value`, the one rule set of every launch path) and
:func:`pack_cuda` (a dict -> the C layout, for the CUDA side).

Loose scalars go into the target's scalar block (``WebGpuTarget.scalar_slots``): a uniform
buffer (WGSL) or push constants (SPIR-V): :class:`ScalarPacker`.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

from khal_runtime import abi
from khal_runtime.errors import ArgumentError, ArgumentValueError, KhalError
from khal_runtime.generated import define

if TYPE_CHECKING:
    from khal_runtime.manifest import Param, StructField, StructLayout, WebGpuTarget

__all__ = [
    "Leaf",
    "Repacker",
    "ScalarPacker",
    "UniformPacker",
    "host_struct_bytes",
    "leaves",
    "pack_cuda",
    "pack_dict",
]

_UINT = {1: "B", 2: "H", 4: "I", 8: "Q"}
_SINT = {1: "b", 2: "h", 4: "i", 8: "q"}
#: memoised C bytes -> target bytes per packer, emptied when it reaches this many entries
_MEMO_MAX = 1024


class Leaf(NamedTuple):
    """One scalar of a struct in one layout: ``path`` (``"v[2]"``, ``"inner.arr[1][0]"``),
    its scalar type, byte offset from the start of the struct and byte width in this layout
    (the scalar's size; a ``bool`` may take 4 bytes in WGSL / SPIR-V)."""

    path: str
    type: str
    offset: int
    width: int


def _width(f: StructField) -> int:
    t = abi.SCALARS[f.type]
    if f.type != "bool":
        return t.size
    inner = f.strides[-1] if f.strides else f.size
    return min(max(inner, 1), 4) if f.strides else min(f.size, 4)


def _indices(shape: tuple[int, ...]) -> Any:
    return itertools.product(*(range(n) for n in shape))


def _flatten(fields: Sequence[StructField], base: int, prefix: str, out: list[Leaf]) -> None:
    for f in fields:
        name = f"{prefix}{f.name}"
        for idx in _indices(f.shape):
            off = base + f.offset + sum(i * s for i, s in zip(idx, f.strides))
            path = name + "".join(f"[{i}]" for i in idx)
            if f.type == "struct":
                _flatten(f.fields or (), off, path + ".", out)
            else:
                out.append(Leaf(path, f.type, off, _width(f)))


def leaves(layout: StructLayout) -> tuple[Leaf, ...]:
    """Every scalar of ``layout``, in declaration order."""
    out: list[Leaf] = []
    _flatten(layout.fields, 0, "", out)
    return tuple(out)


def _format(items: Sequence[tuple[int, str, int]], size: int) -> str:
    """A little-endian ``struct`` format placing each (offset, code, width) (sorted by offset)
    in ``size`` bytes, zero padding between and after."""
    fmt = ["<"]
    pos = 0
    for off, code, width in items:
        if off < pos:
            raise KhalError(f"struct layout has overlapping fields at byte {off}")
        if off > pos:
            fmt.append(f"{off - pos}x")
        fmt.append(code)
        pos = off + width
    if pos > size:
        raise KhalError(f"struct layout has a field past its {size} bytes")
    if size > pos:
        fmt.append(f"{size - pos}x")
    return "".join(fmt)


class Repacker:
    """Moves a struct's bytes from one layout to another, leaf by leaf, bit-exact (each
    leaf is moved as an unsigned integer of its width: NaN payloads and -0.0 survive)."""

    def __init__(self, src: StructLayout, dst: StructLayout, what: str = "struct") -> None:
        self.src, self.dst = src, dst
        self.identity = src == dst
        a, b = leaves(src), leaves(dst)
        pa, pb = [x.path for x in a], [x.path for x in b]
        if sorted(pa) != sorted(pb):
            missing = sorted(set(pa) ^ set(pb))
            raise KhalError(f"{what}: its layouts do not hold the same fields ({missing[:6]}); "
                            "the manifest is inconsistent, rebuild the package")
        by = {x.path: x for x in b}
        for x in a:
            y = by[x.path]
            if x.type != y.type or y.width < x.width and x.type != "bool":
                raise KhalError(f"{what}: field {x.path!r} is {x.type} ({x.width} bytes) in one layout "
                                f"and {y.type} ({y.width} bytes) in the other; rebuild the package")
        sa = sorted(a, key=lambda x: x.offset)
        sb = sorted(b, key=lambda x: x.offset)
        self._unpack = struct.Struct(_format([(x.offset, _UINT[x.width], x.width) for x in sa], src.size)).unpack
        self._pack = struct.Struct(_format([(x.offset, _UINT[x.width], x.width) for x in sb], dst.size)).pack
        pos = {x.path: i for i, x in enumerate(sa)}
        perm = [pos[y.path] for y in sb]
        self._perm: Callable[[tuple[int, ...]], Any] | None = None
        if perm != list(range(len(perm))):
            self._perm = lambda t, p=tuple(perm): tuple(t[i] for i in p)
        self.src_size, self.dst_size = src.size, dst.size

    def convert(self, data: bytes) -> bytes:
        """``data`` (``src.size`` bytes, in the source layout) in the destination layout."""
        if self.identity:
            return data
        vals = self._unpack(data)
        if self._perm is not None:
            vals = self._perm(vals)
        return self._pack(*vals)


# ---------------------------------------------------------------------------------------------
# dicts
# ---------------------------------------------------------------------------------------------
def _code(type_name: str, width: int) -> str:
    t = abi.SCALARS[type_name]
    if type_name == "bool":
        return _UINT[width]
    if width == t.size:
        return t.code
    raise KhalError(f"a {type_name} field of {width} bytes cannot be packed")


def _seq(v: Any) -> list[Any] | None:
    """A vector/array value as a list (lists, tuples, NumPy arrays), else None."""
    if isinstance(v, (list, tuple)):
        return list(v)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.ndarray) and v.ndim >= 1:
        return list(v)
    return None


def _check_keys(d: Mapping[str, Any], fields: Sequence[StructField], where: str, path: str) -> None:
    names = [f.name for f in fields]
    unknown = [k for k in d if k not in names]
    if unknown:
        raise ArgumentError(f"{where}: unknown field(s) {', '.join(repr(path + str(k)) for k in unknown)}; "
                            f"the struct has {', '.join(repr(path + n) for n in names)}")
    missing = [n for n in names if n not in d]
    if missing:
        raise ArgumentError(f"{where}: missing field(s) {', '.join(repr(path + n) for n in missing)}; "
                            "a dict must give every field of the struct")


def _pack_fields(buf: bytearray, fields: Sequence[StructField], d: Any, base: int, where: str,
                 prefix: str) -> None:
    if not isinstance(d, Mapping):
        raise ArgumentError(f"{where}: field {prefix.rstrip('.')!r} is a struct: expected a dict, "
                            f"got {type(d).__name__}")
    _check_keys(d, fields, where, prefix)
    for f in fields:
        _pack_value(buf, f, d[f.name], base + f.offset, (), where, prefix + f.name)


def _pack_value(buf: bytearray, f: StructField, v: Any, off: int, idx: tuple[int, ...], where: str,
                path: str) -> None:
    depth = len(idx)
    if depth < len(f.shape):
        items = _seq(v)
        n = f.shape[depth]
        if items is None or len(items) != n:
            want = "x".join(str(s) for s in f.shape[depth:])
            got = f"{len(items)} item(s)" if items is not None else type(v).__name__
            raise ArgumentValueError(f"{where}: field {path!r} ({f.type}[{want}]) expects {n} item(s) "
                                     f"along this axis, got {got}")
        for i, item in enumerate(items):
            _pack_value(buf, f, item, off + i * f.strides[depth], idx + (i,), where, f"{path}[{i}]")
        return
    if f.type == "struct":
        _pack_fields(buf, f.fields or (), v, off, where, path + ".")
        return
    if isinstance(v, Mapping) or _seq(v) is not None:
        raise ArgumentValueError(f"{where}: field {path!r} is one {f.type}, got {type(v).__name__}")
    try:
        x = abi.scalar_value(f.type, v)
    except TypeError as exc:
        raise ArgumentError(f"{where}: field {path!r} ({f.type}): {exc}") from None
    except ValueError as exc:
        raise ArgumentValueError(f"{where}: field {path!r} ({f.type}): {exc}") from None
    width = _width(f)
    code = _code(f.type, width)
    if f.type == "complex64" or f.type == "complex128":
        struct.pack_into("<" + code, buf, off, *x)
    else:
        struct.pack_into("<" + code, buf, off, int(x) if f.type == "bool" else x)


def pack_dict(layout: StructLayout, d: Any, where: str = "uniform") -> bytes:
    """A dict of field values packed into ``layout`` (padding zeroed). ``where`` begins every
    error message (``"saxpy(): argument 'params' (uniform Params)"``)."""
    buf = bytearray(layout.size)
    _pack_fields(buf, layout.fields, d, 0, where, "")
    return bytes(buf)


def pack_cuda(layout: StructLayout, d: Mapping[str, Any], where: str = "uniform") -> bytes:
    """A dict packed into the struct's CUDA C layout (``Param.layouts["cuda"]``): what the
    CUDA launch path can pass for a uniform given as a dict."""
    return pack_dict(layout, d, where)


# ---------------------------------------------------------------------------------------------
# host structs
# ---------------------------------------------------------------------------------------------
def host_struct_bytes(obj: Any, size: int, where: str) -> bytes:
    """The bytes of a host struct in its C layout: a ctypes Structure / Union / Array, a NumPy
    structured scalar or one-element array, or bytes-like of exactly ``size`` bytes."""
    tp = type(obj)
    if tp is bytes:
        data = obj
    elif isinstance(obj, (bytearray, memoryview)):
        data = bytes(obj)
    elif isinstance(obj, (ctypes.Structure, ctypes.Union, ctypes.Array)):
        data = bytes(obj)
    else:
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, (np.generic, np.ndarray)):
            if getattr(obj, "ndim", 0) and obj.size != 1:
                raise ArgumentError(f"{where}: a NumPy array of {obj.size} elements; a uniform is one struct")
            data = obj.tobytes()
        else:
            raise ArgumentError(
                f"{where}: expected the struct as a dict of its fields, a ctypes Structure, a NumPy "
                f"structured scalar, or bytes of its C layout; got {tp.__module__}.{tp.__qualname__}")
    if len(data) != size:
        raise ArgumentValueError(f"{where}: expected {size} bytes (the struct's C layout), got "
                                 f"{len(data)} ({tp.__name__})")
    return bytes(data)


class UniformPacker:
    """Turns a uniform argument into its bytes in one WebGPU target's layout."""

    def __init__(self, entry: str, param: Param, target: str) -> None:
        self.where = f"{entry}(): argument {param.name!r} (uniform {param.element_type})"
        layouts = param.layouts or {}
        dst = layouts.get(target)  # type: ignore[call-overload]
        if dst is None:
            raise KhalError(f"{self.where}: the manifest has no {target} layout of the struct; "
                            "rebuild the package with a hatch-khal that records it")
        self.layout: StructLayout = dst
        src = layouts.get("cuda")
        self.c_size = src.size if src is not None else dst.size
        self.repacker = Repacker(src, dst, self.where) if src is not None else None
        self._memo: dict[bytes, bytes] = {}

    @property
    def size(self) -> int:
        return self.layout.size

    def pack(self, obj: Any) -> bytes:
        """``obj`` (dict, ctypes, NumPy or C bytes) in the target layout."""
        if isinstance(obj, Mapping):
            return pack_dict(self.layout, obj, self.where)
        data = host_struct_bytes(obj, self.c_size, self.where)
        memo = self._memo
        out = memo.get(data)
        if out is None:
            out = self.repacker.convert(data) if self.repacker is not None else data
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            memo[data] = out
        return out


# ---------------------------------------------------------------------------------------------
# loose scalars
# ---------------------------------------------------------------------------------------------
_FAST: dict[str, tuple[type, ...]] = {"int": (int,), "uint": (int,), "float": (float, int)}


class ScalarPacker:
    """Packs an entry's loose scalar arguments into a target's scalar block
    (``target.scalar_block_size`` bytes, each at its ``ScalarSlot`` offset).

    ``pack(values)`` takes the values of the entry's scalar parameters in declaration order;
    a scalar the target dropped (unused by the shader) is checked and not packed."""

    def __init__(self, entry: str, params: Sequence[Param], target: WebGpuTarget, size: int | None = None) -> None:
        self.entry = entry
        # the parameters WebGPU binds nothing for (abi.Reader.binding None): the scalar block's
        self.params = tuple(p for p in params if abi.kind(p.kind).strategy.binding is None)
        slots = {s.param: s for s in target.scalar_slots}
        self.size = target.scalar_block_size if size is None else size
        items: list[tuple[int, str, int]] = []
        self._plan: list[tuple[Param, bool, tuple[type, ...] | None]] = []
        for p in self.params:
            s = slots.get(p.name)
            t = abi.SCALARS[p.element_type]
            fast = _FAST.get(t.family) if p.element_type not in ("bfloat16",) else None
            if s is None:
                self._plan.append((p, False, fast))
                continue
            if s.size == t.size:
                code = t.code
            elif t.family in ("bool", "uint") and s.size in _UINT and s.size > t.size:
                code = _UINT[s.size]
            elif t.family == "int" and s.size in _SINT and s.size > t.size:
                code = _SINT[s.size]
            else:
                raise KhalError(f"{entry}(): scalar {p.name!r} ({p.element_type}) has a {s.size}-byte "
                                f"slot in the {target.target} scalar block; rebuild the package")
            items.append((s.offset, code, s.size))
            self._plan.append((p, True, fast))
        order = sorted(range(len(items)), key=lambda i: items[i][0])
        fmt = _format([items[i] for i in order], self.size)
        self._struct = struct.Struct(fmt)
        self._order = order if order != list(range(len(order))) else None
        self._complex = any(abi.SCALARS[p.element_type].family == "complex" for p in self.params)
        self._fast_pack = self._make_fast()

    def _make_fast(self) -> Callable[[Sequence[Any]], bytes] | None:
        """``pack`` specialised for arguments of the plain Python types of their slots (an int
        for an integer, an int or float for a float), every slot packed: one type check per
        value and one ``struct`` call; anything else (or out of range) takes the general path."""
        if self._complex or not all(packed and fast for _p, packed, fast in self._plan):
            return None
        n = len(self._plan)
        names = [f"v{i}" for i in range(n)]
        checks = " and ".join(
            f"type(v{i}) is int" if fast == (int,) else f"(type(v{i}) is float or type(v{i}) is int)"
            for i, (_p, _packed, fast) in enumerate(self._plan)) or "True"
        order = self._order if self._order is not None else list(range(n))
        src = (f"def pack(values):\n"
               f"    {', '.join(names)}{',' if n == 1 else ''} = values\n"
               f"    if {checks}:\n"
               f"        try:\n"
               f"            return _pack({', '.join(names[i] for i in order)})\n"
               f"        except (_err, OverflowError):\n"
               f"            pass\n"
               f"    return _slow(values)\n") if n else "def pack(values):\n    return _slow(values)\n"
        ns: dict[str, Any] = {"_pack": self._struct.pack, "_err": struct.error, "_slow": self._pack_slow}
        return define(src, f"scalar packer {self.entry}", ns, "pack")  # type: ignore[no-any-return]

    def convert(self, p: Param, v: Any) -> Any:
        where = f"{self.entry}(): argument {p.name!r} (scalar {p.element_type})"
        try:
            x = abi.scalar_value(p.element_type, v)
        except TypeError as exc:
            raise ArgumentError(f"{where}: {exc}") from None
        except ValueError as exc:
            raise ArgumentValueError(f"{where}: {exc}") from None
        return int(x) if p.element_type == "bool" else x

    def pack(self, values: Sequence[Any]) -> bytes:
        """The scalar block of ``values`` (the entry's scalar arguments, in order)."""
        fast = self._fast_pack
        if fast is not None and len(values) == len(self._plan):
            return fast(values)
        return self._pack_slow(values)

    def _pack_slow(self, values: Sequence[Any]) -> bytes:
        out: list[Any] = []
        for (p, packed, fast), v in zip(self._plan, values):
            if not packed:
                self.convert(p, v)  # dropped by the shader: checked, not packed
            elif fast is None or type(v) not in fast:
                out.append(self.convert(p, v))
            else:
                out.append(v)
        if self._order is not None:
            out = [out[i] for i in self._order]
        if self._complex:
            out = [x for v in out for x in (v if isinstance(v, tuple) else (v,))]
        try:
            return self._struct.pack(*out)
        except (struct.error, OverflowError):
            # out of range for its slot (a fast-path int or float): say which, by the one rule set
            for (p, _packed, _fast), v in zip(self._plan, values):
                self.convert(p, v)
            raise
