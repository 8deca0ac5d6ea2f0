"""Issue #19 on a GPU: kernels as their authors wrote them, against NumPy references.

The package is tests/packages/real_kernels_pkg (templated entries, typedef / macro / multi-word element
types, complex numbers through thrust::complex and cuda::std::complex, 2-D and 3-D launches, a
block chosen per launch, bodies reading blockIdx / gridDim, one source as two crates). Set
``KHAL_TEST_REAL_WHEEL=path/to/khal_real_kernels-*.whl`` to use a wheel built beforehand (the
GPU machine has no CCCL headers to build it); otherwise it is built here with
``pip wheel --no-build-isolation``. Outputs are poisoned before each launch.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers.paths import PACKAGES

pytestmark = pytest.mark.gpu

PKG = PACKAGES / "real_kernels_pkg"
POISON = 0xEFEFEFEF  # what _poisoned() fills uint32 outputs with


@pytest.fixture(scope="module")
def rt() -> Any:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    import khal_runtime

    return khal_runtime


@pytest.fixture(scope="module")
def real(rt: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``khal_real_kernels`` imported from its wheel."""
    from tests.helpers.gpu import import_test_package

    yield from import_test_package(tmp_path_factory, PKG, "khal_real_kernels", "KHAL_TEST_REAL_WHEEL")


@pytest.fixture
def K(real: Any) -> Any:
    return real.kernels


def _dev(rt: Any, a: np.ndarray) -> Any:
    return rt.DeviceBuffer.from_numpy(np.ascontiguousarray(a))


def _poisoned(rt: Any, n: int, dtype: Any) -> Any:
    raw = np.full(n * np.dtype(dtype).itemsize, 0xEF, np.uint8)
    return rt.DeviceBuffer.from_numpy(raw.view(dtype))


# -- templated entries -------------------------------------------------------------------------


