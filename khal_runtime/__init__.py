"""khal_runtime: load and launch the kernels a hatch-khal build embedded in a package.

    import khal_runtime
    kernels = khal_runtime.load("my_shaders")      # reads the manifest; no GPU work yet
    x = khal_runtime.DeviceBuffer.from_numpy(a)
    kernels.saxpy(len(a), x, y, params)            # n threads, on the owned stream

Importing this package is cheap: it imports neither cuda.bindings, wgpu, pydantic,
NVRTC nor hatch_khal; those come on first use. ``load`` (the import of a shader package) reads
the manifest; pydantic validates it only when the digest the build wrote beside it does not vouch
for it (:mod:`khal_runtime.manifest_load`). With ``KHAL_EAGER_INIT=1`` (off by default), the
driver's initialisation starts in a background thread before that, so that the two overlap: at
the ``load`` call, or already when this package is first imported by a shader package's
``__init__`` (a package whose directory holds ``_khal/manifest.json``: it is about to call
``load``), so that the imports it makes before (numpy, its own modules) overlap too; see
:mod:`khal_runtime.backends.cuda.driver` for why it is off by default. The
layers below this public API are described in ARCHITECTURE.md.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from khal_runtime import errors
from khal_runtime.errors import (
    ArgumentError,
    ArgumentValueError,
    ArtifactError,
    BackendFallbackWarning,
    BackendUnavailableError,
    BackendVarError,
    CaptureError,
    CudaError,
    EnvVarError,
    HashMismatchError,
    KhalError,
    LaunchAttributeError,
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
    from khal_runtime.kernels import Kernel, KernelSet, LaunchConfig, launch
    from khal_runtime.tracing import profile
    from khal_runtime.verify import Problem, check_package, verify_package

__all__ = [
    "ArgumentError",
    "ArgumentValueError",
    "ArtifactError",
    "BackendFallbackWarning",
    "BackendUnavailableError",
    "BackendVarError",
    "CaptureError",
    "CudaError",
    "EnvVarError",
    "Graph",
    "Device",
    "DeviceBuffer",
    "HashMismatchError",
    "Kernel",
    "KernelSet",
    "KhalError",
    "LaunchAttributeError",
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
    "launch": "khal_runtime.kernels",
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


#: module names of the import system's frames (frozen or not)
_IMPORT_MACHINERY = ("importlib", "_frozen_importlib")


def _imported_by_a_shader_package() -> bool:
    """Whether the module whose import is running this one is a shader package's ``__init__``:
    the first frame outside the import machinery runs the top level of a package whose
    directory holds the manifest (one stat; the build hook, verify, scripts and tests that
    import khal_runtime are not packages with a manifest)."""
    getframe = getattr(sys, "_getframe", None)
    f: Any = getframe(1) if getframe is not None else None
    while f is not None and (f.f_globals.get("__name__") == __name__
                             or str(f.f_globals.get("__name__")).startswith(_IMPORT_MACHINERY)):
        f = f.f_back
    if f is None or f.f_code.co_name != "<module>":
        return False
    file = f.f_globals.get("__file__")
    if not isinstance(file, str) or os.path.basename(file) != "__init__.py":
        return False
    here = os.path.dirname(file)
    # the package's own __init__, or its generated _khal/__init__ (``from ._khal import kernels``)
    return (os.path.exists(os.path.join(here, "_khal", "manifest.json"))
            or os.path.basename(here) == "_khal" and os.path.exists(os.path.join(here, "manifest.json")))


def _prestart_for_a_shader_package() -> None:
    """:func:`khal_runtime.backends.prestart` when a shader package imports this package: its
    ``load`` call comes at the end of its ``__init__``, after imports (numpy, its modules) that
    the driver's initialisation can overlap too."""
    if _imported_by_a_shader_package():
        from khal_runtime import backends  # lazy: only for a shader package about to load()

        backends.prestart()


_prestart_for_a_shader_package()
