"""Uniform structs on a CUDA device: uploaded once through a content-addressed cache.

Host bytes of a uniform argument (converted by :mod:`khal_runtime.uniforms`) are looked up by
content in a per-device cache and uploaded only on a miss: the same bytes give the same device
pointer and neither allocation nor copy. Uploads are ordered on the launching stream; a hit from
another stream before the upload is known complete waits on an event. The cache is bounded:
when full, the device is synchronised and the cache emptied (its memory is reused, never freed
one entry at a time), unless a live CUDA graph may hold pointers into it.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from khal_runtime.backends.cuda.driver import check, driver
from khal_runtime.capture_state import forbid_in_capture
from khal_runtime.device import ensure_current
from khal_runtime.memo import bump_epoch

__all__ = ["MAX_ENTRIES", "UniformCache", "Upload", "cache_for"]

_ALIGN = 256
_SLAB = 64 * 1024
#: Entries kept per device before the cache is flushed.
MAX_ENTRIES = 4096


class Upload:
    """One cached struct: its device pointer and, while the copy may still be in flight, the
    event recorded after it, the stream it was made on and the host bytes it copies from."""

    __slots__ = ("ptr", "pending", "stream", "host")

    def __init__(self, ptr: int, pending: Any, stream: int, host: Any) -> None:
        self.ptr = ptr
        self.pending = pending
        self.stream = stream
        self.host = host

    def settled(self) -> None:
        self.pending = None
        self.host = None


class UniformCache:
    """Per-device, content-addressed cache of uploaded uniform structs."""

    def __init__(self, device_id: int, max_entries: int = MAX_ENTRIES) -> None:
        self.device_id = device_id
        self.max_entries = max_entries
        #: bytes -> its upload (read lock-free by the launch path: ``e.ptr`` once ``e.pending``
        #: is None)
        self.entries: dict[bytes, Upload] = {}
        self._slabs: list[Any] = []
        self._slab_index = 0
        self._offset = _SLAB
        self._lock = threading.Lock()
        self.uploads = 0
        #: live CUDA graphs of this device (backends/cuda/graphs.py): while > 0 slab memory is never reused
        self.pins = 0
        #: refuse new uploads while capturing (graphs.py); a test may turn it off
        self._capture_guard = True

    def _alloc(self, nbytes: int) -> int:
        size = (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        drv = driver()
        if size > _SLAB:
            dptr = check(drv.cuMemAlloc(size), "cuMemAlloc")
            self._slabs.append(dptr)  # a dedicated slab, kept until close()
            return int(dptr)
        if self._offset + size > _SLAB:
            self._slab_index += 1
            while self._slab_index < len(self._slabs) and int(self._slabs[self._slab_index]) == 0:
                self._slab_index += 1
            if self._slab_index >= len(self._slabs):
                self._slabs.append(check(drv.cuMemAlloc(_SLAB), "cuMemAlloc"))
                self._slab_index = len(self._slabs) - 1
            self._offset = 0
        ptr = int(self._slabs[self._slab_index]) + self._offset
        self._offset += size
        return ptr

    def _flush(self) -> None:
        drv = driver()
        check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
        bump_epoch()  # packed argument blocks may point at entries that are about to be reused
        for e in self.entries.values():
            if e.pending is not None:
                drv.cuEventDestroy(e.pending)
        self.entries.clear()
        if self.pins:
            return  # a live CUDA graph may hold pointers into the slabs: never rewrite them
        self._slab_index = 0
        self._offset = 0 if self._slabs else _SLAB

    def settle(self) -> None:
        """Wait for every upload still in flight (before a graph capture begins, so that no
        captured launch has to wait on an upload event)."""
        drv = driver()
        with self._lock:
            for e in self.entries.values():
                if e.pending is not None:
                    check(drv.cuEventSynchronize(e.pending), "cuEventSynchronize")
                    drv.cuEventDestroy(e.pending)
                    e.settled()

    def fetch(self, data: bytes, stream: Any) -> int:
        """Device pointer holding ``data`` (slow path: upload or cross-stream wait)."""
        drv = driver()
        ensure_current(self.device_id)
        with self._lock:
            e = self.entries.get(data)
            if e is None:
                if self._capture_guard:
                    _refuse_in_capture(stream)
                if len(self.entries) >= self.max_entries:
                    self._flush()
                ptr = self._alloc(len(data))
                buf = ctypes.create_string_buffer(data, len(data))
                check(drv.cuMemcpyHtoDAsync(ptr, ctypes.addressof(buf), len(data), stream.native),
                      "cuMemcpyHtoDAsync")
                ev = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
                check(drv.cuEventRecord(ev, stream.native), "cuEventRecord")
                self.entries[bytes(data)] = Upload(ptr, ev, stream.handle, buf)
                self.uploads += 1
                return ptr
            ev = e.pending
            if ev is not None:
                if not drv.cuEventQuery(ev)[0]:
                    drv.cuEventDestroy(ev)
                    e.settled()
                elif e.stream != stream.handle:
                    check(drv.cuStreamWaitEvent(stream.native, ev, 0), "cuStreamWaitEvent")
            return int(e.ptr)

    def close(self) -> None:
        drv = driver()
        with self._lock:
            self._flush()
            for s in self._slabs:
                drv.cuMemFree(s)
            self._slabs.clear()


def _refuse_in_capture(stream: Any) -> None:
    forbid_in_capture(
        "a uniform struct with contents not uploaded yet was passed",
        "uploading it would allocate and copy from host memory inside the graph. Launch once "
        "with the same uniform values before capture (a warm-up step caches them), or pass a "
        "device buffer holding the struct",
        stream,
    )


_caches: dict[int, UniformCache] = {}
_caches_lock = threading.Lock()


def cache_for(device_id: int) -> UniformCache:
    c = _caches.get(device_id)
    if c is None:
        with _caches_lock:
            c = _caches.setdefault(device_id, UniformCache(device_id))
    return c
