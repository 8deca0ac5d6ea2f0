"""What a WGSL or SPIR-V module itself says about an entry's bindings and layouts.

The manifest's WebGPU facts (each parameter's group / binding / access, the loose scalars'
block and offsets, a uniform struct's field offsets per target, a storage element's size) come
from Slang's reflection of the per-entry compile, after the entry hash is fixed (the hash names
the entry point inside the very artifact), so the hash cannot cover them. The runtime re-derives
them from the artifact instead (:func:`read_shader`) and :mod:`khal_runtime.verify` compares.

Hand-written on purpose: no well-kept, installable Python library reads both WGSL layouts and
SPIR-V decorations without a GPU stack (naga and spirv-tools are native tools, not wheels the
runtime may depend on), and what is needed is small: module-scope resource variables, their
names, and the explicit (SPIR-V ``Offset`` / ``ArrayStride``) or rule-given (WGSL: sizes and
alignments of the spec, ``@align`` / ``@size``) layout of their types. Names follow Slang's
spelling: WGSL ``entryPointParams_<param>_<n>`` and struct members ``<name>_<n>``; SPIR-V
``entryPointParams.<param>`` and plain member names; the loose scalars' block is the variable
named ``entryPointParams`` alone. Parsers return a :class:`ShaderFacts` or raise
:class:`~khal_runtime.binaries.BinaryFormatError`, never anything else.

WGSL names are not the parameters' spellings: WGSL reserves identifiers with ``__``, so Slang's
emitter folds every run of underscores into one before it adds the ``_<n>`` that keeps names
apart (parameter ``x_`` is ``entryPointParams_x_0``; ``_x`` after it ``entryPointParams_x_1``;
``_`` is ``entryPointParams_<n>``, which reads as the loose scalars' block; member ``t__u`` is
``t_u_0``). A name read from WGSL is therefore only compared as :func:`wgsl_stem` of it, and a
variable is matched to its parameter by its ``@group`` / ``@binding``, which the build took from
Slang's reflection (:func:`khal_runtime.verify.webgpu_layout_problems`).
"""

from __future__ import annotations

import re
import struct
from typing import Iterator, NamedTuple

from khal_runtime.binaries import BinaryFormatError

__all__ = ["Leaf", "ShaderFacts", "ShaderVar", "read_shader", "read_spirv", "read_wgsl", "wgsl_stem"]


class Leaf(NamedTuple):
    """One scalar of a struct: its path (field names, and the indices of the arrays, vectors and
    matrix columns on the way: ``("arr", 1)``, ``("v", 2)``), its byte offset from the struct's
    start, its ABI scalar type."""

    path: tuple[str | int, ...]
    offset: int
    type: str

    @property
    def chain(self) -> tuple[str, ...]:
        """The field names of its path (what a rename would change)."""
        return tuple(x for x in self.path if isinstance(x, str))


class ShaderVar(NamedTuple):
    """One module-scope resource variable of an entry's shader."""

    #: the parameter it holds; None: the entry's block of loose scalars
    param: str | None
    #: None for push constants
    group: int | None
    binding: int | None
    #: "read", "read_write", "uniform" or "push_constants"
    access: str
    #: storage: the byte stride of its array's elements (None: not an array)
    stride: int | None = None
    #: uniform / scalar block: every scalar of its struct
    leaves: tuple[Leaf, ...] = ()
    #: uniform / scalar block: bytes its fields cover (the end of the last one)
    end: int = 0
    #: uniform / scalar block: its struct's size where the language defines one (WGSL's layout
    #: rules: the end rounded up to the struct's alignment); None in SPIR-V (no struct size there)
    size: int | None = None


class ShaderFacts(NamedTuple):
    """(NamedTuples, not dataclasses: a frozen dataclass costs milliseconds to define, and this
    module is imported on a WebGPU process's first launch)"""

    vars: tuple[ShaderVar, ...]

    def by_param(self) -> dict[str | None, ShaderVar]:
        return {v.param: v for v in self.vars}


def read_shader(data: bytes, kind: str, source: str = "shader") -> ShaderFacts:
    """The facts of a WGSL (text) or SPIR-V (binary) module."""
    if kind == "wgsl":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BinaryFormatError(f"{source}: WGSL that is not UTF-8 ({exc.reason})") from None
        return read_wgsl(text, source)
    if kind == "spirv":
        return read_spirv(data, source)
    raise BinaryFormatError(f"{source}: {kind!r} is not a WebGPU shader kind")


