"""``WgpuArray``: a contiguous 1-D array of ``count`` elements of ``dtype`` in a WebGPU storage
buffer, with the semantics of the CUDA ``DeviceBuffer``: ``alloc`` / ``from_numpy`` /
``zeros`` / ``to_numpy`` / ``copy_from_numpy`` / ``fill_zero`` / slicing (a view that keeps the
allocation alive) / ``free``. It is the WebGPU backing the generic ``DeviceBuffer`` can hold, and
what this backend's tests and benchmarks use directly.

What a launch needs of it is computed once, at construction: its :class:`~.memory.View`, the
Resource a binding binds, its element type name and, if it cannot be bound (an unaligned
slice, an empty buffer), the error saying why.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from khal_runtime.backends.webgpu import memory
from khal_runtime.backends.webgpu.device import WebGpuDevice, as_device
from khal_runtime.backends.webgpu.memory import Allocation, View
from khal_runtime.dtypes import element_type_of_numpy
from khal_runtime.errors import ArgumentError, ArgumentValueError, KhalError

__all__ = ["WgpuArray", "as_device"]


class WgpuArray:
    """A 1-D device array on WebGPU (see the module docstring)."""

    __slots__ = ("allocation", "offset", "size", "dtype", "_et", "_base", "_res", "_bind_error", "__weakref__")

    allocation: Allocation
    offset: int
    size: int
    dtype: Any
    _et: str
    _base: WgpuArray | None
    _res: tuple[Any, int, int, int]
    _bind_error: KhalError | None

    def __init__(self, a: Allocation, offset: int, count: int, dtype: Any, base: WgpuArray | None = None) -> None:
        self.allocation = a
        self.offset = int(offset)
        self.size = int(count)
        self.dtype = np.dtype(dtype)
        name, _ = element_type_of_numpy(self.dtype)
        self._et = name if name != "struct" else self.dtype.str
        self._base = base
        nbytes = self.size * self.dtype.itemsize
        self._res = a.resource(self.offset, nbytes)
        try:
            memory.check_storage(View(a, self.offset, nbytes), "argument", self.dtype.itemsize)
            self._bind_error = None
        except KhalError as exc:
            self._bind_error = exc

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def alloc(cls, count: int, dtype: Any = "float32", *, device: Any = None, indirect: bool = False) -> WgpuArray:
        """Device memory for ``count`` elements (zero-filled: WebGPU zeroes new buffers)."""
        count = int(count)
        if count < 0:
            raise ValueError(f"DeviceBuffer.alloc: count must be >= 0, got {count}")
        dev = as_device(device)
        a = memory.alloc(dev, count * np.dtype(dtype).itemsize, indirect=indirect)
        return cls(a, 0, count, dtype)

    @classmethod
    def from_numpy(cls, array: Any, *, device: Any = None) -> WgpuArray:
        """A new device array holding a copy of a host array (flattened, C order)."""
        a = np.ascontiguousarray(array).reshape(-1)
        out = cls.alloc(a.size, a.dtype, device=device)
        if a.nbytes:
            memory.upload(out.view, a.view(np.uint8))
        return out

    @classmethod
    def zeros(cls, count: int, dtype: Any = "float32", *, device: Any = None) -> WgpuArray:
        return cls.alloc(count, dtype, device=device)

    # -- copies ------------------------------------------------------------------------------------
    @property
    def view(self) -> View:
        return View(self.allocation, self.offset, self.size * self.dtype.itemsize)

    @property
    def device(self) -> WebGpuDevice:
        return self.allocation.device

    @property
    def device_id(self) -> int:
        return self.allocation.device.ordinal

    @property
    def nbytes(self) -> int:
        return int(self.size * self.dtype.itemsize)

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    def __len__(self) -> int:
        return self.size

    def to_numpy(self) -> Any:
        """A new host array (waits for every launch issued before it)."""
        data = memory.download(self.view)
        return np.frombuffer(bytearray(data), dtype=self.dtype).copy() if data else np.empty(0, self.dtype)

    def copy_from_numpy(self, array: Any) -> WgpuArray:
        """Overwrite with a host array of the same dtype and element count (in launch order)."""
        a = np.ascontiguousarray(array).reshape(-1)
        if a.dtype != self.dtype:
            raise ArgumentError(f"copy_from_numpy: the array holds {self.dtype}, the host array {a.dtype}")
        if a.size != self.size:
            raise ArgumentValueError(f"copy_from_numpy: the array has {self.size} elements, the host "
                                     f"array {a.size}")
        memory.upload(self.view, a.view(np.uint8))
        return self

    def fill_zero(self) -> WgpuArray:
        memory.fill_zero(self.view)
        return self

    def copy_from(self, other: WgpuArray) -> WgpuArray:
        """Device-to-device copy of ``other`` (same byte size) into this array."""
        memory.copy(other.view, self.view)
        return self

    # -- views ------------------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> WgpuArray:
        if not isinstance(key, slice):
            raise TypeError("a WebGPU DeviceBuffer supports slicing only (a[i:j])")
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("DeviceBuffer slices must be contiguous (step 1)")
        root = self._base if self._base is not None else self
        return WgpuArray(self.allocation, self.offset + start * self.dtype.itemsize, max(stop - start, 0),
                         self.dtype, base=root)

    # -- lifetime ---------------------------------------------------------------------------------
    def free(self) -> None:
        """Release the memory now (views of it become invalid). Idempotent."""
        memory.free(self.allocation)

    @property
    def freed(self) -> bool:
        return self.allocation.freed

    def __repr__(self) -> str:
        state = "freed" if self.allocation.freed else f"offset={self.offset}"
        return (f"<WgpuArray {state} count={self.size} dtype={self.dtype} "
                f"device={self.allocation.device.ordinal}>")
