"""Kernel.bind on the H200: a bound saxpy launched repeatedly gives the reference result."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_bound_saxpy_repeated(example_pkg) -> None:  # type: ignore[no-untyped-def]
    import khal_runtime as rt

    n = 100_003
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    dx = rt.DeviceBuffer.from_numpy(x)
    dy = rt.DeviceBuffer.from_numpy(np.zeros(n, np.float32))
    params = example_pkg.SaxpyParams(a=0.5)
    b = example_pkg.kernels.saxpy.bind(dx, dy, params)
    params.a = 100.0  # bound: the copy taken at bind time is used
    for _ in range(4):
        b(example_pkg.elementwise_threads(n))
    rt.default_stream().synchronize()
    np.testing.assert_allclose(dy.to_numpy(), x * np.float32(2.0), rtol=1e-6, atol=1e-6)


def test_bound_launch_with_torch_and_in_a_graph(example_pkg) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    import khal_runtime as rt

    n = 4099
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = torch.ones(n, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    st = rt.default_stream()
    b = example_pkg.kernels.saxpy.bind(x, y, example_pkg.SaxpyParams(a=2.0), stream=st)
    with st.capture(label="bound") as cap:
        b(n)
    cap.graph.launch()
    cap.graph.launch()
    st.synchronize()
    np.testing.assert_allclose(y.cpu().numpy(), 1 + 4 * np.arange(n, dtype=np.float32), rtol=1e-6)
    cap.graph.close()
