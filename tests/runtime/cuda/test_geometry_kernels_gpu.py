"""Issue #24 on a GPU: kernels launched as their authors launch them, against NumPy references.

The package is tests/packages/geometry_kernels_pkg: 1-D markers whose templated helpers read the 2-D ids
(cuSignal / CuPy / PBA style) launched on 2-D grids of 2-D blocks; cuSignal's sosfilt with one
block per signal and as many threads as sections, chosen per launch; a grid-stride loop on any
block; block ids read through inline PTX (no indirect variant: host_read only); hatch-khal's own
folded ids (block fixed, and their indirect variant right); a Slang entry with numthreads(10, 10,
1) launched 2-D. Set ``KHAL_TEST_GEOMETRY_WHEEL=path/to/khal_geometry_kernels-*.whl`` to use a wheel
built beforehand (it holds a Slang crate: building it needs slangpy); otherwise it is built here
with ``pip wheel --no-build-isolation``. Outputs are poisoned before each launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from tests.helpers.paths import PACKAGES

pytestmark = pytest.mark.gpu

PKG = PACKAGES / "geometry_kernels_pkg"


@pytest.fixture(scope="module")
def rt() -> Any:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    import khal_runtime

    return khal_runtime


@pytest.fixture(scope="module")
def geo(rt: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``khal_geometry_kernels`` imported from its wheel."""
    from tests.helpers.gpu import import_test_package

    yield from import_test_package(tmp_path_factory, PKG, "khal_geometry_kernels", "KHAL_TEST_GEOMETRY_WHEEL")


@pytest.fixture
def K(geo: Any) -> Any:
    return geo.kernels


def _dev(rt: Any, a: np.ndarray) -> Any:
    return rt.DeviceBuffer.from_numpy(np.ascontiguousarray(a))


def _poisoned(rt: Any, n: int, dtype: Any) -> Any:
    raw = np.full(n * np.dtype(dtype).itemsize, 0xEF, np.uint8)
    return rt.DeviceBuffer.from_numpy(raw.view(dtype))


def _blocks(n: int, b: int) -> int:
    return (n + b - 1) // b


# -- 1-D markers, 2-D helpers: launched 2-D -----------------------------------------------------


