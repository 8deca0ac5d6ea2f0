"""Dispatching a pipeline: resolve its bindings, check its group counts, record it.

:class:`Launcher` is the internal API the generic layer (and this package's typed call,
:mod:`.kernel`) dispatches through::

    launcher = Launcher(pipeline)
    launcher.dispatch((gx, gy, gz), storages, uniforms, scalars)

``storages``: one :class:`~.memory.View` per storage parameter of the entry, in declaration
order (parameters the shader dropped are accepted and not bound); ``uniforms``: parameter
name -> the struct's bytes in the target's layout (:class:`~.packing.UniformPacker`);
``scalars``: the scalar block (:class:`~.packing.ScalarPacker`), or None when the entry has
none. The dispatch is recorded into the device's open compute pass
(:class:`~.stream.CommandStream`), never submitted on its own.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from khal_runtime import abi
from khal_runtime.backends.webgpu.bindings import (
    Bound,
    BoundGroup,
    Immediates,
    bind_group_cache,
    immediates_cache,
)
from khal_runtime.errors import ArgumentError, ArgumentValueError, GroupLimitError
from khal_runtime.backends.webgpu.memory import Resource, View, check_storage
from khal_runtime.backends.webgpu.pipeline import Pipeline
from khal_runtime.backends.webgpu.uniform_pool import Region, uniform_pool

__all__ = ["Launcher", "group_limit_error"]


def group_limit_error(name: str, groups: tuple[int, int, int], limit: int, device: Any) -> GroupLimitError:
    return GroupLimitError(
        f"{name}: {groups[0]}x{groups[1]}x{groups[2]} workgroups exceed the limit of {limit} per "
        f"dimension of {device.describe()} (max_compute_workgroups_per_dimension). The entry has no "
        "group offset, so the launch cannot be split: launch at most that many groups per dimension "
        "(a 2-D grid whose index the kernel linearises, or a loop over the data inside the kernel)")


class Launcher:
    """Dispatches of one :class:`~.pipeline.Pipeline` (see the module docstring)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        dev = pipeline.device
        self.device = dev
        self.stream = dev.stream
        self.pool = uniform_pool(dev)
        self.groups_cache = bind_group_cache(dev)
        self.imm_cache = immediates_cache(dev)
        self.max_groups = dev.max_groups
        entry = pipeline.entry
        self.name = pipeline.name
        #: each parameter's WebGPU binding (khal_runtime.abi.Reader.binding): "storage", "uniform"
        #: or None (packed into the scalar block)
        binding = {p.name: abi.kind(p.kind).strategy.binding for p in entry.params}
        self.storage_params = tuple(p.name for p in entry.params if binding[p.name] == "storage")
        self.uniform_params = tuple(p.name for p in entry.params if binding[p.name] == "uniform")
        self._itemsize = {p.name: p.element_size for p in entry.params}
        sidx = {n: i for i, n in enumerate(self.storage_params)}
        #: per group: (GroupPlan, sources) with source ("s", storage index) / ("u", name) / ("b", None)
        self.plan: list[tuple[Any, tuple[tuple[str, Any], ...]]] = []
        for g in pipeline.groups:
            src: list[tuple[str, Any]] = []
            for name in g.params:
                if name is None:
                    src.append(("b", None))
                elif binding[name] == "storage":
                    src.append(("s", sidx[name]))
                elif binding[name] == "uniform":
                    src.append(("u", name))
                else:
                    raise ValueError(f"{self.name}: the shader binds parameter {name!r}, whose kind has binding "
                                     f"{binding[name]!r} (not storage or uniform)")
            self.plan.append((g, tuple(src)))
        self.scalar_mode = pipeline.target.scalars
        self.has_scalars = bool(pipeline.target.scalar_slots)

    # -- checks ----------------------------------------------------------------------------------
    def check_groups(self, gx: int, gy: int, gz: int) -> None:
        m = self.max_groups
        if gx > m or gy > m or gz > m:
            raise group_limit_error(self.name, (gx, gy, gz), m, self.device)

    # -- binding ---------------------------------------------------------------------------------
    def check_usage(self, groups: Sequence[tuple[Any, Sequence[Any]]]) -> None:
        """Refuse one dispatch that binds one buffer both read-only and read-write (``groups``:
        (GroupPlan, the Resource of each of its bindings)). WebGPU tracks a buffer's usage as a
        whole in a dispatch: two bindings of it, even of disjoint slices, must be both read-only
        or both read-write; otherwise the dispatch is invalid, which WebGPU reports only when the
        batch is submitted, losing every other dispatch of that batch. Called where a bind group
        is created (a cache miss), and per dispatch across the groups of a multi-group entry."""
        read: dict[int, str] = {}
        write: dict[int, str] = {}
        for g, res in groups:
            for r, access, param in zip(res, g.access, g.params):
                if access == "read":
                    read.setdefault(r[1], param)
                elif access == "read_write":
                    write.setdefault(r[1], param)
        both = read.keys() & write.keys()
        if both:
            serial = min(both)
            ro, rw = read[serial], write[serial]
            raise ArgumentValueError(
                f"{self.name}(): argument {ro!r} (read-only storage) and argument {rw!r} (read-write storage) are "
                f"the same WebGPU buffer (allocation #{serial}, overlapping or not): WebGPU refuses a dispatch "
                f"that binds one buffer both read-only and read-write. Pass {ro!r} a copy (or its own "
                "allocation); nothing was launched")

    def create_group(self, g: Any, key: tuple[Any, ...], res: Sequence[Resource]) -> BoundGroup:
        """The bind group of group plan ``g`` binding ``res`` (``key``: its cache key), created
        after :meth:`check_usage`: the one place a bind group of this launcher is made."""
        self.check_usage(((g, res),))
        return self.groups_cache.create(g.layout, key, g.bindings, res)

    def bind_group(self, g: Any, items: Sequence[Any]) -> Bound:
        """The bind group of group plan ``g`` whose bindings take ``items``: a Resource per
        storage binding, a uniform Region (:meth:`.uniform_pool.UniformPool.region`) per uniform one."""
        res: list[Resource] = []
        dyn: list[int] = []
        for item, access, dy in zip(items, g.access, g.dynamic):
            if access != "uniform":
                res.append(item)
            elif dy:
                res.append(item[1])
                dyn.append(item[2])
            else:
                res.append(item[0])
        key = (g.lid, *res)
        bg = self.groups_cache.groups.get(key)
        if bg is None:
            bg = self.create_group(g, key, res)
        return self.groups_cache.with_offsets(bg, tuple(dyn)) if dyn else bg

    def resolve(self, res: Sequence[Resource], uniforms: Mapping[str, Region],
                block: Region | None) -> tuple[Bound, ...]:
        """The bind groups binding ``res`` (one Resource per storage parameter), the uniform
        regions and the scalar block's region."""
        out = []
        for g, src in self.plan:
            items = [res[k] if kind == "s" else uniforms[k] if kind == "u" else block
                     for kind, k in src]
            out.append(self.bind_group(g, items))
        if len(self.plan) > 1:  # one group's bindings were checked when it was made; across them, here
            self.check_usage([(g, [res[k] if kind == "s" else None for kind, k in src]) for g, src in self.plan])
        return tuple(out)

    def immediates(self, block: bytes | None) -> Immediates | None:
        if self.scalar_mode != "push_constants" or block is None:
            return None
        size = self.pipeline.immediate_size
        if len(block) < size:
            block = block + bytes(size - len(block))
        return self.imm_cache.get(block)

    def prepare(self, storages: Sequence[View], uniforms: Mapping[str, bytes] | None = None,
                scalars: bytes | None = None) -> tuple[tuple[Bound, ...], Immediates | None]:
        """Check and bind the arguments: (bind groups, immediates) for :meth:`record`."""
        if len(storages) != len(self.storage_params):
            raise ArgumentError(f"{self.name}: {len(self.storage_params)} storage view(s) expected "
                                f"({', '.join(self.storage_params)}), got {len(storages)}")
        res: list[Resource] = []
        for name, v in zip(self.storage_params, storages):
            where = f"{self.name}(): argument {name!r}"
            if v.alloc.device is not self.device:
                raise ArgumentValueError(f"{where} is on WebGPU device {v.alloc.device.ordinal}, the "
                                         f"launch on device {self.device.ordinal}")
            check_storage(v, where, self._itemsize[name])
            res.append(v.alloc.resource(v.offset, v.size))
        uniforms = uniforms or {}
        regions: dict[str, Region] = {}
        for name in self.uniform_params:
            data = uniforms.get(name)
            if data is None:
                raise ArgumentError(f"{self.name}(): uniform {name!r} was not given")
            regions[name] = self.pool.region(bytes(data))
        block = None
        if self.has_scalars:
            if scalars is None:
                raise ArgumentError(f"{self.name}(): the scalar block was not given")
            if self.scalar_mode == "uniform":
                block = self.pool.region(bytes(scalars))
        return self.resolve(res, regions, block), self.immediates(scalars)

    # -- recording -------------------------------------------------------------------------------
    def record(self, groups: tuple[int, int, int], bgs: tuple[Bound, ...], imm: Immediates | None) -> None:
        gx, gy, gz = groups
        m = self.max_groups
        if gx > m or gy > m or gz > m:
            raise group_limit_error(self.name, (gx, gy, gz), m, self.device)
        if gx and gy and gz:
            self.stream.record(self.pipeline, bgs, gx, gy, gz, imm)

    def dispatch(self, groups: tuple[int, int, int], storages: Sequence[View],
                 uniforms: Mapping[str, bytes] | None = None, scalars: bytes | None = None) -> None:
        """Record one dispatch of ``groups`` workgroups (see the module docstring)."""
        gx, gy, gz = (int(x) for x in groups)
        if min(gx, gy, gz) < 0:
            raise ArgumentValueError(f"{self.name}: negative group count {groups}")
        self.check_groups(gx, gy, gz)
        bgs, imm = self.prepare(storages, uniforms, scalars)
        self.record((gx, gy, gz), bgs, imm)
