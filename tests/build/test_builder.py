"""The build core in-process: hashing, caching, env variables, errors. CPU only."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hatch_khal.errors import CompileError, ConfigError, PrebuiltError, SourceError
from khal_runtime.binaries import khal_symbols, read_binary

from tests.helpers.build import build, manifest_of
from tests.helpers.projects import make_project
from tests.conftest import SESSION_ENV

@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV:
            monkeypatch.delenv(k)


@pytest.mark.needs_nvrtc
def test_build_produces_hashed_entries_and_valid_artifacts(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    result, _ = build(root, tmp_path / "cache")
    manifest, files = manifest_of(result)
    assert [c.name for c in manifest.crates] == ["alpha", "beta"]
    alpha = manifest.crate("alpha")
    (scale,) = alpha.entries
    assert scale.symbol == f"scale_khal_{scale.hash}"
    assert [(p.name, p.kind, p.element_type, p.element_size) for p in scale.params] == [
        ("y", "storage", "float32", 4),
        ("p", "uniform", "Params", 16),  # sizeof from the compiler: float + pad + double
        ("bias", "scalar", "float32", 4),
    ]
    kinds = sorted((a.kind, a.arch) for a in alpha.artifacts)
    assert kinds == [("cubin", "sm_90"), ("ptx", "compute_75")]
    for art in alpha.artifacts:
        data = files[art.path]
        assert hashlib.sha256(data).hexdigest() == art.sha256 and len(data) == art.size
        info = read_binary(data)
        assert khal_symbols(info)["scale"] == scale.hash
        if art.kind == "cubin":
            assert info.arch == 90 and data[:4] == b"\x7fELF"
        else:
            text = data.decode()
            # libdevice math is resolved: no external __nv_ calls left
            assert "__nv_" not in text and ".extern .func" not in text
    # sources and the local header are recorded with their hashes, relative paths only
    assert [s.path for s in alpha.sources] == ["kernels/alpha/scale.cu", "kernels/include/common.cuh"]
    assert str(tmp_path) not in files["_khal/manifest.json"].decode()
    assert (alpha.spirv.status, alpha.spirv.reason) == ("not_applicable", "CUDA C++ source")
    assert alpha.language == "cuda" and alpha.prebuilt is None


@pytest.mark.needs_nvrtc
def test_hashes_do_not_depend_on_location_and_builds_are_identical(tmp_path: Path) -> None:
    a = make_project(tmp_path / "one")
    b = make_project(tmp_path / "elsewhere" / "two")
    ra, _ = build(a, None)
    rb, _ = build(b, None)
    assert ra.packages[0].files == rb.packages[0].files


@pytest.mark.needs_nvrtc
def test_hash_changes_with_header_and_signature_only(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    m0, _ = manifest_of(build(root, None)[0])
    h0 = {e.name: e.hash for c in m0.crates for e in c.entries}
    # unchanged rebuild: same hashes
    m1, _ = manifest_of(build(root, None)[0])
    assert {e.name: e.hash for c in m1.crates for e in c.entries} == h0
    # header change: alpha's entry changes, beta's does not
    (root / "kernels/include/common.cuh").write_text("#pragma once\nstruct Params { float a; double b; float c; };\n")
    m2, _ = manifest_of(build(root, None)[0])
    h2 = {e.name: e.hash for c in m2.crates for e in c.entries}
    assert h2["scale"] != h0["scale"] and h2["fill"] == h0["fill"]
    assert m2.crate("alpha").entries[0].params[1].element_size == 24
    # signature change
    (root / "kernels/beta/fill.cu").write_text(
        (root / "kernels/beta/fill.cu").read_text().replace("KHAL_SCALAR(uint32_t, value)", "KHAL_SCALAR(uint64_t, value)")
    )
    m3, _ = manifest_of(build(root, None)[0])
    assert {e.name: e.hash for c in m3.crates for e in c.entries}["fill"] != h0["fill"]


@pytest.mark.needs_nvrtc
def test_cache_second_build_compiles_nothing_and_header_change_recompiles_one_crate(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    cache = tmp_path / "cache"
    first, rep = build(root, cache)
    assert first.compiled == 4 and first.cached == 0
    second, rep2 = build(root, cache)
    assert second.compiled == 0 and second.cached == 4
    assert not rep2.infos  # quiet for cache hits
    assert manifest_of(first)[1] == manifest_of(second)[1]
    (root / "kernels/include/common.cuh").write_text("#pragma once\n// touched\nstruct Params { float a; double b; };\n")
    third, _ = build(root, cache)
    assert third.compiled == 2 and third.cached == 2  # only crate alpha (ptx + sm_90)


@pytest.mark.needs_nvrtc
def test_corrupted_cache_entry_is_detected_and_rebuilt(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    cache = tmp_path / "cache"
    first, _ = build(root, cache)
    for art in (cache / "v1").rglob("artifact.bin"):
        art.write_bytes(art.read_bytes()[:100])  # truncate every entry
    second, rep = build(root, cache)
    assert second.compiled == 4
    assert any("corrupted" in w for w in rep.warnings)
    assert manifest_of(first)[1] == manifest_of(second)[1]


@pytest.mark.needs_nvrtc
def test_read_only_cache_degrades_with_warning(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        ro = Path("/proc/khal-cache-cannot-exist")
    else:  # pragma: no cover
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
    root = make_project(tmp_path / "p")
    result, rep = build(root, ro)
    # 4 targets, and each crate's PTX once more: the first PTX (which decides the indirect
    # variants, hatch_khal.cuda.CudaLanguage.prepare) cannot be kept in a cache that does not write
    assert result.compiled == 6
    assert any("not writable" in w for w in rep.warnings)


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("skip", [None, "1"])
def test_cuda_crates_have_no_webgpu_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skip: str | None) -> None:
    """KHAL_SKIP_SPIRV or not: CUDA C++ compiles to CUDA only (Slang crates build WebGPU too)."""
    root = make_project(tmp_path / "p")
    if skip:
        monkeypatch.setenv("KHAL_SKIP_SPIRV", skip)
    m, _ = manifest_of(build(root, None)[0])
    assert all((c.spirv.status, c.spirv.reason) == ("not_applicable", "CUDA C++ source") for c in m.crates)
    assert all(a.kind in ("ptx", "cubin") for c in m.crates for a in c.artifacts)


def test_spirv_on_a_cuda_crate_says_to_write_it_in_slang(tmp_path: Path) -> None:
    crates = '[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "alpha"\nsources = ["kernels/alpha/*.cu"]\ninclude-dirs = ["kernels/include"]\nspirv = true\n'
    root = make_project(tmp_path / "p", crates=crates)
    with pytest.raises(ConfigError, match=r"crates\[0\] 'alpha': option 'spirv = true' asks for WGSL / SPIR-V, "
                                          r"which only Slang crates build .*write the crate in Slang"):
        build(root, None)


@pytest.mark.needs_nvrtc
def test_env_arch_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p")
    monkeypatch.setenv("KHAL_CUDA_ARCHS", "sm_80,sm_86")
    monkeypatch.setenv("KHAL_PTX_ARCH", "none")
    m, _ = manifest_of(build(root, None)[0])
    assert sorted(a.arch for a in m.crate("beta").artifacts) == ["sm_80", "sm_86"]


@pytest.mark.needs_nvrtc
def test_unsupported_arch_names_arch_and_option(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", hook='archs = ["sm_35"]\n')
    with pytest.raises(ConfigError, match=r"sm_35.*'archs'.*supports"):
        build(root, None)


@pytest.mark.needs_nvrtc
def test_compile_error_carries_file_and_line(tmp_path: Path) -> None:
    bad = "KHAL_ENTRY(fill, 64, (KHAL_STORAGE(uint32_t, out)))\n{\n    out[0] = undefined_thing;\n}\n"
    root = make_project(tmp_path / "p", files={"kernels/beta/fill.cu": bad})
    with pytest.raises(CompileError) as err:
        build(root, None)
    msg = str(err.value)
    assert "crate 'beta'" in msg and "fill.cu(3)" in msg and "undefined_thing" in msg


def test_missing_source_and_empty_glob(tmp_path: Path) -> None:
    crates = '[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "gamma"\nsources = ["kernels/none/*.cu"]\n'
    root = make_project(tmp_path / "p", crates=crates)
    with pytest.raises(SourceError, match=r"crate 'gamma'.*kernels/none/\*\.cu.*matches no file"):
        build(root, None)


@pytest.mark.needs_nvrtc
def test_missing_include_is_reported_with_file_line(tmp_path: Path) -> None:
    bad = '#include "nope.cuh"\n' + (Path(__file__).parents[1] / "helpers" / "projects.py").read_text().split('OTHER_CU = """\\\n')[1].split('"""')[0]
    root = make_project(tmp_path / "p", files={"kernels/beta/fill.cu": bad})
    with pytest.raises(CompileError, match=r"fill\.cu\(1\).*nope\.cuh"):
        build(root, None)


def test_non_utf8_source(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    (root / "kernels/beta/fill.cu").write_bytes(b"// caf\xe9\nKHAL_ENTRY(fill, 64, (KHAL_STORAGE(float, o))) {}\n")
    with pytest.raises(SourceError, match=r"kernels/beta/fill\.cu:1.*not valid UTF-8"):
        build(root, None)


def test_crate_without_entries(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", files={"kernels/beta/fill.cu": "__device__ int x;\n"})
    with pytest.raises(SourceError, match="crate 'beta': no KHAL_ENTRY"):
        build(root, None)


@pytest.mark.needs_nvrtc
def test_same_entry_name_in_two_crates(tmp_path: Path) -> None:
    """Entry names are unique per crate (issue #19: one source built as several crates under
    different defines); the runtime reaches each as kernels.<crate>.<entry>."""
    dup = "KHAL_ENTRY(scale, 64, (KHAL_STORAGE(float, o))) { }\n"
    root = make_project(tmp_path / "p", files={"kernels/beta/fill.cu": dup})
    result, _ = build(root, None)
    m, _ = manifest_of(result)
    alpha, beta = m.crate("alpha").entry("scale"), m.crate("beta").entry("scale")
    assert alpha.hash != beta.hash and alpha.symbol != beta.symbol


# -- the escape hatch: CUDA_OXIDE_SHADERS_PTX_<CRATE> -----------------------------------------


def _artifact(result, crate: str, kind: str) -> bytes:  # type: ignore[no-untyped-def]
    m, files = manifest_of(result)
    art = next(a for a in m.crate(crate).artifacts if a.kind == kind)
    return files[art.path]


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_prebuilt_is_embedded_and_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    root = make_project(tmp_path / "p")
    normal, _ = build(root, None)
    pre = tmp_path / f"alpha.{kind}"
    pre.write_bytes(_artifact(normal, "alpha", kind))
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_ALPHA", str(pre))
    result, _ = build(root, None)
    m, files = manifest_of(result)
    alpha = m.crate("alpha")
    assert alpha.prebuilt is not None and alpha.prebuilt.variable == "CUDA_OXIDE_SHADERS_PTX_ALPHA"
    assert alpha.prebuilt.kind == kind and alpha.prebuilt.file_name == pre.name
    assert [a.kind for a in alpha.artifacts] == [kind]
    assert files[alpha.artifacts[0].path] == pre.read_bytes()
    built = manifest_of(normal)[0].crate("alpha").entries
    if kind == "ptx":
        assert alpha.entries == built
    else:  # no PTX shipped: the launch facts are the scanned (hashed) ones, not the PTX's
        assert [e.model_copy(update={"launch": None}) for e in alpha.entries] == \
            [e.model_copy(update={"launch": None}) for e in built]
        assert all(e.launch is not None and e.launch.source == "scan" for e in alpha.entries)
    # the variable of crate alpha does not leak into crate beta
    assert m.crate("beta").prebuilt is None and len(m.crate("beta").artifacts) == 2


@pytest.mark.needs_nvrtc
def test_prebuilt_variable_name_follows_khal_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    crates = '[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "my-crate"\nsources = ["kernels/beta/*.cu"]\n'
    root = make_project(tmp_path / "p", crates=crates)
    normal, _ = build(root, None)
    pre = tmp_path / "x.ptx"
    pre.write_bytes(_artifact(normal, "my-crate", "ptx"))
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_MY_CRATE", str(pre))
    m, _ = manifest_of(build(root, None)[0])
    assert m.crate("my-crate").prebuilt.variable == "CUDA_OXIDE_SHADERS_PTX_MY_CRATE"  # type: ignore[union-attr]


@pytest.mark.needs_nvrtc
def test_prebuilt_with_stale_hash_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p")
    old, _ = build(root, None)
    pre = tmp_path / "alpha.cubin"
    pre.write_bytes(_artifact(old, "alpha", "cubin"))
    (root / "kernels/alpha/scale.cu").write_text((root / "kernels/alpha/scale.cu").read_text() + "\n// edit\n")
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_ALPHA", str(pre))
    with pytest.raises(PrebuiltError) as err:
        build(root, None)
    msg = str(err.value)
    old_hash = manifest_of(old)[0].crate("alpha").entries[0].hash
    assert "entry 'scale'" in msg and old_hash in msg and "CUDA_OXIDE_SHADERS_PTX_ALPHA" in msg
    assert "current sources give" in msg


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "no such file"),
        ("dir", "is a directory"),
        (b"", "empty"),
        (b"\x7fELF\x02\x01\x01" + b"\x00" * 20, "damaged or truncated ELF"),
        (b"random bytes \x01\x02\x03" * 50, "not PTX"),
        (b".version 9.0\n.target sm_90\n.address_size 64\n", "has no kernel for entry 'scale'"),
    ],
)
@pytest.mark.needs_nvrtc
def test_bad_prebuilt_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content, match) -> None:  # type: ignore[no-untyped-def]
    root = make_project(tmp_path / "p")
    pre = tmp_path / "pre.bin"
    if content == "dir":
        pre.mkdir()
    elif content is not None:
        pre.write_bytes(content)
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_ALPHA", str(pre))
    with pytest.raises(PrebuiltError, match=match):
        build(root, None)


@pytest.mark.needs_nvrtc
def test_prebuilt_x86_elf_is_not_a_cubin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p")
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_ALPHA", os.path.realpath("/bin/true"))
    with pytest.raises(PrebuiltError, match="not a CUDA cubin"):
        build(root, None)


@pytest.mark.needs_nvrtc
def test_prebuilt_of_another_crate_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p")
    normal, _ = build(root, None)
    pre = tmp_path / "beta.ptx"
    pre.write_bytes(_artifact(normal, "beta", "ptx"))
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_ALPHA", str(pre))
    with pytest.raises(PrebuiltError, match="no kernel for entry 'scale'"):
        build(root, None)


@pytest.mark.needs_nvrtc
def test_all_prebuilt_needs_no_nvrtc_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p")
    normal, _ = build(root, None)
    for crate in ("alpha", "beta"):
        pre = tmp_path / f"{crate}.ptx"
        pre.write_bytes(_artifact(normal, crate, "ptx"))
        monkeypatch.setenv(f"CUDA_OXIDE_SHADERS_PTX_{crate.upper()}", str(pre))
    result, _ = build(root, None)
    m, _ = manifest_of(result)
    assert m.toolchain.nvrtc_version is None and result.compiled == 0


@pytest.mark.needs_nvrtc
def test_prebuilt_cubin_for_another_arch_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p")  # archs = ["sm_90"]
    monkeypatch.setenv("KHAL_CUDA_ARCHS", "sm_80")
    sm80, _ = build(root, None)
    monkeypatch.delenv("KHAL_CUDA_ARCHS")
    pre = tmp_path / "alpha.cubin"
    pre.write_bytes(_artifact(sm80, "alpha", "cubin"))
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_ALPHA", str(pre))
    with pytest.raises(PrebuiltError, match=r"cubin is for sm_80, but crate 'alpha' targets sm_90"):
        build(root, None)


def test_a_clean_compile_leaves_cpythons_shared_bytes_alone() -> None:
    """NVRTC writes its log, PTX and cubin into buffers we hand it. ``b" " * size`` for an
    empty log (size 1) is CPython's one shared ``b" "``: the compile used to turn it into
    ``b"\\x00"`` for the rest of the build process (on 3.12 the one-space str as well), which
    broke code generated later in the same process. Run in a child so a regression cannot
    corrupt this test session."""
    import subprocess
    import sys

    code = (
        "from hatch_khal.nvrtc import compile_unit\n"
        "r = compile_unit('extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }', 'k.cu', "
        "'sm_90', [], 'c')\n"
        "assert r.log == '' and r.data[:4] == b'\\x7fELF', r\n"
        "p = compile_unit('extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }', 'k.cu', "
        "'compute_90', [], 'c')\n"
        "assert p.data.startswith(b'//'), p.data[:20]\n"
        "print(list(b' '), ' '.join(['a', 'b']), f'{1} {2}', sep='|')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[32]|a b|1 2"


@pytest.mark.needs_nvrtc
def test_cache_key_and_toolchain_follow_the_compilers_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile cache asks the compiler (hatch_khal.compilers) for its name and version."""
    from hatch_khal import nvrtc
    from hatch_khal.model import CompilerIdentity

    root = make_project(tmp_path / "p")
    cache = tmp_path / "cache"
    assert build(root, cache)[0].compiled == 4
    assert build(root, cache)[0].compiled == 0
    monkeypatch.setattr(nvrtc.NvrtcCompiler, "identity", lambda self: CompilerIdentity("nvrtc", "99.9"))
    result, _ = build(root, cache)
    assert result.compiled == 4 and manifest_of(result)[0].toolchain.nvrtc_version == "99.9"


