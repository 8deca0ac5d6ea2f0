"""Slang crates built by the hook (build_packages in-process): the language seam end to end, the
WebGPU stage switches, the content-addressed cache, prebuilt CUDA binaries, and every build-level
error once, as the user sees it. Small projects, one cubin arch (sm_90), so each build costs about
one Slang session and one NVRTC compile."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import traceback
from pathlib import Path
from typing import Any

import pytest

from hatch_khal.builder import build_packages
from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from hatch_khal.errors import CompileError, ConfigError, KhalBuildError, PrebuiltError, SourceError
from hatch_khal.output import write_package_output
from khal_runtime.binaries import khal_symbols, read_binary, webgpu_entry_points
from khal_runtime.manifest import parse_manifest
from khal_runtime.verify import verify_package

from tests.helpers.projects import SCALE_CU, COMMON_CUH
from tests.helpers.slang import MAIN_SLANG, UTIL_SLANG, needs_slang, write
from tests.helpers.build import Recorder
from tests.helpers.slang import ENTRY, one_entry
from tests.conftest import SESSION_ENV

pytestmark = needs_slang

MAIN = {"k/main.slang": MAIN_SLANG, "mods/util.slang": UTIL_SLANG}
DEMO = {"name": "demo", "sources": ["k/*.slang"], "include-dirs": ["mods"]}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV:
            monkeypatch.delenv(k)


def build(root: Path, crates: list[dict[str, Any]] | None = None, cache: Path | None = None,
          editable: bool = False, **hook: Any) -> tuple[Any, Recorder]:
    raw = {"archs": ["sm_90"], "ptx-arch": "none", **hook, "crates": crates or [DEMO]}
    _, resolved = parse_config(raw, default_package="pkg")
    rep = Recorder()
    result = build_packages(root, resolved, rep, cache=Cache(cache, rep.warn) if cache else Cache(None),
                            editable=editable)
    return result, rep


def manifest_of(result):  # type: ignore[no-untyped-def]
    (pkg,) = result.packages
    return parse_manifest(pkg.files["_khal/manifest.json"]), pkg.files


def one_clean_error(exc: BaseException) -> None:
    """One error: no chained traceback ('During handling of the above exception ...')."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert "During handling" not in text and "direct cause" not in text, text