# ---------------------------------------------------------------------------------------------
# WGSL
# ---------------------------------------------------------------------------------------------
_WGSL_SCALARS = {"f32": ("float32", 4), "i32": ("int32", 4), "u32": ("uint32", 4), "f16": ("float16", 2),
                 "bool": ("bool", 4)}
_SUFFIX = re.compile(r"_\d+$")
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_ATTR = re.compile(r"@(\w+)\s*\(\s*([^)]*?)\s*\)")
_VAR = re.compile(r"((?:@\w+\s*\([^)]*\)\s*)+)var\s*<([^>]+)>\s*(\w+)\s*:\s*([^;]+);")
_STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{([^}]*)\}")
_MEMBER = re.compile(r"^((?:@\w+\s*\([^)]*\)\s*)*)(\w+)\s*:\s*(.+)$", re.S)
_INT = re.compile(r"^(?:[iu]32\()?\s*(\d+)[iu]?\s*\)?$")


def _split_top(body: str) -> list[str]:
    """``body`` split on the commas outside ``<...>`` and ``(...)``."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in body:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


class _WgslMember(NamedTuple):
    name: str
    offset: int
    type: str


class _Wgsl:
    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.text = _COMMENTS.sub("", text)
        self.structs: dict[str, tuple[list[_WgslMember], int, int]] = {}  # name -> members, size, align
        self._bodies = {m.group(1): m.group(2) for m in _STRUCT.finditer(self.text)}

    def error(self, what: str) -> BinaryFormatError:
        return BinaryFormatError(f"{self.source}: unreadable WGSL ({what})")

    def struct(self, name: str) -> tuple[list[_WgslMember], int, int]:
        got = self.structs.get(name)
        if got is not None:
            return got
        body = self._bodies.get(name)
        if body is None:
            raise self.error(f"type {name!r} is not a struct of the module")
        self.structs[name] = ([], 0, 1)  # a recursive struct reads as empty, never loops
        members: list[_WgslMember] = []
        end, align = 0, 1
        for raw in _split_top(body):
            m = _MEMBER.match(raw)
            if m is None:
                raise self.error(f"struct {name} member {raw!r}")
            attrs = dict(_ATTR.findall(m.group(1)))
            size, a = self.layout(m.group(3))
            a = int(attrs.get("align", a))
            size = int(attrs.get("size", size))
            if a < 1 or a & (a - 1):
                raise self.error(f"struct {name}: alignment {a}")
            offset = -(-end // a) * a
            members.append(_WgslMember(m.group(2), offset, m.group(3).strip()))
            end, align = offset + size, max(align, a)
        got = (members, -(-end // align) * align, align)
        self.structs[name] = got
        return got

    def _array(self, t: str) -> tuple[str, int | None] | None:
        m = re.fullmatch(r"array\s*<(.+)>", t, re.S)
        if m is None:
            return None
        parts = _split_top(m.group(1))
        if len(parts) == 1:
            return parts[0], None
        n = _INT.match(parts[1]) if len(parts) == 2 else None
        if n is None:
            raise self.error(f"array type {t!r}")
        return parts[0], int(n.group(1))

    def layout(self, t: str) -> tuple[int, int]:
        """(size, align) of a type by the WGSL spec's rules."""
        t = t.strip()
        if t in _WGSL_SCALARS:
            s = _WGSL_SCALARS[t][1]
            return s, s
        m = re.fullmatch(r"atomic\s*<\s*(\w+)\s*>", t)
        if m:
            return self.layout(m.group(1))
        m = re.fullmatch(r"vec([234])\s*<\s*(\w+)\s*>", t)
        if m:
            n, s = int(m.group(1)), self.layout(m.group(2))[0]
            return n * s, (2 if n == 2 else 4) * s
        m = re.fullmatch(r"mat([234])x([234])\s*<\s*(\w+)\s*>", t)
        if m:
            col_size, col_align = self.layout(f"vec{m.group(2)}<{m.group(3)}>")
            return int(m.group(1)) * -(-col_size // col_align) * col_align, col_align
        arr = self._array(t)
        if arr is not None:
            size, align = self.layout(arr[0])
            stride = -(-size // align) * align
            return stride * (arr[1] or 0), align
        if re.fullmatch(r"\w+", t):
            _, size, align = self.struct(t)
            return size, align
        raise self.error(f"type {t!r}")

    def stride(self, element: str) -> int:
        size, align = self.layout(element)
        return -(-size // align) * align

    def leaves(self, t: str, base: int, chain: tuple[str | int, ...], out: list[Leaf], depth: int = 0) -> None:
        if depth > 32:
            raise self.error("types nested too deep")
        t = t.strip()
        if t in _WGSL_SCALARS:
            out.append(Leaf(chain, base, _WGSL_SCALARS[t][0]))
            return
        m = re.fullmatch(r"atomic\s*<\s*(\w+)\s*>", t)
        if m:
            self.leaves(m.group(1), base, chain, out, depth + 1)
            return
        m = re.fullmatch(r"vec([234])\s*<\s*(\w+)\s*>", t)
        if m:
            s = self.layout(m.group(2))[0]
            for i in range(int(m.group(1))):
                self.leaves(m.group(2), base + i * s, chain + (i,), out, depth + 1)
            return
        m = re.fullmatch(r"mat([234])x([234])\s*<\s*(\w+)\s*>", t)
        if m:
            col = f"vec{m.group(2)}<{m.group(3)}>"
            for i in range(int(m.group(1))):
                self.leaves(col, base + i * self.stride(col), chain + (i,), out, depth + 1)
            return
        arr = self._array(t)
        if arr is not None:
            if arr[1] is None:
                raise self.error(f"a runtime-sized array inside a uniform ({t!r})")
            s = self.stride(arr[0])
            for i in range(arr[1]):
                self.leaves(arr[0], base + i * s, chain + (i,), out, depth + 1)
            return
        members, _, _ = self.struct(t)
        wrapper = t.startswith("_Array_") and len(members) == 1 and _SUFFIX.sub("", members[0].name) == "data"
        for mb in members:
            name = _SUFFIX.sub("", mb.name)
            self.leaves(mb.type, base + mb.offset, chain if wrapper else chain + (name,), out, depth + 1)


_UNDERSCORES = re.compile(r"_+")


def wgsl_stem(name: str | None) -> str:
    """What of a name survives Slang's WGSL emitter (see the module docstring): runs of underscores
    folded into one, none at either end. A parameter's name and the name its WGSL variable or
    member has (its ``_<n>`` taken off) have the same stem; ``None`` (the scalars' block) is ``""``."""
    return _UNDERSCORES.sub("_", name or "").strip("_")


def _param_name(var: str, prefix: str, sep: str, suffix: bool) -> str | None:
    """Slang's variable name -> the parameter (None: the scalar block); "" if not an entry's."""
    name = _SUFFIX.sub("", var) if suffix else var
    if name == prefix:
        return None
    if name.startswith(prefix + sep):
        return name[len(prefix) + len(sep):]
    return ""


def read_wgsl(text: str, source: str = "WGSL") -> ShaderFacts:
    """The entry parameters' variables of a WGSL module Slang wrote (see the module docstring)."""
    w = _Wgsl(text, source)
    out: list[ShaderVar] = []
    for m in _VAR.finditer(w.text):
        attrs = dict(_ATTR.findall(m.group(1)))
        if "group" not in attrs or "binding" not in attrs:
            continue
        try:
            group, binding = int(attrs["group"]), int(attrs["binding"])
        except ValueError:
            raise w.error(f"variable {m.group(3)}: @group({attrs['group']}) @binding({attrs['binding']})") from None
        param = _param_name(m.group(3), "entryPointParams", "_", True)
        if param == "":
            raise w.error(f"variable {m.group(3)!r} is no entry parameter's (Slang names them entryPointParams_*)")
        space = [s.strip() for s in m.group(2).split(",")]
        t = m.group(4).strip()
        if space[0] == "storage":
            access = "read_write" if len(space) > 1 and space[1] == "read_write" else "read"
            arr = w._array(t)
            stride = w.stride(arr[0]) if arr is not None else w.layout(t)[0]
            out.append(ShaderVar(param, group, binding, access, stride=stride))
        elif space[0] == "uniform":
            leaves: list[Leaf] = []
            w.leaves(t, 0, (), leaves)
            end = max((lf.offset + _SIZES[lf.type] for lf in leaves), default=0)
            out.append(ShaderVar(param, group, binding, "uniform", leaves=tuple(leaves), end=end,
                                 size=w.layout(t)[0]))
        else:
            raise w.error(f"variable {m.group(3)!r} in address space {m.group(2)!r}")
    return ShaderFacts(tuple(out))


_SIZES = {"float32": 4, "int32": 4, "uint32": 4, "float16": 2, "bool": 4, "int64": 8, "uint64": 8,
          "float64": 8, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1}

# ---------------------------------------------------------------------------------------------
# SPIR-V
# ---------------------------------------------------------------------------------------------
_MAGIC = 0x07230203
_OP_NAME, _OP_MEMBER_NAME, _OP_DECORATE, _OP_MEMBER_DECORATE = 5, 6, 71, 72
_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX = 20, 21, 22, 23, 24
_OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER = 28, 29, 30, 32
_OP_CONSTANT, _OP_VARIABLE = 43, 59
_TYPE_OPS = frozenset({_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX,
                       _OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER})
_DEC_ARRAY_STRIDE, _DEC_MATRIX_STRIDE, _DEC_NON_WRITABLE = 6, 7, 24
_DEC_BINDING, _DEC_SET, _DEC_OFFSET = 33, 34, 35
_SC_UNIFORM, _SC_PUSH_CONSTANT, _SC_STORAGE_BUFFER = 2, 9, 12


class _Spirv:
    def __init__(self, data: bytes, source: str) -> None:
        self.source = source
        if len(data) < 20 or len(data) % 4:
            raise self.error(f"size {len(data)} is not whole words")
        words = struct.unpack(f"<{len(data) // 4}I", data)
        if words[0] != _MAGIC:
            raise self.error(f"magic 0x{words[0]:08x}")
        self.names: dict[int, str] = {}
        self.member_names: dict[tuple[int, int], str] = {}
        self.dec: dict[int, dict[int, tuple[int, ...]]] = {}
        self.member_dec: dict[tuple[int, int], dict[int, tuple[int, ...]]] = {}
        self.types: dict[int, tuple[int, ...]] = {}
        self.constants: dict[int, int] = {}
        self.variables: list[tuple[int, int, int]] = []  # (id, pointer type, storage class)
        for op, ops in self._instructions(words):
            if op == _OP_NAME and len(ops) > 1:
                self.names[ops[0]] = self._string(ops[1:])
            elif op == _OP_MEMBER_NAME and len(ops) > 2:
                self.member_names[(ops[0], ops[1])] = self._string(ops[2:])
            elif op == _OP_DECORATE and len(ops) > 1:
                self.dec.setdefault(ops[0], {})[ops[1]] = ops[2:]
            elif op == _OP_MEMBER_DECORATE and len(ops) > 2:
                self.member_dec.setdefault((ops[0], ops[1]), {})[ops[2]] = ops[3:]
            elif op in _TYPE_OPS and ops:
                self.types[ops[0]] = (op, *ops[1:])
            elif op == _OP_CONSTANT and len(ops) > 2:
                self.constants[ops[1]] = ops[2]
            elif op == _OP_VARIABLE and len(ops) > 2 and ops[2] in (_SC_UNIFORM, _SC_PUSH_CONSTANT, _SC_STORAGE_BUFFER):
                self.variables.append((ops[1], ops[0], ops[2]))

    def error(self, what: str) -> BinaryFormatError:
        return BinaryFormatError(f"{self.source}: unreadable SPIR-V ({what})")

    def _instructions(self, words: tuple[int, ...]) -> Iterator[tuple[int, tuple[int, ...]]]:
        i = 5
        while i < len(words):
            op, count = words[i] & 0xFFFF, words[i] >> 16
            if count == 0 or i + count > len(words):
                raise self.error(f"instruction at word {i}")
            yield op, words[i + 1:i + count]
            i += count

    @staticmethod
    def _string(words: tuple[int, ...]) -> str:
        raw = struct.pack(f"<{len(words)}I", *words)
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def type(self, tid: int) -> tuple[int, ...]:
        t = self.types.get(tid)
        if t is None:
            raise self.error(f"type %{tid} is not defined")
        return t

    def decoration(self, tid: int, dec: int) -> int:
        v = self.dec.get(tid, {}).get(dec)
        if not v:
            raise self.error(f"type %{tid} lacks decoration {dec}")
        return v[0]

    def scalar(self, t: tuple[int, ...]) -> tuple[str, int] | None:
        if t[0] == _OP_TYPE_FLOAT:
            return {16: "float16", 32: "float32", 64: "float64"}.get(t[1], "?"), t[1] // 8
        if t[0] == _OP_TYPE_INT:
            return f"{'int' if t[2] else 'uint'}{t[1]}", t[1] // 8
        if t[0] == _OP_TYPE_BOOL:
            return "bool", 4
        return None

    def leaves(self, tid: int, base: int, chain: tuple[str | int, ...], out: list[Leaf], depth: int = 0,
               matrix_stride: int | None = None) -> None:
        if depth > 32:
            raise self.error("types nested too deep")
        t = self.type(tid)
        s = self.scalar(t)
        if s is not None:
            out.append(Leaf(chain, base, s[0]))
            return
        op = t[0]
        if op == _OP_TYPE_VECTOR:
            es = self.scalar(self.type(t[1]))
            if es is None:
                raise self.error(f"vector %{tid} of a non-scalar")
            for i in range(t[2]):
                out.append(Leaf(chain + (i,), base + i * es[1], es[0]))
        elif op == _OP_TYPE_MATRIX:
            if matrix_stride is None:
                raise self.error(f"matrix %{tid} without a MatrixStride")
            for i in range(t[2]):
                self.leaves(t[1], base + i * matrix_stride, chain + (i,), out, depth + 1)
        elif op == _OP_TYPE_ARRAY:
            n = self.constants.get(t[2])
            if n is None:
                raise self.error(f"array %{tid} of a length that is not a constant")
            stride = self.decoration(tid, _DEC_ARRAY_STRIDE)
            for i in range(n):
                self.leaves(t[1], base + i * stride, chain + (i,), out, depth + 1, matrix_stride)
        elif op == _OP_TYPE_STRUCT:
            members = t[1:]
            wrapper = self.names.get(tid, "").startswith("_Array_") and len(members) == 1 and \
                self.member_names.get((tid, 0)) == "data"
            for i, m in enumerate(members):
                md = self.member_dec.get((tid, i), {})
                off = md.get(_DEC_OFFSET)
                if not off:
                    raise self.error(f"struct %{tid} member {i} has no Offset")
                name = self.member_names.get((tid, i), f"member{i}")
                ms = md.get(_DEC_MATRIX_STRIDE)
                self.leaves(m, base + off[0], chain if wrapper else chain + (name,), out, depth + 1,
                            ms[0] if ms else None)
        else:
            raise self.error(f"type %{tid} (op {op}) inside a uniform")

    def stride(self, tid: int) -> int | None:
        """The element stride of a storage buffer's block: its (last) member's array stride."""
        t = self.type(tid)
        if t[0] != _OP_TYPE_STRUCT or len(t) < 2:
            raise self.error(f"storage block %{tid} is not a struct")
        last = self.type(t[-1])
        if last[0] in (_OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_ARRAY):
            return self.decoration(t[-1], _DEC_ARRAY_STRIDE)
        return None


def read_spirv(data: bytes, source: str = "SPIR-V") -> ShaderFacts:
    """The entry parameters' variables of a SPIR-V module Slang wrote (see the module docstring)."""
    sp = _Spirv(data, source)
    out: list[ShaderVar] = []
    for vid, ptr, sc in sp.variables:
        name = sp.names.get(vid, "")
        param = _param_name(name, "entryPointParams", ".", False)
        if param == "":
            raise sp.error(f"variable {name!r} is no entry parameter's (Slang names them entryPointParams.*)")
        pt = sp.type(ptr)
        if pt[0] != _OP_TYPE_POINTER:
            raise sp.error(f"variable {name!r} is not of a pointer type")
        pointee = pt[2]
        if sc == _SC_PUSH_CONSTANT:
            group = binding = None
        else:
            group, binding = sp.decoration(vid, _DEC_SET), sp.decoration(vid, _DEC_BINDING)
        if sc == _SC_STORAGE_BUFFER:
            writable = _DEC_NON_WRITABLE not in sp.dec.get(vid, {}) and \
                _DEC_NON_WRITABLE not in sp.member_dec.get((pointee, 0), {})
            out.append(ShaderVar(param, group, binding, "read_write" if writable else "read",
                                 stride=sp.stride(pointee)))
        else:
            leaves: list[Leaf] = []
            sp.leaves(pointee, 0, (), leaves)
            end = max((lf.offset + _SIZES.get(lf.type, 4) for lf in leaves), default=0)
            out.append(ShaderVar(param, group, binding, "push_constants" if sc == _SC_PUSH_CONSTANT else "uniform",
                                 leaves=tuple(leaves), end=end))
    return ShaderFacts(tuple(out))
