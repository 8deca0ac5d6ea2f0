"""Issue #24 parts 2 and 3 on the CPU: launch geometry from the compiled kernel.

Which grid an explicit launch may use, whether it may choose its block, and whether an entry keeps
its indirect (persistent-grid) variant come from what the compiled kernel reads: the geometry
special registers of its PTX, through every function it calls, inline asm included (and, for
Slang, numthreads). A kernel that reads ``%ctaid.y`` takes a 2-D grid whatever its marker says; a
kernel whose ids do not fold the compiled block (hatch-khal's ``KHAL_GLOBAL_ID`` and kin, tagged
``khal:fold`` in the PTX) takes any block within its launch bounds; an indirect variant judged
wrong is in no binary. The facts are not in the entry hash, so they are re-derived from the
shipped PTX at verify and at load: a manifest that disagrees is refused, named.

The package is tests/packages/geometry_kernels_pkg (its GPU half: tests/runtime/cuda/test_geometry_kernels_gpu.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from khal_runtime import abi
from khal_runtime.binaries import ptx_kernel_reads, read_binary
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import ArgumentValueError, HashMismatchError, KhalError, ManifestError
from khal_runtime.manifest import Manifest
from khal_runtime.verify import verify_package

from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels  # noqa: F401
from tests.helpers.paths import PACKAGES
from tests.conftest import SESSION_ENV

GEO_PKG = PACKAGES / "geometry_kernels_pkg"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV and k != "KHAL_CACHE_DIR":
            monkeypatch.delenv(k)


@pytest.fixture(scope="module")
def geo_build(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Any:
    """(manifest, package dir, files) of tests/packages/geometry_kernels_pkg built here (sm_90 + PTX)."""
    from tests.helpers.build import build_test_package

    m, out, _rep, files = build_test_package(GEO_PKG, tmp_path_factory.mktemp("geo"), "khal_geometry_kernels",
                                             session_cache)
    return m, out, files


def _ptx(m: Manifest, files: dict[str, bytes], crate: str) -> bytes:
    (art,) = [a for a in m.crate(crate).artifacts if a.kind == "ptx"]
    return files[art.path]


# =============================================================================================
# the PTX reader: calls followed, inline asm read, the hook's own asm told apart
# =============================================================================================

PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.func (.param .b32 r) _Z6helperv()
{
	.reg .b32 %r<2>;
	// begin inline asm
	mov.u32 %r1, %ctaid.y;
	// end inline asm
	st.param.b32 [r], %r1;
	ret;
}
.visible .entry k(.param .u64 p)
{
	.reg .b32 %r<4>;
	.reg .b64 %rd<3>;
	mov.u32 %r1, %tid.x;
	// begin inline asm
	mul.wide.u32 %rd1, %r1, 128; // khal:fold.x
	// end inline asm
	call.uni (retval0), _Z6helperv, ();
	ret;
}
.visible .entry loop(.param .u64 p)
{
	.reg .b32 %r<4>;
	// begin inline asm
	mov.u32 %r1, %ctaid.x; // khal:loop
	// end inline asm
	// begin inline asm
	mov.u32 %r2, %nctaid.x; // khal:loop
	// end inline asm
	mov.u32 %r3, %ntid.x;
	ret;
}
"""


def test_ptx_reads_follow_calls_into_inline_asm() -> None:
    got = ptx_kernel_reads(PTX)
    k = got["k"]
    # %ctaid.y is read by inline asm of a function the kernel calls: a 2-D kernel
    assert k.reads == (("ctaid.y", "_Z6helperv"), ("tid.x", "k")) and k.grid_axes == 2
    assert k.folds == ("x",)
    # the hook's own persistent-grid asm (khal:loop) is not the body's reading
    assert got["loop"].registers == ("ntid.x",) and got["loop"].grid_axes == 1 and got["loop"].folds == ()


# =============================================================================================
# the build: facts from the PTX, wrong indirect variants in no binary
# =============================================================================================

#: entry -> (grid axes, block fixed, keeps its indirect variant) as the compiled kernel has them
FACTS = {
    "row_bias": (2, False, False),  # 1-D marker, a templated helper reads blockIdx.y / threadIdx.y
    "transpose": (2, False, False),  # PBA-style helper: the same
    "sosfilt": (1, False, True),  # block 1024 in the marker; threadIdx.x / blockIdx.x / blockDim.x apart
    "axpb_strided": (1, False, True),  # a grid-stride loop on blockDim / gridDim
    "block_ids": (1, False, False),  # the block id through inline PTX in a helper
    "block_ids_helper": (1, False, False),  # the block id through blockIdx in a helper
    "folded": (1, True, True),  # KHAL_GLOBAL_ID: folds the compiled block in; x only
}


