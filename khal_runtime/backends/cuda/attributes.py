"""An entry's launch attributes on a CUDA device (``Entry.attributes``, the rows of
:mod:`khal_runtime.launch_attributes`).

:data:`CUDA_ATTRIBUTES` maps every row to what it is on CUDA (a :class:`CudaAttribute`): its check
against the device and what it sets on the function when the crate loads (``load``), the
``CUlaunchAttribute`` every launch of the function carries (``launch``), and its check of each
launch's grid (``at_launch``). The table is checked against the rows when this module is imported:
a row without a CUDA mapping fails there, naming it.

:func:`prepare_function` runs once per function when its crate loads and runs the ``load`` of each
attribute the entry has (the opt-in shared-memory maximum, cooperative and cluster launch support;
``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` above 48 KB). The result, a
:class:`FunctionAttributes`, holds the ``CUlaunchAttribute`` list built once, which every launch
configuration of the function's plans carries: the typed call's snapshots and bound launches build
their whole ``cuLaunchKernelEx`` argument tuple once, the other launches set grid, stream and shared
memory on a per-thread configuration that already holds the attributes. Nothing is re-derived per
launch.

A cooperative entry's grid must be co-resident: at most ``cuOccupancyMaxActiveBlocksPerMultiprocessor
x SM count`` blocks, computed once per (threads per block, dynamic shared memory) and checked before
each launch with a larger grid than last checked (a named :class:`LaunchAttributeError` with the
figures). Clusters are compiled in (``__cluster_dims__``): the driver launches them with no attribute;
or given to an explicit launch (``launch(..., cluster=(x, y, z))``: :meth:`FunctionAttributes.with_cluster`,
the cluster a launch attribute); the grid must be a multiple of the cluster dims, checked here too.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from khal_runtime.backends.cuda.driver import check, driver
from khal_runtime.errors import LaunchAttributeError
from khal_runtime.launch_attributes import (CLUSTER_DIMS, DEFAULT_DYNAMIC_SHARED, MAX_PORTABLE_CLUSTER,
                                            AttributeTable, values)

if TYPE_CHECKING:
    from khal_runtime.manifest import Entry

__all__ = ["CUDA_ATTRIBUTES", "CudaAttribute", "FunctionAttributes", "make_launch_ex", "prepare_function"]


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
        #: (row, value) of each attribute the entry has
        self.given = list(values(a))
        self.cluster: tuple[int, int, int] | None = CLUSTER_DIMS.of(a)
        self.sm_count = sm_count
        #: the CUlaunchAttribute list of every launch: built once
        self.launch_attrs: list[Any] = []
        #: whether launches must carry launch attributes (cuLaunchKernelEx with the list)
        self.needs_ex = False
        #: the grid checks of the entry's attributes (``CudaAttribute.at_launch``)
        self.grid_checks = [c for row, _ in self.given if (c := CUDA_ATTRIBUTES[row.name].at_launch) is not None]
        #: (threads per block, dynamic shared bytes) -> blocks that can be co-resident
        self._coresident: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    @property
    def any(self) -> bool:
        return bool(self.shared or self.given)

    def build(self, drv: Any) -> None:
        """The CUlaunchAttribute list (made once, at load): each attribute's ``launch``."""
        attrs: list[Any] = []
        for row, v in self.given:
            make = CUDA_ATTRIBUTES[row.name].launch
            if make is None:
                continue
            if getattr(drv, "CUlaunchAttribute", None) is None:
                raise LaunchAttributeError(f"entry {self.name!r}: its launch attributes need cuLaunchKernelEx "
                                           "launch attributes, which these cuda-bindings lack; upgrade cuda-bindings")
            attrs += make(drv, v)
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
        out.shared, out.shared_limit = self.shared, self.shared_limit
        out.cluster = cluster
        out.grid_checks = [*self.grid_checks, *([_check_cluster_grid] if not self.cluster else [])]
        out._coresident = self._coresident
        out.launch_attrs = [*self.launch_attrs, *_launch_cluster(drv, cluster)]
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
        for grid_check in self.grid_checks:
            grid_check(self, gx, gy, gz, threads, shared)

    def checker(self) -> Callable[[int, int, int, int, int], None] | None:
        """``check(gx, gy, gz, threads, shared)`` for the launch paths, or None when nothing can fail
        beyond the shared-memory limit the generic path checks."""
        return self.check_launch if self.grid_checks else None


def _attribute(device: Any, name: str) -> int:
    """A ``CU_DEVICE_ATTRIBUTE_*`` of a generic Device (through its CUDA device, cached there)."""
    impl = getattr(device, "_impl", device)
    return int(impl.attribute(name))


def prepare_function(entry: Entry, function: Any, device: Any, where: str) -> FunctionAttributes:
    """Check ``entry``'s attributes against ``device`` and set them on ``function`` (once, at load):
    each attribute's ``load``, then the launch attribute list."""
    drv = driver()
    fa = FunctionAttributes(entry, function, device, 0)
    if not fa.any:
        return fa
    fa.sm_count = int(device.sm_count)
    for row, v in fa.given:
        load = CUDA_ATTRIBUTES[row.name].load
        if load is not None:
            load(drv, v, entry, function, device, where)
    fa.build(drv)
    return fa


