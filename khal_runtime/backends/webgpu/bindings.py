"""Bind groups, cached by what they bind, and push-constant (immediates) blocks.

A bind group is keyed by ``(group layout id, serial, offset, size of each binding)``. Serials
are never reused (:func:`.memory.new_serial`), so a freed buffer's groups can never be hit by a
new buffer that got the same ``id()``; the groups of a freed or dropped allocation are
forgotten at once (they would keep its memory alive). The cache is bounded: when full it is
emptied (bind groups are cheap to make: ~20 us on lavapipe).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Sequence

from khal_runtime.backends.webgpu._wgpu import native, wgpu_module
from khal_runtime.backends.webgpu.errors import WebGpuError

if TYPE_CHECKING:
    from khal_runtime.backends.webgpu.device import WebGpuDevice
    from khal_runtime.backends.webgpu.memory import Resource

__all__ = ["BindGroupCache", "BoundGroup", "Immediates", "ImmediatesCache", "bind_group_cache",
           "immediates_cache"]

MAX_GROUPS = 4096
MAX_IMMEDIATES = 1024


class BoundGroup:
    """One wgpu bind group (``gpu``) and its native handle (``raw``, for the fast path)."""

    __slots__ = ("gpu", "raw", "key", "__weakref__")

    def __init__(self, gpu: Any, key: tuple[Any, ...]) -> None:
        self.gpu = gpu
        self.raw = gpu._internal if native() is not None else gpu
        self.key = key


class BindGroupCache:
    """Per-device bind groups by key (see the module docstring)."""

    def __init__(self, device: WebGpuDevice, max_entries: int = MAX_GROUPS) -> None:
        self.device = device
        self.max_entries = max_entries
        self.groups: dict[tuple[Any, ...], BoundGroup] = {}
        self._by_serial: dict[int, list[tuple[Any, ...]]] = {}
        self._lock = threading.Lock()
        self.created = 0

    def get(self, layout: Any, lid: int, bindings: Sequence[int], res: Sequence[Resource]) -> BoundGroup:
        """The bind group of layout ``layout`` (id ``lid``) binding ``res[i]`` at binding
        ``bindings[i]``."""
        key = (lid,) + tuple(x for r in res for x in r[1:])
        g = self.groups.get(key)
        if g is None:
            g = self.create(layout, key, bindings, res)
        return g

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
        g = BoundGroup(gpu, key)
        with self._lock:
            if len(self.groups) >= self.max_entries:
                self.groups.clear()
                self._by_serial.clear()
            self.groups[key] = g
            for r in res:
                self._by_serial.setdefault(r[1], []).append(key)
            self.created += 1
        return g

    def forget(self, serial: int) -> None:
        """Drop every group that binds the allocation with this serial."""
        with self._lock:
            for key in self._by_serial.pop(serial, ()):
                self.groups.pop(key, None)


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
