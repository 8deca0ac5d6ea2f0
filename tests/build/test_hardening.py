"""Build-side hardening (issue #16 and #17): each test failed on the code before its fix."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from hatch_khal.builder import build_packages
from hatch_khal.cache import Cache
from hatch_khal.errors import ConfigError, EntryParseError, KhalBuildError, PrebuiltError, SourceError
from khal_runtime.binaries import khal_symbols, read_binary
from khal_runtime.manifest import parse_manifest
from khal_runtime.verify import check_sources

from tests.helpers.build import Recorder, _crates, build, manifest_of, worker_children
from tests.helpers.projects import COMMON_CUH, HALF_CU, OTHER_CU, SCALE_CU, make_project
from tests.conftest import ROOT, SESSION_ENV, build_env, run


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV:
            monkeypatch.delenv(k)


def _hashes(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    m, _ = manifest_of(result)
    return {e.name: e.hash for c in m.crates for e in c.entries}


def _params_size(result) -> int:  # type: ignore[no-untyped-def]
    m, _ = manifest_of(result)
    return m.crate("alpha").entries[0].params[1].element_size


# -- (2) every file the compiler can read is hashed ------------------------------------------------

HIDDEN_INCLUDES = {
    "macro": '#define H "common.cuh"\n#include H\n',
    "comment-in-directive": '#/**/include "common.cuh"\n',
    "macro-angle": "#define H <common.cuh>\n#include H\n",
    "line-continuation": '#inc\\\nlude "common.cuh"\n',
}


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("how, where", [(h, w) for h in sorted(HIDDEN_INCLUDES) for w in ("include-dir", "source-dir")
                                        if not (h == "macro-angle" and w == "source-dir")])  # <...>: include path only
def test_header_the_scanner_cannot_see_is_still_hashed(tmp_path: Path, how: str, where: str) -> None:
    scale = SCALE_CU.replace('#include "common.cuh"\n', HIDDEN_INCLUDES[how])
    files = {"kernels/alpha/scale.cu": scale}
    if where == "source-dir":  # next to the source, no include dir needed for the quoted form
        files["kernels/alpha/common.cuh"] = COMMON_CUH
        os.makedirs(tmp_path / "p/kernels/include", exist_ok=True)
    root = make_project(tmp_path / "p", files=files)
    if where == "source-dir":
        (root / "kernels/include/common.cuh").unlink()
    header = root / ("kernels/alpha/common.cuh" if where == "source-dir" else "kernels/include/common.cuh")
    cache = tmp_path / "cache"
    first, _ = build(root, cache)
    assert _params_size(first) == 16
    header.write_text("#pragma once\nstruct Params { float a; double b; float c; };\n")
    second, _ = build(root, cache)
    assert _params_size(second) == 24, "the cache served a binary built from the old header"
    assert _hashes(second)["scale"] != _hashes(first)["scale"]
    m, _ = manifest_of(second)
    assert any(s.path.endswith("common.cuh") for s in m.crate("alpha").sources)


@pytest.mark.parametrize(
    "options, named",
    [
        (["-Ikernels/include"], "-Ikernels/include"),
        (["-I", "kernels/include"], "-I"),
        (["--include-path=kernels/include"], "--include-path=kernels/include"),
        (["-include", "common.cuh"], "-include"),
        (["--pre-include=common.cuh"], "--pre-include=common.cuh"),
        (["-isystem", "kernels/include"], "-isystem"),
    ],
)
def test_include_options_are_refused_naming_the_option(tmp_path: Path, options: list[str], named: str) -> None:
    opts = ", ".join(json.dumps(o) for o in options)
    root = make_project(tmp_path / "p", hook=f'archs = ["sm_90"]\noptions = [{opts}]\n')
    with pytest.raises(ConfigError) as err:
        build(root, None)
    msg = str(err.value)
    assert repr(named) in msg and "include-dirs" in msg


# -- (5) the package stays inside the project; nothing foreign is deleted --------------------------


def test_package_outside_the_project_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside_pkg"
    (outside / "_khal").mkdir(parents=True)
    (outside / "_khal" / "precious.txt").write_text("keep me")
    (outside / "__init__.py").write_text("")
    proj = make_project(tmp_path / "proj", hook='archs = ["sm_90"]\npackage = "../outside_pkg"\n')
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                "-w", str(tmp_path / "dist"), str(proj)], env=build_env(tmp_path / "cache"), check=False)
    assert proc.returncode != 0
    assert "'../outside_pkg'" in proc.stderr and "inside the project" in proc.stderr
    assert (outside / "_khal" / "precious.txt").read_text() == "keep me"
    assert not list((tmp_path).glob("dist/*.whl"))


def _tree(top: Path) -> dict[str, bytes]:
    return {str(f.relative_to(top)): f.read_bytes() for f in sorted(top.rglob("*")) if f.is_file()}


def _outside_package(tmp_path: Path) -> Path:
    outside = tmp_path / "outside_pkg"
    (outside / "_khal").mkdir(parents=True)
    (outside / "_khal" / "precious.txt").write_text("keep me")
    (outside / "__init__.py").write_text("")
    return outside


@pytest.mark.parametrize("how", ["absolute", "symlink-out"])
def test_absolute_or_symlinked_package_outside_the_project_is_refused_by_the_hatch_hook(
        tmp_path: Path, how: str) -> None:
    """The hook itself (no pip): every step that would write or delete <package>/_khal refuses
    first, and the folder outside keeps its files; nothing new appears there."""
    from types import SimpleNamespace

    from hatch_khal.plugin import KhalBuildHook

    outside = _outside_package(tmp_path)
    proj = make_project(tmp_path / "proj")
    if how == "absolute":
        package = str(outside)
    else:
        (proj / "linked_pkg").symlink_to(outside, target_is_directory=True)
        package = "linked_pkg"
    before = _tree(outside)
    crates = [{"name": "alpha", "sources": ["kernels/alpha/*.cu"], "include-dirs": ["kernels/include"],
               "package": package}]
    meta = SimpleNamespace(core=SimpleNamespace(raw_name="mini-pkg"))
    steps = {"standard": lambda h: h.initialize("standard", {"force_include": {}}),
             "editable": lambda h: h.initialize("editable", {"force_include": {}}),
             "clean": lambda h: h.clean([])}
    for step, do in steps.items():
        hook = KhalBuildHook(str(proj), {"archs": ["sm_90"], "crates": crates}, None, meta, str(proj), "wheel")
        with pytest.raises(ConfigError, match=rf"crate 'alpha': option 'package' = {re.escape(repr(package))} "
                                              r"must name a package directory inside the project"):
            do(hook)
        assert _tree(outside) == before, step
    assert not (proj / "mini_pkg" / "_khal").exists()


def test_setuptools_package_that_is_not_a_distribution_package_is_refused(tmp_path: Path) -> None:
    """setuptools: `package` must be one of the distribution's packages (else the kernels would be
    written to build_lib at a path no installed package has); refused before anything is compiled."""
    from setuptools.dist import Distribution
    from setuptools.errors import SetupError

    from hatch_khal.setuptools_ext import BuildKhal

    proj = tmp_path / "proj"
    (proj / "src" / "mini_pkg").mkdir(parents=True)
    (proj / "src" / "mini_pkg" / "__init__.py").write_text("")
    (proj / "tools" / "helper").mkdir(parents=True)  # inside the project, but not shipped
    (proj / "tools" / "helper" / "__init__.py").write_text("")
    (proj / "kernels" / "alpha").mkdir(parents=True)
    (proj / "kernels" / "alpha" / "fill.cu").write_text(OTHER_CU)
    (proj / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "mini-pkg"
        version = "0.1.0"

        [tool.khal]
        archs = ["sm_90"]

        [[tool.khal.crates]]
        name = "alpha"
        sources = ["kernels/alpha/*.cu"]
        package = "tools/helper"
        """))
    dist = Distribution({"name": "mini-pkg", "packages": ["mini_pkg"], "package_dir": {"": "src"},
                         "src_root": str(proj)})
    cmd = BuildKhal(dist)
    cmd.build_lib = str(tmp_path / "build_lib")
    before = _tree(proj)
    with pytest.raises(SetupError, match=r"package directory 'tools/helper' is not one of the distribution's "
                                         r"packages \(mini_pkg\); list it in \[tool.setuptools\] packages"):
        cmd.run()
    assert _tree(proj) == before and not (tmp_path / "build_lib").exists()


