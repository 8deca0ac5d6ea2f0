"""Hand-written WGSL kernels with the manifest models a Slang build would give them: the
binding layout Slang emits for WGSL (loose scalars in a uniform block at binding 0, the rest
after it, in declaration order) and, for push constants, the SPIR-V convention (scalars in
immediates, buffers from binding 0), written in WGSL with naga's ``var<immediate>``."""

from __future__ import annotations

import hashlib
from typing import Any

from khal_runtime.manifest import Binding, Entry, Param, ScalarSlot, StructField, StructLayout, WebGpuTarget  # noqa: F401


def _hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def _sym(name: str) -> str:
    return f"{name}_khal_{_hash(name)}"


def storage(name: str, et: str = "float32", writable: bool = False, shape: str = "slice",
            length: int | None = None) -> Param:
    size = {"float32": 4, "uint32": 4, "int32": 4}[et]
    return Param(name=name, kind="storage", element_type=et, element_size=size, element_align=size,
                 shape=shape, length=length, writable=writable)


def scalar(name: str, et: str) -> Param:
    size = {"float32": 4, "uint32": 4, "int32": 4, "float16": 2}[et]
    return Param(name=name, kind="scalar", element_type=et, element_size=size, element_align=size)


def entry(name: str, block: int, params: tuple[Param, ...], bindings: tuple[Binding, ...],
          scalars: str | None = None, block_size: int = 0, slots: tuple[ScalarSlot, ...] = ()) -> Entry:
    sym = _sym(name)
    return Entry(name=name, symbol=sym, hash=_hash(name), block_size=(block, 1, 1), params=params,
                 webgpu=(WebGpuTarget(target="wgsl", path=f"k/{name}.wgsl", entry_point=sym,
                                      bindings=bindings, scalars=scalars, scalar_block_size=block_size,
                                      scalar_slots=slots),))


# -- saxpy, scalars in a uniform block (Slang's WGSL layout) -----------------------------------
def saxpy() -> tuple[Entry, str]:
    e = entry("saxpy", 64, (storage("y", writable=True), storage("x"), scalar("a", "float32"),
                            scalar("n", "uint32")),
              (Binding(param=None, group=0, binding=0, access="uniform"),
               Binding(param="y", group=0, binding=1, access="read_write"),
               Binding(param="x", group=0, binding=2, access="read")),
              "uniform", 8,
              (ScalarSlot(param="a", offset=0, size=4), ScalarSlot(param="n", offset=4, size=4)))
    src = f"""
struct KhalScalars {{ a: f32, n: u32 }}
@group(0) @binding(0) var<uniform> s: KhalScalars;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@compute @workgroup_size(64)
fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    let i = g.x;
    if (i < s.n && i < arrayLength(&y)) {{ y[i] = s.a * x[i] + y[i]; }}
}}
"""
    return e, src


# -- saxpy, scalars in push constants (SPIR-V's layout) ----------------------------------------
def saxpy_push() -> tuple[Entry, str]:
    e = entry("saxpy_push", 64, (storage("y", writable=True), storage("x"), scalar("a", "float32"),
                                 scalar("n", "uint32")),
              (Binding(param="y", group=0, binding=0, access="read_write"),
               Binding(param="x", group=0, binding=1, access="read")),
              "push_constants", 8, (ScalarSlot(param="a", offset=0, size=4), ScalarSlot(param="n", offset=4, size=4)))
    src = f"""
struct KhalScalars {{ a: f32, n: u32 }}
var<immediate> s: KhalScalars;
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@compute @workgroup_size(64)
fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    let i = g.x;
    if (i < s.n && i < arrayLength(&y)) {{ y[i] = s.a * x[i] + y[i]; }}
}}
"""
    return e, src


