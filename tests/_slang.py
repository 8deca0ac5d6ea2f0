"""Helpers of the Slang stage tests: a skip marker, tiny crates on disk, compiled crates."""

from __future__ import annotations

import importlib.util
import textwrap
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "example_shader_pkg"

#: Tests that run Slang skip where slangpy is not installed (they run wherever it is).
needs_slang = pytest.mark.skipif(importlib.util.find_spec("slangpy") is None,
                                 reason="slangpy (the Slang compiler) is not installed")

#: A crate exercising every kind: buffers, Atomic<uint>, a uniform struct whose layout differs per
#: target, loose scalars of several types, an imported module's struct as a storage element, a 3-D
#: group and an entry that declares a buffer it never reads.
MAIN_SLANG = """\
import util;

struct Params { float a; float3 v; float arr[2]; uint n; };

[shader("compute")]
[numthreads(256, 1, 1)]
void saxpy(uint3 tid : SV_DispatchThreadID, uniform RWStructuredBuffer<float> y,
           uniform StructuredBuffer<float> x, uniform ConstantBuffer<Params> p,
           uniform float scale, uniform int k)
{
    uint n, s;
    y.GetDimensions(n, s);
    if (tid.x < n) y[tid.x] = p.a * x[tid.x] + y[tid.x] * scale + float(k) + p.v.y + p.arr[1];
}

[shader("compute")]
[numthreads(8, 4, 2)]
void pairs(uint3 tid : SV_DispatchThreadID, uint3 lid : SV_GroupThreadID, uint gi : SV_GroupIndex,
           uniform RWStructuredBuffer<Pair> ps, uniform RWStructuredBuffer<Atomic<uint>> hits,
           uniform StructuredBuffer<float> unused, uniform uint count, uniform half h)
{
    uint n, s;
    ps.GetDimensions(n, s);
    if (tid.x < n) { ps[tid.x].a = twice(ps[tid.x].b); hits[0].add(gi); }
}
"""

UTIL_SLANG = """\
module util;
public struct Pair { public float a; public float b; };
public float twice(float x) { return 2.0 * x; }
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def plan(root: Path, patterns: list[str] | None = None, include_dirs: list[str] | None = None, **kw):  # type: ignore[no-untyped-def]
    from hatch_khal.slang.stage import plan_slang_crate

    return plan_slang_crate(root, kw.pop("crate", "demo"), patterns or ["k/*.slang"], include_dirs or [],
                            kw.pop("defines", {}), kw.pop("options", []), kw.pop("slang_options", []), **kw)


def compile_files(root: Path, files: dict[str, str], targets=("cuda", "wgsl", "spirv"), **kw):  # type: ignore[no-untyped-def]
    from hatch_khal.slang.stage import compile_slang_crate

    write(root, files)
    return compile_slang_crate(plan(root, **kw), targets)


@lru_cache(maxsize=None)
def main_crate(tmp: str):  # type: ignore[no-untyped-def]
    """The MAIN_SLANG crate, compiled for every target (once per directory)."""
    return compile_files(Path(tmp), {"k/main.slang": MAIN_SLANG, "mods/util.slang": UTIL_SLANG},
                         include_dirs=["mods"])


@lru_cache(maxsize=None)
def example_crate():  # type: ignore[no-untyped-def]
    """example_shader_pkg/kernels/slang, compiled for every target."""
    from hatch_khal.slang.stage import compile_slang_crate, plan_slang_crate

    p = plan_slang_crate(EXAMPLE, "slang_examples", ["kernels/slang/*.slang"], ["kernels/slang/modules"], {}, [])
    return compile_slang_crate(p)


def webgpu_package(root: Path, name: str = "wgpu_example_pkg") -> Path:
    """A package holding only the WebGPU build (WGSL + SPIR-V) of the example's Slang crate, as
    the hook writes it: ``root/<name>`` (import it with ``root`` on sys.path)."""
    from hatch_khal.slang.stage import compile_slang_crate, plan_slang_crate
    from khal_runtime.manifest import SCHEMA_VERSION, Crate, Manifest, SpirvStatus, Toolchain

    p = plan_slang_crate(EXAMPLE, "slang_examples", ["kernels/slang/*.slang"], ["kernels/slang/modules"], {}, [])
    out = compile_slang_crate(p, {"wgsl", "spirv"})
    pkg = root / name
    (pkg / "_khal").mkdir(parents=True, exist_ok=True)
    for rel, data in out.webgpu_files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_bytes(data)
    crate = Crate(name="slang_examples", language="slang", package_dir="_khal/slang_examples",
                  sources=p.manifest_sources, content_hash=p.content_hash,
                  artifacts=tuple(out.webgpu_artifacts()), entries=tuple(out.entries),
                  spirv=SpirvStatus(status="built"))
    m = Manifest(schema_version=SCHEMA_VERSION, package=name, toolchain=Toolchain(hatch_khal_version="test"),
                 crates=(crate,))
    (pkg / "_khal" / "manifest.json").write_text(m.to_json())
    (pkg / "__init__.py").write_text("import khal_runtime\n\nkernels = khal_runtime.load(__name__)\n")
    return pkg
