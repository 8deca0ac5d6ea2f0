"""The backend seam: which backend runs kernels, and what the generic layer asks of it.

Two backends implement :class:`Backend`: CUDA (:mod:`khal_runtime.backends.cuda`, the
driver API through cuda-bindings) and WebGPU (:mod:`khal_runtime.backends.webgpu`, wgpu-py).
The generic modules (``device``, ``buffers``, ``kernels``, ``graphs``, ``tracing``) call a
backend only through this interface and never import a backend package: :func:`get` loads
one by name, like a plugin, the first time it is needed. That keeps ``import khal_runtime``
free of cuda-bindings and wgpu, and every import pointing down the layers (ARCHITECTURE.md).

``KHAL_BACKEND`` (read at first use): ``auto`` (default) uses CUDA when it is usable and every
package loaded so far (:func:`consider`, called by ``khal_runtime.load``) has a CUDA binary for
the device (a cubin of its arch, or PTX the driver can JIT); else WebGPU when an adapter exists
and those packages have WebGPU artifacts, printing one line to stderr that says why CUDA was not
used (and that an NVIDIA device is visible, if one is); ``cuda`` and ``webgpu`` force one, and a
forced backend that is unusable is a hard error, never a substitute. The choice is made once per
process, at the first use of the runtime: buffers, streams and loaded crates belong to one
backend, so a package loaded after it runs on the backend already chosen.

:func:`prestart` (called when a shader package imports the runtime, and by
``khal_runtime.load()``) lets the likely backend start its first-use work early, in the
background: CUDA's driver initialisation (:func:`khal_runtime.backends.cuda.driver.prestart`,
``KHAL_EAGER_INIT``).
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Protocol

from khal_runtime.errors import BackendFallbackWarning, BackendUnavailableError, BackendVarError, EnvVarError, unimplemented

if TYPE_CHECKING:
    from khal_runtime.device import Device, Stream
    from khal_runtime.manifest import Crate, Entry, Param

__all__ = [
    "BACKEND_ENV",
    "MODES",
    "Backend",
    "BackendStatus",
    "DirectLaunch",
    "KernelHandle",
    "LaunchPlan",
    "check_plan",
    "backend_mode",
    "backend_status",
    "chosen",
    "consider",
    "loaded",
    "current",
    "prestart",
    "for_crate",
    "is_current",
    "get",
    "reset",
]

BACKEND_ENV = "KHAL_BACKEND"
MODES = ("auto", "cuda", "webgpu")
#: backend name -> module holding its ``BACKEND`` object
_MODULES = {"cuda": "khal_runtime.backends.cuda", "webgpu": "khal_runtime.backends.webgpu"}


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run kernels here, and why not."""

    usable: bool
    reason: str = ""
    #: the backend's name ("cuda" / "webgpu"); in :func:`backend_status`: the one chosen
    backend: str = ""
    driver_version: tuple[int, int] | None = None
    device_count: int = 0
    #: WebGPU: adapter name, backend type (Vulkan/Metal/DX12), adapter type (CPU/GPU)
    adapter: dict[str, str] = field(default_factory=dict)
    #: why the chosen backend was chosen (``auto``: why CUDA was not used)
    why: str = ""


class KernelHandle(Protocol):
    """What a backend, its plans' code and the generic call path (:mod:`khal_runtime.calls`) ask of
    a kernel: :class:`khal_runtime.kernels.Kernel` implements it. Read through this contract, never
    through the kernel's private members (``tests/test_architecture.py`` checks)."""

    entry: Entry
    #: the entry's name, and its crate's
    name: str
    crate: str
    #: the compiled block, the grid dimensions its count has (1: ``k(n)``; 2 / 3: ``k((nx, ny))``)
    #: and the dynamic shared memory its typed call launches with
    block_size: tuple[int, int, int]
    grid_dims: int
    dynamic_shared: int

    @property
    def params(self) -> tuple[Param, ...]: ...

    def ready_plan(self, device_id: int) -> LaunchPlan:
        """The plan on ``device_id`` (made on first use), with that device's context current here."""

    def resolve_stream(self, stream: Any) -> Stream:
        """``stream=`` of a call resolved (None: this thread's stream) after the crate's backend is chosen."""

    def adopt(self, plan: LaunchPlan, args: tuple[Any, ...]) -> Callable[..., None] | None:
        """Take up ``plan``'s call after the plan learnt the types of ``args``; the call when it is new."""

    def check_args(self, *args: Any) -> None:
        """Validate arguments without launching (named errors)."""

    def launch(self, grid: Any, block: Any, *args: Any, stream: Any = None, shared_mem: int | None = None,
               cluster: Any = None) -> None:
        """The explicit launch (every argument checked)."""