@pytest.fixture(scope="module")
def main_build(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """MAIN_SLANG (buffers, atomics, a uniform struct, half, an imported module) built with the cache."""
    root = write(tmp_path_factory.mktemp("main"), MAIN)
    cache = tmp_path_factory.mktemp("cache")
    result, rep = build(root, cache=cache, **{"ptx-arch": "compute_75"})
    return root, cache, result, rep


@pytest.mark.needs_nvrtc
def test_a_slang_crate_builds_cuda_and_webgpu(main_build, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root, _, result, rep = main_build
    m, files = manifest_of(result)
    (crate,) = m.crates
    assert (crate.language, crate.spirv.status) == ("slang", "built")
    assert m.toolchain.slang_version == "2026.12" and m.toolchain.nvrtc_version
    assert [s.path for s in crate.sources] == ["k/main.slang", "mods/util.slang"]
    assert [e.name for e in crate.entries] == ["pairs", "saxpy"]
    kinds = sorted((a.kind, a.arch or a.entry) for a in crate.artifacts)
    assert kinds == [("cubin", "sm_90"), ("ptx", "compute_75"), ("spirv", "pairs"), ("spirv", "saxpy"),
                     ("wgsl", "pairs"), ("wgsl", "saxpy")]
    for a in crate.artifacts:
        data = files[a.path]
        assert hashlib.sha256(data).hexdigest() == a.sha256 and len(data) == a.size
        if a.kind in ("ptx", "cubin"):
            info = read_binary(data)
            assert khal_symbols(info) == {**{e.name: e.hash for e in crate.entries},
                                          **{f"{e.name}_indirect": e.hash for e in crate.entries}}
        else:
            entry = crate.entry(a.entry or "")
            assert webgpu_entry_points(data, a.kind) == (entry.symbol,)
            assert a.path == f"_khal/demo/{entry.name}.{entry.hash}.{'wgsl' if a.kind == 'wgsl' else 'spv'}"
    # the uniform's layouts per target, the half scalar (cuda_fp16.h from the header wheels)
    saxpy = crate.entry("saxpy")
    assert {t: lay.size for t, lay in saxpy.params[2].layouts.items()} == {"cuda": 28, "wgsl": 80, "spirv": 80}
    assert crate.entry("pairs").params[-1].element_type == "float16"
    assert str(root) not in files["_khal/manifest.json"].decode()
    assert any("compiled Slang crate 'demo' to cuda, spirv, wgsl" in i for i in rep.infos)
    # written out, the package verifies (sha256, symbols, WGSL / SPIR-V entry points)
    (pkg,) = result.packages
    write_package_output(pkg, tmp_path / "pkg")
    assert verify_package(tmp_path / "pkg") == []


@pytest.mark.needs_nvrtc
def test_an_unchanged_rebuild_runs_neither_slang_nor_nvrtc(main_build, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    root, cache, first, _ = main_build
    import hatch_khal.nvrtc
    import hatch_khal.slang.language

    def must_not_run(*a: object, **k: object) -> None:
        raise AssertionError("compiled on an unchanged rebuild")

    with monkeypatch.context() as mp:
        mp.setattr(hatch_khal.slang.language, "compile_slang_crate", must_not_run)
        mp.setattr(hatch_khal.nvrtc, "compile_unit", must_not_run)
        again, rep = build(root, cache=cache, **{"ptx-arch": "compute_75"})
    assert (again.compiled, again.cached) == (0, 3)  # the Slang output, the PTX, the cubin
    assert again.packages[0].files == first.packages[0].files
    assert not any("compiled" in i for i in rep.infos)


@pytest.mark.needs_nvrtc
def test_an_edited_module_rebuilds_the_crate(main_build, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, cache, first, _ = main_build
    root = write(tmp_path, {**MAIN, "mods/util.slang": UTIL_SLANG + "// edited\n"})
    again, _ = build(root, cache=cache, **{"ptx-arch": "compute_75"})
    assert again.compiled == 3
    old, new = manifest_of(first)[0].crates[0], manifest_of(again)[0].crates[0]
    assert all(a.hash != b.hash for a, b in zip(old.entries, new.entries))


@pytest.mark.needs_nvrtc
def test_an_editable_build_reports_an_edited_module_as_stale(main_build, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from khal_runtime.verify import check_sources

    _, cache, _, _ = main_build
    root = write(tmp_path, MAIN)
    (root / "pkg").mkdir()
    result, _ = build(root, cache=cache, editable=True, **{"ptx-arch": "compute_75"})
    (pkg,) = result.packages
    write_package_output(pkg, root / "pkg")
    assert pkg.manifest.editable is not None and check_sources(pkg.manifest, root / "pkg") == []
    (root / "mods/util.slang").write_text(UTIL_SLANG + "// edited\n")
    (problem,) = check_sources(pkg.manifest, root / "pkg")
    assert "mods/util.slang changed" in problem.message and "pip install --no-build-isolation -e " in problem.message


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("how", ["env", "option"])
def test_skipping_the_webgpu_stage(main_build, monkeypatch: pytest.MonkeyPatch, how: str) -> None:  # type: ignore[no-untyped-def]
    root, cache, full, _ = main_build
    crate = dict(DEMO)
    if how == "env":
        monkeypatch.setenv("KHAL_SKIP_SPIRV", "yes")
    else:
        crate["spirv"] = False
    import hatch_khal.nvrtc

    def must_not_run(*a: object, **k: object) -> None:
        raise AssertionError("NVRTC ran: the CUDA unit of a KHAL_SKIP_SPIRV build is the full build's")

    with monkeypatch.context() as mp:
        mp.setattr(hatch_khal.nvrtc, "compile_unit", must_not_run)
        result, _ = build(root, [crate], cache=cache, **{"ptx-arch": "compute_75"})
    m, files = manifest_of(result)
    (c,) = m.crates
    reason = "KHAL_SKIP_SPIRV is set" if how == "env" else "option 'spirv = false' of the crate"
    assert (c.spirv.status, c.spirv.reason) == ("skipped", reason)
    assert sorted(a.kind for a in c.artifacts) == ["cubin", "ptx"] and all(e.webgpu is None for e in c.entries)
    assert not any(p.endswith((".wgsl", ".spv")) for p in files)
    # the same entry hashes and the same CUDA binaries as the full build
    full_m, full_files = manifest_of(full)
    assert [(e.name, e.hash) for e in c.entries] == [(e.name, e.hash) for e in full_m.crates[0].entries]
    assert all(files[a.path] == full_files[a.path] for a in c.artifacts)


@pytest.mark.needs_nvrtc
def test_an_empty_khal_skip_spirv_skips_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KHAL_SKIP_SPIRV", "")
    m, _ = manifest_of(build(write(tmp_path, one_entry()), [{"name": "demo", "sources": ["k/*.slang"]}])[0])
    assert m.crates[0].spirv.status == "built"


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_prebuilt_cuda_binary_of_a_slang_crate(main_build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                               kind: str) -> None:
    """CUDA_OXIDE_SHADERS_PTX_<CRATE> replaces the CUDA binaries; Slang still builds WGSL / SPIR-V."""
    root, cache, full, _ = main_build
    full_m, full_files = manifest_of(full)
    art = next(a for a in full_m.crates[0].artifacts if a.kind == kind)
    (tmp_path / f"demo.{kind}").write_bytes(full_files[art.path])
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_DEMO", str(tmp_path / f"demo.{kind}"))
    result, _ = build(root, cache=cache, **{"ptx-arch": "compute_75"})
    m, files = manifest_of(result)
    (c,) = m.crates
    assert c.prebuilt is not None and (c.prebuilt.variable, c.prebuilt.kind) == ("CUDA_OXIDE_SHADERS_PTX_DEMO", kind)
    assert sorted(a.kind for a in c.artifacts) == [kind, "spirv", "spirv", "wgsl", "wgsl"]
    if kind == "ptx":
        assert c.entries == full_m.crates[0].entries
    else:  # no PTX shipped: the launch facts are reflection's (numthreads), not the PTX's
        assert [e.model_copy(update={"launch": None}) for e in c.entries] == \
            [e.model_copy(update={"launch": None}) for e in full_m.crates[0].entries]
        assert all(e.launch is not None and e.launch.source == "reflection" for e in c.entries)
    assert c.spirv.status == "built"
    # the binary of other sources: refused, naming the entry, both hashes and the variable
    edited = write(tmp_path / "edited", {**MAIN, "k/main.slang": MAIN_SLANG + "// edited\n"})
    with pytest.raises(PrebuiltError, match=r"crate 'demo': entry 'pairs': prebuilt .* carries hash [0-9a-f]{16}, the "
                                            r"current sources give [0-9a-f]{16} \(CUDA_OXIDE_SHADERS_PTX_DEMO="):
        build(edited, cache=cache, **{"ptx-arch": "compute_75"})


@pytest.mark.needs_nvrtc
def test_a_damaged_cached_slang_output_is_rebuilt(tmp_path: Path) -> None:
    root = write(tmp_path / "p", one_entry())
    crate = {"name": "demo", "sources": ["k/*.slang"]}
    build(root, [crate], cache=tmp_path / "cache")
    damaged = 0
    for meta in (tmp_path / "cache").rglob("meta.json"):
        art = meta.parent / "artifact.bin"
        if art.read_bytes().startswith(b"{"):  # the Slang output (JSON); NVRTC's are a cubin
            art.write_bytes(b'{"format": 1, "crate": "other"}')
            meta.write_text('{"sha256": "%s", "size": %d, "log": ""}' % (
                hashlib.sha256(art.read_bytes()).hexdigest(), art.stat().st_size))
            damaged += 1
    assert damaged == 1
    result, rep = build(root, [crate], cache=tmp_path / "cache")
    assert any("not the Slang output of crate 'demo' (unreadable); rebuilding it" in w for w in rep.warnings)
    assert result.compiled == 1 and manifest_of(result)[0].crates[0].spirv.status == "built"


# -- configuration -------------------------------------------------------------------------------


def test_the_language_follows_the_sources() -> None:
    _, crates = parse_config({"crates": [{"name": "a", "sources": ["k/*.slang"]},
                                         {"name": "b", "sources": ["k/*.cu", "k/x.cuh"]},
                                         {"name": "c", "sources": ["k/**"], "spirv": False}]}, default_package="p")
    assert [(c.name, c.language) for c in crates] == [("a", "slang"), ("b", "cuda"), ("c", "cuda")]


@pytest.mark.parametrize("crate, match", [
    ({"sources": ["k/*.slang", "k/*.cu"]}, r"crates\[0\] 'a': option 'sources' mixes Slang sources \(k/\*.slang\) "
                                           r"with CUDA C\+\+ sources \(k/\*.cu\).*two crates"),
    ({"sources": ["k/*.cu"], "spirv": True}, r"'spirv = true' asks for WGSL / SPIR-V, which only Slang crates build"),
    ({"sources": ["k/*.cu"], "slang-options": ["-O3"]}, r"'slang-options' is for Slang crates"),
    ({"sources": ["k/*.slang"], "slang_options": ["-O3"]}, r"unknown option 'crates\[0\].slang_options'; did you "
                                                            r"mean 'slang-options'\?"),
])
def test_configuration_errors(crate: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config({"crates": [{"name": "a", **crate}]}, default_package="p")


def test_a_cuda_glob_that_matches_slang_files_is_refused(tmp_path: Path) -> None:
    root = write(tmp_path, {**one_entry(), "k/also.cu": "// nothing\n"})
    with pytest.raises(ConfigError, match=r"crate 'mixed': option 'sources' \(k/\*\) matches Slang sources "
                                          r"\(k/e.slang\), but a crate whose source globs do not end in .slang is CUDA"):
        build(root, [{"name": "mixed", "sources": ["k/*"]}])


def test_slang_options_reach_slang(tmp_path: Path) -> None:
    root = write(tmp_path, one_entry())
    crate = {"name": "demo", "sources": ["k/*.slang"], "slang-options": ["-no-such-option"]}
    with pytest.raises(ConfigError, match="crate 'demo': Slang rejected the options .*-no-such-option"):
        build(root, [crate])
    with pytest.raises(ConfigError, match=r"Slang option '-target' is set by the khal hook itself"):
        build(root, [{**crate, "slang-options": ["-target"]}])


# -- errors at build level: one clean error each, naming what to fix --------------------------------

BAD = {
    "syntax": (one_entry(body="o[t.x] = 1.0 +;"), CompileError, ["crate 'demo' failed to compile with Slang",
                                                                 "k/e.slang:6", "syntax error"]),
    "parameter type": (one_entry(name="blur", params=",\n        uniform Texture2D<float> img"), SourceError,
                       ["k/e.slang:5: crate 'demo': entry 'blur' parameter 'img': ", "Texture2D",
                        "not a khal binding"]),
    "numthreads": ({"k/e.slang": ENTRY.format(name="wide", params="", body="o[t.x] = 1.0;")
                    .replace("64, 1, 1", "64, 32, 1")}, SourceError,
                   ["k/e.slang:3: crate 'demo': entry 'wide': [numthreads(64, 32, 1)] is 2048 threads per group; "
                    "at most 1024"]),
    "missing module": (one_entry(head="import nowhere_mod;\n"), CompileError, ["k/e.slang:1", "nowhere_mod"]),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_build_errors(tmp_path: Path, what: str) -> None:
    files, error, words = BAD[what]
    with pytest.raises(error) as exc:
        build(write(tmp_path, files), [{"name": "demo", "sources": ["k/*.slang"]}])
    for w in words:
        assert w in str(exc.value), str(exc.value)
    assert str(exc.value).count("crate 'demo'") == 1  # reported once
    one_clean_error(exc.value)


@pytest.mark.needs_nvrtc
def test_half_without_cuda_headers_names_the_header_wheel(tmp_path: Path) -> None:
    """A unit that includes cuda_fp16.h gets the CUDA headers (cuda-headers); with "none" NVRTC's
    error comes with the hint naming the wheel and the option."""
    root = write(tmp_path, one_entry(params=",\n        uniform half h", body="o[t.x] = float(h);"))
    crate = {"name": "demo", "sources": ["k/*.slang"], "spirv": False, "cuda-headers": "none"}
    with pytest.raises(CompileError) as exc:
        build(root, [crate])
    msg = str(exc.value)
    assert "cuda_fp16.h" in msg and "comes from the nvidia-cuda-runtime wheel, but option 'cuda-headers' is \"none\"" in msg
    one_clean_error(exc.value)


@pytest.mark.needs_nvrtc
def test_a_slang_and_a_cuda_crate_may_share_an_entry_name(tmp_path: Path) -> None:
    """Entry names are unique per crate (issue #19 dropped the per-package rule: the runtime reaches
    each as kernels.<crate>.<entry>), across languages too: both build, each with its own hash."""
    root = write(tmp_path, {**one_entry(name="scale"), "kernels/alpha/scale.cu": SCALE_CU,
                            "kernels/include/common.cuh": COMMON_CUH})
    crates = [{"name": "alpha", "sources": ["kernels/alpha/*.cu"], "include-dirs": ["kernels/include"]},
              {"name": "demo", "sources": ["k/*.slang"], "spirv": False}]
    m, _ = manifest_of(build(root, crates)[0])
    cuda, slang = m.crate("alpha").entry("scale"), m.crate("demo").entry("scale")
    assert (m.crate("alpha").language, m.crate("demo").language) == ("cuda", "slang")
    assert cuda.hash != slang.hash and cuda.symbol != slang.symbol


def test_an_entry_defined_twice_in_a_slang_crate(tmp_path: Path) -> None:
    """Within one crate a name is one entry: two files defining it are one clean error."""
    root = write(tmp_path, {**one_entry(name="twice"), "k/f.slang": one_entry(name="twice")["k/e.slang"]})
    with pytest.raises(CompileError) as exc:
        build(root, [{"name": "demo", "sources": ["k/*.slang"]}])
    assert "crate 'demo'" in str(exc.value) and "twice" in str(exc.value)
    one_clean_error(exc.value)


def test_a_slang_compiler_crash_is_one_build_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hatch_khal.slang.client import SlangCrashed
    from hatch_khal.slang.worker import CRASH_ENV

    monkeypatch.setenv(CRASH_ENV, "webgpu")
    with pytest.raises(SlangCrashed) as exc:
        build(write(tmp_path, one_entry()), [{"name": "boom", "sources": ["k/*.slang"]}])
    assert str(exc.value).startswith("crate 'boom': the Slang compiler crashed while compiling entries to WGSL / "
                                     "SPIR-V (killed by signal SIGABRT)")
    one_clean_error(exc.value)


def hide_slangpy(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any, **k: Any) -> Any:
        return None if name == "slangpy" else real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_slangpy_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide_slangpy(monkeypatch)
    with pytest.raises(KhalBuildError) as exc:
        build(write(tmp_path, one_entry()), [{"name": "demo", "sources": ["k/*.slang"]}])
    msg = str(exc.value)
    assert "the 'slangpy' package is not installed" in msg
    assert "add 'slangpy==0.43.1' to [build-system] requires" in msg and "pip install 'slangpy==0.43.1'" in msg
    one_clean_error(exc.value)


# -- the front-ends' requirements -----------------------------------------------------------------


def _hook(tmp_path: Path, crates: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from hatch_khal.plugin import KhalBuildHook

    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__init__.py").touch()
    meta = SimpleNamespace(core=SimpleNamespace(raw_name="pkg"))
    return KhalBuildHook(str(tmp_path), {"crates": crates}, None, meta, str(tmp_path), "wheel")


def test_the_hatch_hook_adds_slangpy_only_for_slang_crates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hatch_khal.slang.library import SLANGPY_REQUIREMENT

    cuda = {"name": "a", "sources": ["k/*.cu"]}
    slang = {"name": "b", "sources": ["k/*.slang"]}
    assert SLANGPY_REQUIREMENT not in _hook(tmp_path, [cuda]).dependencies()
    deps = _hook(tmp_path, [cuda, slang]).dependencies()
    assert deps.count(SLANGPY_REQUIREMENT) == 1 and any(d.startswith("nvidia-cuda-nvrtc") for d in deps)
    # a prebuilt Slang crate needs no NVRTC, but Slang still runs (entries, WGSL / SPIR-V)
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_B", "b.ptx")
    assert _hook(tmp_path, [slang]).dependencies() == [SLANGPY_REQUIREMENT]


def test_the_pinned_slangpy_is_the_tested_one() -> None:
    """One pin: the hook's requirement is what the test extra installs (and what the docs name)."""
    try:
        import tomllib
    except ImportError:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    from importlib.metadata import version

    from hatch_khal.slang.library import SLANGPY_REQUIREMENT

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert SLANGPY_REQUIREMENT in project["optional-dependencies"]["test"]
    assert SLANGPY_REQUIREMENT == f"slangpy=={version('slangpy')}"


def test_the_setuptools_command_names_the_missing_slangpy(monkeypatch: pytest.MonkeyPatch) -> None:
    from setuptools.dist import Distribution

    from hatch_khal.errors import ConfigError
    from hatch_khal.setuptools_ext import BuildKhal

    hook, crates = parse_config({"crates": [{"name": "a", "sources": ["k/*.slang"]}]}, default_package="p")
    cmd = BuildKhal(Distribution())
    cmd._check_requirements(hook, crates)  # installed here: fine
    hide_slangpy(monkeypatch)
    with pytest.raises(ConfigError, match=r"setuptools cannot add build requirements: .*\[build-system\] requires = "
                                          r"\[.*\"slangpy==0.43.1\"\]"):
        cmd._check_requirements(hook, crates)
    _, cuda_only = parse_config({"crates": [{"name": "a", "sources": ["k/*.cu"]}]}, default_package="p")
    cmd._check_requirements(hook, cuda_only)  # no Slang crate: no Slang needed


@pytest.mark.needs_nvrtc
def test_a_module_edited_while_slang_compiles_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slang reads the files after the hook hashed them: an edit in between (even one reverted)
    fails the build and leaves nothing in the cache (issue #24)."""
    from hatch_khal.errors import SourceChangedError
    from hatch_khal.slang import language

    root = write(tmp_path / "p", MAIN)
    util = root / "mods/util.slang"
    real = language.compile_slang_crate

    def edited(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        util.write_text(UTIL_SLANG + "\n// edited\n")
        util.write_text(UTIL_SLANG)
        st = os.stat(util)
        os.utime(util, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse mtime clocks
        return out

    monkeypatch.setattr(language, "compile_slang_crate", edited)
    cache = tmp_path / "cache"
    with pytest.raises(SourceChangedError, match=r"crate 'demo': mods/util.slang changed while Slang compiled"):
        build(root, cache=cache, **{"ptx-arch": "none"})
    monkeypatch.undo()
    result, _ = build(root, cache=cache)
    assert result.compiled == 2  # the Slang stage and the cubin: nothing was cached


@pytest.mark.needs_nvrtc
def test_a_build_from_the_project_folder_passes_the_read_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRTC lists the unit's #line names (``mods/util.slang``) among the files it read: from the
    project folder they name real files, which the crate's hash covers (issue #24)."""
    root = write(tmp_path / "p", MAIN)
    monkeypatch.chdir(root)
    result, _ = build(root)
    assert result.compiled == 2