@pytest.mark.needs_nvrtc
def test_existing_foreign_khal_folder_is_not_deleted(tmp_path: Path) -> None:
    from hatch_khal.builder import write_package_output

    root = make_project(tmp_path / "p")
    result, _ = build(root, None, editable=True)
    (out,) = result.packages
    foreign = root / "mini_pkg" / "_khal"
    foreign.mkdir()
    (foreign / "data.bin").write_bytes(b"user data")
    with pytest.raises(KhalBuildError, match=r"mini_pkg/_khal.*not written by hatch-khal"):
        write_package_output(out, root / "mini_pkg")
    assert (foreign / "data.bin").read_bytes() == b"user data"
    # our own output is replaced freely
    (foreign / "data.bin").unlink()
    foreign.rmdir()
    write_package_output(out, root / "mini_pkg")
    write_package_output(out, root / "mini_pkg")
    assert (foreign / "manifest.json").is_file()


# -- (8) an artifact for another arch is never shipped ---------------------------------------------


@pytest.mark.needs_nvrtc
def test_swapped_cache_entries_are_rebuilt_not_shipped(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", hook='archs = ["sm_80", "sm_90"]\nptx-arch = "compute_75"\n')
    cache = tmp_path / "cache"
    build(root, cache)
    by_crate: dict[tuple[str, ...], dict[tuple[int, str], Path]] = {}
    for art in (cache / "v1").glob("*/*/artifact.bin"):
        info = read_binary(art.read_bytes())
        by_crate.setdefault(tuple(sorted(khal_symbols(info))), {})[(info.arch, info.kind)] = art.parent
    for slots in by_crate.values():  # swap sm_80 <-> sm_90 contents (meta included: sha256 stays valid)
        a, b = slots[(80, "cubin")], slots[(90, "cubin")]
        tmp = a.parent / "swap"
        os.rename(a, tmp)
        os.rename(b, a)
        os.rename(tmp, b)
    result, rep = build(root, cache)
    m, files = manifest_of(result)
    for crate in m.crates:
        for art in crate.artifacts:
            assert read_binary(files[art.path]).arch == art.sm, art.path
    assert result.compiled == 4 and any("sm_" in w and "rebuild" in w for w in rep.warnings), rep.warnings


# -- (10) a cache whose fan-out folders are unusable degrades to no cache --------------------------


@pytest.mark.needs_nvrtc
def test_files_where_cache_fanout_folders_should_be(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "v1").mkdir(parents=True)
    for i in range(256):
        (cache / "v1" / f"{i:02x}").write_text("not a folder")
    root = make_project(tmp_path / "p")
    result, rep = build(root, cache)
    assert result.compiled == 6  # each crate's first PTX (hatch_khal.cuda prepare) again: the cache stores nothing
    assert rep.warnings and all("cache" in w for w in rep.warnings)
    again, _ = build(root, cache)
    assert manifest_of(again)[1] == manifest_of(result)[1]


@pytest.mark.needs_nvrtc
def test_unwritable_cache_fanout_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    cache = tmp_path / "cache"
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*a, **kw):  # type: ignore[no-untyped-def]
        if str(kw.get("dir", "")).startswith(str(cache / "v1" / "")):
            raise PermissionError(13, "Permission denied")
        return real_mkdtemp(*a, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    root = make_project(tmp_path / "p")
    result, rep = build(root, cache)
    # each crate's first PTX (hatch_khal.cuda prepare) compiles again: the cache stores nothing
    assert result.compiled == 6 and any("Permission denied" in w for w in rep.warnings)


# -- (11) prebuilt files: regular files of bounded size only ---------------------------------------

_PREBUILT_SCRIPT = """
import resource, sys, tomllib
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from pathlib import Path
from hatch_khal.builder import build_packages
from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from hatch_khal.errors import PrebuiltError
root = Path(sys.argv[1])
raw = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["khal"]
try:
    rep = type("R", (), {"info": lambda s, m: None, "warn": lambda s, m: None, "debug": lambda s, m: None})()
    build_packages(root, parse_config(raw, default_package="mini_pkg")[1], rep, cache=Cache(None))
except PrebuiltError as exc:
    print("PrebuiltError:", exc)
"""


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "sparse-1g"])
def test_prebuilt_special_files_are_refused_quickly(tmp_path: Path, kind: str) -> None:
    if sys.version_info < (3, 11):
        pytest.skip("the script uses tomllib")
    root = make_project(tmp_path / "p")
    if kind == "dev-zero":
        pre = Path("/dev/zero")
    elif kind == "fifo":
        pre = tmp_path / "pipe"
        os.mkfifo(pre)
    else:
        pre = tmp_path / "big.ptx"
        with open(pre, "wb") as f:
            f.truncate(1 << 30)
    env = build_env(tmp_path / "cache", CUDA_OXIDE_SHADERS_PTX_ALPHA=str(pre))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _PREBUILT_SCRIPT, str(root)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert time.monotonic() - t0 < 30
    out = proc.stdout + proc.stderr
    assert "PrebuiltError:" in out and "CUDA_OXIDE_SHADERS_PTX_ALPHA" in out, out[-2000:]
    assert ("not a regular file" in out) if kind != "sparse-1g" else ("more than" in out), out[-2000:]


