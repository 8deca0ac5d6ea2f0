"""The one fake ``cuda.bindings.driver`` of the CPU tests, and its fixture.

:class:`FakeDriver` records every call, keeps devices, streams, events, graphs and captures
as plain objects, loads "modules" from PTX text (its ``.entry`` lines) or a cubin, decodes each
launch's ``void**`` block with the parameter layout of the launched function, and lets a test
plant errors (``fail[name] = CUresult``). No GPU, no libcuda.

The parameter layouts (what ``cuFuncGetParamInfo`` answers and launches are decoded with) come
from the binary, never from the runtime: a PTX kernel's ``.param`` declarations, a cubin's
``EIATTR_KPARAM_INFO`` records (what the driver itself reads). The PTX that :func:`fake_kernels`
writes carries the ``.param`` declarations NVRTC emits for each parameter's C type
(:func:`nvrtc_params`), so a runtime that packs an ``int32`` into 8 bytes fails here as on a GPU.

The :func:`fake` fixture installs it as the CUDA backend's driver with a fresh runtime state
(device 0 with 132 SMs, compute capability 9.0, driver CUDA 13.0); :func:`fake_kernels` writes
a package of PTX for given entries and loads it through ``khal_runtime.load``, so tests reach
kernels through the public API.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import itertools
import json
import os
import re
import struct
import tempfile
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from khal_runtime import abi, backends, capture_state, device, scratch
from khal_runtime.backends import cuda as cuda_backend
from khal_runtime.backends.cuda import driver as cuda_driver
from khal_runtime.backends.cuda import graphs as cuda_graphs
from khal_runtime.backends.cuda import indirect as cuda_indirect
from khal_runtime.backends.cuda import launch as cuda_launch
from khal_runtime.backends.cuda import uniform_cache
from khal_runtime.binaries import is_elf, read_binary, scan_ptx
from khal_runtime.launch_hooks import hooks
from khal_runtime.manifest import SCHEMA_VERSION, Entry, Param, symbol_for

#: content hash of the fake packages' crate (entry hashes are computed from it)
CONTENT = "c0" * 32


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222
    CUDA_ERROR_NOT_FOUND = 500
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


class CUstream_flags(enum.IntEnum):  # noqa: N801
    CU_STREAM_DEFAULT = 0
    CU_STREAM_NON_BLOCKING = 1


class CUdevice_attribute(enum.IntEnum):  # noqa: N801
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95
    CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH = 120


class CUfunction_attribute(enum.IntEnum):  # noqa: N801
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class CUlaunchAttributeID(enum.IntEnum):  # noqa: N801 - cuda.h's CUlaunchAttributeID, every id
    CU_LAUNCH_ATTRIBUTE_IGNORE = 0
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
    CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY = 3
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
    CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT = 7
    CU_LAUNCH_ATTRIBUTE_PRIORITY = 8
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP = 9
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN = 10
    CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION = 11
    CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT = 12
    CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE = 13
    CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT = 14


class CUclusterSchedulingPolicy(enum.IntEnum):  # noqa: N801
    CU_CLUSTER_SCHEDULING_POLICY_DEFAULT = 0
    CU_CLUSTER_SCHEDULING_POLICY_SPREAD = 1
    CU_CLUSTER_SCHEDULING_POLICY_LOAD_BALANCING = 2


class _LaunchAttributeValue:
    """cuda.bindings' CUlaunchAttributeValue union: any member may be set; the fake remembers which
    (what a launch's record shows for the attribute), ``clusterDim`` being set through its x, y, z."""

    def __init__(self) -> None:
        object.__setattr__(self, "clusterDim", SimpleNamespace(x=0, y=0, z=0))
        object.__setattr__(self, "member", None)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        object.__setattr__(self, "member", name)

    def recorded(self) -> Any:
        if self.member is None:  # (a cluster: its dims were set)
            c = self.clusterDim
            return (c.x, c.y, c.z)
        return int(getattr(self, self.member))


class CUlaunchAttribute:  # noqa: N801 - the bindings' name
    """What cuda.bindings' CUlaunchAttribute holds: an id and a value union."""

    def __init__(self) -> None:
        self.id: Any = 0
        self.value = _LaunchAttributeValue()


#: (parameter name, offset, size) of each kernel parameter, in order
Layout = list[tuple[str, int, int]]

_ENTRY_PARAMS_RE = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)")
_PARAM_RE = re.compile(rb"\.param\s+(?:\.align\s+(\d+)\s+)?\.[a-z]+(8|16|32|64)\b"
                       rb"(?:\s+\.ptr(?:\s*\.(?:global|const|local|shared))?(?:\s+\.align\s+\d+)?)?"
                       rb"\s+([A-Za-z_$%][\w$]*)(?:\s*\[(\d+)\])?")


