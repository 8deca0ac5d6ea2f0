"""Every manifest field the runtime packs, binds or dispatches with is either inside the entry hash
or re-derived from the artifact (issue #24): a manifest edited after the build is a ManifestError
naming the entry and the field, at ``verify`` and at load, never a launch with wrong numbers.

One tiny Slang crate built by the hook (PTX, one cubin, WGSL and SPIR-V) once per module; each
test copies the package, edits its manifest the way a hand (or a broken tool) would, and checks
both places. The WebGPU runs use whatever adapter wgpu-py finds (lavapipe here and in CI).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import khal_runtime
from khal_runtime import abi, backends
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import ManifestError
from khal_runtime.manifest import load_manifest
from khal_runtime.verify import check_manifest, check_symbols, read_artifact, verify_package
from tests.conftest import skip_without
from tests.helpers.build import Recorder
from tests.helpers.slang import needs_slang, write

pytestmark = needs_slang

ROOT = Path(__file__).resolve().parents[3]
PKG = "layouts_pkg"

#: two read-only buffers of one type (only their names tell them apart), a struct storage, a
#: uniform whose layout differs per target, two loose scalars of one type
SRC = """\
struct Pair { float a; float b; };
struct Params { float a; float3 v; float arr[2]; uint n; };

[shader("compute")]
[numthreads(64, 1, 1)]
void mix(uint3 t : SV_DispatchThreadID, uniform RWStructuredBuffer<float> o,
         uniform StructuredBuffer<float> x, uniform StructuredBuffer<float> z,
         uniform RWStructuredBuffer<Pair> ps, uniform ConstantBuffer<Params> p,
         uniform float s, uniform float u)
{
    uint i = t.x;
    uint n, st;
    o.GetDimensions(n, st);
    if (i >= n) return;
    o[i] = x[i] + 2.0 * z[i] + s + 100.0 * u + p.a + 3.0 * p.v.y + 5.0 * p.arr[1] + float(p.n);
    ps[i].a = ps[i].b + 1.0;
}
"""
N = 100
PAIR = np.dtype([("a", "<f4"), ("b", "<f4")])
PARAMS = {"a": 0.5, "v": [1.0, 2.0, 3.0], "arr": [4.0, 6.0], "n": 7}
S, U = 10.5, 0.25


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The crate built by the hook: ``<dir>/layouts_pkg`` with its ``_khal`` folder (its CUDA unit
    compiles with NVRTC: every test of it skips without)."""
    skip_without("needs_nvrtc")
    from hatch_khal.builder import build_packages
    from hatch_khal.cache import Cache
    from hatch_khal.config import parse_config

    root = write(tmp_path_factory.mktemp("proj"), {"k/mix.slang": SRC})
    raw = {"archs": ["sm_90"], "ptx-arch": "compute_75", "crates": [{"name": "demo", "sources": ["k/*.slang"]}]}
    _, resolved = parse_config(raw, default_package=PKG)
    (pkg,) = build_packages(root, resolved, Recorder(), cache=Cache(None)).packages
    out = tmp_path_factory.mktemp("built") / PKG
    for rel, data in pkg.files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return out


