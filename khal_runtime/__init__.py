"""khal_runtime: load and launch the kernels a hatch-khal build embedded in a package.

    import khal_runtime
    kernels = khal_runtime.load("my_shaders")      # reads the manifest; no GPU work yet
    x = khal_runtime.DeviceBuffer.from_numpy(a)
    kernels.saxpy(len(a), x, y, params)            # n threads, on the owned stream

Importing this package is cheap: it imports neither cuda.bindings, wgpu, pydantic,
NVRTC nor hatch_khal; those come on first use. ``load`` (the import of a shader package)
imports pydantic and validates the manifest, and where CUDA is the likely backend it starts
the driver's initialisation in a background thread first, so that the two overlap
(``KHAL_EAGER_INIT=0`` turns that off; see :mod:`khal_runtime.backends.cuda.driver`). The
layers below this public API are described in ARCHITECTURE.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from khal_runtime import errors
from khal_runtime.errors import (
    ArgumentError,
    ArgumentValueError,
    ArtifactError,
    BackendUnavailableError,
    CaptureError,
    CudaError,
    HashMismatchError,
    KhalError,
    ManifestError,
    NoCompatibleBinaryError,
    ParamLayoutError,
    PtxTooNewError,
    StaleBuildError,
)

if TYPE_CHECKING:
    from khal_runtime.backends import BackendStatus
    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.device import Device, Stream, default_stream
    from khal_runtime.graphs import Graph, capture_graph
    from khal_runtime.interop import register_array_type
    from khal_runtime.kernels import Kernel, KernelSet, LaunchConfig
    from khal_runtime.tracing import profile
    from khal_runtime.verify import Problem, check_package, verify_package

__all__ = [
    "ArgumentError",
    "ArgumentValueError",
    "ArtifactError",
    "BackendUnavailableError",
    "CaptureError",
    "CudaError",
    "Graph",
    "Device",
    "DeviceBuffer",
    "HashMismatchError",
    "Kernel",
    "KernelSet",
    "KhalError",
    "LaunchConfig",
    "ManifestError",
    "NoCompatibleBinaryError",
    "ParamLayoutError",
    "Problem",
    "PtxTooNewError",
    "StaleBuildError",
    "Stream",
    "backend_status",
    "BackendStatus",
    "capture_graph",
    "check_package",
    "default_stream",
    "driver_version",
    "errors",
    "launch",
    "load",
    "profile",
    "register_array_type",
    "verify_package",
]

_LAZY = {
    "DeviceBuffer": "khal_runtime.buffers",
    "Device": "khal_runtime.device",
    "Stream": "khal_runtime.device",
    "default_stream": "khal_runtime.device",
    "Kernel": "khal_runtime.kernels",
    "KernelSet": "khal_runtime.kernels",
    "LaunchConfig": "khal_runtime.kernels",
    "Problem": "khal_runtime.verify",
    "verify_package": "khal_runtime.verify",
    "check_package": "khal_runtime.verify",
    "backend_status": "khal_runtime.backends",
    "BackendStatus": "khal_runtime.backends",
    "register_array_type": "khal_runtime.interop",
    "Graph": "khal_runtime.graphs",
    "capture_graph": "khal_runtime.graphs",
    "profile": "khal_runtime.tracing",
}


def load(package: Any) -> KernelSet:
    """The kernels of a shader package, by import name (``load(__name__)``) or directory."""
    from khal_runtime import backends  # lazy: import khal_runtime stays cheap

    # first, so that the CUDA driver initialises while the rest of the runtime is imported
    # (KHAL_EAGER_INIT, see khal_runtime.backends.cuda.driver)
    backends.prestart()
    from khal_runtime.kernels import load as _load  # lazy: import khal_runtime stays cheap

    return _load(package)


def launch(stream: Any, config: LaunchConfig, kernel: Kernel, *args: Any) -> None:
    """``launch(stream, LaunchConfig(grid, block, shmem), kernels.entry, *args)``."""
    kernel.launch(config.grid, config.block, *args, stream=stream, shared_mem=config.shmem)


def driver_version() -> tuple[int, int]:
    """The CUDA version of the installed driver, e.g. (13, 0) (BackendUnavailableError
    without a CUDA driver)."""
    from khal_runtime import backends  # lazy: import khal_runtime stays cheap

    st = backends.get("cuda").status()
    if st.driver_version is None:
        raise BackendUnavailableError(st.reason or "no CUDA device/driver was found")
    return st.driver_version


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'khal_runtime' has no attribute {name!r}")
    import importlib  # lazy: only for the first use of each public name

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
