"""Small uniform buffers, content-addressed: the same bytes give the same region.

A uniform argument (a struct in the target's layout, or the WGSL scalar block) is looked up by
its bytes: a hit costs one dict lookup. A miss copies the bytes into a host mirror of a 64 KiB
uniform slab and marks the range dirty; the dirty ranges go to the GPU with one
``queue.write_buffer`` per slab just before the stream submits (:meth:`UniformPool.commit`, a
``pre_submit`` hook of the stream). A ``write_buffer`` runs before the command buffer submitted
after it, which holds every dispatch that reads the region, and no pending dispatch reads a fresh
region: so a new uniform value neither forces a submit nor costs a GPU call of its own.

A region is never rewritten while work that may read it is pending: when the pool is full
(``MAX_ENTRIES``), it submits the open encoder first (so later writes are ordered after that
work on the queue), forgets every entry and starts over in the same slabs, or, while a
recording is alive (``pins``; its replays read its regions), in new slabs. ``generation``
changes each time, so that bound launches and memoised calls re-resolve their regions.

:meth:`UniformPool.region` returns ``(resource, base, offset)``: the Resource of the region
itself, and for bindings with a dynamic offset the Resource of the slab at offset 0 with the
region's size (shared by every region of that size in the slab) and the offset to pass.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from khal_runtime.backends.webgpu._wgpu import wgpu_module
from khal_runtime.errors import ArgumentValueError, WebGpuError
from khal_runtime.backends.webgpu.memory import Resource, new_serial

if TYPE_CHECKING:
    from khal_runtime.backends.webgpu.device import WebGpuDevice

__all__ = ["MAX_ENTRIES", "SLAB", "Region", "UniformPool", "uniform_pool"]

SLAB = 64 * 1024
MAX_ENTRIES = 4096

#: (Resource of the region, Resource of its slab at offset 0 with the region's size, offset)
Region = tuple[Any, Any, int]


def _round(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class _Slab:
    __slots__ = ("buffer", "serial", "mirror", "lo", "hi", "bases")

    def __init__(self, buffer: Any, size: int) -> None:
        self.buffer = buffer
        self.serial = new_serial()
        self.mirror = bytearray(size)
        self.lo = size
        self.hi = 0
        self.bases: dict[int, Resource] = {}

    def base(self, size: int) -> Resource:
        b = self.bases.get(size)
        if b is None:
            b = self.bases[size] = (self.buffer, self.serial, 0, size)
        return b


class UniformPool:
    """Per-device content-addressed uniform regions (see the module docstring)."""

    def __init__(self, device: WebGpuDevice, max_entries: int = MAX_ENTRIES) -> None:
        self.device = device
        self.max_entries = max_entries
        #: bytes -> Region
        self.entries: dict[bytes, Region] = {}
        self.align = max(16, device.uniform_align)
        self._slabs: list[_Slab] = []
        self._large: list[_Slab] = []
        self._dirty: list[_Slab] = []
        self._index = -1
        self._offset = SLAB
        self.pins = 0
        self.generation = 0
        self.uploads = 0
        self.commits = 0
        self._lock = threading.RLock()  # _recycle -> flush -> commit re-enters it
        device.stream.pre_submit.append(self.commit)

    def region(self, data: bytes) -> Region:
        """The region holding ``data`` (hot path: a dict lookup)."""
        r = self.entries.get(data)
        if r is None:
            r = self._upload(data)
        return r

    def _slab(self, size: int) -> _Slab:
        wgpu = wgpu_module()
        buf = self.device.device.create_buffer(
            label="khal uniforms", size=size, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        return _Slab(buf, size)

    def _upload(self, data: bytes) -> Region:
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
                slab = self._slab(size)
                self._large.append(slab)
                off = 0
            else:
                if self._offset + size > SLAB:
                    self._index += 1
                    if self._index >= len(self._slabs):
                        self._slabs.append(self._slab(SLAB))
                    self._offset = 0
                slab = self._slabs[self._index]
                off = self._offset
                self._offset = _round(off + size, self.align)
            slab.mirror[off:off + n] = data
            if slab.hi == 0:
                self._dirty.append(slab)
            slab.lo = min(slab.lo, off)
            slab.hi = max(slab.hi, off + size)
            r = ((slab.buffer, slab.serial, off, size), slab.base(size), off)
            self.entries[bytes(data)] = r
            self.uploads += 1
            return r

    def commit(self) -> None:
        """Write the dirty ranges of the slabs (called by the stream before every submit)."""
        if not self._dirty:
            return
        with self._lock:
            q = self.device.queue
            dirty = self._dirty
            # A slab leaves the list only once written. A flush can run inside the write (a finalizer
            # the garbage collector runs there frees memory, which flushes): its own commit then
            # finds the slab still listed and writes it before it submits, where taking the list
            # first let that submit run the dispatches before their uniforms were written (they read
            # zeros). A write that raises (wgpu-py reports an earlier error of the device at its next
            # call) leaves the slab to the next submit.
            while dirty:
                s = dirty[0]
                lo, hi = s.lo, s.hi
                try:
                    q.write_buffer(s.buffer, lo, memoryview(s.mirror)[lo:hi])
                except Exception as exc:  # noqa: BLE001
                    raise WebGpuError(f"writing uniforms on {self.device.describe()} failed: {exc}") from None
                if dirty and dirty[0] is s and (s.lo, s.hi) == (lo, hi):  # not written (or grown) meanwhile
                    s.lo, s.hi = len(s.mirror), 0
                    del dirty[0]
            self.commits += 1

    def _recycle(self) -> None:
        st = self.device.stream
        st.flush()  # commits; later writes are then ordered after every dispatch that reads the regions
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
