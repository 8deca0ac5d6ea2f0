"""The CUDA backend's :class:`CudaBackend` (``BACKEND``) and :class:`CudaDevice`.

:class:`CudaBackend` implements :class:`khal_runtime.backends.Backend` by delegating to the
package's modules, one concern each: ``driver`` (cuda-bindings, lazily; status; early
initialisation), ``loader`` (binary selection, loading, parameter-layout checks),
``uniform_cache`` (uploaded uniform structs), ``launch`` + ``launchgen`` (launch plans and their
generated code), ``bound`` (``Kernel.bind``), ``graphs`` (capture and replay), ``indirect``
(device-side indirect dispatch) and ``timer`` (CUDA events for the profiler). It lives here, not
in the package's ``__init__``, so that importing the package (for :func:`driver.prestart`, at
``khal_runtime.load()``) imports none of them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from khal_runtime.backends import BackendStatus, KernelHandle
from khal_runtime.backends.cuda import driver as _drv
from khal_runtime.backends.cuda import graphs, indirect, loader
from khal_runtime.backends.cuda.bound import BoundLaunch
from khal_runtime.backends.cuda.launch import LaunchPlan
from khal_runtime.backends.cuda.timer import EventTimer
from khal_runtime.backends.cuda.uniform_cache import cache_for
from khal_runtime.device import Device, Stream, ensure_current
from khal_runtime.errors import CudaError, NoCompatibleBinaryError, PtxTooNewError

if TYPE_CHECKING:
    from khal_runtime.backends import Backend
    from khal_runtime.backends import LaunchPlan as ContractPlan
    from khal_runtime.manifest import Crate

__all__ = ["BACKEND", "CudaBackend", "CudaDevice"]

_LEGACY_HANDLES = (0, 1, 2)  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
_PER_THREAD = 2
#: cuda-bindings' switch to the per-thread default stream (its ``_ptsz`` entry points): then the
#: NULL handle is each thread's own stream
_PTDS_VAR = "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"


def _compute_capability(handle: Any) -> tuple[int, int]:
    """(major, minor) of a ``CUdevice``: needs the driver initialised, no context."""
    drv = _drv.driver()
    attr = drv.CUdevice_attribute
    return (int(_drv.check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle),
                           "cuDeviceGetAttribute")),
            int(_drv.check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle),
                           "cuDeviceGetAttribute")))


class CudaDevice:
    """What the generic :class:`~khal_runtime.device.Device` holds on CUDA: the ``CUdevice``
    and its retained primary context (shared with PyTorch / CuPy)."""

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal
        # cuDeviceGet + cuDevicePrimaryCtxRetain, or what the early-init thread got (driver.prestart)
        self.handle, self.context = _drv.primary_context(ordinal)
        self._cc: tuple[int, int] | None = None
        self._attrs: dict[str, int] = {}

    def attribute(self, name: str) -> int:
        v = self._attrs.get(name)
        if v is None:
            drv = _drv.driver()
            attr = getattr(drv.CUdevice_attribute, name)
            v = int(_drv.check(drv.cuDeviceGetAttribute(attr, self.handle), "cuDeviceGetAttribute"))
            self._attrs[name] = v
        return v

    def compute_capability(self) -> tuple[int, int]:
        if self._cc is None:
            self._cc = _compute_capability(self.handle)
        return self._cc

    @property
    def arch(self) -> str:
        major, minor = self.compute_capability()
        return f"sm_{major}{minor}"

    @property
    def name(self) -> str:
        raw = _drv.check(_drv.driver().cuDeviceGetName(256, self.handle), "cuDeviceGetName")
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")

    @property
    def sm_count(self) -> int:
        return self.attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")


class CudaBackend:
    """:class:`khal_runtime.backends.Backend` on the CUDA driver API."""

    name = "cuda"

    def __init__(self) -> None:
        self._timer: EventTimer | None = None

    # -- availability --------------------------------------------------------------------------
    def status(self) -> BackendStatus:
        return _drv.status()

    # -- devices and streams -------------------------------------------------------------------
    def open_device(self, ordinal: int) -> CudaDevice:
        _drv.require_cuda()
        return CudaDevice(ordinal)

    def make_current(self, device: Device) -> None:
        _drv.check(_drv.driver().cuCtxSetCurrent(device._impl.context), "cuCtxSetCurrent")

    def create_stream(self, device: Device) -> Stream:
        drv = _drv.driver()
        ensure_current(device.device_id)
        cu = _drv.check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        return Stream(int(cu), device.device_id, owned=True, native=cu, backend=self)

    def destroy_stream(self, stream: Stream) -> None:
        _drv.check(_drv.driver().cuStreamDestroy(stream.native), "cuStreamDestroy")

    def native_stream(self, handle: int) -> Any:
        return _drv.driver().CUstream(handle)

    def is_legacy_stream(self, handle: int) -> bool:
        return handle in _LEGACY_HANDLES

    def is_per_thread_stream(self, handle: int) -> bool:
        """``CU_STREAM_PER_THREAD`` (2), and the NULL stream (0) when cuda-bindings launches on the
        per-thread default stream (``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1``): one stream per
        thread under one handle."""
        if handle == _PER_THREAD:
            return True
        return handle == 0 and os.environ.get(_PTDS_VAR, "0").strip() not in ("", "0")

    def stream_device(self, handle: int) -> int:
        drv = _drv.driver()
        cu = drv.CUstream(handle)
        if hasattr(drv, "cuStreamGetDevice"):
            res = drv.cuStreamGetDevice(cu)
            if not res[0]:
                return int(res[1])  # a CUdevice handle is its ordinal
        ctx = _drv.check(drv.cuStreamGetCtx(cu), "cuStreamGetCtx")
        _drv.check(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            return int(_drv.check(drv.cuCtxGetDevice(), "cuCtxGetDevice"))
        finally:
            _drv.check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def synchronize(self, stream: Stream) -> None:
        _drv.check(_drv.driver().cuStreamSynchronize(stream.native), "cuStreamSynchronize")

    def synchronize_device(self, device: Device) -> None:
        _drv.check(_drv.driver().cuCtxSynchronize(), "cuCtxSynchronize")

    def is_capturing(self, stream: Stream) -> bool:
        drv = _drv.driver()
        status = _drv.check(drv.cuStreamIsCapturing(stream.native), "cuStreamIsCapturing")
        return bool(status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)

    def wait_event(self, stream: Stream, event: Any) -> None:
        _drv.check(_drv.driver().cuStreamWaitEvent(stream.native, event, 0), "cuStreamWaitEvent")

    # -- memory --------------------------------------------------------------------------------
    def alloc(self, device: Device, nbytes: int, what: str = "") -> tuple[int, Any]:
        try:
            dptr = _drv.check(_drv.driver().cuMemAlloc(nbytes), "cuMemAlloc")
        except CudaError as exc:
            if exc.code != "CUDA_ERROR_OUT_OF_MEMORY":
                raise
            raise CudaError(
                f"DeviceBuffer.alloc: out of device memory allocating {nbytes} bytes ({what}) on "
                f"device {device.device_id}; free unused buffers or allocate less", code=exc.code,
            ) from None
        return int(dptr), dptr

    def free(self, device_id: int, allocation: Any) -> None:
        _drv.check(_drv.driver().cuMemFree(allocation), "cuMemFree")

    def copy_from_host(self, buf: Any, host: Any, stream: Stream) -> None:
        _drv.check(_drv.driver().cuMemcpyHtoDAsync(buf.ptr, host.ctypes.data, host.nbytes, stream.native),
              "cuMemcpyHtoDAsync")

    def copy_to_host(self, host: Any, buf: Any, stream: Stream) -> None:
        _drv.check(_drv.driver().cuMemcpyDtoHAsync(host.ctypes.data, buf.ptr, host.nbytes, stream.native),
              "cuMemcpyDtoHAsync")

    def copy_device(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        """Device-to-device copy on ``stream`` (capturable: a module global refilled in a graph)."""
        _drv.check(_drv.driver().cuMemcpyDtoDAsync(dst, src, nbytes, stream.native), "cuMemcpyDtoDAsync")

    def fill_zero(self, buf: Any, stream: Stream) -> None:
        _drv.check(_drv.driver().cuMemsetD8Async(buf.ptr, 0, buf.nbytes, stream.native), "cuMemsetD8Async")

    # -- kernels -------------------------------------------------------------------------------
    def missing_binary(self, crate: Crate, package: str) -> str | None:
        """Why ``crate`` has no binary for device 0 (the arch of its compute capability, the
        driver's PTX ISA), or None when it has one: the choice of :func:`loader.select_candidates`,
        asked without creating a context or loading anything."""
        st = _drv.require_cuda()
        cc = _compute_capability(_drv.check(_drv.driver().cuDeviceGet(0), "cuDeviceGet"))
        version = st.driver_version or (0, 0)
        try:
            loader.select_candidates(crate, cc, version, package=package)
        except PtxTooNewError:
            return (f"no CUDA binary for sm_{cc[0]}{cc[1]} in package {package!r} crate {crate.name!r}: "
                    f"no cubin for it, and its PTX is newer than the driver (CUDA {version[0]}.{version[1]}) "
                    f"can JIT (it ships: {loader.describe_shipped(crate)})")
        except NoCompatibleBinaryError:
            return (f"no CUDA binary for sm_{cc[0]}{cc[1]} in package {package!r} crate {crate.name!r} "
                    f"(it ships: {loader.describe_shipped(crate)})")
        return None

    def load_crate(self, crate: Any, device_id: int) -> loader.LoadedModule:
        """Load ``crate`` (a :class:`khal_runtime.kernels.CrateKernels`) on a device; a first
        launch may come inside a graph capture, where loading is allowed in relaxed mode only."""
        st = _drv.require_cuda()
        dev = Device(device_id)
        blobs = crate.blobs()
        ensure_current(device_id)
        with graphs.relaxed_capture_mode():
            return loader.load_module(crate.crate, crate.package, blobs, dev, st.driver_version or (0, 0))

    def plan(self, kernel: KernelHandle, module: loader.LoadedModule, device_id: int) -> LaunchPlan:
        return LaunchPlan(kernel.entry, kernel.crate, device_id, module.functions[kernel.name],
                          cache_for(device_id), module.indirect.get(kernel.name),
                          module.attributes.get(kernel.name), module.indirect_attributes.get(kernel.name),
                          kernel=kernel)

    def unload(self, module: loader.LoadedModule) -> None:
        loader.unload(module)

    def bind(self, kernel: KernelHandle, plan: LaunchPlan, args: tuple[Any, ...], stream: Stream) -> BoundLaunch:
        return BoundLaunch(kernel, plan, args, stream)

    def dispatch_indirect(self, kernel: KernelHandle, plan: LaunchPlan, count: Any, args: tuple[Any, ...],
                          stream: Stream, grid: Any, threads: bool, host_read: bool | None) -> None:
        indirect.dispatch_indirect(kernel, plan, count, args, stream, grid, threads, host_read)

    def persistent_grid(self, kernel: KernelHandle, plan: LaunchPlan) -> int:
        return indirect.persistent_grid(kernel, plan)

    # -- graphs and profiling ------------------------------------------------------------------
    def capture(self, stream: Stream, *, mode: str, label: str | None, keep: Any) -> graphs.Capture:
        return graphs.Capture(stream, mode=mode, label=label, keep=keep)

    def end_capture(self, stream: Stream) -> graphs.Graph:
        return graphs.end_capture(stream)

    def timer(self) -> EventTimer:
        if self._timer is None:
            self._timer = EventTimer()
        return self._timer

    def native_view(self, buf: Any) -> None:
        """None: a launch passes the buffer's pointer."""
        return None

    def profile_stats(self) -> dict[str, dict[str, float]]:
        """Nothing of its own: the profiler times CUDA launches with :meth:`timer`'s events."""
        return {}

    def profile_table(self) -> str | None:
        return None

    def reset_profile(self) -> None:
        pass


BACKEND = CudaBackend()

if TYPE_CHECKING:  # mypy holds the backend and its plans to the contract (khal_runtime.backends)
    _backend_contract: Backend = BACKEND

    def _plan_contract(plan: LaunchPlan) -> ContractPlan:
        return plan
