"""Issue #27's rough edges on the build side: what ``--no-build-isolation`` needs (the ``build``
extra), an editable build that fails leaves no ``_khal/`` behind, ``scripts/test`` says what it does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import _HIDE, build_env, run

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]


def test_the_build_extra_has_what_a_build_without_isolation_needs() -> None:
    """``pip install "hatch-khal[build]"`` then ``pip install --no-build-isolation -e .`` (the
    quickstart's "iterate quickly"): hatchling's editable wheel imports ``editables``, and a Slang
    crate needs slangpy (what the hook adds to an isolated build)."""
    from hatch_khal.slang.library import SLANGPY_REQUIREMENT
    from packaging.requirements import Requirement

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    build = {Requirement(r).name: r for r in data["project"]["optional-dependencies"]["build"]}
    for name in ("hatchling", "editables", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-crt",
                 "nvidia-cuda-cccl", "slangpy"):
        assert name in build, f"the build extra lacks {name}: {sorted(build)}"
    assert build["slangpy"] == SLANGPY_REQUIREMENT


def _editable(project: Path, code: str, cache: Path, **env: str) -> "os.CompletedProcess[str]":  # type: ignore[name-defined]
    e = build_env(cache, KHAL_CUDA_ARCHS="sm_90", KHAL_PTX_ARCH="none", **env)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(_HIDE), str(ROOT), e.get("PYTHONPATH", "")) if p)
    return run([sys.executable, "-c", code, str(project / "out")], cwd=project, env=e, check=False)


_BUILD = "import sys, hatchling.build as b; b.build_editable(sys.argv[1])"


@pytest.fixture
def quickstart(tmp_path: Path) -> Path:
    from tests.test_docs import write_project

    return write_project(tmp_path / "my-shaders")


@pytest.mark.needs_nvrtc
def test_editable_build_without_editables_says_so_and_leaves_nothing(quickstart: Path, session_cache: Path) -> None:
    r = _editable(quickstart, _BUILD, session_cache, KHAL_TEST_HIDE="editables")
    assert r.returncode != 0
    assert "needs the `editables` package" in r.stderr and 'pip install "hatch-khal[build]"' in r.stderr, r.stderr
    assert not (quickstart / "my_shaders" / "_khal").exists(), "the failed build left my_shaders/_khal/ behind"


@pytest.mark.needs_nvrtc
def test_editable_build_failing_after_the_hook_removes_its_in_place_kernels(quickstart: Path,
                                                                            session_cache: Path) -> None:
    """hatchling calls no hook when its editable wheel fails after ``initialize`` (where the kernels
    are written in place): the hook removes them at exit unless ``finalize`` ran."""
    fail = ("import sys, hatchling.build as b, hatchling.builders.wheel as w\n"
            "def boom(self, directory, **kw): raise RuntimeError('editable wheel failed')\n"
            "w.WheelBuilder.build_editable_detection = boom\n"
            "b.build_editable(sys.argv[1])\n")
    r = _editable(quickstart, fail, session_cache)
    assert r.returncode != 0 and "editable wheel failed" in r.stderr, r.stderr
    assert "kernels written to my_shaders/_khal/" in r.stdout + r.stderr
    assert not (quickstart / "my_shaders" / "_khal").exists(), "the failed build left my_shaders/_khal/ behind"
    # and a build that succeeds keeps them (they are the editable install's kernels)
    r = _editable(quickstart, _BUILD, session_cache)
    assert r.returncode == 0, r.stderr
    assert (quickstart / "my_shaders" / "_khal" / "manifest.json").is_file()


_FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for python3 and the venv's python: records what scripts/test asks of it
echo "CALL $*" >> "$KHAL_FAKE_LOG"
if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
if [ "$1" = -c ]; then echo 3.11; fi
exit 0
"""


def test_scripts_test_says_what_it_installs_before_it_does(tmp_path: Path) -> None:
    """scripts/test takes minutes installing before pytest prints anything: it says what it is doing
    (run on a copy, with a stand-in python3 that installs nothing)."""
    if not (ROOT / "scripts/test").is_file():
        pytest.skip("no scripts/test")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/test").write_text((ROOT / "scripts/test").read_text())
    (tmp_path / "scripts/test").chmod(0o755)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(_FAKE_PYTHON)
    (bin_ / "python3").chmod(0o755)
    log = tmp_path / "log"
    env = dict(os.environ, PATH=f"{bin_}{os.pathsep}{os.environ['PATH']}", KHAL_FAKE_LOG=str(log),
               KHAL_TEST_PYTHONS="0.0")
    r = run(["bash", str(tmp_path / "scripts/test"), "-q"], env=env, check=False)
    if r.returncode == 3:
        pytest.skip("no Vulkan driver here: scripts/test stops before its steps")
    assert r.returncode == 0, r.stderr
    printed = r.stdout
    assert "installing this checkout editable, both distributions" in printed, printed
    assert "with its test extra" in printed, printed
    assert "a few minutes the first time" in printed, printed
    assert "pytest -q" in printed, printed
    assert "-m pip install -q -e ./runtime -e .[test]" in log.read_text()


def test_the_default_nvrtc_writes_ptx_every_cuda13_driver_jits() -> None:
    """With ``nvrtc-requirement`` unset an isolated build resolved the newest NVRTC, whose PTX (13.5:
    ISA 9.5) a CUDA 13.0 driver refuses (CUDA_ERROR_UNSUPPORTED_PTX_VERSION on the H200's R580).
    NVRTC has no option choosing the PTX ISA, so the default is pinned to CUDA 13.0's NVRTC."""
    from hatch_khal.config import DEFAULT_NVRTC_REQUIREMENT, HookConfig
    from khal_runtime.binaries import max_ptx_isa, min_driver_for_ptx_isa
    from packaging.requirements import Requirement

    spec = Requirement(DEFAULT_NVRTC_REQUIREMENT).specifier
    assert spec.contains("13.0.88") and not spec.contains("13.1.0") and not spec.contains("13.5.37"), spec
    assert HookConfig.model_fields["nvrtc_requirement"].default == DEFAULT_NVRTC_REQUIREMENT
    assert max_ptx_isa((13, 0)) == (9, 0) and min_driver_for_ptx_isa("9.0") == (13, 0)


def test_inspect_says_which_driver_the_ptx_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hatch_khal.__main__ import main
    from tests.helpers.fakecuda import make_entry, storage, write_package

    pkg = write_package(tmp_path, [make_entry("k", (storage("x"),))], package="isapkg")  # PTX ISA 9.0
    assert main(["inspect", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert "the PTX needs a CUDA >= 13.0 driver (R580+) to JIT (cubins are unaffected)" in out, out
