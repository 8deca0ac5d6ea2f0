"""Small uniform buffers, content-addressed: the same bytes give the same region.

A uniform argument (a struct in the target's layout, or the WGSL scalar block) is looked up by
its bytes: a hit costs one dict lookup and, because the region is the same, lets the bind group
be reused too. A miss writes the bytes into a fresh region of a 64 KiB slab with
``queue.write_buffer``: that write runs before the next submitted command buffer, which holds
every dispatch that reads the region, and no pending dispatch reads a fresh region, so the
stream does not have to submit first.

A region is never rewritten while work that may read it is pending: when the pool is full
(``MAX_ENTRIES``), it submits the open encoder first (so later writes are ordered after that
work on the queue), forgets every entry and starts over in the same slabs, or, while a
recording is alive (``pins``; its replays read its regions), in new slabs. ``generation``
changes each time, so that a bound launch holding a region re-resolves it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from khal_runtime.backends.webgpu._wgpu import wgpu_module
from khal_runtime.backends.webgpu.errors import WebGpuError
from khal_runtime.backends.webgpu.memory import Resource, new_serial
from khal_runtime.errors import ArgumentValueError

if TYPE_CHECKING:
    from khal_runtime.backends.webgpu.device import WebGpuDevice

__all__ = ["MAX_ENTRIES", "SLAB", "UniformPool", "uniform_pool"]

SLAB = 64 * 1024
MAX_ENTRIES = 4096


def _round(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class UniformPool:
    """Per-device content-addressed uniform regions (see the module docstring)."""

    def __init__(self, device: WebGpuDevice, max_entries: int = MAX_ENTRIES) -> None:
        self.device = device
        self.max_entries = max_entries
        #: bytes -> Resource (wgpu buffer, serial, offset, size)
        self.entries: dict[bytes, Resource] = {}
        self.align = max(16, device.uniform_align)
        self._slabs: list[tuple[Any, int]] = []  # (wgpu buffer, serial), SLAB bytes each
        self._large: list[tuple[Any, int]] = []  # uniforms larger than a slab, one buffer each
        self._index = -1
        self._offset = SLAB
        self.pins = 0
        self.generation = 0
        self.uploads = 0
        self._lock = threading.Lock()

    def region(self, data: bytes) -> Resource:
        """The region holding ``data`` (hot path: a dict lookup)."""
        r = self.entries.get(data)
        if r is None:
            r = self._upload(data)
        return r

    def _slab(self, size: int) -> tuple[Any, int]:
        wgpu = wgpu_module()
        buf = self.device.device.create_buffer(
            label="khal uniforms", size=size, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        return buf, new_serial()

    def _upload(self, data: bytes) -> Resource:
        dev = self.device
        n = len(data)
        size = max(16, _round(n, 16))  # WGSL uniform structs are multiples of 16 bytes
        if size > dev.max_uniform_binding:
            raise ArgumentValueError(
                f"a uniform of {n} bytes is more than {dev.describe()} binds as a uniform "
                f"({dev.max_uniform_binding} bytes, max_uniform_buffer_binding_size); pass it as a "
                "storage buffer instead")
        with dev.stream.lock, self._lock:
            r = self.entries.get(data)
            if r is not None:
                return r
            if len(self.entries) >= self.max_entries:
                self._recycle()
            if size > SLAB:  # a slab of its own
                buf, serial = self._slab(size)
                self._large.append((buf, serial))
                off = 0
            else:
                if self._offset + size > SLAB:
                    self._index += 1
                    if self._index >= len(self._slabs):
                        self._slabs.append(self._slab(SLAB))
                    self._offset = 0
                buf, serial = self._slabs[self._index]
                off = self._offset
                self._offset = _round(off + size, self.align)
            payload = data + bytes(size - n) if size != n else data
            try:
                dev.queue.write_buffer(buf, off, payload)
            except Exception as exc:  # noqa: BLE001
                raise WebGpuError(f"writing a {n}-byte uniform on {dev.describe()} failed: {exc}") from None
            r = (buf, serial, off, size)
            self.entries[bytes(data)] = r
            self.uploads += 1
            return r

    def _recycle(self) -> None:
        st = self.device.stream
        st.flush()  # later writes are then ordered after every dispatch that reads the regions
        self.entries.clear()
        self.generation += 1
        self._large = []
        if self.pins:
            self._slabs = []  # a live recording replays reads of these: never rewrite them
        self._index = -1
        self._offset = SLAB

    def clear(self) -> None:
        """Forget every entry (the next uploads reuse the slabs unless a recording is alive)."""
        with self.device.stream.lock, self._lock:
            self._recycle()


def uniform_pool(device: WebGpuDevice) -> UniformPool:
    """The device's uniform pool."""
    return device.cache("uniforms", UniformPool)  # type: ignore[no-any-return]
