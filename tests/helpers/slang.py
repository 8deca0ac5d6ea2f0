"""Helpers of the Slang tests: a skip marker, tiny crates on disk, compiled crates, and the example's
Slang crate as its wheel ships it."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import textwrap
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_shader_pkg"

#: Tests that run Slang skip where slangpy is not installed (they run wherever it is).
needs_slang = pytest.mark.skipif(importlib.util.find_spec("slangpy") is None,
                                 reason="slangpy (the Slang compiler) is not installed")
#: tests that only read the example wheel's Slang output: the Slang compiler, or a wheel built
#: beforehand (KHAL_TEST_EXAMPLE_WHEEL: the GPU machine, which cannot carry slangpy)
needs_slang_or_wheel = pytest.mark.skipif(
    importlib.util.find_spec("slangpy") is None and not os.environ.get("KHAL_TEST_EXAMPLE_WHEEL"),
    reason="slangpy (the Slang compiler) is not installed and no KHAL_TEST_EXAMPLE_WHEEL is given")

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


ENTRY = """\
[shader("compute")]
[numthreads(64, 1, 1)]
void {name}(uint3 t : SV_DispatchThreadID,
        uniform RWStructuredBuffer<float> o{params})
{{
    {body}
}}
"""


def one_entry(name: str = "f", params: str = "", body: str = "o[t.x] = 1.0;", head: str = "") -> dict[str, str]:
    return {"k/e.slang": head + ENTRY.format(name=name, params=params, body=body)}


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


#: The example package's Slang crate (example_shader_pkg/pyproject.toml)
EXAMPLE_CRATE = "slang"
EXAMPLE_PACKAGE = "example_shader_pkg"


def example_slang_plan():  # type: ignore[no-untyped-def]
    """The example's Slang crate planned from its own pyproject.toml, as the hook plans it."""
    try:
        import tomllib
    except ImportError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    from hatch_khal.config import parse_config
    from hatch_khal.slang.language import SLANG

    table = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    _, crates = parse_config(table["hooks"]["khal"], default_package=EXAMPLE_PACKAGE)
    (cfg,) = [c for c in crates if c.name == EXAMPLE_CRATE]
    return SLANG.plan(EXAMPLE, cfg)


@lru_cache(maxsize=None)
def example_crate():  # type: ignore[no-untyped-def]
    """The example's Slang crate compiled for every target (the stage's output, with its CUDA unit)."""
    from hatch_khal.slang.stage import compile_slang_crate

    plan = example_slang_plan().plan
    return compile_slang_crate(plan.slang, plan.targets)


def cached_example_crate(cache_dir: Path):  # type: ignore[no-untyped-def]
    """The example's Slang output as a build stored it in ``cache_dir`` (the session's example wheel
    build), else compiled here."""
    from hatch_khal.cache import Cache
    from hatch_khal.slang.records import SlangOutput

    plan = example_slang_plan().plan
    hit = Cache(cache_dir).lookup(plan.slang.cache_key(plan.targets))
    return SlangOutput.from_bytes(hit.data) if hit is not None else example_crate()


@dataclass(frozen=True)
class ShippedCrate:
    """A Slang crate as a wheel ships it: what the layout tests read of a stage output, from the wheel."""

    crate: str
    entries: tuple[Any, ...]  # manifest Entry objects
    #: package path -> bytes of every WGSL / SPIR-V artifact
    webgpu_files: dict[str, bytes]
    #: arch ("compute_75", "sm_90") -> PTX / cubin bytes
    binaries: dict[str, bytes]
    manifest: Any

    @property
    def ptx(self) -> str:
        (arch,) = [a for a in self.binaries if a.startswith("compute_")]
        return self.binaries[arch].decode()


def shipped_crate(wheel: Path, crate: str = EXAMPLE_CRATE, package: str = EXAMPLE_PACKAGE) -> ShippedCrate:
    from khal_runtime.manifest import parse_manifest

    with zipfile.ZipFile(wheel) as zf:
        manifest = parse_manifest(zf.read(f"{package}/_khal/manifest.json"))
        c = manifest.crate(crate)
        files = {a.path: zf.read(f"{package}/{a.path}") for a in c.artifacts}
    return ShippedCrate(
        crate=crate, entries=c.entries, manifest=manifest,
        webgpu_files={a.path: files[a.path] for a in c.artifacts if a.kind in ("wgsl", "spirv")},
        binaries={a.arch: files[a.path] for a in c.artifacts if a.arch is not None},
    )