# -- (12) a prebuilt variable for no crate: another package's, ignored; a near miss, refused (#38 item 10) --


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("var", ["CUDA_OXIDE_SHADERS_PTX_GAMMA", "CUDA_OXIDE_SHADERS_PTX_OTHER_PKG_CORE",
                                 "CUDA_OXIDE_SHADERS_PTX_ALPHABET_SOUP"])
def test_a_prebuilt_variable_of_another_package_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           var: str) -> None:
    """A CI that builds several shader packages sets every package's variables for all of them, as
    khal's build scripts expect (each reads its own crate's): one naming no crate of this build
    failed it (it was refused since #29, as a typo)."""
    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "none"\n')
    monkeypatch.setenv(var, str(tmp_path / "elsewhere.ptx"))
    result, rep = build(root, tmp_path / "cache")
    (pkg,) = result.packages
    assert all(c.prebuilt is None for c in pkg.manifest.crates)  # compiled from their sources
    assert not any(var in w for w in rep.warnings)


@pytest.mark.parametrize("var, meant", [
    ("CUDA_OXIDE_SHADERS_PTX_ALHPA", "alpha"),   # two letters swapped
    ("CUDA_OXIDE_SHADERS_PTX_alpha", "alpha"),   # case
    ("CUDA_OXIDE_SHADERS_PTX_ALPH", "alpha"),    # a letter short
    ("CUDA_OXIDE_SHADERS_PTX_BETAA", "beta"),    # a letter more
    ("CUDA_OXIDE_SHADERS_PTX_MY-CRATE", "my_crate"),  # '-' for '_'
    ("CUDA_OXIDE_SHADERS_PTX_MY_CRAET", "my_crate"),
    ("CUDA_OXIDE_SHADERS_PTX_PARTICELS", "particles"),
    ("CUDA_OXIDE_SHADERS_PTX_PARTICLS", "particles"),
    ("CUDA_OXIDE_SHADERS_PTX_PATRICELS", "particles"),  # two edits on a long name
])
def test_a_near_miss_of_a_crate_of_this_build_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, var: str,
                                                                    meant: str) -> None:
    from hatch_khal.config import parse_config
    from hatch_khal.plan import check_prebuilt_variables

    from tests.helpers.build import Recorder

    names = ["alpha", "beta", "my_crate", "particles"]
    _, crates = parse_config({"crates": [{"name": n, "sources": [f"k/{n}/*.cu"]} for n in names]}, default_package="p")
    monkeypatch.setenv(var, "/tmp/x.ptx")
    with pytest.raises(ConfigError) as info:
        check_prebuilt_variables(crates, Recorder())
    want = "CUDA_OXIDE_SHADERS_PTX_" + meant.upper()
    msg = str(info.value)
    assert msg.startswith(f"{var} is set, and no crate of this build is called that, but it is a near miss of "
                          f"{want}, the variable of crate {meant!r}: rename it {want}"), msg
    assert "CUDA_OXIDE_SHADERS_PTX_BETA" in msg  # the crates and their variables