def ptx_param_layouts(ptx: bytes) -> dict[str, Layout]:
    """Kernel name -> its parameter layout, from the ``.param`` declarations of its ``.entry``
    (``.param .u64 p``, ``.param .align 8 .b8 p[16]``): each at the next multiple of its
    alignment (``.align`` or its width), as the driver lays out the parameter space."""
    out: dict[str, Layout] = {}
    for m in _ENTRY_PARAMS_RE.finditer(ptx):
        layout: Layout = []
        off = 0
        found = list(_PARAM_RE.finditer(m.group(2)))
        if len(found) != m.group(2).count(b".param"):
            raise ValueError(f"a .param declaration of {m.group(1).decode()} the fake cannot read: {m.group(2)!r}")
        for p in found:
            width = int(p.group(2)) // 8
            align = int(p.group(1)) if p.group(1) else width
            size = width * (int(p.group(4)) if p.group(4) else 1)
            off = (off + align - 1) // align * align
            layout.append((p.group(3).decode(), off, size))
            off += size
        out[m.group(1).decode()] = layout
    return out


_EIFMT_SVAL, _EIATTR_KPARAM_INFO = 0x04, 0x17


def cubin_param_layouts(cubin: bytes) -> dict[str, Layout]:
    """Kernel name -> its parameter layout, from the ``EIATTR_KPARAM_INFO`` records of its
    ``.nv.info.<name>`` section (ordinal, offset, and the size in bits 18..31 of the flags):
    what ``cuFuncGetParamInfo`` reports on a GPU."""
    from elftools.elf.elffile import ELFFile  # lazy: cubins only

    import io

    out: dict[str, Layout] = {}
    for sec in ELFFile(io.BytesIO(cubin)).iter_sections():
        if not sec.name.startswith(".nv.info."):
            continue
        data, i, params = sec.data(), 0, []
        while i + 4 <= len(data):
            fmt, attr = data[i], data[i + 1]
            if fmt != _EIFMT_SVAL:
                i += 4
                continue
            (size,) = struct.unpack_from("<H", data, i + 2)
            if attr == _EIATTR_KPARAM_INFO:
                _index, ordinal, offset, flags = struct.unpack_from("<IHHI", data, i + 4)
                params.append((ordinal, offset, (flags >> 18) & 0x3FFF))
            i += 4 + size
        out[sec.name[len(".nv.info."):]] = [(f"param_{o}", off, n) for o, off, n in sorted(params)]
    return out


def param_layouts(image: bytes) -> dict[str, Layout]:
    """The parameter layouts of a PTX module or a cubin."""
    return cubin_param_layouts(image) if is_elf(image) else ptx_param_layouts(image.rstrip(b"\0"))


#: The C type of each ABI scalar, as a CUDA C++ author spells it: the fake's own table (the
#: runtime's is what is under test). A scalar type added to the ABI needs its spelling here.
C_TYPES: dict[str, str] = {
    "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
    "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
    "uint64": "unsigned long long", "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
    "float64": "double", "bool": "bool", "complex64": "cuda::std::complex<float>",
    "complex128": "cuda::std::complex<double>",
}
_STRUCT = "khal_fake_struct"


def _probe_name(reader: str, element: str) -> str:
    return f"khal_probe_{reader}_{element}"


