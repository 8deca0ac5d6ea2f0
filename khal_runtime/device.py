"""Devices, their primary contexts, and which one is current in each thread."""

from __future__ import annotations

import threading
from typing import Any

from khal_runtime import _cuda
from khal_runtime._cuda import check

__all__ = ["Device", "current_device_id", "ensure_current", "ready_stream"]

_lock = threading.Lock()
_devices: dict[int, Device] = {}
#: Per thread: ``dev`` = device whose primary context this thread made current,
#: ``default`` = the device plain calls use (Device(i).use()), ``stream`` = the owned stream
#: plain calls launch on, ``ready`` = that stream while its device's context is the one
#: current here (one read tells the launch path both; see :func:`ready_stream`).
_tls = threading.local()


class Device:
    """A CUDA device (``Device(0)``); one shared instance per ordinal.

    Holds the retained primary context (shared with PyTorch/CuPy) and the runtime's
    owned non-blocking stream (:attr:`default_stream`)."""

    _ordinal: int
    _handle: Any
    _ctx: Any
    _stream: Any
    _cc: tuple[int, int] | None
    _attr_cache: dict[str, Any]

    def __new__(cls, ordinal: int = 0) -> Device:
        ordinal = int(ordinal)
        dev = _devices.get(ordinal)
        if dev is not None:
            return dev
        with _lock:
            dev = _devices.get(ordinal)
            if dev is None:
                st = _cuda.require_cuda()
                if not 0 <= ordinal < st.device_count:
                    raise ValueError(
                        f"Device({ordinal}): there are {st.device_count} CUDA device(s)"
                    )
                drv = _cuda.driver()
                dev = super().__new__(cls)
                dev._ordinal = ordinal
                dev._handle = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
                dev._ctx = check(drv.cuDevicePrimaryCtxRetain(dev._handle), "cuDevicePrimaryCtxRetain")
                dev._stream = None
                dev._cc = None
                dev._attr_cache = {}
                _devices[ordinal] = dev
        return dev

    def __init__(self, ordinal: int = 0) -> None:  # state set in __new__
        pass

    @staticmethod
    def count() -> int:
        return _cuda.require_cuda().device_count

    @property
    def device_id(self) -> int:
        return self._ordinal

    @property
    def handle(self) -> Any:
        """The ``CUdevice``."""
        return self._handle

    @property
    def context(self) -> Any:
        """The retained primary ``CUcontext``."""
        return self._ctx

    def _attr(self, name: str) -> int:
        v = self._attr_cache.get(name)
        if v is None:
            drv = _cuda.driver()
            attr = getattr(drv.CUdevice_attribute, name)
            v = int(check(drv.cuDeviceGetAttribute(attr, self._handle), "cuDeviceGetAttribute"))
            self._attr_cache[name] = v
        return v

    def compute_capability(self) -> tuple[int, int]:
        if self._cc is None:
            self._cc = (
                self._attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                self._attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"),
            )
        return self._cc

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability()
        return f"sm_{major}{minor}"

    @property
    def name(self) -> str:
        raw = check(_cuda.driver().cuDeviceGetName(256, self._handle), "cuDeviceGetName")
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")

    @property
    def sm_count(self) -> int:
        return self._attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")

    def set_current(self) -> None:
        """Make this device's primary context current in the calling thread."""
        ensure_current(self._ordinal)

    def use(self) -> Device:
        """Make this the device of plain calls (no ``stream=``) in the calling thread."""
        _tls.default = self._ordinal
        _tls.__dict__.pop("stream", None)
        _tls.__dict__.pop("ready", None)
        ensure_current(self._ordinal)
        return self

    @property
    def default_stream(self) -> Any:
        """The runtime's owned non-blocking stream on this device (never the NULL stream)."""
        s = self._stream
        if s is None:
            from khal_runtime.stream import Stream

            with _lock:
                if self._stream is None:
                    self._stream = Stream._create_owned(self)
                s = self._stream
        return s

    def synchronize(self) -> None:
        from khal_runtime.graphs import forbid_in_capture

        forbid_in_capture("Device.synchronize()", "a host synchronisation cannot be captured; "
                          "synchronise after end_capture()")
        ensure_current(self._ordinal)
        check(_cuda.driver().cuCtxSynchronize(), "cuCtxSynchronize")

    def __repr__(self) -> str:
        return f"<Device {self._ordinal}>"

    def __reduce__(self) -> Any:
        return (Device, (self._ordinal,))


def current_device_id() -> int:
    """The device plain calls use in this thread (0 unless Device(i).use())."""
    return getattr(_tls, "default", 0)


def ensure_current(ordinal: int) -> None:
    """Make the device's primary context current if this thread has not already."""
    if getattr(_tls, "dev", -1) != ordinal:
        dev = Device(ordinal)
        d = _tls.__dict__
        d.pop("ready", None)
        check(_cuda.driver().cuCtxSetCurrent(dev._ctx), "cuCtxSetCurrent")
        _tls.dev = ordinal
        s = d.get("stream")
        if s is not None and s.device_id == ordinal:
            d["ready"] = s


def ready_stream() -> Any:
    """This thread's owned stream for plain calls, with its device's context made current
    here; afterwards ``_tls.ready`` holds it until the thread's current device changes."""
    from khal_runtime.stream import default_stream

    s = default_stream()
    ensure_current(s.device_id)
    _tls.ready = s
    return s
