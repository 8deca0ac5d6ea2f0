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

from ._projects import make_project
from .conftest import ROOT, build_env, run


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")):
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

    from ._build import Recorder

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