def _probe_source() -> str:
    """One kernel per (reader, element type): the kernel parameters of one binding, as the
    build generates them (the readers' ``cuda_params``), for NVRTC to declare in PTX."""
    lines = ["#include <cuda_fp16.h>", "#include <cuda_bf16.h>", "#include <cuda/std/complex>",
             '#include "khal.h"', f"struct {_STRUCT} {{ float a[3]; }};",
             'extern "C" __global__ void khal_probe_group_count(const unsigned int* groups) {}']
    for reader in abi.READERS.values():
        for element, ctype in [*C_TYPES.items(), ("struct", _STRUCT)]:
            if reader.name == "value" and element == "struct":
                continue  # a scalar is an ABI scalar
            kind = next(k for k in abi.KINDS.values() if k.reader == reader.name)
            params = ", ".join(kind.cuda_params(ctype, "p", False))
            lines.append(f'extern "C" __global__ void {_probe_name(reader.name, element)}({params}) {{}}')
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=None)
def nvrtc_params() -> dict[str, list[bytes]]:
    """Probe kernel name -> the ``.param`` declarations NVRTC emits for it (compiled once, the
    PTX kept in the temp folder under a hash of the source and NVRTC's version). Without NVRTC the
    test that needs them skips."""
    from hatch_khal.headers import nvrtc_cuda_major, resolve_headers
    from tests.conftest import skip_without

    skip_without("needs_nvrtc")
    from tests.helpers.synthetic import nvrtc_version

    source = _probe_source()
    key = hashlib.sha256(f"{nvrtc_version()}\0{source}".encode()).hexdigest()[:24]
    cached = Path(tempfile.gettempdir()) / f"khal-fake-params-{key}.ptx"
    try:
        ptx = cached.read_bytes()
    except OSError:
        ptx = _nvrtc_ptx(source, [Path(__file__).resolve().parents[2] / "hatch_khal" / "include",
                                  *resolve_headers("wheels", nvrtc_cuda_major()).include_dirs])
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(ptx)
        os.replace(tmp, cached)
    out = {}
    for m in _ENTRY_PARAMS_RE.finditer(ptx):
        out[m.group(1).decode()] = [p.group(0) for p in _PARAM_RE.finditer(m.group(2))]
    return out