@pytest.mark.parametrize("var", ["CUDA_OXIDE_SHADERS_PTX_GAMMA", "CUDA_OXIDE_SHADERS_PTX_BETS",
                                 "CUDA_OXIDE_SHADERS_PTX_AB", "CUDA_OXIDE_SHADERS_PTX_CORE"])
def test_short_names_one_letter_off_are_other_crates(monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    """A name of 3 letters or fewer is a near miss only by case or '-'; 4 to 7 letters, one letter off;
    8 or more, two: ``BETS``, one letter off ``BETA``, is refused; ``AB``, one off crate ``ac``, is not."""
    from hatch_khal.config import parse_config
    from hatch_khal.plan import check_prebuilt_variables

    from tests.helpers.build import Recorder

    _, crates = parse_config({"crates": [{"name": n, "sources": [f"k/{n}/*.cu"]} for n in ("beta", "ac")]},
                             default_package="p")
    monkeypatch.setenv(var, "/tmp/x.ptx")
    if var.endswith("BETS"):
        with pytest.raises(ConfigError, match="near miss of CUDA_OXIDE_SHADERS_PTX_BETA"):
            check_prebuilt_variables(crates, Recorder())
    else:
        check_prebuilt_variables(crates, Recorder())


def test_empty_prebuilt_variable_for_no_crate_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "none"\n')
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_GAMMA", "")
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_ALPHA_", "")  # a near miss, but it gives nothing: ignored
    _, rep = build(root, tmp_path / "cache")
    assert not any("GAMMA" in w or "ALPHA_" in w for w in rep.warnings)


# -- (13) files outside the project and sources through symlinks -----------------------------------


@pytest.mark.needs_nvrtc
def test_editable_build_with_an_include_dir_outside_the_project(tmp_path: Path) -> None:
    from hatch_khal.builder import write_package_output

    (tmp_path / "shared_inc").mkdir()
    (tmp_path / "shared_inc" / "common.cuh").write_text(COMMON_CUH)
    crates = ('[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "alpha"\n'
              'sources = ["kernels/alpha/*.cu"]\ninclude-dirs = ["../shared_inc"]\n')
    root = make_project(tmp_path / "proj", crates=crates)
    (root / "kernels/include/common.cuh").unlink()
    result, _ = build(root, None, editable=True)
    (out,) = result.packages
    write_package_output(out, root / "mini_pkg")
    m = parse_manifest((root / "mini_pkg/_khal/manifest.json").read_bytes())
    assert check_sources(m) == []  # no StaleBuildError right after building
    # the runtime never reads outside the project (#16.6): an edit there is not seen at import
    # (a rebuild sees it: the content hash covers the file)
    (tmp_path / "shared_inc" / "common.cuh").write_text(COMMON_CUH + "// edited\n")
    assert check_sources(m) == []
    rebuilt, _ = build(root, None, editable=True)
    assert manifest_of(rebuilt)[0].crate("alpha").content_hash != m.crate("alpha").content_hash
    # a non-editable build names the external file without a machine-specific path
    plain, _ = build(root, None)
    paths = [s.path for s in manifest_of(plain)[0].crate("alpha").sources]
    assert not any(str(tmp_path) in p for p in paths) and any("shared_inc/common.cuh" in p for p in paths)


@pytest.mark.needs_nvrtc
def test_sources_through_symlinks_to_same_named_files_are_distinct(tmp_path: Path) -> None:
    for d, entry in (("extA", "one"), ("extB", "two")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "k.cu").write_text(OTHER_CU.replace("fill", entry))
    root = make_project(tmp_path / "proj")
    (root / "kernels/beta/fill.cu").unlink()
    (root / "kernels/beta/a.cu").symlink_to(tmp_path / "extA" / "k.cu")
    (root / "kernels/beta/b.cu").symlink_to(tmp_path / "extB" / "k.cu")
    result, _ = build(root, None, editable=True)
    m, _ = manifest_of(result)
    assert [e.name for e in m.crate("beta").entries] == ["one", "two"]
    assert len({s.path for s in m.crate("beta").sources}) == 2
    from hatch_khal.builder import write_package_output

    write_package_output(result.packages[0], root / "mini_pkg")
    assert check_sources(parse_manifest((root / "mini_pkg/_khal/manifest.json").read_bytes())) == []


# -- (14) generated symbol names never collide -----------------------------------------------------


def test_entry_names_whose_symbols_collide_are_refused(tmp_path: Path) -> None:
    two = OTHER_CU + OTHER_CU.replace("fill", "fill_indirect")
    root = make_project(tmp_path / "p", files={"kernels/beta/fill.cu": two})
    with pytest.raises(SourceError) as err:
        build(root, None)
    msg = str(err.value)
    assert "'fill'" in msg and "'fill_indirect'" in msg and "kernels/beta/fill.cu:" in msg


# -- (15) a KHAL_ENTRY the scanner cannot read is reported -----------------------------------------

MACRO_ENTRY = """\
#define MK(n) KHAL_ENTRY(n, 64, (KHAL_STORAGE(uint32_t, out)))
MK(hidden) { out[0] = 1; }
""" + OTHER_CU


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("src", [MACRO_ENTRY, MACRO_ENTRY.replace("#define MK(n) KHAL_ENTRY", "#define E KHAL_ENTRY\n#define MK(n) E")],
                         ids=["macro", "aliased-marker"])
def test_entry_produced_by_a_macro_is_reported(tmp_path: Path, src: str) -> None:
    root = make_project(tmp_path / "p", files={"kernels/beta/fill.cu": src})
    with pytest.raises(EntryParseError) as err:
        build(root, None)
    msg = str(err.value)
    line = src.splitlines().index(next(ln for ln in src.splitlines() if ln.startswith("MK(hidden)"))) + 1
    assert f"kernels/beta/fill.cu:{line}:" in msg and "'hidden'" in msg and "macro" in msg


@pytest.mark.needs_nvrtc
def test_entry_compiled_out_is_reported(tmp_path: Path) -> None:
    # a condition the scanner cannot decide (the compiler's version): the entry is kept, and
    # reported by name, file, line and condition when the compiler leaves it out
    src = "#if __CUDACC_VER_MAJOR__ < 10\n" + OTHER_CU.replace("fill", "gone") + "#endif\n" + OTHER_CU
    root = make_project(tmp_path / "p", files={"kernels/beta/fill.cu": src})
    with pytest.raises(EntryParseError, match=r"kernels/beta/fill\.cu:2: .*'gone'.*not compiled.*__CUDACC_VER_MAJOR__"):
        build(root, None)


# -- (16) worker processes end with their parent ---------------------------------------------------

_KILL_SCRIPT = """
import sys, tomllib
from pathlib import Path
from hatch_khal.builder import build_packages
from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
root = Path(sys.argv[1])
raw = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["khal"]
crates = parse_config(raw, default_package="mini_pkg")[1]
quiet = type("Q", (), {"info": lambda s, m: None, "warn": lambda s, m: None, "debug": lambda s, m: None})()
build_packages(root, crates, quiet, cache=Cache(None), jobs=2)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux") or sys.version_info < (3, 11), reason="reads /proc")
def test_workers_end_when_the_build_is_killed(tmp_path: Path) -> None:
    hook = 'archs = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100"]\nptx-arch = "none"\n'
    root = make_project(tmp_path / "p", hook=hook, files={"kernels/beta/fill.cu": HALF_CU})
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(root)], env=build_env(tmp_path / "c"))
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            workers = worker_children(proc.pid)
        assert len(workers) == 2, "the build did not start two compile workers"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [w for w in workers if _alive(w)]
    finally:
        for w in worker_children(proc.pid):
            os.kill(w, signal.SIGKILL)
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, "compile workers outlived the killed build"


# -- (17) scanning is linear -----------------------------------------------------------------------


class _CountedText(str):
    """A scanned text whose scans (``count``, ``find``, indexing, slicing) add the characters
    they cover to :data:`_WORK`."""

    def _span(self, start: int | None, end: int | None) -> None:
        _WORK[0] += len(range(*slice(start, end).indices(len(self))))

    def count(self, sub: str, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        self._span(start, end)
        return super().count(sub, start, end)

    def find(self, sub: str, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        self._span(start, end)
        return super().find(sub, start, end)

    def rfind(self, sub: str, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        self._span(start, end)
        return super().rfind(sub, start, end)

    def index(self, sub: str, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        self._span(start, end)
        return super().index(sub, start, end)

    def rindex(self, sub: str, start: int | None = None, end: int | None = None) -> int:  # type: ignore[override]
        self._span(start, end)
        return super().rindex(sub, start, end)

    def __getitem__(self, key: object) -> str:
        _WORK[0] += len(range(*key.indices(len(self)))) if isinstance(key, slice) else 1
        return super().__getitem__(key)  # type: ignore[index]


_WORK = [0]


class _CountedPattern:
    """A compiled pattern whose scans add the characters they may cover (from ``pos`` to the
    end of the string) to :data:`_WORK`."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self._p = pattern

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._p, name)
        if name not in ("search", "match", "fullmatch", "finditer", "findall", "sub", "subn", "split"):
            return attr

        def scan(*args: object, **kw: object) -> object:
            text = args[1] if name in ("sub", "subn") else args[0]
            pos = args[1] if name in ("search", "match", "fullmatch", "finditer", "findall") and len(args) > 1 else 0
            if isinstance(text, str):
                _WORK[0] += max(0, len(text) - int(pos))  # type: ignore[call-overload]
            return attr(*args, **kw)

        return scan


