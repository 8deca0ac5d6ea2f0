"""Reading an entry's WGSL / SPIR-V artifact from a package: confinement, size, sha256 and the
entry point's hash (no GPU needed), then running it from the package (WebGPU)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from khal_runtime.backends.webgpu.artifacts import code_loader, entry_code
from khal_runtime.errors import ArtifactError, HashMismatchError
from khal_runtime.manifest import Artifact, Crate, Entry
from tests.runtime.webgpu.fixtures.make_fixtures import symbol
from tests.runtime.webgpu.test_slang_fixtures import _saxpy

FIX = Path(__file__).resolve().parent / "fixtures"


def _package(tmp_path: Path, entry_hash: str | None = None) -> tuple[Path, Crate, Entry]:
    pkg = tmp_path / "pkg"
    (pkg / "_khal" / "k").mkdir(parents=True)
    arts = []
    e0 = _saxpy("wgsl")
    sp = _saxpy("spirv")
    targets = []
    h = entry_hash or e0.hash
    sym = f"saxpy_khal_{h}"
    for t, ext in ((e0.webgpu[0], "wgsl"), (sp.webgpu[0], "spv")):  # type: ignore[index]
        rel = f"_khal/k/saxpy.{ext}"
        shutil.copy(FIX / f"saxpy.{ext}", pkg / rel)
        data = (pkg / rel).read_bytes()
        arts.append(Artifact(kind=t.target, entry="saxpy", path=rel, sha256=hashlib.sha256(data).hexdigest(),
                             size=len(data)))
        targets.append(t.model_copy(update={"path": rel, "entry_point": sym}))
    entry = Entry(name="saxpy", symbol=sym, hash=h, block_size=(64, 1, 1), params=e0.params,
                  webgpu=tuple(targets))
    crate = Crate(name="k", language="slang", package_dir="_khal/k", sources=(), content_hash="0" * 64,
                  artifacts=tuple(arts), entries=(entry,))
    return pkg, crate, entry


@pytest.mark.parametrize("target", ["wgsl", "spirv"])
def test_entry_code_checks_and_reads(tmp_path: Path, target: str) -> None:
    pkg, crate, entry = _package(tmp_path)
    t = entry.target(target)
    assert t is not None
    data = entry_code(pkg, crate, entry, t)
    assert data == (FIX / f"saxpy.{'wgsl' if target == 'wgsl' else 'spv'}").read_bytes()
    (pkg / t.path).write_bytes(data[:-4] + b"\0\0\0\0")
    with pytest.raises(ArtifactError, match=r"has sha256 .* the file was changed after the build; rebuild"):
        entry_code(pkg, crate, entry, t)
    (pkg / t.path).unlink()
    with pytest.raises(ArtifactError, match="is missing from the package"):
        code_loader(pkg, crate, entry, t)()


@pytest.mark.parametrize("target", ["wgsl", "spirv"])
def test_entry_point_hash_mismatch(tmp_path: Path, target: str) -> None:
    pkg, crate, entry = _package(tmp_path, entry_hash="0123456789abcdef")
    t = entry.target(target)
    assert t is not None
    real = symbol("saxpy").rsplit("_", 1)[1]
    with pytest.raises(HashMismatchError, match=rf"its entry point carries hash {real}, the manifest "
                       r"expects 0123456789abcdef\); rebuild the package") as ei:
        entry_code(pkg, crate, entry, t)
    assert ei.value.found == real and ei.value.expected == "0123456789abcdef"


@pytest.mark.webgpu
def test_run_from_the_package(tmp_path: Path, wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.arrays import WgpuArray
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    pkg, crate, entry = _package(tmp_path)
    t = entry.target("wgsl")
    assert t is not None
    k = KernelPlan(entry, wdev, code_loader(pkg, crate, entry, t), "pkg_k", target=t)
    x = WgpuArray.from_numpy(np.ones(100, np.float32), device=wdev)
    y = WgpuArray.zeros(100, device=wdev)
    k.call(100, (y, x, 3.0, 100))
    np.testing.assert_array_equal(y.to_numpy(), np.full(100, 3, np.float32))
