"""A stand-in ``torch`` for host code run on the fake CUDA driver (tests/helpers/fakecuda.py): put
``tests/helpers/faketorch`` first on ``PYTHONPATH`` and ``import torch`` is this module.

Its tensors are what khal's launch reads of a CUDA tensor (``data_ptr``, ``dtype``, ``get_device``,
``is_cuda``) plus what Triton host code computes with (``shape``, ``stride()``, ``numel()``,
``contiguous()``, ``empty_like`` / ``empty``), at addresses a bump allocator hands out 512-byte
aligned (as PyTorch's CUDA caching allocator does): no memory behind them, nothing computed.
:func:`tensor` makes one at a chosen address and strides (a view at an offset, a strided view).
Used by tests whose host code is Triton's (``example_shader_pkg.tutorials``) where real torch
cannot run it: without a GPU, khal launches CUDA tensors only.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any, Optional, Sequence

__version__ = "0.0+khal.fake"


class dtype:  # noqa: N801 - torch's name
    def __init__(self, name: str, itemsize: int) -> None:
        self.name, self.itemsize = name, itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    __str__ = __repr__


float32 = dtype("float32", 4)
float16 = dtype("float16", 2)
bfloat16 = dtype("bfloat16", 2)
int32 = dtype("int32", 4)
float = float32  # noqa: A001 - torch's alias
half = float16

#: the next address the allocator gives (512-byte steps, a gap between allocations)
_next = itertools.count(0x7F0000000000, 1 << 24)


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


class Size(tuple):  # type: ignore[type-arg]
    pass


class Tensor:
    def __init__(self, shape: Sequence[int], dt: dtype, ptr: int, strides: Optional[Sequence[int]] = None) -> None:
        self.shape = Size(int(d) for d in shape)
        self.dtype = dt
        self.ptr = ptr
        self._strides = tuple(strides) if strides is not None else _contiguous_strides(self.shape)
        self.is_cuda = True
        self.device = SimpleNamespace(type="cuda", index=0)

    def data_ptr(self) -> int:
        return self.ptr

    def get_device(self) -> int:
        return 0

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def stride(self, i: Optional[int] = None) -> Any:
        return self._strides if i is None else self._strides[i]

    def is_contiguous(self) -> bool:
        return self._strides == _contiguous_strides(self.shape)

    def contiguous(self) -> "Tensor":
        return self if self.is_contiguous() else empty_like(self)

    def __repr__(self) -> str:
        return f"<fake torch tensor {tuple(self.shape)} {self.dtype} at {self.ptr:#x} strides {self._strides}>"


def tensor(shape: Sequence[int], dt: dtype = float32, *, offset: int = 0, strides: Optional[Sequence[int]] = None
           ) -> Tensor:
    """A tensor of ``shape`` at a fresh allocation plus ``offset`` elements (a view at an offset),
    with ``strides`` (elements; default contiguous)."""
    return Tensor(shape, dt, next(_next) + offset * dt.itemsize, strides)


def empty(shape: Sequence[int], *, device: Any = None, dtype: dtype = float32) -> Tensor:  # noqa: A002
    return tensor(tuple(shape), dtype)


def empty_like(t: Tensor) -> Tensor:
    return tensor(tuple(t.shape), t.dtype)


class _C:
    @staticmethod
    def _cuda_getCurrentRawStream(device: int) -> int:  # noqa: N802 - torch's name
        return 0  # the legacy default stream


class cuda:  # noqa: N801 - torch's name
    @staticmethod
    def get_device_properties(device: Any) -> Any:
        return SimpleNamespace(multi_processor_count=132, name="fake H200")
