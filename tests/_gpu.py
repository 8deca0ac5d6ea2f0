"""GPU test helpers: ``require_gpu()`` skips cleanly where there is no usable CUDA device."""

from __future__ import annotations

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
