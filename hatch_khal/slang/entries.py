"""Slang entry points onto the khal ABI: from reflection (dicts of :mod:`reflect`) to manifest models.

Every ``[shader("compute")]`` function is an entry. Its parameters with a system-value semantic
(``SV_DispatchThreadID``, ...) are not bindings; every other parameter is an entry-point
``uniform`` and becomes, in declaration order, one parameter of the ABI:

==============================================  =============================================
Slang                                           khal
==============================================  =============================================
``StructuredBuffer<T>``                         storage, read-only, shape "slice"
``RWStructuredBuffer<T>`` (``Atomic<T>`` too)   storage, writable
``ConstantBuffer<S>``                           uniform ``S`` (size and layout per target)
a scalar (``float``, ``int``, ``uint64_t``...)  scalar, by value
==============================================  =============================================

Element types are ABI scalars or structs. Anything else is a :class:`SourceError` naming the file,
the entry and the parameter. Pure Python: runs in the build process, never loads Slang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Container, Sequence

from khal_runtime import abi
from khal_runtime.manifest import Binding, Param, ScalarSlot, StructField, StructLayout, WebGpuTarget

from hatch_khal.errors import SourceError
from hatch_khal.slang.locate import Locator

__all__ = ["CUDA_ONLY_SCALARS", "SLANG_SCALARS", "SlangEntry", "WEBGPU_WORKGROUP_LIMIT", "entries_from_reflection",
           "non_compute_error", "refuse_cuda_only_types", "webgpu_target"]

#: SlangScalarType (slang.h) -> ABI scalar name
SLANG_SCALARS: dict[int, str] = {
    2: "bool", 3: "int32", 4: "uint32", 5: "int64", 6: "uint64", 7: "float16", 8: "float32",
    9: "float64", 10: "int8", 11: "uint8", 12: "int16", 13: "uint16", 16: "bfloat16",
}
#: ABI scalars WebGPU cannot bind: WGSL has no 64-bit types (naga takes i64/u64 only with the
#: native-only SHADER_INT64 feature, which the WebGPU backend does not request; on lavapipe both the
#: WGSL and the SPIR-V module of an int64 scalar or uint64 storage fail create_shader_module), and
#: Slang cannot emit ``double`` to WGSL at all
CUDA_ONLY_SCALARS = frozenset({"int64", "uint64", "float64"})
_STRUCTURED_BUFFER = 0x06
_ACCESS_READ, _ACCESS_READ_WRITE = 1, 2
_STAGE_COMPUTE = 6
#: WebGPU's default ``maxComputeInvocationsPerWorkgroup``
WEBGPU_WORKGROUP_LIMIT = 256
_USE = ("use StructuredBuffer<T> / RWStructuredBuffer<T> (storage), ConstantBuffer<S> (uniform) "
        "or a scalar such as float, int, uint, uint64_t")


@dataclass(frozen=True)
class SlangEntry:
    """One compute entry of a Slang crate, mapped onto the ABI (its CUDA facts)."""

    name: str
    block_size: tuple[int, int, int]
    params: tuple[Param, ...]
    hash: str
    where: str  # file:line, for messages
    #: per parameter name: the element type as reflection saw it for CUDA (storage / uniform)
    cuda_elements: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def symbol(self) -> str:
        return abi.symbol_for(self.name, self.hash)

    @property
    def indirect_symbol(self) -> str:
        return abi.indirect_symbol_for(self.name, self.hash)

    @property
    def threads(self) -> int:
        x, y, z = self.block_size
        return x * y * z


#: ABI scalar -> its Slang spelling (for messages)
_SPELLING = {"bool": "bool", "int32": "int", "uint32": "uint", "int64": "int64_t", "uint64": "uint64_t",
             "float16": "half", "float32": "float", "float64": "double", "int8": "int8_t", "uint8": "uint8_t",
             "int16": "int16_t", "uint16": "uint16_t", "bfloat16": "bfloat16"}
#: SlangResourceShape base shapes -> Slang type names (for messages)
_RESOURCES = {1: "Texture1D", 2: "Texture2D", 3: "Texture3D", 4: "TextureCube", 5: "Buffer",
              6: "StructuredBuffer", 7: "ByteAddressBuffer", 9: "RaytracingAccelerationStructure"}


def _type_name(t: dict[str, Any]) -> str:
    """How Slang spells a reflected type, as far as messages need it."""
    kind = t.get("kind", "?")
    scalar = _SPELLING.get(SLANG_SCALARS.get(t.get("scalar", 0), ""), t.get("name") or "scalar")
    if kind == "scalar":
        return scalar
    if kind == "vector":
        return f"{scalar}{t.get('count')}"
    if kind == "matrix":
        return f"matrix {t.get('rows')}x{t.get('cols')}"
    if kind == "array":
        return f"{_type_name(t['element']) if t.get('element') else '?'}[{t.get('count', '')}]"
    if kind == "resource" and (t.get("shape", 0) & 0x0F) in _RESOURCES:
        base = _RESOURCES[t["shape"] & 0x0F]
        name = ("RW" if t.get("access") == _ACCESS_READ_WRITE else "") + base
        return f"{name}<{_type_name(t['element'])}>" if t.get("element") else str(name)
    if t.get("element") and kind in ("constant_buffer", "parameter_block"):
        return f"{t.get('name') or kind}<{_type_name(t['element'])}>"
    return str(t.get("name") or kind)


def _is_system_value(p: dict[str, Any]) -> bool:
    return bool(str(p.get("semantic") or "").upper().startswith("SV_"))


class _Where:
    """Builds messages that name the file, the crate, the entry and the parameter."""

    def __init__(self, crate: str, locator: Locator, entry: str) -> None:
        self.crate, self.locator, self.entry = crate, locator, entry

    def error(self, message: str, param: str | None = None) -> SourceError:
        at = self.locator.param(self.entry, param) if param else self.locator.entry(self.entry)
        who = f"entry {self.entry!r}" + (f" parameter {param!r}" if param else "")
        return SourceError(f"{at}: crate {self.crate!r}: {who}: {message}")


def _first_scalar(t: dict[str, Any] | None, names: Container[str], path: str = "") -> tuple[str, str] | None:
    """(where, ABI name) of the first scalar of one of ``names`` in a reflected type, at any depth:
    ``""`` for the type itself, ``field 'a'.b`` for a field, an array's / vector's element as
    its container."""
    if t is None:
        return None
    if t.get("kind") == "scalar":
        name = SLANG_SCALARS.get(t.get("scalar", -1), "")
        return (path, name) if name in names else None
    for f in t.get("fields") or ():
        got = _first_scalar(f["type"], names, f"{path}.{f['name']}" if path else f"field {f['name']!r}")
        if got is not None:
            return got
    if t.get("kind") in ("array", "vector", "matrix") and t.get("element"):
        return _first_scalar(t["element"], names, path)
    return None


def _no_bool(t: dict[str, Any], w: _Where, param: str) -> None:
    """bool has no host-shareable layout in WGSL (and differs in size between targets)."""
    got = _first_scalar(t, ("bool",))
    if got is not None:
        raise w.error(f"{got[0] or 'it'} is a bool, which has no portable layout (1 byte in CUDA, "
                      "none in WGSL buffers); use uint (0 or 1)", param)


def _element(t: dict[str, Any] | None, w: _Where, param: str, what: str) -> tuple[str, int, int]:
    """(element_type, size, align) of a storage element or a uniform struct, CUDA layout."""
    if t is None:
        raise w.error(f"{what} has no element type Slang could lay out; {_USE}", param)
    _no_bool(t, w, param)
    if t["kind"] == "scalar":
        name = SLANG_SCALARS.get(t["scalar"])
        if name is None:
            raise w.error(f"{what} of {t.get('name') or 'this scalar type'} is not an ABI scalar type", param)
        return name, abi.SCALARS[name].size, abi.SCALARS[name].align
    if t["kind"] == "struct":
        if not t.get("name") or t["stride"] <= 0:
            raise w.error(f"{what}: struct {t.get('name')!r} has no size Slang could compute", param)
        return t["name"], t["stride"], max(1, t["align"])
    raise w.error(f"{what} of {_type_name(t)} is not supported: the element type must be a scalar or a "
                  "struct (put vectors and matrices inside a struct)", param)


def _param(p: dict[str, Any], w: _Where) -> tuple[Param, dict[str, Any] | None]:
    name, t = p["name"], p["type"]
    kind = t["kind"]
    if kind == "resource" and t.get("shape") == _STRUCTURED_BUFFER and t.get("access") in (_ACCESS_READ, _ACCESS_READ_WRITE):
        writable = t["access"] == _ACCESS_READ_WRITE
        etype, size, align = _element(t.get("element"), w, name, f"{t.get('name', 'StructuredBuffer')}")
        return Param(name=name, kind="storage", element_type=etype, element_size=size, element_align=align,
                     shape="slice", writable=writable), t.get("element")
    if kind == "constant_buffer":
        el = t.get("element")
        if el is None or el["kind"] != "struct":
            raise w.error(f"ConstantBuffer<{_type_name(el) if el else '?'}>: a uniform must hold a struct", name)
        etype, size, align = _element(el, w, name, "ConstantBuffer")
        layout = struct_layout(el, w, name)
        return Param(name=name, kind="uniform", element_type=etype, element_size=size, element_align=align,
                     layouts={"cuda": layout}), el
    if kind == "scalar":
        _no_bool(t, w, name)
        scalar_name = SLANG_SCALARS.get(t["scalar"])
        if scalar_name is None:
            raise w.error(f"{t.get('name') or 'this scalar type'} is not an ABI scalar type", name)
        etype = scalar_name
        return Param(name=name, kind="scalar", element_type=etype, element_size=abi.SCALARS[etype].size,
                     element_align=abi.SCALARS[etype].align), None
    if not p["offsets"] and not p.get("semantic"):
        raise w.error("is not an entry-point uniform Slang could lay out; declare it 'uniform'", name)
    if p.get("semantic"):
        raise w.error(f"semantic {p['semantic']} is not a system value (SV_...); only system values and "
                      "uniforms may be entry parameters", name)
    hint = ""
    if kind == "vector":
        hint = " (pass a vector inside a ConstantBuffer struct, or as separate scalars)"
    elif kind == "struct":
        hint = f" (pass a struct as ConstantBuffer<{t.get('name')}>)"
    elif kind == "resource" and t.get("shape") == _STRUCTURED_BUFFER:
        hint = " (append / consume buffers are not supported)"
    raise w.error(f"{_type_name(t)} is not a khal binding{hint}; {_USE}", name)


#: SlangStage (slang.h) -> the name [shader("...")] takes
_STAGE_NAMES = {1: "vertex", 2: "hull", 3: "domain", 4: "geometry", 5: "fragment", 6: "compute",
                7: "raygeneration", 8: "intersection", 9: "anyhit", 10: "closesthit", 11: "miss", 12: "callable",
                13: "mesh", 14: "amplification"}
_NUMTHREADS = re.compile(r"\[\s*numthreads\s*\(", re.I)


def _declares_numthreads(locator: Locator, entry: str) -> bool:
    """Whether the entry's declaration carries ``[numthreads(...)]`` (reflection reports (1, 1, 1)
    with or without it). True when the declaration cannot be found: only a missing one is refused."""
    head = locator.declaration_head(entry)
    return head is None or bool(_NUMTHREADS.search(head))


def non_compute_error(crate: str, stages: Sequence[tuple[str, int]], locator: Locator) -> SourceError | None:
    """The error for a crate whose sources hold entries of other stages than compute (vertex,
    fragment, ...), naming them and where they are; None if every entry is a compute one. Slang
    compiles every ``[shader]`` entry of a module, and the CUDA target takes compute ones only
    (the others fail with an internal error, or crash Slang)."""
    others = [(name, stage) for name, stage in stages if stage != _STAGE_COMPUTE]
    if not others:
        return None
    listing = ", ".join(f"{name!r} ([shader(\"{_STAGE_NAMES.get(stage, stage)}\")] at {locator.entry(name)})"
                        for name, stage in others)
    compute = [name for name, stage in stages if stage == _STAGE_COMPUTE]
    kept = f" (its compute entries: {', '.join(map(repr, compute))})" if compute else ""
    return SourceError(
        f"{locator.entry(others[0][0])}: crate {crate!r}: {'entry' if len(others) == 1 else 'entries'} {listing} "
        f"{'is not a compute entry' if len(others) == 1 else 'are not compute entries'}: hatch-khal compiles "
        f"only [shader(\"compute\")] entries (to CUDA kernels and WebGPU compute shaders), and Slang compiles "
        f"every [shader] entry of the crate's sources{kept}; move {'it' if len(others) == 1 else 'them'} to a "
        ".slang file that is not one of the crate's sources (option 'sources')"
    )


def entries_from_reflection(crate: str, reflected: list[dict[str, Any]], global_params: list[dict[str, Any]],
                            content_hash: str, locator: Locator) -> list[SlangEntry]:
    """The crate's entries from the reflection of its whole-module CUDA compile, sorted by name."""
    if global_params:
        g = global_params[0]
        raise SourceError(
            f"{locator.name(g['name'])}: crate {crate!r}: global shader parameter {g['name']!r} "
            f"({_type_name(g['type'])}): khal binds entry-point parameters only; make it a 'uniform' "
            "parameter of each entry that uses it"
        )
    out: list[SlangEntry] = []
    for e in reflected:
        name = e["name"]
        w = _Where(crate, locator, name)
        if e["stage"] != _STAGE_COMPUTE:
            raise non_compute_error(crate, [(x["name"], x["stage"]) for x in reflected], locator) or w.error(
                "is not a compute shader; a Slang crate's entries are [shader(\"compute\")] functions")
        if "_khal_" in name or name.endswith("_khal"):
            raise w.error("the name must not contain '_khal_' (reserved for symbols)")
        block = tuple(int(v) for v in e["block"])
        if len(block) != 3 or any(v < 1 for v in block):
            raise w.error(f"[numthreads{block}] must be three positive numbers")
        if block == (1, 1, 1) and not _declares_numthreads(locator, name):
            raise w.error("has no [numthreads(X, Y, Z)] attribute, so Slang would compile it with groups of one "
                          "thread: a compute entry states its threads per group; add [numthreads(64, 1, 1)] (or "
                          "[numthreads(1, 1, 1)], written out, if one thread per group is meant)")
        threads = block[0] * block[1] * block[2]
        if threads > abi.MAX_BLOCK_THREADS:
            raise w.error(f"[numthreads({block[0]}, {block[1]}, {block[2]})] is {threads} threads per group; "
                          f"at most {abi.MAX_BLOCK_THREADS} are allowed")
        params: list[Param] = []
        elements: dict[str, dict[str, Any]] = {}
        for p in e["params"]:
            if _is_system_value(p):
                continue
            param, element = _param(p, w)
            params.append(param)
            if element is not None:
                elements[param.name] = element
        if not params:
            raise w.error("has no parameters; the ABI needs at least one (a buffer, uniform or scalar)")
        signature = abi.entry_signature(name, block, params)
        out.append(SlangEntry(name, block, tuple(params), abi.entry_hash(content_hash, signature),
                              locator.entry(name), elements))
    names = [x.name for x in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SourceError(f"crate {crate!r}: entry {dup[0]!r} is defined twice")
    return sorted(out, key=lambda x: x.name)


def refuse_cuda_only_types(crate: str, entries: Sequence[SlangEntry], locator: Locator,
                           targets: Sequence[str]) -> None:
    """SourceError naming the file, entry and parameter for a 64-bit scalar (``double``,
    ``int64_t``, ``uint64_t``) in a binding of a crate built for WebGPU: a loose scalar, a storage
    element, or a field of a storage element or uniform struct. They are CUDA-only: WGSL has no
    64-bit types (wgpu rejects the WGSL Slang emits for int64 at pipeline creation, and Slang
    cannot emit double at all); ``targets``: the WebGPU targets being built (none: nothing to do)."""
    if not targets:
        return
    for e in entries:
        w = _Where(crate, locator, e.name)
        for p in e.params:
            got: tuple[str, str] | None = None
            if p.kind == "scalar" and p.element_type in CUDA_ONLY_SCALARS:
                got = ("", p.element_type)
            elif p.element_type in CUDA_ONLY_SCALARS:
                got = ("its element type", p.element_type)
            else:
                got = _first_scalar(e.cuda_elements.get(p.name), CUDA_ONLY_SCALARS)
            if got is None:
                continue
            what, spelling = got[0], _SPELLING[got[1]]
            raise w.error(
                f"{what + ' is ' if what else 'is '}{spelling}, a 64-bit type WebGPU does not support "
                f"(WGSL has no 64-bit types), so it cannot be built for {' / '.join(t.upper() for t in targets)}; "
                "64-bit types are CUDA-only: build this crate for CUDA only (KHAL_SKIP_SPIRV=1, or "
                "spirv = false in the crate's configuration), or use a 32-bit type", p.name)


# ---------------------------------------------------------------------------------------------
# struct layouts
# ---------------------------------------------------------------------------------------------
def _field(name: str, offset: int, t: dict[str, Any], w: _Where, param: str) -> StructField:
    size = t["size"]
    shape: list[int] = []
    strides: list[int] = []
    while t["kind"] == "array":
        if t.get("count", 0) <= 0 or t.get("element") is None:
            raise w.error(f"field {name!r}: arrays in a uniform need a fixed size", param)
        shape.append(t["count"])
        strides.append(t["element_stride"])
        t = t["element"]
    if t["kind"] == "vector":
        scalar = SLANG_SCALARS.get(t.get("scalar", 0))
        if scalar is None:
            raise w.error(f"field {name!r}: vector of a non-ABI scalar type", param)
        shape.append(t["count"])
        strides.append(abi.SCALARS[scalar].size)
        return StructField(name=name, type=scalar, offset=offset, size=size, shape=tuple(shape), strides=tuple(strides))
    if t["kind"] == "scalar":
        scalar = SLANG_SCALARS.get(t.get("scalar", 0))
        if scalar is None:
            raise w.error(f"field {name!r}: {t.get('name')} is not an ABI scalar type", param)
        return StructField(name=name, type=scalar, offset=offset, size=size, shape=tuple(shape), strides=tuple(strides))
    if t["kind"] == "struct":
        fields = tuple(_field(f["name"], f["offset"], f["type"], w, param) for f in t["fields"])
        return StructField(name=name, type="struct", offset=offset, size=size, shape=tuple(shape),
                           strides=tuple(strides), fields=fields)
    what = "matrices are not supported yet in uniforms (use float4 rows)" if t["kind"] == "matrix" else \
        f"{_type_name(t)} cannot be part of a uniform"
    raise w.error(f"field {name!r}: {what}", param)


def struct_layout(t: dict[str, Any], w: _Where, param: str) -> StructLayout:
    """A struct (reflection of one target) as the manifest's :class:`StructLayout`."""
    return StructLayout(size=t["stride"], fields=tuple(_field(f["name"], f["offset"], f["type"], w, param)
                                                      for f in t["fields"]))


def _leaves(t: dict[str, Any], base: int = 0, path: str = "") -> list[tuple[str, int, str, int]]:
    """Flattened (path, offset, type, size) of a storage element, for cross-target comparison."""
    if t["kind"] == "struct":
        out = []
        for f in t["fields"]:
            out += _leaves(f["type"], base + f["offset"], f"{path}.{f['name']}" if path else f["name"])
        return out
    if t["kind"] == "array" and t.get("element") is not None:
        out = []
        for i in range(max(0, t.get("count", 0))):
            out += _leaves(t["element"], base + i * t["element_stride"], f"{path}[{i}]")
        return out
    return [(path, base, _type_name(t), t["size"])]


def _names(t: dict[str, Any]) -> list[Any]:
    """The field names of a type, nested (what a rename would change)."""
    if t.get("kind") == "struct":
        return [[f["name"], _names(f["type"])] for f in t["fields"]]
    if t.get("kind") == "array" and t.get("element") is not None:
        return _names(t["element"])
    return []


# ---------------------------------------------------------------------------------------------
# WebGPU targets
# ---------------------------------------------------------------------------------------------
def webgpu_target(crate: str, entry: SlangEntry, target: str, reflected: dict[str, Any], path: str,
                  locator: Locator) -> tuple[WebGpuTarget, dict[str, StructLayout]]:
    """The :class:`WebGpuTarget` of one entry compiled alone for ``target`` ("wgsl" / "spirv"), and
    the layout of each uniform struct in that target. ``reflected`` is that compile's reflection."""
    w = _Where(crate, locator, entry.name)
    if reflected["name"] != entry.symbol:
        raise w.error(f"the {target} compile named its entry point {reflected['name']!r}, not {entry.symbol!r}")
    params = [p for p in reflected["params"] if not _is_system_value(p)]
    names = [p["name"] for p in params]

    def renamed(what: str) -> SourceError:
        return w.error(
            f"compiling for {target} with -D {entry.name}={entry.symbol} (how the WebGPU entry point gets "
            f"its symbol) changed {what}: the entry's name is also used as another identifier (a parameter, "
            "a struct field); rename one of them"
        )

    if names != [p.name for p in entry.params]:
        raise renamed(f"the parameters ({[p.name for p in entry.params]} -> {names})")
    base = reflected["offsets"].get("descriptor_slot", [0, 0])
    bindings: list[Binding] = []
    slots: list[ScalarSlot] = []
    layouts: dict[str, StructLayout] = {}
    for p, mp in zip(params, entry.params):
        t = p["type"]
        access = abi.kind(mp.kind).strategy.access(mp.writable)
        if access is None:  # packed into the entry's scalar block
            off = p["offsets"].get("uniform")
            if off is None:
                raise w.error(f"{target}: Slang placed the scalar outside the entry's scalar block", mp.name)
            slots.append(ScalarSlot(param=mp.name, offset=off[0], size=t["size"]))
            continue
        slot = p["offsets"].get("descriptor_slot")
        if slot is None:
            raise w.error(f"{target}: Slang gave the parameter no binding slot", mp.name)
        element = t.get("element")
        if element is not None and _names(element) != _names(entry.cuda_elements[mp.name]):
            raise renamed(f"the fields of {element.get('name')!r} ({_names(entry.cuda_elements[mp.name])} -> "
                          f"{_names(element)})")
        if access == "uniform":
            layouts[mp.name] = struct_layout(element, w, mp.name)
        elif element is not None and element["kind"] == "struct":
            cuda, here = _leaves(entry.cuda_elements[mp.name]), _leaves(element)
            if cuda != here or entry.cuda_elements[mp.name]["stride"] != element["stride"]:
                raise w.error(
                    f"struct {element['name']!r} is laid out differently in CUDA "
                    f"({entry.cuda_elements[mp.name]['stride']} bytes: {cuda}) and {target} "
                    f"({element['stride']} bytes: {here}); the host passes the same bytes to both: "
                    "put float3 / float4 fields first or at 16-byte offsets (pad with floats), or use scalars",
                    mp.name)
        if p.get("used") is False:
            continue  # Slang dropped it from the shader: nothing to bind
        bindings.append(Binding(param=mp.name, group=slot[1] + base[1], binding=slot[0] + base[0], access=access))
    scalars = None
    block = reflected.get("scalar_block_size", 0) if slots else 0
    if slots:
        container = reflected.get("container", {})
        if "push_constant" in container:
            scalars = "push_constants"
        elif "descriptor_slot" in container:
            if reflected.get("container_used") is False:
                slots, block = [], 0  # no scalar is read: the shader declares no block
            else:
                scalars = "uniform"
                c = container["descriptor_slot"]
                bindings.append(Binding(param=None, group=c[1] + base[1], binding=c[0] + base[0], access="uniform"))
        else:
            raise w.error(f"{target}: Slang put the scalar parameters neither in push constants nor in a "
                          f"uniform block ({sorted(container)})")
    wt = WebGpuTarget(target=target, path=path, entry_point=entry.symbol,  # type: ignore[arg-type]
                      bindings=tuple(sorted(bindings, key=lambda b: (b.group, b.binding))),
                      scalars=scalars, scalar_block_size=block, scalar_slots=tuple(slots))  # type: ignore[arg-type]
    return wt, layouts
