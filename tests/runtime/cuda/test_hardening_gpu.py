"""Runtime hardening on the GPU: bad buffers fail before launch, OOM is clear, the runtime
stays usable, and many threads launching on their own streams all get correct results."""

from __future__ import annotations

import threading

import numpy as np
import pytest


@pytest.fixture(scope="module")
def rt():  # type: ignore[no-untyped-def]
    import khal_runtime

    return khal_runtime


def _saxpy_ok(example_pkg, rt, n: int = 1000) -> None:  # type: ignore[no-untyped-def]
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    dx, dy = rt.DeviceBuffer.from_numpy(x), rt.DeviceBuffer.from_numpy(y)
    example_pkg.kernels.saxpy(n, dx, dy, example_pkg.SaxpyParams(a=2.0))
    rt.default_stream().synchronize()
    np.testing.assert_array_equal(dy.to_numpy(), example_pkg.reference.saxpy(x, y, 2.0))


@pytest.mark.gpu
def test_freed_buffer_is_refused_before_launch(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    x = rt.DeviceBuffer.from_numpy(np.zeros(16, np.float32))
    y = rt.DeviceBuffer.from_numpy(np.zeros(16, np.float32))
    x.free()
    with pytest.raises(rt.ArgumentValueError, match="freed"):
        example_pkg.kernels.saxpy(16, x, y, example_pkg.SaxpyParams(a=1.0))
    _saxpy_ok(example_pkg, rt)


@pytest.mark.gpu
def test_out_of_memory_is_clear_and_recoverable(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(rt.CudaError, match="out of device memory .* free unused buffers"):
        rt.DeviceBuffer.alloc(1 << 45, np.float32)  # 128 TiB
    _saxpy_ok(example_pkg, rt)


@pytest.mark.gpu
def test_host_and_strided_arrays_are_refused(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    y = rt.DeviceBuffer.from_numpy(np.zeros(16, np.float32))
    p = example_pkg.SaxpyParams(a=1.0)
    with pytest.raises(rt.ArgumentError, match="'x'"):
        example_pkg.kernels.saxpy(16, np.zeros(16, np.float32), y, p)
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        strided = torch.zeros(32, device="cuda")[::2]
        with pytest.raises((rt.ArgumentError, rt.ArgumentValueError), match="contiguous"):
            example_pkg.kernels.saxpy(16, strided, y, p)
        with pytest.raises((rt.ArgumentError, rt.ArgumentValueError), match="'y'"):
            example_pkg.kernels.saxpy(16, y, torch.zeros(16, dtype=torch.float64, device="cuda"), p)
    with pytest.raises((rt.ArgumentError, rt.ArgumentValueError), match="params"):
        example_pkg.kernels.saxpy(16, y, y, b"\x00" * 8)  # uniform of the wrong size
    _saxpy_ok(example_pkg, rt)


@pytest.mark.gpu
def test_stress_threads_on_own_streams(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    n_threads, iters, n = 8, 50, 100_003
    R = example_pkg.reference
    x = (np.random.default_rng(0).standard_normal(n)).astype(np.float32)
    errors: list[BaseException] = []
    results: dict[int, tuple[np.ndarray, float, np.ndarray]] = {}

    def worker(t: int) -> None:
        try:
            s = rt.Stream.create()
            dx = rt.DeviceBuffer.from_numpy(x, s)
            dy = rt.DeviceBuffer.from_numpy(np.zeros(n, np.float32), s)
            dg = rt.DeviceBuffer.from_numpy(np.full(n, np.nan, np.float32), s)
            out = rt.DeviceBuffer.from_numpy(np.zeros(1, np.float32), s)
            for _ in range(iters):
                example_pkg.kernels.saxpy(example_pkg.elementwise_threads(n), dx, dy,
                                          example_pkg.SaxpyParams(a=float(t)), stream=s)
            example_pkg.kernels.gelu(example_pkg.elementwise_threads(n), dx, dg, stream=s)
            example_pkg.kernels.reduce_sum(example_pkg.reduce_sum_threads(n), dx, out, stream=s)
            s.synchronize()
            results[t] = (dy.to_numpy(s), float(out.to_numpy(s)[0]), dg.to_numpy(s))
            s.synchronize()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    gelu = R.gelu(x)
    for t in range(n_threads):
        y, total, g = results[t]
        np.testing.assert_allclose(y, x * np.float32(t) * iters, rtol=1e-4, atol=1e-3)
        assert abs(total - R.reduce_sum(x)) <= R.sum_tolerance(x)
        np.testing.assert_allclose(g, gelu, rtol=1e-5, atol=1e-6)


class _Cai:
    """A float32 view at ``ptr`` through ``__cuda_array_interface__`` (``readonly``: data[1])."""

    def __init__(self, ptr: int, n: int, readonly: bool = False) -> None:
        self._cai = {"version": 3, "shape": (n,), "typestr": "<f4", "data": (ptr, readonly), "strides": None}

    @property
    def __cuda_array_interface__(self) -> dict:  # type: ignore[type-arg]
        return self._cai


@pytest.mark.gpu
def test_misaligned_and_read_only_arrays_are_refused_before_launch(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    """A float32 array at an odd address would be a sticky CUDA_ERROR_MISALIGNED_ADDRESS (the
    context lost for the process); a read-only array would be written. Both are refused by name,
    and the runtime stays usable."""
    n = 256
    raw = rt.DeviceBuffer.alloc(4 * n + 4, np.uint8)
    xs = np.arange(n, dtype=np.float32)
    x = rt.DeviceBuffer.from_numpy(xs)
    y = rt.DeviceBuffer.from_numpy(np.ones(n, np.float32))
    p = example_pkg.SaxpyParams(a=2.0)
    for _ in range(2):  # generic path, then generated code
        with pytest.raises(rt.ArgumentValueError, match=r"argument 'x'.*not a multiple of 4 bytes"):
            example_pkg.kernels.saxpy(n, _Cai(raw.ptr + 1, n), y, p)
        with pytest.raises(rt.ArgumentError, match=r"argument 'y'.*read-only"):
            example_pkg.kernels.saxpy(n, x, _Cai(y.ptr, n, readonly=True), p)
    example_pkg.kernels.saxpy(n, _Cai(x.ptr, n, readonly=True), y, p)  # a read-only x is fine
    rt.default_stream().synchronize()
    np.testing.assert_array_equal(y.to_numpy(), example_pkg.reference.saxpy(xs, np.ones(n, np.float32), 2.0))
    _saxpy_ok(example_pkg, rt)
