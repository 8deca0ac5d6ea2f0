"""Hardening, round four (issue #38), the run-time items: numbers and devices that launched wrong
work, empty launches refused, and what a memo or a shared buffer let through.

CPU only: the fake driver (tests/helpers/fakecuda.py) records what would be launched; Triton
families are made of manifest entries as a build writes them (no Triton).
"""

from __future__ import annotations

import enum
import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import khal_runtime
from khal_runtime import abi
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.dtypes import dtype_info
from khal_runtime.errors import ArgumentError, ArgumentValueError, TritonAssumptionError
from khal_runtime.manifest import Entry, Param, TritonFacts, TritonScratch
from tests.helpers.fakecuda import CONTENT, FakeDriver, fake, fake_kernels, make_entry, storage  # noqa: F401

_names = itertools.count()
_U64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
_SCALARS = {"i32": ("int32", 4), "i64": ("int64", 8), "fp32": ("float32", 4), "i1": ("bool", 1)}


def triton_entry(name: str, family: str, names: tuple[str, ...], types: tuple[str, ...], *,
                 divisible: tuple[str, ...] = (), ones: tuple[str, ...] = (), scratch: int = 0,
                 constexprs: dict[str, Any] | None = None) -> Entry:
    """A Triton entry hashed as a build hashes it: ``names`` / ``types`` its runtime arguments,
    ``divisible`` / ``ones`` what it assumes (an argument assumed 1 is not its parameter),
    ``scratch``: bytes of global scratch memory per program."""
    facts = TritonFacts(kernel=f"{family}_kernel", family=family, base=not (divisible or ones), num_warps=4,
                        num_stages=3, shared=0, names=names, types=types, divisible=divisible, ones=ones,
                        constexprs=constexprs if constexprs is not None else {"BLOCK": 256}, cache_key="ck",
                        triton_version="3.6.0",
                        global_scratch=TritonScratch(size=scratch, align=16) if scratch else None)
    params = []
    for n, t in zip(names, types):
        if n in ones:
            continue
        if t.startswith("*"):
            params.append(Param(name=n, **_U64))
        else:
            et, size = _SCALARS[t]
            params.append(Param(name=n, kind="scalar", element_type=et, element_size=size, element_align=size))
    params += [Param(name="khal_global_scratch", **_U64), Param(name="khal_profile_scratch", **_U64)]
    sig = abi.entry_signature(name, (128, 1, 1), tuple(params), grid_dims=3, attributes=None, triton=facts.record())
    h = abi.entry_hash(CONTENT, sig)
    return Entry(name=name, symbol=abi.symbol_for(name, h), hash=h, block_size=(128, 1, 1), params=tuple(params),
                 grid_dims=3, triton=facts)


def triton_kernels(drv: FakeDriver, tmp_path: Path, entries: list[Entry]) -> Any:
    """A Triton crate ``c`` of ``entries`` on the fake driver, under a package name no other test used."""
    name = f"khal_h4rt{next(_names)}_{os.getpid()}"
    return fake_kernels(drv, tmp_path, entries, package=name, language="triton")


def _add(drv: FakeDriver, tmp_path: Path, pointee: str = "fp32", twin: bool = True) -> Any:
    """``add(x: *<pointee>, out: *<pointee>, n: i32)``, built as ``add`` (x, out aligned, n divisible
    by 16) and, with ``twin``, its conservative twin."""
    names, types = ("x", "out", "n"), (f"*{pointee}", f"*{pointee}", "i32")
    entries = [triton_entry("add", "add", names, types, divisible=names)]
    if twin:
        entries.append(triton_entry("add__base", "add", names, types))
    return triton_kernels(drv, tmp_path, entries).add


def _buf(ptr: int, dtype: str = "float32", device: int = 0, n: int = 1024) -> DeviceBuffer:
    return DeviceBuffer(ptr, n, dtype, device)


class _Cai:
    """A device array known only by its ``__cuda_array_interface__`` (and a ``dtype``, if given)."""

    def __init__(self, ptr: int, typestr: str, dtype: Any = None) -> None:
        self.__cuda_array_interface__ = {"shape": (1024,), "typestr": typestr, "data": (ptr, False), "version": 3}
        if dtype is not None:
            self.dtype = dtype


