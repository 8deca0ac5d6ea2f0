"""Independent readers of compiled artifacts, for checking the Slang stage's manifest claims.

Hand-written on purpose: the manifest's bindings and layouts must be checked against what the
WGSL, SPIR-V and PTX really say, not against the stage's own reflection code; and no SPIR-V tool
(spirv-tools, naga) is installable here. Each reader covers what Slang emits, nothing more:

* :func:`read_spirv`: a SPIR-V word reader (header, OpName / OpMemberName, OpEntryPoint,
  OpExecutionMode LocalSize, OpDecorate / OpMemberDecorate, OpType*, OpVariable, OpConstant);
* :func:`read_wgsl`: WGSL module-scope ``var``s with ``@group`` / ``@binding``, structs with
  their members' offsets computed by WGSL's layout rules (``@align`` / ``@size`` honoured), the
  ``@workgroup_size`` and the entry's name;
* :func:`ptx_params`: the ``.param`` types of each ``.entry`` and its ``.maxntid``.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------- SPIR-V
_OP_NAME, _OP_MEMBER_NAME, _OP_ENTRY_POINT, _OP_EXECUTION_MODE = 5, 6, 15, 16
_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR = 20, 21, 22, 23
_OP_TYPE_ARRAY, _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER = 28, 29, 30, 32
_OP_CONSTANT, _OP_VARIABLE, _OP_DECORATE, _OP_MEMBER_DECORATE = 43, 59, 71, 72
DEC_BLOCK, DEC_ARRAY_STRIDE, DEC_NON_WRITABLE, DEC_BINDING, DEC_SET, DEC_OFFSET = 2, 6, 24, 33, 34, 35
SC_UNIFORM, SC_PUSH_CONSTANT, SC_STORAGE_BUFFER = 2, 9, 12


def _string(words: list[int]) -> tuple[str, int]:
    """A literal string at the start of ``words`` and how many words it takes."""
    raw = b"".join(struct.pack("<I", w) for w in words)
    end = raw.index(b"\x00")
    return raw[:end].decode("utf-8"), end // 4 + 1


@dataclass
class Spirv:
    entry_points: list[tuple[int, str]] = field(default_factory=list)  # (execution model, name)
    local_size: tuple[int, ...] = ()
    names: dict[int, str] = field(default_factory=dict)
    member_names: dict[tuple[int, int], str] = field(default_factory=dict)
    decorations: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    member_decorations: dict[tuple[int, int], dict[int, list[int]]] = field(default_factory=dict)
    types: dict[int, tuple] = field(default_factory=dict)  # id -> (op, operands...)
    constants: dict[int, int] = field(default_factory=dict)
    variables: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (pointer type, storage class)

    def pointee(self, var: int) -> int:
        ptr = self.types[self.variables[var][0]]
        assert ptr[0] == _OP_TYPE_POINTER
        return ptr[2]

    def struct_members(self, struct_id: int) -> list[tuple[str, int, int]]:
        """(name, offset, type id) of a struct's members."""
        t = self.types[struct_id]
        assert t[0] == _OP_TYPE_STRUCT, t
        return [(self.member_names.get((struct_id, i), f"m{i}"),
                 self.member_decorations.get((struct_id, i), {}).get(DEC_OFFSET, [-1])[0], m)
                for i, m in enumerate(t[1:])]

    def size_of(self, type_id: int) -> int:
        """Bytes a type takes under its explicit layout (offsets, strides)."""
        t = self.types[type_id]
        op = t[0]
        if op in (_OP_TYPE_INT, _OP_TYPE_FLOAT):
            return t[1] // 8
        if op == _OP_TYPE_VECTOR:
            return self.size_of(t[1]) * t[2]
        if op == _OP_TYPE_ARRAY:
            return self.decorations[type_id][DEC_ARRAY_STRIDE][0] * self.constants[t[2]]
        if op == _OP_TYPE_STRUCT:
            return max((off + self.size_of(m) for _, off, m in self.struct_members(type_id)), default=0)
        raise AssertionError(f"no size for type op {op}")

    def variable_named(self, name: str) -> int:
        for v in self.variables:
            if self.names.get(v) == name:
                return v
        raise KeyError(f"{name!r} not among {[self.names.get(v) for v in self.variables]}")


def read_spirv(data: bytes) -> Spirv:
    assert len(data) % 4 == 0 and len(data) >= 20
    words = list(struct.unpack(f"<{len(data) // 4}I", data))
    assert words[0] == 0x07230203, hex(words[0])
    out = Spirv()
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        assert count > 0, f"bad instruction at word {i}"
        ops = words[i + 1: i + count]
        if op == _OP_NAME:
            out.names[ops[0]] = _string(ops[1:])[0]
        elif op == _OP_MEMBER_NAME:
            out.member_names[(ops[0], ops[1])] = _string(ops[2:])[0]
        elif op == _OP_ENTRY_POINT:
            out.entry_points.append((ops[0], _string(ops[2:])[0]))
        elif op == _OP_EXECUTION_MODE and ops[1] == 17:  # LocalSize
            out.local_size = tuple(ops[2:5])
        elif op == _OP_DECORATE:
            out.decorations.setdefault(ops[0], {})[ops[1]] = list(ops[2:])
        elif op == _OP_MEMBER_DECORATE:
            out.member_decorations.setdefault((ops[0], ops[1]), {})[ops[2]] = list(ops[3:])
        elif op in (_OP_TYPE_BOOL, _OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_ARRAY,
                    _OP_TYPE_RUNTIME_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER):
            out.types[ops[0]] = (op, *ops[1:])
        elif op == _OP_CONSTANT:
            out.constants[ops[1]] = ops[2]
        elif op == _OP_VARIABLE and ops[2] in (SC_UNIFORM, SC_PUSH_CONSTANT, SC_STORAGE_BUFFER):
            out.variables[ops[1]] = (ops[0], ops[2])
        i += count
    return out