class DirectLaunch(NamedTuple):
    """What a front that reads, checks and packs its own values launches an entry with
    (:meth:`LaunchPlan.direct`; the Triton call, :mod:`khal_runtime.triton`): ``pack(block, 0,
    *values)`` (the plan's ``struct.Struct.pack_into``: plain ints and floats, ``struct.error``
    out of range), ``new_block()`` (an argument block, its ``void*[]`` and that array's address),
    ``launch(function, gx, gy, gz, bx, by, bz, shmem, cu_stream, addr, 0)`` (``cuLaunchKernel``),
    ``failed(result, gx, gy, gz, bx, by, bz)`` (the named error of a failed launch), and for a
    launch repeated with the same block, grid and stream: ``prepared(*prepare(function, grid,
    block, shmem, cu_stream, addr))`` (CUDA's ``launch_call``)."""

    function: Any
    pack: Callable[..., None]
    new_block: Callable[[], tuple[Any, Any, int]]
    launch: Callable[..., Any]
    failed: Callable[..., None]
    prepared: Callable[..., Any]
    prepare: Callable[..., tuple[Any, ...]]


class LaunchPlan(Protocol):
    """What a backend's plan for one entry on one device offers the generic layer (``Kernel``,
    Triton families, tracing, launch hooks): the whole contract both backends implement (CUDA's
    :class:`khal_runtime.backends.cuda.launch.LaunchPlan`, WebGPU's ``WebGpuPlan``), checked
    when a backend's first plan is made (:func:`check_plan`), not at the first use of a member.
    The generic layer asks a plan nothing else: no member is probed (``hasattr``) or read past
    this contract.

    Calls go one way, down: the kernel reads ``call`` and installs it; the plan's code sends
    what it does not handle to :func:`khal_runtime.calls.slow_call`, which it imports (a layer
    below the backends); nothing is handed down for the plan to call back. A plan whose state
    changes (a type learnt, launch hooks installed) makes its code again when it is next read:
    ``run`` and ``call`` are generated at most once per state."""

    entry: Entry
    #: the crate's name
    crate: str
    device_id: int
    @property
    def run(self) -> Callable[..., None]:
        """The explicit launch, ``run(gx, gy, gz, bx, by, bz, shmem, stream, args)``: every argument
        read and checked (a generated function on CUDA, an attribute replaced when the state changes)."""

    @property
    def call(self) -> Callable[..., None]:
        """The kernel's call on this device for the plan's current state, ``(n, *args,
        stream=None)``, made when first read after a change (a property on CUDA); it holds the
        kernel, so ``Kernel`` installs it as its ``func`` with nothing to prepend. Off its fast
        paths it calls ``khal_runtime.calls.slow_call(kernel, n, args, stream)``; meeting an
        argument type it was not made for, it raises ``khal_runtime.calls.Restate`` inside and
        takes that path, which reads ``call`` again."""

    def learn(self, args: tuple[Any, ...]) -> bool:
        """Record what the types of ``args`` ask of the plan's code (an array type to inline...),
        before it is made, so a first launch makes it once; True when the state changed. An
        argument it cannot read is left for the launch to diagnose."""

    def regenerate_code(self) -> None:
        """Launch hooks were installed or removed: ``run`` is made again when next used."""

    def clustered_run(self, cluster: tuple[int, int, int]) -> Callable[..., None]:
        """``run`` launching thread-block clusters of ``cluster`` blocks (``launch(...,
        cluster=...)``, for a kernel compiled without cluster dims), checked against the device;
        a backend without clusters raises :class:`~khal_runtime.errors.LaunchAttributeError`."""

    def cooperative_limit(self, threads: int, shared: int) -> int:
        """The most blocks of ``threads`` threads and ``shared`` bytes of dynamic shared memory
        that can be co-resident (the largest cooperative grid); a backend without cooperative
        launches raises :class:`~khal_runtime.errors.LaunchAttributeError`."""

    def direct(self) -> DirectLaunch | None:
        """The parts of a launch for a front that packs its own values, or None when this plan's
        launches need more than a pack and a launch call (then the front calls ``run``)."""


