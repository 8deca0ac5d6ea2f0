"""Issue #39 on a GPU: a kernel loaded from a companion distribution. The small test project is built
for sm_90 only (no PTX) with the build API, packed as a wheel, split (``python -m hatch_khal split
--force``: its cubins go to ``mini-pkg-kernels-sm90``), both installed into a folder, and ``fill``
launched there: the cubin the driver loads is the companion's."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _wheel(root: Path, files: dict[str, bytes], out: Path) -> Path:
    """A plain wheel of package mini_pkg with the build's files (no hatchling on the GPU machine)."""
    path = out / "mini_pkg-0.1.0-py3-none-any.whl"
    out.mkdir(parents=True, exist_ok=True)
    members = {"mini_pkg/__init__.py": (root / "mini_pkg/__init__.py").read_bytes(),
               **{f"mini_pkg/{k}": v for k, v in files.items()},
               "mini_pkg-0.1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: mini-pkg\nVersion: 0.1.0\n",
               "mini_pkg-0.1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                 b"Tag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr("mini_pkg-0.1.0.dist-info/RECORD", "".join(f"{n},,\n" for n in members) + "mini_pkg-0.1.0.dist-info/RECORD,,\n")
    return path


def test_a_kernel_loaded_from_its_companion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    import numpy as np

    import khal_runtime
    from hatch_khal.builder import build_packages
    from hatch_khal.cache import Cache
    from hatch_khal.model import PrintReporter
    from tests.helpers.build import _crates
    from tests.helpers.projects import make_project

    monkeypatch.setenv("KHAL_PTX_ARCH", "none")
    root = make_project(tmp_path / "proj", hook='archs = ["sm_90"]\n')
    (pkg,) = build_packages(root, _crates(root), PrintReporter(), cache=Cache(None)).packages
    wheel = _wheel(root, pkg.files, tmp_path / "dist")
    out = subprocess.run([sys.executable, "-m", "hatch_khal", "split", str(wheel), "--force", "--out",
                          str(tmp_path / "split")], capture_output=True, text=True, check=True).stdout.split()
    wheels = [w for w in out if w.endswith(".whl")]
    assert [Path(w).name for w in wheels] == ["mini_pkg-0.1.0-py3-none-any.whl",
                                              "mini_pkg_kernels_sm90-0.1.0-py3-none-any.whl"]
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    *wheels], check=True)
    assert not list((site / "mini_pkg").rglob("*.cubin"))  # the main package ships none
    monkeypatch.syspath_prepend(str(site))
    ks = khal_runtime.load(site / "mini_pkg")
    buf = khal_runtime.DeviceBuffer.from_numpy(np.zeros(1000, dtype=np.uint32))
    ks.fill(1000, buf, 7)
    assert (buf.to_numpy() == 7).all()
    module = ks.crates["beta"].module(0)
    assert module.artifact.distribution == "mini-pkg-kernels-sm90" and module.artifact.arch == "sm_90"
