"""Build-side hardening (issue #29): each test failed on the code before its fix."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from khal_runtime.abi import parse_arch, split_symbol
from khal_runtime.manifest import parse_manifest

from tests.helpers.projects import make_project
from tests.helpers.slang import needs_slang
from tests.conftest import ROOT, SESSION_ENV, build_env, run


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV:
            monkeypatch.delenv(k)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A build subprocess that runs this tree's hatch_khal (not the editable install's)."""
    return build_env(tmp_path / "cache", PYTHONPATH=str(ROOT), **extra)


def _crate(**kw: Any) -> dict[str, Any]:
    return {"name": "alpha", "sources": ["k/*.cu"], **kw}


# -- (12) names and values are matched whole: a trailing newline is no part of a name ---------------


@pytest.mark.parametrize("table, named", [
    ({"crates": [_crate(name="alpha\n")]}, "crates[0].name"),
    ({"crates": [_crate(archs=["sm_090"])]}, "crates[0].archs"),
    ({"archs": ["sm_90\n"], "crates": [_crate()]}, "archs"),
    ({"crates": [_crate(**{"ptx-arch": "compute_075"})]}, "crates[0].ptx-arch"),
    ({"ptx-arch": "compute_75\n", "crates": [_crate()]}, "ptx-arch"),
    ({"defines": {"X\n": 1}, "crates": [_crate()]}, "defines"),
    ({"crates": [_crate(defines={"Y\n": "2"})]}, "crates[0].defines"),
], ids=["name-newline", "arch-leading-zero", "arch-newline", "ptx-leading-zero", "ptx-newline",
        "define-newline", "crate-define-newline"])
def test_names_and_values_are_matched_whole(table: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=rf"option {re.escape(repr(named))}"):
        parse_config(table, default_package="p")


