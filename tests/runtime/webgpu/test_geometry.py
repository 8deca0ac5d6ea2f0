"""Issue #24 on WebGPU (lavapipe in CI): the Slang entry with ``[numthreads(10, 10, 1)]`` of
tests/packages/geometry_kernels_pkg is a 2-D entry there too (``k((nx, ny))`` and a 2-D ``launch``), against
NumPy; and its launch facts are checked against the shipped PTX when the crate loads on WebGPU."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import khal_runtime
from khal_runtime import backends
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import ManifestError
from tests.conftest import skip_without
from tests.helpers.paths import PACKAGES

pytestmark = [pytest.mark.webgpu]

GEO_PKG = PACKAGES / "geometry_kernels_pkg"


@pytest.fixture(scope="module")
def geo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/packages/geometry_kernels_pkg's Slang crate (sm_90 + PTX + WGSL / SPIR-V): from the wheel named
    by KHAL_TEST_GEOMETRY_WHEEL when given (the GPU machine has no Slang compiler), else built here."""
    given = os.environ.get("KHAL_TEST_GEOMETRY_WHEEL")
    if given:
        return _slang2d_from_wheel(Path(given), tmp_path_factory.mktemp("geo-wheel"))
    if importlib.util.find_spec("slangpy") is None:
        pytest.skip("slangpy (the Slang compiler) is not installed and no KHAL_TEST_GEOMETRY_WHEEL is given")
    skip_without("needs_nvrtc")  # the crate's CUDA unit compiles with NVRTC
    from hatch_khal.builder import build_packages
    from hatch_khal.cache import Cache
    from hatch_khal.config import parse_config

    from tests.helpers.build import Recorder, tomllib  # type: ignore[attr-defined]

    root = tmp_path_factory.mktemp("geo-wgpu") / "proj"
    shutil.copytree(GEO_PKG, root)
    raw = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    crates = [c for c in parse_config(raw["hooks"]["khal"], default_package="khal_geometry_kernels")[1]
              if c.name == "slang2d"]
    rep = Recorder()
    (pkg,) = build_packages(root, crates, rep, cache=Cache(tmp_path_factory.mktemp("geo-cache"), rep.warn)).packages
    out = root / "khal_geometry_kernels"
    for rel, data in pkg.files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return out


def _slang2d_from_wheel(wheel: Path, root: Path) -> Path:
    """The wheel's package with its manifest cut to crate slang2d (what the fixture builds)."""
    from khal_runtime.manifest import parse_manifest

    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(root)
    out = root / "khal_geometry_kernels"
    path = out / "_khal" / "manifest.json"
    m = parse_manifest(path.read_bytes())
    path.write_text(m.model_copy(update={"crates": (m.crate("slang2d"),)}).to_json())
    return out


@pytest.fixture
def webgpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("KHAL_BACKEND", "webgpu")
    backends.reset()
    yield
    backends.reset()


@pytest.mark.parametrize("nx, ny", [(25, 15), (10, 10), (1, 33)])
def test_numthreads_10x10_runs_2d_on_webgpu(geo_dir: Path, webgpu: Any, nx: int, ny: int) -> None:
    K: Any = khal_runtime.load(geo_dir)
    a = np.random.default_rng(nx + ny).standard_normal((ny, nx)).astype(np.float32)
    want = np.float32(3) * a + np.arange(ny, dtype=np.float32)[:, None]
    da = DeviceBuffer.from_numpy(a)
    grid = ((nx + 9) // 10, (ny + 9) // 10)
    runs: tuple[Callable[[Any], None], ...] = (
        lambda o: K.saxpy2d((nx, ny), da, o, nx, ny, 3.0),
        lambda o: K.saxpy2d.launch(grid, None, da, o, nx, ny, 3.0))
    for run in runs:
        out = DeviceBuffer.from_numpy(np.full(nx * ny, -7, np.float32))
        run(out)
        np.testing.assert_allclose(out.to_numpy().reshape(ny, nx), want, rtol=1e-6, atol=1e-6)


def test_tampered_launch_facts_are_refused_on_webgpu(geo_dir: Path, webgpu: Any, tmp_path: Path) -> None:
    pkg = tmp_path / "khal_geometry_kernels"
    shutil.copytree(geo_dir, pkg)
    path = pkg / "_khal" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["crates"][0]["entries"][0]["launch"]["grid_axes"] = 3
    path.write_text(json.dumps(doc))
    K: Any = khal_runtime.load(pkg)
    with pytest.raises(ManifestError, match=r"entry 'saxpy2d' \(crate 'slang2d'\): the manifest's launch facts are "
                                            r"not the shipped PTX's: grid_axes 3 \(the PTX says 2\)"):
        K.saxpy2d((10, 10), DeviceBuffer.from_numpy(np.zeros(100, np.float32)),
                  DeviceBuffer.from_numpy(np.zeros(100, np.float32)), 10, 10, 1.0)