def webgpu_package(root: Path, name: str = "wgpu_example_pkg") -> Path:
    """A package holding only the WebGPU build (WGSL + SPIR-V) of the example's Slang crate, as
    the hook writes it: ``root/<name>`` (import it with ``root`` on sys.path). Taken from the wheel
    named by KHAL_TEST_EXAMPLE_WHEEL when given (no Slang compiler needed), else compiled here."""
    from khal_runtime.manifest import SCHEMA_VERSION, Crate, Manifest, SpirvStatus, Toolchain

    given = os.environ.get("KHAL_TEST_EXAMPLE_WHEEL")
    if given:
        return _webgpu_package_from_wheel(Path(given), root, name)

    p = example_slang_plan()
    out = example_crate()
    pkg = root / name
    (pkg / "_khal").mkdir(parents=True, exist_ok=True)
    for rel, data in out.webgpu_files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_bytes(data)
    crate = Crate(name=EXAMPLE_CRATE, language="slang", package_dir=f"_khal/{EXAMPLE_CRATE}",
                  sources=p.plan.slang.manifest_sources, content_hash=p.content_hash,
                  artifacts=tuple(out.webgpu_artifacts()), entries=tuple(out.entries),
                  spirv=SpirvStatus(status="built"))
    m = Manifest(schema_version=SCHEMA_VERSION, package=name, toolchain=Toolchain(hatch_khal_version="test"),
                 crates=(crate,))
    (pkg / "_khal" / "manifest.json").write_text(m.to_json())
    (pkg / "__init__.py").write_text("import khal_runtime\n\nkernels = khal_runtime.load(__name__)\n")
    return pkg


def webgpu_only(c: Any) -> Any:
    """Crate ``c`` of a built manifest as a build without its CUDA stage writes it: the WGSL /
    SPIR-V artifacts only, and the launch facts of Slang's reflection (facts from PTX need the PTX
    that backs them: the runtime refuses them without it)."""
    from khal_runtime.manifest import LaunchFacts

    entries = tuple(e if e.launch is None or e.launch.source != "ptx" else e.model_copy(update={
        "launch": LaunchFacts(source="reflection", grid_axes=e.grid_dims, block_fixed=e.fixed_block)})
        for e in c.entries)
    return c.model_copy(update={"artifacts": tuple(a for a in c.artifacts if a.kind in ("wgsl", "spirv")),
                                "entries": entries})


def _webgpu_package_from_wheel(wheel: Path, root: Path, name: str) -> Path:
    """:func:`webgpu_package` from a built example wheel: its Slang crate, WGSL / SPIR-V only."""
    from khal_runtime.manifest import SCHEMA_VERSION, Manifest, Toolchain

    shipped = shipped_crate(wheel)
    c = shipped.manifest.crate(EXAMPLE_CRATE)
    pkg = root / name
    (pkg / "_khal").mkdir(parents=True, exist_ok=True)
    for rel, data in shipped.webgpu_files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_bytes(data)
    crate = webgpu_only(c)
    m = Manifest(schema_version=SCHEMA_VERSION, package=name, toolchain=Toolchain(hatch_khal_version="test"),
                 crates=(crate,))
    (pkg / "_khal" / "manifest.json").write_text(m.to_json())
    (pkg / "__init__.py").write_text("import khal_runtime\n\nkernels = khal_runtime.load(__name__)\n")
    return pkg


def stale_slang_package(wheel: Path, root: Path, name: str = "stale_slang_pkg") -> Path:
    """The example wheel's Slang crate as it would be after its source was edited and only the
    manifest was rebuilt: another content hash, so every entry hash and symbol is new, beside the
    old (stale) cubins and PTX, whose symbols carry the old hashes. CUDA binaries only (the
    WebGPU files would be stale the same way). Needs no Slang compiler (the GPU machine)."""
    from khal_runtime import abi
    from khal_runtime.manifest import SCHEMA_VERSION, Manifest, SpirvStatus, Toolchain

    shipped = shipped_crate(wheel)
    c = shipped.manifest.crate(EXAMPLE_CRATE)
    content = hashlib.sha256(b"edited " + c.content_hash.encode()).hexdigest()
    entries = []
    for e in c.entries:
        h = abi.entry_hash(content, e.signature())
        entries.append(e.model_copy(update={
            "hash": h, "symbol": abi.symbol_for(e.name, h), "webgpu": None,
            "indirect_symbol": abi.indirect_symbol_for(e.name, h) if e.indirect_symbol else None}))
    arts = tuple(a for a in c.artifacts if a.kind in ("cubin", "ptx"))
    pkg = root / name
    with zipfile.ZipFile(wheel) as zf:
        for a in arts:
            (pkg / a.path).parent.mkdir(parents=True, exist_ok=True)
            (pkg / a.path).write_bytes(zf.read(f"{EXAMPLE_PACKAGE}/{a.path}"))
    crate = c.model_copy(update={"content_hash": content, "entries": tuple(entries), "artifacts": arts,
                                 "spirv": SpirvStatus(status="skipped", reason="KHAL_SKIP_SPIRV is set")})
    m = Manifest(schema_version=SCHEMA_VERSION, package=name, toolchain=Toolchain(hatch_khal_version="test"),
                 crates=(crate,))
    (pkg / "_khal").mkdir(parents=True, exist_ok=True)
    (pkg / "_khal" / "manifest.json").write_text(m.to_json())
    return pkg
