"""GPU test helpers: ``require_gpu()`` skips cleanly where there is no usable CUDA device."""

from __future__ import annotations

import pytest


def gpu_status() -> tuple[bool, str]:
    try:
        from khal_runtime._cuda import backend_status

        st = backend_status()
    except Exception as exc:  # pragma: no cover - broken install
        return False, f"{type(exc).__name__}: {exc}"
    return st.usable, st.reason


def require_gpu() -> None:
    """Skip the calling test unless a CUDA device and driver are usable."""
    ok, why = gpu_status()
    if not ok:
        pytest.skip(f"no GPU: {why}")


@pytest.fixture
def gpu() -> None:
    require_gpu()
