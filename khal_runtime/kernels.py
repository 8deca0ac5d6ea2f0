"""A loaded shader package: :func:`load` -> :class:`KernelSet` of :class:`Kernel`.

``load`` reads and validates the manifest (and, for editable installs, checks the sources
are unchanged) but does no GPU work: the binary is chosen, verified and loaded per device on
a kernel's first use, by the process's backend (:mod:`khal_runtime.backends`), so importing a
shader package works on a machine with no GPU or driver.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from khal_runtime import backends, launch_hooks
from khal_runtime.backends import LaunchPlan
from khal_runtime.arguments import check_block, check_block_within, check_grid, diagnose_args, dim3, grid3
from khal_runtime.arguments import shared_mem as check_shared_mem
from khal_runtime.device import Stream, _tls, as_stream, current_device_id, default_stream, ensure_current
from khal_runtime.languages import CrateLanguage, language_for
from khal_runtime.launch_attributes import CLUSTER_DIMS, COOPERATIVE, DEFAULT_DYNAMIC_SHARED
from khal_runtime.calls import generic_call
from khal_runtime.companions import Resolved, missing_hint
from khal_runtime.companions import resolve as resolve_companions
from khal_runtime.errors import (BackendUnavailableError, KhalError, LaunchAttributeError, ManifestError,
                                 NoCompatibleBinaryError, StaleBuildError)
from khal_runtime.manifest_load import read_manifest
from khal_runtime.manifest_records import MANIFEST_DIR, MANIFEST_NAME
from khal_runtime.verify import check_crate_hashes, check_manifest, check_sources, read_artifact

if TYPE_CHECKING:
    from khal_runtime.manifest import Crate, Entry, Manifest, Param

__all__ = ["CrateKernels", "Kernel", "KernelSet", "LaunchConfig", "ModuleGlobal", "ModuleGlobals", "find_package_dir",
           "launch", "load"]


@dataclass(frozen=True)
class LaunchConfig:
    """Grid (blocks), block (threads per block; None = the entry's block size), dynamic shared
    memory in bytes: ``khal_runtime.launch(stream, LaunchConfig(grid, block, shmem), kernel, ...)``."""

    grid: int | tuple[int, ...]
    block: int | tuple[int, ...] | None = None
    shmem: int = 0


def launch(stream: Any, config: LaunchConfig, kernel: Kernel, *args: Any) -> None:
    """``cuda.core``-style launch: ``launch(stream, LaunchConfig(grid, block, shmem), kernels.k, *args)``."""
    kernel.launch(config.grid, config.block, *args, stream=stream, shared_mem=config.shmem)


def _stream_of(stream: Any) -> Stream:
    """``stream=`` of a launch: None (this thread's owned stream), a Stream, or anything
    :func:`khal_runtime.device.as_stream` takes."""
    if stream is None:
        st: Stream | None = _tls.__dict__.get("stream")
        # outside the lookup's handler: an error making the stream (no GPU) is not chained to it
        return st if st is not None else default_stream()
    if type(stream) is Stream:
        return stream
    return as_stream(stream)


class Kernel(functools.partial):  # type: ignore[type-arg]
    """One entry point. ``k(n, *args, stream=None)`` runs ``n`` threads (grid = ceil(n / block.x));
    a 2-D / 3-D entry (``entry.grid_dims``) takes ``k((nx, ny), ...)`` / ``k((nx, ny, nz), ...)``,
    each axis rounded up to whole blocks. ``k.launch(grid, block, *args, stream=None,
    shared_mem=None)`` takes explicit dimensions: as many grid axes as the compiled kernel reads
    block ids along (``entry.launch_dims``), and ``block`` the compiled one or None, unless the
    kernel's ids do not fold it in (``entry.launch_block_fixed``): then any block within its
    launch bounds.

    Why a ``functools.partial``: calling it is the product's hot path, and CPython calls a
    partial through C-level vectorcall straight into its function, where an object with a
    Python ``__call__`` goes through a slot lookup and a bound-method call. ``func`` starts as
    the generic path (:func:`khal_runtime.calls.generic_call`, ``func(self, n, ...)``); the first
    launch makes the plan and the kernel takes up the call the backend generated for the entry on
    that device (``LaunchPlan.call``, read by :meth:`adopt`: nothing is handed down to the plan),
    which holds the kernel itself, so the partial has no arguments to prepend and forwards the
    call as it is; what that call does not handle it sends to :func:`khal_runtime.calls.slow_call`.
    The partial's own attributes (``func``, ``args``) are that machinery, not part of the API.

    What the backends and the generic call path read of a kernel is
    :class:`khal_runtime.backends.KernelHandle` (its public members below), never its private ones."""

    __slots__ = ("entry", "name", "crate", "block_size", "grid_dims", "dynamic_shared", "_crate", "_plans",
                 "_int_block_is_compiled", "_launch_dims", "_launch_block_fixed", "_shared_limit", "_lock", "_fast")

    entry: Entry
    name: str
    crate: str
    #: the compiled block (threads per block along x, y, z)
    block_size: tuple[int, int, int]
    #: the grid dimensions of the typed call's count: 1 (``k(n)``), 2 or 3 (``k((nx, ny))``)
    grid_dims: int
    #: the dynamic shared memory the typed call launches with (``KHAL_SHARED_MEM``, or what a
    #: Triton compile needs; else 0)
    dynamic_shared: int
    _crate: CrateKernels
    _plans: dict[int, LaunchPlan]
    #: ``block=<int>`` names the compiled block (it is ``(bx, 1, 1)`` and the ids fold it in)
    _int_block_is_compiled: bool
    _launch_dims: int
    _launch_block_fixed: bool
    _shared_limit: int
    _lock: threading.Lock
    #: the plan whose call is this kernel's (its first device's), None before the first launch
    _fast: LaunchPlan | None

    def __new__(cls, crate: CrateKernels, entry: Entry) -> Kernel:
        self = super().__new__(cls, generic_call)
        self._set_call(generic_call, self)
        self._fast = None
        self.entry = entry
        self.name = entry.name
        self.crate = crate.name
        self._crate = crate
        self._plans = {}
        bx, by, bz = (int(x) for x in entry.block_size)
        self.block_size = (bx, by, bz)
        self._int_block_is_compiled = by == bz == 1 and entry.launch_block_fixed
        self.grid_dims = entry.grid_dims
        # the compiled kernel's launch facts (re-derived from the shipped PTX when the crate loads,
        # before any launch): grid axes an explicit launch may use, whether it must use the block
        self._launch_dims, self._launch_block_fixed = entry.launch_dims, entry.launch_block_fixed
        # launch attributes (KHAL_SHARED_MEM): the typed call's dynamic shared memory, and the most
        # an explicit launch may ask for (beyond 48 KB only what the entry declared)
        self.dynamic_shared = entry.dynamic_shared
        self._shared_limit = max(self.dynamic_shared, DEFAULT_DYNAMIC_SHARED)
        self._lock = threading.Lock()
        return self

    def __init__(self, crate: CrateKernels, entry: Entry) -> None:  # state set in __new__
        pass

    def _set_call(self, fn: Callable[..., None], *bound: Any) -> None:
        """What calling this kernel runs: ``fn(*bound, n, *args, stream=None)``."""
        functools.partial.__setstate__(self, (fn, bound, None, None))  # type: ignore[attr-defined]

    def __reduce__(self) -> Any:
        raise TypeError(f"Kernel {self.name!r} cannot be pickled: it holds loaded GPU code; "
                        f"pickle the package name and call khal_runtime.load() on the other side")

    @property
    def params(self) -> tuple[Param, ...]:
        return self.entry.params

    def plan(self, device_id: int) -> LaunchPlan:
        """The backend's launch plan on a device (loads the crate there on first use); the
        kernel's call becomes the plan's, when it is the kernel's first device (a warm-up: the
        call is generated now, and again when a launch brings argument types it has not seen)."""
        p = self._plan(device_id)
        if self.grid_dims == 1:  # 2-D / 3-D entries keep the generic path: a plan's call is for 1-D counts
            self.adopt(p, ())
        return p

    def _plan(self, device_id: int) -> LaunchPlan:
        """The plan on a device, made on first use."""
        p = self._plans.get(device_id)
        if p is None:
            with self._lock:
                p = self._plans.get(device_id)
                if p is None:
                    module = self._crate.module(device_id)
                    backend = self._crate.backend
                    p = backends.check_plan(backend.plan(self, module, device_id), backend.name)
                    self._plans[device_id] = p
        return p

    def ready_plan(self, device_id: int) -> LaunchPlan:
        """The plan on ``device_id``, with that device's context current in this thread."""
        plan = self._plans.get(device_id)
        if plan is None:  # made outside any except block: its errors come unchained
            plan = self._plan(device_id)
        if getattr(_tls, "dev", -1) != device_id:
            ensure_current(device_id)
        return plan

    def adopt(self, plan: LaunchPlan, args: tuple[Any, ...]) -> Callable[..., None] | None:
        """Make this kernel's call the one ``plan`` offers now, after the plan learnt the types of
        ``args`` (so it is generated once for them): only for the plan of the first device the
        kernel ran on (other devices take :func:`khal_runtime.calls.slow_call`); the kernel is then
        watched by the launch hooks, which make it read its plan's call again when they come or go
        (:meth:`regenerate_code`). Returns the call when it is new, None when there is none or the
        kernel has it already (a call that sent its launch here is never given it back)."""
        fast = self._fast
        if fast is None:
            with self._lock:
                if self._fast is None:
                    self._fast = plan
                    launch_hooks.hooks.watch(self)
                fast = self._fast
        if fast is not plan:
            return None
        if args:
            plan.learn(args)
        fn: Callable[..., None] = plan.call
        if fn is self.func:
            return None
        self._set_call(fn)
        return fn

    def regenerate_code(self) -> None:
        """Launch hooks came or went (the kernel is watched once it has a plan's call): read the
        plan's call again, which is made for the hooks now installed."""
        p = self._fast
        if p is not None:
            self._set_call(p.call)

    def resolve_stream(self, stream: Any) -> Stream:
        """``stream=`` resolved, after this crate's backend is chosen (``auto`` must not fall back
        to WebGPU for a crate without a WebGPU build because a stream was made first)."""
        if self._crate._backend is None:
            self._crate.backend  # noqa: B018
        return _stream_of(stream)

    def launch(self, grid: Any, block: Any, *args: Any, stream: Any = None, shared_mem: int | None = None,
               cluster: Any = None) -> None:
        """Launch ``grid`` blocks of the compiled block size (``block``: None, or that size);
        ``shared_mem``: bytes of dynamic shared memory (None: what the entry declares with
        ``KHAL_SHARED_MEM``, else 0); ``cluster``: blocks per thread-block cluster (an int or up to
        three dims; CUDA on sm_90+, for a kernel compiled without ``KHAL_CLUSTER``), the grid a
        multiple of it. A grid with a 0 in it (``cdiv(0, BLOCK)``) launches nothing: the arguments
        are checked as for a launch, and the call returns (a negative grid is an error)."""
        if shared_mem is None:
            shared_mem = self.dynamic_shared
        st = self.resolve_stream(stream)
        plan = self.ready_plan(st.device_id)
        if type(grid) is int and 0 < grid <= 2**31 - 1:
            gx, gy, gz = grid, 1, 1
        else:
            gx, gy, gz = grid3(grid, f"{self.name}.launch(): grid")
            check_grid(self.name, (gx, gy, gz), self._launch_dims)
        bx, by, bz = self.block_size
        if block is not None and not (type(block) is int and block == bx and self._int_block_is_compiled):
            b = dim3(block, f"{self.name}.launch(): block")
            if self._launch_block_fixed:
                check_block(self.name, b, (bx, by, bz))
            else:
                check_block_within(self.name, b, self.entry.max_block_threads)
                bx, by, bz = b
        shmem = shared_mem if type(shared_mem) is int and 0 <= shared_mem < 2**32 else \
            check_shared_mem(self.name, shared_mem)
        if shmem > self._shared_limit:
            raise LaunchAttributeError(
                f"{self.name}.launch(): shared_mem={shmem} bytes is more than the entry declares ({self._shared_limit} "
                f"bytes{'' if self.dynamic_shared else ': the limit without a declaration'}); declare "
                f"KHAL_SHARED_MEM({shmem}) in its KHAL_ENTRY marker (above 48 KB the function is opted in once, at load)")
        if cluster is not None:
            run = self._clustered(plan, cluster)
        else:
            run = plan.run
        if not (gx and gy and gz):  # an empty grid: the arguments checked, nothing launched
            diagnose_args(plan.entry, args, device=st.device_id)
            return
        run(gx, gy, gz, bx, by, bz, shmem, st, args)

    def _clustered(self, plan: LaunchPlan, cluster: Any) -> Callable[..., None]:
        """The explicit launch of ``plan`` with clusters of ``cluster`` blocks, or the named error."""
        dims = dim3(cluster, f"{self.name}.launch(): cluster")
        a = self.entry.attributes
        compiled = CLUSTER_DIMS.of(a)
        if compiled is not None and dims != compiled:
            raise LaunchAttributeError(
                f"{self.name}.launch(): cluster={dims}, but the kernel was compiled with clusters of {compiled} "
                "(KHAL_CLUSTER, __cluster_dims__), which a launch cannot change; leave cluster= out")
        if compiled is not None:
            return plan.run
        return plan.clustered_run(dims)

    def max_cooperative_grid(self, block: Any = None, shared_mem: int | None = None, *, device: int | None = None) -> int:
        """The most blocks of ``block`` threads (None: the compiled block) and ``shared_mem`` bytes
        (None: the declared) that can be co-resident on the device: the largest grid a cooperative
        entry (``KHAL_COOPERATIVE``) may be launched with (occupancy per SM x SMs, computed once)."""
        a = self.entry.attributes
        if not COOPERATIVE.of(a):
            raise LaunchAttributeError(f"{self.name}: not a cooperative entry (KHAL_COOPERATIVE)")
        dev = current_device_id() if device is None else int(device)
        plan = self.ready_plan(dev)
        if block is None:
            bx, by, bz = self.block_size
        else:
            bx, by, bz = dim3(block, f"{self.name}.max_cooperative_grid(): block")
        return plan.cooperative_limit(bx * by * bz, self.dynamic_shared if shared_mem is None else int(shared_mem))

    def bind(self, *args: Any, stream: Any = None) -> Any:
        """A bound launch: ``args`` checked and packed once, then ``b(n)`` launches ``n``
        threads at about the cost of a raw launch (see :mod:`khal_runtime.backends.cuda.bound`)."""
        st = self.resolve_stream(stream)
        plan = self.ready_plan(st.device_id)
        return self._crate.backend.bind(self, plan, args, st)

    def dispatch_indirect(self, count: Any, *args: Any, stream: Any = None, grid: Any = None,
                          threads: bool = False, host_read: bool | None = None) -> None:
        """Launch with the workgroup count (``threads=True``: thread count) read from ``count``,
        a device uint32 buffer written by earlier work (docs/guide/graphs-and-indirect.md,
        "Indirect dispatch")."""
        st = self.resolve_stream(stream)
        plan = self.ready_plan(st.device_id)
        self._crate.backend.dispatch_indirect(self, plan, count, args, st, grid, threads, host_read)

    def check_args(self, *args: Any) -> None:
        """Validate arguments without launching (no GPU needed)."""
        diagnose_args(self.entry, args)

    def __repr__(self) -> str:
        return f"<Kernel {self.crate}.{self.name} block={self.block_size} hash={self.entry.hash}>"


class ModuleGlobal:
    """A crate's module global (a ``__constant__`` or ``__device__`` variable, ``Crate.globals``) on
    one device: ``kernels.crates["core"].globals["table"]``. Its address and size come from the
    driver when the crate loads there (``cuLibraryGetGlobal``), checked against the manifest.

    ``copy_from_numpy(a)`` writes it from a host array of exactly its size in bytes (any dtype: the
    PTX declares most arrays as bytes), ``to_numpy(dtype)`` reads it back, ``fill_zero()`` resets it,
    ``copy_from(buffer)`` copies from device memory (a ``DeviceBuffer``, CuPy / torch array) on the
    stream: that one is capturable, so a graph can refill a table or reset a counter on replay.
    ``as_buffer(dtype)`` is a ``DeviceBuffer`` view of it (not owning), for a storage argument."""

    __slots__ = ("crate", "var", "name", "space", "size", "_kernels", "_device")

    def __init__(self, kernels: CrateKernels, var: Any, device: int | None = None) -> None:
        self._kernels = kernels
        self.crate = kernels.name
        self.var = var
        self.name, self.space, self.size = var.name, var.space, int(var.size)
        self._device = device

    @property
    def device_id(self) -> int:
        return current_device_id() if self._device is None else self._device

    def on(self, device: int) -> ModuleGlobal:
        """The same global on ``device`` (loads the crate there)."""
        return ModuleGlobal(self._kernels, self.var, int(device))

    @property
    def ptr(self) -> int:
        """Its device address on this device (the crate loaded there first)."""
        dev = self.device_id
        module = self._kernels.module(dev)
        found = getattr(module, "globals", {}).get(self.name)
        if found is None:
            raise KhalError(f"crate {self.crate!r}: the {self._kernels.backend.name} backend has no module global "
                            f"{self.name!r} (module globals are CUDA's)")
        return int(found[0])

    def as_buffer(self, dtype: Any = "uint8") -> Any:
        """A ``DeviceBuffer`` view of its bytes as ``dtype`` (it does not own them: never freed)."""
        from khal_runtime.buffers import DeviceBuffer  # lazy: numpy, only when a global is used
        import numpy as np

        itemsize = np.dtype(dtype).itemsize
        if self.size % itemsize:
            raise KhalError(f"global {self.name!r} ({self.size} bytes) is not a whole number of {np.dtype(dtype)}")
        ptr = self.ptr
        return DeviceBuffer(ptr, self.size // itemsize, dtype, self.device_id, backend=self._kernels.backend)

    def _host(self, array: Any) -> Any:
        import numpy as np  # lazy: numpy, only when a global is used

        a = np.ascontiguousarray(array)
        if a.nbytes != self.size:
            raise KhalError(f"global {self.crate}.{self.name} is {self.size} bytes ({self.var.type} x "
                            f"{self.size // self.var.element_size}); the array is {a.nbytes} bytes ({a.dtype} x {a.size})")
        return a.view(np.uint8).reshape(-1)

    def copy_from_numpy(self, array: Any, stream: Any = None) -> ModuleGlobal:
        """Write it from a host array of exactly its size in bytes, ordered on ``stream``."""
        self.as_buffer("uint8").copy_from_numpy(self._host(array), stream)
        return self

    def to_numpy(self, dtype: Any = None, stream: Any = None) -> Any:
        """Its bytes as a new host array of ``dtype`` (default: the PTX element type's, bytes for ``b8``)."""
        out = self.as_buffer("uint8").to_numpy(stream)
        return out.view(dtype if dtype is not None else _PTX_DTYPES.get(self.var.type, "uint8"))

    def fill_zero(self, stream: Any = None) -> ModuleGlobal:
        self.as_buffer("uint8").fill_zero(stream)
        return self

    def copy_from(self, source: Any, stream: Any = None) -> ModuleGlobal:
        """Copy its bytes from device memory (``source``: any storage argument of exactly its size in
        bytes), on ``stream``: device to device, so it can be captured in a graph."""
        from khal_runtime import interop  # lazy: as the launch path

        st = _stream_of(stream)
        ptr, count, key = interop.extract(source)
        nbytes = count * _itemsize(key)
        if nbytes != self.size:
            raise KhalError(f"global {self.crate}.{self.name} is {self.size} bytes; the source is {nbytes}")
        ensure_current(self.device_id)
        self._kernels.backend.copy_device(self.ptr, ptr, self.size, st)
        return self

    def __repr__(self) -> str:
        return f"<ModuleGlobal {self.crate}.{self.name} ({self.space} {self.var.type}, {self.size} bytes)>"


#: numpy dtype of a PTX element type (b8 arrays: bytes)
_PTX_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "u8": "uint8", "u16": "uint16",
               "u32": "uint32", "u64": "uint64", "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
               "b8": "uint8", "b16": "uint16", "b32": "uint32", "b64": "uint64"}


def _itemsize(key: Any) -> int:
    from khal_runtime.dtypes import ReadOnly, dtype_info  # lazy: as the launch path

    if type(key) is ReadOnly:
        key = key.dtype
    name, size = dtype_info(key)
    return int(size)


class ModuleGlobals(dict):  # type: ignore[type-arg]
    """name -> :class:`ModuleGlobal` of a crate; a name the crate does not have is a KeyError naming those it has."""

    def __init__(self, kernels: CrateKernels) -> None:
        super().__init__({g.name: ModuleGlobal(kernels, g) for g in kernels.crate.globals or ()})
        self._crate = kernels.name

    def __missing__(self, name: str) -> ModuleGlobal:
        raise KeyError(f"crate {self._crate!r} has no module global {name!r}; it has {', '.join(self) or 'none'} "
                       "(the build lists the .visible __constant__ / __device__ variables of its PTX)")


class CrateKernels:
    """One crate: its manifest record, its verified binaries, its modules per device, and its
    entries as attributes (``kernels.crates["core"].saxpy``); its module globals in ``globals``."""

    #: the raw entries, where the crate's language launches them through launchers of its own
    #: (:meth:`replace_kernels`; Triton: its instance families); unset otherwise
    instances: dict[str, Kernel]

    def __init__(self, package: str, package_dir: Path, crate: Crate, *,
                 artifact_dirs: dict[str, Path] | None = None, missing: dict[str, list[str]] | None = None,
                 hashes_checked: bool = True) -> None:
        self.package = package
        #: whether its entry hashes were recomputed (``load`` does it for a manifest the build's digest
        #: does not vouch for; else the first use of the crate does, before anything loads)
        self._hashes_checked = hashes_checked
        self.package_dir = Path(package_dir)
        self.crate = crate
        #: artifact path -> the companion distribution's folder it is read from (others: the package's)
        self._artifact_dirs = artifact_dirs or {}
        #: companion distributions not installed -> the archs they ship (named when no binary fits)
        self._missing = missing or {}
        self.name = crate.name
        self._lock = threading.Lock()
        self._modules: dict[int, Any] = {}
        self._blobs: dict[str, bytes] | None = None
        self._backend: Any = None
        self._kernels = {e.name: Kernel(self, e) for e in crate.entries}
        # the crate's language (khal_runtime.languages): what its kernel set needs at load (Triton: its
        # instance families over the entries, which then are the crate's launchers)
        language = language_for(crate.language)
        language.setup(self)
        for n, k in self._kernels.items():
            if not hasattr(type(self), n):
                self.__dict__[n] = k
        #: the crate's language at run time: its own calls, its WebGPU build (set after the entries:
        #: an entry named ``language`` stays reachable as ``crate["language"]``)
        self.language: CrateLanguage = language
        #: the kernels' own calls made so far (:meth:`function`; its presence tells ``__getattr__``
        #: the crate is made)
        self._functions: dict[str, Any] | None = None
        #: the crate's ``__constant__`` / ``__device__`` variables (:class:`ModuleGlobal`); an entry
        #: named ``globals`` stays reachable as ``crate["globals"]``
        self.globals = ModuleGlobals(self)

    def replace_kernels(self, kernels: dict[str, Any]) -> None:
        """What a language's :meth:`~khal_runtime.languages.CrateLanguage.setup` calls to launch the
        crate through launchers of its own (Triton: one per instance family) instead of one
        :class:`Kernel` per entry: name -> launcher, each then an attribute of the crate (and of
        the package, where its name is unique); a launcher has a ``name`` and a ``crate`` (the
        crate's name), as a :class:`Kernel` has."""
        self._kernels = dict(kernels)

    def function(self, name: str) -> Any:
        """``kernels.<kernel>`` when it is no entry: the kernel's own call, made by the crate's
        language when first asked for (a Triton crate's
        :class:`~khal_runtime.triton_call.TritonFunction`), None when the crate has none of that name."""
        funcs = self._functions
        if funcs is None:
            funcs = self._functions = {}
        f = funcs.get(name)
        if f is None:
            f = self.language.function(self, name)
            if f is not None:
                funcs[name] = f
        return f

    def function_names(self) -> list[str]:
        """The kernels with an own call (:meth:`function`)."""
        return self.language.function_names(self)

    def triton_functions(self) -> dict[tuple[str, str], Any]:
        """The kernels' own calls keyed by (module, qualname), for the kernels importable at run time
        (``TritonFacts.module`` set): what serving a library's module replaces its globals with."""
        out = {}
        for n in self.function_names():
            f = self.function(n)
            if f is not None and f.module:
                out[(f.module, f.qualname or n)] = f
        return out

    @property
    def backend(self) -> Any:
        """The backend this crate runs on (the process's, chosen on first use)."""
        b = self._backend
        if b is None:
            c = self.crate
            b = self._backend = backends.for_crate(
                self.language.webgpu_missing(c) is None, f"crate {c.name!r} of package {self.package!r}",
                _no_webgpu_reason(c))
        return b

    def blobs(self) -> dict[str, bytes]:
        """Every artifact's bytes, after the confinement, size and sha256 checks (read once)."""
        if self._blobs is None:
            self._blobs = {a.path: read_artifact(self._artifact_dirs.get(a.path, self.package_dir), a)
                           for a in self.crate.artifacts}
        return self._blobs

    def module(self, device_id: int) -> Any:
        """The crate loaded on a device (loaded on first use, once per device)."""
        m = self._modules.get(device_id)
        if m is None:
            with self._lock:
                m = self._modules.get(device_id)
                if m is None:
                    if not self._hashes_checked:
                        problems = check_crate_hashes(self.crate)
                        if problems:
                            raise problems[0].exception()
                        self._hashes_checked = True
                    try:
                        m = self.backend.load_crate(self, device_id)
                    except NoCompatibleBinaryError as exc:
                        if not self._missing:
                            raise
                        raise type(exc)(f"{exc}{missing_hint(self._missing)}") from None
                    self._modules[device_id] = m
        return m

    def load(self, device: int | None = None) -> None:
        """Load the crate now (on ``device``, default this thread's) instead of at first use."""
        self.module(current_device_id() if device is None else int(device))

    def close(self) -> None:
        """Unload the crate from every device it was loaded on."""
        with self._lock:
            for m in self._modules.values():
                self.backend.unload(m)
            self._modules.clear()

    def __getattr__(self, name: str) -> Kernel:
        d = self.__dict__
        try:
            return d["_kernels"][name]  # type: ignore[no-any-return]
        except KeyError:
            f = self.function(name) if "_functions" in d and not name.startswith("__") else None
            if f is not None:
                d[name] = f
                return f  # type: ignore[no-any-return]
            raise AttributeError(f"crate {self.name!r} has no entry {name!r}; it has "
                                 f"{', '.join([*self._kernels, *self.function_names()]) or 'none'}") from None

    def __getitem__(self, name: str) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            f = self.function(name)
            if f is not None:
                return f  # type: ignore[no-any-return]
            return self._kernels[name]
        return k

    def __iter__(self) -> Iterator[Kernel]:
        return iter(self._kernels.values())

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._kernels) | set(self.function_names()))


