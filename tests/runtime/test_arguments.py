"""Argument checking and packing, on CPU: a fake driver records what cuLaunchKernel gets."""

from __future__ import annotations

import ctypes
import struct
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from khal_runtime.abi import bf16_bits
from khal_runtime.arguments import diagnose_args
from khal_runtime.backends.cuda import driver as cuda_driver
from khal_runtime.backends.cuda.launch import LaunchPlan
from khal_runtime.backends.cuda.loader import expected_param_layout
from khal_runtime.backends.cuda.uniform_cache import Upload
from khal_runtime.errors import ArgumentError, ArgumentValueError
from tests.helpers.synthetic import CRATE, build_package
from tests.helpers.fakecuda import FakeDriver, fake, ptx_param_layouts  # noqa: F401  (fixture)

pytestmark = pytest.mark.needs_nvrtc


class FakeDeviceArray:
    """A device array seen only through __cuda_array_interface__ (v3)."""

    def __init__(self, n: int, typestr: str = "<f4", ptr: int = 0x7000_0000, strides: Any = None,
                 shape: Any = None) -> None:
        self._cai = {"version": 3, "shape": shape or (n,), "typestr": typestr, "data": (ptr, False),
                     "strides": strides, "stream": None}

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._cai


class FakeDLPack:
    def __init__(self, device_type: int) -> None:
        self.device_type = device_type

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, 0)

    def __dlpack__(self, stream: Any = None) -> Any:  # pragma: no cover - host is rejected first
        raise AssertionError("not reached")


class FakeUniforms:
    """Stands in for the CUDA backend's UniformCache: uploads are pointers in a fake range."""

    def __init__(self) -> None:
        self.entries: dict[bytes, Upload] = {}
        self.uploads = 0

    def fetch(self, data: bytes, stream: Any) -> int:
        e = self.entries.get(data)
        if e is None:
            self.uploads += 1
            e = Upload(0xD000_0000 + 256 * self.uploads, None, 0, None)
            self.entries[bytes(data)] = e
        return int(e.ptr)


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory):
    return build_package(tmp_path_factory.mktemp("args"), "synth_args_pkg")


STREAM = SimpleNamespace(native="STREAM", handle=7, device_id=0)


def _plan(pkg, fake: FakeDriver, name: str) -> tuple[LaunchPlan, FakeUniforms]:
    entry = pkg.manifest.crate(CRATE).entry(name)
    uni = FakeUniforms()
    plan = LaunchPlan(entry, CRATE, 0, f"FUNC:{name}", uni)  # type: ignore[arg-type]
    fake.layout = _binary_layout(pkg, entry.symbol)
    return plan, uni


def _binary_layout(pkg: Any, symbol: str) -> list[tuple[str, int, int]]:
    """The kernel's parameter layout as NVRTC compiled it (the package's PTX ``.param`` lines),
    never the runtime's own: a scalar packed at the wrong width shows in the slots."""
    layout = ptx_param_layouts(pkg.artifact_file("ptx").read_bytes())[symbol]
    assert [(o, n) for _, o, n in layout] == [(o, n) for _, o, n in expected_param_layout(
        pkg.manifest.crate(CRATE).entry(symbol.split("_khal_")[0]))], "the runtime disagrees with NVRTC"
    return layout