def test_build_records_launch_facts_from_the_ptx(geo_build: Any) -> None:
    m, _, _ = geo_build
    signal = m.crate("signal")
    for name, (axes, fixed, indirect) in FACTS.items():
        e = signal.entry(name)
        assert e.launch is not None and e.launch.source == "ptx", name
        assert (e.launch.grid_axes, e.launch.block_fixed, e.indirect_symbol is not None) == (axes, fixed, indirect), name
        assert e.grid_dims == 1 and e.fixed_block  # the markers' (hashed) facts are as written
        assert (e.launch_dims, e.launch_block_fixed) == (axes, fixed)
    sos_facts = signal.entry("sosfilt").launch
    assert sos_facts is not None and "ntid.x" in sos_facts.reads
    # the inline-PTX block id is a grid read like blockIdx.x: the variant is left out, saying why
    assert "reads blockIdx.x" in (signal.entry("block_ids").indirect_reason or "")
    assert "_block_of_helper" in (signal.entry("block_ids_helper").indirect_reason or "")
    # Slang: numthreads(10, 10, 1) is a 2-D entry (the typed call's shape), its block fixed
    s = m.crate("slang2d").entry("saxpy2d")
    assert (s.block_size, s.grid_dims, s.launch_dims, s.launch_block_fixed) == ((10, 10, 1), 2, 2, True)
    assert s.launch is not None and s.launch.source == "ptx"


def test_wrong_indirect_variants_are_in_no_binary(geo_build: Any) -> None:
    """Issue #24 part 3: a variant the build judged wrong is not shipped at all (PTX nor cubin)."""
    m, _, files = geo_build
    signal = m.crate("signal")
    binaries = [read_binary(files[a.path]) for a in signal.artifacts if a.kind in ("ptx", "cubin")]
    assert sorted(b.kind for b in binaries) == ["cubin", "ptx"]
    for name, (_, _, indirect) in FACTS.items():
        e = signal.entry(name)
        sym = abi.indirect_symbol_for(e.name, e.hash)
        assert all((sym in b.functions) == indirect for b in binaries), name
        assert all(e.symbol in b.functions for b in binaries)


@pytest.mark.needs_nvrtc
def test_a_build_without_ptx_keeps_the_scanned_facts(tmp_path: Path, session_cache: Path) -> None:
    """ptx-arch = "none": nothing to read the facts from, so the hashed (scanned) ones stand: the
    1-D entry whose helper reads blockIdx.y is still refused a 2-D grid there, and the variants the
    text check refuses are in no cubin."""
    from hatch_khal.builder import build_packages
    from hatch_khal.cache import Cache
    from hatch_khal.config import parse_config

    from tests.helpers.build import Recorder, manifest_of, tomllib  # type: ignore[attr-defined]

    root = tmp_path / "p"
    shutil.copytree(GEO_PKG, root)
    text = (root / "pyproject.toml").read_text().replace('ptx-arch = "compute_90"', 'ptx-arch = "none"')
    text = text[:text.index('[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "slang2d"')]
    raw = tomllib.loads(text)["tool"]["hatch"]["build"]["targets"]["wheel"]
    rep = Recorder()
    result = build_packages(root, parse_config(raw["hooks"]["khal"], default_package="khal_geometry_kernels")[1],
                            rep, cache=Cache(session_cache, rep.warn))
    m, files = manifest_of(result)  # type: ignore[no-untyped-call]
    signal = m.crate("signal")
    e = signal.entry("row_bias")
    assert e.launch is not None and (e.launch.source, e.launch_dims, e.launch_block_fixed) == ("scan", 1, True)
    (cubin,) = [read_binary(files[a.path]) for a in signal.artifacts]
    helper = signal.entry("block_ids_helper")  # blockIdx outside an entry body: the text check says no
    assert helper.indirect_symbol is None and "cannot check" in (helper.indirect_reason or "")
    assert abi.indirect_symbol_for(helper.name, helper.hash) not in cubin.functions


# =============================================================================================
# the runtime (fake driver, the build's own PTX): what each kernel accepts
# =============================================================================================


def _kernels(fake: FakeDriver, tmp_path: Path, geo_build: Any, crate: str = "signal") -> Any:
    m, _, files = geo_build
    c = m.crate(crate)
    entries = [e.model_copy(update={"webgpu": None}) for e in c.entries]
    if crate == "slang2d":
        entries = [e.model_copy(update={"params": tuple(p.model_copy(update={"layouts": None}) for p in e.params)})
                   for e in entries]
    ks = fake_kernels(fake, tmp_path, entries, crate=crate, content=c.content_hash, ptx=_ptx(m, files, crate),
                      language=c.language)
    return getattr(ks, crate)


