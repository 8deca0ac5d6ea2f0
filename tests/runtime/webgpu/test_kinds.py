"""Parameter kinds on the WebGPU launch path: a new kind reusing a reader needs no change
here; a reader the path does not implement is refused when the kernel is planned."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from khal_runtime import abi
from tests.runtime.webgpu import _kernels as K

pytestmark = pytest.mark.webgpu


def test_a_new_kind_reusing_a_reader_launches(wdev: Any, stream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime.backends.webgpu.arrays import WgpuArray
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    monkeypatch.setitem(abi.KINDS, "count", abi.ParamKind("count", "value", (None,)))
    e, src = K.saxpy()
    n = e.params[3]
    e = e.model_copy(update={"params": (*e.params[:3], n.model_copy(update={"kind": "count"}))})
    k = KernelPlan(e, wdev, src.encode(), "tests")
    x = WgpuArray.from_numpy(np.arange(300, dtype=np.float32), device=wdev)
    y = WgpuArray.from_numpy(np.ones(300, np.float32), device=wdev)
    k.call(300, (y, x, 2.0, 250))
    want = np.ones(300, np.float32)
    want[:250] += 2 * np.arange(250, dtype=np.float32)
    np.testing.assert_array_equal(y.to_numpy(), want)


def test_an_unknown_reader_is_refused(wdev: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    e, src = K.saxpy()
    monkeypatch.setitem(abi.KINDS, "scalar", dataclasses.replace(abi.KINDS["scalar"], reader="pixels"))
    with pytest.raises(ValueError, match="parameter kind 'scalar' has reader 'pixels', which this path does not"):
        KernelPlan(e, wdev, src.encode(), "tests")
