"""WebGPU adapters and devices: which adapter, its status, and one device per ordinal.

Ordinals: the adapters wgpu-py enumerates, best first (discrete GPU, integrated, virtual, CPU;
native backends Vulkan / Metal / D3D12 before OpenGL, and an OpenGL twin of an adapter already
listed through a native backend left out). ``KHAL_WEBGPU_ADAPTER`` keeps only the adapters
whose name, description, vendor or backend contains it (case-insensitive), e.g. ``llvmpipe``,
``nvidia`` or ``vulkan``. Nothing here runs at import; :func:`status` probes once and never
raises; :func:`get_device` creates a device lazily, once per ordinal, thread-safely.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from khal_runtime.backends.webgpu._wgpu import wgpu_module
from khal_runtime.errors import BackendUnavailableError, WebGpuError
from khal_runtime.backends.webgpu.stream import CommandStream

__all__ = [
    "ADAPTER_ENV",
    "AdapterInfo",
    "WebGpuDevice",
    "WebGpuStatus",
    "device_count",
    "get_device",
    "require_webgpu",
    "status",
]

ADAPTER_ENV = "KHAL_WEBGPU_ADAPTER"

#: features asked for when the adapter has them: SPIR-V push constants, GPU timestamps for
#: profiling, and what Slang's WGSL may ``enable`` (f16, subgroups)
WANTED_FEATURES = ("immediates", "timestamp-query", "shader-f16", "subgroup")
#: limits that must be raised to the adapter's (the rest are raised too when the adapter allows)
KEY_LIMITS = ("max-compute-workgroups-per-dimension", "max-storage-buffer-binding-size",
              "max-buffer-size", "max-storage-buffers-per-shader-stage", "max-immediate-size",
              "max-compute-invocations-per-workgroup", "max-compute-workgroup-storage-size",
              "max-compute-workgroup-size-x", "max-compute-workgroup-size-y",
              "max-compute-workgroup-size-z", "max-uniform-buffer-binding-size",
              "max-bindings-per-bind-group")

_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
_NATIVE = {"Vulkan", "Metal", "D3D12"}


@dataclass(frozen=True)
class AdapterInfo:
    """What one adapter says of itself."""

    name: str            # "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H200"
    vendor: str
    backend_type: str    # "Vulkan", "Metal", "D3D12", "OpenGL", ...
    adapter_type: str    # "DiscreteGPU", "IntegratedGPU", "CPU", ...
    description: str = ""

    def describe(self) -> str:
        return f"{self.name} ({self.adapter_type}, {self.backend_type})"


@dataclass(frozen=True)
class WebGpuStatus:
    """Whether WebGPU is usable here, which adapter ordinal 0 is, and why not if it is not."""

    usable: bool
    reason: str = ""
    adapter: AdapterInfo | None = None
    #: every adapter ordinal, best first (after ``KHAL_WEBGPU_ADAPTER``)
    adapters: tuple[AdapterInfo, ...] = ()
    #: every adapter wgpu-py saw, before the filter
    seen: tuple[AdapterInfo, ...] = field(default=())


def _info(adapter: Any) -> AdapterInfo:
    i = adapter.info
    return AdapterInfo(name=str(i.get("device", "") or i.get("description", "") or "?"),
                       vendor=str(i.get("vendor", "")),
                       backend_type=str(i.get("backend_type", "?")),
                       adapter_type=str(i.get("adapter_type", "?")),
                       description=str(i.get("description", "")))


def _rank(adapters: list[Any]) -> list[tuple[Any, AdapterInfo]]:
    pairs = [(a, _info(a)) for a in adapters]
    pairs.sort(key=lambda p: (_TYPE_RANK.get(p[1].adapter_type, 4), p[1].backend_type not in _NATIVE))
    native = {p[1].name for p in pairs if p[1].backend_type in _NATIVE}
    return [p for p in pairs if p[1].backend_type in _NATIVE or p[1].name not in native]


def _matches(info: AdapterInfo, want: str) -> bool:
    w = want.lower()
    return any(w in s.lower() for s in (info.name, info.description, info.vendor, info.backend_type,
                                        info.adapter_type))


_lock = threading.Lock()
_probe: tuple[WebGpuStatus, list[Any]] | None = None
_devices: dict[int, WebGpuDevice] = {}


def _enumerate() -> tuple[WebGpuStatus, list[Any]]:
    try:
        wgpu = wgpu_module()
    except BackendUnavailableError as exc:
        return WebGpuStatus(False, str(exc)), []
    try:
        found = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:  # noqa: BLE001
        found = []
        why = f"{type(exc).__name__}: {exc}"
    else:
        why = ""
    if not found:
        try:
            a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
            found = [a] if a is not None else []
        except Exception as exc:  # noqa: BLE001
            why = why or f"{type(exc).__name__}: {exc}"
    ranked = _rank(found)
    seen = tuple(i for _, i in ranked)
    if not ranked:
        return WebGpuStatus(False, "no WebGPU adapter was found" + (f" ({why})" if why else "")
                            + ": install a Vulkan (or Metal / D3D12) driver; on a machine without a "
                            "GPU, Mesa's lavapipe (Debian/Ubuntu: apt-get install mesa-vulkan-drivers)"), []
    want = os.environ.get(ADAPTER_ENV, "").strip()
    if want:
        ranked = [p for p in ranked if _matches(p[1], want)]
        if not ranked:
            return WebGpuStatus(False, f"{ADAPTER_ENV}={want!r} matches none of the WebGPU adapters "
                                f"({'; '.join(i.describe() for i in seen)}): unset it or name one of them",
                                seen=seen), []
    infos = tuple(i for _, i in ranked)
    return WebGpuStatus(True, "", infos[0], infos, seen), [a for a, _ in ranked]


def _probed() -> tuple[WebGpuStatus, list[Any]]:
    global _probe
    p = _probe
    if p is None:
        with _lock:
            if _probe is None:
                _probe = _enumerate()
            p = _probe
    return p


def status() -> WebGpuStatus:
    """Probe WebGPU once (import wgpu, enumerate adapters); cached; never raises."""
    return _probed()[0]


def require_webgpu() -> WebGpuStatus:
    """The status if WebGPU is usable, else BackendUnavailableError saying why."""
    st = status()
    if not st.usable:
        raise BackendUnavailableError(st.reason)
    return st


def device_count() -> int:
    return len(require_webgpu().adapters)


class WebGpuDevice:
    """One WebGPU device (adapter ordinal), with its queue's single ordered command stream.

    Everything wgpu-py stays inside: ``adapter``, ``device`` and ``queue`` are the wgpu-py
    objects, for this package's modules only. The plain attributes are the limits and
    features the launch path reads (cheap, never recomputed)."""

    def __init__(self, ordinal: int, adapter: Any) -> None:
        self.ordinal = ordinal
        self.adapter = adapter
        self.info = _info(adapter)
        self.device = _request_device(adapter, self.info)
        self.queue = self.device.queue
        lim = self.device.limits
        feats = set(self.device.features)
        self.limits: dict[str, int] = {str(k): int(v) for k, v in lim.items()}
        self.features: frozenset[str] = frozenset(str(f) for f in feats)
        self.max_groups = int(lim["max-compute-workgroups-per-dimension"])
        self.storage_align = int(lim["min-storage-buffer-offset-alignment"])
        self.uniform_align = int(lim["min-uniform-buffer-offset-alignment"])
        self.max_storage_binding = int(lim["max-storage-buffer-binding-size"])
        self.max_uniform_binding = int(lim["max-uniform-buffer-binding-size"])
        self.max_buffer_size = int(lim["max-buffer-size"])
        self.has_immediates = "immediates" in self.features
        self.max_immediate_size = int(lim.get("max-immediate-size", 0)) if self.has_immediates else 0
        self.has_timestamps = "timestamp-query" in self.features
        #: the device's one ordered command stream (WebGPU has one queue per device)
        self.stream = CommandStream(self)
        #: per-device caches other modules attach (uniform pool, bind groups, pipelines, ...)
        self.caches: dict[str, Any] = {}
        self.lock = threading.RLock()

    def cache(self, name: str, make: Any) -> Any:
        """The per-device object ``name``, made by ``make(self)`` on first use."""
        c = self.caches.get(name)
        if c is None:
            with self.lock:
                c = self.caches.get(name)
                if c is None:
                    c = make(self)
                    self.caches[name] = c
        return c

    def describe(self) -> str:
        return f"WebGPU device {self.ordinal}: {self.info.describe()}"

    def __repr__(self) -> str:
        return f"<WebGpuDevice {self.ordinal} {self.info.describe()}>"


def _request_device(adapter: Any, info: AdapterInfo) -> Any:
    feats = [f for f in WANTED_FEATURES if f in adapter.features]
    alim = {str(k): int(v) for k, v in adapter.limits.items()}
    attempts = (alim, {k: alim[k] for k in KEY_LIMITS if k in alim}, None)
    last: Exception | None = None
    for limits in attempts:
        try:
            return adapter.request_device_sync(label="khal", required_features=feats,
                                               required_limits=limits)
        except Exception as exc:  # noqa: BLE001  (retry with fewer raised limits)
            last = exc
    raise WebGpuError(f"WebGPU adapter {info.describe()} refused to create a device "
                      f"({type(last).__name__}: {last}); pick another with {ADAPTER_ENV}=<name>")


def get_device(ordinal: int = 0) -> WebGpuDevice:
    """The device of adapter ``ordinal`` (created on first use; one per ordinal)."""
    dev = _devices.get(ordinal)
    if dev is not None:
        return dev
    st = require_webgpu()
    ordinal = int(ordinal)
    if not 0 <= ordinal < len(st.adapters):
        raise ValueError(f"WebGPU device {ordinal}: there are {len(st.adapters)} adapter(s) "
                         f"({'; '.join(i.describe() for i in st.adapters)})")
    with _lock:
        dev = _devices.get(ordinal)
        if dev is None:
            dev = WebGpuDevice(ordinal, _probed()[1][ordinal])
            _devices[ordinal] = dev
    return dev


def as_device(device: Any) -> WebGpuDevice:
    """A WebGpuDevice from an ordinal, a device, or anything with ``device_id`` (None: device 0)."""
    if isinstance(device, WebGpuDevice):
        return device
    if device is None:
        return get_device(0)
    return get_device(int(getattr(device, "device_id", device)))
