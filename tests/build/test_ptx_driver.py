"""#38 item 14: which driver a build's PTX needs, said where pip shows it. A driver JITs PTX only up
to its own CUDA version, and NVRTC writes the PTX ISA of its release: a build without isolation
using an NVRTC newer than ``nvrtc-requirement`` admits (the test environment's 13.5 against the
default, CUDA 13.0's) shipped PTX most drivers cannot load, warned at most under ``pip -v``. Plain
``pip wheel`` shows a backend's output only when it fails, so such a build fails, naming the driver
the PTX would need and the three ways out; the summary line of every build says it too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import hatch_khal.nvrtc as nv
from hatch_khal.errors import ConfigError
from tests.conftest import build_env, run
from tests.helpers.projects import make_project


@pytest.fixture
def strict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(nv.ANY_MINOR_ENV, raising=False)  # the test session sets it (tests/conftest.py)


def _nvrtc(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    major, minor = (int(x) for x in release.split("+")[0].split(".")[:2])
    monkeypatch.setattr(nv, "nvrtc_release", lambda: release)
    monkeypatch.setattr(nv, "nvrtc_version", lambda: (major, minor))
    monkeypatch.setattr(nv, "_loaded_library", lambda: None)


@pytest.mark.parametrize("requirement, release, need", [
    ("nvidia-cuda-nvrtc~=13.0.0", "13.5.37", "needs a CUDA >= 13.5 driver"),
    ("nvidia-cuda-nvrtc~=13.0.0", "13.1.80", "needs a CUDA >= 13.1 driver"),
    ("nvidia-cuda-nvrtc-cu12~=12.8.0", "12.9.86", "needs a CUDA >= 12.9 driver (R575+)"),
    ("nvidia-cuda-nvrtc<13.2", "13.3.1", "needs a CUDA >= 13.3 driver"),
])
def test_an_nvrtc_newer_than_the_requirement_is_refused_naming_the_driver(
        strict: None, monkeypatch: pytest.MonkeyPatch, requirement: str, release: str, need: str) -> None:
    _nvrtc(monkeypatch, release)
    with nv.requirement(requirement):
        why = nv.ptx_problem()
    assert why is not None
    assert why.startswith(f"the NVRTC in this build environment is {release}, newer than option 'nvrtc-requirement' "
                          f"({requirement!r}) admits: the PTX it writes {need} to load"), why
    major, minor = release.split(".")[:2]
    assert f"pip install '{requirement}'" in why
    assert f'nvrtc-requirement = "nvidia-cuda-nvrtc>={major}.{minor}"' in why
    assert 'ptx-arch = "none", or KHAL_PTX_ARCH=none' in why and "KHAL_NVRTC_ANY_MINOR=1" in why


@pytest.mark.parametrize("requirement, release", [
    ("nvidia-cuda-nvrtc~=13.0.0", "13.0.88"),     # what the requirement admits
    ("nvidia-cuda-nvrtc>=13.0", "13.5.37"),       # a requirement that admits it
    ("nvidia-cuda-nvrtc>=13.5", "13.0.88"),       # older than asked: its PTX loads on more drivers
    ("nvidia-cuda-nvrtc", "13.5.37"),
    ("nvidia-cuda-nvrtc~=13.0.0", "13.5+lib.0123456789abcdef"),  # a toolkit's NVRTC: by major.minor
])
def test_an_admitted_or_older_nvrtc_passes(strict: None, monkeypatch: pytest.MonkeyPatch, requirement: str,
                                           release: str) -> None:
    _nvrtc(monkeypatch, release)
    with nv.requirement(requirement):
        got = nv.ptx_problem()
    assert (got is None) is not release.startswith("13.5+lib"), got


def test_the_old_behaviour_is_a_variable_away(monkeypatch: pytest.MonkeyPatch) -> None:
    _nvrtc(monkeypatch, "13.5.37")
    monkeypatch.setenv(nv.ANY_MINOR_ENV, "1")
    with nv.requirement("nvidia-cuda-nvrtc~=13.0.0"):
        assert nv.ptx_problem() is None


def test_only_a_crate_that_builds_ptx_is_refused(strict: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cubins of a newer NVRTC load on any driver of its major: only the PTX is a driver question."""
    from types import SimpleNamespace

    from hatch_khal.plan import targets
    from tests.helpers.build import Recorder

    _nvrtc(monkeypatch, "13.5.37")
    monkeypatch.setattr(nv, "supported_archs", lambda: (75, 80, 90))
    language = SimpleNamespace(compiler="nvrtc")
    cfg = SimpleNamespace(name="core", archs=["sm_90"], archs_explicit=True, ptx_arch="compute_75")
    with nv.requirement("nvidia-cuda-nvrtc~=13.0.0"):
        with pytest.raises(ConfigError, match=r"crate 'core' builds PTX \(compute_75\): the NVRTC in this build "
                                              r"environment is 13.5.37"):
            targets(SimpleNamespace(cfg=cfg, language=language), Recorder())  # type: ignore[arg-type]
        cfg.ptx_arch = None
        assert targets(SimpleNamespace(cfg=cfg, language=language), Recorder()) == ["sm_90"]  # type: ignore[arg-type]