@pytest.mark.parametrize("entry, dtype, a", [
    ("scale_f32", np.float32, 1.5), ("scale_f64", np.float64, -2.25),
    ("scale_c64", np.complex64, 0.5 - 1.25j), ("scale_c128", np.complex128, -3 + 0.5j),
])
@pytest.mark.parametrize("n", [1, 1000, 1 << 20])
def test_one_template_four_instantiations(rt: Any, K: Any, entry: str, dtype: Any, a: complex, n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(n)
    x = x.astype(dtype)
    buf = _dev(rt, x)
    getattr(K, entry)(n, buf, a)
    want = x * np.asarray(a, dtype)
    tol = 0 if np.dtype(dtype).kind == "f" else (1e-6 if dtype == np.complex64 else 1e-14)
    np.testing.assert_allclose(buf.to_numpy(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("entry, dtype, rdtype", [("abs2_c64", np.complex64, np.float32),
                                                  ("abs2_c128", np.complex128, np.float64)])
def test_grid_stride_template_direct_and_indirect(rt: Any, K: Any, entry: str, dtype: Any, rdtype: Any) -> None:
    """cuSignal's shape: blockIdx * blockDim + threadIdx, striding by blockDim * gridDim."""
    n = 100_003
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    want = (x.real.astype(rdtype) ** 2 + x.imag.astype(rdtype) ** 2)
    inp = _dev(rt, x)
    k = getattr(K, entry)
    for run in (lambda o: k(n, inp, o), lambda o: k.launch(7, None, inp, o),
                lambda o: k.dispatch_indirect(_dev(rt, np.array([5], np.uint32)), inp, o)):
        out = _poisoned(rt, n, rdtype)
        run(out)
        np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-6 if rdtype == np.float32 else 1e-14)


# -- element types the compiler resolved -------------------------------------------------------


@pytest.mark.parametrize("how", ["direct", "indirect", "indirect-threads"])
def test_typedefs_macros_and_builtin_spellings_take_their_natural_dtypes(rt: Any, K: Any, how: str) -> None:
    """Direct, and through the indirect (persistent-grid) variant on a device-side count of
    groups or of threads: the same results."""
    n = 5000
    r = np.linspace(-10, 10, n, dtype=np.float32)
    outs = {"l": np.int64, "u": np.uint32, "ll": np.int64, "sc": np.int8, "li": np.int64, "tn": np.float64}
    bufs = {k: _poisoned(rt, n, t) for k, t in outs.items()}
    args = (_dev(rt, r), bufs["l"], bufs["u"], bufs["ll"], bufs["sc"], bufs["li"], bufs["tn"], 7, -3)
    if how == "direct":
        K.spellings(n, *args)
    else:
        assert K.spellings.entry.indirect_symbol is not None  # a 1-D body: the manifest gives it one
        threads = how == "indirect-threads"
        count = _dev(rt, np.array([n if threads else (n + 255) // 256], np.uint32))
        K.spellings.dispatch_indirect(count, *args, threads=threads)
    i = np.arange(n)
    assert (bufs["l"].to_numpy() == (r * 2).astype(np.int64) - 3).all()
    assert (bufs["u"].to_numpy() == (i * 7).astype(np.uint32)).all()
    assert (bufs["ll"].to_numpy() == -i.astype(np.int64) * 1_000_000_000).all()
    assert (bufs["sc"].to_numpy() == ((i % 100) - 50).astype(np.int8)).all()
    assert (bufs["li"].to_numpy() == i * 3).all()
    assert (bufs["tn"].to_numpy() == r.astype(np.float64) / 4).all()
    # the natural dtype only: a long is int64 (not int32, not uint64 of the same size), on both paths
    count1 = _dev(rt, np.array([1], np.uint32))
    for bad_l in (np.int32, np.uint64, np.float64):
        bad = (_dev(rt, r), _dev(rt, np.zeros(n, bad_l)), *list(bufs.values())[1:], 7, -3)
        with pytest.raises(rt.ArgumentError, match="argument 'l' .*expected element type int64"):
            if how == "direct":
                K.spellings(n, *bad)
            else:
                K.spellings.dispatch_indirect(count1, *bad)


def test_struct_elements_take_structured_arrays(rt: Any, K: Any) -> None:
    particle = np.dtype([("x", "<f4"), ("y", "<f4"), ("id", "<i4"), ("pad", "<i4")])
    p = np.zeros(300, particle)
    p["x"], p["id"] = np.arange(300), np.arange(300) * 2
    buf = _dev(rt, p)
    K.move(300, buf, 0.5)
    got = buf.to_numpy()
    assert (got["x"] == np.arange(300) + 0.5).all() and (got["id"] == np.arange(300) * 2 + 1).all()
    with pytest.raises(rt.ArgumentError, match=r"expected element type Particle \(16 bytes\), got complex128"):
        K.move(300, _dev(rt, np.zeros(300, np.complex128)), 0.5)


# -- complex numbers ---------------------------------------------------------------------------


def _complex(n: int, dtype: Any, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)


def test_thrust_complex_and_cuda_std_complex(rt: Any, K: Any) -> None:
    n = 10_000
    a = _complex(n, np.complex64)
    out = _poisoned(rt, n, np.complex64)
    K.cmul_thrust(n, _dev(rt, a), out, 2 - 1j)
    np.testing.assert_allclose(out.to_numpy(), a * np.complex64(2 - 1j) + np.conj(a), rtol=2e-6, atol=2e-6)
    b = _complex(n, np.complex128, 2) * 0.5
    out = _poisoned(rt, n, np.complex128)
    K.cexp_std(n, _dev(rt, b), out, np.complex128(0.25 + 3j))
    np.testing.assert_allclose(out.to_numpy(), np.exp(b) * (0.25 + 3j), rtol=1e-13)
    with pytest.raises(rt.ArgumentError, match="expected element type complex64"):
        K.cmul_thrust(n, _dev(rt, a.astype(np.complex128)), out, 1)


def test_complex_arrays_of_torch_and_cupy(rt: Any, K: Any) -> None:
    n = 4096
    x = _complex(n, np.complex64, 5)
    want = x * np.complex64(1.5 + 0.5j)
    torch = importlib.import_module("torch") if importlib.util.find_spec("torch") else None
    cupy = importlib.import_module("cupy") if importlib.util.find_spec("cupy") else None
    if torch is None and cupy is None:
        pytest.skip("neither torch nor cupy")
    if torch is not None:
        t = torch.from_numpy(x.copy()).cuda()
        K.scale_c64(n, t, 1.5 + 0.5j)
        torch.cuda.synchronize()
        np.testing.assert_allclose(t.cpu().numpy(), want, rtol=1e-6, atol=1e-6)
        with pytest.raises(rt.ArgumentError, match="expected element type complex64"):
            K.scale_c64(n, t.to(torch.complex128), 1)
    if cupy is not None:
        c = cupy.asarray(x)
        K.scale_c64(n, c, 1.5 + 0.5j)
        cupy.cuda.runtime.deviceSynchronize()
        np.testing.assert_allclose(cupy.asnumpy(c), want, rtol=1e-6, atol=1e-6)


# -- 2-D and 3-D launches ----------------------------------------------------------------------


@pytest.mark.parametrize("nx, ny", [(1, 1), (17, 33), (640, 480)])
def test_2d_entry(rt: Any, K: Any, nx: int, ny: int) -> None:
    a = np.random.default_rng(nx).standard_normal((ny, nx)).astype(np.float32)
    out = _poisoned(rt, nx * ny, np.float32)
    K.add2d((nx, ny), _dev(rt, a), out, nx, ny)
    y, x = np.mgrid[0:ny, 0:nx]
    want = a + (x * 1000 + y).astype(np.float32)
    assert (out.to_numpy().reshape(ny, nx) == want).all()
    with pytest.raises(rt.ArgumentError, match=r"the entry is 2-D .*\(nx, ny\)"):
        K.add2d(nx * ny, _dev(rt, a), out, nx, ny)
    out2 = _poisoned(rt, nx * ny, np.float32)
    K.add2d.launch(((nx + 15) // 16, (ny + 15) // 16), None, _dev(rt, a), out2, nx, ny)  # explicit grid
    assert (out2.to_numpy() == out.to_numpy()).all()
    # no indirect variant for a 2-D entry (the count counts groups along x only): refused, saying why
    assert K.add2d.entry.indirect_symbol is None
    out3 = _poisoned(rt, nx * ny, np.float32)
    with pytest.raises(rt.KhalError, match=r"add2d has no indirect .*variant: it is a 2-D entry.*host_read=True"):
        K.add2d.dispatch_indirect(_dev(rt, np.array([1], np.uint32)), _dev(rt, a), out3, nx, ny)
    assert (out3.to_numpy().view(np.uint32) == POISON).all()  # nothing was launched


def test_3d_entry(rt: Any, K: Any) -> None:
    nx, ny, nz = 21, 10, 7
    out = _poisoned(rt, nx * ny * nz, np.uint32)
    K.grid3d((nx, ny, nz), out, nx, ny, nz)
    z, y, x = np.mgrid[0:nz, 0:ny, 0:nx]
    assert (out.to_numpy().reshape(nz, ny, nx) == x + 100 * y + 10000 * z).all()


def test_1d_block_over_a_2d_grid(rt: Any, K: Any) -> None:
    n, batch = 1000, 6
    a = np.random.default_rng(9).standard_normal((batch, n)).astype(np.float32)
    out = _poisoned(rt, n * batch, np.float32)
    K.batch_scale((n, batch), _dev(rt, a), out, n)
    assert (out.to_numpy().reshape(batch, n) == a * np.arange(1, batch + 1, dtype=np.float32)[:, None]).all()


@pytest.mark.parametrize("block", [32, 256, 1000, 1024])
def test_a_block_chosen_per_launch(rt: Any, K: Any, block: int) -> None:
    n = 5000
    out, seen = _poisoned(rt, n, np.uint32), _poisoned(rt, 1, np.uint32)
    K.iota_any_block.launch((n + block - 1) // block, block, out, seen)
    assert (out.to_numpy() == np.arange(n)).all() and seen.to_numpy()[0] == block
    K.iota_any_block(n, out, seen)  # the typed call: the default block
    assert seen.to_numpy()[0] == 256


# -- indirect dispatch of bodies that read blockIdx / gridDim ----------------------------------


def _persistent(K: Any, name: str) -> int:
    from khal_runtime.backends.cuda.indirect import persistent_grid

    k = getattr(K, name)
    return int(persistent_grid(k, k.plan(0)))


def _counts(G: int) -> list[int]:
    return [0, 1, 5, G - 1, G, G + 1, 3 * G + 7]


def test_indirect_equals_direct_for_a_body_reading_blockidx(rt: Any, K: Any) -> None:
    G = _persistent(K, "stamp")
    most = 3 * G + 7 + 4  # room for sentinels past the last group
    for c in _counts(G):
        results = []
        for how in ("direct", "indirect"):
            out, seen = _poisoned(rt, most * 64, np.uint32), rt.DeviceBuffer.zeros(most, np.uint32)
            if how == "direct":
                if c:
                    K.stamp.launch(c, None, out, seen)
            else:
                K.stamp.dispatch_indirect(_dev(rt, np.array([c], np.uint32)), out, seen)
            results.append((out.to_numpy(), seen.to_numpy()))
        (d_out, d_seen), (i_out, i_seen) = results
        assert (i_out == d_out).all() and (i_seen == d_seen).all(), f"count {c} (G={G})"
        assert (d_seen[:c] == 1).all() and (d_seen[c:] == 0).all()  # each group once, no extra group
        assert (d_out[c * 64:] == POISON).all() and (d_out[: c * 64] == np.arange(c * 64) * 3 + c).all()


def test_indirect_equals_direct_with_shared_memory(rt: Any, K: Any) -> None:
    G = _persistent(K, "block_sum")
    n = (3 * G + 7) * 128
    a = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    ad = _dev(rt, a)
    for c in _counts(G):
        d, i = _poisoned(rt, 3 * G + 11, np.float32), _poisoned(rt, 3 * G + 11, np.float32)
        if c:
            K.block_sum.launch(c, None, ad, d)
        K.block_sum.dispatch_indirect(_dev(rt, np.array([c], np.uint32)), ad, i)
        assert d.to_numpy().tobytes() == i.to_numpy().tobytes(), f"count {c} (G={G})"
    # threads=True: the count is threads, rounded up to whole groups
    t = _poisoned(rt, 3 * G + 11, np.float32)
    K.block_sum.dispatch_indirect(_dev(rt, np.array([5 * 128 + 1], np.uint32)), ad, t, threads=True)
    np.testing.assert_allclose(t.to_numpy()[:6], a[:768].reshape(6, 128).sum(axis=1), rtol=1e-5)


def test_a_helper_reading_blockidx_has_no_indirect_variant(rt: Any, K: Any) -> None:
    assert K.stamp_helper.entry.indirect_symbol is None
    out = _poisoned(rt, 64 * 9, np.uint32)
    count = _dev(rt, np.array([7], np.uint32))
    with pytest.raises(rt.KhalError, match=r"no indirect .*my_block.*host_read=True"):
        K.stamp_helper.dispatch_indirect(count, out)
    K.stamp_helper.dispatch_indirect(count, out, host_read=True)
    got = out.to_numpy()
    assert (got[: 7 * 64] == np.arange(7 * 64)).all() and (got[7 * 64:] == POISON).all()


# -- one source, two crates --------------------------------------------------------------------


def test_one_source_built_under_two_sets_of_defines(rt: Any, K: Any) -> None:
    n = 3000
    for crate, dtype, which in (("variant_f32", np.float32, 2), ("variant_f64", np.float64, 1)):
        ck = getattr(K, crate)
        x, y = np.arange(n, dtype=dtype), np.ones(n, dtype)
        yd = _dev(rt, y)
        ck.axpy(n, _dev(rt, x), yd, 0.5)
        assert (yd.to_numpy() == dtype(0.5) * x + 1).all()
        w = rt.DeviceBuffer.zeros(1, np.int32)
        ck.path(1, w)
        assert w.to_numpy()[0] == which
    with pytest.raises(AttributeError, match=r"entry 'axpy' exists in crates"):
        K.axpy  # noqa: B018
    with pytest.raises(rt.ArgumentError, match="expected element type float32"):
        K.variant_f32.axpy(n, _dev(rt, np.zeros(n)), _dev(rt, np.zeros(n)), 1.0)
