"""The CUDA driver, reached lazily through cuda-bindings; its early initialisation.

Nothing here runs at ``import khal_runtime``: the driver module is imported on first use,
so a machine with no GPU, no driver or no cuda-bindings can import shader packages and read
their manifests. :func:`status` says whether CUDA is usable and, if not, why. Every module of
the CUDA backend calls the driver through :func:`driver` and :func:`check`; nothing outside
the backend does.

Early initialisation (``KHAL_EAGER_INIT``)
------------------------------------------
``cuInit`` and the retain of device 0's primary context are the largest part of a process's
first launch (figures: benchmarks/RESULTS.md, 2026-11-30, "Figures formerly in code comments"),
and they wait on nothing of ours. :func:`prestart` runs them in a background thread. It is called when a
shader package's ``__init__`` imports ``khal_runtime`` (its first line, normally) and again by
``khal_runtime.load()`` (for a package that imported the runtime earlier, or a ``load`` by
path): the driver initialises while the main thread imports what the package imports (numpy,
say) and what ``load`` needs (pydantic, the manifest's validation, the launch path), and the
first use joins the thread (:func:`status` waits for its probe,
:func:`primary_context` for its context) instead of paying for it in full. cuda-bindings
releases the GIL in ``cuInit`` and ``cuDevicePrimaryCtxRetain``, so the two really overlap.

It starts only where CUDA is the likely backend: ``KHAL_BACKEND`` unset, ``auto`` or ``cuda``
(never ``webgpu``), an NVIDIA driver visible (``/dev/nvidiactl``, ``/proc/driver/nvidia``,
WSL's libcuda, Windows' nvcuda.dll), ``CUDA_VISIBLE_DEVICES`` not set to nothing, and
cuda-bindings importable (it is imported in the caller's thread, before the thread starts).
The thread retains device 0's primary context only when the process sees exactly one device:
a process that sees several (and may work on device 3) gets ``cuInit`` early and no context it
did not ask for on device 0. What a first use reports does not change: the thread computes the
very status (and reason) the first use would have computed and cached, and a context it could
not retain is retained again by the first use, in its own thread, which raises what it raised
before.

Off by default; ``KHAL_EAGER_INIT=1`` turns it on. The trade-off that keeps it off: a process
that imports a shader package but never launches would initialise the driver anyway (with one
device it would also hold a primary context, a few hundred MB of device memory, until it exits:
every ``spawn``-ed DataLoader worker that imports the package, every test process collecting
modules); the driver would read ``CUDA_VISIBLE_DEVICES`` at the import rather than at the first
use; and a process that forks after the import would hand its children a CUDA initialised
before the fork (CUDA does not survive fork). PyTorch and CuPy initialise CUDA lazily for the
same reasons. A CLI tool or a service whose every process launches kernels gains the overlap
(most of ``cuInit`` and the context retain) by setting ``KHAL_EAGER_INIT=1`` (then ``CUDA_VISIBLE_DEVICES``
empty or ``KHAL_BACKEND=webgpu`` still start nothing; the driver-visible check is skipped). Processes that import ``khal_runtime`` without importing or loading a shader package
(the build hook, ``verify``, scripts) never start it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
from types import ModuleType
from typing import Any, Callable

from khal_runtime.abi import env_flag
from khal_runtime.backends import BackendStatus
from khal_runtime.errors import BackendUnavailableError, CaptureError, CudaError

__all__ = ["EAGER_ENV", "bindings_mismatch", "check", "driver", "driver_version", "prestart", "primary_context", "require_cuda",
           "reset_status", "status", "while_initialising"]

#: "1" turns the early initialisation on (off by default: module docstring)
EAGER_ENV = "KHAL_EAGER_INIT"
#: how long the exit of a process waits for an early initialisation still running
_EXIT_WAIT_S = 10.0

_lock = threading.Lock()
_driver: ModuleType | None = None
_status: BackendStatus | None = None
#: the early-initialisation thread (:func:`prestart`), once started
_early: threading.Thread | None = None
#: device ordinal -> (CUdevice, CUcontext) the early thread retained, for the first CudaDevice
_early_ctx: dict[int, tuple[Any, Any]] = {}
#: first-use work that needs no driver, done by a thread about to wait for the early thread
#: instead of idling (:func:`while_initialising`)
_idle_work: list[Callable[[], object]] = []


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


def _bindings_version() -> str:
    try:
        from cuda import bindings  # lazy: only to word an error

        return str(bindings.__version__)
    except Exception:  # noqa: BLE001 - an old or odd install: the message goes without it
        return "(version unknown)"


def bindings_mismatch(drv: Any, version: tuple[int, int] | None) -> str | None:
    """What to install when cuda-bindings was built for a newer CUDA major than the driver's
    (cuda-bindings 13.x on a CUDA 12 driver: some calls may fail), else None."""
    built = getattr(drv, "CUDA_VERSION", None)
    if version is None or not isinstance(built, int) or built // 1000 <= version[0]:
        return None
    fix = ("install 'cuda-bindings~=12.9' (and PTX built by an NVRTC 12 no newer than the driver: "
           "docs/guide/configuration.md)" if version[0] == 12 else "update the NVIDIA driver")
    return (f"khal: cuda-bindings {_bindings_version()} is built for CUDA {built // 1000}, but the driver "
            f"is CUDA {version[0]}.{version[1]}: some calls may fail; {fix}")


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
            "CUDA_ERROR_INSUFFICIENT_DRIVER": f"the installed driver is older than cuda-bindings {_bindings_version()} "
                                              "needs (cuda-bindings 13.x needs a CUDA 13 driver, 580 or newer; "
                                              "with a CUDA 12 driver install 'cuda-bindings~=12.9')",
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": "the CUDA forward-compat layer does not support this device",
        }.get(name, "cuInit failed")
        return BackendStatus(False, f"no CUDA device/driver was found: {why} (cuInit -> {name})", "cuda",
                             _version(drv))
    version = _version(drv)
    note = bindings_mismatch(drv, version)
    if note:
        warnings.warn(note, RuntimeWarning, stacklevel=2)
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
        _before_waiting()
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
    """Probe again at the next :func:`status` (tests that install a fake driver); forgets the
    early initialisation (after waiting for its thread)."""
    global _status, _early
    t = _early
    if t is not None and t is not threading.current_thread():
        t.join()
    with _lock:
        _status = None
        _early = None
        _early_ctx.clear()


# ---------------------------------------------------------------------------------------------
# early initialisation (module docstring)
# ---------------------------------------------------------------------------------------------
def _wanted() -> bool:
    """Whether :func:`prestart` should start: ``KHAL_EAGER_INIT``, then the environment."""
    if not env_flag(os.environ.get(EAGER_ENV), EAGER_ENV):  # an unknown value: EnvVarError
        return False  # off by default (the module docstring says why); "0" etc. too
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False  # no device: first use says so, with nothing to overlap
    return True


def prestart() -> bool:
    """Start ``cuInit`` (and, with one device, device 0's primary context) in a background
    thread, if CUDA is the likely backend and nothing has probed it yet; True if it started.
    Called through :func:`khal_runtime.backends.prestart` (the import of the runtime by a shader
    package, ``khal_runtime.load()``), which has already ruled out ``KHAL_BACKEND=webgpu``. Raises only
    :class:`~khal_runtime.errors.EnvVarError`, for a ``KHAL_EAGER_INIT`` it does not understand (at the
    shader package's import, as ``load`` would): whatever else fails here is found again, and
    reported as before, at first use."""
    global _early
    if _early is not None or _status is not None or not _wanted():
        return False
    try:
        driver()  # imported here: the thread only calls into the driver, it imports nothing
    except BackendUnavailableError:
        return False
    # _lock is taken here and released by the thread once its probe is done: a status() made in
    # the meantime waits for that probe instead of racing it with a second cuInit. Held already:
    # a probe is under way (or the thread is starting); nothing to start.
    if not _lock.acquire(blocking=False):
        return False
    if _started_or_probed():  # meanwhile, by another thread
        _lock.release()
        return False
    t = _early = threading.Thread(target=_early_init, name="khal-cuda-init", daemon=True)
    try:
        t.start()
    except RuntimeError:  # no thread to be had: everything happens at first use
        _early = None
        _lock.release()
        return False
    atexit.register(_wait_at_exit, t)
    return True


def _started_or_probed() -> bool:
    return _early is not None or _status is not None


def _early_init() -> None:
    """The thread of :func:`prestart` (started holding ``_lock``): the status probe (cuInit,
    version, devices), exactly as :func:`status` makes it; then device 0's primary context when
    it is the only device."""
    global _status
    try:
        try:
            _status = _probe()
        finally:
            _lock.release()
        st = _status
        if not st.usable or st.device_count != 1:
            return
        drv = driver()
        err, dev = drv.cuDeviceGet(0)
        if err:
            return
        err, ctx = drv.cuDevicePrimaryCtxRetain(dev)
        if err:
            return
        _early_ctx[0] = (dev, ctx)
    except Exception:  # noqa: BLE001 - reported by the first use, which does again what failed here
        return


def _wait_at_exit(t: threading.Thread) -> None:
    """At exit, let a still-running early initialisation finish before the interpreter and the
    driver's own exit handlers go away under it (bounded: a hung driver does not hang the exit)."""
    t.join(_EXIT_WAIT_S)


def primary_context(ordinal: int) -> tuple[Any, Any]:
    """(``CUdevice``, retained primary ``CUcontext``) of a device: the ones the early thread got
    for it (waiting for the thread if it is still at work), else ``cuDeviceGet`` +
    ``cuDevicePrimaryCtxRetain`` now, raising CudaError as they fail."""
    t = _early
    if ordinal == 0 and t is not None and t is not threading.current_thread():
        _before_waiting()
        t.join()
    got = _early_ctx.pop(ordinal, None)
    if got is not None:
        return got
    drv = driver()
    handle = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
    return handle, check(drv.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")


def while_initialising(work: Callable[[], object]) -> None:
    """Have ``work`` (CPU work a first use needs that does not need the driver, e.g. importing
    the cubin reader) done by the first thread that would otherwise sit waiting for the early
    initialisation, while it runs; never done if nobody waits (its user then does it when it
    needs it, as before). Errors are ignored: the user meets them again."""
    _idle_work.append(work)


def _before_waiting() -> None:
    """Do the :func:`while_initialising` work while the early thread is still at work."""
    t = _early
    if t is None or t is threading.current_thread():
        return
    while _idle_work and t.is_alive():
        try:
            work = _idle_work.pop(0)
        except IndexError:  # another thread took the last one
            return
        try:
            work()
        except Exception:  # noqa: BLE001 - see while_initialising
            pass


def _after_fork_in_child() -> None:
    """A forked child has no early thread, and a lock that thread held would stay locked."""
    global _lock, _early
    _lock = threading.Lock()
    _early = None
    _early_ctx.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