# ----------------------------------------------------------------------------------------- WGSL
_WGSL_SCALARS = {"f32": (4, 4), "i32": (4, 4), "u32": (4, 4), "f16": (2, 2), "bool": (4, 4)}


@dataclass
class WgslVar:
    name: str
    group: int
    binding: int
    space: str  # "uniform", "storage, read", "storage, read_write"
    type: str


@dataclass
class WgslMember:
    name: str
    offset: int
    size: int
    align: int
    type: str


@dataclass
class Wgsl:
    vars: list[WgslVar]
    structs: dict[str, list[WgslMember]]
    workgroup_size: tuple[int, ...]
    entry_point: str

    def layout(self, type_name: str) -> tuple[int, int]:
        """(size, align) of a WGSL type by the spec's layout rules (with @align/@size)."""
        t = type_name.strip()
        if t in _WGSL_SCALARS:
            return _WGSL_SCALARS[t]
        m = re.fullmatch(r"vec([234])<(\w+)>", t)
        if m:
            n, (s, _) = int(m.group(1)), _WGSL_SCALARS[m.group(2)]
            return n * s, (2 if n == 2 else 4) * s
        m = re.fullmatch(r"array<(.+),\s*(?:i32\()?(\d+)\)?>", t)
        if m:
            size, align = self.layout(m.group(1))
            return self.stride(m.group(1)) * int(m.group(2)), align
        members = self.structs[t]
        align = max(mm.align for mm in members)
        end = members[-1].offset + members[-1].size
        return -(-end // align) * align, align

    def stride(self, element: str) -> int:
        size, align = self.layout(element)
        return -(-size // align) * align

    def var(self, name: str) -> WgslVar:
        for v in self.vars:
            if v.name == name:
                return v
        raise KeyError(name)


_VAR_RE = re.compile(
    r"((?:@\w+\(\d+\)\s*){2})var<([^>]+)>\s+(\w+)\s*:\s*([^;]+);")
_STRUCT_RE = re.compile(r"struct\s+(\w+)\s*\{([^}]*)\};?")
_MEMBER_RE = re.compile(r"^((?:@\w+\(\d+\)\s*)*)(\w+)\s*:\s*(.+)$", re.S)


def _split_members(body: str) -> list[str]:
    """Struct members, split on the commas outside ``<...>`` and ``(...)``."""
    parts, depth, cur = [], 0, []
    for ch in body:
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def read_wgsl(text: str) -> Wgsl:
    structs: dict[str, list[WgslMember]] = {}
    out = Wgsl([], structs, (), "")
    for sm in _STRUCT_RE.finditer(text):
        members: list[WgslMember] = []
        end = 0
        structs[sm.group(1)] = members
        for raw in _split_members(sm.group(2)):
            mm = _MEMBER_RE.match(raw)
            assert mm, f"unreadable WGSL member {raw!r}"
            attrs = dict(re.findall(r"@(\w+)\((\d+)\)", mm.group(1)))
            size, align = out.layout(mm.group(3))
            align = int(attrs.get("align", align))
            size = int(attrs.get("size", size))
            offset = -(-end // align) * align
            members.append(WgslMember(mm.group(2), offset, size, align, mm.group(3).strip()))
            end = offset + size
    for vm in _VAR_RE.finditer(text):
        attrs = dict(re.findall(r"@(\w+)\((\d+)\)", vm.group(1)))
        out.vars.append(WgslVar(vm.group(3), int(attrs["group"]), int(attrs["binding"]),
                                " ".join(vm.group(2).split()), vm.group(4).strip()))
    wg = re.search(r"@workgroup_size\(([^)]*)\)\s*fn\s+(\w+)\s*\(", text)
    assert wg, "no compute entry point in the WGSL"
    out.workgroup_size = tuple(int(x) for x in wg.group(1).split(","))
    out.entry_point = wg.group(2)
    return out


def slang_name(wgsl_name: str) -> str:
    """``entryPointParams_y_0`` -> ``y``; ``scale_0`` -> ``scale`` (Slang's WGSL naming)."""
    name = re.sub(r"_\d+$", "", wgsl_name)
    return name.removeprefix("entryPointParams_")


# ------------------------------------------------------------------------------------------ PTX
def ptx_params(ptx: str) -> dict[str, tuple[list[str], tuple[int, ...] | None]]:
    """entry name -> (param types in order, .maxntid) of every ``.entry`` in the PTX."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\((.*?)\)\s*(\.maxntid\s+([\d,\s]+))?", ptx, re.S):
        types = ["".join(t) for t in re.findall(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+\w+(\[\d+\])?",
                                                 m.group(2))]
        ntid = tuple(int(x) for x in m.group(4).split(",")) if m.group(4) else None
        out[m.group(1)] = (types, ntid)
    return out
