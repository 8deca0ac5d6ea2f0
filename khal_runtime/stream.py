"""Streams: the runtime's owned non-blocking stream per device, and foreign ones.

Accepted wherever a ``stream=`` is taken: :class:`Stream`, any object with
``__cuda_stream__`` (returns ``(version, handle)``), PyTorch and CuPy streams,
or a raw integer ``CUstream`` handle. The legacy NULL stream is never used
unless passed explicitly (``0``).
"""

from __future__ import annotations

import threading
from typing import Any

from khal_runtime import _cuda
from khal_runtime._cuda import check
from khal_runtime.device import Device, _tls, current_device_id, ensure_current

__all__ = ["Stream", "as_stream", "default_stream"]

_LEGACY_HANDLES = (0, 1, 2)  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
_cache_lock = threading.Lock()
_foreign: dict[tuple[type, int], Stream] = {}
_FOREIGN_MAX = 256


class Stream:
    """A CUDA stream bound to one device."""

    __slots__ = ("device_id", "handle", "_cu", "_owned", "_keep", "__weakref__")

    device_id: int
    handle: int
    _cu: Any  # cuda.bindings CUstream: what cuLaunchKernel takes fastest
    _owned: bool
    _keep: Any

    def __init__(self, handle: int, device_id: int, *, keep: Any = None, owned: bool = False):
        self.handle = int(handle)
        self.device_id = int(device_id)
        self._cu = _cuda.driver().CUstream(self.handle)
        self._owned = owned
        self._keep = keep

    @classmethod
    def _create_owned(cls, device: Device) -> Stream:
        drv = _cuda.driver()
        ensure_current(device.device_id)
        flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        cu = check(drv.cuStreamCreate(flags), "cuStreamCreate")
        s = cls(int(cu), device.device_id, owned=True)
        s._cu = cu
        return s

    @classmethod
    def create(cls, device: Device | int | None = None) -> Stream:
        """A new non-blocking stream owned by the caller (destroyed with :meth:`close`)."""
        if device is None:
            device = current_device_id()
        dev = device if isinstance(device, Device) else Device(int(device))
        return cls._create_owned(dev)

    @property
    def device(self) -> Device:
        return Device(self.device_id)

    def synchronize(self) -> None:
        from khal_runtime.graphs import forbid_in_capture

        forbid_in_capture("Stream.synchronize()", "a host synchronisation cannot be captured; "
                          "synchronise after end_capture() (or after graph.launch())", self)
        ensure_current(self.device_id)
        check(_cuda.driver().cuStreamSynchronize(self._cu), "cuStreamSynchronize")

    def is_capturing(self) -> bool:
        """Whether a CUDA graph capture is in progress on this stream (seam for graphs.py)."""
        drv = _cuda.driver()
        status = check(drv.cuStreamIsCapturing(self._cu), "cuStreamIsCapturing")
        return bool(status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)

    # -- graph capture (khal_runtime.graphs) ------------------------------------------------------
    def begin_capture(self, mode: str = "thread_local", label: str | None = None) -> Any:
        """Start capturing this stream into a CUDA graph (``cuStreamBeginCapture``)."""
        from khal_runtime.graphs import begin_capture

        return begin_capture(self, mode=mode, label=label)

    def end_capture(self) -> Any:
        """End the capture: the instantiated :class:`khal_runtime.graphs.Graph`."""
        from khal_runtime.graphs import end_capture

        return end_capture(self)

    def capture(self, mode: str = "thread_local", label: str | None = None) -> Any:
        """``with stream.capture() as cap: ...`` then ``cap.graph``."""
        from khal_runtime.graphs import capture

        return capture(self, mode=mode, label=label)

    def wait_event(self, event: Any) -> None:
        check(_cuda.driver().cuStreamWaitEvent(self._cu, event, 0), "cuStreamWaitEvent")

    def close(self) -> None:
        """Destroy a stream made by :meth:`create` (no-op for borrowed ones)."""
        if self._owned and self.handle:
            ensure_current(self.device_id)
            check(_cuda.driver().cuStreamDestroy(self._cu), "cuStreamDestroy")
            self.handle = 0

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def __int__(self) -> int:
        return self.handle

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.handle == self.handle

    def __hash__(self) -> int:
        return hash(self.handle)

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "borrowed"
        return f"<Stream 0x{self.handle:x} device={self.device_id} {kind}>"


def default_stream() -> Stream:
    """The owned stream of this thread's current device."""
    try:
        return _tls.stream  # type: ignore[no-any-return]
    except AttributeError:
        s = Device(current_device_id()).default_stream
        ensure_current(s.device_id)
        _tls.stream = s
        return s


def _device_of_handle(handle: int) -> int:
    if handle in _LEGACY_HANDLES:
        return current_device_id()
    drv = _cuda.driver()
    cu = drv.CUstream(handle)
    if hasattr(drv, "cuStreamGetDevice"):
        res = drv.cuStreamGetDevice(cu)
        if not res[0]:
            return _ordinal_of(res[1])
    ctx = check(drv.cuStreamGetCtx(cu), "cuStreamGetCtx")
    check(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        dev = check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
    finally:
        check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")
    return _ordinal_of(dev)


def _ordinal_of(cudevice: Any) -> int:
    # A CUdevice handle is its ordinal.
    return int(cudevice)


def _foreign_handle(obj: Any) -> tuple[int, int | None]:
    """(handle, device ordinal or None) of a foreign stream object."""
    proto = getattr(type(obj), "__cuda_stream__", None)
    if proto is not None:
        ver_handle = obj.__cuda_stream__()
        return int(ver_handle[1]), None
    mod = type(obj).__module__
    if mod.startswith("torch"):
        return int(obj.cuda_stream), int(obj.device_index)
    if mod.startswith("cupy"):
        dev = getattr(obj, "device_id", None)
        return int(obj.ptr), (int(dev) if dev is not None and dev >= 0 else None)
    for attr in ("handle", "ptr", "cuda_stream"):
        v = getattr(obj, attr, None)
        if isinstance(v, int):
            return v, None
    raise TypeError(
        f"stream: expected a khal_runtime.Stream, an object with __cuda_stream__, a "
        f"torch/cupy stream or an int CUstream handle, got {type(obj).__name__}"
    )


def as_stream(obj: Any) -> Stream:
    """Coerce a stream-like object to a :class:`Stream` (None -> default stream)."""
    if obj is None:
        return default_stream()
    if type(obj) is Stream:
        return obj
    if isinstance(obj, Stream):
        return obj
    if isinstance(obj, bool):
        raise TypeError("stream: expected a stream, got a bool")
    if isinstance(obj, int):
        handle, dev = obj, None
    else:
        handle, dev = _foreign_handle(obj)
    key = (type(obj), handle)
    s = _foreign.get(key)
    if s is not None and (dev is None or s.device_id == dev):
        if not isinstance(obj, int):
            s._keep = obj
        return s
    if dev is None:
        dev = _device_of_handle(handle)
    s = Stream(handle, dev, keep=None if isinstance(obj, int) else obj)
    if handle in _LEGACY_HANDLES:  # per-thread meaning: not cached
        return s
    with _cache_lock:
        if len(_foreign) >= _FOREIGN_MAX:
            _foreign.clear()
        _foreign[key] = s
    return s
