""":class:`WebGpuBackend`: the WebGPU package seen through :class:`khal_runtime.backends.Backend`.

The generic layer's objects map onto this package's as follows: a :class:`~khal_runtime.Device`
holds a :class:`~.device.WebGpuDevice`; a :class:`~khal_runtime.Stream` holds the device's one
:class:`~.stream.CommandStream` (WebGPU has one queue per device: every stream of a device is
that queue, in order); a :class:`~khal_runtime.DeviceBuffer` holds an :class:`~.memory.Allocation`
and, as ``_native``, a :class:`~.arrays.WgpuArray` over its bytes (what the launch path binds);
a kernel's plan on a device is a :class:`WebGpuPlan` over a :class:`~.kernel.KernelPlan`; a
capture records launches into a :class:`~.recording.Recording`, replayed as one submit.

A ``DeviceBuffer``'s ``ptr`` on WebGPU is an address in a range of its own per allocation
(``serial << 40``), never dereferenced: it keeps slicing, identity and ordering the same as on
CUDA (``ptr - root.ptr`` is the byte offset into the wgpu buffer).
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any, Callable

from khal_runtime import capture_state
from khal_runtime.backends import BackendStatus, KernelHandle
from khal_runtime.backends.webgpu import device as _dev
from khal_runtime.backends.webgpu import kernel as _kernel
from khal_runtime.backends.webgpu import memory, profiling, recording
from khal_runtime.backends.webgpu.arrays import WgpuArray
from khal_runtime.backends.webgpu.artifacts import entry_code
from khal_runtime.backends.webgpu.pipeline import select_target
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.calls import slow_call
from khal_runtime.device import Device, Stream, as_stream
from khal_runtime.errors import ArgumentError, BackendUnavailableError, CaptureError, KhalError, LaunchAttributeError
from khal_runtime.graphs import Graph
from khal_runtime.languages import language_for
from khal_runtime.launch_hooks import hooks
from khal_runtime.verify import check_launch_facts, read_artifact

if TYPE_CHECKING:
    from khal_runtime.backends import Backend
    from khal_runtime.backends import LaunchPlan as ContractPlan
    from khal_runtime.manifest import Crate

__all__ = ["BACKEND", "WebGpuBackend", "WebGpuPlan"]

#: bits of a DeviceBuffer's ``ptr`` below the allocation's serial: its byte offset
_ADDRESS_BITS = 40


class _DeviceInfo:
    """What the generic Device holds on WebGPU."""

    def __init__(self, dev: _dev.WebGpuDevice) -> None:
        self.handle = dev
        self.context = None
        self.name = dev.info.name
        self.arch = f"webgpu ({dev.info.backend_type}, {dev.info.adapter_type})"

    def compute_capability(self) -> tuple[int, int]:
        raise KhalError(f"{self.name} is a WebGPU device: it has no CUDA compute capability")

    @property
    def sm_count(self) -> int:
        raise KhalError(f"{self.name} is a WebGPU device: it has no CUDA multiprocessor count")


class _Module:
    """A crate "loaded" on a WebGPU device: its entries' checked shader code, read lazily."""

    def __init__(self, crate: Any, device: _dev.WebGpuDevice) -> None:
        self.crate = crate
        self.device = device


