"""Devices and streams, and which device is current in each thread.

:class:`Device` (``Device(0)``) and :class:`Stream` are the same objects on every backend; what
they do is the backend's (:mod:`khal_runtime.backends`). On CUDA a device holds its retained
primary context (shared with PyTorch / CuPy) and the runtime's owned non-blocking stream; on
WebGPU a device is an adapter's device and its stream is the device's queue, recorded into in
order.

``stream=`` takes a :class:`Stream`, any object with ``__cuda_stream__`` (cuda.core), PyTorch
and CuPy streams (and those of libraries registered with their ``stream`` hook:
:mod:`khal_runtime.interop`), or a raw integer ``CUstream`` handle. The legacy NULL stream is never used
unless passed explicitly (``0``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from khal_runtime import backends
from khal_runtime.capture_state import forbid_in_capture
from khal_runtime.interop.registry import STREAM_READERS, STREAM_TYPE_READERS

__all__ = [
    "Device",
    "Stream",
    "as_stream",
    "current_device_id",
    "default_stream",
    "ensure_current",
    "is_torch_tensor",
    "ready_stream",
    "torch_stream",
]

_lock = threading.Lock()
_devices: dict[tuple[str, int], Device] = {}
#: Per thread: ``dev`` = device whose context this thread made current, ``default`` = the
#: device plain calls use (Device(i).use()), ``stream`` = the owned stream plain calls launch
#: on, ``ready`` = that stream while its device's context is the one current here (one read
#: tells the launch path both; see :func:`ready_stream`).
_tls = threading.local()


class Device:
    """A device of the process's backend (``Device(0)``); one shared instance per ordinal."""

    _ordinal: int
    backend_impl: backends.Backend
    _impl: Any
    _stream: Stream | None

    def __new__(cls, ordinal: int = 0) -> Device:
        ordinal = int(ordinal)
        bk = backends.current()
        key = (bk.name, ordinal)
        dev = _devices.get(key)
        if dev is not None:
            return dev
        with _lock:
            dev = _devices.get(key)
            if dev is None:
                count = bk.status().device_count
                if not 0 <= ordinal < count:
                    raise ValueError(f"Device({ordinal}): there are {count} {bk.name.upper()} device(s)")
                dev = super().__new__(cls)
                dev._ordinal = ordinal
                dev.backend_impl = bk
                dev._impl = bk.open_device(ordinal)
                dev._stream = None
                _devices[key] = dev
        return dev

    def __init__(self, ordinal: int = 0) -> None:  # state set in __new__
        pass

    @staticmethod
    def count() -> int:
        return int(backends.current().status().device_count)

    @property
    def device_id(self) -> int:
        return self._ordinal

    @property
    def backend(self) -> str:
        """``"cuda"`` or ``"webgpu"``."""
        return str(self.backend_impl.name)

    @property
    def handle(self) -> Any:
        """The backend's device (a ``CUdevice`` on CUDA)."""
        return self._impl.handle

    @property
    def context(self) -> Any:
        """The retained primary ``CUcontext`` (CUDA)."""
        return self._impl.context

    def compute_capability(self) -> tuple[int, int]:
        """(major, minor) of a CUDA device."""
        return self._impl.compute_capability()  # type: ignore[no-any-return]

    @property
    def arch(self) -> str:
        return str(self._impl.arch)

    @property
    def name(self) -> str:
        return str(self._impl.name)

    @property
    def sm_count(self) -> int:
        return int(self._impl.sm_count)

    def set_current(self) -> None:
        """Make this device's context current in the calling thread."""
        ensure_current(self._ordinal)

    def use(self) -> Device:
        """Make this the device of plain calls (no ``stream=``) in the calling thread."""
        _tls.default = self._ordinal
        _tls.__dict__.pop("stream", None)
        _tls.__dict__.pop("ready", None)
        ensure_current(self._ordinal)
        return self

    @property
    def default_stream(self) -> Stream:
        """The runtime's owned stream on this device (on CUDA non-blocking, never the NULL stream)."""
        s = self._stream
        if s is None:
            with _lock:
                if self._stream is None:
                    self._stream = self.backend_impl.create_stream(self)
                s = self._stream
        return s

    def synchronize(self) -> None:
        forbid_in_capture("Device.synchronize()", "a host synchronisation cannot be captured; "
                          "synchronise after end_capture()")
        ensure_current(self._ordinal)
        self.backend_impl.synchronize_device(self)

    def __repr__(self) -> str:
        return f"<Device {self._ordinal} ({self.backend_impl.name})>"

    def __reduce__(self) -> Any:
        return (Device, (self._ordinal,))