#: the members of :class:`LaunchPlan`, checked on each backend's first plan
_PLAN_MEMBERS = ("entry", "crate", "device_id", "run", "call", "learn", "regenerate_code", "clustered_run",
                 "cooperative_limit", "direct")
#: those that must be callable (``call`` is not read to check it: reading it makes it)
_PLAN_CALLABLE = ("run", "learn", "regenerate_code", "clustered_run", "cooperative_limit", "direct")
_checked_plans: set[type] = set()


def _has(plan: Any, member: str) -> bool:
    """Whether ``plan`` has ``member``, without reading a property (which may generate code)."""
    return any(member in vars(c) for c in type(plan).__mro__) or member in getattr(plan, "__dict__", {})


def check_plan(plan: Any, backend: str) -> LaunchPlan:
    """``plan``, after checking once per plan type that it offers every member of
    :class:`LaunchPlan` (as pluggy checks an implementation against its spec when it is
    registered): a backend missing one fails here, naming it, not at some later launch."""
    tp = type(plan)
    if tp not in _checked_plans:
        lacks = unimplemented(plan, _PLAN_MEMBERS, _PLAN_CALLABLE, _has)
        if lacks is not None:
            raise TypeError(f"the {backend} backend's plan {tp.__qualname__} does not implement LaunchPlan: {lacks}")
        _checked_plans.add(tp)
    return plan  # type: ignore[no-any-return]


class Backend(Protocol):
    """What the generic layer asks of a backend. ``Device`` / ``Stream`` objects are the
    generic classes of :mod:`khal_runtime.device`; ``native`` values are the backend's own."""

    name: str

    # -- availability --------------------------------------------------------------------------
    def status(self) -> BackendStatus: ...

    # -- devices and streams -------------------------------------------------------------------
    def open_device(self, ordinal: int) -> Any: ...
    def make_current(self, device: Device) -> None: ...
    def create_stream(self, device: Device) -> Stream: ...
    def destroy_stream(self, stream: Stream) -> None: ...
    def native_stream(self, handle: int) -> Any: ...
    def stream_device(self, handle: int) -> int: ...
    def is_legacy_stream(self, handle: int) -> bool: ...
    #: a handle that names another stream in each thread (CUDA's ``CU_STREAM_PER_THREAD``): what is
    #: kept per stream (Triton scratch, an indirect dispatch's count word) is kept per thread for it
    def is_per_thread_stream(self, handle: int) -> bool: ...
    def synchronize(self, stream: Stream) -> None: ...
    def synchronize_device(self, device: Device) -> None: ...
    def is_capturing(self, stream: Stream) -> bool: ...
    def wait_event(self, stream: Stream, event: Any) -> None: ...

    # -- memory (``buf``: a :class:`khal_runtime.DeviceBuffer` of this backend) ----------------
    def alloc(self, device: Device, nbytes: int, what: str) -> tuple[int, Any]: ...
    def free(self, device_id: int, allocation: Any) -> None: ...
    def copy_from_host(self, buf: Any, host: Any, stream: Stream) -> None: ...
    def copy_to_host(self, host: Any, buf: Any, stream: Stream) -> None: ...
    def fill_zero(self, buf: Any, stream: Stream) -> None: ...
    def native_view(self, buf: Any) -> Any:
        """The backend's own object over ``buf``'s bytes, what its launch path binds (WebGPU's
        ``WgpuArray``), or None where a launch passes the pointer (CUDA)."""

    # -- kernels (``crate``: a :class:`khal_runtime.kernels.CrateKernels`) ----------------------
    def missing_binary(self, crate: Crate, package: str) -> str | None:
        """Why this backend has nothing to run ``crate`` with on this machine (CUDA: no cubin
        for the first device's arch and no PTX its driver can JIT; WebGPU: no WGSL / SPIR-V),
        or None when it has; loads nothing. Asked only of a usable backend."""
    def load_crate(self, crate: Any, device_id: int) -> Any: ...
    def plan(self, kernel: KernelHandle, module: Any, device_id: int) -> LaunchPlan: ...
    def unload(self, module: Any) -> None: ...
    def bind(self, kernel: KernelHandle, plan: Any, args: tuple[Any, ...], stream: Stream) -> Any: ...
    def dispatch_indirect(self, kernel: KernelHandle, plan: Any, count: Any, args: tuple[Any, ...],
                          stream: Stream, grid: Any, threads: bool, host_read: bool | None) -> None: ...

    # -- graphs and profiling ------------------------------------------------------------------
    def capture(self, stream: Stream, *, mode: str, label: str | None, keep: Any) -> Any: ...
    def end_capture(self, stream: Stream) -> Any: ...
    def timer(self) -> Any:
        """A per-launch timer for the profiler (``start``/``stop``/``elapsed_ms``, ``what``), or
        None where the backend times its launches itself and reports them through
        :meth:`profile_stats` / :meth:`profile_table` (WebGPU)."""
    def profile_stats(self) -> dict[str, dict[str, float]]:
        """The launches this backend timed itself, per kernel (empty where the profiler's timer did)."""
    def profile_table(self) -> str | None:
        """This backend's part of ``khal_runtime.profile()`` (None: nothing of its own)."""
    def reset_profile(self) -> None:
        """Forget what :meth:`profile_stats` reports."""