class WebGpuPlan:
    """One entry on one WebGPU device, as the generic Kernel uses a plan.

    While launch hooks are installed (tracing, profiling: :mod:`khal_runtime.launch_hooks`) every launch
    goes through ``hooks.dispatch`` as on CUDA, so the trace line, ``sync`` mode and NVTX ranges
    are the generic ones; without hooks the call is the kernel plan's specialised one."""

    def __init__(self, kernel: KernelHandle, kp: _kernel.KernelPlan, device_id: int, crate: str) -> None:
        self.entry = kp.entry
        self.crate = crate
        self.kp = kp
        self.device_id = device_id
        self.kernel = kernel
        #: hooks installed -> the kernel's call made for that (:attr:`call`)
        self._calls: dict[bool, Callable[..., None]] = {}

    def regenerate_code(self) -> None:
        """Hooks were installed or removed: nothing to make again (``run`` asks the hooks at each
        launch; :attr:`call` is made per hook state)."""

    def learn(self, args: tuple[Any, ...]) -> bool:
        """Nothing: the kernel plan's call reads every argument type alike."""
        return False

    def clustered_run(self, cluster: tuple[int, int, int]) -> Callable[..., None]:
        """Refused: WebGPU has no thread-block clusters."""
        raise LaunchAttributeError(f"{self.entry.name}.launch(): cluster={cluster} is for CUDA on sm_90+; the "
                                   "webgpu backend has no thread-block clusters")

    def cooperative_limit(self, threads: int, shared: int) -> int:
        """Refused: WebGPU has no cooperative launches (a cooperative entry is refused at its plan)."""
        raise LaunchAttributeError(f"{self.entry.name}: not a cooperative entry on the webgpu backend")

    def direct(self) -> None:
        """None: a front launches through :meth:`run`."""
        return None

    def run(self, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int, st: Stream,
            args: tuple[Any, ...]) -> None:
        if hooks.active and hooks.dispatch is not None:
            hooks.dispatch(self, (gx, gy, gz), (bx, by, bz), shmem, st, args,
                           lambda: self.kp.launch((gx, gy, gz), (bx, by, bz), args, shmem))
            return
        self.kp.launch((gx, gy, gz), (bx, by, bz), args, shmem)

    @property
    def call(self) -> Callable[..., None]:
        """The kernel's call on this device while hooks are (not) installed: the kernel plan's
        specialised call, or through ``hooks.dispatch``; another device takes the generic
        :func:`khal_runtime.calls.slow_call`."""
        active = hooks.active
        fn = self._calls.get(active)
        if fn is None:
            fn = self._calls[active] = self._hooked_call() if active else self._plain_call()
        return fn

    def _plain_call(self) -> Callable[..., None]:
        call = self.kp.call
        device_id = self.device_id
        kernel = self.kernel

        def __call__(n: Any, *args: Any, stream: Any = None) -> None:
            if stream is not None:
                st = stream if type(stream) is Stream else as_stream(stream)
                if st.device_id != device_id:
                    slow_call(kernel, n, args, st)
                    return
            call(n, args)

        return __call__

    def _hooked_call(self) -> Callable[..., None]:
        call = self.kp.call
        block = tuple(self.kp.block)
        bx = block[0]
        plan = self
        kernel = self.kernel

        def __call__(n: Any, *args: Any, stream: Any = None) -> None:
            st = kernel.resolve_stream(stream)
            if st.device_id != plan.device_id:
                slow_call(kernel, n, args, st)
                return
            grid = ((n + bx - 1) // bx, 1, 1) if type(n) is int else (n,)
            dispatch = hooks.dispatch
            if dispatch is None:
                call(n, args)
                return
            dispatch(plan, grid, block, 0, st, args, lambda: call(n, args))

        return __call__


class _Graph(Graph):
    """A WebGPU "graph": the launches recorded once, replayed as one command encoder and one
    submit (WebGPU has no graphs)."""

    def __init__(self, rec: recording.Recording, stream: Stream) -> None:  # noqa: D107
        self._rec = rec
        self.stream = stream
        self.label = rec.label
        self.device_id = stream.device_id
        self.kernels: list[str] = []
        self._fn: Callable[..., Any] | None = None

    @property
    def node_count(self) -> int:
        return int(self._rec.dispatch_count)

    def upload(self, stream: Any = None) -> Graph:
        return self

    def launch(self, stream: Any = None) -> None:
        st = self.stream if stream is None else as_stream(stream)
        if st.device_id != self.device_id:
            raise KhalError(f"graph {self.label!r} belongs to WebGPU device {self.device_id}")
        if hooks.active:
            graph_launch = getattr(hooks.dispatch, "graph_launch", None)
            if graph_launch is not None:
                graph_launch(self, st, self._rec.launch)
                return
        self._rec.launch()

    def update(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        self._rec.update(fn, *args, **kwargs)
        if fn is not None:
            self._fn = fn
        return True

    def close(self) -> None:
        self._rec.close()

    def __repr__(self) -> str:
        return f"<Graph {self.label!r} (WebGPU recording, {self.node_count} dispatches)>"


class _Capture:
    """A capture on a WebGPU stream: this package's recording, known to the generic capture
    guards (:mod:`khal_runtime.capture_state`) while it is open."""

    def __init__(self, backend: WebGpuBackend, stream: Stream, label: str | None, keep: Any) -> None:
        self._backend = backend
        self.stream = stream
        self._cap = recording.Capture(stream.native, label=label, keep=keep)
        self.label = self._cap.label
        self.graph: _Graph | None = None
        self.kernels: list[str] = []

    def begin(self) -> _Capture:
        with self._backend._lock:
            if self.stream.handle in self._backend._open:
                raise CaptureError(f"stream 0x{self.stream.handle:x} is already capturing; end that capture first")
            self._cap.begin()
            self._backend._open[self.stream.handle] = self
        capture_state.push(self)
        return self

    def _done(self) -> None:
        capture_state.pop(self)
        with self._backend._lock:
            self._backend._open.pop(self.stream.handle, None)

    def end(self) -> _Graph:
        try:
            rec = self._cap.end()
        finally:
            self._done()
        capture_state.flush_deferred()
        self.graph = _Graph(rec, self.stream)
        self.graph.kernels = self.kernels  # what the trace / profiler saw launched into it
        return self.graph

    def abort(self) -> None:
        try:
            self._cap.abort()
        finally:
            self._done()

    def __enter__(self) -> _Capture:
        return self.begin()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
            return
        self.end()


class WebGpuBackend:
    """:class:`khal_runtime.backends.Backend` on wgpu-py."""

    name = "webgpu"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, _Capture] = {}
        self._handles = itertools.count(0x7E00)
        #: timestamp-query timers by device ordinal (kept after profiling stops: the table reads them)
        self._timers: dict[int, profiling.Timer] = {}
        #: devices that cannot be profiled (no 'timestamp-query'), described for the table
        self._untimed: dict[int, str] = {}
        self._devices: dict[int, _dev.WebGpuDevice] = {}
        hooks.watch(self)

    # -- availability --------------------------------------------------------------------------
    def status(self) -> BackendStatus:
        st = _dev.status()
        adapter = {}
        if st.adapter is not None:
            adapter = {"name": st.adapter.name, "backend_type": st.adapter.backend_type,
                       "adapter_type": st.adapter.adapter_type, "vendor": st.adapter.vendor}
        return BackendStatus(st.usable, st.reason, "webgpu", None, len(st.adapters), adapter)

    # -- devices and streams -------------------------------------------------------------------
    def open_device(self, ordinal: int) -> _DeviceInfo:
        return _DeviceInfo(_dev.get_device(ordinal))

    def make_current(self, device: Device) -> None:
        pass  # WebGPU has no current context

    def create_stream(self, device: Device) -> Stream:
        dev: _dev.WebGpuDevice = device._impl.handle
        return Stream(next(self._handles), device.device_id, native=dev.stream, backend=self)

    def destroy_stream(self, stream: Stream) -> None:
        stream.native.flush()

    def native_stream(self, handle: int) -> Any:
        raise KhalError(f"stream handle 0x{handle:x}: WebGPU has no foreign streams; pass None "
                        "(the device's queue) or a khal_runtime.Stream of the device")

    def stream_device(self, handle: int) -> int:
        return self.native_stream(handle)  # type: ignore[no-any-return]

    def is_legacy_stream(self, handle: int) -> bool:
        return False

    def is_per_thread_stream(self, handle: int) -> bool:
        return False

    def synchronize(self, stream: Stream) -> None:
        stream.native.synchronize()

    def synchronize_device(self, device: Device) -> None:
        device._impl.handle.stream.synchronize()

    def is_capturing(self, stream: Stream) -> bool:
        return stream.native.capturing() is not None

    def wait_event(self, stream: Stream, event: Any) -> None:
        pass  # one queue per device: everything is already in order

    # -- memory --------------------------------------------------------------------------------
    def alloc(self, device: Device, nbytes: int, what: str) -> tuple[int, Any]:
        a = memory.alloc(device._impl.handle, nbytes)
        return a.serial << _ADDRESS_BITS, a

    def native_view(self, buf: DeviceBuffer) -> WgpuArray | None:
        """The WgpuArray over ``buf``'s bytes (what a launch binds)."""
        root = buf.root
        alloc = root._alloc
        if alloc is None:
            return None
        return WgpuArray(alloc, buf.ptr - root.ptr, buf.size, buf.dtype)

    def free(self, device_id: int, allocation: Any) -> None:
        memory.free(allocation)

    def copy_from_host(self, buf: Any, host: Any, stream: Stream) -> None:
        import numpy as np  # lazy: host copies only

        memory.upload(buf._native.view, np.ascontiguousarray(host).reshape(-1).view(np.uint8))

    def copy_to_host(self, host: Any, buf: Any, stream: Stream) -> None:
        import numpy as np  # lazy: host copies only

        data = memory.download(buf._native.view)
        host.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)

    def fill_zero(self, buf: Any, stream: Stream) -> None:
        memory.fill_zero(buf._native.view)

    # -- kernels -------------------------------------------------------------------------------
    def missing_binary(self, crate: Crate, package: str) -> str | None:
        """Why ``crate`` has no WGSL / SPIR-V to run here, or None when it has."""
        why = language_for(crate.language).webgpu_missing(crate)
        if why is not None:
            return f"package {package!r} crate {crate.name!r} has no WebGPU build: {why}"
        return None

    def load_crate(self, crate: Any, device_id: int) -> _Module:
        c = crate.crate
        why = language_for(c.language).webgpu_missing(c)
        if why is not None:
            raise BackendUnavailableError(
                f"crate {c.name!r} of package {crate.package!r} has no WebGPU (WGSL / SPIR-V) "
                f"artifacts: {why}. The backend is WebGPU because "
                f"{_why_webgpu()}; on a machine with a usable CUDA device set KHAL_BACKEND=cuda")
        if any(e.launch is not None and e.launch.source == "ptx" for e in c.entries):
            # the launch facts the explicit launch checks use are backed by the shipped PTX (read
            # here: the CUDA binaries are not otherwise read on WebGPU)
            ptx = {a.path: read_artifact(crate.package_dir, a) for a in c.artifacts if a.kind == "ptx"}
            facts = check_launch_facts(c, ptx)
            if facts:
                raise facts[0].exception()
        return _Module(crate, _dev.get_device(device_id))

    def plan(self, kernel: KernelHandle, module: _Module, device_id: int) -> WebGpuPlan:
        crate = module.crate
        entry = kernel.entry
        attrs = entry.attributes.describe() if entry.attributes is not None else ""
        if attrs:  # launch attributes are CUDA's: WebGPU has no such launch (refused, never ignored)
            raise LaunchAttributeError(
                f"entry {crate.name}.{entry.name} needs launch attributes ({attrs}) that WebGPU has no launch "
                "for; run it on CUDA (KHAL_BACKEND=cuda)")
        if crate.crate.globals:
            raise LaunchAttributeError(
                f"crate {crate.name!r} has module globals ({', '.join(g.name for g in crate.crate.globals)}), which "
                "WebGPU does not have; run it on CUDA (KHAL_BACKEND=cuda)")
        target = select_target(entry, crate.name)
        # read and checked now (sha256, the entry point's hash), as a CUDA binary is at load: a
        # pipeline cached for the same symbol must never hide a tampered artifact
        code = entry_code(crate.package_dir, crate.crate, entry, target)
        kp = _kernel.KernelPlan(entry, module.device, code, f"{crate.name}", target)
        plan = WebGpuPlan(kernel, kp, device_id, crate.name)
        self._configure(module.device)
        return plan

    def unload(self, module: Any) -> None:
        pass

    def bind(self, kernel: KernelHandle, plan: WebGpuPlan, args: tuple[Any, ...], stream: Stream) -> Any:
        return plan.kp.bind(args)

    def dispatch_indirect(self, kernel: KernelHandle, plan: WebGpuPlan, count: Any, args: tuple[Any, ...],
                          stream: Stream, grid: Any, threads: bool, host_read: bool | None) -> None:
        if grid is not None:
            raise KhalError(f"{kernel.name}.dispatch_indirect(): grid= sizes CUDA's persistent grid; "
                            "WebGPU dispatches the count natively: leave it out")
        if hooks.active and hooks.dispatch is not None:
            hooks.dispatch(plan, ("indirect",), tuple(plan.kp.block), 0, stream, args,
                           lambda: plan.kp.dispatch_indirect(count, args, threads))
            return
        plan.kp.dispatch_indirect(count, args, threads)

    # -- graphs and profiling ------------------------------------------------------------------
    def capture(self, stream: Stream, *, mode: str, label: str | None, keep: Any) -> _Capture:
        return _Capture(self, stream, label, keep)

    def end_capture(self, stream: Stream) -> _Graph:
        with self._lock:
            cap = self._open.get(stream.handle)
        if cap is None:
            raise CaptureError(f"no capture is open on stream 0x{stream.handle:x}; call begin_capture() first")
        return cap.end()

    def timer(self) -> None:
        """None: the generic profiler does not time WebGPU launches with a timer pair; each
        device's stream times its dispatches with timestamp queries (:mod:`.profiling`) while
        profiling is on, and :meth:`profile_table` reports them."""
        return None

    # hooks.watch(self): tracing or profiling switched on or off
    def regenerate_code(self) -> None:
        for dev in list(self._devices.values()):
            self._configure(dev)

    def _configure(self, dev: _dev.WebGpuDevice) -> None:
        """Timestamp profiling on ``dev`` while the installed hooks profile, off otherwise."""
        self._devices[dev.ordinal] = dev
        cfg = getattr(hooks.dispatch, "cfg", None) if hooks.active else None
        want = bool(getattr(cfg, "profile", False))
        on = dev.stream.timer is not None
        if want and not on:
            if not profiling.profiling_supported(dev):
                self._untimed[dev.ordinal] = dev.describe()
                return
            timer = self._timers.get(dev.ordinal)
            if timer is None:
                self._timers[dev.ordinal] = profiling.enable_profiling(dev)
            else:  # profiling again: the same counters go on
                with dev.stream.lock:
                    dev.stream.flush()
                    dev.stream.timer = timer
        elif on and not want:
            profiling.disable_profiling(dev)

    def profile_stats(self) -> dict[str, dict[str, float]]:
        """Per kernel (and per replayed recording): calls, total_ms, mean_us, min_us, max_us."""
        out: dict[str, dict[str, float]] = {}
        for timer in self._timers.values():
            for name, s in timer.stats().items():
                out[name] = {"calls": s["count"], "total_ms": s["total_ms"], "mean_us": s["mean_us"],
                             "min_us": s["min_us"], "max_us": s["max_us"]}
        return out

    def profile_table(self) -> str | None:
        """The WebGPU part of ``khal_runtime.profile()`` (None when nothing was profiled here)."""
        parts = [t.table() for t in self._timers.values() if t.stats()]
        parts += [f"khal WebGPU profile: {what} has no 'timestamp-query' feature: GPU times per "
                  "dispatch cannot be measured on it (time whole steps on the host instead)"
                  for what in self._untimed.values()]
        return "\n".join(parts) if parts else None

    def reset_profile(self) -> None:
        for timer in self._timers.values():
            timer.reset()


def _why_webgpu() -> str:
    from khal_runtime import backends  # lazy: only to word an error

    return backends.backend_status().why or "KHAL_BACKEND chose it"


def _x_device_buffer(b: DeviceBuffer) -> _kernel.StorageInfo:
    w = b._native
    if w is None:
        raise ArgumentError("is a DeviceBuffer of another backend, or a freed one")
    return w._res, w._et, w.size, w._bind_error, w.allocation


_kernel.register_storage_type(DeviceBuffer, _x_device_buffer)

BACKEND = WebGpuBackend()

if TYPE_CHECKING:  # mypy holds the backend and its plans to the contract (khal_runtime.backends)
    _backend_contract: Backend = BACKEND

    def _plan_contract(plan: WebGpuPlan) -> ContractPlan:
        return plan
