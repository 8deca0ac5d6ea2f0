"""The stage API the builder calls: KHAL_SKIP_SPIRV builds, the cache round trip, determinism,
manifest assembly, the size-probe check and the dependency check."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from khal_runtime.binaries import read_binary
from khal_runtime.manifest import Artifact, Crate, SpirvStatus

from hatch_khal.errors import ConfigError, KhalBuildError, SourceError
from hatch_khal.slang.records import SlangOutput
from tests.helpers.slang import MAIN_SLANG, UTIL_SLANG, compile_files, main_crate, needs_slang, one_entry, plan

pytestmark = needs_slang
MAIN = {"k/main.slang": MAIN_SLANG, "mods/util.slang": UTIL_SLANG}


@pytest.fixture(scope="module")
def crate(tmp_path_factory):  # type: ignore[no-untyped-def]
    return main_crate(str(tmp_path_factory.mktemp("main")))


def test_skip_spirv_builds_no_webgpu_and_keeps_the_hashes(tmp_path: Path, crate) -> None:  # type: ignore[no-untyped-def]
    out = compile_files(tmp_path, MAIN, targets=("cuda",), include_dirs=["mods"])
    assert not out.webgpu_built and out.webgpu_files == {} and out.webgpu_artifacts() == ()
    assert all(e.webgpu is None for e in out.entries)
    assert set(out.timings) == {"session", "cuda", "worker"}  # the worker compiled no WGSL / SPIR-V
    # the same files elsewhere: same content hash, same entry hashes as the full build
    assert [(e.name, e.hash) for e in out.entries] == [(e.name, e.hash) for e in crate.entries]
    assert out.cuda_unit == crate.cuda_unit


def test_cache_round_trip(crate) -> None:  # type: ignore[no-untyped-def]
    back = SlangOutput.from_bytes(crate.to_bytes())
    assert back == crate
    with pytest.raises(KhalBuildError, match="clear the khal cache"):
        SlangOutput.from_bytes(b'{"format": 99}')


def test_compiles_are_deterministic(tmp_path: Path, crate) -> None:  # type: ignore[no-untyped-def]
    again = compile_files(tmp_path, MAIN, include_dirs=["mods"])
    assert dataclasses.replace(again, timings={}) == dataclasses.replace(crate, timings={})


@pytest.mark.needs_nvrtc
def test_manifest_crate_from_the_output(tmp_path: Path) -> None:
    from hatch_khal.nvrtc import compile_unit

    out = compile_files(tmp_path, one_entry(params=",\n        uniform float s"))
    p = plan(tmp_path)
    ptx = compile_unit(out.cuda_unit, out.unit_name, "compute_75", list(out.nvrtc_options), "demo").data
    info = read_binary(ptx)
    out.check_probes(info.globals_u64)
    ptx_art = Artifact(kind="ptx", arch="compute_75", path="_khal/demo/demo.compute_75.ptx",
                       sha256=__import__("hashlib").sha256(ptx).hexdigest(), size=len(ptx), ptx_isa=info.ptx_isa)
    crate = Crate(name="demo", language="slang", package_dir="_khal/demo", sources=p.manifest_sources,
                  content_hash=out.content_hash, artifacts=(ptx_art,) + out.webgpu_artifacts(), entries=out.entries,
                  spirv=SpirvStatus(status="built"))
    assert crate.has_webgpu
    arts = {a.path: a for a in out.webgpu_artifacts()}
    assert sorted(arts) == sorted(out.webgpu_files)
    e = out.entries[0]
    assert sorted(arts) == [f"_khal/demo/f.{e.hash}.spv", f"_khal/demo/f.{e.hash}.wgsl"]
    assert set(info.functions) == {e.symbol, e.indirect_symbol}
    tampered = dict(info.globals_u64) | {"khal_sizeof_f_0": 8}
    with pytest.raises(KhalBuildError, match="parameter 'o'"):
        out.check_probes(tampered)


def test_entry_hashes_follow_an_imported_module(tmp_path: Path, crate) -> None:  # type: ignore[no-untyped-def]
    files = {**MAIN, "mods/util.slang": UTIL_SLANG + "// edited\n"}
    out = compile_files(tmp_path, files, targets=("cuda",), include_dirs=["mods"])
    old = {e.name: e.hash for e in crate.entries}
    assert all(old[e.name] != e.hash for e in out.entries)


def test_a_file_slang_reads_that_the_scan_missed_is_refused(tmp_path: Path) -> None:
    files = one_entry(head='#define HIDDEN "hidden.slang"\n#include HIDDEN\n')
    files["k/sub/hidden.slang"] = "// not in the hash\n"
    (tmp_path / "k").mkdir()
    (tmp_path / "k/hidden.slang").write_text("// read through a macro\n")
    with pytest.raises(SourceError, match=r"crate 'demo': Slang read .*k/hidden.slang, which the hook's module scan"):
        compile_files(tmp_path, files, patterns=["k/e.slang"], targets=("cuda",))


def test_bad_slang_option_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="crate 'demo': Slang rejected the options"):
        compile_files(tmp_path, one_entry(), slang_options=["-no-such-option"], targets=("cuda",))


def test_slang_warnings_are_returned(tmp_path: Path) -> None:
    out = compile_files(tmp_path, one_entry(params=",\n        float not_uniform"), targets=("cuda",))
    assert any("Slang says" in w and "treated as 'uniform'" in w for w in out.warnings)


def test_large_groups_warn_for_webgpu(tmp_path: Path) -> None:
    files = {"k/e.slang": one_entry()["k/e.slang"].replace("64, 1, 1", "512, 1, 1")}
    out = compile_files(tmp_path, files)
    assert any("512 threads per group; WebGPU allows 256" in w for w in out.warnings)
