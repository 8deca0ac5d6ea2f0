"""Static types of kernel arguments: what the generated ``.pyi`` of a shader package names.

A shader package's stub (written by the build next to its manifest, see ``hatch_khal.stubs``)
gives each entry a ``__call__`` with one typed parameter per kernel parameter; the types are
the aliases below. They are structural (``Protocol``s), so nothing here imports torch, CuPy
or NumPy: a ``torch.Tensor``, a ``cupy.ndarray``, a :class:`~khal_runtime.DeviceBuffer` or
anything with ``__cuda_array_interface__`` / ``__dlpack__`` is a :data:`DeviceArray` to a
type checker. They describe what the launch accepts; the launch still checks every argument
(device, dtype, size) at run time.

A leaf module: it imports nothing of the project at run time.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Protocol, Sequence, SupportsComplex, SupportsFloat, SupportsIndex, Union

if TYPE_CHECKING:
    from typing import TypeAlias

    from khal_runtime.buffers import DeviceBuffer

__all__ = [
    "BoolScalar",
    "BoundLaunch",
    "BoundLaunch2D",
    "BoundLaunch3D",
    "ComplexScalar",
    "Count2D",
    "Count3D",
    "DeviceArray",
    "Dim3",
    "FloatScalar",
    "IntScalar",
    "StreamLike",
    "SupportsCudaArrayInterface",
    "SupportsDLPack",
    "SupportsStructBytes",
    "Uniform",
]


class SupportsCudaArrayInterface(Protocol):
    """Anything exposing CUDA memory through ``__cuda_array_interface__`` (CuPy, Numba,
    PyTorch, :class:`~khal_runtime.DeviceBuffer`, ...)."""

    @property
    def __cuda_array_interface__(self) -> object: ...


class SupportsDLPack(Protocol):
    """Anything exporting a DLPack capsule (JAX, PyTorch, CuPy, ...)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> object: ...


class SupportsStructBytes(Protocol):
    """A NumPy structured scalar or 0-d array: a ``dtype`` and ``tobytes()``."""

    @property
    def dtype(self) -> Any: ...

    def tobytes(self) -> bytes: ...


class BoundLaunch(Protocol):
    """What ``kernel.bind(...)`` returns: call it with a thread count."""

    def __call__(self, n: SupportsIndex, /) -> None: ...


class BoundLaunch2D(Protocol):
    """What ``kernel.bind(...)`` of a 2-D entry returns: call it with ``(nx, ny)``."""

    def __call__(self, n: Count2D, /) -> None: ...


class BoundLaunch3D(Protocol):
    """What ``kernel.bind(...)`` of a 3-D entry returns: call it with ``(nx, ny, nz)``."""

    def __call__(self, n: Count3D, /) -> None: ...


#: A storage argument: device memory of the entry's element type (checked at launch).
DeviceArray: TypeAlias = Union["DeviceBuffer", SupportsCudaArrayInterface, SupportsDLPack]

#: A uniform argument: the struct as a ctypes ``Structure`` / ``Union`` / array, a NumPy
#: structured value, its bytes, a mapping of field values (Slang crates, packed by the recorded
#: layout), or a device array already holding the struct.
Uniform: TypeAlias = Union[
    ctypes.Structure,
    ctypes.Union,
    "ctypes.Array[Any]",
    SupportsStructBytes,
    bytes,
    bytearray,
    memoryview,
    "dict[str, Any]",
    DeviceArray,
]

#: Scalar arguments by the family of their ABI type: integers take ``int`` and NumPy integers
#: (``__index__``), floats (``float16``/``bfloat16`` too) any real number, ``bool`` a bool.
IntScalar: TypeAlias = SupportsIndex
FloatScalar: TypeAlias = SupportsFloat
BoolScalar: TypeAlias = bool
ComplexScalar: TypeAlias = Union[SupportsComplex, SupportsFloat]

#: The thread count of a 2-D entry's typed call, ``(nx, ny)``, and of a 3-D one's, ``(nx, ny, nz)``
#: (``entry.grid_dims``): a tuple of that many integers, or a list (the launch checks its length).
#: A 1-D entry takes an :data:`IntScalar`; each refuses the other's form at run time too.
Count2D: TypeAlias = Union[tuple[SupportsIndex, SupportsIndex], list[int], list[SupportsIndex]]
Count3D: TypeAlias = Union[tuple[SupportsIndex, SupportsIndex, SupportsIndex], list[int], list[SupportsIndex]]

#: A grid or block: an int or up to three ints.
Dim3: TypeAlias = Union[SupportsIndex, Sequence[SupportsIndex]]

#: ``stream=``: a :class:`~khal_runtime.Stream`, a torch / CuPy / cuda.core stream, an
#: object with ``__cuda_stream__``, a raw ``CUstream`` int, or None (the owned stream).
StreamLike: TypeAlias = object