def _f32(n: int, addr: int = 0x1000) -> DeviceBuffer:
    return DeviceBuffer(addr, n, "float32", 0)


def test_a_1d_marker_whose_helper_reads_y_takes_a_2d_launch(fake: FakeDriver, tmp_path: Path, geo_build: Any) -> None:
    """cuSignal / CuPy / PBA style: launched as their authors launch them (refused before #24 with
    "grid (3, 3, 1) has more than 1 dimension(s), but the entry's thread ids use x only")."""
    ks = _kernels(fake, tmp_path, geo_build)
    a, b, out = _f32(48 * 48), _f32(48, 0x9000), _f32(48 * 48, 0x20000)
    ks.row_bias.launch((3, 3), (16, 16), a, b, out, 48, 48, 2.0)
    assert (fake.launches[-1]["grid"], fake.launches[-1]["block"]) == ((3, 3, 1), (16, 16, 1))
    src, dst = DeviceBuffer(0x1000, 64 * 32, "uint32", 0), DeviceBuffer(0x40000, 64 * 32, "uint32", 0)
    ks.transpose.launch((2, 4), (32, 8), src, dst, 64, 32)
    assert (fake.launches[-1]["grid"], fake.launches[-1]["block"]) == ((2, 4, 1), (32, 8, 1))
    # within its launch bounds only (the marker's 256 threads)
    with pytest.raises(ArgumentValueError, match=r"block \(32, 32, 1\) has 1024 threads; .*at most 256"):
        ks.row_bias.launch((3, 3), (32, 32), a, b, out, 48, 48, 2.0)
    # no kernel reads a z block id: a 3-D grid is still refused
    with pytest.raises(ArgumentValueError, match=r"grid \(3, 3, 2\) has more than 2 dimension\(s\)"):
        ks.row_bias.launch((3, 3, 2), (16, 16), a, b, out, 48, 48, 2.0)
    # the typed call keeps the marker's shape: k(n) for a 1-D marker
    ks.row_bias(256, a, b, out, 48, 48, 2.0)
    assert fake.launches[-1]["grid"] == (1, 1, 1) and fake.launches[-1]["block"] == (256, 1, 1)


def test_block_driven_bodies_take_the_block_given(fake: FakeDriver, tmp_path: Path, geo_build: Any) -> None:
    """cuSignal's sosfilt: one block per signal, as many threads as sections (refused before #24
    as "not the block size the entry was compiled for"); a grid-stride loop on blockDim alike."""
    ks = _kernels(fake, tmp_path, geo_build)
    sos, x = _f32(8 * 6), _f32(4 * 100, 0x9000)
    ks.sosfilt.launch(4, (8, 1, 1), sos, x, 100)
    assert (fake.launches[-1]["grid"], fake.launches[-1]["block"]) == ((4, 1, 1), (8, 1, 1))
    ks.sosfilt.launch(4, 8, sos, x, 100)
    assert fake.launches[-1]["block"] == (8, 1, 1)
    ks.axpb_strided.launch(7, 64, x, 2.0, 1.0)
    assert (fake.launches[-1]["grid"], fake.launches[-1]["block"]) == ((7, 1, 1), (64, 1, 1))
    with pytest.raises(ArgumentValueError, match=r"at most 1024 threads"):
        ks.sosfilt.launch(4, (64, 32, 1), sos, x, 100)


def test_kernels_that_assume_the_compiled_geometry_are_still_refused(fake: FakeDriver, tmp_path: Path,
                                                                      geo_build: Any) -> None:
    ks = _kernels(fake, tmp_path, geo_build)
    x = _f32(1000)
    with pytest.raises(ArgumentValueError, match=r"block \(64, 1, 1\) is not the block size the entry was compiled "
                                                 r"for \(128, 1, 1\)"):
        ks.folded.launch(8, 64, x, 1.0)  # KHAL_GLOBAL_ID folds 128 in
    ks.folded.launch(8, 128, x, 1.0)
    assert fake.launches[-1]["block"] == (128, 1, 1)
    with pytest.raises(ArgumentValueError, match=r"grid \(2, 2, 1\) has more than 1 dimension\(s\), but the "
                                                 r"entry's thread ids use x only"):
        ks.folded.launch((2, 2), None, x, 1.0)
    with pytest.raises(ArgumentValueError, match=r"use x only"):
        ks.axpb_strided.launch((2, 2), 64, x, 2.0, 1.0)  # reads no y block id
    with pytest.raises(ArgumentValueError, match=r"use x only"):
        ks.sosfilt.launch((2, 2), 8, _f32(48), x, 10)


