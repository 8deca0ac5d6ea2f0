"""Uniform arguments: host structs uploaded once through a content-addressed cache.

A uniform parameter receives a device pointer to a struct of ``element_size``
bytes. Host values (ctypes Structure, NumPy structured scalar / 0-d array,
``bytes``) are turned into bytes, looked up by content in a per-device cache,
and uploaded only on a miss: the same bytes give the same device pointer and
neither allocation nor copy. Uploads are ordered on the launching stream; a
hit from another stream before the upload is known complete waits on an
event. The cache is bounded: when full, the device is synchronised and the
cache emptied (its memory is reused, never freed one entry at a time).

A device buffer already holding the struct is passed through as its pointer.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

from khal_runtime import _cuda
from khal_runtime._cuda import check
from khal_runtime.buffers import BadArgument, bump_epoch, extract
from khal_runtime.dtypes import dtype_info
from khal_runtime.errors import ArgumentError

__all__ = ["UniformCache", "uniform_converter", "to_uniform"]

_ALIGN = 256
_SLAB = 64 * 1024
#: Entries kept per device before the cache is flushed.
MAX_ENTRIES = 4096


class UniformCache:
    """Per-device, content-addressed cache of uploaded uniform structs."""

    def __init__(self, device_id: int, max_entries: int = MAX_ENTRIES) -> None:
        self.device_id = device_id
        self.max_entries = max_entries
        #: bytes -> [device pointer, pending event or None, upload stream handle]
        self.entries: dict[bytes, list[Any]] = {}
        self._slabs: list[Any] = []
        self._slab_index = 0
        self._offset = _SLAB
        self._lock = threading.Lock()
        self.uploads = 0
        #: live CUDA graphs of this device (graphs.py): while > 0 slab memory is never reused
        self.pins = 0
        #: refuse new uploads while capturing (graphs.py); a test may turn it off
        self._capture_guard = True

    def _alloc(self, nbytes: int) -> int:
        size = (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        drv = _cuda.driver()
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
        drv = _cuda.driver()
        check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
        bump_epoch()  # packed argument blocks may point at entries that are about to be reused
        for e in self.entries.values():
            if e[1] is not None:
                drv.cuEventDestroy(e[1])
        self.entries.clear()
        if self.pins:
            return  # a live CUDA graph may hold pointers into the slabs: never rewrite them
        self._slab_index = 0
        self._offset = 0 if self._slabs else _SLAB

    def settle(self) -> None:
        """Wait for every upload still in flight (before a graph capture begins, so that no
        captured launch has to wait on an upload event)."""
        drv = _cuda.driver()
        with self._lock:
            for e in self.entries.values():
                if e[1] is not None:
                    check(drv.cuEventSynchronize(e[1]), "cuEventSynchronize")
                    drv.cuEventDestroy(e[1])
                    e[1] = None
                    e[3] = None

    def fetch(self, data: bytes, stream: Any) -> int:
        """Device pointer holding ``data`` (slow path: upload or cross-stream wait)."""
        from khal_runtime.device import ensure_current

        drv = _cuda.driver()
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
                check(drv.cuMemcpyHtoDAsync(ptr, ctypes.addressof(buf), len(data), stream._cu),
                      "cuMemcpyHtoDAsync")
                ev = check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
                check(drv.cuEventRecord(ev, stream._cu), "cuEventRecord")
                self.entries[bytes(data)] = [ptr, ev, stream.handle, buf]
                self.uploads += 1
                return ptr
            ev = e[1]
            if ev is not None:
                if not drv.cuEventQuery(ev)[0]:
                    drv.cuEventDestroy(ev)
                    e[1] = None
                    e[3] = None
                elif e[2] != stream.handle:
                    check(drv.cuStreamWaitEvent(stream._cu, ev, 0), "cuStreamWaitEvent")
            return int(e[0])

    def close(self) -> None:
        drv = _cuda.driver()
        with self._lock:
            self._flush()
            for s in self._slabs:
                drv.cuMemFree(s)
            self._slabs.clear()


def _refuse_in_capture(stream: Any) -> None:
    from khal_runtime.graphs import forbid_in_capture

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


# ---------------------------------------------------------------------------------------------
# Converters: obj -> bytes (host struct) or (device pointer, nbytes) (device buffer)
# ---------------------------------------------------------------------------------------------
UniformConverter = Callable[[Any], "bytes | tuple[int, int]"]


def _c_bytes(obj: Any) -> bytes:
    return obj


def _c_buffer(obj: Any) -> bytes:
    return bytes(obj)


def _c_ctypes(obj: Any) -> bytes:
    return bytes(obj)  # buffer protocol: sizeof(obj) bytes


def _c_numpy(obj: Any) -> bytes:
    if getattr(obj, "ndim", 0) and obj.size != 1:
        raise BadArgument(ArgumentError, f"is a NumPy array of {obj.size} elements; a uniform is one struct")
    return obj.tobytes()


def _c_device(obj: Any) -> tuple[int, int]:
    ptr, count, key = extract(obj)
    _, itemsize = dtype_info(key)
    return ptr, count * itemsize


_CONVERTERS: dict[type, UniformConverter] = {bytes: _c_bytes, bytearray: _c_buffer, memoryview: _c_buffer}


def _choose(obj: Any) -> UniformConverter:
    import sys

    if isinstance(obj, (ctypes.Structure, ctypes.Union, ctypes.Array)):
        return _c_ctypes
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, (np.void, np.generic)):
        return _c_numpy
    if np is not None and isinstance(obj, np.ndarray):
        return _c_numpy
    tp = type(obj)
    if (isinstance(obj, _device_types()) or hasattr(tp, "__cuda_array_interface__")
            or hasattr(tp, "__dlpack_device__")
            or (tp.__module__ or "").startswith(("torch", "cupy"))):
        return _c_device
    raise BadArgument(
        ArgumentError,
        f"expected a uniform struct (ctypes Structure, NumPy structured scalar, bytes, or a "
        f"device buffer holding it), got {tp.__module__}.{tp.__qualname__}",
    )


def _device_types() -> tuple[type, ...]:
    from khal_runtime.buffers import DeviceBuffer

    return (DeviceBuffer,)


def uniform_converter(obj: Any) -> UniformConverter:
    fn = _CONVERTERS.get(type(obj))
    if fn is None:
        fn = _choose(obj)
        _CONVERTERS[type(obj)] = fn
    return fn


def to_uniform(obj: Any) -> bytes | tuple[int, int]:
    return uniform_converter(obj)(obj)
