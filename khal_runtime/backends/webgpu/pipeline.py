"""Compute pipelines of entries, with explicit layouts built from the manifest.

From an entry's artifact (WGSL text, or SPIR-V) and its :class:`~khal_runtime.manifest.WebGpuTarget`:
the shader module; one bind group layout per group index used (``read`` -> read-only-storage,
``read_write`` -> storage, ``uniform`` -> uniform; compute visibility); the pipeline layout
(``immediate_size`` for the scalar block when ``target.scalars == "push_constants"``); the
compute pipeline with ``entry_point = target.entry_point``. Cached per (entry symbol, target,
device). WGSL is the default; ``KHAL_WEBGPU_SHADER=spirv`` selects SPIR-V where the entry has it.
"""

from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from khal_runtime.backends.webgpu._wgpu import native, wgpu_module
from khal_runtime.errors import EnvVarError, KhalError, PipelineCreationError

if TYPE_CHECKING:
    from khal_runtime.manifest import Entry, WebGpuTarget
    from khal_runtime.backends.webgpu.device import WebGpuDevice

__all__ = ["SHADER_ENV", "GroupPlan", "Pipeline", "get_pipeline", "select_target"]

SHADER_ENV = "KHAL_WEBGPU_SHADER"
_ACCESS = {"read": "read-only-storage", "read_write": "storage", "uniform": "uniform"}
_lids = itertools.count(1)


def select_target(entry: Entry, crate: str = "") -> WebGpuTarget:
    """The entry's target to run: WGSL, or SPIR-V with ``KHAL_WEBGPU_SHADER=spirv``."""
    raw = os.environ.get(SHADER_ENV, "").strip().lower() or "wgsl"
    if raw not in ("wgsl", "spirv"):
        raise EnvVarError(f"{SHADER_ENV}={raw!r}: expected wgsl (the default) or spirv", variable=SHADER_ENV,
                          value=raw)
    name = f"{crate + '.' if crate else ''}{entry.name}"
    if not entry.webgpu:
        raise KhalError(f"entry {name} has no WebGPU build (a CUDA C++ crate, or built with "
                        "KHAL_SKIP_SPIRV): it runs on CUDA only; rebuild a Slang crate without "
                        "KHAL_SKIP_SPIRV for WebGPU")
    t = entry.target(raw)
    if t is None:
        have = ", ".join(x.target for x in entry.webgpu)
        raise KhalError(f"entry {name} has no {raw} build ({SHADER_ENV}={raw}); it has {have}")
    return t


class GroupPlan(NamedTuple):
    """One bind group of a pipeline: its group index, layout (and a unique id for cache keys), and
    for each binding its number and what fills it (``param`` None: the scalar block)."""

    group: int
    layout: Any
    lid: int
    bindings: tuple[int, ...]
    params: tuple[str | None, ...]
    access: tuple[str, ...]
    #: per binding: whether it takes a dynamic offset (uniform bindings, where the device allows)
    dynamic: tuple[bool, ...]


class Pipeline:
    """A compute pipeline of one entry on one device (wgpu objects inside)."""

    def __init__(self, device: WebGpuDevice, entry: Entry, target: WebGpuTarget, gpu: Any,
                 layout: Any, groups: tuple[GroupPlan, ...], immediate_size: int, name: str) -> None:
        self.device = device
        self.entry = entry
        self.target = target
        self.gpu = gpu
        self.raw = gpu._internal if native() is not None else gpu
        self.layout = layout
        self.groups = groups
        self.immediate_size = immediate_size
        self.block = tuple(entry.block_size)
        #: "crate.entry" (error messages, traces, profiles)
        self.name = name

    @property
    def symbol(self) -> str:
        return self.entry.symbol

    def __repr__(self) -> str:
        return f"<Pipeline {self.name} {self.target.target} on WebGPU device {self.device.ordinal}>"


