"""Bind groups, cached by what they bind, and push-constant (immediates) blocks.

A bind group is keyed by ``(group layout id, Resource of each binding)`` where a Resource is
``(wgpu buffer, serial, offset, size)``. Serials are never reused (:func:`.memory.new_serial`),
so a freed buffer's groups can never be hit by a new buffer that got the same ``id()``; the
groups of a freed or dropped allocation are forgotten at once (they would keep its memory
alive). The cache is bounded: when full it is emptied (bind groups are cheap to make).

Uniform bindings (uniform structs, the WGSL scalar block) have dynamic offsets where the device
allows as many as the pipeline has: their bind group binds the uniform slab at offset 0, and
each dispatch passes the region's offset. A new uniform value then costs a new region, not a
new bind group. :class:`DynBound` is a bind group with its offsets, cached by both, so that
the stream can skip ``set_bind_group`` when it is the one already set.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Sequence

from khal_runtime.backends.webgpu._wgpu import native, wgpu_module
from khal_runtime.errors import WebGpuError

if TYPE_CHECKING:
    from khal_runtime.backends.webgpu.device import WebGpuDevice
    from khal_runtime.backends.webgpu.memory import Resource

__all__ = ["BindGroupCache", "Bound", "BoundGroup", "DynBound", "Immediates", "ImmediatesCache",
           "bind_group_cache", "immediates_cache"]

MAX_GROUPS = 4096
MAX_DYN = 4096
MAX_IMMEDIATES = 1024


def _null() -> Any:
    nat = native()
    return nat[1].NULL if nat is not None else None


class BoundGroup:
    """One wgpu bind group (``gpu``), its native handle (``raw``, for the fast path), the
    serials of the allocations it binds, and no dynamic offsets (``n_dyn`` 0)."""

    __slots__ = ("gpu", "raw", "key", "serials", "n_dyn", "offsets", "dyn", "__weakref__")

    def __init__(self, gpu: Any, key: tuple[Any, ...], serials: tuple[int, ...]) -> None:
        self.gpu = gpu
        self.raw = gpu._internal if native() is not None else gpu
        self.key = key
        self.serials = serials
        self.n_dyn = 0
        self.offsets = _null()
        self.dyn: tuple[int, ...] = ()


class DynBound:
    """A bind group with its dynamic offsets (same attributes as :class:`BoundGroup`)."""

    __slots__ = ("gpu", "raw", "key", "serials", "n_dyn", "offsets", "dyn", "__weakref__")

    def __init__(self, base: BoundGroup, dyn: tuple[int, ...]) -> None:
        self.gpu, self.raw, self.key, self.serials = base.gpu, base.raw, base.key, base.serials
        self.n_dyn = len(dyn)
        self.dyn = dyn
        nat = native()
        self.offsets = nat[1].new("uint32_t[]", list(dyn)) if nat is not None else None


class BindGroupCache:
    """Per-device bind groups by key (see the module docstring)."""

    def __init__(self, device: WebGpuDevice, max_entries: int = MAX_GROUPS) -> None:
        self.device = device
        self.max_entries = max_entries
        self.groups: dict[tuple[Any, ...], BoundGroup] = {}
        self.dyn: dict[tuple[Any, ...], DynBound] = {}
        self._by_serial: dict[int, list[tuple[Any, ...]]] = {}
        # reentrant: an Allocation collected while this thread holds it forgets its groups here
        self._lock = threading.RLock()
        self.created = 0

    def get(self, layout: Any, lid: int, bindings: Sequence[int], res: Sequence[Resource]) -> BoundGroup:
        """The bind group of layout ``layout`` (id ``lid``) binding ``res[i]`` at binding
        ``bindings[i]``."""
        key = (lid, *res)
        g = self.groups.get(key)
        if g is None:
            g = self.create(layout, key, bindings, res)
        return g

    def with_offsets(self, g: BoundGroup, dyn: tuple[int, ...]) -> DynBound:
        """``g`` with dynamic offsets ``dyn`` (cached)."""
        key = (g, *dyn)
        d = self.dyn.get(key)
        if d is None:
            if len(self.dyn) >= MAX_DYN:
                self.dyn.clear()
            d = self.dyn[key] = DynBound(g, dyn)
        return d

    def create(self, layout: Any, key: tuple[Any, ...], bindings: Sequence[int],
               res: Sequence[Resource]) -> BoundGroup:
        wgpu = wgpu_module()
        entries = [{"binding": b, "resource": {"buffer": r[0], "offset": r[2], "size": r[3]}}
                   for b, r in zip(bindings, res)]
        try:
            gpu = self.device.device.create_bind_group(label="khal", layout=layout, entries=entries)
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, wgpu.GPUError):
                raise WebGpuError(f"creating a bind group on {self.device.describe()} failed: "
                                  f"{' '.join(str(exc).split())[:800]}") from None
            raise
        serials = tuple(r[1] for r in res)
        g = BoundGroup(gpu, key, serials)
        with self._lock:
            if len(self.groups) >= self.max_entries:
                self.groups.clear()
                self._by_serial.clear()
                self.dyn.clear()
            self.groups[key] = g
            for s in serials:
                self._by_serial.setdefault(s, []).append(key)
            self.created += 1
        return g

    def forget(self, serial: int) -> None:
        """Drop every group that binds the allocation with this serial."""
        with self._lock:
            keys = self._by_serial.pop(serial, ())
            dropped = [self.groups.pop(key, None) for key in keys]
            if any(g is not None for g in dropped) and self.dyn:
                gone = {id(g) for g in dropped if g is not None}
                self.dyn = {k: v for k, v in self.dyn.items() if id(k[0]) not in gone}


#: what a dispatch sets at one group index
Bound = BoundGroup | DynBound


def bind_group_cache(device: WebGpuDevice) -> BindGroupCache:
    return device.cache("bindings", BindGroupCache)  # type: ignore[no-any-return]


class Immediates:
    """A push-constant block: its bytes and a cffi pointer to them (kept alive here)."""

    __slots__ = ("data", "cdata", "size")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)
        nat = native()
        self.cdata = nat[1].from_buffer(data) if nat is not None else None


class ImmediatesCache:
    """Per-device :class:`Immediates` by bytes (bounded)."""

    def __init__(self, device: WebGpuDevice) -> None:
        self.blocks: dict[bytes, Immediates] = {}

    def get(self, data: bytes) -> Immediates:
        b = self.blocks.get(data)
        if b is None:
            if len(self.blocks) >= MAX_IMMEDIATES:
                self.blocks.clear()
            b = self.blocks[data] = Immediates(data)
        return b


def immediates_cache(device: WebGpuDevice) -> ImmediatesCache:
    return device.cache("immediates", ImmediatesCache)  # type: ignore[no-any-return]
