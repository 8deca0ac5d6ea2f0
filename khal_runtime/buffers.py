"""Device memory: :class:`DeviceBuffer`, and reading foreign device arrays.

Foreign arrays are read through a per-type extractor cache: ``type(obj)`` picks
a function once, so PyTorch tensors take ``data_ptr()`` (0.18 us) instead of
``__cuda_array_interface__`` (3.5 us) and CuPy arrays ``.data.ptr`` instead of
their interface dict. The generic protocols (CUDA Array Interface v2/v3, then
DLPack) are the fallback for anything else.

An extractor maps an object to ``(device pointer, element count, dtype key)``;
the dtype key is whatever is cheapest to read (an element type name, a NumPy
or torch dtype, a typestr) and is resolved by :func:`khal_runtime.dtypes.dtype_info`
once per key and parameter.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any, Callable, Hashable

from khal_runtime import _cuda
from khal_runtime._cuda import check
from khal_runtime.dtypes import dtype_info, element_type_of_numpy
from khal_runtime.errors import ArgumentError, ArgumentValueError, CudaError

__all__ = ["DeviceBuffer", "Extractor", "extractor_for", "extract", "register_extractor"]

#: obj -> (device pointer, element count, dtype key)
Extractor = Callable[[Any], "tuple[int, int, Hashable]"]

FREED = "<freed buffer>"

#: ``EPOCH[0]`` changes whenever device memory an earlier launch may have packed a pointer to
#: becomes invalid: a DeviceBuffer freed, the uniform cache flushed. Each change also clears
#: every memo of the typed call's prepacked paths (launching.py), registered as (memo list,
#: index of its valid flag, value that clears it): in ``MEMOS`` for as long as the process
#: runs (a plan's shared snapshots), in ``THREAD_MEMOS`` for as long as their owner lives (a
#: thread's slots, owned by an object only that thread's thread-local storage holds, so they
#: go when the thread ends). A launch that read its arguments before a change stores no memo.
EPOCH = [0]
MEMOS: list[tuple[list[Any], int, Any]] = []
THREAD_MEMOS: weakref.WeakKeyDictionary[Any, list[tuple[list[Any], int, Any]]] = weakref.WeakKeyDictionary()
# reentrant: taking it can allocate, allocating can collect a dropped DeviceBuffer, and its
# __del__ frees it, which bumps the epoch again in the same thread
_EPOCH_LOCK = threading.RLock()


#: Array types whose pointer, element count, dtype and contiguity never change for the life of
#: the object, so that a launch may reuse what it packed from the same object (launching.py's
#: memos, which hold a reference: the memory cannot go away under them). DeviceBuffer (freeing
#: it bumps the epoch) and cupy.ndarray (``data``, ``size``, ``dtype`` and ``_c_contiguous``
#: are read-only, set in ``__init__``; an in-place shape change keeps a contiguous array
#: contiguous). Not torch.Tensor: see VERSIONED_ARRAY_TYPES.
STABLE_ARRAY_TYPES: set[type] = set()

#: Array types that can change under the same object, but not without a sign the memos check on
#: every reuse: torch.Tensor and its subclasses. ``set_``, ``resize_``, ``t_``, ``as_strided_``
#: and every other in-place op bump the tensor's ``_version`` (under ``no_grad`` and
#: ``inference_mode`` too); ``.data =`` and ``torch.utils.swap_tensors`` keep the version but
#: move ``data_ptr()`` unless the new data starts at the same address. A memo holds the
#: tensor's storage as well, so that address cannot be handed to another allocation while it
#: is remembered: the same pointer then means the same memory, and a reused launch stays
#: inside it. Inference tensors (no ``_version``) are read on every launch.
VERSIONED_ARRAY_TYPES: set[type] = set()

#: Every array type a memo may hold: STABLE_ARRAY_TYPES | VERSIONED_ARRAY_TYPES.
MEMO_ARRAY_TYPES: set[type] = set()


def _memoable(tp: type, versioned: bool = False) -> None:
    (VERSIONED_ARRAY_TYPES if versioned else STABLE_ARRAY_TYPES).add(tp)
    MEMO_ARRAY_TYPES.add(tp)


def tensor_storage(t: Any) -> Any:
    """The storage (memory) of a tensor of a VERSIONED_ARRAY_TYPES type, else None."""
    if type(t) not in VERSIONED_ARRAY_TYPES:
        return None
    try:
        return t.untyped_storage()
    except Exception:  # noqa: BLE001  (a tensor-like without storage)
        return None


def tensor_memo(t: Any) -> tuple[int, Any] | None:
    """What a memo keeps of a tensor of a VERSIONED_ARRAY_TYPES type: ``(its _version, its
    storage)``; None when it has none (an inference tensor, a type without ``_version``)."""
    if type(t) not in VERSIONED_ARRAY_TYPES:
        return None
    try:
        # asked first: an inference tensor's _version raises a C++ error, whose backtrace
        # costs tens of microseconds
        if t.is_inference():
            return None
        return t._version, t.untyped_storage()
    except Exception:  # noqa: BLE001
        return None


def bump_epoch() -> None:
    with _EPOCH_LOCK:  # a lock: two racing ``+= 1`` could leave the epoch changed once, not twice
        EPOCH[0] += 1
        for memo, flag, reset in MEMOS:
            memo[flag] = reset
        for group in list(THREAD_MEMOS.values()):
            for memo, flag, reset in group:
                memo[flag] = reset


def register_memo(memo: list[Any], flag: int, reset: Any = None, owner: Any = None) -> None:
    """Have every bump_epoch() set ``memo[flag] = reset`` (while ``owner`` lives, if given)."""
    with _EPOCH_LOCK:
        if owner is None:
            MEMOS.append((memo, flag, reset))
        else:
            THREAD_MEMOS.setdefault(owner, []).append((memo, flag, reset))


class DeviceBuffer:
    """A contiguous 1-D array of ``count`` elements of ``dtype`` in device memory.

    ``buf[a:b]`` is a view (offset pointer, its own element count) that keeps
    the allocation alive. Pass it as a storage argument, or to anything that
    reads ``__cuda_array_interface__``.
    """

    __slots__ = ("ptr", "size", "dtype", "_et", "device_id", "_base", "_alloc", "__weakref__")

    ptr: int
    size: int
    dtype: Any
    _et: str
    device_id: int
    _base: DeviceBuffer | None
    _alloc: Any

    def __init__(self, ptr: int, count: int, dtype: Any, device_id: int, *, base: Any = None,
                 alloc: Any = None) -> None:
        import numpy as np

        self.ptr = int(ptr)
        self.size = int(count)
        self.dtype = np.dtype(dtype)
        name, _ = element_type_of_numpy(self.dtype)
        self._et = name if name != "struct" else self.dtype.str
        self.device_id = int(device_id)
        self._base = base
        self._alloc = alloc

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def alloc(cls, count: int, dtype: Any = "float32", *, device: Any = None) -> DeviceBuffer:
        """Uninitialised device memory for ``count`` elements."""
        import numpy as np

        from khal_runtime.device import Device, current_device_id, ensure_current

        count = int(count)
        if count < 0:
            raise ValueError(f"DeviceBuffer.alloc: count must be >= 0, got {count}")
        dev = _device_ordinal(device, current_device_id)
        Device(dev)
        ensure_current(dev)
        nbytes = max(count * np.dtype(dtype).itemsize, 1)
        _no_alloc_in_capture(nbytes, dev)
        flush_deferred_frees()
        try:
            dptr = check(_cuda.driver().cuMemAlloc(nbytes), "cuMemAlloc")
        except CudaError as exc:
            if exc.code != "CUDA_ERROR_OUT_OF_MEMORY":
                raise
            raise CudaError(
                f"DeviceBuffer.alloc: out of device memory allocating {nbytes} bytes ({count} x "
                f"{np.dtype(dtype)}) on device {dev}; free unused buffers or allocate less",
                code=exc.code,
            ) from None
        return cls(int(dptr), count, dtype, dev, alloc=dptr)

    @classmethod
    def from_numpy(cls, array: Any, stream: Any = None, *, device: Any = None) -> DeviceBuffer:
        """Copy a host array (flattened, C order) to new device memory, ordered on ``stream``."""
        import numpy as np

        a = np.ascontiguousarray(array)
        from khal_runtime.stream import as_stream

        st = as_stream(stream) if stream is not None or device is None else None
        if st is None:
            from khal_runtime.device import Device

            st = Device(_device_ordinal(device, lambda: 0)).default_stream
        buf = cls.alloc(a.size, a.dtype, device=st.device_id)
        buf._copy_in(a, st)
        return buf

    @classmethod
    def zeros(cls, count: int, dtype: Any = "float32", *, stream: Any = None) -> DeviceBuffer:
        import numpy as np

        return cls.from_numpy(np.zeros(int(count), dtype=dtype), stream)

    # -- copies -------------------------------------------------------------------------------
    def _copy_in(self, a: Any, st: Any) -> None:
        from khal_runtime.device import ensure_current

        if a.nbytes:
            ensure_current(self.device_id)
            check(_cuda.driver().cuMemcpyHtoDAsync(self.ptr, a.ctypes.data, a.nbytes, st._cu),
                  "cuMemcpyHtoDAsync")

    def copy_from_numpy(self, array: Any, stream: Any = None) -> DeviceBuffer:
        """Overwrite this buffer with a host array of the same dtype and element count."""
        import numpy as np

        from khal_runtime.stream import as_stream

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
        import numpy as np

        from khal_runtime.device import ensure_current
        from khal_runtime.stream import as_stream

        self._check_live("to_numpy")
        out = np.empty(self.size, dtype=self.dtype)
        st = as_stream(stream) if stream is not None else self._stream()
        _no_host_read_in_capture(st)
        if out.nbytes:
            ensure_current(self.device_id)
            check(_cuda.driver().cuMemcpyDtoHAsync(out.ctypes.data, self.ptr, out.nbytes, st._cu),
                  "cuMemcpyDtoHAsync")
        st.synchronize()
        return out

    def fill_zero(self, stream: Any = None) -> DeviceBuffer:
        from khal_runtime.device import ensure_current
        from khal_runtime.stream import as_stream

        self._check_live("fill_zero")
        st = as_stream(stream) if stream is not None else self._stream()
        if self.nbytes:
            ensure_current(self.device_id)
            check(_cuda.driver().cuMemsetD8Async(self.ptr, 0, self.nbytes, st._cu), "cuMemsetD8Async")
        return self

    def _stream(self) -> Any:
        from khal_runtime.device import Device

        return Device(self.device_id).default_stream

    def _check_live(self, what: str) -> None:
        if self._et == FREED or (self._base is not None and self._base._et == FREED):
            raise ArgumentValueError(f"DeviceBuffer.{what}: the buffer was freed")

    # -- views ----------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> DeviceBuffer:
        if not isinstance(key, slice):
            raise TypeError("DeviceBuffer supports slicing only (buf[a:b])")
        self._check_live("__getitem__")
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("DeviceBuffer slices must be contiguous (step 1)")
        count = max(stop - start, 0)
        root = self._base if self._base is not None else self
        return DeviceBuffer(self.ptr + start * self.dtype.itemsize, count, self.dtype,
                            self.device_id, base=root)

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self._check_live("__cuda_array_interface__")
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
        root = self._base if self._base is not None else self
        alloc = root._alloc
        root._alloc = None
        if alloc is not None:
            _release(alloc, root.device_id)
        for b in (self, root):
            b._et = FREED
            b.ptr = 0
        bump_epoch()  # after the buffer reads as freed: a launch packing it from now on sees it

    def __del__(self) -> None:
        if self._base is None and getattr(self, "_alloc", None) is not None:
            try:
                self.free()
            except Exception:
                pass

    def __repr__(self) -> str:
        state = "freed" if self._et == FREED else f"0x{self.ptr:x}"
        return f"<DeviceBuffer {state} count={self.size} dtype={self.dtype} device={self.device_id}>"


#: Frees asked for while this process had a capture open in the freeing thread: cuMemFree
#: there would invalidate the capture, so they wait for the capture to end.
_DEFERRED: list[tuple[Any, int]] = []
_memoable(DeviceBuffer)
_DEFERRED_LOCK = threading.Lock()


def _release(alloc: Any, device_id: int) -> None:
    """cuMemFree now, or after the capture this thread has open (a buffer dropped or freed
    inside ``capture()`` — a temporary, or one the launch memo let go of — must not break it)."""
    from khal_runtime.graphs import capturing

    if capturing():
        with _DEFERRED_LOCK:
            _DEFERRED.append((alloc, device_id))
        return
    from khal_runtime.device import ensure_current

    ensure_current(device_id)
    check(_cuda.driver().cuMemFree(alloc), "cuMemFree")


def flush_deferred_frees() -> None:
    """Free what was released during a capture; called when a capture ends (and on alloc)."""
    if not _DEFERRED:
        return
    with _DEFERRED_LOCK:
        pending = _DEFERRED[:]
        _DEFERRED.clear()
    for alloc, dev in pending:
        _release(alloc, dev)


def _no_alloc_in_capture(nbytes: int, device_id: int) -> None:
    # graph capture (khal_runtime.graphs): an allocation would invalidate the capture;
    # KHAL_CUDA_ALLOC_TRACE=1 logs every allocation with its caller (khal_runtime.tracing)
    import os

    from khal_runtime.graphs import forbid_in_capture

    if os.environ.get("KHAL_CUDA_ALLOC_TRACE"):
        from khal_runtime.tracing import trace_alloc

        trace_alloc(nbytes, device_id)
    forbid_in_capture("DeviceBuffer allocation", "allocate every buffer before begin_capture() "
                      "and reuse it in the captured work (KHAL_CUDA_ALLOC_TRACE=1 shows where)")


def _no_host_read_in_capture(st: Any) -> None:
    from khal_runtime.graphs import forbid_in_capture

    forbid_in_capture("DeviceBuffer.to_numpy() (a host read)", "captured work does not run until the "
                      "graph is launched; read results after graph.launch() and a synchronize", st)


def _device_ordinal(device: Any, default: Callable[[], int]) -> int:
    if device is None:
        return default()
    return int(getattr(device, "device_id", device))


# ---------------------------------------------------------------------------------------------
# Extractors
# ---------------------------------------------------------------------------------------------

class BadArgument(Exception):
    """Internal: an extractor rejected an object. ``cls`` is the public error to raise."""

    def __init__(self, cls: type[Exception], message: str) -> None:
        super().__init__(message)
        self.cls = cls


def _x_buffer(b: DeviceBuffer) -> tuple[int, int, Hashable]:
    # a slice of a freed buffer reads as freed too (free() marks the buffer it was called on)
    return b.ptr, b.size, b._et if b._base is None or b._base._et is not FREED else FREED


def _torch_bad(t: Any) -> BadArgument:
    if not t.is_cuda:
        kind = getattr(getattr(t, "device", None), "type", "cpu")
        what = "a host tensor" if kind == "cpu" else "not a CUDA tensor"
        return BadArgument(ArgumentError, f"is {what} (device {t.device}); move it with .cuda()")
    return BadArgument(ArgumentValueError, "is a non-contiguous tensor; pass .contiguous()")


def _x_torch(t: Any) -> tuple[int, int, Hashable]:
    if t.is_cuda and t.is_contiguous():
        ptr, count = t.data_ptr(), t.numel()
        if ptr or not count:
            return ptr, count, t.dtype
        raise BadArgument(ArgumentValueError, f"is a tensor of {count} elements with no memory "
                          "(its storage was freed, e.g. untyped_storage().resize_(0)); "
                          "reallocate it before the launch, or pass another tensor")
    raise _torch_bad(t)


def _x_cupy_fast(a: Any) -> tuple[int, int, Hashable]:
    if a._c_contiguous:
        return a.data.ptr, a.size, a.dtype
    raise BadArgument(ArgumentValueError, "is a non-contiguous CuPy array; pass cupy.ascontiguousarray(a)")


def _x_cupy(a: Any) -> tuple[int, int, Hashable]:
    if a.flags.c_contiguous:
        return a.data.ptr, a.size, a.dtype
    raise BadArgument(ArgumentValueError, "is a non-contiguous CuPy array; pass cupy.ascontiguousarray(a)")


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


_TYPESTR_SIZE: dict[str, int] = {}


def _typestr_size(typestr: str) -> int:
    n = _TYPESTR_SIZE.get(typestr)
    if n is None:
        import numpy as np

        n = np.dtype(typestr).itemsize
        _TYPESTR_SIZE[typestr] = n
    return n


def _x_cai(obj: Any) -> tuple[int, int, Hashable]:
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    typestr = cai["typestr"]
    ptr = cai["data"][0]
    if cai.get("mask") is not None:
        raise BadArgument(ArgumentValueError, "is a masked array (__cuda_array_interface__ mask)")
    count = 1
    for d in shape:
        count *= d
    strides = cai.get("strides")
    if strides is not None and count and not _c_contiguous(shape, tuple(strides), _typestr_size(typestr)):
        raise BadArgument(ArgumentValueError,
                          f"is not C-contiguous (shape {shape}, strides {tuple(strides)})")
    key: Hashable = typestr
    if typestr.startswith(("|V", "<V")) and cai.get("descr"):
        import numpy as np

        key = np.dtype([tuple(d) for d in cai["descr"]])
    return int(ptr or 0), count, key


# DLPack (fallback) ----------------------------------------------------------------------------
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
    ]


_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _x_dlpack(obj: Any) -> tuple[int, int, Hashable]:
    dev_type, _dev_id = obj.__dlpack_device__()
    if int(dev_type) not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        what = {1: "host memory (DLPack CPU)", 3: "pinned host memory (DLPack CUDAHost)"}.get(
            int(dev_type), f"not device memory (DLPack device type {int(dev_type)})")
        raise BadArgument(ArgumentError, f"is {what}")
    try:
        cap = obj.__dlpack__(stream=-1)
    except TypeError:
        cap = obj.__dlpack__()
    addr = _capsule_get(cap, b"dltensor")  # DLManagedTensor*: DLTensor is its first member
    t = _DLTensor.from_address(addr)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    count = 1
    for d in shape:
        count *= d
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    strides = tuple(t.strides[i] * itemsize for i in range(t.ndim)) if t.strides else None
    if count and not _c_contiguous(shape, strides, itemsize):
        raise BadArgument(ArgumentValueError, f"is not C-contiguous (DLPack shape {shape})")
    ptr = (t.data or 0) + t.byte_offset
    key = (int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes))
    del cap  # the capsule's destructor calls the producer's deleter; obj keeps the memory
    return ptr, count, key


def _host_rejector(what: str) -> Extractor:
    def reject(obj: Any) -> tuple[int, int, Hashable]:
        raise BadArgument(
            ArgumentError,
            f"is host memory ({what}); copy it to the device first, e.g. "
            "khal_runtime.DeviceBuffer.from_numpy(a)",
        )

    return reject


def _not_an_array(obj: Any) -> tuple[int, int, Hashable]:
    raise BadArgument(
        ArgumentError,
        f"expected a device array (DeviceBuffer, torch/CuPy array, __cuda_array_interface__ or "
        f"DLPack), got {type(obj).__module__}.{type(obj).__qualname__}",
    )


_lock = threading.Lock()
#: type -> extractor; read lock-free on the hot path.
EXTRACTORS: dict[type, Extractor] = {DeviceBuffer: _x_buffer}


def register_extractor(tp: type, fn: Extractor) -> None:
    """Teach the runtime a device-array type: ``fn(obj) -> (ptr, count, dtype key)``."""
    with _lock:
        EXTRACTORS[tp] = fn


def _choose(obj: Any) -> Extractor:
    tp = type(obj)
    mod = tp.__module__ or ""
    if isinstance(obj, DeviceBuffer):
        return _x_buffer
    if mod.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "is_cuda"):
        if hasattr(tp, "_version") and hasattr(obj, "untyped_storage") and hasattr(obj, "is_inference"):
            _memoable(tp, versioned=True)
        return _x_torch
    if mod.startswith("cupy") and hasattr(obj, "data") and hasattr(obj, "size"):
        try:
            obj._c_contiguous
            if tp.__name__ == "ndarray":
                _memoable(tp)
            return _x_cupy_fast
        except AttributeError:
            return _x_cupy
    if hasattr(tp, "__cuda_array_interface__"):
        return _x_cai
    if hasattr(obj, "__array_interface__") or isinstance(obj, (bytes, bytearray, memoryview)):
        return _host_rejector(f"{tp.__module__}.{tp.__qualname__}")
    if hasattr(tp, "__dlpack__") and hasattr(tp, "__dlpack_device__"):
        return _x_dlpack
    if isinstance(obj, (list, tuple)):
        return _host_rejector(tp.__name__)
    return _not_an_array


def extractor_for(obj: Any) -> Extractor:
    """The cached extractor for ``type(obj)`` (chosen on first sight of the type)."""
    fn = EXTRACTORS.get(type(obj))
    if fn is None:
        fn = _choose(obj)
        if fn is not _not_an_array and not getattr(fn, "__name__", "") == "reject":
            with _lock:
                EXTRACTORS[type(obj)] = fn
    return fn


def device_of(obj: Any) -> int | None:
    """The CUDA device an array's memory is on, for the types that say so cheaply
    (DeviceBuffer, torch, CuPy); None when unknown (``__cuda_array_interface__``, DLPack)."""
    if isinstance(obj, DeviceBuffer):
        return obj.device_id
    mod = type(obj).__module__ or ""
    try:
        if mod.startswith("torch") and getattr(obj, "is_cuda", False):
            return int(obj.get_device())
        if mod.startswith("cupy"):
            return int(obj.device.id)
    except Exception:  # noqa: BLE001  (a look-alike without these attributes)
        return None
    return None


def extract(obj: Any) -> tuple[int, int, Hashable]:
    """(device pointer, element count, dtype key) of any supported device array."""
    return extractor_for(obj)(obj)


def describe_dtype(key: Hashable) -> tuple[str, int]:
    return dtype_info(key)