def test_an_inline_ptx_block_id_has_no_indirect_variant(fake: FakeDriver, tmp_path: Path, geo_build: Any) -> None:
    """Before #24 the inline-asm read was skipped: the variant shipped, and dispatch_indirect read
    the persistent block's id instead of the group's."""
    ks = _kernels(fake, tmp_path, geo_build)
    count = DeviceBuffer(0x2000, 1, "uint32", 0)
    out = DeviceBuffer(0x1000, 64, "uint32", 0)
    for name in ("block_ids", "block_ids_helper"):
        with pytest.raises(KhalError, match=rf"entry signal\.{name} has no indirect \(persistent-grid\) variant: code it "
                                            r"runs reads blockIdx\.x"):
            getattr(ks, name).dispatch_indirect(count, out)
    fake.host_words[0x2000] = 5
    ks.block_ids.dispatch_indirect(count, out, host_read=True)
    assert fake.launches[-1]["grid"] == (5, 1, 1)


def test_slang_numthreads_10x10_is_a_2d_entry(fake: FakeDriver, tmp_path: Path, geo_build: Any) -> None:
    """``[numthreads(10, 10, 1)]``: k((nx, ny)) and a 2-D launch (both refused before #24); the block
    stays numthreads's."""
    ks = _kernels(fake, tmp_path, geo_build, "slang2d")
    a, out = _f32(25 * 15), _f32(25 * 15, 0x9000)
    ks.saxpy2d((25, 15), a, out, 25, 15, 2.0)
    assert (fake.launches[-1]["grid"], fake.launches[-1]["block"]) == ((3, 2, 1), (10, 10, 1))
    ks.saxpy2d.launch((3, 2), None, a, out, 25, 15, 2.0)
    assert fake.launches[-1]["grid"] == (3, 2, 1)
    with pytest.raises(ArgumentValueError, match="not the block size the entry was compiled for"):
        ks.saxpy2d.launch((3, 2), (5, 5, 1), a, out, 25, 15, 2.0)


# =============================================================================================
# tampering: the facts are re-derived from the shipped PTX at verify and at load
# =============================================================================================


def _tampered(geo_build: Any, tmp_path: Path, edit: Any) -> Path:
    _, out, _ = geo_build
    pkg = tmp_path / "khal_geometry_kernels"
    shutil.copytree(out, pkg)
    path = pkg / "_khal" / "manifest.json"
    doc = json.loads(path.read_text())
    crate = next(c for c in doc["crates"] if c["name"] == "signal")
    edit(crate, {e["name"]: e for e in crate["entries"]})
    path.write_text(json.dumps(doc))
    return pkg


def _facts(name: str, **kw: Any) -> Any:
    def edit(crate: dict[str, Any], entries: dict[str, Any]) -> None:
        entries[name]["launch"].update(kw)
    return edit


def _drop_ptx(crate: dict[str, Any], entries: dict[str, Any]) -> None:
    crate["artifacts"] = [a for a in crate["artifacts"] if a["kind"] != "ptx"]


def _readd_indirect(crate: dict[str, Any], entries: dict[str, Any]) -> None:
    e = entries["block_ids"]
    e["indirect_symbol"] = abi.indirect_symbol_for(e["name"], e["hash"])
    del e["indirect_reason"]


@pytest.mark.parametrize("edit, error, match", [
    (_facts("folded", block_fixed=False), ManifestError, r"entry 'folded' \(crate 'signal'\): the manifest's launch "
     r"facts are not the shipped PTX's: block_fixed False \(the PTX says True\)"),
    (_facts("folded", grid_axes=2), ManifestError, r"entry 'folded' .*grid_axes 2 \(the PTX says 1\)"),
    (_facts("sosfilt", reads=["ctaid.x", "tid.x"]), ManifestError, r"entry 'sosfilt' .*reads \('ctaid\.x', 'tid\.x'\)"),
    (_drop_ptx, ManifestError, r"launch facts from PTX, but the crate ships no PTX to back them"),
    (_readd_indirect, HashMismatchError, r"entry 'block_ids' \(crate 'signal'\): indirect-dispatch kernel "
     r"'block_ids_indirect_khal_[0-9a-f]{16}' is missing from"),
], ids=["block_fixed", "grid_axes", "reads", "no-ptx", "indirect-readded"])
def test_tampered_launch_facts_are_refused_at_verify_and_at_load(fake: FakeDriver, tmp_path: Path, geo_build: Any,
                                                                 edit: Any, error: type[KhalError], match: str) -> None:
    import khal_runtime

    pkg = _tampered(geo_build, tmp_path, edit)
    problems = [p for p in verify_package(pkg) if p.crate == "signal"]
    assert problems and all(p.error is error for p in problems), problems
    assert any(re.search(match, p.message) for p in problems), [p.message for p in problems]
    ks: Any = khal_runtime.load(pkg)  # no GPU work yet: the first use loads (and checks) the binary
    with pytest.raises(error, match=match):
        ks.signal.folded.launch(8, None, _f32(1000), 1.0)


