"""Issue #29 item 4 and issue #25 on WebGPU: a buffer bound read-only and read-write in one
dispatch is refused at that launch, naming both parameters, and never costs another launch its
work; the launch geometry is read by the CUDA path's one ``dim3``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from khal_runtime.errors import ArgumentError
from tests.webgpu import _kernels as K

pytestmark = pytest.mark.webgpu

_plans: dict[str, Any] = {}


def plan(name: str, wdev: Any) -> Any:
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    p = _plans.get(name)
    if p is None:
        e, src = getattr(K, name)()
        p = _plans[name] = KernelPlan(e, wdev, src.encode(), "tests")
    return p


def arr(a: Any, wdev: Any) -> Any:
    from khal_runtime.backends.webgpu.arrays import WgpuArray

    return WgpuArray.from_numpy(np.asarray(a), device=wdev)


# -- issue #25: one dim3 ----------------------------------------------------------------------------
@pytest.mark.parametrize("grid", [True, False, (2, True)])
def test_a_bool_grid_is_refused_as_on_cuda(wdev: Any, stream: Any, grid: Any) -> None:
    from khal_runtime import arguments

    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    with pytest.raises(ArgumentError, match=r"grid: expected an integer or up to 3 integers"):
        arguments.dim3(grid)  # the CUDA path's rule
    with pytest.raises(ArgumentError, match=r"grid: expected an integer or up to 3 integers"):
        k.launch(grid, None, (y, x, 1.0, 64))
    with pytest.raises(ArgumentError, match=r"grid: expected an integer or up to 3 integers"):
        k.bind((y, x, 1.0, 64)).launch(grid)
    stream.flush()
    assert not y.to_numpy().any()


def test_webgpu_has_no_dim3_of_its_own() -> None:
    from khal_runtime import arguments
    from khal_runtime.backends.webgpu import kernel

    assert kernel.dim3 is arguments.dim3
