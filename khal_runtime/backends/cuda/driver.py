"""The CUDA driver, reached lazily through cuda-bindings.

Nothing here runs at ``import khal_runtime``: the driver module is imported on first use,
so a machine with no GPU, no driver or no cuda-bindings can import shader packages and read
their manifests. :func:`status` says whether CUDA is usable and, if not, why. Every module of
the CUDA backend calls the driver through :func:`driver` and :func:`check`; nothing outside
the backend does.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

from khal_runtime.backends import BackendStatus
from khal_runtime.errors import BackendUnavailableError, CaptureError, CudaError

__all__ = ["check", "driver", "driver_version", "require_cuda", "reset_status", "status"]

_lock = threading.Lock()
_driver: ModuleType | None = None
_status: BackendStatus | None = None


def driver() -> ModuleType:
    """``cuda.bindings.driver``, imported on first use (raises BackendUnavailableError)."""
    global _driver
    if _driver is None:
        try:
            from cuda.bindings import driver as drv  # lazy: the driver is optional at import
        except Exception as exc:  # noqa: BLE001  (ImportError, or a broken install)
            raise BackendUnavailableError(
                f"no CUDA device/driver was found: cuda-bindings cannot be imported ({exc}); "
                "install it with pip install cuda-bindings"
            ) from None
        _driver = drv
    return _driver


def result_name(res: Any) -> str:
    try:
        return res.name  # type: ignore[no-any-return]
    except AttributeError:
        return f"CUresult({int(res)})"


def check(result: Any, call: str) -> Any:
    """Unpack a cuda-bindings result tuple; raise CudaError naming the call and CUresult."""
    err = result[0]
    if err:
        name = result_name(err)
        if name.startswith("CUDA_ERROR_STREAM_CAPTURE") or name == "CUDA_ERROR_CAPTURED_EVENT":
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


def _version(drv: Any) -> tuple[int, int] | None:
    err, ver = drv.cuDriverGetVersion()
    return (int(ver) // 1000, (int(ver) % 1000) // 10) if not err else None


def _probe() -> BackendStatus:
    try:
        drv = driver()
    except BackendUnavailableError as exc:
        return BackendStatus(False, str(exc), "cuda")
    try:
        res = drv.cuInit(0)
    except Exception as exc:  # noqa: BLE001  (libcuda.so not found: cuda-pathfinder raises)
        return BackendStatus(
            False,
            "no CUDA device/driver was found: the NVIDIA driver library (libcuda.so.1) "
            f"could not be loaded ({type(exc).__name__}: {exc})", "cuda",
        )
    if res[0]:
        name = result_name(res[0])
        why = {
            "CUDA_ERROR_NO_DEVICE": "the driver reports no CUDA-capable device",
            "CUDA_ERROR_INSUFFICIENT_DRIVER": "the installed driver is older than cuda-bindings needs",
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": "the CUDA forward-compat layer does not support this device",
        }.get(name, "cuInit failed")
        return BackendStatus(False, f"no CUDA device/driver was found: {why} (cuInit -> {name})", "cuda",
                             _version(drv))
    version = _version(drv)
    err, count = drv.cuDeviceGetCount()
    if err or count == 0:
        return BackendStatus(
            False,
            "no CUDA device/driver was found: the driver is loaded but reports 0 devices"
            + (f" ({result_name(err)})" if err else "") + " (check CUDA_VISIBLE_DEVICES)",
            "cuda", version,
        )
    return BackendStatus(True, "", "cuda", version, int(count))


def status() -> BackendStatus:
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
    st = status()
    if not st.usable:
        raise BackendUnavailableError(st.reason)
    return st


def driver_version() -> tuple[int, int]:
    """The driver's CUDA version, e.g. (13, 0). Raises BackendUnavailableError without one."""
    st = status()
    if st.driver_version is None:
        raise BackendUnavailableError(st.reason or "no CUDA device/driver was found")
    return st.driver_version


def reset_status() -> None:
    """Probe again at the next :func:`status` (tests that install a fake driver)."""
    global _status
    with _lock:
        _status = None
