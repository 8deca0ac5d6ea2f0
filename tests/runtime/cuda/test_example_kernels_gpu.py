"""GPU tests of example-shader-pkg's kernels against their NumPy references.

Every test carries the ``gpu`` marker and skips cleanly where there is no CUDA
device (``_require_gpu``) or no built example package (the ``example_pkg``
session fixture of tests/conftest.py). Outputs are poisoned (NaN or
0xFFFFFFFF) before each launch so a kernel that skips an element fails;
accumulators (sums, histograms, counters) start from a known value instead.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

SIZES = [1, 7, 255, 256, 257, 1000, 4099, 1 << 20, 3_000_001]
POISON_U32 = 0xFFFFFFFF


# --------------------------------------------------------------------- helpers


@pytest.fixture(scope="session", autouse=True)
def _require_gpu():
    """Skip the module unless cuda-bindings finds a CUDA device."""
    driver = pytest.importorskip("cuda.bindings.driver")
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # libcuda not found
        pytest.skip(f"no CUDA driver: {exc}")
    if err != driver.CUresult.CUDA_SUCCESS:
        pytest.skip(f"no CUDA driver: cuInit -> {err.name}")
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        pytest.skip("no CUDA device")


@pytest.fixture(scope="session")
def rt():
    return pytest.importorskip("khal_runtime")


@pytest.fixture(scope="session")
def K(example_pkg):
    return example_pkg.kernels


@pytest.fixture(scope="session")
def R(example_pkg):
    return example_pkg.reference


def _sync(rt) -> None:
    """Wait for the runtime's owned (non-blocking) stream and everything else on the context."""
    rt.default_stream().synchronize()
    from cuda.bindings import driver

    (err,) = driver.cuCtxSynchronize()
    assert err == driver.CUresult.CUDA_SUCCESS, f"cuCtxSynchronize -> {err.name}"


def _dev(rt, a: np.ndarray):
    return rt.DeviceBuffer.from_numpy(np.ascontiguousarray(a))


def _host(rt, buf) -> np.ndarray:
    _sync(rt)
    return buf.to_numpy()


def _scalar(rt, buf):
    return _host(rt, buf).reshape(-1)[0]


@functools.lru_cache(maxsize=None)
def _floats(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + n)
    x = rng.standard_normal(n).astype(np.float32) * np.float32(3)
    x.setflags(write=False)
    return x


@functools.lru_cache(maxsize=None)
def _gelu_refs(example_pkg_reference, n: int):
    x = _floats(n)
    return example_pkg_reference.gelu(x), example_pkg_reference.gelu_tanh(x)


def _thread_counts(n: int, fast: int) -> list[int]:
    """The fast launch, one thread per element, and (small n) a single thread."""
    counts = [fast, n]
    if n <= 4099:
        counts.append(1)
    return sorted(set(counts))


# ------------------------------------------------------------------ core crate


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_saxpy(example_pkg, K, R, rt, n):
    x = _floats(n, 1)
    y = _floats(n, 2)
    params = example_pkg.SaxpyParams(a=1.75)
    expected = R.saxpy(x, y, 1.75)
    for threads in _thread_counts(n, example_pkg.elementwise_threads(n)):
        dx, dy = _dev(rt, x), _dev(rt, y)
        K.saxpy(threads, dx, dy, params)
        got = _host(rt, dy)
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=f"threads={threads}")
        np.testing.assert_array_equal(_host(rt, dx), x)  # x is read-only


