"""Slang's C reflection, read into plain JSON-able dicts (runs in the worker process only).

Nothing here decides anything: it records what Slang says about each entry point of one compile
request (names, thread-group size, parameters with their types and per-target layouts, which
binding slots the code really uses) so that :mod:`hatch_khal.slang.entries` can map it onto the
khal ABI in the parent process. Sizes and offsets are in bytes of the ``uniform`` category (what a
buffer or a parameter block holds); binding slots are the ``descriptor table slot`` category
(Vulkan ``binding``, WebGPU ``@binding``); push constants have their own category.
"""

from __future__ import annotations

import ctypes
from typing import Any

from hatch_khal.slang.library import SlangLibrary

__all__ = ["CATEGORIES", "TYPE_KINDS", "read_entries", "read_global_params"]

#: SlangParameterCategory values this project reads (slang.h).
CATEGORIES: dict[int, str] = {
    1: "mixed", 2: "constant_buffer", 3: "shader_resource", 4: "unordered_access", 5: "varying_input",
    6: "varying_output", 7: "sampler_state", 8: "uniform", 9: "descriptor_slot", 10: "specialization_constant",
    11: "push_constant", 12: "register_space", 13: "generic", 20: "sub_element_register_space",
}
_UNIFORM = 8

#: SlangTypeKind values (slang.h).
TYPE_KINDS: dict[int, str] = {
    0: "none", 1: "struct", 2: "array", 3: "matrix", 4: "vector", 5: "scalar", 6: "constant_buffer",
    7: "resource", 8: "sampler_state", 9: "texture_buffer", 10: "shader_storage_buffer",
    11: "parameter_block", 12: "generic_type_parameter", 13: "interface", 14: "output_stream",
    15: "mesh_output", 16: "specialized", 17: "feedback", 18: "pointer", 19: "dynamic_resource", 20: "enum",
}
_MAX_DEPTH = 16
_UNBOUNDED = ctypes.c_size_t(-1).value


def _s(value: bytes | None) -> str:
    return value.decode("utf-8", "replace") if value else ""


def _categories(lib: SlangLibrary, type_layout: int) -> list[int]:
    n = lib.spReflectionTypeLayout_GetCategoryCount(type_layout)
    return [lib.spReflectionTypeLayout_GetCategoryByIndex(type_layout, i) for i in range(n)]


def _offsets(lib: SlangLibrary, var_layout: int, type_layout: int) -> dict[str, list[int]]:
    """category -> [offset, space] of a variable layout."""
    return {
        CATEGORIES.get(c, str(c)): [int(lib.spReflectionVariableLayout_GetOffset(var_layout, c)),
                                    int(lib.spReflectionVariableLayout_GetSpace(var_layout, c))]
        for c in _categories(lib, type_layout)
    }


def read_type(lib: SlangLibrary, tl: int, depth: int = 0) -> dict[str, Any]:
    """A type layout as a dict: kind, name, size/align/stride (uniform bytes) and what it holds."""
    t = lib.spReflectionTypeLayout_GetType(tl)
    kind = TYPE_KINDS.get(lib.spReflectionTypeLayout_getKind(tl), "unknown")
    size = int(lib.spReflectionTypeLayout_GetSize(tl, _UNIFORM))
    out: dict[str, Any] = {
        "kind": kind,
        "name": _s(lib.spReflectionType_GetName(t)) if t else "",
        "size": -1 if size == _UNBOUNDED else size,
        "align": int(lib.spReflectionTypeLayout_getAlignment(tl, _UNIFORM)),
        "stride": int(lib.spReflectionTypeLayout_GetStride(tl, _UNIFORM)),
    }
    if depth > _MAX_DEPTH:
        out["kind"] = "too_deep"
        return out
    if kind == "scalar":
        out["scalar"] = int(lib.spReflectionType_GetScalarType(t))
    elif kind == "vector":
        out["count"] = int(lib.spReflectionType_GetElementCount(t))
        out["scalar"] = int(lib.spReflectionType_GetScalarType(lib.spReflectionType_GetElementType(t)))
    elif kind == "matrix":
        out["rows"] = int(lib.spReflectionType_GetRowCount(t))
        out["cols"] = int(lib.spReflectionType_GetColumnCount(t))
    elif kind == "array":
        count = int(lib.spReflectionType_GetElementCount(t))
        out["count"] = -1 if count == _UNBOUNDED else count
        out["element_stride"] = int(lib.spReflectionTypeLayout_GetElementStride(tl, _UNIFORM))
        el = lib.spReflectionTypeLayout_GetElementTypeLayout(tl)
        out["element"] = read_type(lib, el, depth + 1) if el else None
    elif kind == "struct":
        fields = []
        for i in range(lib.spReflectionTypeLayout_GetFieldCount(tl)):
            f = lib.spReflectionTypeLayout_GetFieldByIndex(tl, i)
            v = lib.spReflectionVariableLayout_GetVariable(f)
            fields.append({
                "name": _s(lib.spReflectionVariable_GetName(v)),
                "offset": int(lib.spReflectionVariableLayout_GetOffset(f, _UNIFORM)),
                "type": read_type(lib, lib.spReflectionVariableLayout_GetTypeLayout(f), depth + 1),
            })
        out["fields"] = fields
    elif kind in ("resource", "constant_buffer", "parameter_block", "texture_buffer", "shader_storage_buffer"):
        if t:
            out["shape"] = int(lib.spReflectionType_GetResourceShape(t))
            out["access"] = int(lib.spReflectionType_GetResourceAccess(t))
        el = lib.spReflectionTypeLayout_GetElementTypeLayout(tl)
        out["element"] = read_type(lib, el, depth + 1) if el else None
    return out