class KernelSet:
    """Every entry of a shader package: ``ks.<entry>`` (unique names), ``ks.crates[<crate>].<entry>``."""

    def __init__(self, package: str, package_dir: Path, manifest: Manifest, companions: Resolved | None = None, *,
                 hashes_checked: bool = True) -> None:
        self.package = package
        self.package_dir = package_dir
        self.manifest = manifest
        crates = companions.crates if companions is not None else manifest.crates
        dirs = companions.dirs if companions is not None else {}
        missing = companions.missing if companions is not None else {}
        self.crates: dict[str, CrateKernels] = {
            c.name: CrateKernels(package, package_dir, c, artifact_dirs=dirs, missing=missing,
                                 hashes_checked=hashes_checked or manifest.schema_version < 2) for c in crates
        }
        by_name: dict[str, list[Kernel]] = {}
        for ck in self.crates.values():
            for k in ck:
                by_name.setdefault(k.name, []).append(k)
        self._kernels = {n: ks[0] for n, ks in by_name.items() if len(ks) == 1}
        self._ambiguous = {n: [k.crate for k in ks] for n, ks in by_name.items() if len(ks) > 1}
        # plain instance attributes: ``ks.entry`` then costs a dict lookup, not __getattr__
        for n, k in self._kernels.items():
            if not hasattr(type(self), n) and n not in self.__dict__:
                self.__dict__[n] = k

    def __getattr__(self, name: str) -> Kernel:
        d = self.__dict__
        k = d.get("_kernels", {}).get(name)
        if k is not None:
            return k  # type: ignore[no-any-return]
        if name in d.get("_ambiguous", {}):
            raise AttributeError(f"entry {name!r} exists in crates {d['_ambiguous'][name]}; "
                                 f"use kernels.crates[<crate>].{name}")
        if name in d.get("crates", {}):
            return d["crates"][name]  # type: ignore[no-any-return]
        if not name.startswith("__") and "crates" in d:  # a Triton kernel's own call (after every entry name)
            found = [f for f in (ck.function(name) for ck in d["crates"].values()) if f is not None]
            if len(found) == 1:
                d[name] = found[0]
                return found[0]  # type: ignore[no-any-return]
            if found:
                raise AttributeError(f"Triton kernel {name!r} exists in crates {[f.crate for f in found]}; "
                                     f"use kernels.crates[<crate>].{name}")
        raise AttributeError(f"package {d.get('package')!r} has no entry {name!r}; it has "
                             f"{', '.join(sorted(d.get('_kernels', {}))) or 'none'}")

    def __getitem__(self, name: str) -> Kernel:
        return self._kernels[name]

    def __iter__(self) -> Iterator[Kernel]:
        return iter(self._kernels.values())

    def __contains__(self, name: object) -> bool:
        return name in self._kernels

    def __dir__(self) -> list[str]:
        funcs = {n for ck in self.crates.values() for n in ck.function_names()}
        return sorted(set(super().__dir__()) | set(self._kernels) | set(self.crates) | funcs)

    @property
    def entries(self) -> list[str]:
        return sorted(self._kernels)

    def __repr__(self) -> str:
        return f"<KernelSet {self.package} entries={self.entries}>"