class AxpbyParams(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


def test_axpby_packs_pointer_count_uniform_and_float32(pkg, fake: FakeDriver) -> None:
    plan, uni = _plan(pkg, fake, "axpby")
    x = FakeDeviceArray(100, ptr=0x1000)
    y = FakeDeviceArray(90, ptr=0x2000)
    plan.run(1, 1, 1, 256, 1, 1, 0, STREAM, (x, y, AxpbyParams(2.0, 3.0), 0.1))
    (l,) = fake.launches
    assert l["f"] == "FUNC:axpby" and l["stream"] == "STREAM" and l["grid"] == (1, 1, 1)
    s = l["slots"]
    assert struct.unpack("<Q", s[0])[0] == 0x1000 and struct.unpack("<Q", s[1])[0] == 100
    assert struct.unpack("<Q", s[2])[0] == 0x2000 and struct.unpack("<Q", s[3])[0] == 90
    uptr = struct.unpack("<Q", s[4])[0]
    assert uni.entries[bytes(AxpbyParams(2.0, 3.0))].ptr == uptr
    assert len(s[5]) == 4 and struct.unpack("<f", s[5])[0] == pytest.approx(0.1, rel=1e-7)
    # same struct bytes again (as bytes, as numpy) -> the cached pointer, no new upload
    rec = np.array((2.0, 3.0), dtype=[("a", "<f4"), ("b", "<f4")])
    plan.run(1, 1, 1, 256, 1, 1, 0, STREAM, (x, y, bytes(AxpbyParams(2.0, 3.0)), 0.1))
    plan.run(1, 1, 1, 256, 1, 1, 0, STREAM, (x, y, rec[()], 0.1))
    plan.run(1, 1, 1, 256, 1, 1, 0, STREAM, (x, y, rec, 0.1))
    assert uni.uploads == 1
    assert {struct.unpack("<Q", l["slots"][4])[0] for l in fake.launches} == {uptr}


def test_uniform_already_on_device(pkg, fake: FakeDriver) -> None:
    plan, uni = _plan(pkg, fake, "axpby")
    x = FakeDeviceArray(4)
    dev_struct = FakeDeviceArray(2, "<f4", ptr=0xBEEF00)
    plan.run(1, 1, 1, 256, 1, 1, 0, STREAM, (x, x, dev_struct, 1.0))
    assert struct.unpack("<Q", fake.launches[0]["slots"][4])[0] == 0xBEEF00
    assert uni.uploads == 0
    with pytest.raises(ArgumentValueError, match="holds 4 bytes, the struct needs 8"):
        plan.run(1, 1, 1, 256, 1, 1, 0, STREAM, (x, x, FakeDeviceArray(1), 1.0))


def test_scalars_packed_at_exact_width(pkg, fake: FakeDriver) -> None:
    plan, _ = _plan(pkg, fake, "scalars")
    out = FakeDeviceArray(8, "<u8", ptr=0x3000)
    plan.run(1, 1, 1, 32, 1, 1, 0, STREAM, (out, -5, 1.5, -(2**40), 0.1, 65535, True, 0.1, 1.5))
    s = fake.launches[0]["slots"]
    assert [len(x) for x in s] == [8, 8, 1, 2, 8, 4, 2, 1, 8, 2]
    assert struct.unpack("<b", s[2])[0] == -5
    assert s[3] == np.float16(1.5).tobytes()
    assert struct.unpack("<q", s[4])[0] == -(2**40)
    assert s[5] == np.float32(0.1).tobytes()  # a float32 slot gets 4 bytes, not a double
    assert struct.unpack("<H", s[6])[0] == 65535
    assert s[7] == b"\x01"
    assert s[8] == np.float64(0.1).tobytes()
    assert struct.unpack("<H", s[9])[0] == 0x3FC0  # bfloat16(1.5)
    # numpy scalars are fine too
    plan.run(1, 1, 1, 32, 1, 1, 0, STREAM, (out, np.int8(3), np.float16(2), np.int64(7), np.float32(1),
                                            np.uint16(9), np.bool_(False), np.float64(2), 2.0))
    assert struct.unpack("<b", fake.launches[1]["slots"][2])[0] == 3


ARGS_OK = lambda: (FakeDeviceArray(10), FakeDeviceArray(10), AxpbyParams(1, 2), 0.5)  # noqa: E731


@pytest.mark.parametrize(
    "mutate, exc, pattern",
    [
        (lambda a: a[:3], ArgumentError, r"axpby\(\) takes 4 argument\(s\) \(x, y, p, bias\).*got 3"),
        (lambda a: (FakeDeviceArray(10, "<f8"),) + a[1:], ArgumentError, r"'x' .*expected element type float32.*got float64"),
        (lambda a: (a[0], FakeDeviceArray(10, "<i4")) + a[2:], ArgumentError, r"'y' .*got int32"),
        (lambda a: (np.zeros(10, np.float32),) + a[1:], ArgumentError, r"'x' .*is host memory"),
        (lambda a: (a[0], [1.0, 2.0]) + a[2:], ArgumentError, r"'y' .*is host memory"),
        (lambda a: (object(),) + a[1:], ArgumentError, r"'x' .*expected a device array"),
        (lambda a: (FakeDLPack(1),) + a[1:], ArgumentError, r"'x' .*is host memory \(DLPack CPU\)"),
        (lambda a: (FakeDeviceArray(10, strides=(8,)),) + a[1:], ArgumentValueError, r"'x' .*not C-contiguous"),
        (lambda a: a[:2] + (b"\x00" * 12, a[3]), ArgumentValueError, r"'p' \(uniform AxpbyParams \(8 bytes\)\).*expected 8 bytes, got 12"),
        (lambda a: a[:2] + (3.0, a[3]), ArgumentError, r"'p' .*expected a uniform struct"),
        (lambda a: a[:3] + ("x",), ArgumentError, r"'bias' \(scalar float32\).*expected a number"),
        (lambda a: a[:3] + (1e300,), ArgumentValueError, r"'bias' .*cannot pass"),
    ],
)
def test_bad_arguments_are_named_and_nothing_launches(pkg, fake: FakeDriver, mutate, exc, pattern) -> None:
    plan, _ = _plan(pkg, fake, "axpby")
    args = mutate(ARGS_OK())
    with pytest.raises(exc, match=pattern):
        plan.run(1, 1, 1, 256, 1, 1, 0, STREAM, args)
    with pytest.raises(exc, match=pattern):
        diagnose_args(plan.entry, args)
    assert fake.launches == []
    assert issubclass(ArgumentError, TypeError) and issubclass(ArgumentValueError, ValueError)


@pytest.mark.parametrize(
    "index, value, exc, pattern",
    [
        (1, 1.5, ArgumentError, r"'a' \(scalar int8\): expected an integer, got float"),
        (1, 200, ArgumentValueError, r"'a' .*cannot pass 200"),
        (5, -1, ArgumentValueError, r"'e' \(scalar uint16\)"),
        (3, 2**70, ArgumentValueError, r"'c' \(scalar int64\)"),
    ],
)
def test_bad_scalars(pkg, fake: FakeDriver, index: int, value: Any, exc: type, pattern: str) -> None:
    plan, _ = _plan(pkg, fake, "scalars")
    args = [FakeDeviceArray(8, "<u8"), 1, 1.0, 1, 1.0, 1, True, 1.0, 1.0]
    args[index] = value
    with pytest.raises(exc, match=pattern):
        plan.run(1, 1, 1, 32, 1, 1, 0, STREAM, tuple(args))
    assert fake.launches == []


def test_fixed_array_needs_its_length(pkg, fake: FakeDriver) -> None:
    plan, _ = _plan(pkg, fake, "scalars")
    args = (FakeDeviceArray(7, "<u8"), 1, 1.0, 1, 1.0, 1, True, 1.0, 1.0)
    with pytest.raises(ArgumentValueError, match=r"'out' \(storage uint64\[8\]\): needs 8 elements, got 7"):
        plan.run(1, 1, 1, 32, 1, 1, 0, STREAM, args)


def test_threads_pack_into_their_own_buffers(pkg, fake: FakeDriver) -> None:
    plan, _ = _plan(pkg, fake, "fill")
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            arr = FakeDeviceArray(10 + t, "<u4", ptr=0x10000 * (t + 1))
            for i in range(300):
                plan.run(1, 1, 1, 128, 1, 1, 0, STREAM, (arr, t * 1000 + i))
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(fake.launches) == 1800
    for l in fake.launches:
        ptr, count = struct.unpack("<QQ", l["slots"][0] + l["slots"][1])
        value = struct.unpack("<I", l["slots"][2])[0]
        t = ptr // 0x10000 - 1
        assert count == 10 + t and value // 1000 == t


def test_kernel_check_args_without_gpu(pkg) -> None:
    import khal_runtime

    ks = khal_runtime.load(pkg.package_dir)
    ks.fill.check_args(FakeDeviceArray(4, "<u4"), 3)
    with pytest.raises(ArgumentError, match=r"fill\(\): argument 'out' \(storage uint32\)"):
        ks.fill.check_args(FakeDeviceArray(4, "<f4"), 3)


@settings(max_examples=200, deadline=None)
@given(st.floats(width=32, allow_nan=False))
def test_bf16_rounding_matches_truncated_float32(v: float) -> None:
    bits = bf16_bits(v)
    f32 = struct.unpack("<I", struct.pack("<f", v))[0]
    # round-to-nearest-even of the top 16 bits: within one ulp of truncation
    assert bits in ((f32 >> 16) & 0xFFFF, ((f32 >> 16) + 1) & 0xFFFF)
    back = struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    if abs(v) < 3e38:
        assert abs(back - v) <= abs(v) * 2 ** -8 + 1e-38


@settings(max_examples=100, deadline=None)
@given(st.integers(-128, 127), st.integers(0, 2**16 - 1), st.integers(-(2**63), 2**63 - 1))
def test_integer_scalars_roundtrip(a: int, e: int, c: int) -> None:
    drv = FakeDriver()
    old = cuda_driver._driver
    cuda_driver._driver = drv  # type: ignore[assignment]
    try:
        pkg = _PKG[0]
        entry = pkg.manifest.crate(CRATE).entry("scalars")
        plan = LaunchPlan(entry, CRATE, 0, "F", FakeUniforms())  # type: ignore[arg-type]
        drv.layout = _binary_layout(pkg, entry.symbol)
        plan.run(1, 1, 1, 32, 1, 1, 0, STREAM, (FakeDeviceArray(8, "<u8"), a, 0.0, c, 0.0, e, False, 0.0, 0.0))
    finally:
        cuda_driver._driver = old  # type: ignore[assignment]
    s = drv.launches[0]["slots"]
    assert struct.unpack("<b", s[2])[0] == a
    assert struct.unpack("<q", s[4])[0] == c
    assert struct.unpack("<H", s[6])[0] == e


_PKG: list[Any] = []


@pytest.fixture(autouse=True, scope="module")
def _remember(pkg) -> None:
    _PKG.append(pkg)


@pytest.mark.parametrize("grid", [(), []])
def test_an_empty_grid_is_refused_not_taken_for_one_block(grid: Any) -> None:
    """``dim3(())`` padded the empty sequence to (1, 1, 1): ``k[()]`` of a Triton family, or a
    launch given ``grid=()``, ran one program where the caller had computed none."""
    from khal_runtime.arguments import dim3
    from khal_runtime.errors import ArgumentValueError

    with pytest.raises(ArgumentValueError, match=r"grid: expected 1 to 3 dimensions, got \(\)|got \[\]"):
        dim3(grid)
    assert dim3((2,)) == (2, 1, 1) and dim3([2, 3]) == (2, 3, 1)
