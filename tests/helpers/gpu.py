"""GPU test helpers: ``require_gpu()`` skips cleanly where there is no usable CUDA device."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest


def gpu_status() -> tuple[bool, str]:
    """Whether CUDA is usable here. The runtime's own modules are imported outside any
    ``try``: a broken runtime must fail the GPU tests, never skip them."""
    from khal_runtime import backends

    st = backends.get("cuda").status()
    return st.usable, st.reason


def require_gpu() -> None:
    """Skip the calling test unless a CUDA device and driver are usable."""
    ok, why = gpu_status()
    if not ok:
        pytest.skip(f"no GPU: {why}")


@pytest.fixture
def gpu() -> None:
    require_gpu()


def import_test_package(tmp_path_factory: pytest.TempPathFactory, project: Path, module: str,
                        wheel_env: str) -> Iterator[Any]:
    """Yield ``module`` imported from the wheel of the test package at ``project``: the wheel named by
    the environment variable ``wheel_env`` (built beforehand, e.g. by scripts/gpu-check), else one
    built here without isolation. Unpacked into a folder put first on sys.path for the fixture's
    life (a generator: ``yield from`` it in a module-scoped fixture)."""
    given = os.environ.get(wheel_env)
    if given:
        wheel = Path(given)
        assert wheel.is_file(), f"{wheel_env}={given}: no such wheel"
    else:
        out = tmp_path_factory.mktemp(f"{module}-wheel")
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                               "-w", str(out), str(project)], capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        (wheel,) = out.glob(f"{module}-*.whl")
    site = tmp_path_factory.mktemp(f"{module}-site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    sys.path.insert(0, str(site))
    sys.modules.pop(module, None)
    try:
        yield importlib.import_module(module)
    finally:
        sys.path.remove(str(site))
