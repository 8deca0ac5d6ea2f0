"""An entry's launch attributes on a CUDA device (``Entry.attributes``, :data:`khal_runtime.abi.LAUNCH_ATTRIBUTES`).

:func:`prepare_function` runs once per function when its crate loads: it checks what the entry
needs against the device (the opt-in shared-memory maximum, cooperative and cluster launch
support) and sets what must be set on the function (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``
above 48 KB). The result, a :class:`FunctionAttributes`, holds the ``CUlaunchAttribute`` list built
once (cooperative, PDL), which every launch configuration of the function's plans carries: the
typed call's snapshots and bound launches build their whole ``cuLaunchKernelEx`` argument tuple
once, the other launches set grid, stream and shared memory on a per-thread configuration that
already holds the attributes. Nothing is re-derived per launch.

A cooperative entry's grid must be co-resident: at most ``cuOccupancyMaxActiveBlocksPerMultiprocessor
x SM count`` blocks, computed once per (threads per block, dynamic shared memory) and checked before
each launch with a larger grid than last checked (a named :class:`LaunchAttributeError` with the
figures). Clusters are compiled in (``__cluster_dims__``): the driver launches them with no attribute;
or given to an explicit launch (``launch(..., cluster=(x, y, z))``: :meth:`FunctionAttributes.with_cluster`,
the cluster a launch attribute); the grid must be a multiple of the cluster dims, checked here too.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from khal_runtime.abi import DEFAULT_DYNAMIC_SHARED, MAX_PORTABLE_CLUSTER
from khal_runtime.backends.cuda.driver import check, driver
from khal_runtime.errors import LaunchAttributeError

if TYPE_CHECKING:
    from khal_runtime.manifest import Entry

__all__ = ["FunctionAttributes", "make_launch_ex", "prepare_function"]


class FunctionAttributes:
    """What one function's launches need of its entry's attributes, prepared once at load."""

    def __init__(self, entry: Entry, function: Any = None, device: Any = None, sm_count: int = 0) -> None:
        a = entry.attributes
        self.entry = entry
        self.function = function
        self.name = entry.name
        #: dynamic shared memory the typed call (and bound launches, indirect dispatch) launch with
        self.shared = entry.dynamic_shared
        #: the most dynamic shared memory an explicit launch may ask for
        self.shared_limit = max(self.shared, DEFAULT_DYNAMIC_SHARED)
        self.cooperative = bool(a is not None and a.cooperative)
        self.pdl = bool(a is not None and a.pdl)
        self.cluster = tuple(a.cluster_dims) if a is not None and a.cluster_dims else None
        self.sm_count = sm_count
        #: the CUlaunchAttribute list of every launch (cooperative, PDL): built once
        self.launch_attrs: list[Any] = []
        #: whether launches must carry launch attributes (cuLaunchKernelEx with the list)
        self.needs_ex = False
        #: (threads per block, dynamic shared bytes) -> blocks that can be co-resident
        self._coresident: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    @property
    def any(self) -> bool:
        return bool(self.shared or self.cooperative or self.pdl or self.cluster)

    def build(self, drv: Any) -> None:
        """The CUlaunchAttribute list (made once, at load)."""
        attrs: list[Any] = []
        if not (self.cooperative or self.pdl):
            self.launch_attrs, self.needs_ex = attrs, False
            return
        if getattr(drv, "CUlaunchAttribute", None) is None:
            raise LaunchAttributeError(f"entry {self.name!r}: its launch attributes need cuLaunchKernelEx "
                                       "launch attributes, which these cuda-bindings lack; upgrade cuda-bindings")
        make: Any = drv.CUlaunchAttribute
        ids: Any = drv.CUlaunchAttributeID
        if self.cooperative:
            at = make()
            at.id = ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            at.value.cooperative = 1
            attrs.append(at)
        if self.pdl:
            at = make()
            at.id = ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            at.value.programmaticStreamSerializationAllowed = 1
            attrs.append(at)
        self.launch_attrs = attrs
        self.needs_ex = bool(attrs)

    def with_cluster(self, drv: Any, cluster: tuple[int, int, int], device: Any) -> FunctionAttributes:
        """These attributes plus a cluster of ``cluster`` blocks given at launch
        (``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``, for a kernel compiled without
        ``__cluster_dims__``), checked against ``device`` (sm_90+, at most the portable size)."""
        where = f"{self.name}.launch(): cluster={cluster}"
        size = cluster[0] * cluster[1] * cluster[2]
        cc = device.compute_capability()
        if cc < (9, 0) or not _attribute(device, "CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH"):
            raise LaunchAttributeError(f"{where}: the device ({device.name}, sm_{cc[0]}{cc[1]}) has no thread-block "
                                       "clusters (sm_90+)")
        if size > MAX_PORTABLE_CLUSTER:
            raise LaunchAttributeError(f"{where}: a cluster of {size} blocks is more than the portable "
                                       f"{MAX_PORTABLE_CLUSTER}")
        if getattr(drv, "CUlaunchAttribute", None) is None:
            raise LaunchAttributeError(f"{where}: a cluster given at launch needs cuLaunchKernelEx launch "
                                       "attributes, which these cuda-bindings lack; upgrade cuda-bindings")
        out = FunctionAttributes(self.entry, self.function, device, self.sm_count)
        out.shared, out.shared_limit, out.cooperative, out.pdl = self.shared, self.shared_limit, self.cooperative, self.pdl
        out.cluster = cluster
        out._coresident = self._coresident
        at = drv.CUlaunchAttribute()
        at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = cluster
        out.launch_attrs = [*self.launch_attrs, at]
        out.needs_ex = True
        return out

    def configure(self, cfg: Any) -> Any:
        """Put the prebuilt attributes on a CUlaunchConfig."""
        if self.launch_attrs:
            cfg.attrs = self.launch_attrs
        cfg.numAttrs = len(self.launch_attrs)
        return cfg

    # checks of a launch ---------------------------------------------------------------------------
    def coresident(self, threads: int, shared: int) -> int:
        """Blocks of ``threads`` threads and ``shared`` bytes of dynamic shared memory that can run at
        once on the device (occupancy per SM x SMs), computed once per combination."""
        key = (threads, shared)
        n = self._coresident.get(key)
        if n is None:
            per_sm = int(check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, threads, shared),
                               f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.entry.symbol})"))
            n = per_sm * self.sm_count
            with self._lock:
                self._coresident[key] = n
        return n

    def check_launch(self, gx: int, gy: int, gz: int, threads: int, shared: int) -> None:
        """Refuse a grid the attributes cannot launch (named, with the figures)."""
        if shared > self.shared_limit:
            raise LaunchAttributeError(
                f"{self.name}.launch(): shared_mem={shared} bytes is more than the entry declares "
                f"({self.shared_limit} bytes{'' if self.shared else ', the default limit'}); declare "
                f"KHAL_SHARED_MEM({shared}) in its KHAL_ENTRY marker (above 48 KB the function is opted in at load)")
        if self.cooperative:
            limit = self.coresident(threads, shared)
            blocks = gx * gy * gz
            if blocks > limit:
                per_sm = limit // self.sm_count if self.sm_count else 0
                raise LaunchAttributeError(
                    f"{self.name}: a cooperative grid of {blocks} blocks cannot be co-resident on device: at most "
                    f"{limit} ({per_sm} per SM by cuOccupancyMaxActiveBlocksPerMultiprocessor for {threads} threads "
                    f"and {shared} bytes of dynamic shared memory, x {self.sm_count} SMs); launch fewer blocks "
                    "(a grid-stride loop) or fewer threads")
        if self.cluster:
            cx, cy, cz = self.cluster
            if gx % cx or gy % cy or gz % cz:
                raise LaunchAttributeError(
                    f"{self.name}: grid {(gx, gy, gz)} is not a whole number of its clusters "
                    f"{self.cluster} (KHAL_CLUSTER); round the grid up to a multiple of the cluster dims")

    def checker(self) -> Callable[[int, int, int, int, int], None] | None:
        """``check(gx, gy, gz, threads, shared)`` for the launch paths, or None when nothing can fail
        beyond the shared-memory limit the generic path checks."""
        return self.check_launch if (self.cooperative or self.cluster) else None



def _attribute(device: Any, name: str) -> int:
    """A ``CU_DEVICE_ATTRIBUTE_*`` of a generic Device (through its CUDA device, cached there)."""
    impl = getattr(device, "_impl", device)
    return int(impl.attribute(name))


def prepare_function(entry: Entry, function: Any, device: Any, where: str) -> FunctionAttributes:
    """Check ``entry``'s attributes against ``device`` and set them on ``function`` (once, at load)."""
    drv = driver()
    fa = FunctionAttributes(entry, function, device, 0)
    if not fa.any:
        return fa
    fa.sm_count = int(device.sm_count)
    if fa.shared > DEFAULT_DYNAMIC_SHARED:
        optin = _attribute(device, "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        if fa.shared > optin:
            raise LaunchAttributeError(
                f"{where}: entry {entry.name!r} declares KHAL_SHARED_MEM({fa.shared}), more dynamic shared memory "
                f"than the device ({device.name}, {device.arch}) allows a block ({optin} bytes, "
                "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
        check(drv.cuFuncSetAttribute(function, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     fa.shared),
              f"cuFuncSetAttribute({entry.symbol}, MAX_DYNAMIC_SHARED_SIZE_BYTES={fa.shared})")
    if fa.cooperative and not _attribute(device, "CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH"):
        raise LaunchAttributeError(f"{where}: entry {entry.name!r} is cooperative (KHAL_COOPERATIVE) and the device "
                                   f"({device.name}) cannot launch cooperative grids")
    if fa.cluster:
        cc = device.compute_capability()
        size = fa.cluster[0] * fa.cluster[1] * fa.cluster[2]
        if cc < (9, 0) or not _attribute(device, "CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH"):
            raise LaunchAttributeError(f"{where}: entry {entry.name!r} is clustered (KHAL_CLUSTER{fa.cluster}) and the "
                                       f"device ({device.name}, sm_{cc[0]}{cc[1]}) has no thread-block clusters (sm_90+)")
        if size > MAX_PORTABLE_CLUSTER:
            raise LaunchAttributeError(f"{where}: entry {entry.name!r}: a cluster of {size} blocks is more than the "
                                       f"portable {MAX_PORTABLE_CLUSTER}")
    fa.build(drv)
    return fa


def make_launch_ex(drv: Any, fa: FunctionAttributes) -> Callable[..., Any]:
    """``launch_ex(f, gx, gy, gz, bx, by, bz, shmem, cu_stream, params)``: ``cuLaunchKernelEx`` with a
    per-thread CUlaunchConfig that holds ``fa``'s attribute list (set once per thread): each call
    sets only the grid, block, shared memory and stream. For launches whose grid or stream is not
    known ahead (the explicit launch, the typed call's full read); the others prebuild it all."""
    ex = getattr(drv, "cuLaunchKernelEx", None)
    config = getattr(drv, "CUlaunchConfig", None)
    if ex is None or config is None:
        raise LaunchAttributeError(f"entry {fa.name!r}: its launch attributes need cuLaunchKernelEx, which these "
                                   "cuda-bindings lack; upgrade cuda-bindings")
    tls = threading.local()

    def launch_ex(f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int, cu: Any,
                  params: int) -> Any:
        try:
            cfg = tls.cfg
        except AttributeError:
            cfg = tls.cfg = fa.configure(config())
        cfg.gridDimX = gx
        cfg.gridDimY = gy
        cfg.gridDimZ = gz
        cfg.blockDimX = bx
        cfg.blockDimY = by
        cfg.blockDimZ = bz
        cfg.sharedMemBytes = shmem
        cfg.hStream = cu
        return ex(cfg, f, params, 0)

    return launch_ex
