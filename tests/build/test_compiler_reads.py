"""The cache key and the entry hashes cover exactly what the compiler read (issue #24 part 1, #29):
each test failed on the code before its fix."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hatch_khal import nvrtc
from hatch_khal.errors import SourceChangedError, UncoveredReadError
from hatch_khal.model import CompileJob, CompileOutput

from tests.helpers.build import build, manifest_of
from tests.helpers.projects import make_project
from tests.conftest import SESSION_ENV

ALPHA_ONLY = textwrap.dedent(
    """\
    [[tool.hatch.build.targets.wheel.hooks.khal.crates]]
    name = "alpha"
    sources = ["kernels/alpha/*.cu"]
    include-dirs = ["kernels/include"]
    """
)

#: a kernel whose value comes from a header reached through a macro #include
MACRO_CU = """\
#define CFG "{path}"
#include CFG
KHAL_ENTRY(cfg, 64, (KHAL_STORAGE(uint32_t, out)))
{{
    uint64_t i = KHAL_GLOBAL_ID;
    if (i < out.len) out[i] = CFG_VALUE;
}}
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV:
            monkeypatch.delenv(k)


#: one cubin per crate: one compile each
HOOK = 'archs = ["sm_90"]\nptx-arch = "none"\n'


def _project(root: Path, files: dict[str, str], crates: str = ALPHA_ONLY) -> Path:
    return make_project(root, hook=HOOK, crates=crates, files=files)


def _hashes(result: Any) -> dict[str, str]:
    m, _ = manifest_of(result)
    return {e.name: e.hash for c in m.crates for e in c.entries}


def _artifact(result: Any) -> bytes:
    m, files = manifest_of(result)
    (art,) = [a for c in m.crates for a in c.artifacts]
    return bytes(files[f"_khal/{art.path}" if not art.path.startswith("_khal/") else art.path])


# -- (1) a header outside what the hash covers is refused by name -----------------------------------

#: where the macro-included header lives (relative to the project, or "ABS" outside it)
UNCOVERED = {
    "other-folder": "shared/cfg.cuh",
    "absolute": "ABS",
    "hidden": "kernels/alpha/.cfg.cuh",
    "pycache": "kernels/alpha/__pycache__/cfg.cuh",
    "node_modules": "kernels/alpha/node_modules/cfg.cuh",
    "egg-info": "kernels/alpha/x.egg-info/cfg.cuh",
    "venv": "kernels/alpha/venv/cfg.cuh",
    "_khal": "kernels/alpha/_khal/cfg.cuh",
    "pyc": "kernels/alpha/cfg.pyc",
}


@pytest.mark.parametrize("where", sorted(UNCOVERED))
def test_header_the_hash_does_not_cover_is_refused_by_name(tmp_path: Path, where: str) -> None:
    rel = UNCOVERED[where]
    header = tmp_path / "outside" / "cfg.cuh" if rel == "ABS" else tmp_path / "p" / rel
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_text("#define CFG_VALUE 7u\n")
    if where == "venv":
        (header.parent / "pyvenv.cfg").write_text("home = /usr\n")
    root = _project(tmp_path / "p", {"kernels/alpha/cfg.cu": MACRO_CU.format(path=str(header))})
    with pytest.raises(UncoveredReadError, match=rf"crate 'alpha': the compiler read .*{header.name}.* "
                                                 r"move it into the crate's folders"):
        build(root, tmp_path / "cache", jobs=1)


def test_header_in_the_crates_folders_through_a_macro_still_builds(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", {"kernels/alpha/cfg.cu": MACRO_CU.format(path="../include/cfg.cuh"),
                                     "kernels/include/cfg.cuh": "#define CFG_VALUE 7u\n"})
    result, rep = build(root, tmp_path / "cache", jobs=1)
    assert result.compiled == 1 and not rep.warnings


# -- (2) include-dirs order decides which header is read: it is in the hash ------------------------

def test_swapping_include_dirs_with_same_named_headers_recompiles(tmp_path: Path) -> None:
    crates = ALPHA_ONLY.replace('include-dirs = ["kernels/include"]', 'include-dirs = ["inc_a", "inc_b", "kernels/include"]')
    root = _project(tmp_path / "p", {"kernels/alpha/cfg.cu": MACRO_CU.format(path="cfg.cuh"),
                                     "inc_a/cfg.cuh": "#define CFG_VALUE 1u\n",
                                     "inc_b/cfg.cuh": "#define CFG_VALUE 2u\n"}, crates)
    cache = tmp_path / "cache"
    first, _ = build(root, cache, jobs=1)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('["inc_a", "inc_b",', '["inc_b", "inc_a",'))
    second, _ = build(root, cache, jobs=1)
    assert second.compiled == 1
    assert _hashes(second) != _hashes(first)
    assert _artifact(second) != _artifact(first)