def test_a_debug_build_keeps_the_scanned_facts(tmp_path: Path, session_cache: Path) -> None:
    """``-G`` keeps dead code, so its PTX reads every id the generated kernel computes: the facts
    are the scanned ones there (a 2-D grid stays refused for an x-only kernel)."""
    from tests.helpers.build import build, manifest_of
    from tests.helpers.projects import make_project

    src = "KHAL_ENTRY(k, 64, (KHAL_STORAGE(float, x))) { uint64_t i = KHAL_GLOBAL_ID; if (i < x.len) x[i] = 1.0f; }\n"
    crates = ('[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "dbg"\nsources = ["kernels/dbg/*.cu"]\n'
              'options = ["-G"]\n')
    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "compute_90"\n', crates=crates,
                        files={"kernels/dbg/k.cu": src})
    m, files = manifest_of(build(root, session_cache)[0])  # type: ignore[no-untyped-call]
    e = m.crate("dbg").entry("k")
    assert e.launch is not None and (e.launch.source, e.launch_dims, e.launch_block_fixed) == ("scan", 1, True)
    (art,) = [a for a in m.crate("dbg").artifacts if a.kind == "ptx"]
    assert ptx_kernel_reads(files[art.path])[e.symbol].grid_axes == 3  # what the PTX alone would say


def test_an_integer_count_for_a_multi_d_entry_says_how_to_write_it() -> None:
    """Slang entries with a 2-D / 3-D numthreads took ``k(n)`` before they were called by their
    dimensionality (#24): the refusal gives the tuple that launches the same grid along x."""
    from khal_runtime.arguments import grid_for_threads
    from khal_runtime.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"the entry is 3-D .* got 100; 100 threads along x alone is \(100, 1, 1\)"):
        grid_for_threads("pairs", 100, (8, 4, 2), 3)
    # and that tuple gives the grid the integer gave before: ceil(100 / 8) blocks along x
    assert grid_for_threads("pairs", (100, 1, 1), (8, 4, 2), 3) == (13, 1, 1)


FIXED_CU = """\
#include "khal.h"
// a tile of the compiled block's size, written as a constant: no id macro folds the block in
KHAL_ENTRY(tiled, 128, (KHAL_STORAGE(float, y)))
{
    KHAL_FIXED_BLOCK();
    __shared__ float tile[128];
    const unsigned i = blockIdx.x * 128u + threadIdx.x;
    tile[threadIdx.x] = i < y.len ? y[i] : 0.0f;
    __syncthreads();
    if (i < y.len) y[i] = tile[127u - threadIdx.x];
}
KHAL_ENTRY(free_block, 128, (KHAL_STORAGE(float, y)))
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < y.len) y[i] *= 2.0f;
}
"""


@pytest.mark.needs_nvrtc
def test_khal_fixed_block_keeps_a_block_the_code_assumes(tmp_path: Path, session_cache: Path) -> None:
    """Code that assumes the compiled block without the id macros (a CUB block primitive, a tile of
    constant size) says so with ``KHAL_FIXED_BLOCK()``: its tagged asm survives into the PTX, so the
    compiled facts say the block is fixed, and ``launch()`` refuses another; the same body without it
    takes any block."""
    from tests.helpers.build import build, manifest_of
    from tests.helpers.projects import make_project

    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "compute_90"\n',
                        crates='[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "fx"\n'
                               'sources = ["kernels/fx/*.cu"]\n',
                        files={"kernels/fx/k.cu": FIXED_CU})
    result, _ = build(root, session_cache, jobs=1)
    m, _files = manifest_of(result)
    tiled, free = m.crate("fx").entry("tiled"), m.crate("fx").entry("free_block")
    assert tiled.launch is not None and tiled.launch.source == "ptx" and tiled.launch.block_fixed
    assert tiled.launch_block_fixed
    assert free.launch is not None and free.launch.source == "ptx" and not free.launch.block_fixed
    assert not free.launch_block_fixed