def test_entry_scanning_is_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scanner's work, counted (never timed): Python lines run in hatch_khal.entries and .preprocessor, the
    characters its regular expressions may scan, and the characters its string scans and slices
    of the whole text cover. Four times the entries must cost about four times the work; a
    rescan from the start per entry (line numbers counted from 0, a regex from the top) makes
    that ratio grow with the size."""
    from hatch_khal import entries, preprocessor
    from hatch_khal.entries import find_entries

    for module in (entries, preprocessor):
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                monkeypatch.setattr(module, name, _CountedPattern(value))
    for name in ("strip_comments", "blank_preprocessor"):  # the whole-text results the scan walks
        fn = getattr(entries, name)
        monkeypatch.setattr(entries, name, lambda *a, _fn=fn, **k: _CountedText(_fn(*a, **k)))

    def source(n: int) -> str:
        return "".join(
            f"// entry {i}\nKHAL_ENTRY(e{i}, 64, (KHAL_STORAGE(float, x), KHAL_SCALAR(int, k)))\n{{ x[0] = k; }}\n"
            for i in range(n)
        )

    def work(n: int) -> int:
        text = source(n)
        lines = [0]
        here = {entries.__file__, preprocessor.__file__}

        def tracer(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line" and frame.f_code.co_filename in here:
                lines[0] += 1
            return tracer

        _WORK[0] = 0
        previous = sys.gettrace()  # a coverage tracer, say: put back after
        sys.settrace(tracer)
        try:
            found = find_entries(_CountedText(text), "big.cu")
        finally:
            sys.settrace(previous)
        assert len(found) == n
        return lines[0] + _WORK[0]

    small, large = work(500), work(2000)
    ratio = large / small
    assert ratio < 4.4, f"4x the entries took {ratio:.2f}x the work ({small} -> {large} steps and characters)"


# -- (18) KHAL_JOBS --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_bad_khal_jobs_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    root = make_project(tmp_path / "p")
    monkeypatch.setenv("KHAL_JOBS", value)
    with pytest.raises(ConfigError, match=rf"KHAL_JOBS={value!r}.*positive integer"):
        build(root, None)


# -- (#17) BOM, CLI --------------------------------------------------------------------------------


@pytest.mark.parametrize("rel", ["kernels/alpha/scale.cu", "kernels/include/common.cuh"])
def test_utf8_bom_is_refused_with_a_hint(tmp_path: Path, rel: str) -> None:
    root = make_project(tmp_path / "p")
    p = root / rel
    p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
    with pytest.raises(SourceError, match=rf"{rel}:1: .*byte-order mark.*without"):
        build(root, None)


def test_cli_version_and_plain_help() -> None:
    from hatch_khal import __version__

    out = run([sys.executable, "-m", "hatch_khal", "--version"]).stdout
    assert out.strip() == f"hatch-khal {__version__}"
    helptext = run([sys.executable, "-m", "hatch_khal", "--help"]).stdout
    assert "inspect" in helptext and "`" not in helptext


@pytest.mark.needs_nvrtc
def test_inspect_escapes_control_characters_from_a_hand_made_manifest(tmp_path: Path) -> None:
    """Issue #16 item 20: a crate name or a version carrying ESC sequences (colours, a terminal
    title, a hidden line) is printed escaped, never raw; also in verify's and the error's lines."""
    from khal_runtime.manifest import MANIFEST_DIR, MANIFEST_NAME

    root = make_project(tmp_path / "p")
    result, _ = build(root, None)
    m, _ = manifest_of(result)
    data = json.loads(m.to_json())
    evil_crate, evil_version = "alpha\x1b[2J\x1b]0;pwned\x07\u202e\x9b", "0.1\x1b[31m\nFAIL forged line"
    data["crates"][0]["name"] = evil_crate
    data["toolchain"]["hatch_khal_version"] = evil_version
    data["package"] = "mini\x1b[8m"
    pkg = tmp_path / "pkg"
    (pkg / MANIFEST_DIR).mkdir(parents=True)
    (pkg / MANIFEST_DIR / MANIFEST_NAME).write_text(json.dumps(data))
    out = run([sys.executable, "-m", "hatch_khal", "inspect", str(pkg)]).stdout
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\u202e" not in out
    assert r"crate alpha\x1b[2J\x1b]0;pwned\x07\u202e\x9b: CUDA C++" in out
    assert r"hatch-khal 0.1\x1b[31m\x0aFAIL forged line" in out and r"package mini\x1b[8m" in out
    assert not any(line.startswith("FAIL") for line in out.splitlines())
    proc = run([sys.executable, "-m", "hatch_khal", "verify", str(pkg)], check=False)  # artifacts missing
    assert proc.returncode == 1 and "\x1b" not in proc.stderr and r"mini\x1b[8m" in proc.stderr
    odd = tmp_path / "dir\x1b[2J"  # an error message naming a path
    odd.mkdir()
    proc = run([sys.executable, "-m", "hatch_khal", "inspect", str(odd)], check=False)
    assert proc.returncode == 2 and "\x1b" not in proc.stderr and r"dir\x1b[2J: no _khal/manifest.json" in proc.stderr