# -- (3) a file that changes during the compile never reaches the cache ----------------------------

def _compile_then(edit: Any) -> Any:
    real = nvrtc.NvrtcCompiler.compile

    def compile(self: nvrtc.NvrtcCompiler, job: CompileJob) -> CompileOutput:
        out = real(self, job)
        edit()
        return out

    return compile


def _edit_before(edit: Any) -> Any:
    real = nvrtc.NvrtcCompiler.compile

    def compile(self: nvrtc.NvrtcCompiler, job: CompileJob) -> CompileOutput:
        edit()
        return real(self, job)

    return compile


MARKED_H = '#pragma once\nextern "C" __device__ unsigned int {mark} = 1u;\n'


@pytest.mark.parametrize("when", ["between-hash-and-compile", "edited-and-reverted-during-compile"])
def test_header_edited_during_the_build_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       when: str) -> None:
    root = _project(tmp_path / "p", {"kernels/include/common.cuh":
                    MARKED_H.format(mark="mark_old") + "struct Params { float a; double b; };\n"})
    header = root / "kernels/include/common.cuh"
    old = header.read_text()
    new = old.replace("mark_old", "mark_new")
    cache = tmp_path / "cache"
    if when == "between-hash-and-compile":
        monkeypatch.setattr(nvrtc.NvrtcCompiler, "compile", _edit_before(lambda: header.write_text(new)))
    else:
        def edit_and_revert() -> None:
            header.write_text(new)
            header.write_text(old)
            st = os.stat(header)
            os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # mtime granularity
        monkeypatch.setattr(nvrtc.NvrtcCompiler, "compile", _compile_then(edit_and_revert))
    with pytest.raises(SourceChangedError, match=r"crate 'alpha': kernels/include/common.cuh changed while "
                                                 r"the crate compiled for sm_90 .*nothing of this compile was "
                                                 r"cached: build again"):
        build(root, cache, jobs=1)
    monkeypatch.undo()
    header.write_text(old)  # back to what was hashed first: a poisoned entry would be a hit now
    again, _ = build(root, cache, jobs=1)
    assert again.compiled == 1
    assert b"mark_old" in _artifact(again) and b"mark_new" not in _artifact(again)


# -- an NVRTC that cannot list its reads (no --fdevice-time-trace): built, never cached -------------

def test_output_whose_reads_are_unknown_is_used_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = nvrtc.NvrtcCompiler.compile

    def unlisted(self: nvrtc.NvrtcCompiler, job: CompileJob) -> CompileOutput:
        out = real(self, job)
        return CompileOutput(out.data, out.log, out.seconds, reads=None)

    monkeypatch.setattr(nvrtc.NvrtcCompiler, "compile", unlisted)
    root = _project(tmp_path / "p", {})
    cache = tmp_path / "cache"
    first, rep = build(root, cache, jobs=1)
    assert first.compiled == 1
    assert [w for w in rep.warnings if "cannot list the files a compile reads" in w and "not cached" in w]
    again, _ = build(root, cache, jobs=1)
    assert again.compiled == 1 and _hashes(again) == _hashes(first)


@pytest.mark.needs_nvrtc
def test_nvrtc_without_the_trace_option_compiles_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRTC_ERROR_INVALID_OPTION for the trace option: compiled again without it, reads unknown."""
    def rejected(*args: Any, **kw: Any) -> Any:
        raise nvrtc.ConfigError("NVRTC rejected the options [...]: unrecognized option --fdevice-time-trace")

    monkeypatch.setattr(nvrtc, "_traced", rejected)
    job = CompileJob(crate="c", target="compute_75", compiler="nvrtc", name="k.cu", options=(), key="0",
                     text='extern "C" __global__ void k() {}\n')
    out = nvrtc.compile_listing_reads(job)
    assert out.reads is None and b".entry k" in out.data


# -- (4) the compiler's full identity: the NVRTC wheel's release, not its minor --------------------

@pytest.mark.needs_nvrtc
def test_nvrtc_identity_is_the_wheels_release() -> None:
    from importlib import metadata

    assert nvrtc.NVRTC.identity().version == metadata.version("nvidia-cuda-nvrtc")


def test_another_nvrtc_patch_release_recompiles_and_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-cuda-nvrtc 13.4.59 and 13.4.92 are both NVRTC "13.4": their outputs must not share a key."""
    root = _project(tmp_path / "p", {})
    cache = tmp_path / "cache"
    monkeypatch.setattr(nvrtc, "nvrtc_release", lambda: "13.4.59", raising=False)
    first, _ = build(root, cache, jobs=1)
    assert build(root, cache, jobs=1)[0].compiled == 0
    monkeypatch.setattr(nvrtc, "nvrtc_release", lambda: "13.4.92", raising=False)
    second, _ = build(root, cache, jobs=1)
    assert second.compiled == 1
    assert manifest_of(second)[0].toolchain.nvrtc_version == "13.4.92"