@pytest.mark.parametrize("nx, ny", [(48, 48), (50, 37), (1, 300)])
def test_cusignal_style_2d_helper_on_a_2d_grid(rt: Any, K: Any, nx: int, ny: int) -> None:
    rng = np.random.default_rng(nx * ny)
    a = rng.standard_normal((ny, nx)).astype(np.float32)
    b = rng.standard_normal(nx).astype(np.float32)
    out = _poisoned(rt, nx * ny, np.float32)
    K.row_bias.launch((_blocks(nx, 16), _blocks(ny, 16)), (16, 16), _dev(rt, a), _dev(rt, b), out, nx, ny, 2.5)
    np.testing.assert_allclose(out.to_numpy().reshape(ny, nx), a * np.float32(2.5) + b[None, :], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("block", [(32, 8), (16, 16), (8, 4)])
def test_pba_style_transpose_on_a_2d_grid(rt: Any, K: Any, block: tuple[int, int]) -> None:
    width, height = 70, 45
    src = np.arange(width * height, dtype=np.uint32).reshape(height, width)
    dst = _poisoned(rt, width * height, np.uint32)
    K.transpose.launch((_blocks(width, block[0]), _blocks(height, block[1])), block, _dev(rt, src), dst,
                       width, height)
    assert (dst.to_numpy().reshape(width, height) == src.T).all()


# -- blocks chosen at run time ------------------------------------------------------------------


def _sos(n_sections: int, seed: int) -> np.ndarray:
    """Stable all-pass second-order sections (rows [a2, a1, 1, 1, a1, a2], poles inside radius 0.9):
    gain 1, so a cascade of many keeps the signal's size."""
    rng = np.random.default_rng(seed)
    r = rng.uniform(0.3, 0.9, n_sections)
    th = rng.uniform(0.1, 3.0, n_sections)
    a1, a2 = -2 * r * np.cos(th), r * r
    sos = np.zeros((n_sections, 6), np.float32)
    sos[:, 0], sos[:, 1], sos[:, 2], sos[:, 3], sos[:, 4], sos[:, 5] = a2, a1, 1.0, 1.0, a1, a2
    return sos


def _sosfilt_reference(sos: np.ndarray, x: np.ndarray) -> np.ndarray:
    """scipy.signal.sosfilt (transposed direct form II per section), in float64."""
    y = x.astype(np.float64).copy()
    for b0, b1, b2, _, a1, a2 in sos.astype(np.float64):
        z0 = np.zeros(y.shape[0])
        z1 = np.zeros(y.shape[0])
        out = np.empty_like(y)
        for i in range(y.shape[1]):
            xi = y[:, i]
            yi = b0 * xi + z0
            z0 = b1 * xi - a1 * yi + z1
            z1 = b2 * xi - a2 * yi
            out[:, i] = yi
        y = out
    return np.asarray(y)


@pytest.mark.parametrize("n_sections", [1, 8, 37])
def test_sosfilt_one_block_per_signal_one_thread_per_section(rt: Any, K: Any, n_sections: int) -> None:
    """cuSignal's sosfilt, as cuSignal launches it: grid = signals, block = sections (the marker
    says 1024: its threadIdx.x / blockIdx.x / blockDim.x are read apart, so any block fits)."""
    n_signals, n_samples = 4, 300
    sos = _sos(n_sections, n_sections)
    x = np.random.default_rng(7).standard_normal((n_signals, n_samples)).astype(np.float32)
    buf = _dev(rt, x)
    K.sosfilt.launch(n_signals, n_sections, _dev(rt, sos), buf, n_samples)
    np.testing.assert_allclose(buf.to_numpy().reshape(n_signals, n_samples), _sosfilt_reference(sos, x),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("grid, block", [(7, 64), (3, 256), (1, 32), (100, 128)])
def test_grid_stride_loop_on_any_block(rt: Any, K: Any, grid: int, block: int) -> None:
    n = 100_003
    x = np.random.default_rng(grid).standard_normal(n).astype(np.float32)
    buf = _dev(rt, x)
    K.axpb_strided.launch(grid, block, buf, 2.0, -1.0)
    np.testing.assert_allclose(buf.to_numpy(), x * np.float32(2) - np.float32(1), rtol=1e-6, atol=1e-6)


# -- block ids through inline PTX: no indirect variant ------------------------------------------


@pytest.mark.parametrize("entry, tag", [("block_ids", 1), ("block_ids_helper", 2)])
def test_inline_ptx_block_ids_have_no_indirect_variant(rt: Any, K: Any, entry: str, tag: int) -> None:
    k = getattr(K, entry)
    assert k.entry.indirect_symbol is None
    want = np.full(16, 0xEFEFEFEF, np.uint32)
    want[:5] = np.arange(5, dtype=np.uint32) * 10 + tag
    out = _poisoned(rt, 16, np.uint32)
    k.launch(5, None, out)
    assert (out.to_numpy() == want).all()
    out = _poisoned(rt, 16, np.uint32)
    count = _dev(rt, np.array([5], np.uint32))
    with pytest.raises(rt.KhalError, match="no indirect"):
        k.dispatch_indirect(count, out)
    k.dispatch_indirect(count, out, host_read=True)  # the host reads the count: the direct kernel, 5 blocks
    assert (out.to_numpy() == want).all()


# -- hatch-khal's folded ids: block fixed, indirect variant right --------------------------------


def test_folded_ids_keep_their_block_and_their_indirect_variant(rt: Any, K: Any) -> None:
    from khal_runtime.errors import ArgumentValueError

    n = 1000
    want = np.float32(0.5) + np.arange(n, dtype=np.float32)
    runs: tuple[Callable[[Any], None], ...] = (
        lambda b: K.folded(n, b, 0.5),
        lambda b: K.folded.launch(_blocks(n, 128), None, b, 0.5),
        lambda b: K.folded.launch(_blocks(n, 128), 128, b, 0.5),
        lambda b: K.folded.dispatch_indirect(_dev(rt, np.array([_blocks(n, 128)], np.uint32)), b, 0.5),
        lambda b: K.folded.dispatch_indirect(_dev(rt, np.array([n], np.uint32)), b, 0.5, threads=True))
    for run in runs:
        buf = _poisoned(rt, n, np.float32)
        run(buf)
        np.testing.assert_array_equal(buf.to_numpy(), want)
    assert K.folded.entry.indirect_symbol is not None
    with pytest.raises(ArgumentValueError, match="not the block size the entry was compiled for"):
        K.folded.launch(16, 64, _poisoned(rt, n, np.float32), 0.5)
    with pytest.raises(ArgumentValueError, match="use x only"):
        K.folded.launch((4, 2), None, _poisoned(rt, n, np.float32), 0.5)


# -- Slang: numthreads(10, 10, 1) ---------------------------------------------------------------


@pytest.mark.parametrize("nx, ny", [(25, 15), (10, 10), (1, 33)])
def test_slang_numthreads_10x10_launched_2d(rt: Any, K: Any, nx: int, ny: int) -> None:
    a = np.random.default_rng(nx + ny).standard_normal((ny, nx)).astype(np.float32)
    want = np.float32(3) * a + np.arange(ny, dtype=np.float32)[:, None]
    da = _dev(rt, a)
    grid = (_blocks(nx, 10), _blocks(ny, 10))
    runs: tuple[Callable[[Any], None], ...] = (
        lambda o: K.saxpy2d((nx, ny), da, o, nx, ny, 3.0),
        lambda o: K.saxpy2d.launch(grid, None, da, o, nx, ny, 3.0),
        lambda o: K.saxpy2d.launch(grid, (10, 10, 1), da, o, nx, ny, 3.0))
    for run in runs:
        out = _poisoned(rt, nx * ny, np.float32)
        run(out)
        np.testing.assert_allclose(out.to_numpy().reshape(ny, nx), want, rtol=1e-6, atol=1e-6)