def _used(lib: SlangLibrary, request: int, entry_index: int, category: int, space: int, index: int) -> bool | None:
    flag = ctypes.c_bool(False)
    rc = lib.spIsParameterLocationUsed(request, entry_index, 0, category, space, index, ctypes.byref(flag))
    return bool(flag.value) if rc >= 0 else None


def read_entries(lib: SlangLibrary, request: int) -> list[dict[str, Any]]:
    """Every entry point of a compiled request, in reflection order."""
    refl = lib.spGetReflection(request)
    if not refl:
        return []
    out = []
    for i in range(lib.spReflection_getEntryPointCount(refl)):
        ep = lib.spReflection_getEntryPointByIndex(refl, i)
        size = (ctypes.c_uint64 * 3)()
        lib.spReflectionEntryPoint_getComputeThreadGroupSize(ep, 3, size)
        entry: dict[str, Any] = {
            "name": _s(lib.spReflectionEntryPoint_getName(ep)),
            "name_override": _s(lib.spReflectionEntryPoint_getNameOverride(ep)),
            "stage": int(lib.spReflectionEntryPoint_getStage(ep)),
            "block": [int(v) for v in size],
            "has_default_cb": bool(lib.spReflectionEntryPoint_hasDefaultConstantBuffer(ep)),
            "offsets": {}, "container": {}, "scalar_block_size": 0, "params": [],
        }
        vl = lib.spReflectionEntryPoint_getVarLayout(ep)
        if vl:
            tl = lib.spReflectionVariableLayout_GetTypeLayout(vl)
            entry["offsets"] = _offsets(lib, vl, tl)
            cv = lib.spReflectionTypeLayout_getContainerVarLayout(tl)
            if cv:
                entry["container"] = _offsets(lib, cv, lib.spReflectionVariableLayout_GetTypeLayout(cv))
            el = lib.spReflectionTypeLayout_GetElementTypeLayout(tl)
            if el:
                entry["scalar_block_size"] = int(lib.spReflectionTypeLayout_GetSize(el, _UNIFORM))
            slot = entry["container"].get("descriptor_slot")
            if slot is not None:
                base = entry["offsets"].get("descriptor_slot", [0, 0])
                entry["container_used"] = _used(lib, request, i, 9, slot[1] + base[1], slot[0] + base[0])
        for j in range(lib.spReflectionEntryPoint_getParameterCount(ep)):
            p = lib.spReflectionEntryPoint_getParameterByIndex(ep, j)
            v = lib.spReflectionVariableLayout_GetVariable(p)
            tl = lib.spReflectionVariableLayout_GetTypeLayout(p)
            param: dict[str, Any] = {
                "name": _s(lib.spReflectionVariable_GetName(v)),
                "semantic": _s(lib.spReflectionVariableLayout_GetSemanticName(p)),
                "offsets": _offsets(lib, p, tl),
                "type": read_type(lib, tl),
            }
            slot = param["offsets"].get("descriptor_slot")
            if slot is not None:
                base = entry["offsets"].get("descriptor_slot", [0, 0])
                param["used"] = _used(lib, request, i, 9, slot[1] + base[1], slot[0] + base[0])
            entry["params"].append(param)
        out.append(entry)
    return out


def read_global_params(lib: SlangLibrary, request: int) -> list[dict[str, Any]]:
    """Global shader parameters (``RWStructuredBuffer<float> g;`` at module scope), by name and type."""
    refl = lib.spGetReflection(request)
    if not refl:
        return []
    out = []
    for i in range(lib.spReflection_GetParameterCount(refl)):
        p = lib.spReflection_GetParameterByIndex(refl, i)
        v = lib.spReflectionVariableLayout_GetVariable(p)
        tl = lib.spReflectionVariableLayout_GetTypeLayout(p)
        out.append({"name": _s(lib.spReflectionVariable_GetName(v)), "type": read_type(lib, tl)})
    return out