class Stream:
    """A stream of work bound to one device (a CUDA stream; on WebGPU the device's queue)."""

    __slots__ = ("device_id", "handle", "native", "_owned", "_keep", "backend_impl", "__weakref__")

    device_id: int
    handle: int
    #: the backend's own stream object: what a launch passes (a cuda-bindings ``CUstream``)
    native: Any
    _owned: bool
    _keep: Any
    backend_impl: backends.Backend

    def __init__(self, handle: int, device_id: int, *, keep: Any = None, owned: bool = False,
                 native: Any = None, backend: Any = None) -> None:
        self.backend_impl = backend if backend is not None else backends.current()
        self.handle = int(handle)
        self.device_id = int(device_id)
        self.native = native if native is not None else self.backend_impl.native_stream(self.handle)
        self._owned = owned
        self._keep = keep

    @classmethod
    def create(cls, device: Device | int | None = None) -> Stream:
        """A new stream owned by the caller (destroyed with :meth:`close`)."""
        if device is None:
            device = current_device_id()
        dev = device if isinstance(device, Device) else Device(int(device))
        return dev.backend_impl.create_stream(dev)

    @property
    def device(self) -> Device:
        return Device(self.device_id)

    @property
    def backend(self) -> str:
        return str(self.backend_impl.name)

    def synchronize(self) -> None:
        forbid_in_capture("Stream.synchronize()", "a host synchronisation cannot be captured; "
                          "synchronise after end_capture() (or after graph.launch())", self)
        ensure_current(self.device_id)
        self.backend_impl.synchronize(self)

    def is_capturing(self) -> bool:
        """Whether a graph capture is in progress on this stream."""
        return bool(self.backend_impl.is_capturing(self))

    # -- graph capture (khal_runtime.graphs) ------------------------------------------------------
    def begin_capture(self, mode: str = "thread_local", label: str | None = None) -> Any:
        """Start capturing this stream's launches into a graph."""
        return self.backend_impl.capture(self, mode=mode, label=label, keep=None).begin()

    def end_capture(self) -> Any:
        """End the capture: the instantiated :class:`khal_runtime.graphs.Graph`."""
        return self.backend_impl.end_capture(self)

    def capture(self, mode: str = "thread_local", label: str | None = None) -> Any:
        """``with stream.capture() as cap: ...`` then ``cap.graph``."""
        return self.backend_impl.capture(self, mode=mode, label=label, keep=None)

    def wait_event(self, event: Any) -> None:
        self.backend_impl.wait_event(self, event)

    def close(self) -> None:
        """Destroy a stream made by :meth:`create` (no-op for borrowed ones)."""
        if self._owned and self.handle:
            ensure_current(self.device_id)
            self.backend_impl.destroy_stream(self)
            self.handle = 0

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def __int__(self) -> int:
        return self.handle

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.handle == self.handle and other.backend_impl is self.backend_impl

    def __hash__(self) -> int:
        return hash(self.handle)

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "borrowed"
        return f"<Stream 0x{self.handle:x} device={self.device_id} {kind}>"


# ---------------------------------------------------------------------------------------------
# this thread's device and stream
# ---------------------------------------------------------------------------------------------
def current_device_id() -> int:
    """The device plain calls use in this thread (0 unless Device(i).use())."""
    return getattr(_tls, "default", 0)


def ensure_current(ordinal: int) -> None:
    """Make the device's context current if this thread has not already."""
    if getattr(_tls, "dev", -1) != ordinal:
        dev = Device(ordinal)
        d = _tls.__dict__
        d.pop("ready", None)
        dev.backend_impl.make_current(dev)
        _tls.dev = ordinal
        s = d.get("stream")
        if s is not None and s.device_id == ordinal:
            d["ready"] = s


def default_stream() -> Stream:
    """The owned stream of this thread's current device."""
    s: Stream | None = _tls.__dict__.get("stream")
    if s is None:  # made outside any except block: its errors (no GPU) come unchained
        s = Device(current_device_id()).default_stream
        ensure_current(s.device_id)
        _tls.stream = s
    return s


def ready_stream() -> Stream:
    """This thread's owned stream for plain calls, with its device's context made current
    here; afterwards ``_tls.ready`` holds it until the thread's current device changes."""
    s = default_stream()
    ensure_current(s.device_id)
    _tls.ready = s
    return s


_cache_lock = threading.Lock()
_foreign: dict[tuple[type, int], Stream] = {}
_FOREIGN_MAX = 256


def _protocol_handle(obj: Any) -> tuple[int, int | None]:
    return int(obj.__cuda_stream__()[1]), None


def _stream_reader(obj: Any) -> Callable[[Any], tuple[int, int | None] | None]:
    """How to read (handle, device ordinal or None) of a foreign stream object of ``obj``'s
    type: the ``__cuda_stream__`` protocol, a registered library's reader (torch, CuPy, ...), or
    a ``handle`` / ``ptr`` / ``cuda_stream`` int attribute."""
    if getattr(type(obj), "__cuda_stream__", None) is not None:
        return _protocol_handle
    for reader in STREAM_READERS:  # the array libraries' streams (torch, CuPy, registered ones)
        if reader(obj) is not None:
            return reader
    for attr in ("handle", "ptr", "cuda_stream"):
        if isinstance(getattr(obj, attr, None), int):
            def by_attribute(o: Any, attr: str = attr) -> tuple[int, int | None] | None:
                v = getattr(o, attr, None)
                return (v, None) if isinstance(v, int) else None
            return by_attribute
    raise TypeError(
        f"stream: expected a khal_runtime.Stream, an object with __cuda_stream__, a "
        f"torch/cupy stream or an int CUstream handle, got {type(obj).__name__}"
    )


