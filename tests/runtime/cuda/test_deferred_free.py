"""Buffers released during a capture are freed when it ends (CPU, the fake driver)."""

from __future__ import annotations

import pytest

from khal_runtime import capture_state, memo
from khal_runtime.backends import cuda
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.device import Device
from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401  (fixture)


def _buf(ptr: int) -> DeviceBuffer:
    return DeviceBuffer(ptr, 4, "float32", 0, alloc=ptr, backend=cuda.BACKEND)


def test_free_inside_capture_waits_for_its_end(fake: FakeDriver) -> None:
    a, b = _buf(0x1000), _buf(0x2000)
    with Device(0).default_stream.capture():
        a.free()
        del b  # garbage: __del__ frees
        assert fake.freed == [] and capture_state.pending_releases() == 2
        assert a.ptr == 0  # the buffer object is dead at once; only the cuMemFree waits
    assert sorted(fake.freed) == [0x1000, 0x2000] and capture_state.pending_releases() == 0
    c = _buf(0x3000)
    c.free()  # outside a capture: at once
    assert fake.freed[-1] == 0x3000


def test_a_buffer_collected_inside_an_epoch_bump_does_not_deadlock(fake: FakeDriver,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """register_memo() and bump_epoch() allocate while holding the epoch lock; an allocation
    can run the cyclic garbage collector, which can finalise a dropped DeviceBuffer, whose
    free() bumps the epoch again in the same thread. With a plain lock that hung the GPU test
    run (a buffer held by an exception's traceback cycle). Here the collection is forced at
    that allocation."""
    import gc
    import threading
    import weakref

    class Cycle:
        pass

    class CollectingDict(weakref.WeakKeyDictionary):  # type: ignore[type-arg]
        def setdefault(self, key, default=None):  # type: ignore[no-untyped-def, override]
            c = Cycle()
            c.me = c
            c.buf = _buf(0x7000)
            del c
            gc.collect()  # what an allocation here may do: finalises the buffer -> free()
            return super().setdefault(key, default)

    monkeypatch.setattr(memo, "THREAD_MEMOS", CollectingDict())

    class Owner:
        pass

    owner = Owner()
    th = threading.Thread(target=lambda: memo.register_memo([None], 0, owner=owner), daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), "deadlocked"
    assert fake.freed == [0x7000]


def test_a_buffer_collected_inside_another_librarys_capture_waits_for_it(fake: FakeDriver,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch's torch.cuda.graph is not ours: a DeviceBuffer the garbage collector frees inside
    it must not call cuMemFree then (that invalidates the capture); the free happens at the next
    release or allocation outside it."""
    inside = [True]
    monkeypatch.setattr(capture_state, "_foreign_probes", [lambda: inside[0]])
    a = _buf(0x4000)
    del a
    assert fake.freed == [] and capture_state.pending_releases() == 1
    inside[0] = False
    b = _buf(0x5000)
    b.free()  # outside: the kept one first, then this one
    assert fake.freed == [0x4000, 0x5000] and capture_state.pending_releases() == 0


def test_the_torch_probe_needs_torch_imported_and_capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from khal_runtime.interop import torch as torch_interop

    assert torch_interop.capturing in capture_state._foreign_probes
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert torch_interop.capturing() is False  # never imports torch
    state = {"init": False, "cap": True}
    cuda_ns = types.SimpleNamespace(is_initialized=lambda: state["init"],
                                    is_current_stream_capturing=lambda: state["cap"])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda_ns))
    assert torch_interop.capturing() is False  # CUDA not initialised by torch: no capture
    state["init"] = True
    assert torch_interop.capturing() is True
    state["cap"] = False
    assert torch_interop.capturing() is False
