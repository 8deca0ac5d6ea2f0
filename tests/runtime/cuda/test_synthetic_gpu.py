"""khal_runtime on a real GPU, with a synthetic NVRTC-built shader package."""

from __future__ import annotations

import ctypes
import hashlib
import threading
from pathlib import Path

import numpy as np
import pytest

import khal_runtime
from khal_runtime import DeviceBuffer, Device, LaunchConfig, Stream
from khal_runtime.errors import (
    ArgumentError,
    HashMismatchError,
    NoCompatibleBinaryError,
    PtxTooNewError,
)
from khal_runtime.backends.cuda.loader import ptx_isa_supported
from tests.helpers.gpu import require_gpu
from tests.helpers.synthetic import CRATE, build_package

pytestmark = pytest.mark.gpu


class AxpbyParams(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory):
    require_gpu()
    return build_package(tmp_path_factory.mktemp("gpu"), "synth_gpu_pkg")


@pytest.fixture(scope="module")
def ks(pkg):
    return khal_runtime.load(pkg.package_dir)


def test_device_info() -> None:
    require_gpu()
    d = Device(0)
    assert d.compute_capability() >= (7, 5)
    assert d.name and d.sm_count > 0
    assert khal_runtime.driver_version() >= (12, 0)
    s = d.default_stream
    assert s.handle != 0
    from cuda.bindings import driver

    err, flags = driver.cuStreamGetFlags(s.native)
    assert not err and int(flags) & int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
    print(f"\nDEVICE {d.name} cc={d.compute_capability()} sms={d.sm_count} driver={khal_runtime.driver_version()}")


def test_fill_typed_call_and_roundtrip(ks) -> None:
    buf = DeviceBuffer.alloc(1000, np.uint32)
    ks.fill(1000, buf, 7)
    assert (buf.to_numpy() == 7).all()
    ks.fill(10, buf[100:110], 9)  # slice: offset pointer and its own count
    out = buf.to_numpy()
    assert (out[100:110] == 9).all() and (out[:100] == 7).all() and (out[110:] == 7).all()
    a = np.arange(50, dtype=np.uint32)
    b = DeviceBuffer.from_numpy(a)
    assert (b.to_numpy() == a).all()
    b.copy_from_numpy(a * 2)
    assert (b[5:8].to_numpy() == a[5:8] * 2).all()
    b.free()
    with pytest.raises(khal_runtime.ArgumentValueError, match="freed"):
        ks.fill(4, b, 1)


def test_axpby_uniform_forms_and_cache(ks) -> None:
    from khal_runtime.backends.cuda.uniform_cache import cache_for

    n = 4096
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    y = np.random.default_rng(1).random(n, dtype=np.float32)
    dx = DeviceBuffer.from_numpy(x)
    rec = np.array((0.5, 0.25), dtype=[("a", "<f4"), ("b", "<f4")])
    for p in (AxpbyParams(2.0, 3.0), bytes(AxpbyParams(2.0, 3.0)), rec, DeviceBuffer.from_numpy(
            np.array([2.0, 3.0], np.float32))):
        a, b = (0.5, 0.25) if p is rec else (2.0, 3.0)
        dy = DeviceBuffer.from_numpy(y)
        ks.axpby(n, dx, dy, p, 0.125)
        np.testing.assert_allclose(dy.to_numpy(), a * x + b * y + np.float32(0.125), rtol=1e-6)
    cache = cache_for(0)
    before = cache.uploads
    dy = DeviceBuffer.from_numpy(y)
    for _ in range(10):
        ks.axpby(n, dx, dy, AxpbyParams(2.0, 3.0), 0.0)
    assert cache.uploads == before  # same bytes: cached device pointer, no upload


def test_scalars_exact_bits(ks) -> None:
    out = DeviceBuffer.alloc(8, np.uint64)
    ks.scalars(1, out, -5, 1.5, -(2**40), 0.1, 65535, True, 0.1, 1.5)
    got = out.to_numpy()
    assert got[0] == np.uint64(2**64 - 5)
    assert got[1] == np.float16(1.5).view(np.uint16)
    assert got[2] == np.uint64(2**64 - 2**40)
    assert got[3] == np.float32(0.1).view(np.uint32)
    assert got[4] == 65535 and got[5] == 1
    assert got[6] == np.float64(0.1).view(np.uint64)
    assert got[7] == 0x3FC0


def test_launch_forms(ks) -> None:
    buf = DeviceBuffer.alloc(512, np.uint32)
    s = Stream.create()
    khal_runtime.launch(s, LaunchConfig(grid=2, block=128), ks.fill, buf, 3)
    ks.fill.launch((2, 1, 1), None, buf[256:], 4, stream=s)
    s.synchronize()
    out = buf.to_numpy(stream=s)
    assert (out[:256] == 3).all() and (out[256:] == 4).all()
    s.close()


def test_bad_args_raise_before_launch(ks) -> None:
    with pytest.raises(ArgumentError, match=r"fill\(\): argument 'out'"):
        ks.fill(10, DeviceBuffer.alloc(10, np.float32), 1)
    with pytest.raises(ArgumentError, match="host memory"):
        ks.fill(10, np.zeros(10, np.uint32), 1)