@pytest.mark.parametrize("value", ["sm_090", "sm_90,compute_075"])
def test_env_archs_are_matched_whole(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("KHAL_CUDA_ARCHS", value)
    with pytest.raises(ConfigError, match="KHAL_CUDA_ARCHS"):
        parse_config({"crates": [_crate()]}, default_package="p")


def test_runtime_parsers_are_matched_whole() -> None:
    for bad in ("sm_90\n", "sm_090", "compute_075", "compute_75\n"):
        with pytest.raises(ValueError):
            parse_arch(bad)
    assert split_symbol("saxpy_khal_0123456789abcdef") == ("saxpy", "0123456789abcdef")
    assert split_symbol("saxpy_khal_0123456789abcdef\n") is None


# -- (1) a package is named one way: two spellings of one folder are one package, a symlink is refused --


def _hook(proj: Path, crates: list[dict[str, Any]], **table: Any) -> Any:
    from types import SimpleNamespace

    from hatch_khal.plugin import KhalBuildHook

    meta = SimpleNamespace(core=SimpleNamespace(raw_name="mini-pkg"), config={})
    config = {"archs": ["sm_90"], "ptx-arch": "none", "crates": crates, **table}
    return KhalBuildHook(str(proj), config, None, meta, str(proj), "wheel")


_TWO = [{"name": "alpha", "sources": ["kernels/alpha/*.cu"], "include-dirs": ["kernels/include"]},
        {"name": "beta", "sources": ["kernels/beta/*.cu"]}]


@pytest.mark.parametrize("spelling", ["./mini_pkg", "mini_pkg/", "mini_pkg/.", ".//mini_pkg//."])
def test_two_spellings_of_one_package_are_one_package(tmp_path: Path, spelling: str) -> None:
    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "none"\n')
    crates = [dict(_TWO[0], package="mini_pkg"), dict(_TWO[1], package=spelling)]
    _, resolved = parse_config({"crates": crates}, default_package=None)
    assert [c.package for c in resolved] == ["mini_pkg", "mini_pkg"]
    from hatch_khal.frontend import check_packages

    check_packages(root, resolved, "test")
    result, _ = build_resolved(root, resolved, tmp_path / "cache")
    (pkg,) = result.packages  # one package: one manifest with both crates
    assert pkg.package == "mini_pkg"
    assert sorted(c.name for c in pkg.manifest.crates) == ["alpha", "beta"]


def build_resolved(root: Path, crates: list[Any], cache_dir: Path) -> Any:
    from hatch_khal.builder import build_packages
    from hatch_khal.cache import Cache

    from tests.conftest import skip_without
    from tests.helpers.build import Recorder

    skip_without("needs_nvrtc")
    rep = Recorder()
    return build_packages(root, crates, rep, cache=Cache(cache_dir, rep.warn)), rep


@pytest.mark.parametrize("how", ["symlink", "symlinked-parent"])
def test_a_package_named_through_a_symlink_is_refused_by_name(tmp_path: Path, how: str) -> None:
    proj = make_project(tmp_path / "proj")
    if how == "symlink":
        (proj / "alias").symlink_to("mini_pkg", target_is_directory=True)
        alias, real = "alias", "mini_pkg"
    else:
        (proj / "lib" / "inner").mkdir(parents=True)
        (proj / "lib" / "inner" / "__init__.py").write_text("")
        (proj / "src").symlink_to("lib", target_is_directory=True)
        alias, real = "src/inner", "lib/inner"
    crates = [dict(_TWO[0], package="mini_pkg"), dict(_TWO[1], package=alias)]
    for step in ("standard", "editable", "clean"):
        hook = _hook(proj, crates)
        with pytest.raises(ConfigError, match=rf"crate 'beta': option 'package' = '{alias}' reaches the package "
                                              rf"directory '{real}' through a symlink; name it '{real}'"):
            hook.clean([]) if step == "clean" else hook.initialize(step, {"force_include": {}})
    assert not (proj / "mini_pkg" / "_khal").exists() and not (proj / real / "_khal").exists()


def test_one_folder_under_two_names_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A case-insensitive file system gives one folder two names that resolve() keeps apart."""
    from hatch_khal.frontend import check_packages

    proj = make_project(tmp_path / "proj")
    (proj / "other_pkg").mkdir()
    _, resolved = parse_config({"crates": [dict(_TWO[0], package="mini_pkg"), dict(_TWO[1], package="other_pkg")]},
                               default_package=None)
    real_stat = Path.stat

    def same_inode(self: Path, **kw: Any) -> os.stat_result:  # other_pkg plays Mini_Pkg on such a system
        return real_stat(proj / "mini_pkg" if self.name == "other_pkg" else self, **kw)

    monkeypatch.setattr(Path, "stat", same_inode)
    with pytest.raises(ConfigError, match=r"crate 'beta': option 'package' = 'other_pkg' is the directory 'mini_pkg' "
                                          r"\(option 'package' of crate 'alpha'\) spelt another way; spell it"):
        check_packages(proj, resolved, "test")


def test_pip_wheel_of_two_spellings_ships_both_crates(tmp_path: Path) -> None:
    """End to end, without a py.typed in the package: one manifest, both crates, no hatchling error."""
    import zipfile

    crates = textwrap.dedent("""\
        [[tool.hatch.build.targets.wheel.hooks.khal.crates]]
        name = "alpha"
        sources = ["kernels/alpha/*.cu"]
        include-dirs = ["kernels/include"]
        package = "mini_pkg"

        [[tool.hatch.build.targets.wheel.hooks.khal.crates]]
        name = "beta"
        sources = ["kernels/beta/*.cu"]
        package = "./mini_pkg"
        """)
    proj = make_project(tmp_path / "proj", hook='archs = ["sm_90"]\nptx-arch = "none"\n', crates=crates)
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
         str(proj)], env=_env(tmp_path))
    (whl,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
        manifest = parse_manifest(zf.read("mini_pkg/_khal/manifest.json"))
    assert sorted(c.name for c in manifest.crates) == ["alpha", "beta"]
    assert not [n for n in names if "_khal/" in n and not n.startswith("mini_pkg/_khal/")]


def test_setuptools_refuses_a_package_alias_before_compiling(tmp_path: Path) -> None:
    from setuptools.dist import Distribution
    from setuptools.errors import SetupError

    from hatch_khal.setuptools_ext import BuildKhal

    proj = tmp_path / "proj"
    (proj / "mini_pkg").mkdir(parents=True)
    (proj / "mini_pkg" / "__init__.py").write_text("")
    (proj / "alias").symlink_to("mini_pkg", target_is_directory=True)
    (proj / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "mini-pkg"
        version = "0.1.0"

        [[tool.khal.crates]]
        name = "alpha"
        sources = ["k/*.cu"]
        package = "mini_pkg"

        [[tool.khal.crates]]
        name = "beta"
        sources = ["k/*.cu"]
        package = "alias"
        """))
    cmd = BuildKhal(Distribution({"name": "mini-pkg", "packages": ["mini_pkg"], "src_root": str(proj)}))
    cmd.build_lib = str(tmp_path / "build_lib")
    with pytest.raises(SetupError, match=r"crate 'beta': option 'package' = 'alias' reaches the package directory "
                                         r"'mini_pkg' through a symlink"):
        cmd.run()
    assert not (tmp_path / "build_lib").exists()