_lock = threading.Lock()
_loaded: dict[str, Backend] = {}
_current: Backend | None = None
_why = ""
#: (package, crate) of every package loaded under ``auto`` before the choice (:func:`consider`)
_considered: list[tuple[str, Crate]] = []


def _warn(message: str) -> None:
    # stacklevel 4: past _choose and current(), at the first use that made the choice
    warnings.warn(message, BackendFallbackWarning, stacklevel=4)


#: what ``auto``'s fallback reports, once per process (the choice is made once): a
#: BackendFallbackWarning, which users filter like any warning (tests redirect it)
_report: Callable[[str], None] = _warn


def backend_mode() -> str:
    """``KHAL_BACKEND``: "auto" (unset), "cuda" or "webgpu"; anything else is an error."""
    raw = os.environ.get(BACKEND_ENV, "").strip()
    mode = raw.lower() or "auto"
    if mode not in MODES:
        raise BackendVarError(
            f"{BACKEND_ENV}={raw!r} is not a backend khal_runtime provides; "
            f"use one of {', '.join(MODES)} (or leave it unset for auto-detection)", variable=BACKEND_ENV, value=raw)
    return mode


def get(name: str) -> Backend:
    """The backend called ``name``, its package imported on first use (a plugin lookup: the
    generic layer depends on the :class:`Backend` interface, not on an implementation)."""
    b = _loaded.get(name)
    if b is None:
        module = importlib.import_module(_MODULES[name])
        b = _loaded.setdefault(name, module.BACKEND)
    return b


def _nvidia_visible() -> bool:
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def _choose() -> tuple[Backend, str]:
    mode = backend_mode()
    if mode != "auto":
        b = get(mode)
        st = b.status()
        if not st.usable:
            hint = (" An NVIDIA device is visible (/dev/nvidiactl): the NVIDIA driver or "
                    "cuda-bindings install is probably broken." if mode == "cuda" and _nvidia_visible() else "")
            raise BackendUnavailableError(f"{BACKEND_ENV}={mode}: {st.reason}{hint}")
        return b, f"{BACKEND_ENV}={mode}"
    cuda = get("cuda")
    cst = cuda.status()
    missing = None
    if cst.usable:
        missing = next((m for p, c in _considered if (m := cuda.missing_binary(c, p)) is not None), None)
        if missing is None:
            return cuda, "CUDA is usable"
    webgpu: Backend | None = None
    try:
        webgpu = get("webgpu")
        wst = webgpu.status()
    except ImportError as exc:  # pragma: no cover - the package ships with the runtime
        wst = BackendStatus(False, f"the WebGPU backend cannot be imported ({exc})", "webgpu")
    name = wst.adapter.get("name", "an adapter")
    kind = wst.adapter.get("adapter_type", "")
    adapter = f"{name}{', ' + kind if kind else ''}"
    if missing is not None:
        # CUDA works, but a loaded package has no binary for the device: WebGPU only where it
        # can run every loaded package (else CUDA, and that crate's load names the missing binary)
        if not wst.usable or webgpu is None or any(webgpu.missing_binary(c, p) is not None for p, c in _considered):
            return cuda, f"CUDA is usable (but {missing}, and WebGPU cannot run every loaded package)"
        _report(f"KHAL_BACKEND=auto: {missing}; using WebGPU ({adapter})")
        return webgpu, f"{missing}; fell back to WebGPU"
    if not wst.usable:
        cuda_only = [f"{p!r}" for p, c in _considered if webgpu.missing_binary(c, p) is not None] \
            if _considered and webgpu is not None else []
        if cuda_only and len(cuda_only) == len(_considered):
            # installing wgpu cannot help: nothing loaded has a WebGPU build
            pkgs = ", ".join(dict.fromkeys(cuda_only))
            raise BackendUnavailableError(
                f"{cst.reason}; and no WebGPU fallback: the loaded package(s) {pkgs} ship no WebGPU "
                "build (CUDA C++ crates run on CUDA only; a Slang crate ships WGSL / SPIR-V too)")
        raise BackendUnavailableError(
            f"{cst.reason}; and no WebGPU fallback: {wst.reason}")
    assert webgpu is not None  # usable, so imported
    hint = (" An NVIDIA device is visible (/dev/nvidiactl): this probably hides a broken CUDA "
            "setup; set KHAL_BACKEND=cuda to see the error.") if _nvidia_visible() else ""
    line = (f"KHAL_BACKEND=auto: using WebGPU ({adapter}) because "
            f"CUDA is not usable: {cst.reason}.{hint}")
    _report(line)
    return webgpu, f"CUDA is not usable ({cst.reason}); fell back to WebGPU"