def _foreign_handle(obj: Any) -> tuple[int, int | None]:
    """(handle, device ordinal or None) of a foreign stream object."""
    got = _stream_reader(obj)(obj)
    assert got is not None
    return got


#: per foreign stream type, the reader that read one (:func:`_stream_reader`): :func:`as_stream`
#: asks it first (a torch stream from ``torch.cuda.current_stream()`` is a new object on every
#: call; probing every route for it cost more than the launch's own checks); the registry
#: empties it when a library adds a reader
_readers = STREAM_TYPE_READERS


def as_stream(obj: Any) -> Stream:
    """Coerce a stream-like object to a :class:`Stream` (None -> this thread's default stream)."""
    if obj is None:
        return default_stream()
    tp = type(obj)
    if tp is Stream:
        return obj  # type: ignore[no-any-return]  # (its type is Stream: no isinstance needed)
    read = _readers.get(tp)
    got = read(obj) if read is not None else None
    if got is not None:
        s = _foreign.get((tp, got[0]))
        if s is not None and (got[1] is None or s.device_id == got[1]):
            s._keep = obj
            return s
    if isinstance(obj, Stream):
        return obj
    if isinstance(obj, bool):
        raise TypeError("stream: expected a stream, got a bool")
    if isinstance(obj, int):
        handle, dev = obj, None
    else:
        if got is None:
            read = _stream_reader(obj)
            got = read(obj)
            assert got is not None
            if len(_readers) < _FOREIGN_MAX:
                _readers[tp] = read
        handle, dev = got
    key = (type(obj), handle)
    s = _foreign.get(key)
    if s is not None and (dev is None or s.device_id == dev):
        if not isinstance(obj, int):
            s._keep = obj
        return s
    bk = backends.current()
    if dev is None:
        dev = current_device_id() if bk.is_legacy_stream(handle) else bk.stream_device(handle)
    s = Stream(handle, dev, keep=None if isinstance(obj, int) else obj, backend=bk)
    if bk.is_legacy_stream(handle):  # per-thread meaning: not cached
        return s
    with _cache_lock:
        if len(_foreign) >= _FOREIGN_MAX:
            _foreign.clear()
        _foreign[key] = s
    return s


# ---------------------------------------------------------------------------------------------
# PyTorch's current stream, for launches given torch tensors and no ``stream=``
# ---------------------------------------------------------------------------------------------
#: the tensor types :func:`torch_stream` reads (PyTorch's, learnt by :func:`is_torch_tensor`): a
#: launch with one of them and no ``stream=`` runs on PyTorch's current stream of its device, as
#: Triton's launcher does
TORCH_TENSOR_TYPES: set[type] = set()
#: ``torch._C._cuda_getCurrentRawStream`` (device -> its current CUstream handle), read once; False
#: where torch cannot be imported
_torch_raw: Any = None
#: ``handle << 8 | device`` -> the runtime's Stream for PyTorch's stream (the same object for the
#: same stream: launches stay on their fast paths)
_torch_streams: dict[int, Stream] = {}
_TORCH_STREAMS_MAX = 64


def _torch_raw_reader() -> Any:
    global _torch_raw
    raw = _torch_raw
    if raw is None:
        try:
            import torch  # lazy: only for a torch tensor's launch; importing khal_runtime never imports torch
        except ImportError:
            raw = False
        else:
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            if raw is None:
                def raw(device: int) -> int:
                    return int(torch.cuda.current_stream(device).cuda_stream)
        _torch_raw = raw
    return raw


def is_torch_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a PyTorch tensor (its type learnt into :data:`TORCH_TENSOR_TYPES`): of a
    ``torch`` module, with ``data_ptr`` and ``get_device``, torch importable."""
    t = type(obj)
    if t in TORCH_TENSOR_TYPES:
        return True
    if not (getattr(t, "__module__", "") or "").startswith("torch") or not callable(getattr(obj, "get_device", None)) \
            or not callable(getattr(obj, "data_ptr", None)) or not _torch_raw_reader():
        return False
    TORCH_TENSOR_TYPES.add(t)
    return True


def torch_stream(tensor: Any) -> Stream | None:
    """PyTorch's current stream of ``tensor``'s device (``torch.cuda.current_stream(device)``) as
    a :class:`Stream` (one object per stream), None for a tensor not on a CUDA device or where
    torch cannot be read."""
    raw = _torch_raw if _torch_raw is not None else _torch_raw_reader()
    if not raw:
        return None
    dev = tensor.get_device()
    if dev < 0:
        return None
    h = int(raw(dev))
    key = h << 8 | dev
    s = _torch_streams.get(key)
    if s is None:
        s = Stream(h, dev, backend=backends.current())
        if len(_torch_streams) >= _TORCH_STREAMS_MAX:
            _torch_streams.clear()
        _torch_streams[key] = s
    return s