# -- (2) a configuration the build would not read is an error, not a wheel without kernels ----------

_SETUPTOOLS_PYPROJECT = """\
[build-system]
requires = ["setuptools>=70", "hatch-khal"]
build-backend = "setuptools.build_meta"

[project]
name = "mini-pkg"
version = "0.1.0"

[{table}]
archs = ["sm_90"]

[[{table}.crates]]
name = "alpha"
sources = ["kernels/alpha/*.cu"]
"""

_SETUPTOOLS_BUILD = """\
import os, sys
from setuptools import build_meta
os.makedirs("dist", exist_ok=True)
try:
    getattr(build_meta, sys.argv[1])("dist")
except BaseException as exc:
    print("FAILED:", type(exc).__name__, exc)
else:
    print("BUILT")
"""


@pytest.mark.parametrize("table", ["tool.hatch.build.targets.wheel.hooks.khal", "tool.hatch.build.hooks.khal",
                                   "tool.hatch.build.targets.sdist.hooks.khal", "tool.hatch-khal", "tool.Khal"])
@pytest.mark.parametrize("hook", ["build_wheel", "build_sdist", "build_editable"])
def test_setuptools_build_with_only_a_hatch_table_is_refused(tmp_path: Path, table: str, hook: str) -> None:
    """A hatch hook table (or a misspelt [tool.khal]) in a setuptools build: was a warning that pip shows
    only with -v, and a wheel without kernels."""
    proj = tmp_path / "proj"
    (proj / "mini_pkg").mkdir(parents=True)
    (proj / "mini_pkg" / "__init__.py").write_text("")
    (proj / "pyproject.toml").write_text(_SETUPTOOLS_PYPROJECT.format(table=table))
    out = run([sys.executable, "-c", _SETUPTOOLS_BUILD, hook], cwd=proj, env=_env(tmp_path)).stdout
    assert "FAILED:" in out, out
    assert f"has [{table}] but no [tool.khal], and this is a setuptools build" in out
    assert "name the table [tool.khal]" in out
    assert not list((proj / "dist").iterdir())


def test_a_hatchling_project_is_not_refused_by_the_setuptools_plugin(tmp_path: Path) -> None:
    """setuptools running where the project's backend is hatchling is not that project's build."""
    from setuptools.dist import Distribution

    from hatch_khal.setuptools_ext import finalize_distribution_options, read_khal_table

    proj = make_project(tmp_path / "proj")
    dist = Distribution({"name": "mini-pkg", "src_root": str(proj)})
    finalize_distribution_options(dist)
    assert read_khal_table(dist) is None


def test_pip_wheel_setuptools_with_only_the_hatch_table_fails(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "mini_pkg").mkdir(parents=True)
    (proj / "mini_pkg" / "__init__.py").write_text("")
    (proj / "pyproject.toml").write_text(_SETUPTOOLS_PYPROJECT.format(table="tool.hatch.build.targets.wheel.hooks.khal"))
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
                str(tmp_path / "dist"), str(proj)], env=_env(tmp_path), check=False)
    assert proc.returncode != 0
    assert "but no [tool.khal], and this is a setuptools build" in proc.stdout + proc.stderr
    assert not list(tmp_path.glob("dist/*.whl"))


