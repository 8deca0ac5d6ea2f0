"""The CUDA driver, reached lazily through cuda-bindings.

Nothing here runs at ``import khal_runtime``: the driver module is imported on
first use, so a machine with no GPU, no driver or no cuda-bindings can import
shader packages and read their manifests. :func:`backend_status` says whether
CUDA is usable and, if not, why.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from khal_runtime.errors import BackendUnavailableError, CudaError

__all__ = [
    "BACKEND_ENV",
    "BackendStatus",
    "backend_mode",
    "backend_status",
    "check",
    "driver",
    "driver_version",
    "require_cuda",
]

BACKEND_ENV = "KHAL_BACKEND"
_VALID_MODES = ("auto", "cuda")

_lock = threading.Lock()
_driver: ModuleType | None = None
_status: BackendStatus | None = None


@dataclass(frozen=True)
class BackendStatus:
    usable: bool
    reason: str = ""
    driver_version: tuple[int, int] | None = None
    device_count: int = 0


def backend_mode() -> str:
    """``KHAL_BACKEND``: "auto" (unset) or "cuda"; anything else is an error."""
    raw = os.environ.get(BACKEND_ENV, "").strip()
    mode = raw.lower() or "auto"
    if mode not in _VALID_MODES:
        raise BackendUnavailableError(
            f"{BACKEND_ENV}={raw!r} is not a backend khal_runtime provides; "
            f"use one of {', '.join(_VALID_MODES)} (or leave it unset for auto-detection)"
        )
    return mode


def driver() -> ModuleType:
    """``cuda.bindings.driver``, imported on first use (raises BackendUnavailableError)."""
    global _driver
    if _driver is None:
        try:
            from cuda.bindings import driver as drv
        except Exception as exc:  # ImportError, or a broken install
            raise BackendUnavailableError(
                f"no CUDA device/driver was found: cuda-bindings cannot be imported ({exc}); "
                "install it with pip install cuda-bindings"
            ) from None
        _driver = drv
    return _driver


def _name(res: Any) -> str:
    try:
        return res.name  # type: ignore[no-any-return]
    except AttributeError:
        return f"CUresult({int(res)})"


def check(result: Any, call: str) -> Any:
    """Unpack a cuda-bindings result tuple; raise CudaError naming the call and CUresult."""
    err = result[0]
    if err:
        name = _name(err)
        if name.startswith("CUDA_ERROR_STREAM_CAPTURE") or name == "CUDA_ERROR_CAPTURED_EVENT":
            from khal_runtime.errors import CaptureError

            exc = CaptureError(
                f"{call} failed: {name}: the call is not allowed while a stream captures a CUDA "
                "graph (thread-local mode forbids allocations and synchronisation on this thread; "
                "the legacy NULL stream cannot be captured); do it before begin_capture() or "
                "after end_capture()")
            exc.code = name  # type: ignore[attr-defined]
            raise exc
        raise CudaError(f"{call} failed: {name}", code=name)
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def _probe() -> BackendStatus:
    try:
        drv = driver()
    except BackendUnavailableError as exc:
        return BackendStatus(False, str(exc))
    try:
        res = drv.cuInit(0)
    except Exception as exc:  # libcuda.so not found: cuda-pathfinder raises
        return BackendStatus(
            False,
            "no CUDA device/driver was found: the NVIDIA driver library (libcuda.so.1) "
            f"could not be loaded ({type(exc).__name__}: {exc})",
        )
    if res[0]:
        name = _name(res[0])
        why = {
            "CUDA_ERROR_NO_DEVICE": "the driver reports no CUDA-capable device",
            "CUDA_ERROR_INSUFFICIENT_DRIVER": "the installed driver is older than cuda-bindings needs",
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": "the CUDA forward-compat layer does not support this device",
        }.get(name, "cuInit failed")
        err, ver = drv.cuDriverGetVersion()
        version = (int(ver) // 1000, (int(ver) % 1000) // 10) if not err else None
        return BackendStatus(
            False, f"no CUDA device/driver was found: {why} (cuInit -> {name})", version
        )
    err, ver = drv.cuDriverGetVersion()
    version = (int(ver) // 1000, (int(ver) % 1000) // 10) if not err else None
    err, count = drv.cuDeviceGetCount()
    if err or count == 0:
        return BackendStatus(
            False,
            "no CUDA device/driver was found: the driver is loaded but reports 0 devices"
            + (f" ({_name(err)})" if err else "")
            + " (check CUDA_VISIBLE_DEVICES)",
            version,
        )
    return BackendStatus(True, "", version, int(count))


def backend_status() -> BackendStatus:
    """Probe CUDA once (cuInit, driver version, device count); cached."""
    global _status
    st = _status
    if st is None:
        with _lock:
            if _status is None:
                _status = _probe()
            st = _status
    return st


def require_cuda() -> BackendStatus:
    """The status if CUDA is usable, else BackendUnavailableError saying why."""
    backend_mode()
    st = backend_status()
    if not st.usable:
        raise BackendUnavailableError(st.reason)
    return st


def driver_version() -> tuple[int, int]:
    """The driver's CUDA version, e.g. (13, 0). Raises BackendUnavailableError without one."""
    st = backend_status()
    if st.driver_version is None:
        raise BackendUnavailableError(st.reason or "no CUDA device/driver was found")
    return st.driver_version


def _reset_for_tests() -> None:
    global _status
    with _lock:
        _status = None
