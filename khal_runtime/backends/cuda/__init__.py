"""The CUDA backend: the driver API through cuda-bindings.

``BACKEND`` (a :class:`~khal_runtime.backends.cuda.backend.CudaBackend`), ``CudaBackend`` and
``CudaDevice`` live in :mod:`khal_runtime.backends.cuda.backend` and are imported on first
access: importing this package imports only :mod:`~khal_runtime.backends.cuda.driver`, so that
``khal_runtime.load()`` can start the driver's initialisation (:func:`prestart`) before the
rest of the runtime (pydantic, the launch path) is imported, and overlap the two. Nothing
outside this package calls cuda-bindings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from khal_runtime.backends.cuda.driver import prestart

if TYPE_CHECKING:
    from khal_runtime.backends.cuda.backend import BACKEND, CudaBackend, CudaDevice

__all__ = ["BACKEND", "CudaBackend", "CudaDevice", "prestart"]

_BACKEND_NAMES = ("BACKEND", "CudaBackend", "CudaDevice")


def __getattr__(name: str) -> Any:
    if name not in _BACKEND_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from khal_runtime.backends.cuda import backend  # lazy: see the module docstring

    value = getattr(backend, name)
    globals()[name] = value
    return value
