"""A fake ``cuda.bindings.driver`` for CPU tests of graphs, tracing and indirect dispatch.

It records every call, keeps events / graphs / captures as plain objects, decodes
``cuLaunchKernel``'s ``void**`` block with the layout the test gives it, and lets a
test plant errors (``fail[name] = CUresult``). No GPU, no libcuda.
"""

from __future__ import annotations

import ctypes
import enum
import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from khal_runtime import _cuda
from khal_runtime.manifest import Entry, Param, symbol_for


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_ILLEGAL_ADDRESS = 700
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910


class CUstreamCaptureMode(enum.IntEnum):
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
    CU_STREAM_CAPTURE_MODE_RELAXED = 2


class CUstreamCaptureStatus(enum.IntEnum):
    CU_STREAM_CAPTURE_STATUS_NONE = 0
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2


class CUevent_flags(enum.IntEnum):  # noqa: N801
    CU_EVENT_DEFAULT = 0
    CU_EVENT_DISABLE_TIMING = 2


class FakeGraph:
    def __init__(self, gid: int, nodes: list[Any]) -> None:
        self.id = gid
        self.nodes = nodes

    def __int__(self) -> int:
        return 0x6000 + self.id


class FakeDriver:
    CUresult = CUresult
    CUstreamCaptureMode = CUstreamCaptureMode
    CUstreamCaptureStatus = CUstreamCaptureStatus
    CUevent_flags = CUevent_flags

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.launches: list[dict[str, Any]] = []
        self.layouts: dict[Any, list[tuple[str, int, int]]] = {}
        self.capturing: dict[Any, int] = {}      # stream -> capture mode
        self.captured: dict[Any, list[Any]] = {}  # stream -> launches recorded
        self.thread_mode = CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
        self.fail: dict[str, CUresult] = {}
        self.elapsed = itertools.cycle([0.5, 1.5])  # ms per event pair
        self.event_ids = itertools.count(1)
        self.graph_ids = itertools.count(1)
        self.host_words: dict[int, int] = {}      # device pointer -> uint32 value (for DtoH)
        self.occupancy = 8

    def _r(self, name: str, *rest: Any) -> tuple[Any, ...]:
        err = self.fail.get(name, CUresult.CUDA_SUCCESS)
        return (err, *rest) if not err else (err,) + tuple(None for _ in rest)

    def _log(self, *call: Any) -> None:
        self.calls.append(call)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    # streams
    def CUstream(self, h: int) -> Any:  # noqa: N802
        return f"CUstream({h})"

    def cuStreamIsCapturing(self, s: Any) -> tuple[Any, ...]:  # noqa: N802
        st = CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE if s in self.capturing \
            else CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
        return (CUresult.CUDA_SUCCESS, st)

    def cuStreamSynchronize(self, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuStreamSynchronize", s)
        return self._r("cuStreamSynchronize")

    def cuStreamBeginCapture(self, s: Any, mode: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuStreamBeginCapture", s, mode)
        self.capturing[s] = mode
        self.captured[s] = []
        return self._r("cuStreamBeginCapture")

    def cuStreamEndCapture(self, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuStreamEndCapture", s)
        self.capturing.pop(s, None)
        nodes = self.captured.pop(s, [])
        return self._r("cuStreamEndCapture", FakeGraph(next(self.graph_ids), nodes))

    def cuThreadExchangeStreamCaptureMode(self, mode: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuThreadExchangeStreamCaptureMode", mode)
        old, self.thread_mode = self.thread_mode, mode
        return (CUresult.CUDA_SUCCESS, old)

    # graphs
    def cuGraphInstantiate(self, g: Any, flags: int) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuGraphInstantiate", g.id)
        return self._r("cuGraphInstantiate", SimpleNamespace(graph=g))

    def cuGraphExecUpdate(self, ex: Any, g: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuGraphExecUpdate", g.id)
        if self.fail.get("cuGraphExecUpdate"):
            return (self.fail["cuGraphExecUpdate"], None)
        ex.graph = g
        return (CUresult.CUDA_SUCCESS, SimpleNamespace(result=0))

    def cuGraphGetNodes(self, g: Any, n: int = 0) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, [], len(g.nodes))

    def cuGraphUpload(self, ex: Any, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuGraphUpload", ex.graph.id, s)
        return self._r("cuGraphUpload")

    def cuGraphLaunch(self, ex: Any, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuGraphLaunch", ex.graph.id, s)
        return self._r("cuGraphLaunch")

    def cuGraphDestroy(self, g: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuGraphDestroy", g.id)
        return (CUresult.CUDA_SUCCESS,)

    def cuGraphExecDestroy(self, ex: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuGraphExecDestroy", ex.graph.id)
        return (CUresult.CUDA_SUCCESS,)

    # events
    def cuEventCreate(self, flags: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, f"ev{next(self.event_ids)}")

    def cuEventRecord(self, ev: Any, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuEventRecord", ev, s)
        return (CUresult.CUDA_SUCCESS,)

    def cuEventQuery(self, ev: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    def cuEventSynchronize(self, ev: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuEventSynchronize", ev)
        return (CUresult.CUDA_SUCCESS,)

    def cuEventElapsedTime(self, a: Any, b: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, next(self.elapsed))

    def cuEventDestroy(self, ev: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    # kernels
    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):  # noqa: N802
        layout = self.layouts.get(f, [])
        slots = []
        if layout:
            ptrs = (ctypes.c_void_p * len(layout)).from_address(params)
            slots = [ctypes.string_at(ptrs[i], size) for i, (_, _, size) in enumerate(layout)]
        rec = dict(f=f, grid=(gx, gy, gz), block=(bx, by, bz), shmem=shmem, stream=stream, slots=slots)
        self.launches.append(rec)
        self._log("cuLaunchKernel", f, stream)
        if stream in self.capturing:
            self.captured[stream].append(rec)
        return self._r("cuLaunchKernel")

    class CUlaunchConfig:  # noqa: N801 - the bindings' name
        """What cuda.bindings' CUlaunchConfig holds, for cuLaunchKernelEx."""

        gridDimX = gridDimY = gridDimZ = blockDimX = blockDimY = blockDimZ = 1  # noqa: N815
        sharedMemBytes = numAttrs = 0  # noqa: N815
        hStream: Any = None  # noqa: N815

    def cuLaunchKernelEx(self, cfg, f, params, extra):  # noqa: N802
        """Recorded as the cuLaunchKernel it is equivalent to (the runtime uses either)."""
        return self.cuLaunchKernel(f, cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX,
                                   cfg.blockDimY, cfg.blockDimZ, cfg.sharedMemBytes, cfg.hStream,
                                   params, extra)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, f: Any, block: int, smem: int):  # noqa: N802
        return (CUresult.CUDA_SUCCESS, self.occupancy)

    def cuModuleLoadData(self, image: bytes) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuModuleLoadData", len(image))
        return (CUresult.CUDA_SUCCESS, "HELPER_MODULE")

    def cuModuleGetFunction(self, mod: Any, name: bytes) -> tuple[Any, ...]:  # noqa: N802
        self.layouts["HELPER"] = [("threads", 0, 8), ("groups", 8, 8), ("block", 16, 4)]
        return (CUresult.CUDA_SUCCESS, "HELPER")

    def cuMemAlloc(self, n: int) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuMemAlloc", n)
        return self._r("cuMemAlloc", 0xA110C000 + 256 * len(self.calls))

    def cuMemFree(self, p: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS,)

    def cuMemHostAlloc(self, n: int, flags: int) -> tuple[Any, ...]:  # noqa: N802
        buf = ctypes.create_string_buffer(n)
        self.calls.append(("cuMemHostAlloc", n))
        self._keep = getattr(self, "_keep", []) + [buf]
        return (CUresult.CUDA_SUCCESS, ctypes.addressof(buf))

    def cuMemcpyDtoHAsync(self, dst: int, src: int, n: int, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuMemcpyDtoHAsync", src, n, s)
        ctypes.c_uint32.from_address(dst).value = self.host_words.get(src, 0)
        return self._r("cuMemcpyDtoHAsync")

    def cuCtxSynchronize(self) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuCtxSynchronize")
        return (CUresult.CUDA_SUCCESS,)


def make_entry(name: str, params: tuple[Param, ...], block: int = 128, indirect: bool = True) -> Entry:
    h = "0123456789abcdef"
    return Entry(name=name, symbol=symbol_for(name, h), hash=h, block_size=(block, 1, 1), params=params,
                 indirect_symbol=symbol_for(f"{name}_indirect", h) if indirect else None)


def storage(name: str, et: str = "float32", size: int = 4, **kw: Any) -> Param:
    return Param(name=name, kind="storage", element_type=et, element_size=size, element_align=size,
                 shape=kw.pop("shape", "slice"), **kw)


def uniform(name: str, et: str = "Params", size: int = 8) -> Param:
    return Param(name=name, kind="uniform", element_type=et, element_size=size, element_align=4)


def scalar(name: str, et: str = "float32", size: int = 4) -> Param:
    return Param(name=name, kind="scalar", element_type=et, element_size=size, element_align=size)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    """The fake driver, a fake Device(0) (132 SMs) current in this thread, a fresh runtime state."""
    from khal_runtime import device, graphs, indirect, launching, uniforms
    from khal_runtime.stream import Stream

    drv = FakeDriver()
    monkeypatch.setattr(_cuda, "_driver", drv)
    dev = object.__new__(device.Device)
    dev._ordinal = 0
    dev._handle = 0
    dev._ctx = "CTX"
    dev._cc = (9, 0)
    dev._attr_cache = {"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 132}
    dev._stream = Stream(0x5000, 0, owned=True)
    monkeypatch.setitem(device._devices, 0, dev)
    monkeypatch.setattr(device._tls, "dev", 0, raising=False)
    monkeypatch.setattr(device._tls, "stream", dev._stream, raising=False)
    monkeypatch.setattr(device._tls, "ready", dev._stream, raising=False)
    monkeypatch.setattr(uniforms, "_caches", {})
    for d in (indirect._helpers, indirect._iplans, indirect._grids, indirect._scratch, indirect._helper_args):
        d.clear()
    monkeypatch.setattr(indirect._tls, "pinned", None, raising=False)
    graphs._open.clear()
    graphs._state.__dict__.pop("captures", None)
    launching.hooks.uninstall()
    yield drv
    launching.hooks.uninstall()
    graphs._open.clear()
    graphs._state.__dict__.pop("captures", None)
    for d in (indirect._helpers, indirect._iplans, indirect._grids, indirect._scratch, indirect._helper_args):
        d.clear()
