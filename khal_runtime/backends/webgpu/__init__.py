"""The WebGPU backend of khal_runtime (wgpu-py): runs the WGSL / SPIR-V builds of Slang crates.

Importing this package imports nothing of wgpu-py (an optional dependency: ``pip install
khal-runtime[webgpu]``); the first use without it raises BackendUnavailableError saying so.
Every wgpu-py object stays inside: the generic runtime layer calls the internal API below,
and users see the same Device / Stream / DeviceBuffer / kernel API as on CUDA.

Modules, one concern each (lower ones never import higher ones):

* :mod:`._wgpu` -- wgpu-py, imported lazily (the backend's error classes are
  :mod:`khal_runtime.errors`', with every other: ``WebGpuError``, ``PipelineCreationError``, ...);
* :mod:`.packing` -- uniform structs per target layout, loose scalars (pure Python);
* :mod:`.stream` -- the device's ordered command stream (open encoder / pass, batching);
* :mod:`.device` -- adapter choice, status, one device per ordinal;
* :mod:`.memory` -- storage buffers, views, ordered uploads / downloads / clears / copies;
* :mod:`.uniform_pool` -- content-addressed uniform regions; :mod:`.bindings` -- bind groups;
* :mod:`.artifacts` -- an entry's WGSL / SPIR-V from its package, checked (sha256, entry hash);
* :mod:`.pipeline` -- shader modules, explicit layouts, compute pipelines (cached);
* :mod:`.launch` -- :class:`Launcher`: dispatch a pipeline with views and packed bytes;
* :mod:`.arrays` -- :class:`WgpuArray`, the device array (DeviceBuffer semantics);
* :mod:`.kernel` -- :class:`KernelPlan`: the typed call ``k(n, *args)``, bind, indirect;
* :mod:`.indirect` -- native indirect dispatch; :mod:`.recording` -- capture / replay;
* :mod:`.profiling` -- timestamp-query GPU times, trace fields.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from khal_runtime import errors

# ``khal_runtime.backends.webgpu.errors``, this backend's error classes' module in 0.2.0, is
# khal_runtime.errors, where every error class is: imports written against it keep working
sys.modules[f"{__name__}.errors"] = errors

__all__ = [
    "BACKEND",
    "WebGpuBackend",
    "BoundDispatch",
    "Capture",
    "KernelPlan",
    "Launcher",
    "Recording",
    "WebGpuDevice",
    "WebGpuStatus",
    "WgpuArray",
    "capture",
    "capture_recording",
    "code_loader",
    "disable_profiling",
    "enable_profiling",
    "get_device",
    "register_storage_type",
    "status",
]

_LAZY = {
    "BACKEND": "backend", "WebGpuBackend": "backend",
    "BoundDispatch": "kernel", "KernelPlan": "kernel", "register_storage_type": "kernel",
    "Capture": "recording", "Recording": "recording", "capture": "recording",
    "capture_recording": "recording", "Launcher": "launch",
    "WebGpuDevice": "device", "WebGpuStatus": "device", "get_device": "device", "status": "device",
    "WgpuArray": "arrays", "code_loader": "artifacts",
    "enable_profiling": "profiling", "disable_profiling": "profiling",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
