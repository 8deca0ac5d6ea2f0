"""GPU tests of the example's `cccl` crate: CUDA headers, bf16, CUB and cooperative groups
from PyPI wheels, each against a NumPy reference. Outputs are poisoned before each run."""

from __future__ import annotations

import numpy as np
import pytest

SIZES = [1, 7, 31, 32, 33, 255, 257, 511, 512, 513, 4099, 1 << 20, 3_000_001]


def _sync(rt) -> None:  # type: ignore[no-untyped-def]
    rt.default_stream().synchronize()


def _floats(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed + n).standard_normal(n) * 3).astype(np.float32)


@pytest.fixture(scope="module")
def rt():  # type: ignore[no-untyped-def]
    import khal_runtime

    return khal_runtime


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_sum_cub(example_pkg, rt, n: int) -> None:  # type: ignore[no-untyped-def]
    x = _floats(n, 1)
    out = rt.DeviceBuffer.from_numpy(np.zeros(1, np.float32))
    threads = min(n, 1 << 18)
    example_pkg.kernels.sum_cub(threads, rt.DeviceBuffer.from_numpy(x), out)
    _sync(rt)
    R = example_pkg.reference
    assert abs(float(out.to_numpy()[0]) - R.sum_cub(x)) <= R.sum_tolerance(x)


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_sort_tiles(example_pkg, rt, n: int) -> None:  # type: ignore[no-untyped-def]
    keys = np.random.default_rng(n).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    d = rt.DeviceBuffer.from_numpy(keys)
    example_pkg.kernels.sort_tiles(example_pkg.sort_tiles_threads(n), d)
    _sync(rt)
    np.testing.assert_array_equal(d.to_numpy(), example_pkg.reference.sort_tiles(keys, example_pkg.SORT_TILE))


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_tile_max(example_pkg, rt, n: int) -> None:  # type: ignore[no-untyped-def]
    x = _floats(n, 2)
    expected = example_pkg.reference.tile_max(x)
    out = rt.DeviceBuffer.from_numpy(np.full(expected.size, np.nan, np.float32))
    example_pkg.kernels.tile_max(-(-n // 256) * 256, rt.DeviceBuffer.from_numpy(x), out)
    _sync(rt)
    np.testing.assert_array_equal(out.to_numpy(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 7), (257, 64), (1024, 1000), (4096, 768)])
def test_bias_gelu_bf16_torch(example_pkg, rt, rows: int, cols: int) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    g = torch.Generator().manual_seed(rows * 31 + cols)
    x = (torch.randn(rows, cols, generator=g) * 3).to(torch.bfloat16)
    bias = torch.randn(cols, generator=g).to(torch.bfloat16)
    y = torch.full((rows, cols), float("nan"), dtype=torch.bfloat16)
    xd, bd, yd = x.cuda(), bias.cuda(), y.cuda()
    torch.cuda.synchronize()
    example_pkg.kernels.bias_gelu_bf16(rows * cols, xd, bd, yd, cols)
    _sync(rt)
    got = yd.float().cpu().numpy().reshape(-1)
    expected = example_pkg.reference.bias_gelu_bf16(x.float().numpy(), bias.float().numpy())
    # one bf16 ulp (2^-8 relative) of rounding freedom between erff and the float64 reference
    np.testing.assert_allclose(got, expected, rtol=2 ** -7, atol=1e-3)


@pytest.mark.gpu
def test_bf16_wrong_dtype_is_rejected_before_launch(example_pkg, rt) -> None:  # type: ignore[no-untyped-def]
    x = rt.DeviceBuffer.from_numpy(np.zeros(8, np.float32))
    with pytest.raises(rt.ArgumentError, match="bias_gelu_bf16.*'x'"):
        example_pkg.kernels.bias_gelu_bf16(8, x, x, x, 8)