@pytest.mark.needs_nvrtc
def test_stages_ask_each_records_language_and_hand_on_frozen_records(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A crate's language is looked up by name once, at planning; every later stage asks the
    Language its record carries (here a spy over CUDA C++, with no name left to look up once
    planning is done) and gets a new frozen record: Planned -> Prepared -> Compiled. The build is
    the one CUDA C++ makes, from the same cache entries."""
    import dataclasses
    import sys
    import types

    from hatch_khal import languages
    from hatch_khal.cuda import CUDA
    from hatch_khal.languages import Compiled, Planned, Prepared

    root = make_project(tmp_path / "p")
    cache = tmp_path / "cache"
    plain, _ = build(root, cache)
    seen: list[tuple[str, str, object]] = []

    class Spy(type(CUDA)):  # type: ignore[misc]  # its defaults (title, options, requirements)

        def plan(self, root: Path, cfg):  # type: ignore[no-untyped-def]
            return dataclasses.replace(CUDA.plan(root, cfg), language=self)

        def prepare(self, planned, cache, reporter):  # type: ignore[no-untyped-def]
            languages.LANGUAGES.clear()  # planning is over: a lookup by name now fails
            languages._loaded.clear()
            seen.append(("prepare", planned.cfg.name, planned))
            return CUDA.prepare(planned, cache, reporter)

        def jobs(self, prepared, root, targets):  # type: ignore[no-untyped-def]
            seen.append(("jobs", prepared.cfg.name, prepared))
            return CUDA.jobs(prepared, root, targets)

        def explain(self, prepared, error):  # type: ignore[no-untyped-def]
            return CUDA.explain(prepared, error)

        def finish(self, compiled, binary):  # type: ignore[no-untyped-def]
            seen.append(("finish", compiled.cfg.name, compiled))
            with pytest.raises(dataclasses.FrozenInstanceError):
                compiled.entries = ()
            return CUDA.finish(compiled, binary)

    spy_module = types.ModuleType("khal_test_spy_language")
    spy_module.SPY = Spy()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, spy_module.__name__, spy_module)
    monkeypatch.setattr(languages, "LANGUAGES", {"cuda": f"{spy_module.__name__}:SPY"})
    monkeypatch.setattr(languages, "_loaded", {})
    result, _ = build(root, cache)
    # the same jobs under the same cache keys: all from the cache
    assert (plain.compiled, result.compiled, result.cached) == (4, 0, 4)
    assert result.packages[0].files == plain.packages[0].files
    assert [(stage, crate, type(record)) for stage, crate, record in seen] == [
        ("prepare", "alpha", Planned), ("prepare", "beta", Planned), ("jobs", "alpha", Prepared),
        ("jobs", "beta", Prepared), ("finish", "alpha", Compiled), ("finish", "beta", Compiled)]
    assert all(record.language is spy_module.SPY for _, _, record in seen)  # type: ignore[attr-defined]
    (alpha,) = [r for stage, crate, r in seen if (stage, crate) == ("finish", "alpha")]
    assert isinstance(alpha, Compiled) and set(alpha.outputs) == {"compute_75", "sm_90"}