def consider(package: str, crates: tuple[Crate, ...]) -> None:
    """Let ``auto``'s choice, when it is still to be made, check that ``package``'s crates have a
    binary for the backend it picks (``khal_runtime.load`` calls it; nothing is loaded or
    initialised here)."""
    with _lock:
        if _current is None:
            _considered.extend((package, c) for c in crates)


def prestart() -> None:
    """Let the backend this process will likely choose start its first-use work now, in the
    background, to overlap the imports that follow: CUDA's driver initialisation
    (:func:`khal_runtime.backends.cuda.driver.prestart`, which decides whether CUDA is likely and
    honours ``KHAL_EAGER_INIT``). Nothing when ``KHAL_BACKEND`` is ``webgpu`` (or not a backend:
    ``load`` reports that) or a backend is chosen already. Imports the CUDA package, which is
    light (its driver module); raises only EnvVarError (``KHAL_EAGER_INIT``)."""
    if _current is not None:
        return
    try:
        mode = backend_mode()
    except EnvVarError:
        return  # load() reports it
    if mode == "webgpu":
        return
    try:
        start = getattr(importlib.import_module(_MODULES["cuda"]), "prestart", None)
    except ImportError:  # pragma: no cover - the package ships with the runtime
        return
    if start is not None:
        start()


def current() -> Backend:
    """The backend of this process, chosen on first use (BackendUnavailableError saying why
    when there is none)."""
    global _current, _why
    b = _current
    if b is None:
        with _lock:
            if _current is None:
                _current, _why = _choose()
                _considered.clear()
            b = _current
    return b


def is_current(backend: Backend) -> bool:
    """Whether ``backend`` is the one this process chose (no lock: safe in ``__del__``)."""
    return _current is backend


def for_crate(has_webgpu: bool, what: str, why_not: str = "it was built for CUDA only") -> Backend:
    """The backend to run a crate on: :func:`current`, except that ``auto`` never falls back to
    WebGPU for a crate without WebGPU artifacts (CUDA C++ or Triton sources, or a Slang crate built
    without its WebGPU stage; ``why_not`` says which): where CUDA is unusable that is an error
    saying why, and no fallback is chosen for it."""
    b = _current
    if b is not None:
        return b
    if not has_webgpu and backend_mode() == "auto":
        st = get("cuda").status()
        if not st.usable:
            raise BackendUnavailableError(
                f"{st.reason}; and {what} has no WebGPU build to fall back to ({why_not})")
    return current()


def backend_status() -> BackendStatus:
    """The chosen backend (choosing it now if needed), its devices or adapter, and why it was
    chosen; ``usable=False`` with the reason when no backend can run kernels here."""
    try:
        b = current()
    except (BackendUnavailableError, EnvVarError) as exc:
        return BackendStatus(False, str(exc), "", why=str(exc))
    st = b.status()
    return BackendStatus(st.usable, st.reason, b.name, st.driver_version, st.device_count,
                         dict(st.adapter), _why)


def chosen() -> str | None:
    """The name of the backend this process chose, None while none is chosen (nothing is chosen
    to answer)."""
    with _lock:
        return _current.name if _current is not None else None


def loaded() -> list[Backend]:
    """The backends whose package has been imported (none is imported to answer)."""
    with _lock:
        return list(_loaded.values())


def reset() -> None:
    """Forget the chosen backend (tests; a changed ``KHAL_BACKEND``)."""
    global _current, _why
    with _lock:
        _current = None
        _why = ""
        _considered.clear()