def test_hatchling_hook_table_for_every_target_is_refused_in_the_wheel_too(tmp_path: Path) -> None:
    """[tool.hatch.build.hooks.khal] built the wheel and failed only the sdist (python -m build failed
    where pip wheel passed): refused in both, before anything is compiled, naming the wheel's table."""
    proj = make_project(tmp_path / "proj")
    text = (proj / "pyproject.toml").read_text().replace("tool.hatch.build.targets.wheel.hooks.khal",
                                                          "tool.hatch.build.hooks.khal")
    (proj / "pyproject.toml").write_text(text)
    for cmd in (["wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp_path / "dist")],):
        proc = run([sys.executable, "-m", "pip", *cmd, str(proj)], env=_env(tmp_path), check=False)
        assert proc.returncode != 0, proc.stdout
        out = proc.stdout + proc.stderr
        assert "is configured in [tool.hatch.build.hooks.khal], which applies to every target" in out, out[-3000:]
        assert "name the table [tool.hatch.build.targets.wheel.hooks.khal]" in out
    out = run([sys.executable, "-c", "import hatchling.build as b, os; os.makedirs('d'); b.build_sdist('d')"],
              cwd=proj, env=_env(tmp_path), check=False)
    assert out.returncode != 0 and "is configured in [tool.hatch.build.hooks.khal]" in out.stderr
    assert not (proj / "mini_pkg" / "_khal").exists()


def test_no_manifest_at_import_names_the_tables(tmp_path: Path) -> None:
    """A hatchling project with [tool.khal] only: hatchling never imports hatch-khal (its plugins load
    only for a hook table), so the first word comes at import: it names the tables."""
    from khal_runtime.errors import ManifestError
    from khal_runtime.manifest import load_manifest

    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "_khal" / "manifest.json")
    msg = str(info.value)
    assert "no khal manifest" in msg and "[tool.hatch.build.targets.wheel.hooks.khal]" in msg
    assert "(not [tool.khal]" in msg and "setuptools' [tool.khal]" in msg


# -- (3) and (15) Slang: a compute entry without [numthreads]; vertex / fragment entries beside compute ones --

_SLANG_ENTRY = """\
[shader("compute")]
{numthreads}
void f(uint3 t : SV_DispatchThreadID, uniform RWStructuredBuffer<float> o) {{ o[t.x] = 1.0; }}
"""

_GRAPHICS = """\
struct VOut { float4 pos : SV_Position; };

[shader("vertex")]
VOut vmain(uint vid : SV_VertexID) { VOut o; o.pos = float4(0, 0, 0, 1); return o; }

[shader("fragment")]
float4 fmain() : SV_Target { return float4(1, 0, 0, 1); }
"""


@needs_slang
@pytest.mark.parametrize("numthreads", ["", "// [numthreads(64, 1, 1)]", "/* [numthreads(8, 1, 1)] */"],
                         ids=["none", "in-a-line-comment", "in-a-block-comment"])
def test_slang_compute_entry_without_numthreads_names_file_and_line(tmp_path: Path, numthreads: str) -> None:
    from hatch_khal.errors import SourceError

    from tests.helpers.slang import compile_files

    with pytest.raises(SourceError) as info:
        compile_files(tmp_path, {"k/e.slang": _SLANG_ENTRY.format(numthreads=numthreads)}, targets=("cuda",))
    assert str(info.value).startswith("k/e.slang:3: crate 'demo': entry 'f': has no [numthreads(X, Y, Z)] attribute")
    assert "add [numthreads(64, 1, 1)]" in str(info.value)


@needs_slang
def test_slang_numthreads_of_one_written_out_builds(tmp_path: Path) -> None:
    from tests.helpers.slang import compile_files

    out = compile_files(tmp_path, {"k/e.slang": _SLANG_ENTRY.format(numthreads="[numthreads(1, 1, 1)]")},
                        targets=("cuda",))
    assert [(e.name, e.block_size) for e in out.entries] == [("f", (1, 1, 1))]


@needs_slang
@pytest.mark.parametrize("crash", [False, True], ids=["fails", "crashes"])
def test_slang_vertex_and_fragment_entries_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     crash: bool) -> None:
    """Slang's CUDA compile fails (an internal error) on them, or could crash: either way the build
    names the entries that are not compute ones, where they are, and what to do."""
    from hatch_khal.errors import SourceError
    from hatch_khal.slang.worker import CRASH_ENV

    from tests.helpers.slang import compile_files

    if crash:
        monkeypatch.setenv(CRASH_ENV, "cuda")
    source = _SLANG_ENTRY.format(numthreads="[numthreads(64, 1, 1)]") + _GRAPHICS
    with pytest.raises(SourceError) as info:
        compile_files(tmp_path, {"k/e.slang": source}, targets=("cuda",))
    msg = str(info.value)
    assert msg.startswith("k/e.slang:7: crate 'demo': entries 'vmain' ([shader(\"vertex\")] at k/e.slang:7), "
                          "'fmain' ([shader(\"fragment\")] at k/e.slang:10) are not compute entries"), msg
    assert "(its compute entries: 'f')" in msg and "move them to a .slang file that is not one of the crate's" in msg