@pytest.mark.gpu
@pytest.mark.parametrize("n", [257, 4099, 1 << 20])
def test_saxpy_torch(example_pkg, K, R, rt, n):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    x = torch.from_numpy(_floats(n, 1).copy()).cuda()
    y = torch.from_numpy(_floats(n, 2).copy()).cuda()
    torch.cuda.synchronize()  # our kernel runs on the runtime's stream, not torch's
    K.saxpy(example_pkg.elementwise_threads(n), x, y, example_pkg.SaxpyParams(a=-0.5))
    _sync(rt)
    np.testing.assert_allclose(y.cpu().numpy(), R.saxpy(_floats(n, 1), _floats(n, 2), -0.5), rtol=1e-6, atol=1e-6)

    # Offset slices are not 16-byte aligned: the scalar path must take over.
    x2 = torch.from_numpy(_floats(n + 1, 3).copy()).cuda()
    y2 = torch.from_numpy(_floats(n + 1, 4).copy()).cuda()
    torch.cuda.synchronize()
    K.saxpy(example_pkg.elementwise_threads(n), x2[1:], y2[1:], example_pkg.SaxpyParams(a=2.0))
    _sync(rt)
    expected = _floats(n + 1, 4).copy()
    expected[1:] = R.saxpy(_floats(n + 1, 3)[1:], _floats(n + 1, 4)[1:], 2.0)
    np.testing.assert_allclose(y2.cpu().numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_saxpy_torch_relaunch_sees_every_change_to_a_tensor(example_pkg, K, rt):
    """The typed call reuses what it packed for the same tensors (a memo slot, then a shared
    snapshot) only while each has the version and pointer it had: an in-place resize (also under
    ``no_grad`` and ``inference_mode``), ``.data =``, an inference tensor (no version counter)
    resized or moved, a storage freed under its tensor and an in-place transpose between launches
    all reach the next launch."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    n = 4099
    threads = example_pkg.elementwise_threads(n)
    one = example_pkg.SaxpyParams(a=1.0)
    x = torch.ones(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    whole = y.view(-1)  # another tensor on y's memory, to see past a shrunk y
    torch.cuda.synchronize()  # torch works on its own stream, the runtime on its own
    for _ in range(12):  # past PROMOTE_AFTER: the last launches come from a shared snapshot
        K.saxpy(threads, x, y, one)
    _sync(rt)
    assert torch.equal(y.cpu(), torch.full((n,), 12.0))

    x.mul_(2)  # in place, values only
    torch.cuda.synchronize()
    K.saxpy(threads, x, y, one)
    _sync(rt)
    assert torch.equal(y.cpu(), torch.full((n,), 14.0))

    y.resize_(1000)  # same memory, fewer elements: the kernel must stop at 1000
    for _ in range(12):
        K.saxpy(threads, x, y, one)
    _sync(rt)
    w = whole.cpu()
    assert torch.equal(w[:1000], torch.full((1000,), 38.0)) and torch.equal(w[1000:], torch.full((n - 1000,), 14.0))

    y.data = torch.zeros(n, device="cuda")  # other memory, the version kept
    torch.cuda.synchronize()
    K.saxpy(threads, x, y, one)
    _sync(rt)
    assert torch.equal(y.cpu(), torch.full((n,), 2.0))
    assert torch.equal(whole.cpu()[:1000], torch.full((1000,), 38.0))  # the old memory untouched

    # From here on y's memory is mirrored in NumPy: with a = 1 a launch does y[:m] += x[:m],
    # m = min(len x, len y); a launch that used a stale size or pointer breaks the mirror.
    xs, ws, ws2 = _floats(n, 5), _floats(n, 6), _floats(n + 4096, 7)
    x.copy_(torch.from_numpy(xs.copy()))
    ymem = torch.zeros(n, device="cuda")
    y.data = ymem  # y and ymem share memory: ymem shows all n floats whatever y's size
    ey = np.zeros(n, np.float32)

    def relaunch(xt, xref, count=1):
        torch.cuda.synchronize()
        for _ in range(count):
            K.saxpy(threads, xt, y, one)
        _sync(rt)
        m = min(xt.numel(), y.numel())
        for _ in range(count):
            ey[:m] += xref[:m]
        np.testing.assert_allclose(ymem.cpu().numpy(), ey, rtol=1e-6, atol=1e-6)

    relaunch(x, xs, 12)  # past PROMOTE_AFTER: each change below meets the shared snapshot
    with torch.no_grad():
        y.resize_(2000)  # shrinks in place under no_grad
    relaunch(x, xs)
    with torch.no_grad():
        y.resize_(3000)  # grows back within its memory: same pointer, more elements
    relaunch(x, xs, 12)
    with torch.inference_mode():
        y.resize_(2500)  # a normal tensor resized under inference_mode
    relaunch(x, xs, 12)
    with torch.inference_mode():
        y.resize_(n)
    relaunch(x, xs)

    with torch.inference_mode():
        w = torch.empty(n, device="cuda")  # an inference tensor: no version counter
        w.copy_(torch.from_numpy(ws.copy()))
    assert w.is_inference()
    relaunch(w, ws, 12)
    with torch.inference_mode():
        w.resize_(100)  # same memory, fewer elements
    relaunch(w, ws, 12)
    with torch.inference_mode():
        w.resize_(n + 4096)  # more than its memory holds: moved to new memory
        w.copy_(torch.from_numpy(ws2.copy()))
    relaunch(w, ws2)

    relaunch(x, xs, 12)
    y.untyped_storage().resize_(0)  # y's memory (and ymem's) freed under it: no pointer, n elements
    for _ in range(2):  # twice: a refused launch leaves nothing behind to reuse
        with pytest.raises(rt.ArgumentValueError, match=r"argument 'y'.*with no memory"):
            K.saxpy(threads, x, y, one)
    y.data = torch.zeros(n, device="cuda")

    x.resize_(2, (n - 1) // 2).t_()  # x itself transposed in place: no longer contiguous
    with pytest.raises(rt.ArgumentValueError, match="non-contiguous"):
        K.saxpy(threads, x, y, one)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [257, 4099, 1 << 20])
def test_saxpy_cupy(example_pkg, K, R, rt, n):
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("CuPy sees no device")
    except cp.cuda.runtime.CUDARuntimeError as exc:  # pragma: no cover - no driver
        pytest.skip(f"CuPy: {exc}")
    x = cp.asarray(_floats(n, 1))
    y = cp.asarray(_floats(n, 2))
    cp.cuda.Device().synchronize()
    K.saxpy(example_pkg.elementwise_threads(n), x, y, example_pkg.SaxpyParams(a=3.0))
    _sync(rt)
    np.testing.assert_allclose(cp.asnumpy(y), R.saxpy(_floats(n, 1), _floats(n, 2), 3.0), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kernel", ["gelu", "gelu_tanh"])
def test_gelu(example_pkg, K, R, rt, n, kernel):
    x = _floats(n)
    exact, approx = _gelu_refs(R, n)
    expected = exact if kernel == "gelu" else approx
    for threads in _thread_counts(n, example_pkg.elementwise_threads(n)):
        y = _dev(rt, np.full(n, np.nan, np.float32))
        getattr(K, kernel)(threads, _dev(rt, x), y)
        got = _host(rt, y)
        assert not np.isnan(got).any(), f"threads={threads}: elements left unwritten"
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=f"threads={threads}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_reduce_sum(example_pkg, K, R, rt, n):
    x = _floats(n)
    expected = R.reduce_sum(x)
    tol = R.sum_tolerance(x)
    for threads in _thread_counts(n, example_pkg.reduce_sum_threads(n)):
        out = _dev(rt, np.zeros(1, np.float32))
        K.reduce_sum(threads, _dev(rt, x), out)
        got = float(_scalar(rt, out))
        assert abs(got - expected) <= tol, f"threads={threads}: {got} vs {expected} (tol {tol})"


@pytest.mark.gpu
def test_reduce_sum_accumulates(example_pkg, K, R, rt):
    x = np.ones(10_000, np.float32)
    out = _dev(rt, np.array([5.0], np.float32))
    K.reduce_sum(example_pkg.reduce_sum_threads(x.size), _dev(rt, x), out)
    K.reduce_sum(example_pkg.reduce_sum_threads(x.size), _dev(rt, x), out)
    assert float(_scalar(rt, out)) == 20_005.0


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("shift", [0, 8, 24])
def test_histogram_digits(K, R, rt, n, shift):
    keys = R.make_keys(n, seed=n)
    hist = _dev(rt, np.zeros(R.RADIX_BINS, np.uint32))
    K.histogram_digits(n, _dev(rt, keys), hist, shift)
    got = _host(rt, hist)
    np.testing.assert_array_equal(got, R.histogram_digits(keys, shift))
    assert int(got.sum()) == n


@pytest.mark.gpu
def test_histogram_digits_accumulates(K, R, rt):
    keys = R.make_keys(5000, seed=3)
    start = np.arange(R.RADIX_BINS, dtype=np.uint32)
    hist = _dev(rt, start)
    K.histogram_digits(256, _dev(rt, keys), hist, 16)  # fewer threads than keys
    np.testing.assert_array_equal(_host(rt, hist), R.histogram_digits(keys, 16, start))


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_exclusive_scan(example_pkg, K, R, rt, n):
    rng = np.random.default_rng(n)
    values = rng.integers(0, 2**32, size=n, dtype=np.uint32)  # wraps: uint32 semantics
    out = _dev(rt, np.full(n, POISON_U32, np.uint32))
    total = _dev(rt, np.full(1, POISON_U32, np.uint32))
    K.exclusive_scan(example_pkg.EXCLUSIVE_SCAN_THREADS, _dev(rt, values), out, total)
    expected, expected_total = R.exclusive_scan(values)
    np.testing.assert_array_equal(_host(rt, out), expected)
    assert int(_scalar(rt, total)) == expected_total


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 4099])
def test_exclusive_scan_any_thread_count(K, R, rt, n):
    values = np.arange(n, dtype=np.uint32)
    out = _dev(rt, np.full(n, POISON_U32, np.uint32))
    total = _dev(rt, np.full(1, POISON_U32, np.uint32))
    K.exclusive_scan(n * 1024, _dev(rt, values), out, total)  # extra groups do nothing
    expected, expected_total = R.exclusive_scan(values)
    np.testing.assert_array_equal(_host(rt, out), expected)
    assert int(_scalar(rt, total)) == expected_total


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("shift", [0, 24])
def test_radix_partition(example_pkg, K, R, rt, n, shift):
    """histogram -> scan -> scatter, all on the device."""
    keys = R.make_keys(n, seed=n + shift)
    d_keys = _dev(rt, keys)
    hist = _dev(rt, np.zeros(R.RADIX_BINS, np.uint32))
    offsets = _dev(rt, np.full(R.RADIX_BINS, POISON_U32, np.uint32))
    total = _dev(rt, np.full(1, POISON_U32, np.uint32))
    out = _dev(rt, np.full(n, POISON_U32, np.uint32))
    K.histogram_digits(n, d_keys, hist, shift)
    K.exclusive_scan(example_pkg.EXCLUSIVE_SCAN_THREADS, hist, offsets, total)
    K.scatter_digits(n, d_keys, offsets, out, shift)

    starts, count = R.exclusive_scan(R.histogram_digits(keys, shift))
    assert int(_scalar(rt, total)) == count == n
    expected, ends = R.scatter_digits(keys, starts, shift)
    R.assert_same_buckets(_host(rt, out), expected, shift)
    np.testing.assert_array_equal(_host(rt, offsets), ends)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [257, 4099])
def test_scatter_digits_few_threads(K, R, rt, n):
    keys = R.make_keys(n, seed=7)
    starts, _ = R.exclusive_scan(R.histogram_digits(keys, 8))
    offsets = _dev(rt, starts)
    out = _dev(rt, np.full(n, POISON_U32, np.uint32))
    K.scatter_digits(64, _dev(rt, keys), offsets, out, 8)
    expected, ends = R.scatter_digits(keys, starts, 8)
    R.assert_same_buckets(_host(rt, out), expected, 8)
    np.testing.assert_array_equal(_host(rt, offsets), ends)


# ------------------------------------------------------------- particles crate


def _sim(example_pkg, n: int):
    return example_pkg.SimParams(dt=0.016, gravity=-9.81, restitution=0.6, n=n)


def _live_counts(n: int) -> list[int]:
    return sorted({n, max(0, n - 3)})


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_integrate(example_pkg, K, R, rt, n):
    particles = R.make_particles(n, seed=n)
    for live in _live_counts(n):
        params = _sim(example_pkg, live)
        buf = _dev(rt, particles)
        K.integrate(n, buf, params)
        got = _host(rt, buf)
        # Written without FMA contraction: bit-exact against float32 NumPy.
        assert got.tobytes() == R.integrate(particles, params).tobytes(), f"params.n={live}"


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_collide_ground(example_pkg, K, R, rt, n):
    particles = R.make_particles(n, seed=n + 1)
    for live in _live_counts(n):
        params = _sim(example_pkg, live)
        buf = _dev(rt, particles)
        K.collide_ground(n, buf, params)
        got = _host(rt, buf)
        expected = R.collide_ground(particles, params)
        assert got.tobytes() == expected.tobytes(), f"params.n={live}"
        alive = expected["life"][:live] > 0
        assert (got["py"][:live][alive] >= 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_count_active(example_pkg, K, R, rt, n):
    particles = R.make_particles(n, seed=n + 2)
    for live in _live_counts(n):
        params = _sim(example_pkg, live)
        count = _dev(rt, np.zeros(1, np.uint32))
        K.count_active(n, _dev(rt, particles), params, count)
        assert int(_scalar(rt, count)) == R.count_active(particles, params), f"params.n={live}"


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_compact_alive(example_pkg, K, R, rt, n):
    particles = R.make_particles(n, seed=n + 3)
    for live in _live_counts(n):
        params = _sim(example_pkg, live)
        indices = _dev(rt, np.full(n, POISON_U32, np.uint32))
        count = _dev(rt, np.zeros(1, np.uint32))
        K.compact_alive(n, _dev(rt, particles), params, indices, count)
        expected = R.compact_alive(particles, params)
        k = int(_scalar(rt, count))
        got = _host(rt, indices)
        assert k == expected.size, f"params.n={live}"
        np.testing.assert_array_equal(np.sort(got[:k]), expected)
        assert (got[k:] == POISON_U32).all(), "wrote past the alive count"


@pytest.mark.gpu
def test_compact_alive_short_output(example_pkg, K, R, rt):
    """A too-short index list keeps the full count and drops the surplus."""
    n = 4099
    particles = R.make_particles(n, seed=11)
    params = _sim(example_pkg, n)
    expected = R.compact_alive(particles, params)
    cap = expected.size // 2
    indices = _dev(rt, np.full(cap, POISON_U32, np.uint32))
    count = _dev(rt, np.zeros(1, np.uint32))
    K.compact_alive(n, _dev(rt, particles), params, indices, count)
    assert int(_scalar(rt, count)) == expected.size
    got = _host(rt, indices)
    assert np.isin(got, expected).all() and np.unique(got).size == cap


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_kinetic_energy(example_pkg, K, R, rt, n):
    particles = R.make_particles(n, seed=n + 4)
    params = _sim(example_pkg, n)
    alive = R.compact_alive(particles, params)
    energy = _dev(rt, np.zeros(1, np.float32))
    # The count lives on the device; launch more threads than it to check the bound.
    K.kinetic_energy(n, _dev(rt, particles), _dev(rt, alive), _dev(rt, np.array([alive.size], np.uint32)), energy)
    expected = R.kinetic_energy(particles, alive)
    got = float(_scalar(rt, energy))
    assert abs(got - expected) <= 1e-5 * expected + 1e-6, (got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1000, 1 << 20])
def test_particle_step(example_pkg, K, R, rt, n):
    """integrate -> collide_ground -> compact_alive -> kinetic_energy over a few steps."""
    particles = R.make_particles(n, seed=n + 5)
    params = _sim(example_pkg, n)
    buf = _dev(rt, particles)
    expected = particles
    for _ in range(3):
        K.integrate(n, buf, params)
        K.collide_ground(n, buf, params)
        expected = R.collide_ground(R.integrate(expected, params), params)
    indices = _dev(rt, np.full(n, POISON_U32, np.uint32))
    count = _dev(rt, np.zeros(1, np.uint32))
    energy = _dev(rt, np.zeros(1, np.float32))
    K.compact_alive(n, buf, params, indices, count)
    K.kinetic_energy(n, buf, indices, count, energy)

    assert _host(rt, buf).tobytes() == expected.tobytes()
    alive = R.compact_alive(expected, params)
    assert int(_scalar(rt, count)) == alive.size
    e = R.kinetic_energy(expected, alive)
    assert abs(float(_scalar(rt, energy)) - e) <= 1e-5 * e + 1e-6
