"""The example wheel's Slang crate (README command 1's package, built once per session): CUDA
binaries, WGSL and SPIR-V for every entry with no GPU and no toolkit; the KHAL_SKIP_SPIRV build of
the same crate; inspect / verify of its WebGPU artifacts; and its kernels run through khal_runtime
on WebGPU (lavapipe) from the wheel. The manifest-against-artifact checks of every entry are in
test_slang_layouts.py ("wheel")."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from hatch_khal.config import DEFAULT_ARCHS
from hatch_khal.nvrtc import supported_archs
from khal_runtime.binaries import khal_symbols, read_binary, webgpu_entry_points
from khal_runtime.manifest import parse_manifest

from tests.helpers.slang import EXAMPLE_CRATE, EXAMPLE_PACKAGE, ROOT, needs_slang, needs_slang_or_wheel
from tests.conftest import EXAMPLE, build_env, run

pytestmark = needs_slang_or_wheel
PKG = EXAMPLE_PACKAGE
CRATES_HEADER = "[[tool.hatch.build.targets.wheel.hooks.khal.crates]]"


def _wheel_files(whl: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(whl) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def test_the_slang_crate_builds_every_target_without_gpu_or_toolkit(example_wheel: Path) -> None:
    files = _wheel_files(example_wheel)
    m = parse_manifest(files[f"{PKG}/_khal/manifest.json"])
    c = m.crate(EXAMPLE_CRATE)
    assert (c.language, c.spirv.status) == ("slang", "built") and c.prebuilt is None
    assert m.toolchain.slang_version and m.toolchain.nvrtc_version
    cubins = {a.arch for a in c.artifacts if a.kind == "cubin"}
    assert cubins == {a for a in DEFAULT_ARCHS if int(a[3:]) in supported_archs()}
    assert [a.arch for a in c.artifacts if a.kind == "ptx"] == ["compute_75"]
    for a in c.artifacts:
        data = files[f"{PKG}/{a.path}"]
        if a.kind in ("ptx", "cubin"):
            assert set(khal_symbols(read_binary(data))) == {e.name for e in c.entries} | \
                {f"{e.name}_indirect" for e in c.entries}
        else:
            assert webgpu_entry_points(data, a.kind) == (c.entry(a.entry or "").symbol,)
    webgpu = sorted((a.entry, a.kind) for a in c.artifacts if a.kind in ("wgsl", "spirv"))
    assert webgpu == sorted((e.name, k) for e in c.entries for k in ("wgsl", "spirv"))
    # the CUDA C++ crates beside it build no WebGPU stage
    assert {x.spirv.status for x in m.crates if x.name != EXAMPLE_CRATE} == {"not_applicable"}


def _slang_only_project(dest: Path) -> Path:
    """The example with its Slang crate alone (same package, kernels and hook options)."""
    text = (EXAMPLE / "pyproject.toml").read_text()
    head, *blocks = text.split(CRATES_HEADER)
    (block,) = [b for b in blocks if f'name = "{EXAMPLE_CRATE}"' in b]
    dest.mkdir(parents=True)
    (dest / "pyproject.toml").write_text(head + CRATES_HEADER + block)
    shutil.copytree(EXAMPLE / "kernels" / "slang", dest / "kernels" / "slang")
    shutil.copytree(EXAMPLE / PKG, dest / PKG, ignore=shutil.ignore_patterns("_khal", "__pycache__"))
    shutil.copy(EXAMPLE / "README.md", dest / "README.md")
    return dest


@needs_slang
def test_khal_skip_spirv_builds_the_same_crate_without_webgpu_files(
        example_wheel: Path, session_cache: Path, tmp_path: Path) -> None:
    """KHAL_SKIP_SPIRV=1: the same entries, hashes and CUDA binaries, no WGSL / SPIR-V (one cubin
    arch to keep it short: NVRTC's outputs come from the session build's cache)."""
    proj = _slang_only_project(tmp_path / "proj")
    env = build_env(session_cache, KHAL_SKIP_SPIRV="1", KHAL_CUDA_ARCHS="sm_90")
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
         str(tmp_path / "dist"), str(proj)], env=env)
    (whl,) = (tmp_path / "dist").glob("*.whl")
    skipped, full = _wheel_files(whl), _wheel_files(example_wheel)
    assert not any(n.endswith((".wgsl", ".spv")) for n in skipped)
    m = parse_manifest(skipped[f"{PKG}/_khal/manifest.json"])
    (c,) = m.crates
    full_c = parse_manifest(full[f"{PKG}/_khal/manifest.json"]).crate(EXAMPLE_CRATE)
    assert (c.spirv.status, c.spirv.reason) == ("skipped", "KHAL_SKIP_SPIRV is set")
    def cuda_facts(entries):  # type: ignore[no-untyped-def]  # what a CUDA launch reads of each entry
        return [(e.name, e.hash, e.block_size, [(p.name, p.kind, p.element_type, p.element_size, p.element_align,
                                                  p.writable, (p.layouts or {}).get("cuda")) for p in e.params])
                for e in entries]

    assert cuda_facts(c.entries) == cuda_facts(full_c.entries)
    assert all(e.webgpu is None for e in c.entries)
    assert all(set(p.layouts or {}) <= {"cuda"} for e in c.entries for p in e.params)
    assert sorted((a.kind, a.arch) for a in c.artifacts) == [("cubin", "sm_90"), ("ptx", "compute_75")]
    for a in c.artifacts:  # byte for byte the full build's
        assert skipped[f"{PKG}/{a.path}"] == full[f"{PKG}/{a.path}"], a.path
    assert "verify: OK" in run([sys.executable, "-m", "hatch_khal", "verify", str(whl)]).stdout


def test_cli_inspect_shows_language_webgpu_stage_and_entry_points(example_wheel: Path) -> None:
    out = run([sys.executable, "-m", "hatch_khal", "inspect", str(example_wheel)]).stdout
    c = parse_manifest(_wheel_files(example_wheel)[f"{PKG}/_khal/manifest.json"]).crate(EXAMPLE_CRATE)
    assert f"crate {EXAMPLE_CRATE}: Slang, {len(c.sources)} source file(s)" in out
    assert "WGSL/SPIR-V built" in out and "crate core: CUDA C++" in out and "not_applicable (CUDA C++ source)" in out
    for e in c.entries:
        for t in e.webgpu or ():
            assert f"      {t.target:5} entry point {e.symbol}  " in out and t.path in out
    assert "scalars in push constants" in out and "scalars in uniform" in out


def test_cli_verify_catches_a_wgsl_entry_point_of_another_hash(example_wheel: Path, tmp_path: Path) -> None:
    """A WGSL file whose sha256 the manifest agrees with, but whose entry point carries another
    entry hash: verify names the entry, the expected entry point and what the shader has."""
    import hashlib

    files = _wheel_files(example_wheel)
    name = f"{PKG}/_khal/manifest.json"
    m = json.loads(files[name])
    crate = next(c for c in m["crates"] if c["name"] == EXAMPLE_CRATE)
    art = next(a for a in crate["artifacts"] if a["kind"] == "wgsl" and a["entry"] == "saxpy_shared")
    entry = next(e for e in crate["entries"] if e["name"] == "saxpy_shared")
    other = "0123456789abcdef"
    wgsl = files[f"{PKG}/{art['path']}"].replace(entry["symbol"].encode(), f"saxpy_shared_khal_{other}".encode())
    assert wgsl != files[f"{PKG}/{art['path']}"]
    files[f"{PKG}/{art['path']}"] = wgsl
    art.update(sha256=hashlib.sha256(wgsl).hexdigest(), size=len(wgsl))  # the manifest agrees with the file
    files[name] = json.dumps(m).encode()
    bad = tmp_path / example_wheel.name
    with zipfile.ZipFile(bad, "w") as zf:
        for n, data in files.items():
            zf.writestr(n, data)
    proc = run([sys.executable, "-m", "hatch_khal", "verify", str(bad)], check=False)
    assert proc.returncode == 1
    assert (f"entry 'saxpy_shared' (crate '{EXAMPLE_CRATE}') in {art['path']}: the manifest expects entry point "
            f"{entry['symbol']}, the WGSL has saxpy_shared_khal_{other}") in proc.stderr
    assert proc.stderr.count("FAIL ") == 1  # the SPIR-V of the same entry is still fine


RUN_ON_WEBGPU = textwrap.dedent("""\
    import numpy as np
    import khal_runtime
    from khal_runtime import DeviceBuffer as B
    import example_shader_pkg as ex
    from example_shader_pkg import reference as R, slang_reference as S

    K = ex.kernels
    # CUDA (--fmad=false): bit for bit; WebGPU: within a few ulps (its compilers may fuse a*b+c)
    ulps = 0 if khal_runtime.backend_status().backend == "cuda" else S.WEBGPU_ULPS
    rng = np.random.default_rng(5)
    x = rng.standard_normal(3000).astype(np.float32)
    y = rng.standard_normal(3000).astype(np.float32)
    Y = B.from_numpy(y)
    K.saxpy_shared(3000, Y, B.from_numpy(x), 1.7)
    assert S.matches(Y.to_numpy(), S.saxpy_shared(x, y, 1.7), ulps)

    keys = rng.integers(0, 2**32, size=5000, dtype=np.uint32)
    total = B.from_numpy(np.array([7], np.uint32))
    K.sum_u32(5000, B.from_numpy(keys), total)
    assert int(total.to_numpy()[0]) == S.sum_u32(keys, 7)
    bins = B.from_numpy(np.zeros(256, np.uint32))
    K.histogram256(5000, B.from_numpy(keys), bins, 8)
    assert np.array_equal(bins.to_numpy(), S.histogram256(keys, 8))

    p = S.Affine((1.5, -2.0, 0.25, 3.0), (0.5, -0.25, 0.125), 0.75, 3, 0x3FF, (0.1, -0.2))
    yy, kk = B.from_numpy(np.zeros(200, np.float32)), B.from_numpy(np.zeros(200, np.int32))
    xs = x[:200].copy()
    K.affine(200, B.from_numpy(xs), yy, kk, p, 1.25, -40, 150)  # the CUDA-layout struct, repacked to std140
    want_y, want_k = S.affine(xs, p, 1.25, -40, 150)
    assert np.array_equal(kk.to_numpy(), want_k) and S.matches(yy.to_numpy(), want_y, ulps)
    # the same struct as a dict of its fields: packed per backend from the manifest's layouts
    fields = dict(scale=(1.5, -2.0, 0.25, 3.0), shift=(0.5, -0.25, 0.125), bias=0.75, step=3, mask=0x3FF,
                  taps=(0.1, -0.2))
    yy2, kk2 = B.from_numpy(np.zeros(200, np.float32)), B.from_numpy(np.zeros(200, np.int32))
    K.affine(200, B.from_numpy(xs), yy2, kk2, fields, 1.25, -40, 150)
    assert np.array_equal(kk2.to_numpy(), want_k) and np.array_equal(yy2.to_numpy(), yy.to_numpy())

    # GetDimensions sees the element count of a slice (264 of 1000: 1000 threads, y a view at an
    # offset of 256 bytes, aligned for WebGPU): nothing outside the slice is written
    big, ones = B.from_numpy(np.zeros(1000, np.float32)), B.from_numpy(np.ones(1000, np.float32))
    K.saxpy_shared(1000, big[64:328], ones, 2.0)
    got = big.to_numpy()
    assert (got[64:328] == 2.0).all() and not got[:64].any() and not got[328:].any(), np.flatnonzero(got)

    parts = R.make_particles(1000, seed=4)
    sim = ex.SimParams(0.01, -9.81, 0.5, 900)
    buf = B.from_numpy(parts)
    K.slang_integrate(1000, buf, sim)
    K.slang_collide_ground(1000, buf, sim)
    want = S.collide_ground(S.integrate(parts, sim), sim)
    assert S.matches(buf.to_numpy(), want, ulps)
    alive = B.from_numpy(np.zeros(1, np.uint32))
    K.slang_count_active(1000, buf, sim, alive)  # counts over the first sim.n = 900 only
    assert int(alive.to_numpy()[0]) == R.count_active(buf.to_numpy(), sim) > 0
    print("OK", khal_runtime.backend_status().backend)
    """)


@pytest.mark.parametrize("backend", ["webgpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_example_slang_kernels_run_from_the_wheel(example_site: Path, tmp_path: Path, backend: str) -> None:
    """Through the public API, one script for both backends, against the NumPy references: on
    WebGPU (lavapipe here, the H200 through Vulkan) from the wheel's WGSL and its manifest's bindings
    and layouts, within WEBGPU_ULPS (drivers may fuse a*b+c; integers exact); on CUDA (the GPU
    machine) from its cubins / PTX, built with --fmad=false: bit for bit. Also: a uniform given as a
    dict of fields, ``GetDimensions`` of a slice (its count, not the allocation's) and
    ``slang_count_active``."""
    if backend == "webgpu":
        pytest.importorskip("wgpu")
    env = dict(os.environ, KHAL_BACKEND=backend,
               PYTHONPATH=os.pathsep.join([str(example_site), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("XDG_RUNTIME_DIR", str(tmp_path))
    proc = run([sys.executable, "-c", RUN_ON_WEBGPU], env=env, cwd=tmp_path, check=False)
    if backend == "webgpu" and proc.returncode and "BackendUnavailableError" in proc.stderr:
        pytest.skip(f"no WebGPU adapter: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith(f"OK {backend}")