# -- (#29 item 10) a cache entry holding another build's binary of the crate is rebuilt -------------

def test_cache_entry_with_another_builds_binary_is_dropped_and_rebuilt(tmp_path: Path) -> None:
    from khal_runtime.binaries import khal_symbols, read_binary

    root = _project(tmp_path / "p", {})
    cache = tmp_path / "cache"

    def entry_dirs() -> set[Path]:
        return {a.parent for a in (cache / "v1").glob("*/*/artifact.bin")
                if "scale" in khal_symbols(read_binary(a.read_bytes()))}

    build(root, cache, jobs=1)
    (old,) = entry_dirs()
    src = root / "kernels/alpha/scale.cu"
    src.write_text(src.read_text().replace("+ bias", "- bias"))
    second, _ = build(root, cache, jobs=1)
    (new,) = entry_dirs() - {old}
    for name in ("artifact.bin", "meta.json"):  # the old build's binary under the new key: meta consistent
        (new / name).write_bytes((old / name).read_bytes())
    third, rep = build(root, cache, jobs=1)
    assert third.compiled == 1 and _hashes(third) == _hashes(second)
    assert any("carries hash" in w and "rebuilding it" in w for w in rep.warnings), rep.warnings


# -- (#29 item 19) a CUDA C++ crate's options are in its hash and its cache key --------------------

def test_changing_options_of_a_cuda_crate_recompiles_and_changes_the_entry_hash(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", {})
    cache = tmp_path / "cache"
    first, _ = build(root, cache, jobs=1)
    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('include-dirs = ["kernels/include"]',
                                                       'include-dirs = ["kernels/include"]\noptions = ["--use_fast_math"]'))
    second, _ = build(root, cache, jobs=1)
    assert second.compiled == 1
    assert _hashes(second) != _hashes(first)
    assert _artifact(second) != _artifact(first)


# -- (#29 item 13) what the hash walk cannot stat is skipped, not a raw OSError --------------------

def test_a_path_too_long_to_stat_under_a_crate_folder_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _project(tmp_path / "p", {})
    monkeypatch.chdir(root / "kernels/alpha")
    depth = 0
    while depth * 201 < 4200:  # past PATH_MAX (4096): made one relative step at a time
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
        depth += 1
    os.mkdir("deepest")
    with open("k.cuh", "w") as fh:
        fh.write("#pragma once\n")
    monkeypatch.chdir(tmp_path)
    result, _ = build(root, tmp_path / "cache", jobs=1)
    assert result.compiled == 1


# -- (5) __FILE__ spells the project's location: a checkout elsewhere does not get that binary -------

FILE_GLOBAL = 'extern "C" __device__ const char khal_where[] = __FILE__;\n'
#: the optimiser folds the string into stores: no scan of the binary finds the path
FILE_FOLDED = ("__device__ const char* khal_where() { return __FILE__; }\n"
               "KHAL_ENTRY(where, 64, (KHAL_STORAGE(uint8_t, out)))\n"
               "{\n    for (int i = 0; i < 48; ++i) out[i] = khal_where()[i];\n}\n")