# -- what each launch attribute is on CUDA -----------------------------------------------------------
class CudaAttribute(NamedTuple):
    """One launch attribute on CUDA (a row of :mod:`khal_runtime.launch_attributes`, mapped)."""

    #: ``load(drv, value, entry, function, device, where)``, once per function when its crate loads:
    #: refuse a device that cannot honour it (:class:`LaunchAttributeError`), set what the function needs
    load: Callable[[Any, Any, Entry, Any, Any, str], None] | None = None
    #: ``launch(drv, value)``: the ``CUlaunchAttribute`` list every launch of the function carries
    launch: Callable[[Any, Any], list[Any]] | None = None
    #: ``at_launch(fa, gx, gy, gz, threads, shared)``: refuse a grid it cannot launch (named, with figures)
    at_launch: Callable[[FunctionAttributes, int, int, int, int, int], None] | None = None


def _launch_attribute(drv: Any, name: str, **value: Any) -> list[Any]:
    """One ``CUlaunchAttribute`` of id ``CU_LAUNCH_ATTRIBUTE_<name>`` with ``value``'s fields set."""
    at = drv.CUlaunchAttribute()
    at.id = getattr(drv.CUlaunchAttributeID, f"CU_LAUNCH_ATTRIBUTE_{name}")
    for k, v in value.items():
        setattr(at.value, k, v)
    return [at]


def _load_shared(drv: Any, shared: int, entry: Entry, function: Any, device: Any, where: str) -> None:
    if shared <= DEFAULT_DYNAMIC_SHARED:
        return
    optin = _attribute(device, "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
    if shared > optin:
        raise LaunchAttributeError(
            f"{where}: entry {entry.name!r} declares KHAL_SHARED_MEM({shared}), more dynamic shared memory "
            f"than the device ({device.name}, {device.arch}) allows a block ({optin} bytes, "
            "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
    check(drv.cuFuncSetAttribute(function, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 shared),
          f"cuFuncSetAttribute({entry.symbol}, MAX_DYNAMIC_SHARED_SIZE_BYTES={shared})")


def _load_cooperative(drv: Any, value: bool, entry: Entry, function: Any, device: Any, where: str) -> None:
    if not _attribute(device, "CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH"):
        raise LaunchAttributeError(f"{where}: entry {entry.name!r} is cooperative (KHAL_COOPERATIVE) and the device "
                                   f"({device.name}) cannot launch cooperative grids")


def _check_coresident(fa: FunctionAttributes, gx: int, gy: int, gz: int, threads: int, shared: int) -> None:
    limit = fa.coresident(threads, shared)
    blocks = gx * gy * gz
    if blocks > limit:
        per_sm = limit // fa.sm_count if fa.sm_count else 0
        raise LaunchAttributeError(
            f"{fa.name}: a cooperative grid of {blocks} blocks cannot be co-resident on device: at most "
            f"{limit} ({per_sm} per SM by cuOccupancyMaxActiveBlocksPerMultiprocessor for {threads} threads "
            f"and {shared} bytes of dynamic shared memory, x {fa.sm_count} SMs); launch fewer blocks "
            "(a grid-stride loop) or fewer threads")


def _load_cluster(drv: Any, cluster: tuple[int, int, int], entry: Entry, function: Any, device: Any,
                  where: str) -> None:
    cc = device.compute_capability()
    size = cluster[0] * cluster[1] * cluster[2]
    if cc < (9, 0) or not _attribute(device, "CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH"):
        raise LaunchAttributeError(f"{where}: entry {entry.name!r} is clustered (KHAL_CLUSTER{cluster}) and the "
                                   f"device ({device.name}, sm_{cc[0]}{cc[1]}) has no thread-block clusters (sm_90+)")
    if size > MAX_PORTABLE_CLUSTER:
        raise LaunchAttributeError(f"{where}: entry {entry.name!r}: a cluster of {size} blocks is more than the "
                                   f"portable {MAX_PORTABLE_CLUSTER}")


def _check_cluster_grid(fa: FunctionAttributes, gx: int, gy: int, gz: int, threads: int, shared: int) -> None:
    cx, cy, cz = fa.cluster or (1, 1, 1)
    if gx % cx or gy % cy or gz % cz:
        raise LaunchAttributeError(
            f"{fa.name}: grid {(gx, gy, gz)} is not a whole number of its clusters "
            f"{fa.cluster} (KHAL_CLUSTER); round the grid up to a multiple of the cluster dims")


def _launch_cluster(drv: Any, cluster: tuple[int, int, int]) -> list[Any]:
    """A cluster given at launch (an entry compiled with one needs no attribute: ``__cluster_dims__``)."""
    at = _launch_attribute(drv, "CLUSTER_DIMENSION")
    at[0].value.clusterDim.x, at[0].value.clusterDim.y, at[0].value.clusterDim.z = cluster
    return at


#: every launch attribute on CUDA, checked against launch_attributes.ATTRIBUTES on import
CUDA_ATTRIBUTES: AttributeTable[CudaAttribute] = AttributeTable("the CUDA backend (backends/cuda/attributes.py)", {
    "max_dynamic_shared": CudaAttribute(load=_load_shared),
    "cooperative": CudaAttribute(load=_load_cooperative, at_launch=_check_coresident,
                                 launch=lambda drv, v: _launch_attribute(drv, "COOPERATIVE", cooperative=1)),
    "cluster_dims": CudaAttribute(load=_load_cluster, at_launch=_check_cluster_grid),
    "pdl": CudaAttribute(launch=lambda drv, v: _launch_attribute(
        drv, "PROGRAMMATIC_STREAM_SERIALIZATION", programmaticStreamSerializationAllowed=1)),
    "cluster_scheduling": CudaAttribute(launch=lambda drv, policy: _launch_attribute(
        drv, "CLUSTER_SCHEDULING_POLICY_PREFERENCE", clusterSchedulingPolicyPreference=getattr(
            drv.CUclusterSchedulingPolicy, f"CU_CLUSTER_SCHEDULING_POLICY_{policy.upper()}"))),
})


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
