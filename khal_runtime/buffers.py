"""Device memory: :class:`DeviceBuffer`, the same class on every backend.

A DeviceBuffer is a contiguous 1-D array of ``count`` elements of one NumPy dtype in one
device's memory; ``buf[a:b]`` is a view (its own pointer and element count) that keeps the
allocation alive. On CUDA ``ptr`` is the device address; on WebGPU it is an address in a
per-process range the backend hands out, so that slicing and identity work the same way
(``ptr - root.ptr`` is the byte offset into the wgpu buffer).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Hashable

from khal_runtime import backends, capture_state, interop
from khal_runtime.device import Device, Stream, as_stream, current_device_id, ensure_current
from khal_runtime.dtypes import byte_order_problem, element_type_of_numpy
from khal_runtime.errors import ArgumentError, ArgumentValueError
from khal_runtime.launch_hooks import alloc_trace_on, trace_alloc
from khal_runtime.memo import bump_epoch

__all__ = ["FREED", "DeviceBuffer"]

FREED = "<freed buffer>"


def _numpy() -> Any:
    try:
        import numpy as np  # lazy: import khal_runtime stays cheap; buffers need numpy
    except ImportError:
        raise ArgumentError("DeviceBuffer needs NumPy for its dtype and host copies: "
                            "pip install numpy") from None
    return np


def _native_dtype(dtype: Any, what: str) -> Any:
    np = _numpy()
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ArgumentError(f"{what}: {dtype!r} is not a NumPy dtype ({exc})") from None
    problem = byte_order_problem(dt)
    if problem is not None:
        raise ArgumentError(f"{what}: {problem}")
    if dt.hasobject:
        raise ArgumentError(f"{what}: dtype {dt} holds Python objects, which device memory cannot")
    return dt


def _count(count: Any, what: str) -> int:
    try:
        n = operator.index(count)
    except TypeError:
        raise ArgumentError(f"{what}: count must be an integer, got {count!r}") from None
    if n < 0:
        raise ArgumentValueError(f"{what}: count must be >= 0, got {n}")
    return n


class DeviceBuffer:
    """A contiguous 1-D array of ``count`` elements of ``dtype`` in device memory.

    ``buf[a:b]`` is a view (offset pointer, its own element count) that keeps the allocation
    alive. Pass it as a storage argument; on CUDA, also to anything that reads
    ``__cuda_array_interface__``."""

    __slots__ = ("ptr", "size", "dtype", "_et", "device_id", "_base", "_alloc", "backend_impl", "_native", "__weakref__")

    ptr: int
    size: int
    dtype: Any
    _et: str
    device_id: int
    _base: DeviceBuffer | None
    _alloc: Any
    #: the backend the memory belongs to (None: an external CUDA pointer wrapped without one)
    backend_impl: backends.Backend | None
    #: the backend's own view of these bytes, where its launch path binds one (WebGPU), else None
    _native: Any

    def __init__(self, ptr: int, count: int, dtype: Any, device_id: int, *, base: DeviceBuffer | None = None,
                 alloc: Any = None, backend: Any = None) -> None:
        self.ptr = int(ptr)
        self.size = int(count)
        self.dtype = _native_dtype(dtype, "DeviceBuffer")
        name, _ = element_type_of_numpy(self.dtype)
        self._et = name if name != "struct" else self.dtype.str
        self.device_id = int(device_id)
        self._base = base
        self._alloc = alloc
        self.backend_impl = backend if backend is not None else (base.backend_impl if base is not None else None)
        self._native = self.backend_impl.native_view(self) if self.backend_impl is not None else None

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def alloc(cls, count: int, dtype: Any = "float32", *, device: Any = None) -> DeviceBuffer:
        """Uninitialised device memory for ``count`` elements."""
        n = _count(count, "DeviceBuffer.alloc")
        dt = _native_dtype(dtype, "DeviceBuffer.alloc")
        dev = Device(_device_ordinal(device, current_device_id))
        ensure_current(dev.device_id)
        nbytes = max(n * dt.itemsize, 1)
        if alloc_trace_on():
            trace_alloc(nbytes, dev.device_id, capture_state.capturing())
        capture_state.forbid_in_capture(
            "DeviceBuffer allocation", "allocate every buffer before begin_capture() and reuse "
            "it in the captured work (KHAL_CUDA_ALLOC_TRACE=1 shows where)")
        capture_state.flush_deferred()
        ptr, handle = dev.backend_impl.alloc(dev, nbytes, f"{n} x {dt}")
        return cls(ptr, n, dt, dev.device_id, alloc=handle, backend=dev.backend_impl)

    @classmethod
    def from_numpy(cls, array: Any, stream: Any = None, *, device: Any = None) -> DeviceBuffer:
        """Copy a host array (flattened, C order) to new device memory, ordered on ``stream``."""
        np = _numpy()
        a = np.ascontiguousarray(array)
        if byte_order_problem(a.dtype) is not None:  # the same values, in the byte order the device reads
            a = a.astype(a.dtype.newbyteorder("="))
        st = as_stream(stream) if stream is not None or device is None else \
            Device(_device_ordinal(device, lambda: 0)).default_stream
        buf = cls.alloc(a.size, a.dtype, device=st.device_id)
        buf._copy_in(a, st)
        return buf

    @classmethod
    def zeros(cls, count: int, dtype: Any = "float32", *, stream: Any = None) -> DeviceBuffer:
        np = _numpy()
        return cls.from_numpy(np.zeros(_count(count, "DeviceBuffer.zeros"), dtype=dtype), stream)

    # -- copies -------------------------------------------------------------------------------
    def _copy_in(self, a: Any, st: Stream) -> None:
        if a.nbytes:
            ensure_current(self.device_id)
            self._backend().copy_from_host(self, a, st)

    def copy_from_numpy(self, array: Any, stream: Any = None) -> DeviceBuffer:
        """Overwrite this buffer with a host array of the same dtype and element count."""
        np = _numpy()
        a = np.ascontiguousarray(array)
        self._check_live("copy_from_numpy")
        if a.dtype != self.dtype:
            raise ArgumentError(f"copy_from_numpy: buffer holds {self.dtype}, array is {a.dtype}")
        if a.size != self.size:
            raise ArgumentValueError(
                f"copy_from_numpy: buffer has {self.size} elements, array has {a.size}"
            )
        self._copy_in(a, as_stream(stream) if stream is not None else self._stream())
        return self

    def to_numpy(self, stream: Any = None) -> Any:
        """Copy to a new host array (waits for ``stream``, default the owned stream)."""
        np = _numpy()
        self._check_live("to_numpy")
        out = np.empty(self.size, dtype=self.dtype)
        st = as_stream(stream) if stream is not None else self._stream()
        capture_state.forbid_in_capture(
            "DeviceBuffer.to_numpy() (a host read)", "captured work does not run until the graph is "
            "launched; read results after graph.launch() and a synchronize", st)
        if out.nbytes:
            ensure_current(self.device_id)
            self._backend().copy_to_host(out, self, st)
        st.synchronize()
        return out

    def fill_zero(self, stream: Any = None) -> DeviceBuffer:
        self._check_live("fill_zero")
        st = as_stream(stream) if stream is not None else self._stream()
        if self.nbytes:
            ensure_current(self.device_id)
            self._backend().fill_zero(self, st)
        return self

    def _stream(self) -> Stream:
        return Device(self.device_id).default_stream

    def _backend(self) -> backends.Backend:
        """The backend of the memory (a pointer wrapped without one: the process's, CUDA's)."""
        return self.backend_impl if self.backend_impl is not None else backends.current()

    def _check_live(self, what: str) -> None:
        if self._et == FREED or (self._base is not None and self._base._et == FREED):
            raise ArgumentValueError(f"DeviceBuffer.{what}: the buffer was freed")

    @property
    def root(self) -> DeviceBuffer:
        """The buffer that owns the allocation (itself unless a view)."""
        return self._base if self._base is not None else self

    # -- views ----------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> DeviceBuffer:
        if not isinstance(key, slice):
            raise TypeError("DeviceBuffer supports slicing only (buf[a:b])")
        self._check_live("__getitem__")
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("DeviceBuffer slices must be contiguous (step 1)")
        count = max(stop - start, 0)
        return DeviceBuffer(self.ptr + start * self.dtype.itemsize, count, self.dtype,
                            self.device_id, base=self.root)

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        return int(self.size * self.dtype.itemsize)

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self._check_live("__cuda_array_interface__")
        if self.backend_impl is not None and self.backend_impl.name != "cuda":
            raise AttributeError("a WebGPU DeviceBuffer has no __cuda_array_interface__")
        return {
            "version": 3,
            "shape": (self.size,),
            "typestr": self.dtype.str,
            "descr": self.dtype.descr,
            "data": (self.ptr, False),
            "strides": None,
            "stream": None,
        }

    # -- lifetime -------------------------------------------------------------------------------
    def free(self) -> None:
        """Release the memory now (views of it become invalid too). Idempotent."""
        root = self.root
        alloc = root._alloc
        root._alloc = None
        if alloc is not None:
            _release(root.backend_impl, alloc, root.device_id)
        for b in (self, root):
            b._et = FREED
            b.ptr = 0
        bump_epoch()  # after the buffer reads as freed: a launch packing it from now on sees it

    def __del__(self) -> None:
        if getattr(self, "_base", None) is None and getattr(self, "_alloc", None) is not None:
            try:
                self.free()
            except Exception:  # noqa: BLE001  (the context may be gone at exit)
                pass

    def __repr__(self) -> str:
        state = "freed" if self._et == FREED else f"0x{self.ptr:x}"
        return f"<DeviceBuffer {state} count={self.size} dtype={self.dtype} device={self.device_id}>"


def _release(bk: Any, alloc: Any, device_id: int) -> None:
    """Free now, or after the capture this thread has open (a buffer dropped or freed inside
    ``capture()`` — a temporary, or one the launch memo let go of — must not break it)."""

    def now() -> None:
        # a buffer of a backend no longer the process's (tests switch backends): no context to
        # make current, and no Device() of the new one (a buffer collected while the next backend
        # is being chosen would wait on that choice's lock)
        if backends.is_current(bk):
            ensure_current(device_id)
        bk.free(device_id, alloc)

    if not capture_state.defer(now):
        capture_state.flush_deferred()  # kept during a capture that has ended since
        now()


def _device_ordinal(device: Any, default: Callable[[], int]) -> int:
    if device is None:
        return default()
    return int(getattr(device, "device_id", device))


# -- the runtime's own array type, first in the interop registry ----------------------------------
def _x_buffer(b: DeviceBuffer) -> tuple[int, int, Hashable]:
    # a slice of a freed buffer reads as freed too (free() marks the buffer it was called on)
    return b.ptr, b.size, b._et if b._base is None or b._base._et is not FREED else FREED


interop.register_array_type(DeviceBuffer, _x_buffer, device=lambda b: b.device_id, memo="stable",
                            name="DeviceBuffer")