def find_package_dir(package: str | os.PathLike[str]) -> tuple[str, Path]:
    """(package name, directory) of an importable package name or a package directory path."""
    if isinstance(package, os.PathLike) or (isinstance(package, str) and os.sep in package):
        p = Path(package)
        return p.name, p
    mod = sys.modules.get(package)
    locations = None
    if mod is not None:
        locations = list(getattr(mod, "__path__", []) or [])
        if not locations and getattr(mod, "__file__", None):
            locations = [str(Path(mod.__file__).parent)]  # type: ignore[arg-type]
    if not locations:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError) as exc:
            raise KhalError(f"cannot find package {package!r}: {exc}") from None
        if spec is None:
            raise KhalError(f"cannot find package {package!r}; is it installed?")
        locations = list(spec.submodule_search_locations or [])
        if not locations and spec.origin:
            locations = [str(Path(spec.origin).parent)]
    for loc in locations:
        if (Path(loc) / MANIFEST_DIR / MANIFEST_NAME).is_file():
            return package, Path(loc)
    return package, Path(locations[0])


_tracing_env_read = False


def _tracing_from_env_once() -> None:
    """:func:`khal_runtime.tracing.install_from_env_once`, at the first load, importing tracing
    only where a variable asks for it (or it is imported already): a process that traces nothing
    never imports it (its module, its dispatcher and profiler classes)."""
    global _tracing_env_read
    if _tracing_env_read:
        return
    _tracing_env_read = True
    if launch_hooks.env_asks() or "khal_runtime.tracing" in sys.modules:
        from khal_runtime import tracing  # lazy: only where tracing is asked for

        tracing.install_from_env_once()


