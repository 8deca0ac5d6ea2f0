"""The generated per-entry ``Kernel.__call__``: same packing and the same named errors as the
generic path, on CPU with the fake driver (tests/helpers/fakecuda.py)."""

from __future__ import annotations

import re
import struct
from types import SimpleNamespace
from typing import Any

import pytest

from khal_runtime import DeviceBuffer, calls, memo
from khal_runtime.device import _tls
from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.kernels import Kernel
from tests.helpers.runtime import P, Tensor, _kernel, _u64, generated_name
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, stream  # noqa: F401  (fixture)


def test_generated_call_packs_like_the_abi(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    k, st = _kernel(fake)
    assert isinstance(k, Kernel) and k.func is not calls.generic_call  # generated code installed
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x, y, z = (DeviceBuffer(0x1000 * (i + 1), 300 + i, "float32", 0) for i in range(3))
    for u in (P(2.0, 3.0), bytes(P(2.0, 3.0)), P(2.0, 3.0)):
        k(300, x, y, z, u, 0.25, stream=st)
    t = Tensor(0x9000, 50)
    k(300, t, y, z, P(2.0, 3.0), 0.25, stream=st)  # torch-like: learned, then inlined
    k(300, t, y, z, P(2.0, 3.0), 0.25, stream=st)
    assert "ArrayT0_0" in k.plan(0).call_source and "StructT3_0" in k.plan(0).call_source
    assert len(fake.launches) == 5
    for l in fake.launches:
        assert l["grid"] == (3, 1, 1) and l["block"] == (128, 1, 1) and l["stream"] == "STREAM"
        s = l["slots"]
        assert struct.unpack("<Q", s[2])[0] == 0x2000 and struct.unpack("<Q", s[3])[0] == 301
        assert struct.unpack("<f", s[7])[0] == 0.25
    assert struct.unpack("<Q", fake.launches[-1]["slots"][0])[0] == 0x9000
    assert struct.unpack("<Q", fake.launches[-1]["slots"][1])[0] == 50


def test_generated_call_names_bad_arguments(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x = DeviceBuffer(0x1000, 10, "float32", 0)
    i32 = DeviceBuffer(0x1000, 10, "int32", 0)
    p = P(1, 2)
    with pytest.raises(ArgumentError, match=r"five\(\): argument 'y'.*element type float32"):
        k(10, x, i32, x, p, 1.0, stream=st)
    with pytest.raises(ArgumentValueError, match=r"argument 'z'.*needs 4 elements, got 2"):
        k(10, x, x, x[:2], p, 1.0, stream=st)
    with pytest.raises(ArgumentValueError, match=r"argument 'p'.*expected 8 bytes, got 4"):
        k(10, x, x, x, b"abcd", 1.0, stream=st)
    with pytest.raises(ArgumentError, match=r"argument 's'.*expected a number"):
        k(10, x, x, x, p, "1.0", stream=st)
    with pytest.raises(ArgumentError, match=r"takes 5 argument\(s\).*got 4"):
        k(10, x, x, x, p, stream=st)
    with pytest.raises(ArgumentError, match=r"takes 5 argument\(s\).*got 6"):
        k(10, x, x, x, p, 1.0, 2.0, stream=st)
    k(10, Tensor(0x9000, 10), x, x, p, 1.0, stream=st)
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*non-contiguous tensor"):
        k(10, Tensor(0x9000, 10, contiguous=False), x, x, p, 1.0, stream=st)
    with pytest.raises(ArgumentError, match=r"argument 'x'.*host memory"):
        k(10, bytearray(40), x, x, p, 1.0, stream=st)
    dead = DeviceBuffer(0, 10, "float32", 0)
    dead.free()
    with pytest.raises(ArgumentValueError, match="freed"):
        k(10, dead, x, x, p, 1.0, stream=st)
    k(0, x, x, x, p, 1.0, stream=st)  # n == 0: checked, not launched
    with pytest.raises(ValueError, match=">= 0"):
        k(-1, x, x, x, p, 1.0, stream=st)
    assert len(fake.launches) == 1


def test_prepacked_path_repacks_whatever_changed(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """The memo of the last launch (same DeviceBuffers and scalars: skip re-packing them) must
    never launch stale values: a freed buffer, another array type in between, a mutated
    uniform, a new scalar and a launch that failed half-way each force the full path."""
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x, y, z = (DeviceBuffer(0x1000 * (i + 1), 300 + i, "float32", 0) for i in range(3))
    p = P(2.0, 3.0)
    s = 0.25
    k(300, x, y, z, p, s, stream=st)
    k(300, x, y, z, p, s, stream=st)  # memo hit
    assert fake.launches[0]["slots"] == fake.launches[1]["slots"]
    ptr_p = _u64(fake.launches[1], 6)

    p.a = 5.0  # same ctypes object, new bytes: the uniform is re-read on the fast path too
    k(300, x, y, z, p, s, stream=st)
    assert _u64(fake.launches[-1], 6) != ptr_p
    assert _u64(fake.launches[-1], 6) == k.plan(0).uniforms.entries[bytes(p)].ptr
    assert fake.launches[-1]["slots"][:6] == fake.launches[0]["slots"][:6]

    k(300, Tensor(0x9000, 77), y, z, p, s, stream=st)  # another array type in between
    assert _u64(fake.launches[-1], 0) == 0x9000 and _u64(fake.launches[-1], 1) == 77
    k(300, x, y, z, p, s, stream=st)  # must not reuse the tensor's packed pointer
    assert _u64(fake.launches[-1], 0) == 0x1000 and _u64(fake.launches[-1], 1) == 300

    k(300, x, y, z, p, 0.5, stream=st)  # a new scalar object
    assert struct.unpack("<f", fake.launches[-1]["slots"][7])[0] == 0.5

    n = len(fake.launches)
    with pytest.raises(ArgumentValueError, match="'s'"):  # fails in pack, after the buffers
        k(300, x, y, z, p, 1e300, stream=st)
    k(300, x, y, z, p, 0.5, stream=st)
    assert len(fake.launches) == n + 1
    assert struct.unpack("<f", fake.launches[-1]["slots"][7])[0] == 0.5
    assert _u64(fake.launches[-1], 4) == 0x3000 and _u64(fake.launches[-1], 5) == 302

    x.free()  # same object, now freed: refused before launch
    with pytest.raises(ArgumentValueError, match="freed"):
        k(300, x, y, z, p, 0.5, stream=st)
    assert len(fake.launches) == n + 1


@pytest.mark.parametrize("n", [1.5, "10", None])
def test_thread_count_must_be_an_integer(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch, n: Any) -> None:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x = DeviceBuffer(0x1000, 10, "float32", 0)
    with pytest.raises(ArgumentError, match=r"five\(\): the first argument is the thread count, an integer"):
        k(n, x, x, x, P(1, 2), 1.0, stream=st)
    with pytest.raises(ArgumentError, match=r"five\(\): the first argument is the thread count"):
        k.bind(x, x, x, x, 1.0, stream=st)(n)
    assert fake.launches == []


@pytest.mark.parametrize("grid", [1.5, "x", (2, 0.5)])
def test_explicit_launch_grid_must_be_integers(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch, grid: Any) -> None:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x = DeviceBuffer(0x1000, 10, "float32", 0)
    with pytest.raises(ArgumentError, match=r"grid: expected an integer or up to 3 integers"):
        k.launch(grid, 128, x, x, x, P(1, 2), 1.0, stream=st)
    assert fake.launches == []


def test_prepacked_path_never_reuses_a_block_something_else_rewrote(fake: FakeDriver,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The explicit launch packs into the same per-thread block: the typed call after it must
    not take the block for its own (it once did, launching the explicit call's arguments).
    The memoised grid follows the thread count; a 0-d NumPy scalar, which can change in place,
    is read on every call; bump_epoch (a free, a uniform-cache flush) clears every memo."""
    import numpy as np

    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x, y, z = (DeviceBuffer(0x1000 * (i + 1), 300 + i, "float32", 0) for i in range(3))
    p = P(2.0, 3.0)
    k(300, x, y, z, p, 0.25, stream=st)
    k(300, x, y, z, p, 0.25, stream=st)
    k.launch(3, 128, y, x, z, p, 0.25, stream=st)
    assert _u64(fake.launches[-1], 0) == 0x2000
    k(300, x, y, z, p, 0.25, stream=st)
    assert _u64(fake.launches[-1], 0) == 0x1000 and _u64(fake.launches[-1], 2) == 0x2000
    assert fake.launches[-1]["grid"] == (3, 1, 1)

    for n, grid in ((1000, 8), (1000, 8), (129, 2), (300, 3)):
        k(n, x, y, z, p, 0.25, stream=st)
        assert fake.launches[-1]["grid"] == (grid, 1, 1)

    s = np.array(0.25, dtype=np.float32)
    k(300, x, y, z, p, s, stream=st)
    s[()] = 0.75
    k(300, x, y, z, p, s, stream=st)
    assert struct.unpack("<f", fake.launches[-1]["slots"][7])[0] == 0.75

    k(300, x, y, z, p, 0.25, stream=st)
    k(300, x, y, z, p, 0.25, stream=st)
    x.ptr = 0x7000  # white box: only a bump may tell the memo that pointers moved
    memo.bump_epoch()
    k(300, x, y, z, p, 0.25, stream=st)
    assert _u64(fake.launches[-1], 0) == 0x7000


def test_a_slice_of_a_freed_buffer_is_refused(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    root = DeviceBuffer(0x1000, 600, "float32", 0)
    x, y = root[0:300], root[300:600]
    p = P(2.0, 3.0)
    k(300, x, y, y, p, 0.25, stream=st)
    k(300, x, y, y, p, 0.25, stream=st)
    root.free()
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*freed"):
        k(300, x, y, y, p, 0.25, stream=st)
    with pytest.raises(ArgumentValueError, match="freed"):
        x.to_numpy()
    assert len(fake.launches) == 2


def test_kernel_call_is_the_generated_code_and_hooks_regenerate_it(fake: FakeDriver,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    from khal_runtime.launch_hooks import hooks

    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    plan = k.plan(0)
    assert re.fullmatch(generated_name("call five"), k.func.__code__.co_filename)
    assert "hooks." not in plan.call_source  # no tracing: no hook check on the launch path
    seen: list[Any] = []

    def dispatch(plan: Any, grid: Any, block: Any, shmem: int, stream: Any, args: Any, go: Any) -> None:
        seen.append((grid, args[4]))
        go()

    hooks.install(dispatch)
    try:
        assert "hooks.dispatch" in plan.call_source and "hooks.dispatch" in plan.source
        x = DeviceBuffer(0x1000, 300, "float32", 0)
        k(300, x, x, x, P(1, 2), 0.5, stream=st)
        assert seen == [((3, 1, 1), 0.5)] and len(fake.launches) == 1
    finally:
        hooks.uninstall()
    assert "hooks." not in plan.call_source
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(k)


def test_shared_memo_snapshot_is_immutable_and_follows_every_change(fake: FakeDriver,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch repeated PROMOTE_AFTER times becomes one of the plan's shared snapshots; what
    changes after (a uniform's bytes, another buffer, the explicit launch, a free) must never
    be launched from a stale snapshot."""
    from khal_runtime.backends.cuda.launchgen import PROMOTE_AFTER

    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    plan = k.plan(0)
    x, y, z = (DeviceBuffer(0x1000 * (i + 1), 300 + i, "float32", 0) for i in range(3))
    p = P(2.0, 3.0)
    for _ in range(PROMOTE_AFTER + 1):
        k(300, x, y, z, p, 0.25, stream=st)
    assert plan._shared[0].a0 is x  # promoted
    assert fake.ex_calls == 0
    k(300, x, y, z, p, 0.25, stream=st)
    assert fake.ex_calls == 1  # the snapshot launches through cuLaunchKernelEx, config built once
    first = fake.launches[0]["slots"]
    assert all(launch["slots"] == first for launch in fake.launches)

    k.launch(3, 128, z, y, x, p, 0.25, stream=st)  # rewrites this thread's block, not the snapshot
    k(300, x, y, z, p, 0.25, stream=st)
    assert fake.launches[-1]["slots"] == first

    p.b = 7.0  # same struct object, new bytes: the snapshot does not apply
    k(300, x, y, z, p, 0.25, stream=st)
    assert _u64(fake.launches[-1], 6) == plan.uniforms.entries[bytes(p)].ptr != _u64(fake.launches[0], 6)

    memo.bump_epoch()
    assert plan._shared[0].a0 is not x  # cleared
    k(300, x, y, z, p, 0.25, stream=st)
    assert _u64(fake.launches[-1], 0) == 0x1000


def test_threads_repeating_their_own_arguments_each_launch_their_own(fake: FakeDriver,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads each repeating different arguments on one entry (more of them than there are
    shared snapshots, so they keep replacing each other's): the snapshots and the per-thread
    blocks never mix one thread's arguments into another's launch. Each thread's thread
    count is its signature in the grid."""
    import threading

    from khal_runtime.backends.cuda import launch as cuda_launch
    from khal_runtime.backends.cuda import launchgen

    k, st = _kernel(fake)
    errors: list[BaseException] = []
    p = P(1.0, 2.0)

    def work(t: int) -> None:
        try:
            _tls.dev = 0
            bufs = [DeviceBuffer(0x10_0000 * (t + 1) + 0x1000 * i, 1000, "float32", 0) for i in range(3)]
            count, scalar = 128 * (t + 1), float(t)
            for _ in range(300):
                k(count, *bufs, p, scalar, stream=st)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    import sys

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython will: interleave the calls
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors
    assert len(fake.launches) == 6 * 300
    for launch in fake.launches:
        t = launch["grid"][0] - 1
        assert _u64(launch, 0) == 0x10_0000 * (t + 1) and _u64(launch, 4) == 0x10_0000 * (t + 1) + 0x2000
        assert struct.unpack("<f", launch["slots"][7])[0] == float(t)
    assert sum(snap.a0 is not cuda_launch.NOMEMO for snap in k.plan(0)._shared) == launchgen.SLOTS


def _counting_array_type(module: str, name: str) -> type:
    """A device-array type whose attribute reads are counted (``reads``)."""
    reads = {"n": 0}

    class Arr:
        def __init__(self, ptr: int, n: int) -> None:
            self._p, self._n = ptr, n

        def _read(self, v: Any) -> Any:
            reads["n"] += 1
            return v

        data = property(lambda self: SimpleNamespace(ptr=self._read(self._p)))
        size = property(lambda self: self._read(self._n))
        dtype = property(lambda self: self._read("float32"))
        _c_contiguous = property(lambda self: self._read(True))
        is_cuda = property(lambda self: self._read(True))
        device = property(lambda self: SimpleNamespace(id=self._read(0)))

        def get_device(self) -> int:
            return self._read(0)

        def data_ptr(self) -> int:
            return self._read(self._p)

        def numel(self) -> int:
            return self._read(self._n)

        def is_contiguous(self) -> bool:
            return self._read(True)

    Arr.__module__, Arr.__name__, Arr.__qualname__ = module, name, name
    Arr.reads = reads  # type: ignore[attr-defined]
    return Arr


def test_cupy_arrays_are_packed_once_unversioned_tensors_every_call(fake: FakeDriver,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """cupy.ndarray cannot change pointer, size, dtype or contiguity under the same object, so a
    repeated launch reuses its packed block; a torch tensor can (set_, resize_, .data =), and
    one without a version counter to tell (this one, like an inference tensor) is read again
    on every launch (tensors with one: tests/runtime/test_torch_memo.py)."""
    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    p = P(1.0, 2.0)
    for module, name, memoised in (("cupy._core.core", "ndarray", True), ("torch", "Tensor", False)):
        T = _counting_array_type(module, name)
        x, y, z = T(0x1000, 300), T(0x2000, 300), T(0x3000, 300)
        for _ in range(3):
            k(300, x, y, z, p, 0.5, stream=st)
        before = T.reads["n"]  # type: ignore[attr-defined]
        k(300, x, y, z, p, 0.5, stream=st)
        assert (T.reads["n"] == before) is memoised, (module, T.reads)  # type: ignore[attr-defined]
        assert _u64(fake.launches[-1], 0) == 0x1000 and _u64(fake.launches[-1], 4) == 0x3000


def test_alternating_argument_sets_each_get_a_snapshot(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Double buffering (step(a, b), step(b, a), ...) and two call sites of one entry: each
    argument set has its own memo slot and, once repeated, its own shared snapshot."""
    from khal_runtime.backends.cuda.launchgen import PROMOTE_AFTER, SLOTS

    k, st = _kernel(fake)
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    a, b, z = (DeviceBuffer(0x1000 * (i + 1), 300, "float32", 0) for i in range(3))
    p = P(1.0, 2.0)
    sets = [(a, b), (b, a), (a, a)]
    assert len(sets) < SLOTS
    for _ in range(PROMOTE_AFTER + 1):
        for x, y in sets:
            k(300, x, y, z, p, 0.5, stream=st)
    before = fake.ex_calls
    for _ in range(5):
        for x, y in sets:
            k(300, x, y, z, p, 0.5, stream=st)
            assert (_u64(fake.launches[-1], 0), _u64(fake.launches[-1], 2)) == (x.ptr, y.ptr)
    assert fake.ex_calls - before == 5 * len(sets)  # every one from a snapshot


def test_a_finished_threads_memo_slots_are_released(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread's memo slots (and their argument blocks) go with the thread: a server
    running each request on a new thread must not accumulate them, nor make every free()
    walk them."""
    import gc
    import threading

    k, st = _kernel(fake)
    x = DeviceBuffer(0x1000, 300, "float32", 0)
    gc.collect()  # plans of earlier tests, and the slots their threads registered
    before = len(memo.THREAD_MEMOS)
    during: list[int] = []

    def work() -> None:
        _tls.dev = 0
        for _ in range(3):
            k(300, x, x, x, P(1, 2), 0.5, stream=st)
        during.append(len(memo.THREAD_MEMOS))

    for _ in range(5):
        th = threading.Thread(target=work)
        th.start()
        th.join()
    gc.collect()
    assert during == [before + 1] * 5  # registered while the thread ran
    assert len(memo.THREAD_MEMOS) == before
    assert len(fake.launches) == 15


def test_an_array_on_another_device_is_refused(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel given another device's memory fails with an illegal address, which ruins the
    context: every launch path names the argument instead, and launches nothing."""
    k, st = _kernel(fake)  # its plan and stream: device 0
    monkeypatch.setattr(_tls, "dev", 0, raising=False)
    x = DeviceBuffer(0x1000, 300, "float32", 0)
    p = P(1.0, 2.0)
    for _ in range(3):  # remembered, so the next call's first checks are the memo's
        k(300, x, x, x, p, 0.5, stream=st)
    launched = len(fake.launches)
    other = DeviceBuffer(0x9000, 300, "float32", 1)
    msg = r"argument 'y'.*is on device 1, the launch is on device 0"
    with pytest.raises(ArgumentValueError, match=msg):
        k(300, x, other, x, p, 0.5, stream=st)
    with pytest.raises(ArgumentValueError, match=msg):
        k(300, x, other[10:], x, p, 0.5, stream=st)  # a slice is on its buffer's device
    with pytest.raises(ArgumentValueError, match=msg):
        k.launch(3, 128, x, other, x, p, 0.5, stream=st)
    with pytest.raises(ArgumentValueError, match=msg):
        k.bind(x, other, x, p, 0.5, stream=st)
    with pytest.raises(ArgumentValueError, match=msg):
        k(300, x, Tensor(0x9000, 300, device=1), x, p, 0.5, stream=st)
    with pytest.raises(ArgumentError, match=r"argument 'y'.*host tensor"):
        k(300, x, Tensor(0x9000, 300, device=-1), x, p, 0.5, stream=st)
    xpu = Tensor(0x9000, 300, device=0)  # another accelerator's device 0 (torch.xpu, say)
    xpu.is_cuda, xpu.device.type = False, "xpu"
    with pytest.raises(ArgumentError, match=r"argument 'y'.*not a CUDA tensor"):
        k(300, x, xpu, x, p, 0.5, stream=st)
    assert len(fake.launches) == launched
    k(300, x, Tensor(0x9000, 300, device=0), x, p, 0.5, stream=st)
    assert len(fake.launches) == launched + 1