@pytest.mark.parametrize("how", ["global", "folded"])
def test_a_binary_naming_its_checkout_is_not_reused_by_another(tmp_path: Path, how: str) -> None:
    import shutil

    hook = 'archs = ["sm_90"]\nptx-arch = "compute_90"\n'
    extra = {"kernels/alpha/where.cu": FILE_GLOBAL} if how == "global" else {"kernels/alpha/where.cu": FILE_FOLDED}
    first = make_project(tmp_path / "a" / "p", hook=hook, files=extra)
    cache = tmp_path / "cache"
    build(first, cache, jobs=1)
    second = tmp_path / "b" / "p"
    shutil.copytree(first, second)
    result, _ = build(second, cache, jobs=1)
    m, files = manifest_of(result)
    assert result.compiled == 2 and result.cached == 2  # alpha's two binaries again; beta's from the cache
    if how == "global":
        for art in m.crate("alpha").artifacts:
            data = files[art.path]
            spelled = str(second).encode() if art.kind == "cubin" else \
                ", ".join(str(b) for b in str(second).encode()).encode()
            assert spelled in data, art.path
    again, _ = build(second, cache, jobs=1)
    assert again.compiled == 0  # the entry now names the second checkout


def test_the_scan_finds_paths_raw_and_as_ptx_bytes() -> None:
    from hatch_khal.reads import spelled_locations

    job = CompileJob(crate="c", target="compute_90", compiler="nvrtc", text="", name="k.cu", options=(), key="0",
                     locations=("/x/proj", "/x/proj/inc", "/site/khal/include"), covered_dirs=("/site/khal/include",))
    ptx = b".global .align 1 .b8 khal_where[20] = {" + ", ".join(str(b) for b in b"/x/proj/k.cu").encode() + b"};"
    assert spelled_locations(job, ptx) == ("/x/proj",)
    assert spelled_locations(job, b"\x00/x/proj/inc/a.cuh\x00") == ("/x/proj", "/x/proj/inc")
    assert spelled_locations(job, b"nothing") == ()
    assert spelled_locations(job.__class__(**{**job.__dict__, "names_paths": True}), b"nothing") == \
        ("/x/proj", "/x/proj/inc")


def test_a_build_from_the_project_folder_passes_the_read_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRTC lists the generated #line names (``kernels/alpha/scale.cu``) among the files it read:
    from the project folder they name the crate's own files."""
    root = _project(tmp_path / "p", {})
    monkeypatch.chdir(root)
    assert build(root, tmp_path / "cache", jobs=1)[0].compiled == 1


# -- (#37) the binary of a plain compile: NVRTC's trace changes sm_100+ code, and 13.0's from run to run --

#: the example's gelu kernels: enough code for the trace to change NVRTC's sm_100 output
GELU = ("example_shader_pkg", "kernels/core/gelu.cu")
BLACKWELL_HOOK = 'archs = ["sm_100"]\nptx-arch = "none"\n'


def _gelu_project(root: Path) -> Path:
    from tests.helpers.paths import ROOT

    example = ROOT / GELU[0] / "kernels"
    files = {"kernels/gelu/gelu.cu": (example / "core" / "gelu.cu").read_text()}
    for header in (example / "include").iterdir():
        files[f"kernels/example/{header.name}"] = header.read_text()
    crate = '[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "gelu"\nsources = ["kernels/gelu/*.cu"]\n' \
            'include-dirs = ["kernels/example"]\n'
    return make_project(root, hook=BLACKWELL_HOOK, crates=crate, files=files)


@pytest.mark.needs_nvrtc
def test_an_sm_100_cubin_is_byte_identical_from_two_directories_and_caches_and_is_nvrtcs_plain_output(
        tmp_path: Path) -> None:
    """Two builds of one crate for sm_100, in two directories with two caches: the same bytes, and
    the bytes of NVRTC's plain compile of the unit (the trace for the reads would change them)."""
    first, _ = build(_gelu_project(tmp_path / "a" / "proj"), tmp_path / "a" / "cache", jobs=1)
    second, _ = build(_gelu_project(tmp_path / "b" / "deeper" / "proj"), tmp_path / "b" / "cache", jobs=1)
    _, files_a = manifest_of(first)
    _, files_b = manifest_of(second)
    (name,) = [n for n in files_a if n.endswith(".cubin")]
    assert files_a[name] == files_b[name]

    captured: list[CompileJob] = []
    real = nvrtc.compile_listing_reads

    def capture(job: CompileJob) -> CompileOutput:
        captured.append(job)
        return real(job)

    root = _gelu_project(tmp_path / "c" / "proj")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nvrtc.NvrtcCompiler, "compile", lambda self, job: capture(job))
        third, _ = build(root, None, jobs=1)
    (job,) = captured
    plain = nvrtc.compile_unit(job.text, job.name, job.target, list(job.options), job.crate).data
    _, files_c = manifest_of(third)
    assert files_c[name] == plain
    assert files_c[name] == files_a[name]