@needs_slang
def test_slang_crash_without_graphics_entries_stays_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hatch_khal.slang.client import SlangCrashed
    from hatch_khal.slang.worker import CRASH_ENV

    from tests.helpers.slang import compile_files

    monkeypatch.setenv(CRASH_ENV, "cuda")
    with pytest.raises(SlangCrashed):
        compile_files(tmp_path, {"k/e.slang": _SLANG_ENTRY.format(numthreads="[numthreads(64, 1, 1)]")},
                      targets=("cuda",))


# -- (11) PTX is read without its comments ----------------------------------------------------------

_PTX_HEAD = b".version 8.0\n.target sm_90\n.address_size 64\n"


@pytest.mark.parametrize("ptx, functions", [
    (_PTX_HEAD + b"/*\n.visible .entry k_khal_0123456789abcdef(\n)\n{ ret; }\n*/\n", ()),
    (_PTX_HEAD + b"// .visible .entry k_khal_0123456789abcdef(\n", ()),
    (_PTX_HEAD + b"/* a */ .visible .entry k_khal_0123456789abcdef(\n)\n{ ret; }\n", ("k_khal_0123456789abcdef",)),
    (_PTX_HEAD + b'.file 1 "/src//k/*.cu"\n.visible .entry k_khal_0123456789abcdef(\n)\n{ ret; }\n',
     ("k_khal_0123456789abcdef",)),
], ids=["entry-in-block-comment", "entry-in-line-comment", "entry-after-comment", "comment-marks-in-a-string"])
def test_ptx_entries_in_comments_are_not_entries(ptx: bytes, functions: tuple[str, ...]) -> None:
    from khal_runtime.binaries import scan_ptx

    assert scan_ptx(ptx).functions == functions


@pytest.mark.parametrize("ptx", [
    b".version 8.0\n// .target sm_90\n.address_size 64\n",
    b"/* .version 8.0 */\n.target sm_90\n",
    b".version 8.0\n/*\n.target sm_90\n*/\n.target sm_80 // the real one is sm_80\n",
], ids=["target-in-comment", "version-in-comment", "real-target-after-a-commented-one"])
def test_ptx_directives_in_comments_are_not_read(ptx: bytes) -> None:
    from khal_runtime.binaries import BinaryFormatError, scan_ptx

    if b"sm_80" in ptx:
        assert scan_ptx(ptx).arch == 80
        return
    with pytest.raises(BinaryFormatError, match="outside comments"):
        scan_ptx(ptx)