def _no_webgpu_reason(crate: Crate) -> str:
    """Why ``crate`` has no WebGPU build, from its manifest's record of its WebGPU stage (which the
    crate's language wrote: "CUDA C++ source", "Triton source", "KHAL_SKIP_SPIRV is set", ...), for
    the error of a crate that cannot fall back to WebGPU."""
    st = crate.spirv
    if st.status == "not_applicable":
        return f"{st.reason or 'its sources'}: it builds for CUDA only; Slang crates build for WebGPU too"
    if st.status == "skipped":
        return f"its WebGPU stage was skipped at build time ({st.reason or 'KHAL_SKIP_SPIRV'}); rebuild without that"
    return f"no WGSL / SPIR-V artifacts (WebGPU stage {st.status}{': ' + st.reason if st.reason else ''})"


def load(package: str | os.PathLike[str]) -> KernelSet:
    """The kernels of a shader package (by import name, or its directory).

    Reads the manifest and checks that it agrees with itself; checks editable-install sources
    (StaleBuildError); honours ``KHAL_BACKEND`` ("cuda" / "webgpu": that backend must be usable
    now). GPU work happens at first use; the CUDA driver may start initialising now, in the
    background (``KHAL_EAGER_INIT``, :mod:`khal_runtime.backends.cuda.driver`)."""
    backends.prestart()  # (khal_runtime.load has called it already, before importing this module)
    mode = backends.backend_mode()
    name, pkg_dir = find_package_dir(package)
    recording = bool(os.environ.get(RECORDING_ENV))
    if recording and not (pkg_dir / MANIFEST_DIR / MANIFEST_NAME).is_file():
        # `python -m hatch_khal triton record` of a package never built: its kernels run under Triton's JIT
        return UnbuiltKernels(name)  # type: ignore[return-value]
    manifest, vouched = read_manifest(pkg_dir / MANIFEST_DIR / MANIFEST_NAME)
    if not vouched:  # (vouched by the build's digest: each crate's entry hashes at its first use)
        problems = check_manifest(manifest)
        if problems:
            raise problems[0].exception()
    stale = check_sources(manifest, pkg_dir)
    if stale:
        more = f" (and {len(stale) - 1} more file(s))" if len(stale) > 1 else ""
        raise StaleBuildError(f"package {name!r}: {stale[0].message}{more}")
    if mode != "auto":
        try:
            backends.current()
        except BackendUnavailableError as exc:
            raise BackendUnavailableError(f"package {name!r}: {exc}") from None
    else:  # auto: the choice, still to come, checks this package has a binary for the backend
        backends.consider(manifest.package or name, manifest.crates)
    _tracing_from_env_once()
    # cubins shipped by companion distributions (per arch family): where installed, and checked
    companions = resolve_companions(manifest.package or name, pkg_dir, manifest)
    kernels = KernelSet(manifest.package or name, pkg_dir, manifest, companions, hashes_checked=not vouched)
    # a recorded process runs Triton's JIT, which records the launches: nothing is served then
    if not recording and any(ck.language.serves(ck.crate) for ck in kernels.crates.values()):
        from khal_runtime import triton_serve  # lazy: only for packages whose Triton kernels host code imports

        triton_serve.serve(kernels)
    return kernels


#: set by ``python -m hatch_khal triton record`` in the processes it records
RECORDING_ENV = "KHAL_TRITON_RECORDING"


class UnbuiltKernels:
    """What ``load()`` returns, while ``python -m hatch_khal triton record`` runs, for a package not
    built yet: its host code runs Triton's JIT (which the recording needs); asking it for a kernel
    says so."""

    def __init__(self, package: str) -> None:
        self.package = package

    def __getattr__(self, name: str) -> Any:
        raise ManifestError(f"package {self.package!r} is not built yet (no khal manifest): while `python -m "
                            f"hatch_khal triton record` runs, its kernels {name!r} included run under Triton's JIT; "
                            "build the package to launch them through khal")