def _paths(k: Any, *args: Any) -> list[Any]:
    """Every way a Triton family launches ``args`` (each twice: the second time the generated call)."""
    return [lambda: k[4](*args), lambda: k[(4,)](*args), lambda: k.launch(4, *args),
            lambda: k[lambda meta: (4,)](*args), lambda: k.bind(*args)(4)]


# -- (1) fp8 pointers check the dtype as every other pointer does ------------------------------
class _Dt:
    """A dtype object as torch and NumPy (ml_dtypes) print theirs."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Dt) and other.name == self.name


@pytest.mark.parametrize("pointee,ok,wrong", [
    ("fp8e4nv", ["torch.float8_e4m3fn", "float8_e4m3fn"], ["float32", "int32", "float64", "float8_e5m2", "uint8"]),
    ("fp8e5", ["torch.float8_e5m2", "float8_e5m2"], ["float32", "int32", "float64", "float8_e4m3fn", "int8"]),
])
def test_an_fp8_pointer_checks_the_dtype_on_every_path(fake: FakeDriver, tmp_path: Path, pointee: str, ok: list[str],
                                                       wrong: list[str]) -> None:
    add = _add(fake, tmp_path, pointee)
    for dt in wrong:
        bad = _Cai(0x10000, "|u1", _Dt(dt))
        for launch in _paths(add, bad, _Cai(0x20000, "|u1", _Dt(ok[0])), 1024):
            for _ in range(2):
                with pytest.raises(ArgumentError, match=rf"add\(\): argument 'x' is an array of {dt.split('.')[-1]}, "
                                                        rf"the kernel was built for \*{pointee}"):
                    launch()
    assert fake.launches == []
    for dt in ok:
        for launch in _paths(add, _Cai(0x10000, "|u1", _Dt(dt)), _Cai(0x20000, "|u1", _Dt(ok[0])), 1024):
            launch()
    assert len(fake.launches) == 5 * len(ok)
    # a DeviceBuffer of another dtype (a NumPy dtype) is refused too
    with pytest.raises(ArgumentError, match=rf"argument 'out' is an array of float32, the kernel was built for "
                                            rf"\*{pointee}"):
        add[4](_Cai(0x10000, "|u1", _Dt(ok[0])), _buf(0x20000), 1024)


@pytest.mark.parametrize("pointee,typestr,wrong", [("fp8e4nv", "<V1", "<f4"), ("fp8e4nv", "|V1", "|u1"),
                                                   ("fp8e5", "<f1", "<i4"), ("fp8e5", "|f1", "<V1")])
def test_an_array_known_by_its_interface_alone_is_checked_by_its_typestr(fake: FakeDriver, tmp_path: Path,
                                                                         pointee: str, typestr: str,
                                                                         wrong: str) -> None:
    """ml_dtypes' float8_e4m3fn is typestr ``<V1``, its float8_e5m2 ``<f1``: the interface's
    spelling; an array with no ``dtype`` attribute was launched unchecked before."""
    add = _add(fake, tmp_path, pointee)
    add[4](_Cai(0x10000, typestr), _Cai(0x20000, typestr), 1024)
    for _ in range(2):
        with pytest.raises(ArgumentError, match=r"argument 'x' is an array of "):
            add[4](_Cai(0x10000, wrong), _Cai(0x20000, typestr), 1024)
    assert len(fake.launches) == 1


def test_an_interface_array_without_dtype_is_checked_for_every_pointee(fake: FakeDriver, tmp_path: Path) -> None:
    add = _add(fake, tmp_path, "fp32")
    add[4](_Cai(0x10000, "<f4"), _Cai(0x20000, "<f4"), 1024)
    for _ in range(2):
        with pytest.raises(ArgumentError, match=r"argument 'out' is an array of int32, the kernel was built for "
                                                r"\*fp32 \(float32\)"):
            add[4](_Cai(0x10000, "<f4"), _Cai(0x20000, "<i4"), 1024)
    assert len(fake.launches) == 1


def test_dlpack_and_torch_name_the_fp8_types_as_triton_pointees_do() -> None:
    assert dtype_info((10, 8, 1)) == ("float8_e4m3fn", 1) and dtype_info((12, 8, 1)) == ("float8_e5m2", 1)
    from khal_runtime.interop.torch import dtype_name

    class FakeTorchDtype:
        itemsize = 1

        def __str__(self) -> str:
            return "torch.float8_e4m3fn"

    FakeTorchDtype.__module__ = "torch"
    assert dtype_name(FakeTorchDtype()) == ("float8_e4m3fn", 1)


def test_the_fp8_pointers_torch_dtype_is_the_operators_too(fake: FakeDriver, tmp_path: Path) -> None:
    add = _add(fake, tmp_path, "fp8e4nv")
    assert add.pointee_dtype(0) == "float8_e4m3fn"
    assert _add(fake, tmp_path / "b", "fp8e5").pointee_dtype(1) == "float8_e5m2"


# -- (5) an empty grid launches nothing, on every launch path ----------------------------------
@pytest.mark.parametrize("grid", [0, (0,), (4, 0), (0, 1, 1), np.int64(0), [0], lambda meta: (0,),
                                  lambda meta: ((0 + meta["BLOCK"] - 1) // meta["BLOCK"],)])
def test_a_triton_family_launches_nothing_for_an_empty_grid(fake: FakeDriver, tmp_path: Path, grid: Any) -> None:
    add = _add(fake, tmp_path, twin=False)
    x, out = _buf(0x10000), _buf(0x20000)
    for _ in range(2):  # (the second time through the generated call)
        add[grid](x, out, 0)
        add.launch(grid, x, out, 0)
        add[grid](x, out, 1000)  # nothing runs, so no assumption is broken (n = 1000 is not divisible by 16)
    b = add.bind(x, out, 0)
    b(grid)
    b(4)
    b(grid)
    assert [la["grid"] for la in fake.launches] == [(4, 1, 1)]


def test_an_empty_launch_still_checks_its_arguments(fake: FakeDriver, tmp_path: Path) -> None:
    add = _add(fake, tmp_path)
    for _ in range(2):
        with pytest.raises(ArgumentError, match=r"argument 'x' is an array of int32, the kernel was built for \*fp32"):
            add[0](_buf(0x10000, "int32"), _buf(0x20000), 0)
        with pytest.raises(ArgumentValueError, match=r"argument 'x' \(\*fp32\) points at 0x10002"):
            add[(0,)](0x10002, _buf(0x20000), 0)
        with pytest.raises(ArgumentError, match=r"add\(\) takes 3 argument\(s\)"):
            add[0](_buf(0x10000), _buf(0x20000))
    assert fake.launches == []


@pytest.mark.parametrize("grid,cls,match", [
    (-1, ArgumentValueError, r"grid: every dimension must be >= 0 \(0: launch nothing\), got \(-1, 1, 1\)"),
    ((4, -2), ArgumentValueError, r"must be >= 0"),
    (1.0, ArgumentError, r"grid: expected an integer or up to 3 integers, got 1.0"),
    ((0.0,), ArgumentError, r"expected an integer or up to 3 integers"),
    ("0", ArgumentError, r"expected an integer or up to 3 integers"),
    ((), ArgumentValueError, r"expected 1 to 3 dimensions, got \(\) \(an empty tuple names no dimension; a grid "
                             r"of no programs is 0 or \(0,\)\)"),
    ((0, 0, 0, 0), ArgumentValueError, r"expected 1 to 3 dimensions"),
])
def test_a_negative_or_non_integer_grid_stays_an_error(fake: FakeDriver, tmp_path: Path, grid: Any, cls: type,
                                                       match: str) -> None:
    add = _add(fake, tmp_path)
    x, out = _buf(0x10000), _buf(0x20000)
    b = add.bind(x, out, 1024)
    for launch in (lambda: add[grid](x, out, 1024), lambda: add.launch(grid, x, out, 1024), lambda: b(grid)):
        for _ in range(2):
            with pytest.raises(cls, match=match):
                launch()
    assert fake.launches == []


def test_the_explicit_launch_of_a_cuda_entry_launches_nothing_for_an_empty_grid(fake: FakeDriver,
                                                                               tmp_path: Path) -> None:
    ks = fake_kernels(fake, tmp_path, [make_entry("fill", (storage("out", "float32", 4, writable=True),), block=128),
                                       make_entry("fill3", (storage("out", "float32", 4, writable=True),),
                                                  block=(8, 8, 1), grid_dims=3)])
    out = _buf(0x10000)
    for grid in (0, (0,), np.int64(0)):
        ks.fill.launch(grid, None, out)
        khal_runtime.launch(None, khal_runtime.LaunchConfig(grid), ks.fill, out)
    for grid in ((0, 4), (4, 0, 2), (4, 4, 0)):
        ks.fill3.launch(grid, None, out)
    ks.fill(0, out)  # the typed call: a count of 0 launched nothing before too
    ks.fill3((0, 5, 1), out)
    ks.fill.bind(out)(0)
    assert fake.launches == []
    with pytest.raises(ArgumentError, match=r"fill\(\): argument 'out' .*expected element type float32"):
        ks.fill.launch(0, None, _buf(0x10000, "int32"))  # the arguments are checked all the same
    with pytest.raises(ArgumentValueError, match=r"fill.launch\(\): grid: every dimension must be >= 0"):
        ks.fill.launch(-1, None, out)
    with pytest.raises(ArgumentValueError, match=r"fill.launch\(\): grid: expected 1 to 3 dimensions, got \(\)"):
        ks.fill.launch((), None, out)
    with pytest.raises(ArgumentValueError, match=r"block: every dimension must be >= 1"):
        ks.fill3.launch(0, (0, 8), out)  # a block of 0 threads is no empty launch: still an error
    with pytest.raises(ArgumentValueError, match=r"more than 1 dimension"):
        ks.fill.launch((0, 2), None, out)  # a 1-D entry's grid checked as before
    ks.fill.launch(2, None, out)
    assert [la["grid"] for la in fake.launches] == [(2, 1, 1)]


def test_an_empty_launch_inside_a_capture_captures_nothing(fake: FakeDriver, tmp_path: Path) -> None:
    add = _add(fake, tmp_path)
    x, out = _buf(0x10000), _buf(0x20000)
    add[4](x, out, 1024)
    st = khal_runtime.default_stream()
    with st.capture() as cap:
        add[0](x, out, 0)
        add[4](x, out, 1024)
    assert len(fake.launches) == 2 and cap.graph is not None


# -- (6) integral scalars are read as their value ------------------------------------------------
class _Size(enum.IntEnum):
    N = 1024
    ONE = 1


def _ints() -> list[Any]:
    out: list[Any] = [np.int64(1024), np.int32(1024), np.uint64(1024), _Size.N]
    try:
        import torch
    except ImportError:
        return out
    return [*out, torch.tensor(1024)]


@pytest.mark.parametrize("make", range(5))
def test_an_integral_scalar_meets_a_divisibility_assumption_as_its_value(fake: FakeDriver, tmp_path: Path,
                                                                         make: int) -> None:
    ints = _ints()
    if make >= len(ints):
        pytest.skip("torch is not installed")
    n = ints[make]
    only = _add(fake, tmp_path, twin=False)  # built as written only: no twin to fall back to
    x, out = _buf(0x10000), _buf(0x20000)
    for _ in range(2):
        only[4](x, out, n)
        only.launch((4,), x, out, n)
    only.bind(x, out, n)(4)
    assert only.chosen(x, out, n) == "add"
    both = _add(fake, tmp_path / "twin")
    assert both.chosen(x, out, n) == "add"  # the specialised variant, not the twin
    both[4](x, out, n)
    assert fake.launches[-1]["f"].endswith(both.variants[0].entry.symbol)
    assert {int.from_bytes(la["slots"][2], "little") for la in fake.launches} == {1024}


def test_an_integral_scalar_meets_an_equals_1_assumption(fake: FakeDriver, tmp_path: Path) -> None:
    names, types = ("x", "stride"), ("*fp32", "i32")
    ks = triton_kernels(fake, tmp_path, [triton_entry("st", "st", names, types, ones=("stride",))])
    x = _buf(0x10000)
    for one in (np.int64(1), np.uint8(1), _Size.ONE, 1):
        for _ in range(2):
            ks.st[2](x, one)
    assert len(fake.launches) == 8
    with pytest.raises(TritonAssumptionError, match=r"stride = 2 is not 1"):
        ks.st[2](x, np.int64(2))
    for bad in (1.0, True, np.bool_(True), "1"):  # not integral: the named error, never the value 1
        with pytest.raises((TritonAssumptionError, ArgumentError)):
            ks.st[2](x, bad)


def test_an_integer_address_of_any_integral_type_is_a_pointer(fake: FakeDriver, tmp_path: Path) -> None:
    add = _add(fake, tmp_path)
    for _ in range(2):
        add[4](np.uint64(0x10000), np.int64(0x20000), 1024)
    assert fake.launches[-1]["f"].endswith(add.variants[0].entry.symbol)
    with pytest.raises(ArgumentError, match=r"argument 'x': bool is not a device pointer"):
        add[4](True, 0x20000, 1024)


# -- (7) an array of another device is refused, on every path ----------------------------------
def test_a_device_buffer_of_another_device_is_refused_by_a_triton_family(fake: FakeDriver, tmp_path: Path) -> None:
    add = _add(fake, tmp_path)
    x, out = _buf(0x10000), _buf(0x20000)
    add[4](x, out, 1024)  # the fast call has learnt DeviceBuffers
    other = _buf(0x30000, device=1)
    for launch in _paths(add, x, other, 1024):
        for _ in range(2):
            with pytest.raises(ArgumentValueError, match=r"add\(\): argument 'out' is on device 1, the launch is on "
                                                         r"device 0: move it there, or launch on a stream of device 1"):
                launch()
    view = _buf(0x40000, device=1, n=2048)[:1024]  # a view of one (read by the fast call's reader)
    with pytest.raises(ArgumentValueError, match=r"argument 'x' is on device 1"):
        add[4](view, out, 1024)
    assert len(fake.launches) == 1


def test_a_device_buffer_of_another_device_is_refused_by_the_cuda_call_too(fake: FakeDriver, tmp_path: Path) -> None:
    ks = fake_kernels(fake, tmp_path, [make_entry("fill", (storage("out", "float32", 4, writable=True),), block=128)])
    other = _buf(0x30000, device=1)
    for launch in (lambda: ks.fill(1024, other), lambda: ks.fill.launch(8, None, other),
                   lambda: ks.fill.bind(other)):
        with pytest.raises(ArgumentValueError, match=r"is on device 1, the launch is on device 0: move it there"):
            launch()
    assert fake.launches == []


# -- (2) a per-thread stream's scratch is per thread ---------------------------------------------
def _scratch_family(drv: FakeDriver, tmp_path: Path) -> Any:
    names, types = ("x", "n"), ("*fp32", "i32")
    return triton_kernels(drv, tmp_path, [triton_entry("sk", "sk", names, types, scratch=64)]).sk


def _scratch_of(launch: dict[str, Any]) -> int:
    return int.from_bytes(launch["slots"][2], "little")  # (x, n, global scratch, profile scratch)


def _in_thread(fn: Any) -> Any:
    import threading

    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


@pytest.mark.parametrize("how", ["int", "stream object"])
def test_two_threads_on_the_per_thread_stream_get_scratch_of_their_own(fake: FakeDriver, tmp_path: Path,
                                                                        how: str) -> None:
    from khal_runtime import scratch
    from khal_runtime.device import as_stream, ensure_current

    sk = _scratch_family(fake, tmp_path)
    x = _buf(0x10000)
    per_thread = 2 if how == "int" else as_stream(2)  # CU_STREAM_PER_THREAD (one object shared by the threads)

    def launches() -> list[int]:
        ensure_current(0)
        for _ in range(12):  # past the memo's promotion to a shared snapshot
            sk[4](x, 1024, stream=per_thread)
        sk.launch(4, x, 1024, stream=per_thread)
        b = sk.bind(x, 1024, stream=per_thread)
        b(4)
        b(4)
        return [_scratch_of(la) for la in fake.launches[-15:]]

    mine = launches()
    theirs = _in_thread(launches)
    assert len(set(mine)) == 1 and len(set(theirs)) == 1 and mine[0] and theirs[0]
    assert mine[0] != theirs[0]  # concurrent streams: one buffer each
    again = launches()
    assert set(again) == {mine[0]}  # the other thread's launches did not take this thread's
    assert scratch.held()["retired"] >= 64 * 4  # the ended thread's buffer: kept until release()
    # an ordinary stream is one stream for every thread: one buffer, shared
    st = khal_runtime.default_stream()
    sk[4](x, 1024, stream=st)
    shared = _scratch_of(fake.launches[-1])
    assert _in_thread(lambda: (ensure_current(0), sk[4](x, 1024, stream=st), _scratch_of(fake.launches[-1]))[2]) \
        == shared


def test_the_per_thread_default_stream_of_cuda_bindings_is_per_thread(fake: FakeDriver,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime.backends.cuda import BACKEND

    assert BACKEND.is_per_thread_stream(2) and not BACKEND.is_per_thread_stream(1)
    assert not BACKEND.is_per_thread_stream(0) and not BACKEND.is_per_thread_stream(0x1234)
    monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    assert BACKEND.is_per_thread_stream(0)
    monkeypatch.setenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0")
    assert not BACKEND.is_per_thread_stream(0)


def test_an_indirect_dispatchs_count_word_is_per_thread_on_the_per_thread_stream(fake: FakeDriver) -> None:
    from khal_runtime.backends.cuda.indirect import _scratch_for
    from khal_runtime.device import as_stream

    st = as_stream(2)
    mine = _scratch_for(0, st)
    assert _scratch_for(0, st) is mine and _in_thread(lambda: _scratch_for(0, st)) is not mine
    owned = khal_runtime.default_stream()
    assert _in_thread(lambda: _scratch_for(0, owned)) is _scratch_for(0, owned)


# -- (4) a dtype changed at the same address is not the remembered launch --------------------------
class _TorchLike:
    """What a Triton family reads of a CUDA tensor (torch's module name: read as one)."""

    is_cuda = True

    def __init__(self, ptr: int, dtype: Any) -> None:
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr

    def get_device(self) -> int:
        return 0


_TorchLike.__module__ = "torch"


@pytest.mark.parametrize("repeats", [2, 12], ids=["memo slot", "shared snapshot"])
def test_a_triton_memo_is_not_repeated_on_another_dtype_at_the_same_address(fake: FakeDriver, tmp_path: Path,
                                                                             repeats: int) -> None:
    add = _add(fake, tmp_path)
    f32, i32 = _Dt("torch.float32"), _Dt("torch.int32")
    x, out = _TorchLike(0x10000, f32), _TorchLike(0x20000, f32)
    for _ in range(repeats):
        add[4](x, out, 1024)
    x.dtype = i32  # x.data = x.data.view(torch.int32): the same address, the version kept
    with pytest.raises(ArgumentError, match=r"argument 'x' is an array of int32, the kernel was built for \*fp32"):
        add[4](x, out, 1024)
    assert len(fake.launches) == repeats


def test_an_autotuned_family_times_nothing_for_an_empty_grid(fake: FakeDriver, tmp_path: Path) -> None:
    """Timing the configs of an empty launch would time nothing and keep that choice for the key."""
    names, types = ("x", "n"), ("*fp32", "i32")
    entries = []
    for config, block in ((0, 128), (1, 256)):
        e = triton_entry(f"tk_c{config}", "tk", names, types, constexprs={"BLOCK": block})
        facts = e.triton.model_copy(update={"config": config, "autotune_key": ("n",)})
        from khal_runtime import abi as _abi

        sig = _abi.entry_signature(e.name, e.block_size, e.params, grid_dims=3, triton=facts.record())
        h = _abi.entry_hash(CONTENT, sig)
        entries.append(e.model_copy(update={"triton": facts, "hash": h, "symbol": _abi.symbol_for(e.name, h)}))
    ks = triton_kernels(fake, tmp_path, entries)
    tk = next(iter(ks.crates["c"]))
    assert tk.tuned
    x = _buf(0x10000)
    for _ in range(2):
        tk[lambda meta: ((0 + meta["BLOCK"] - 1) // meta["BLOCK"],)](x, 0)
        tk[0](x, 4096)
    assert fake.launches == [] and tk.choices == {}
    tk.pin(1)
    tk[4](x, 4096)
    assert len(fake.launches) == 1