def test_torch_inputs(ks) -> None:
    torch = pytest.importorskip("torch")
    x = torch.rand(1000, device="cuda")
    y = torch.rand(1000, device="cuda")
    expect = 2 * x + 3 * y + 1
    ks.axpby(1000, x, y, AxpbyParams(2, 3), 1.0, stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    assert torch.allclose(y, expect)
    with pytest.raises(ArgumentError, match="host tensor"):
        ks.axpby(10, x.cpu(), y, AxpbyParams(2, 3), 1.0)
    with pytest.raises(khal_runtime.ArgumentValueError, match="non-contiguous"):
        ks.axpby(10, x[::2], y, AxpbyParams(2, 3), 1.0)
    with pytest.raises(ArgumentError, match="float64"):
        ks.axpby(10, x.double(), y, AxpbyParams(2, 3), 1.0)


def test_cupy_inputs(ks) -> None:
    cp = pytest.importorskip("cupy")
    o = cp.zeros(300, dtype=cp.uint32)
    ks.fill(300, o, 11, stream=cp.cuda.get_current_stream())
    cp.cuda.get_current_stream().synchronize()
    assert int((o == 11).sum()) == 300
    x = cp.ones(64, dtype=cp.float32)
    y = cp.ones(64, dtype=cp.float32)
    ks.axpby(64, x, y, AxpbyParams(1, 1), 0.5)
    Device(0).default_stream.synchronize()
    assert float(y.sum()) == 64 * 2.5


def test_stale_cubin_rejected(tmp_path: Path) -> None:
    require_gpu()
    pkg = build_package(tmp_path, "synth_stale_pkg", ptx_archs=())
    other = build_package(tmp_path / "o", "synth_stale_other", build_id="v2", ptx_archs=())
    data = other.artifact_file("cubin").read_bytes()
    pkg.artifact_file("cubin").write_bytes(data)
    crate = pkg.manifest.crate(CRATE)
    arts = tuple(a.model_copy(update={"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
                 for a in crate.artifacts)
    pkg.write_manifest(pkg.manifest.model_copy(update={"crates": (crate.model_copy(update={"artifacts": arts}),)}))
    ks = khal_runtime.load(pkg.package_dir)
    with pytest.raises(HashMismatchError, match="expects hash"):
        ks.fill(4, DeviceBuffer.alloc(4, np.uint32), 1)


def test_stale_slang_cubin_rejected(tmp_path: Path, example_wheel: Path) -> None:
    """A Slang crate's cubin from before its source was edited (the example wheel's cubins beside
    a manifest with the edited crate's hashes: tests/helpers/slang.py::stale_slang_package): refused
    with HashMismatchError before it is loaded, as a CUDA C++ crate's is."""
    require_gpu()
    from tests.helpers.slang import stale_slang_package

    ks = khal_runtime.load(stale_slang_package(example_wheel, tmp_path))
    first = ks.manifest.crate("slang").entries[0]
    y, x = DeviceBuffer.from_numpy(np.zeros(16, np.float32)), DeviceBuffer.from_numpy(np.ones(16, np.float32))
    with pytest.raises(HashMismatchError, match=f"entry '{first.name}'.*expects hash {first.hash}"):
        ks.saxpy_shared(16, y, x, 1.0)


def test_ptx_path(tmp_path: Path) -> None:
    require_gpu()
    cc = Device(0).compute_capability()
    pkg = build_package(tmp_path, "synth_ptx_pkg", cubin_archs=(), ptx_archs=("compute_75",))
    isa = pkg.manifest.crate(CRATE).artifact("ptx").ptx_isa
    ks = khal_runtime.load(pkg.package_dir)
    buf = DeviceBuffer.alloc(100, np.uint32)
    print(f"\nPTX ISA {isa} on driver {khal_runtime.driver_version()}")
    if ptx_isa_supported(isa, khal_runtime.driver_version()):
        ks.fill(100, buf, 5)
        assert (buf.to_numpy() == 5).all()
    else:
        with pytest.raises(PtxTooNewError, match=f"sm_{cc[0]}{cc[1]}"):
            ks.fill(100, buf, 5)


def test_wrong_arch_cubin_only(tmp_path: Path) -> None:
    require_gpu()
    cc = Device(0).compute_capability()
    other = "sm_80" if cc[0] != 8 else "sm_90"
    pkg = build_package(tmp_path, "synth_arch_pkg", cubin_archs=(other,), ptx_archs=())
    ks = khal_runtime.load(pkg.package_dir)
    with pytest.raises(NoCompatibleBinaryError, match=f"cubin {other}"):
        ks.fill(4, DeviceBuffer.alloc(4, np.uint32), 1)


def test_concurrent_threads_own_streams(ks) -> None:
    n_threads, iters, n = 6, 200, 4096
    bufs = [DeviceBuffer.alloc(n, np.uint32) for _ in range(n_threads)]
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            s = Stream.create()
            for i in range(iters):
                ks.fill(n, bufs[t], t * 10000 + i, stream=s)
            s.synchronize()
            s.close()
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t, b in enumerate(bufs):
        assert (b.to_numpy() == t * 10000 + iters - 1).all()


def test_repeated_launches_take_the_prepacked_path_and_compute_right(ks) -> None:
    """A launch repeated with the same arguments is launched from a shared snapshot (its packed
    block and launch config reused): on the GPU it must compute exactly what fresh launches do.
    (The cost of that path is measured by ``benchmarks/run.py --only launch``, not here.)"""
    from khal_runtime.backends.cuda.launchgen import PROMOTE_AFTER

    n = 1 << 16
    x = np.random.default_rng(5).random(n, dtype=np.float32)
    y0 = np.random.default_rng(6).random(n, dtype=np.float32)
    dx, dy = DeviceBuffer.from_numpy(x), DeviceBuffer.from_numpy(y0)
    p = AxpbyParams(1, 1)
    reps = PROMOTE_AFTER + 10
    for _ in range(reps):
        ks.axpby(n, dx, dy, p, 0.0)  # y = x + y
    plan = ks.axpby.plan(0)
    assert plan._shared[0].a0 is dx  # promoted to a shared snapshot
    want = y0.copy()
    for _ in range(reps):
        want = (x + want).astype(np.float32)
    np.testing.assert_array_equal(dy.to_numpy(), want)
