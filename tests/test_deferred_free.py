"""Buffers released during a capture are freed when it ends (CPU, fake driver)."""

from __future__ import annotations

from typing import Any

import pytest

from khal_runtime import _cuda, buffers, graphs
from khal_runtime.buffers import DeviceBuffer


class Driver:
    def __init__(self) -> None:
        self.freed: list[int] = []

    def cuMemFree(self, ptr: Any) -> tuple[int]:  # noqa: N802
        self.freed.append(int(ptr))
        return (0,)

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[int]:  # noqa: N802
        return (0,)


def test_free_inside_capture_waits_for_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    drv = Driver()
    monkeypatch.setattr(_cuda, "_driver", drv)
    monkeypatch.setattr("khal_runtime.device.ensure_current", lambda ordinal: None)
    open_capture = [True]
    monkeypatch.setattr(graphs, "capturing", lambda stream=None: open_capture[0])
    a = DeviceBuffer(0x1000, 4, "float32", 0, alloc=0x1000)
    b = DeviceBuffer(0x2000, 4, "float32", 0, alloc=0x2000)
    a.free()
    del b  # garbage: __del__ frees
    assert drv.freed == [] and len(buffers._DEFERRED) == 2
    assert a.ptr == 0  # the buffer object is dead at once; only the cuMemFree waits
    open_capture[0] = False
    buffers.flush_deferred_frees()
    assert sorted(drv.freed) == [0x1000, 0x2000] and not buffers._DEFERRED
    c = DeviceBuffer(0x3000, 4, "float32", 0, alloc=0x3000)
    c.free()  # outside a capture: at once
    assert drv.freed[-1] == 0x3000


def test_a_buffer_collected_inside_an_epoch_bump_does_not_deadlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """register_memo() and bump_epoch() allocate while holding the epoch lock; an allocation
    can run the cyclic garbage collector, which can finalise a dropped DeviceBuffer, whose
    free() bumps the epoch again in the same thread. With a plain lock that hung the GPU test
    run (a buffer held by an exception's traceback cycle). Here the collection is forced at
    that allocation."""
    import gc
    import threading
    import weakref

    drv = Driver()
    monkeypatch.setattr(_cuda, "_driver", drv)
    monkeypatch.setattr("khal_runtime.device.ensure_current", lambda ordinal: None)
    monkeypatch.setattr(graphs, "capturing", lambda stream=None: False)

    class Cycle:
        pass

    class CollectingDict(weakref.WeakKeyDictionary):  # type: ignore[type-arg]
        def setdefault(self, key, default=None):  # type: ignore[no-untyped-def, override]
            c = Cycle()
            c.me = c
            c.buf = DeviceBuffer(0x7000, 4, "float32", 0, alloc=0x7000)
            del c
            gc.collect()  # what an allocation here may do: finalises the buffer -> free()
            return super().setdefault(key, default)

    monkeypatch.setattr(buffers, "THREAD_MEMOS", CollectingDict())

    class Owner:
        pass

    owner = Owner()
    th = threading.Thread(target=lambda: buffers.register_memo([None], 0, owner=owner), daemon=True)
    th.start()
    th.join(10)
    assert not th.is_alive(), "deadlocked"
    assert drv.freed == [0x7000]