def edited(built: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the built package whose manifest entry ``mix`` went through ``edit`` (a dict)."""
    d = tmp_path / PKG
    shutil.copytree(built, d)
    path = d / "_khal" / "manifest.json"
    m = json.loads(path.read_text())
    (entry,) = m["crates"][0]["entries"]
    edit(entry)
    path.write_text(json.dumps(m, indent=1))
    return d


# ------------------------------------------------------------------------------------ the edits
def _target(e: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in e["webgpu"] if t["target"] == name)


def _param(e: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in e["params"] if p["name"] == name)


def _binding(t: dict[str, Any], param: str | None) -> dict[str, Any]:
    return next(b for b in t["bindings"] if b.get("param") == param)


def _swap(a: dict[str, Any], b: dict[str, Any], key: str) -> None:
    a[key], b[key] = b[key], a[key]


def _fields(e: dict[str, Any], target: str) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in _param(e, "p")["layouts"][target]["fields"]}


def swap_scalar_offsets(target: str) -> Callable[[dict[str, Any]], None]:
    def edit(e: dict[str, Any]) -> None:
        a, b = _target(e, target)["scalar_slots"]
        _swap(a, b, "offset")
    return edit


def swap_bindings(target: str, p: str | None = "x", q: str | None = "z") -> Callable[[dict[str, Any]], None]:
    def edit(e: dict[str, Any]) -> None:
        t = _target(e, target)
        _swap(_binding(t, p), _binding(t, q), "binding")
    return edit


def swap_uniform_offsets(target: str) -> Callable[[dict[str, Any]], None]:
    def edit(e: dict[str, Any]) -> None:
        f = _fields(e, target)
        _swap(f["a"], f["n"], "offset")
    return edit


def set_key(where: Callable[[dict[str, Any]], dict[str, Any]], key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(e: dict[str, Any]) -> None:
        where(e)[key] = value
    return edit


def wgsl_scalars_as_push_constants(e: dict[str, Any]) -> None:
    t = _target(e, "wgsl")
    t["bindings"] = [b for b in t["bindings"] if b.get("param") is not None]
    t["scalars"] = "push_constants"


def spirv_scalars_as_a_uniform_block(e: dict[str, Any]) -> None:
    t = _target(e, "spirv")
    t["bindings"].append({"group": 0, "binding": 9, "access": "uniform"})
    t["scalars"] = "uniform"


def drop_binding(e: dict[str, Any]) -> None:
    t = _target(e, "wgsl")
    t["bindings"] = [b for b in t["bindings"] if b.get("param") != "z"]


def pair_of_16_bytes(e: dict[str, Any]) -> None:
    _param(e, "ps")["element_size"] = 16


#: edits of what the WebGPU backend binds and packs with: (edit, target it hits, field named)
WEBGPU_EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "wgsl scalar offsets swapped": (swap_scalar_offsets("wgsl"), "wgsl", "webgpu.wgsl.scalar_slots (parameter 's')"),
    "spirv scalar offsets swapped": (swap_scalar_offsets("spirv"), "spirv", "webgpu.spirv.scalar_slots (parameter 's')"),
    "wgsl scalar slot size": (set_key(lambda e: _target(e, "wgsl")["scalar_slots"][1], "size", 2), "wgsl",
                              "webgpu.wgsl.scalar_slots (parameter 'u')"),
    "wgsl scalar block size": (set_key(lambda e: _target(e, "wgsl"), "scalar_block_size", 8), "wgsl",
                               "webgpu.wgsl.scalar_block_size"),
    "wgsl scalars as push constants": (wgsl_scalars_as_push_constants, "wgsl", "webgpu.wgsl.scalars"),
    "spirv scalars as a uniform block": (spirv_scalars_as_a_uniform_block, "spirv", "webgpu.spirv.scalars"),
    "wgsl storage bindings swapped": (swap_bindings("wgsl"), "wgsl", "webgpu.wgsl.bindings (parameter 'x')"),
    "spirv storage bindings swapped": (swap_bindings("spirv"), "spirv", "webgpu.spirv.bindings (parameter 'x')"),
    "wgsl scalar block and a buffer swapped": (swap_bindings("wgsl", None, "o"), "wgsl", "webgpu.wgsl.scalars"),
    "wgsl storage and uniform swapped": (swap_bindings("wgsl", "ps", "p"), "wgsl",
                                         "webgpu.wgsl.bindings (parameter 'p')"),
    "wgsl access": (set_key(lambda e: _binding(_target(e, "wgsl"), "x"), "access", "read_write"), "wgsl",
                    "webgpu.wgsl.bindings (parameter 'x')"),
    "spirv group": (set_key(lambda e: _binding(_target(e, "spirv"), "ps"), "group", 1), "spirv",
                    "webgpu.spirv.bindings (parameter 'ps')"),
    "wgsl binding dropped": (drop_binding, "wgsl", "webgpu.wgsl.bindings (parameter 'z')"),
    "wgsl uniform offsets swapped": (swap_uniform_offsets("wgsl"), "wgsl", "params.p.layouts.wgsl"),
    "spirv uniform offsets swapped": (swap_uniform_offsets("spirv"), "spirv", "params.p.layouts.spirv"),
    "wgsl uniform array stride": (set_key(lambda e: _fields(e, "wgsl")["arr"], "strides", [4]), "wgsl",
                                  "params.p.layouts.wgsl"),
    "wgsl uniform vector made a scalar": (lambda e: _fields(e, "wgsl")["v"].update(shape=[], strides=[]), "wgsl",
                                          "params.p.layouts.wgsl"),
    "wgsl uniform scalar array made float2": (lambda e: _fields(e, "wgsl")["arr"].update(shape=[2, 2], strides=[16, 4]),
                                              "wgsl", "params.p.layouts.wgsl"),
    "spirv uniform field type": (set_key(lambda e: _fields(e, "spirv")["n"], "type", "float32"), "spirv",
                                 "params.p.layouts.spirv"),
    "wgsl uniform size": (set_key(lambda e: _param(e, "p")["layouts"]["wgsl"], "size", 96), "wgsl",
                          "params.p.layouts.wgsl.size"),
    "wgsl struct storage of 16-byte records": (pair_of_16_bytes, "wgsl", "params.ps.element_size"),
    "spirv struct storage of 16-byte records": (pair_of_16_bytes, "spirv", "params.ps.element_size"),
}


def _cuda_layout(e: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in _param(e, "p")["layouts"]["cuda"]["fields"]}


def uniform_of_32_bytes(e: dict[str, Any]) -> None:
    _param(e, "p")["element_size"] = 32
    _param(e, "p")["layouts"]["cuda"]["size"] = 32


def swap_cuda_offsets(e: dict[str, Any]) -> None:
    f = _cuda_layout(e)
    _swap(f["a"], f["n"], "offset")


#: edits of what the CUDA side (and the C-struct reading on WebGPU) uses: (edit, field named); the
#: probe-checked ones are found in the PTX / cubin, the CUDA layout by the entry hash
CUDA_EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "struct storage of 16-byte records": (pair_of_16_bytes, "params.ps.element_size"),
    "struct storage aligned to 8": (set_key(lambda e: _param(e, "ps"), "element_align", 8), "params.ps.element_align"),
    "uniform of 32 bytes": (uniform_of_32_bytes, "params.p.element_size"),
    "scalar aligned to 8": (set_key(lambda e: _param(e, "s"), "element_align", 8), "params.s.element_align"),
    "CUDA layout offsets swapped": (swap_cuda_offsets, "uniforms' CUDA layouts"),
    "CUDA layout array stride": (set_key(lambda e: _cuda_layout(e)["arr"], "strides", [8]), "uniforms' CUDA layouts"),
}


def _named(problems: list[Any], field: str) -> list[Any]:
    return [p for p in problems if p.error is ManifestError and "entry 'mix'" in p.message
            and field in p.message and "rebuild" in p.message]


# ------------------------------------------------------------------------------------- verify
def test_the_unedited_package_verifies(built: Path) -> None:
    assert verify_package(built, sources=False) == []


@pytest.mark.parametrize("label", list(WEBGPU_EDITS))
def test_a_webgpu_layout_edit_fails_verify(built: Path, tmp_path: Path, label: str) -> None:
    edit, _, field = WEBGPU_EDITS[label]
    d = edited(built, tmp_path, edit)
    problems = verify_package(d, sources=False)
    assert _named(problems, field), [p.message for p in problems]


@pytest.mark.parametrize("label", list(CUDA_EDITS))
def test_a_cuda_layout_edit_fails_verify_and_the_cuda_load_check(built: Path, tmp_path: Path, label: str) -> None:
    edit, field = CUDA_EDITS[label]
    d = edited(built, tmp_path, edit)
    problems = verify_package(d, sources=False)
    assert _named(problems, field), [p.message for p in problems]
    m = load_manifest(d / "_khal" / "manifest.json")
    crate = m.crate("demo")
    if check_manifest(m):
        # the entry hash covers it: khal_runtime.load refuses the package before any backend
        with pytest.raises(ManifestError, match="uniforms' CUDA layouts"):
            khal_runtime.load(d)
        return
    # what the CUDA backend's load_module runs on the binary it picked, before cuModuleLoad
    for art in (a for a in crate.artifacts if a.kind in ("ptx", "cubin")):
        got = check_symbols(crate, art, read_artifact(d, art))
        assert _named(got, field), (art.path, [p.message for p in got])


def test_an_edited_ptx_isa_fails_verify(built: Path, tmp_path: Path) -> None:
    """The CUDA loader picks PTX by its recorded ISA version (whether the driver can JIT it)."""
    d = tmp_path / PKG
    shutil.copytree(built, d)
    path = d / "_khal" / "manifest.json"
    m = json.loads(path.read_text())
    (ptx,) = [a for a in m["crates"][0]["artifacts"] if a["kind"] == "ptx"]
    ptx["ptx_isa"] = "7.0"
    path.write_text(json.dumps(m))
    problems = [p for p in verify_package(d, sources=False) if p.error is ManifestError]
    assert problems and "artifacts.ptx_isa" in problems[0].message and "rebuild" in problems[0].message


def test_the_verify_command_names_the_field(built: Path, tmp_path: Path) -> None:
    d = edited(built, tmp_path, swap_scalar_offsets("wgsl"))
    r = subprocess.run([sys.executable, "-m", "hatch_khal", "verify", str(d)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "webgpu.wgsl.scalar_slots (parameter 's')" in r.stderr and "rebuild the package" in r.stderr, r.stderr


def test_a_manifest_hashed_before_the_cuda_layouts_were_still_loads(built: Path) -> None:
    """A package built before the CUDA layouts were hashed keeps loading; an edit of anything that
    hash covers is still refused (and so is one of the CUDA layout under the newer hash)."""
    m = load_manifest(built / "_khal" / "manifest.json")
    crate = m.crate("demo")
    (e,) = crate.entries
    old = abi.entry_hash(crate.content_hash, e.signature(layouts=False))
    assert old != e.hash  # the layout is in today's hash
    legacy = e.model_copy(update={"hash": old, "symbol": abi.symbol_for(e.name, old)})
    m_old = m.model_copy(update={"crates": (crate.model_copy(update={"entries": (legacy,)}),)})
    assert check_manifest(m_old) == []
    p0 = legacy.params[1].model_copy(update={"writable": True})
    bad = legacy.model_copy(update={"params": (legacy.params[0], p0, *legacy.params[2:])})
    m_bad = m.model_copy(update={"crates": (crate.model_copy(update={"entries": (bad,)}),)})
    assert [p.error for p in check_manifest(m_bad)] == [ManifestError]


# --------------------------------------------------------------------------- load, on WebGPU

@pytest.fixture
def webgpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("KHAL_BACKEND", "webgpu")
    backends.reset()
    yield monkeypatch
    backends.reset()


def _args() -> tuple[Any, ...]:
    x = np.arange(N, dtype=np.float32)
    z = np.full(N, 1000.0, dtype=np.float32)
    ps = np.zeros(N, dtype=PAIR)
    ps["b"] = np.arange(N)
    return (DeviceBuffer.zeros(N, np.float32), DeviceBuffer.from_numpy(x), DeviceBuffer.from_numpy(z),
            DeviceBuffer.from_numpy(ps), dict(PARAMS), S, U)


def _want() -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(N, dtype=np.float32)
    o = x + np.float32(2000.0) + np.float32(S + 100.0 * U + 0.5 + 3.0 * 2.0 + 5.0 * 6.0 + 7.0)
    return o, np.arange(N, dtype=np.float32) + 1


@pytest.mark.webgpu
@pytest.mark.parametrize("target", ["wgsl", "spirv"])
def test_the_unedited_package_loads_and_computes_on_webgpu(built: Path, webgpu: Any, target: str) -> None:
    webgpu.setenv("KHAL_WEBGPU_SHADER", target)
    ks = khal_runtime.load(built)
    o, x, z, ps, p, s, u = _args()
    ks.mix(N, o, x, z, ps, p, s, u)
    want_o, want_a = _want()
    np.testing.assert_allclose(o.to_numpy(), want_o, rtol=1e-6)
    np.testing.assert_array_equal(ps.to_numpy()["a"], want_a)


@pytest.mark.webgpu
@pytest.mark.parametrize("label", list(WEBGPU_EDITS))
def test_a_webgpu_layout_edit_is_refused_at_load(built: Path, tmp_path: Path, webgpu: Any, label: str) -> None:
    edit, target, field = WEBGPU_EDITS[label]
    webgpu.setenv("KHAL_WEBGPU_SHADER", target)
    ks = khal_runtime.load(edited(built, tmp_path, edit))
    o, x, z, ps, p, s, u = _args()
    if label.endswith("16-byte records"):  # the typed call takes what the manifest says
        ps = DeviceBuffer.from_numpy(np.zeros(N, dtype=[("a", "<f4"), ("b", "<f4"), ("pad", "<f8")]))
    with pytest.raises(ManifestError) as info:
        ks.mix(N, o, x, z, ps, p, s, u)
    msg = str(info.value)
    assert "entry 'mix'" in msg and field in msg and "rebuild the package" in msg, msg
    assert not o.to_numpy().any()  # nothing ran


# ------------------------------------------------------------------------------ the readers alone
def test_the_wgsl_reader_follows_the_layout_rules() -> None:
    from khal_runtime.shaders import read_wgsl

    text = """
    // a comment with var<uniform> nothing : u32;
    struct In_0 { @align(8) q_0 : vec2<f32>, k_0 : array<u32, i32(3)>, };
    struct Big_std140_0 { a_0 : f32, @size(12) b_0 : f32, m_0 : mat2x3<f32>, i_0 : In_0, };
    @group(1) @binding(2) var<uniform> entryPointParams_big_0 : Big_std140_0;
    @binding(0) @group(0) var<storage, read_write> entryPointParams_hits_0 : array<atomic<u32>>;
    @binding(1) @group(0) var<storage, read> entryPointParams_els_0 : array<In_0>;
    """
    facts = read_wgsl(text).by_param()
    big = facts["big"]
    assert (big.group, big.binding, big.access) == (1, 2, "uniform")
    at = {(lf.path, lf.offset) for lf in big.leaves}
    # a 0, b 4 (@size 12), m 16 (mat2x3: two vec3 columns, stride 16), i 48 (align 8): q 48, k 56
    assert {(("a",), 0), (("b",), 4), (("m", 0, 0), 16), (("m", 1, 2), 40), (("i", "q", 1), 52),
            (("i", "k", 2), 64)} <= at
    assert big.size == 80 and big.end == 68
    assert facts["hits"].stride == 4 and facts["hits"].access == "read_write"
    assert facts["els"].stride == 24 and facts["els"].access == "read"


def test_unreadable_shaders_are_artifact_errors() -> None:
    from khal_runtime.binaries import BinaryFormatError
    from khal_runtime.shaders import read_shader

    for data, kind in ((b"\x03\x02\x23\x07" * 3, "spirv"), (b"\xff\xfe", "wgsl"),
                       (b"@group(0) @binding(0) var<uniform> entryPointParams_p_0 : Missing_0;", "wgsl"),
                       (b"@group(0) @binding(0) var<storage, read> stranger : array<f32>;", "wgsl")):
        with pytest.raises(BinaryFormatError):
            read_shader(data, kind)


def test_a_tampered_wgsl_with_its_sha256_updated_is_refused(built: Path, tmp_path: Path) -> None:
    """Bindings swapped in the WGSL itself (the manifest's sha256 and size updated to match): the
    manifest no longer describes the shader, so verify says so."""
    import hashlib

    d = tmp_path / PKG
    shutil.copytree(built, d)
    path = d / "_khal" / "manifest.json"
    m = json.loads(path.read_text())
    (art,) = [a for a in m["crates"][0]["artifacts"] if a["kind"] == "wgsl"]
    f = d / art["path"]
    text = f.read_text()
    text = text.replace("@binding(2) @group(0) var<storage, read> entryPointParams_x_0",
                        "@binding(9) @group(0) var<storage, read> entryPointParams_x_0")
    assert "@binding(9)" in text
    f.write_text(text)
    art["sha256"], art["size"] = hashlib.sha256(text.encode()).hexdigest(), len(text.encode())
    path.write_text(json.dumps(m))
    problems = verify_package(d, sources=False)
    assert _named(problems, "webgpu.wgsl.bindings (parameter 'x')"), [p.message for p in problems]