# -- arrayLength of every binding: exact ranges ---------------------------------------------------
def lengths() -> tuple[Entry, str]:
    e = entry("lengths", 64, (storage("out", "uint32", writable=True), storage("a"), storage("b", writable=True)),
              (Binding(param="out", group=0, binding=0, access="read_write"),
               Binding(param="a", group=0, binding=1, access="read"),
               Binding(param="b", group=0, binding=2, access="read_write")))
    src = f"""
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(64)
fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    let i = g.x;
    if (i == 0u) {{ out[0] = arrayLength(&out); out[1] = arrayLength(&a); out[2] = arrayLength(&b); }}
    if (i < arrayLength(&b)) {{ b[i] = a[i] + 100.0; }}
}}
"""
    return e, src


# -- a uniform struct with a vec4, a vec3, an array and mixed scalars --------------------------------
def _f(name: str, t: str, off: int, size: int, shape: tuple[int, ...] = (),
       strides: tuple[int, ...] = ()) -> StructField:
    return StructField(name=name, type=t, offset=off, size=size, shape=shape, strides=strides)


#: ``struct Params { float a; int b; float4 v; float3 w; uint n; float c[2]; }``
CUDA_PARAMS = StructLayout(size=64, fields=(
    _f("a", "float32", 0, 4), _f("b", "int32", 4, 4), _f("v", "float32", 16, 16, (4,), (4,)),
    _f("w", "float32", 32, 12, (3,), (4,)), _f("n", "uint32", 44, 4), _f("c", "float32", 48, 8, (2,), (4,))))
WGSL_PARAMS = StructLayout(size=80, fields=(
    _f("a", "float32", 0, 4), _f("b", "int32", 4, 4), _f("v", "float32", 16, 16, (4,), (4,)),
    _f("w", "float32", 32, 12, (3,), (4,)), _f("n", "uint32", 44, 4), _f("c", "float32", 48, 32, (2,), (16,))))


def params_struct() -> tuple[Entry, str]:
    p = Param(name="p", kind="uniform", element_type="Params", element_size=64, element_align=16,
              layouts={"cuda": CUDA_PARAMS, "wgsl": WGSL_PARAMS})
    e = entry("read_params", 1, (storage("out", writable=True), p),
              (Binding(param="out", group=0, binding=0, access="read_write"),
               Binding(param="p", group=0, binding=1, access="uniform")))
    src = f"""
struct Params {{ a: f32, b: i32, v: vec4<f32>, w: vec3<f32>, n: u32, c: array<vec4<f32>, 2> }}
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;
@compute @workgroup_size(1)
fn {e.symbol}() {{
    out[0] = p.a; out[1] = f32(p.b);
    out[2] = p.v.x; out[3] = p.v.y; out[4] = p.v.z; out[5] = p.v.w;
    out[6] = p.w.x; out[7] = p.w.y; out[8] = p.w.z;
    out[9] = f32(p.n); out[10] = p.c[0].x; out[11] = p.c[1].x;
}}
"""
    return e, src


def params_ctypes() -> Any:
    import ctypes

    class Params(ctypes.Structure):
        _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_int32), ("_p0", ctypes.c_uint8 * 8),
                    ("v", ctypes.c_float * 4), ("w", ctypes.c_float * 3), ("n", ctypes.c_uint32),
                    ("c", ctypes.c_float * 2), ("_p1", ctypes.c_uint8 * 8)]

    return Params


def params_dtype() -> Any:
    import numpy as np

    return np.dtype({"names": ["a", "b", "v", "w", "n", "c"],
                     "formats": ["<f4", "<i4", ("<f4", 4), ("<f4", 3), "<u4", ("<f4", 2)],
                     "offsets": [0, 4, 16, 32, 44, 48], "itemsize": 64})


# -- hits: each thread adds 1 to its slot (indirect dispatch) ---------------------------------
def hits() -> tuple[Entry, str]:
    e = entry("hits", 64, (storage("h", "uint32", writable=True),),
              (Binding(param="h", group=0, binding=0, access="read_write"),))
    src = f"""
@group(0) @binding(0) var<storage, read_write> h: array<u32>;
@compute @workgroup_size(64)
fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    if (g.x < arrayLength(&h)) {{ h[g.x] = h[g.x] + 1u; }}
}}
"""
    return e, src
