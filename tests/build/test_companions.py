"""Wheels within the index's size limit: ``python -m hatch_khal split`` moves each arch family's cubins
into a companion distribution (``mini-pkg-kernels-sm90``) pinned to the main version and manifest;
installed beside the package, the runtime finds it (entry point) and loads its cubin with the same
checks; without it the package falls back to its PTX, else names the distribution to install. CPU
only: the fake driver (device sm_90) loads the real cubins NVRTC made."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import khal_runtime
from khal_runtime.errors import ArtifactError, NoCompatibleBinaryError
from khal_runtime.manifest import parse_manifest
from tests.conftest import build_env
from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401  (fixture)
from tests.helpers.projects import make_project

pytestmark = pytest.mark.needs_nvrtc


def _wheel(tmp: Path, name: str, **env: str) -> Path:
    root = make_project(tmp / name / "proj", hook='archs = ["sm_80", "sm_90"]\n')
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
                          str(tmp / name / "dist"), str(root)], capture_output=True, text=True, timeout=600,
                         env=build_env(tmp / "cache", SOURCE_DATE_EPOCH="1700000000", KHAL_CACHE_URL="none", **env))
    assert out.returncode == 0, out.stderr[-3000:]
    return next((tmp / name / "dist").glob("*.whl"))


def _split(wheel: Path, out: Path, *extra: str) -> list[Path]:
    res = subprocess.run([sys.executable, "-m", "hatch_khal", "split", str(wheel), "--out", str(out), *extra],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return [Path(line) for line in res.stdout.splitlines() if line.endswith(".whl")]


def _install(target: Path, *wheels: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    *map(str, wheels)], check=True, capture_output=True, timeout=300)
    return target


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("split")
    wheel = _wheel(tmp, "with-ptx")
    main, *companions = _split(wheel, tmp / "out", "--max-size", "2kB")
    nptx = _wheel(tmp, "no-ptx", KHAL_PTX_ARCH="none")
    main_nptx, *comp_nptx = _split(nptx, tmp / "out-no-ptx", "--max-size", "2kB")
    return {"tmp": tmp, "whole": wheel, "main": main, "sm80": companions[0], "sm90": companions[1],
            "main-no-ptx": main_nptx, "sm90-no-ptx": comp_nptx[1]}


def test_the_split_wheels(split: dict[str, Path]) -> None:
    assert [split["sm80"].name, split["sm90"].name] == ["mini_pkg_kernels_sm80-0.1.0-py3-none-any.whl",
                                                        "mini_pkg_kernels_sm90-0.1.0-py3-none-any.whl"]
    with zipfile.ZipFile(split["main"]) as zf:
        names = zf.namelist()
        manifest = parse_manifest(zf.read("mini_pkg/_khal/manifest.json"))
        metadata = zf.read("mini_pkg-0.1.0.dist-info/METADATA").decode()
    assert not [n for n in names if n.endswith(".cubin")] and "mini_pkg/_khal/alpha/alpha.compute_75.ptx" in names
    dists = {a.arch: a.distribution for c in manifest.crates for a in c.artifacts}
    assert dists == {"compute_75": None, "sm_80": "mini-pkg-kernels-sm80", "sm_90": "mini-pkg-kernels-sm90"}
    assert 'Requires-Dist: mini-pkg-kernels-sm90==0.1.0; extra == "sm90"' in metadata
    with zipfile.ZipFile(split["sm90"]) as zf:
        names = zf.namelist()
        record = json.loads(zf.read("mini_pkg_kernels_sm90/_khal/companion.json"))
        meta = zf.read("mini_pkg_kernels_sm90-0.1.0.dist-info/METADATA").decode()
        eps = zf.read("mini_pkg_kernels_sm90-0.1.0.dist-info/entry_points.txt").decode()
    assert sorted(n for n in names if n.endswith(".cubin")) == ["mini_pkg_kernels_sm90/_khal/alpha/alpha.sm_90.cubin",
                                                                 "mini_pkg_kernels_sm90/_khal/beta/beta.sm_90.cubin"]
    assert record["requires"] == "mini-pkg==0.1.0" and "Requires-Dist: mini-pkg==0.1.0" in meta
    assert eps == "[khal_runtime.companions]\nmini_pkg = mini_pkg_kernels_sm90\n"
    # the main wheel verifies (its own artifacts; the companions' are checked where installed)
    out = subprocess.run([sys.executable, "-m", "hatch_khal", "verify", str(split["main"])], capture_output=True,
                         text=True)
    assert out.returncode == 0 and "verify: OK" in out.stdout, out.stdout + out.stderr


def test_a_wheel_within_the_limit_is_left_alone(split: dict[str, Path]) -> None:
    assert _split(split["whole"], split["tmp"] / "same") == [split["whole"]]


def test_the_companion_for_the_device_is_found_and_its_cubin_loaded(split: dict[str, Path], fake: FakeDriver,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    site = _install(split["tmp"] / "site-both", split["main"], split["sm90"])
    monkeypatch.syspath_prepend(str(site))
    ks = khal_runtime.load(site / "mini_pkg")
    module = ks.crates["alpha"].module(0)
    assert module.artifact.arch == "sm_90" and module.artifact.distribution == "mini-pkg-kernels-sm90"
    assert "cuLibraryLoadData" in [c[0] for c in fake.calls]


def test_without_the_companion_the_ptx_is_loaded(split: dict[str, Path], fake: FakeDriver,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    site = _install(split["tmp"] / "site-sm80", split["main"], split["sm80"])
    monkeypatch.syspath_prepend(str(site))
    fake.version = 13090  # a driver that JITs the PTX of the NVRTC installed here (13.x)
    from khal_runtime.backends.cuda import driver as cuda_driver

    cuda_driver.reset_status()
    module = khal_runtime.load(site / "mini_pkg").crates["beta"].module(0)
    assert module.artifact.kind == "ptx"


def test_without_companion_or_ptx_the_error_names_the_distribution(split: dict[str, Path], fake: FakeDriver,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    site = _install(split["tmp"] / "site-bare", split["main-no-ptx"])
    monkeypatch.syspath_prepend(str(site))
    ks = khal_runtime.load(site / "mini_pkg")
    with pytest.raises(NoCompatibleBinaryError, match=r"not installed: mini-pkg-kernels-sm80 \(sm_80\); "
                                                      r"mini-pkg-kernels-sm90 \(sm_90\)"):
        ks.crates["alpha"].module(0)


def test_a_companion_of_another_build_is_refused_by_name(split: dict[str, Path], fake: FakeDriver,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # the sm90 companion of the PTX-less build beside the main wheel of the other build
    site = _install(split["tmp"] / "site-mixed", split["main"], split["sm90-no-ptx"])
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ArtifactError, match="companion distribution mini-pkg-kernels-sm90 0.1.0 was split from "
                                            "another build of it"):
        khal_runtime.load(site / "mini_pkg")