def _nvrtc_ptx(source: str, include_dirs: list[Path]) -> bytes:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"khal_fake_params.cu", 0, [], [])
    assert not err, err
    try:
        opts = [b"--gpu-architecture=compute_90", b"-std=c++17", *(f"-I{d}".encode() for d in include_dirs)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = bytearray(size)
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC failed on the fake's parameter probes: {log.decode(errors='replace')}")
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        out = bytearray(size)
        nvrtc.nvrtcGetPTX(prog, out)
        return bytes(out).rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def entry_params(entry: Entry, indirect: bool = False) -> list[str]:
    """The ``.param`` declarations of ``entry``'s kernel (its indirect variant: one more, the
    group count's pointer), each NVRTC's own for its parameter's C type."""
    probes = nvrtc_params()
    decls: list[bytes] = []
    for p in entry.params:
        reader = abi.kind(p.kind).strategy.name
        element = p.element_type if p.element_type in abi.SCALARS else "struct"
        if element != "struct" and element not in C_TYPES:
            raise KeyError(f"scalar type {element!r}: add its C spelling to tests/helpers/fakecuda.py C_TYPES")
        decls += probes[_probe_name(reader, element)]
    if indirect:
        decls += probes["khal_probe_group_count"]
    out = []
    for i, d in enumerate(decls):
        m = _PARAM_RE.match(d)
        assert m is not None
        out.append((d[:m.start(3)] + f"p{i}".encode() + d[m.end(3):]).decode())
    return out


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
    CUstream_flags = CUstream_flags
    CUdevice_attribute = CUdevice_attribute
    CUfunction_attribute = CUfunction_attribute
    CUlaunchAttributeID = CUlaunchAttributeID
    CUlaunchAttribute = CUlaunchAttribute
    CUclusterSchedulingPolicy = CUclusterSchedulingPolicy

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.launches: list[dict[str, Any]] = []
        #: function -> parameter layout (what cuFuncGetParamInfo answers and launches decode with)
        self.layouts: dict[Any, list[tuple[str, int, int]]] = {}
        #: the layout of launches of a function not in ``layouts``
        self.layout: list[tuple[str, int, int]] = []
        self.attributes = {CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
                           CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
                           CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 132,
                           CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
                           CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: 1,
                           CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: 1}
        #: (function, attribute, value) of every cuFuncSetAttribute
        self.func_attributes: list[tuple[Any, Any, int]] = []
        #: (library, global name) -> (device pointer, bytes) that cuLibraryGetGlobal answers
        self.globals: dict[str, tuple[int, int]] = {}
        #: (function, threads, shared) of every occupancy query
        self.occupancy_calls: list[tuple[Any, int, int]] = []
        self.devices = 1
        self.version = 13000
        self.freed: list[int] = []
        self.memory: dict[int, bytes] = {}  # device pointer -> bytes copied there
        self.libraries: dict[Any, dict[str, Any]] = {}
        self.stream_ids = itertools.count(0x5000)
        self.alloc_ids = itertools.count(0)
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

    # init, devices, contexts
    def cuInit(self, flags: int) -> tuple[Any, ...]:  # noqa: N802
        return self._r("cuInit")

    def cuDriverGetVersion(self) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, self.version)

    def cuDeviceGetCount(self) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, self.devices)

    def cuDeviceGet(self, ordinal: int) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, ordinal)

    def cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, f"CTX{dev}")

    def cuDeviceGetAttribute(self, attr: Any, dev: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, self.attributes[attr])

    def cuDeviceGetName(self, n: int, dev: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, b"Fake H200\0")

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuCtxSetCurrent", ctx)
        return (CUresult.CUDA_SUCCESS,)

    # streams
    def CUstream(self, h: int) -> Any:  # noqa: N802
        return f"CUstream({h})"

    def cuStreamCreate(self, flags: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuStreamCreate", flags)
        return (CUresult.CUDA_SUCCESS, _Handle(next(self.stream_ids)))

    def cuStreamDestroy(self, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuStreamDestroy", s)
        return (CUresult.CUDA_SUCCESS,)

    def cuStreamGetDevice(self, s: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, 0)

    def cuStreamWaitEvent(self, s: Any, ev: Any, flags: int) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuStreamWaitEvent", s, ev)
        return (CUresult.CUDA_SUCCESS,)

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
    def cuLaunchKernel(self, f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,  # noqa: N802
                       shmem: int, stream: Any, params: int, extra: Any) -> tuple[Any, ...]:
        assert isinstance(params, int)
        layout = self.layouts.get(f, self.layout)
        slots = []
        if layout:
            ptrs = (ctypes.c_void_p * len(layout)).from_address(params)
            slots = [ctypes.string_at(ptrs[i] or 0, size) for i, (_, _, size) in enumerate(layout)]
        rec = dict(f=f, grid=(gx, gy, gz), block=(bx, by, bz), shmem=shmem, stream=stream, slots=slots, attrs=[])
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

    ex_calls = 0

    def cuLaunchKernelEx(self, cfg: Any, f: Any, params: int, extra: Any) -> tuple[Any, ...]:  # noqa: N802
        """Recorded as the cuLaunchKernel it is equivalent to (the runtime uses either), with the
        launch attributes it carried (``attrs``: (id, value) pairs, the first ``numAttrs``)."""
        self.ex_calls += 1
        r = self.cuLaunchKernel(f, cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX,
                                cfg.blockDimY, cfg.blockDimZ, cfg.sharedMemBytes, cfg.hStream,
                                params, extra)
        attrs = []
        for a in list(getattr(cfg, "attrs", []) or [])[: cfg.numAttrs]:
            attrs.append((CUlaunchAttributeID(int(a.id)).name, a.value.recorded()))
        assert len(attrs) == cfg.numAttrs, "numAttrs counts more attributes than the configuration holds"
        self.launches[-1]["attrs"] = attrs
        return r

    def cuFuncSetAttribute(self, f: Any, attr: Any, value: int) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuFuncSetAttribute", f, attr, value)
        self.func_attributes.append((f, attr, int(value)))
        return self._r("cuFuncSetAttribute")

    def cuLibraryGetGlobal(self, lib: Any, name: bytes) -> tuple[Any, ...]:  # noqa: N802
        g = self.globals.get(name.decode())
        return (CUresult.CUDA_SUCCESS, *g) if g else (CUresult.CUDA_ERROR_NOT_FOUND, None, None)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, n: int, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuMemcpyDtoDAsync", int(dst), int(src), n, s)
        if s in self.capturing:
            self.captured[s].append(dict(copy=(int(dst), int(src), n)))
        return (CUresult.CUDA_SUCCESS,)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, f: Any, block: int, smem: int) -> tuple[Any, ...]:  # noqa: N802
        self.occupancy_calls.append((f, block, smem))
        return (CUresult.CUDA_SUCCESS, self.occupancy)

    def cuModuleLoadData(self, image: bytes) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuModuleLoadData", len(image))
        return (CUresult.CUDA_SUCCESS, "HELPER_MODULE")

    def cuModuleGetFunction(self, mod: Any, name: bytes) -> tuple[Any, ...]:  # noqa: N802
        self.layouts["HELPER"] = [("threads", 0, 8), ("groups", 8, 8), ("block", 16, 4)]
        return (CUresult.CUDA_SUCCESS, "HELPER")

    # libraries (PTX text or a cubin: its kernels and their parameter layouts are the binary's)
    def cuLibraryLoadData(self, image: bytes, *rest: Any) -> tuple[Any, ...]:  # noqa: N802
        """Loads PTX or a cubin: its kernels, each with the parameter layout the binary gives
        (:func:`param_layouts`) unless the test set one before (a binary that disagrees)."""
        self._log("cuLibraryLoadData", len(image))
        if self.fail.get("cuLibraryLoadData"):
            return (self.fail["cuLibraryLoadData"], None)
        image = bytes(image)
        functions = read_binary(image).functions if is_elf(image) else scan_ptx(image.rstrip(b"\0")).functions
        lib = _Handle(0x11B000 + len(self.libraries))
        self.libraries[lib] = {name: f"FUNC:{name}" for name in functions}
        for name, layout in param_layouts(image).items():
            self.layouts.setdefault(f"FUNC:{name}", layout)
        return (CUresult.CUDA_SUCCESS, lib)

    def cuLibraryGetKernel(self, lib: Any, name: bytes) -> tuple[Any, ...]:  # noqa: N802
        fn = self.libraries[lib].get(name.decode())
        return (CUresult.CUDA_SUCCESS, fn) if fn else (CUresult.CUDA_ERROR_NOT_FOUND, None)

    def cuKernelGetFunction(self, kernel: Any) -> tuple[Any, ...]:  # noqa: N802
        return (CUresult.CUDA_SUCCESS, kernel)

    def cuFuncGetParamInfo(self, func: Any, i: int) -> tuple[Any, ...]:  # noqa: N802
        layout = self.layouts.get(func, [])
        if i >= len(layout):
            return (CUresult.CUDA_ERROR_INVALID_VALUE, None, None)
        return (CUresult.CUDA_SUCCESS, layout[i][1], layout[i][2])

    def cuLibraryUnload(self, lib: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuLibraryUnload", lib)
        return (CUresult.CUDA_SUCCESS,)

    # memory
    def cuMemAlloc(self, n: int) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuMemAlloc", n)
        return self._r("cuMemAlloc", _Handle(0xA110C000 + 0x10000 * next(self.alloc_ids)))

    def cuMemFree(self, p: Any) -> tuple[Any, ...]:  # noqa: N802
        self.freed.append(int(p))
        return (CUresult.CUDA_SUCCESS,)

    def cuMemcpyHtoDAsync(self, dst: int, src: int, n: int, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuMemcpyHtoDAsync", int(dst), n, s)
        self.memory[int(dst)] = ctypes.string_at(src, n)
        return self._r("cuMemcpyHtoDAsync")

    def cuMemsetD8Async(self, dst: int, value: int, n: int, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuMemsetD8Async", int(dst), n, s)
        self.memory[int(dst)] = bytes([value]) * n
        return (CUresult.CUDA_SUCCESS,)

    def cuMemHostAlloc(self, n: int, flags: int) -> tuple[Any, ...]:  # noqa: N802
        buf = ctypes.create_string_buffer(n)
        self.calls.append(("cuMemHostAlloc", n))
        self._keep = getattr(self, "_keep", []) + [buf]
        return (CUresult.CUDA_SUCCESS, ctypes.addressof(buf))

    def cuMemcpyDtoHAsync(self, dst: int, src: int, n: int, s: Any) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuMemcpyDtoHAsync", int(src), n, s)
        if int(src) in self.memory:
            data = self.memory[int(src)][:n]
            ctypes.memmove(dst, data, len(data))
        else:
            ctypes.c_uint32.from_address(dst).value = self.host_words.get(int(src), 0)
        return self._r("cuMemcpyDtoHAsync")

    def cuCtxSynchronize(self) -> tuple[Any, ...]:  # noqa: N802
        self._log("cuCtxSynchronize")
        return (CUresult.CUDA_SUCCESS,)


class _Handle(int):
    """A driver handle: an int, as cuda-bindings' handles convert to."""


def make_entry(name: str, params: tuple[Param, ...], block: int | tuple[int, int, int] = 128,
               indirect: bool = True, content: str = CONTENT, grid_dims: int = 1, **extra: Any) -> Entry:
    """An entry whose hash is the one its signature and ``content`` give (as a build makes it);
    ``extra``: other Entry fields (fixed_block, launch_bounds, indirect_reason, template, ...)."""
    bs: tuple[int, int, int] = (block, 1, 1) if isinstance(block, int) else (block[0], block[1], block[2])
    proto = Entry.model_construct(name=name, block_size=bs, params=params, grid_dims=grid_dims,
                                  fixed_block=extra.get("fixed_block", True),
                                  launch_bounds=extra.get("launch_bounds"), template=extra.get("template"),
                                  template_args=extra.get("template_args"), attributes=extra.get("attributes"))
    h = abi.entry_hash(content, proto.signature())
    return Entry(name=name, symbol=symbol_for(name, h), hash=h, block_size=bs, params=params,
                 indirect_symbol=abi.indirect_symbol_for(name, h) if indirect else None,
                 grid_dims=grid_dims, **extra)


def storage(name: str, et: str = "float32", size: int = 4, **kw: Any) -> Param:
    return Param(name=name, kind="storage", element_type=et, element_size=size, element_align=size,
                 shape=kw.pop("shape", "slice"), **kw)


def uniform(name: str, et: str = "Params", size: int = 8) -> Param:
    return Param(name=name, kind="uniform", element_type=et, element_size=size, element_align=4)


def scalar(name: str, et: str = "float32", size: int = 4) -> Param:
    return Param(name=name, kind="scalar", element_type=et, element_size=size, element_align=size)


def _reset_runtime() -> None:
    backends.reset()
    cuda_driver.reset_status()
    device._devices.clear()
    device._foreign.clear()
    device._torch_streams.clear()
    device._tls.__dict__.clear()
    uniform_cache._caches.clear()
    for d in (cuda_indirect._helpers, cuda_indirect._iplans, cuda_indirect._grids, cuda_indirect._scratch,
              cuda_indirect._helper_args):
        d.clear()
    cuda_indirect._tls.__dict__.clear()
    cuda_graphs._open.clear()
    capture_state._state.__dict__.pop("captures", None)
    for held in (scratch._pools, scratch._foreign):  # a stream handle of this test is another's in the next
        held.clear()
    scratch._retired.clear()
    # CUDA plans of earlier tests that the garbage collector has not freed yet would regenerate with
    # the hooks (a test that added a parameter kind to abi.KINDS leaves plans naming it); what other
    # backends watch (a WebGPU device's stream, which outlives a test) stays watched
    for plan in list(hooks._watched):
        if isinstance(plan, cuda_launch.LaunchPlan):
            hooks._watched.discard(plan)
    hooks.uninstall()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    """The fake driver as the CUDA backend's, with a fresh runtime state: device 0 (132 SMs,
    sm_90, driver CUDA 13.0) current in this thread, its owned stream made."""
    drv = FakeDriver()
    monkeypatch.setenv("KHAL_BACKEND", "cuda")
    monkeypatch.setattr(cuda_driver, "_driver", drv)
    _reset_runtime()
    device.Device(0).default_stream  # noqa: B018  (make the owned stream now: tests count calls)
    device.ensure_current(0)
    drv.calls.clear()
    yield drv
    _reset_runtime()


def stream(handle: int = 7, native: Any = "STREAM", device_id: int = 0) -> device.Stream:
    """A borrowed CUDA stream with a recognisable native handle."""
    return device.Stream(handle, device_id, native=native, backend=cuda_backend.BACKEND)


def write_package(root: Path, entries: list[Entry], *, crate: str = "c", package: str = "fakepkg",
                  language: str = "cuda", content: str = CONTENT, ptx: bytes | None = None,
                  globals: list[dict[str, Any]] | None = None) -> Path:
    """Write ``root/<package>/``: a manifest and one PTX artifact naming ``entries``' kernels
    (and their indirect variants), each with the ``.param`` declarations NVRTC gives its
    parameters (:func:`entry_params`). ``ptx`` / ``content``: a real build's PTX and content hash
    instead (its entries' launch facts are checked against that PTX at load). Returns the package
    directory."""
    pkg = root / package
    art_dir = pkg / "_khal" / crate
    art_dir.mkdir(parents=True, exist_ok=True)
    lines = [".version 9.0", ".target sm_90", ".address_size 64", ""]
    for e in entries:
        for sym in (e.symbol, e.indirect_symbol):
            if sym:
                lines.append(f".visible .entry {sym}(")
                lines.append(",\n".join(f"\t{d}" for d in entry_params(e, indirect=sym != e.symbol)))
                cluster = e.attributes.cluster_dims if e.attributes is not None else None
                if cluster:  # what __cluster_dims__ compiles to
                    lines.append(")\n.explicitcluster\n.reqnctapercluster {}, {}, {}".format(*cluster))
                    lines.append("{\n    ret;\n}")
                else:
                    lines.append(")\n{\n    ret;\n}")
    if ptx is None:
        ptx = ("\n".join(lines) + "\n").encode()
    # a real build's PTX (NVRTC 13.5: ISA 9.5) is declared ISA 9.0, which the fake driver (CUDA 13.0)
    # JITs; verify checks the manifest's ptx_isa against this line
    isa = "9.0"
    ptx = re.sub(rb"^(\s*)\.version\s+\d+\.\d+", rb"\g<1>.version 9.0", ptx, count=1, flags=re.M)
    rel = f"_khal/{crate}/{crate}.compute_90.ptx"
    (pkg / rel).write_bytes(ptx)
    manifest = {
        "schema_version": SCHEMA_VERSION, "package": package,
        "toolchain": {"hatch_khal_version": "test", "abi_version": abi.ABI_VERSION},
        "crates": [{
            "name": crate, "language": language, "package_dir": f"_khal/{crate}", "sources": [],
            "content_hash": content,
            "artifacts": [{"kind": "ptx", "arch": "compute_90", "path": rel, "ptx_isa": isa,
                           "sha256": hashlib.sha256(ptx).hexdigest(), "size": len(ptx)}],
            "entries": [e.model_dump(mode="json", exclude_none=True) for e in entries],
            **({"globals": globals} if globals else {}),
        }],
    }
    (pkg / "_khal" / "manifest.json").write_text(json.dumps(manifest))
    return pkg


def fake_kernels(drv: FakeDriver, root: Path, entries: list[Entry], *, crate: str = "c",
                 package: str = "fakepkg", language: str = "cuda", content: str = CONTENT,
                 ptx: bytes | None = None, globals: list[dict[str, Any]] | None = None) -> Any:
    """Write a package of PTX for ``entries`` (:func:`write_package`), register the parameter
    layouts its PTX declares with the fake driver (a test may change them before the first
    launch: the binary then disagrees with the manifest), and load it through ``khal_runtime.load``."""
    import khal_runtime

    pkg = write_package(root, entries, crate=crate, package=package, language=language, content=content, ptx=ptx,
                        globals=globals)
    for ptx in (pkg / "_khal" / crate).glob("*.ptx"):
        drv.layouts.update({f"FUNC:{name}": layout for name, layout in ptx_param_layouts(ptx.read_bytes()).items()})
    return khal_runtime.load(pkg)


__all__ = ["CONTENT", "C_TYPES", "CUresult", "CUstreamCaptureMode", "FakeDriver", "Layout", "cubin_param_layouts",
           "entry_params", "fake", "fake_kernels", "make_entry", "nvrtc_params", "param_layouts", "ptx_param_layouts",
           "scalar", "storage", "stream", "uniform", "write_package", "SimpleNamespace"]
