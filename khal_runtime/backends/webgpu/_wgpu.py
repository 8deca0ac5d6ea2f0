"""wgpu-py, imported on first use.

``wgpu`` is an optional dependency: importing :mod:`khal_runtime.backends.webgpu` never imports
it; the first thing that needs it calls :func:`wgpu_module`, which raises
:class:`~khal_runtime.errors.BackendUnavailableError` saying how to install it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from types import ModuleType
from typing import Any

from khal_runtime.errors import BackendUnavailableError

__all__ = ["INSTALL_HINT", "MIN_PYTHON", "install_hint", "native", "wgpu_module"]

INSTALL_HINT = "pip install khal-runtime[webgpu] (or pip install wgpu)"
#: the Python the ``webgpu`` extra installs wgpu-py on (pyproject.toml: ``python_version >= '3.11'``)
MIN_PYTHON = (3, 11)


def install_hint(version: tuple[int, int] | None = None) -> str:
    """How to get wgpu-py on this Python (``version``, default the running one): the extra, or,
    below 3.11, where the extra installs nothing (wgpu-py 0.32 requires 3.11), a newer Python."""
    major, minor = version if version is not None else sys.version_info[:2]
    if (major, minor) < MIN_PYTHON:
        return (f"WebGPU needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} (this is Python {major}.{minor}: "
                "the wgpu-py it is tested with, 0.32, requires 3.11, and the [webgpu] extra installs "
                "nothing here); on "
                f"Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer install it with {INSTALL_HINT}")
    return f"install it with {INSTALL_HINT}"


_lock = threading.Lock()
_module: ModuleType | None = None
_native: tuple[Any, Any] | None = None


def _quiet_xdg() -> None:
    """wgpu-native (through the Vulkan loader / Mesa) prints ``error: XDG_RUNTIME_DIR is
    invalid`` when the variable is unset or points nowhere; give it a private directory."""
    cur = os.environ.get("XDG_RUNTIME_DIR")
    if not cur or not os.path.isdir(cur):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="khal-xdg-")


def wgpu_module() -> ModuleType:
    """The ``wgpu`` package (BackendUnavailableError saying how to install it when it is not)."""
    global _module
    mod = _module
    if mod is not None:
        return mod
    with _lock:
        if _module is None:
            _quiet_xdg()
            try:
                import wgpu  # lazy: wgpu is optional, imported on use
                import wgpu.backends.wgpu_native  # noqa: F401  (registers the native backend)
            except ImportError as exc:
                raise BackendUnavailableError(
                    f"the WebGPU backend needs wgpu-py, which cannot be imported ({exc}); "
                    f"{install_hint()}") from None
            except Exception as exc:  # a broken install: the native library fails to load
                raise BackendUnavailableError(
                    f"the WebGPU backend needs wgpu-py, which failed to load "
                    f"({type(exc).__name__}: {exc}); reinstall it with {INSTALL_HINT}") from None
            _module = wgpu
        return _module


def native() -> tuple[Any, Any] | None:
    """``(lib, ffi)``: wgpu-native's cffi library and FFI as wgpu-py exports them
    (``wgpu.backends.wgpu_native.lib`` / ``.ffi``), or None if this wgpu-py lacks them.

    Used only by the per-dispatch recording calls (set_pipeline, set_bind_group,
    set_immediates, dispatch), where wgpu-py's wrappers cost several times what the same C calls
    cost (their per-call error capture, and a fresh cffi array for the dynamic offsets of every
    ``set_bind_group``; figures: benchmarks/RESULTS.md, 2026-11-30, "Figures formerly in code
    comments"). Errors of pass commands are
    reported by wgpu-native when the pass ends or the encoder finishes, both of which go
    through wgpu-py's checked wrappers, so nothing is lost."""
    global _native
    if _native is None:
        wgpu_module()
        try:
            from wgpu.backends import wgpu_native as wn  # lazy: wgpu is optional, imported on use

            lib, ffi = wn.lib, wn.ffi
            for name in ("wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
                         "wgpuComputePassEncoderDispatchWorkgroups",
                         "wgpuComputePassEncoderDispatchWorkgroupsIndirect",
                         "wgpuComputePassEncoderSetImmediates"):
                getattr(lib, name)
            _native = (lib, ffi)
        except Exception:  # noqa: BLE001  (another wgpu-py layout: use its public methods)
            _native = (None, None)
    return None if _native[0] is None else _native
