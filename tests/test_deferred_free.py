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
