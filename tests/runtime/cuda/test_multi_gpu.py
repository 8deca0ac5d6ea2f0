"""Several GPUs: one module per device, a kernel launches on the device of the stream given.
Skips with fewer than two devices (run on the lent 2-GPU machine)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def rt():  # type: ignore[no-untyped-def]
    import khal_runtime

    if khal_runtime.Device.count() < 2:
        pytest.skip("needs at least two CUDA devices")
    return khal_runtime


def test_each_device_runs_its_own_copy_of_the_kernels(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    n = 100_003
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    for d in range(rt.Device.count()):
        st = rt.Device(d).default_stream
        dx = rt.DeviceBuffer.from_numpy(x, st)
        dy = rt.DeviceBuffer.from_numpy(np.ones(n, np.float32), st)
        assert dx.device_id == d and st.device_id == d
        example_pkg.kernels.saxpy(example_pkg.elementwise_threads(n), dx, dy,
                                  example_pkg.SaxpyParams(a=float(d + 2)), stream=st)
        st.synchronize()
        np.testing.assert_allclose(dy.to_numpy(st), x * np.float32(d + 2) + 1, rtol=1e-6, atol=1e-6)
    assert set(example_pkg.kernels.saxpy._plans) >= {0, 1}  # one launch plan (module) per device


def test_threads_on_different_devices_at_once(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    n = 1 << 20
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    errors: list[BaseException] = []
    sums: dict[int, float] = {}

    def work(d: int) -> None:
        try:
            st = rt.Stream.create(device=d)
            dx = rt.DeviceBuffer.from_numpy(x, st)
            out = rt.DeviceBuffer.from_numpy(np.zeros(1, np.float32), st)
            for _ in range(20):
                example_pkg.kernels.reduce_sum(example_pkg.reduce_sum_threads(n), dx, out, stream=st)
            st.synchronize()
            sums[d] = float(out.to_numpy(st)[0]) / 20
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(d,)) for d in range(2) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    R = example_pkg.reference
    for d in (0, 1):
        assert abs(sums[d] - R.reduce_sum(x)) <= 20 * R.sum_tolerance(x)


def test_an_array_on_another_device_is_refused(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    """Another device's memory would fail in the kernel with an illegal address and ruin the
    context; the launch names the argument instead, and the device goes on working."""
    n = 4099
    st0, st1 = rt.Device(0).default_stream, rt.Device(1).default_stream
    x0 = rt.DeviceBuffer.from_numpy(np.ones(n, np.float32), st0)
    y0 = rt.DeviceBuffer.from_numpy(np.zeros(n, np.float32), st0)
    x1 = rt.DeviceBuffer.from_numpy(np.ones(n, np.float32), st1)
    saxpy, p = example_pkg.kernels.saxpy, example_pkg.SaxpyParams(a=2.0)
    threads = example_pkg.elementwise_threads(n)
    for _ in range(3):
        saxpy(threads, x0, y0, p, stream=st0)
    others = [x1]
    try:
        import torch

        if torch.cuda.device_count() >= 2:
            others.append(torch.ones(n, device="cuda:1"))
    except ImportError:
        pass
    try:
        import cupy as cp

        with cp.cuda.Device(1):
            others.append(cp.ones(n, dtype=cp.float32))
    except ImportError:
        pass
    for other in others:
        with pytest.raises(rt.ArgumentValueError, match="'x'.*is on device 1, the launch is on device 0"):
            saxpy(threads, other, y0, p, stream=st0)
    saxpy(threads, x0, y0, p, stream=st0)
    st0.synchronize()
    np.testing.assert_array_equal(y0.to_numpy(st0), np.full(n, 8.0, np.float32))