def test_prebuilt_ptx_whose_entry_is_only_in_a_comment_is_refused(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled PTX of crate alpha with its kernel's .entry moved into a comment (and the kernel
    turned into a .func): the build took it, and the launch failed with CUDA_ERROR_NOT_FOUND."""
    from hatch_khal.errors import PrebuiltError

    from tests.helpers.build import build

    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "compute_90"\n')
    result, _ = build(root, tmp_path / "cache")
    (pkg,) = result.packages
    ptx = pkg.files["_khal/alpha/alpha.compute_90.ptx"]
    m = re.search(rb"\.visible \.entry (scale_khal_[0-9a-f]{16})\(", ptx)
    assert m is not None
    hidden = ptx.replace(m.group(0), b"/*\n" + m.group(0) + b"\n*/\n.visible .func " + m.group(1) + b"(", 1)
    pre = tmp_path / "alpha.ptx"
    pre.write_bytes(hidden)
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_ALPHA", str(pre))
    with pytest.raises(PrebuiltError, match=rf"crate 'alpha': prebuilt ptx alpha.ptx has no kernel for entry 'scale' "
                                            rf"\(expected symbol {m.group(1).decode()}\)"):
        build(root, tmp_path / "cache")


# -- (15) __restrict in a marker's type; a header the runtime wheel does not ship ---------------------


@pytest.mark.parametrize("marker", ["KHAL_STORAGE(float __restrict, x)", "KHAL_STORAGE(const float __restrict, x)",
                                    "KHAL_UNIFORM(Params __restrict, x)", "KHAL_STORAGE(restrict float, x)"])
def test_restrict_spelt_other_than_restrict_underscores_is_refused_by_name(marker: str) -> None:
    from hatch_khal.entries import scan_source
    from hatch_khal.errors import EntryParseError

    word = "restrict" if "restrict float" in marker else "__restrict"
    with pytest.raises(EntryParseError, match=rf"k.cu:1: entry 'k' parameter 'x': type .*: write '__restrict__', "
                                              rf"not '{word}': hatch-khal puts __restrict__ on the pointer"):
        scan_source(f"KHAL_ENTRY(k, 32, ({marker}))\n{{ }}\n", "k.cu")


def test_restrict_on_a_by_value_parameter_is_refused_not_dropped() -> None:
    from hatch_khal.entries import scan_source
    from hatch_khal.errors import EntryParseError

    with pytest.raises(EntryParseError, match=r"k.cu:1: entry 'k' parameter 's': type 'float __restrict__': KHAL_SCALAR "
                                              r"is passed by value, so '__restrict__' .* has nothing to apply to; drop it"):
        scan_source("KHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x), KHAL_SCALAR(float __restrict__, s)))\n{ }\n", "k.cu")


def test_restrict_underscores_still_builds(tmp_path: Path) -> None:
    from tests.helpers.build import build, manifest_of

    src = "KHAL_ENTRY(fill, 64, (KHAL_STORAGE(uint32_t __restrict__, out), KHAL_SCALAR(uint32_t, value)))\n{ }\n"
    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "none"\n',
                        files={"kernels/beta/fill.cu": src})
    m, _ = manifest_of(build(root, tmp_path / "cache")[0])
    assert [p.name for p in m.crate("beta").entries[0].params] == ["out", "value"]


def test_profiler_api_header_hint_says_what_it_is(tmp_path: Path) -> None:
    """<cuda_profiler_api.h>: the hint said to install nvidia-cuda-runtime, which is installed and does
    not ship it (and NVRTC refuses the header's __host__ functions where it is found)."""
    from hatch_khal.errors import CompileError

    from tests.helpers.build import build

    src = "#include <cuda_profiler_api.h>\nKHAL_ENTRY(fill, 64, (KHAL_STORAGE(float, o))) { }\n"
    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "none"\n',
                        files={"kernels/beta/fill.cu": src})
    with pytest.raises(CompileError) as err:
        build(root, None)
    (hint,) = [line for line in str(err.value).splitlines() if line.startswith("hint: ")]
    assert "pip install" not in hint and "comes from the" not in hint
    assert "<cuda_profiler_api.h> (cudaProfilerStart / cudaProfilerStop) is the CUDA profiler's host API" in hint
    assert "drop the #include" in hint


def test_a_runtime_looking_header_the_installed_wheel_lacks_is_not_sent_to_pip_install() -> None:
    from hatch_khal.headers import header_hint, resolve_headers

    if not resolve_headers("wheels", 13).include_dirs:
        pytest.skip("no CUDA 13 header wheels here")
    hint = header_hint("cuda_not_a_real_header.h", "wheels", 13)
    assert "the nvidia-cuda-runtime wheel installed here does not ship it" in hint and "pip install" not in hint
    assert "comes from the nvidia-cuda-runtime wheel" in header_hint("cuda_fp16.h", "wheels", 13)
