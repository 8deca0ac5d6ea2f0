"""The hatchling hook's wheel after an editable install left kernels in the source tree
(``<package>/_khal/``), through hatchling's public API only (#40 item 5): the staged kernels are
forced into the wheel file by file, so each in-place file of the same name is left out (a forced
file takes precedence over a project file at its path); an in-place file this build does not write
would be shipped, so that build is refused, naming it. Built in process with hatchling's
``WheelBuilder``, one arch and no PTX (a fraction of a second per build)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from hatchling.builders.wheel import WheelBuilder

from hatch_khal.errors import ConfigError
from tests.helpers.projects import make_project

HOOK = 'archs = ["sm_90"]\nptx-arch = "none"\n'


@pytest.fixture
def edited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, session_cache: Path) -> Path:
    """A project after an editable build, which wrote its kernels in place."""
    monkeypatch.setenv("KHAL_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("KHAL_CUDA_ARCHS", raising=False)
    proj = make_project(tmp_path / "proj", hook=HOOK)
    next(WheelBuilder(str(proj)).build(directory=str(tmp_path / "editable"), versions=["editable"]))
    assert json.loads((proj / "mini_pkg" / "_khal" / "manifest.json").read_text())["editable"]
    return proj


def _khal_files(whl: str) -> list[str]:
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
    assert len(names) == len(set(names)), names  # every file once
    return sorted(n for n in names if "/_khal/" in n)


def test_in_place_kernels_are_replaced_by_forced_files_not_by_changing_the_configuration(
        edited: Path, tmp_path: Path) -> None:
    builder = WheelBuilder(str(edited))
    exclude = builder.config.exclude_spec
    whl = next(builder.build(directory=str(tmp_path / "dist"), versions=["standard"]))
    assert builder.config.exclude_spec is exclude  # the hook changed none of hatchling's settings
    assert _khal_files(whl) == ["mini_pkg/_khal/__init__.py", "mini_pkg/_khal/__init__.pyi",
                                "mini_pkg/_khal/alpha/alpha.sm_90.cubin", "mini_pkg/_khal/beta/beta.sm_90.cubin",
                                "mini_pkg/_khal/manifest.digest", "mini_pkg/_khal/manifest.json"]
    with zipfile.ZipFile(whl) as zf:
        assert "editable" not in json.loads(zf.read("mini_pkg/_khal/manifest.json"))  # this build's, not the tree's
    assert (edited / "mini_pkg" / "_khal" / "manifest.json").is_file()  # the editable install keeps its kernels


def test_an_in_place_file_this_build_does_not_write_is_refused_naming_it(
        edited: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (edited / "mini_pkg" / "_khal" / "alpha" / "leftover.cubin").write_bytes(b"stale")
    with pytest.raises(ConfigError) as refused:  # (the tests' KHAL_BUILD_DEBUG: raised after the error block)
        next(WheelBuilder(str(edited)).build(directory=str(tmp_path / "dist"), versions=["standard"]))
    err = capsys.readouterr().err
    assert str(refused.value) in err
    assert "mini_pkg/_khal/alpha/leftover.cubin" in err and "would be shipped in the wheel" in err
    assert 'exclude = ["/mini_pkg/_khal/"]' in err
    # what the message offers: the project leaves the folder out of wheels; the hook's kernels still go in
    text = (edited / "pyproject.toml").read_text()
    (edited / "pyproject.toml").write_text(text.replace('packages = ["mini_pkg"]\n',
                                                        'packages = ["mini_pkg"]\nexclude = ["/mini_pkg/_khal/"]\n', 1))
    whl = next(WheelBuilder(str(edited)).build(directory=str(tmp_path / "dist"), versions=["standard"]))
    files = _khal_files(whl)
    assert "mini_pkg/_khal/alpha/leftover.cubin" not in files and "mini_pkg/_khal/manifest.json" in files