def _create(device: WebGpuDevice, entry: Entry, target: WebGpuTarget, code: bytes | str, name: str) -> Pipeline:
    wgpu = wgpu_module()
    d = device.device
    what = f"entry {name} ({target.target}, {target.path})"
    immediate = 0
    if target.scalars == "push_constants":
        immediate = (target.scalar_block_size + 3) & ~3
        if not device.has_immediates:
            raise PipelineCreationError(
                f"{what}: its scalars are push constants, which {device.describe()} does not support "
                f"(no 'immediates' feature); run the WGSL build ({SHADER_ENV}=wgsl, the default)")
        if immediate > device.max_immediate_size:
            raise PipelineCreationError(
                f"{what}: its push constants take {immediate} bytes, {device.describe()} allows "
                f"{device.max_immediate_size}; run the WGSL build ({SHADER_ENV}=wgsl)")
    if target.target == "wgsl":
        try:
            source: bytes | str = code.decode("utf-8") if isinstance(code, (bytes, bytearray)) else code
        except UnicodeDecodeError:
            raise PipelineCreationError(f"{what}: the WGSL artifact is not UTF-8 text; rebuild the package") from None
    else:
        source = bytes(code) if not isinstance(code, str) else code.encode()
    used = sorted({b.group for b in target.bindings})
    n_uniform = sum(1 for b in target.bindings if b.access == "uniform")
    dyn_ok = n_uniform <= device.limits.get("max-dynamic-uniform-buffers-per-pipeline-layout", 8)
    n_groups = (used[-1] + 1) if used else 0
    groups: list[GroupPlan] = []
    layouts: list[Any] = []
    try:
        module = d.create_shader_module(label=entry.symbol, code=source)
        for g in range(n_groups):
            bs = sorted((b for b in target.bindings if b.group == g), key=lambda b: b.binding)
            dyn = tuple(dyn_ok and b.access == "uniform" for b in bs)
            entries = [{"binding": b.binding, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": _ACCESS[b.access], "has_dynamic_offset": dy}}
                       for b, dy in zip(bs, dyn)]
            layout = d.create_bind_group_layout(label=f"{entry.symbol} group {g}", entries=entries)
            layouts.append(layout)
            groups.append(GroupPlan(g, layout, next(_lids), tuple(b.binding for b in bs),
                                    tuple(b.param for b in bs), tuple(b.access for b in bs), dyn))
        playout = d.create_pipeline_layout(label=entry.symbol, bind_group_layouts=layouts,
                                           immediate_size=immediate)
        gpu = d.create_compute_pipeline(label=entry.symbol, layout=playout,
                                        compute={"module": module, "entry_point": target.entry_point})
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, (wgpu.GPUError, RuntimeError, ValueError)):
            msg = "\n".join(line.rstrip() for line in str(exc).strip().splitlines()[:40])
            raise PipelineCreationError(
                f"{what}: WebGPU could not create its pipeline on {device.describe()}:\n{msg}\n"
                f"Rebuild the package; if it persists, report it with the artifact, or try the other "
                f"shader language ({SHADER_ENV}=wgsl / spirv)") from None
        raise
    return Pipeline(device, entry, target, gpu, playout, tuple(groups), immediate, name)


def get_pipeline(device: WebGpuDevice, entry: Entry, target: WebGpuTarget,
                 code: bytes | str | Callable[[], bytes | str], crate: str = "") -> Pipeline:
    """The pipeline of ``entry``'s ``target`` on ``device`` (created on first use; cached per
    (entry symbol, target, device)). ``code`` is the artifact's bytes, or a function giving
    them (called on a cache miss only)."""
    cache: dict[tuple[str, str], Pipeline] = device.cache("pipelines", lambda _d: {})
    key = (entry.symbol, target.target)
    p = cache.get(key)
    if p is None:
        with device.lock:
            p = cache.get(key)
            if p is None:
                src = code() if callable(code) else code
                p = _create(device, entry, target, src, f"{crate + '.' if crate else ''}{entry.name}")
                cache[key] = p
    return p