@pytest.mark.needs_nvrtc
def test_plain_pip_wheel_shows_the_driver_the_ptx_needs(tmp_path: Path, session_cache: Path) -> None:
    """A build without isolation in an environment whose NVRTC is newer than the default requirement
    (this one's, when it holds 13.1 or later) fails where plain ``pip wheel`` shows it; with no PTX
    (or a requirement that admits it) it builds, and its summary names the PTX's driver."""
    from hatch_khal.config import DEFAULT_NVRTC_REQUIREMENT
    from packaging.requirements import Requirement

    release = nv.nvrtc_release()
    env = build_env(session_cache)
    env.pop(nv.ANY_MINOR_ENV, None)
    env.pop("KHAL_BUILD_DEBUG", None)
    proj = make_project(tmp_path / "p", hook='archs = ["sm_90"]\n')
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp_path / "d")]
    if Requirement(DEFAULT_NVRTC_REQUIREMENT).specifier.contains(release.split("+")[0]):
        pytest.skip(f"this environment's NVRTC ({release}) is the default requirement's: nothing to refuse")
    proc = run([*cmd, str(proj)], env=env, check=False)
    out = proc.stdout + proc.stderr
    major, minor = release.split(".")[:2]
    assert proc.returncode != 0 and f"needs a CUDA >= {major}.{minor} driver" in out, out
    assert "crate 'alpha' builds PTX (compute_75)" in out and "Traceback" not in out, out
    ok = make_project(tmp_path / "q", hook='archs = ["sm_90"]\n', nvrtc_requirement=f"nvidia-cuda-nvrtc>={major}.{minor}")
    proc = run([*cmd, "-v", str(ok)], env=env)
    assert f"its PTX (ISA {int(major) - 4}.{minor}) needs a CUDA >= {major}.{minor} driver" in proc.stdout + proc.stderr


# -- what the entry hash covers (#38 item 15): not the NVRTC release ---------------------------------------
def test_the_entry_hash_does_not_cover_the_nvrtc_release_the_cache_key_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs said the entry hash comes from "the compiler's identity (the NVRTC release)"; it does
    not, on purpose: NVRTC compiles the kernel the hash names and does not change which kernel that is
    (a PTX prebuilt by another compiler carries the same hashes, CUDA_OXIDE_SHADERS_PTX_<CRATE>). The
    compile cache's key does cover it: another NVRTC recompiles."""
    from hatch_khal.config import parse_config
    from hatch_khal.cuda import CUDA, CudaFront

    root = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "none"\n')
    _, crates = parse_config({"archs": ["sm_90"], "crates": [{"name": "beta", "sources": ["kernels/beta/*.cu"]}]},
                             default_package="mini_pkg")

    def plan_and_keys(release: str) -> tuple[tuple[tuple[str, str], ...], list[str]]:
        _nvrtc(monkeypatch, release)
        planned = CUDA.plan(root, crates[0])
        prepared = planned.prepared(CudaFront({}))
        return tuple((e.name, e.hash) for e in planned.entries), [j.key for j in CUDA.jobs(prepared, root, ["sm_90"])]

    hashes_a, keys_a = plan_and_keys("13.0.88")
    hashes_b, keys_b = plan_and_keys("13.5.37")
    assert hashes_a == hashes_b and hashes_a
    assert keys_a != keys_b
