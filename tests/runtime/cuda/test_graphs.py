"""Graph capture and indirect dispatch on CPU, against the fake driver (tests/helpers/fakecuda.py).

What a real GPU must confirm is in tests/runtime/cuda/test_graphs_gpu.py and test_indirect_gpu.py; here:
the driver calls made (and not made), the capture guards and their messages, graph
rebinding, the persistent-grid launch of the indirect variant and its extra
parameter, the host-read path and its trace line.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from khal_runtime import graphs
from khal_runtime.arguments import diagnose_args
from khal_runtime.backends.cuda import driver as cuda_driver
from khal_runtime.backends.cuda import graphs as cuda_graphs
from khal_runtime.backends.cuda import indirect
from khal_runtime.backends.cuda.launch import LaunchPlan
from khal_runtime.backends.cuda.uniform_cache import UniformCache, Upload, cache_for
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.device import Device, Stream
from khal_runtime.errors import ArgumentError, CaptureError, CudaError, KhalError
from tests.helpers.fakecuda import (  # noqa: F401 - fixture
    CUresult,
    CUstreamCaptureMode,
    FakeDriver,
    fake,
    fake_kernels,
    make_entry,
    scalar,
    storage,
    uniform,
)


class Params(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


def _stream(fake: FakeDriver) -> Stream:
    return Device(0).default_stream


# ------------------------------------------------------------------------------ capture basics


def test_capture_begin_end_launch(fake: FakeDriver) -> None:
    st = _stream(fake)
    with st.capture(label="step") as cap:
        assert graphs.capturing() and graphs.current_capture() is cap
        assert st.is_capturing()
    g = cap.graph
    assert not graphs.capturing()
    assert fake.calls[0] == ("cuStreamBeginCapture", st.native,
                             CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    assert ("cuStreamEndCapture", st.native) in fake.calls
    g.upload()
    g.launch()
    g()
    assert fake.names().count("cuGraphLaunch") == 2 and "cuGraphUpload" in fake.names()
    assert g.node_count == 0 and g.label == "step"
    assert cache_for(0).pins == 1
    g.close()
    g.close()
    assert cache_for(0).pins == 0
    assert {"cuGraphExecDestroy", "cuGraphDestroy"} <= set(fake.names())
    with pytest.raises(CaptureError, match="closed"):
        g.launch()


def test_begin_end_capture_methods(fake: FakeDriver) -> None:
    st = _stream(fake)
    st.begin_capture()
    with pytest.raises(CaptureError, match="already capturing"):
        st.begin_capture()
    g = st.end_capture()
    assert isinstance(g, graphs.Graph)
    with pytest.raises(CaptureError, match="no capture is open"):
        st.end_capture()


@pytest.mark.parametrize("handle", [0, 1, 2])
def test_legacy_stream_refused_up_front(fake: FakeDriver, handle: int) -> None:
    legacy = Stream(handle, 0)
    with pytest.raises(CaptureError, match="legacy NULL stream"):
        legacy.begin_capture()
    assert "cuStreamBeginCapture" not in fake.names()
    assert not graphs.capturing()


def test_bad_mode(fake: FakeDriver) -> None:
    with pytest.raises(ValueError, match="thread_local"):
        _stream(fake).begin_capture(mode="sideways")


def test_exception_inside_capture_aborts(fake: FakeDriver) -> None:
    st = _stream(fake)
    with pytest.raises(RuntimeError, match="boom"):
        with st.capture():
            raise RuntimeError("boom")
    assert not graphs.capturing() and not st.is_capturing()
    assert "cuGraphDestroy" in fake.names() and "cuGraphInstantiate" not in fake.names()
    st.begin_capture()  # the stream is free again
    st.end_capture()


def test_end_capture_failure_is_a_capture_error(fake: FakeDriver) -> None:
    st = _stream(fake)
    st.begin_capture()
    fake.fail["cuStreamEndCapture"] = CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    with pytest.raises(CaptureError, match="CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.*KHAL_TRACE=1"):
        st.end_capture()
    assert not graphs.capturing()


def test_capture_driver_errors_become_capture_errors(fake: FakeDriver) -> None:
    with pytest.raises(CaptureError, match="not allowed while a stream captures") as ei:
        cuda_driver.check((CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,), "cuMemAlloc")
    assert ei.value.code == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"  # type: ignore[attr-defined]
    with pytest.raises(CudaError):
        cuda_driver.check((CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,), "cuMemcpy")


# ------------------------------------------------------------------------------ guards


def test_alloc_in_capture_raises_before_the_driver(fake: FakeDriver) -> None:
    DeviceBuffer.alloc(4, "float32")  # fine outside
    n = fake.names().count("cuMemAlloc")
    with _stream(fake).capture():
        with pytest.raises(CaptureError, match="allocate every buffer before begin_capture"):
            DeviceBuffer.alloc(16, "float32")
    assert fake.names().count("cuMemAlloc") == n


def test_alloc_trace(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    out = tmp_path / "trace.txt"
    monkeypatch.setenv("KHAL_CUDA_ALLOC_TRACE", "1")
    monkeypatch.setenv("KHAL_CUDA_TRACE_FILE", str(out))
    DeviceBuffer.alloc(10, "float32")
    with _stream(fake).capture():
        with pytest.raises(CaptureError):
            DeviceBuffer.alloc(3, "uint8")
    lines = out.read_text().splitlines()
    assert lines[0].startswith("khal: alloc 40 B on device 0 at ") and "test_graphs.py" in lines[0]
    assert lines[1].startswith("khal: alloc 3 B") and lines[1].endswith("INSIDE GRAPH CAPTURE")


def test_host_reads_and_syncs_in_capture_raise(fake: FakeDriver) -> None:
    from khal_runtime.device import Device

    buf = DeviceBuffer(0x1000, 4, "float32", 0)
    st = _stream(fake)
    with st.capture():
        with pytest.raises(CaptureError, match="to_numpy.*after graph.launch"):
            buf.to_numpy()
        with pytest.raises(CaptureError, match="Stream.synchronize"):
            st.synchronize()
        with pytest.raises(CaptureError, match="Device.synchronize"):
            Device(0).synchronize()
    assert not any(n in fake.names() for n in ("cuStreamSynchronize", "cuMemcpyDtoHAsync", "cuCtxSynchronize"))


def test_foreign_capture_is_seen_through_the_stream(fake: FakeDriver) -> None:
    """A capture begun by someone else (torch.cuda.graph) on the stream still guards to_numpy."""
    st = _stream(fake)
    fake.capturing[st.native] = 0
    with pytest.raises(CaptureError, match="to_numpy"):
        DeviceBuffer(0x1000, 4, "float32", 0).to_numpy(stream=st)


def test_uniform_upload_refused_in_capture_cached_one_fine(fake: FakeDriver) -> None:
    cache = UniformCache(0)
    st = _stream(fake)
    cache.entries[b"A" * 8] = Upload(0xD000, None, st.handle, None)
    with st.capture():
        assert cache.fetch(b"A" * 8, st) == 0xD000
        with pytest.raises(CaptureError, match="Launch once with the same uniform values before capture"):
            cache.fetch(b"B" * 8, st)
    assert "cuMemAlloc" not in fake.names()


def test_capture_settles_pending_uniform_uploads(fake: FakeDriver) -> None:
    cache = cache_for(0)
    st = _stream(fake)
    cache.entries[b"C" * 8] = Upload(0xD100, "EV_PENDING", st.handle, b"keep")
    with st.capture():
        pass
    assert ("cuEventSynchronize", "EV_PENDING") in fake.calls
    assert cache.entries[b"C" * 8].pending is None
    assert fake.calls.index(("cuEventSynchronize", "EV_PENDING")) < fake.names().index("cuStreamBeginCapture")


def test_pinned_uniform_cache_never_rewinds(fake: FakeDriver) -> None:
    cache = UniformCache(0)
    cache._slabs = ["S0"]
    cache._slab_index, cache._offset = 0, 512
    cache.pins = 1
    cache._flush()
    assert (cache._slab_index, cache._offset) == (0, 512) and not cache.entries
    cache.pins = 0
    cache._flush()
    assert (cache._slab_index, cache._offset) == (0, 0)


def test_relaxed_mode_only_while_capturing(fake: FakeDriver) -> None:
    with cuda_graphs.relaxed_capture_mode():
        pass
    assert "cuThreadExchangeStreamCaptureMode" not in fake.names()
    with _stream(fake).capture():
        with cuda_graphs.relaxed_capture_mode():
            assert fake.thread_mode == CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    assert fake.names().count("cuThreadExchangeStreamCaptureMode") == 2


# ------------------------------------------------------------------------------ launches + rebind


def _plan(fake: FakeDriver, name: str = "axpby", indirect_fn: str | None = "IFUNC") -> LaunchPlan:
    e = make_entry(name, (storage("x"), storage("y"), uniform("p"), scalar("bias")), block=256)
    plan = LaunchPlan(e, "core", 0, f"FUNC:{name}", cache_for(0), indirect_fn)
    fake.layouts[f"FUNC:{name}"] = plan.layout
    return plan


def test_capture_graph_and_rebind(fake: FakeDriver) -> None:
    plan = _plan(fake)
    st = _stream(fake)
    cache_for(0).entries[bytes(Params(1, 2))] = Upload(0xD200, None, st.handle, None)

    def step(x: DeviceBuffer, y: DeviceBuffer) -> None:
        plan.run(1, 1, 1, 256, 1, 1, 0, st, (x, y, Params(1, 2), 0.5))
        plan.run(2, 1, 1, 256, 1, 1, 0, st, (y, x, Params(1, 2), 0.5))

    a, b = DeviceBuffer(0x1000, 64, "float32", 0), DeviceBuffer(0x2000, 64, "float32", 0)
    g = graphs.capture_graph(step, a, b, stream=st)
    assert g.label == "step" and g.node_count == 2
    assert g._keep == ((a, b), {})
    first = [struct.unpack("<Q", r["slots"][0])[0] for r in fake.launches]
    assert first == [0x1000, 0x2000]
    c, d = DeviceBuffer(0x3000, 64, "float32", 0), DeviceBuffer(0x4000, 64, "float32", 0)
    assert g.rebind(c, d) is True
    assert g.updates == 1 and "cuGraphExecUpdate" in fake.names()
    assert [struct.unpack("<Q", r["slots"][0])[0] for r in fake.launches[2:]] == [0x3000, 0x4000]
    assert g._keep == ((c, d), {})
    # a topology change: cuGraphExecUpdate refuses, the graph is instantiated again
    fake.fail["cuGraphExecUpdate"] = CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
    assert g.update(lambda: plan.run(1, 1, 1, 256, 1, 1, 0, st, (a, b, Params(1, 2), 0.5))) is False
    assert g.reinstantiations == 1 and g.node_count == 1
    g.launch()
    assert fake.calls[-1][0] == "cuGraphLaunch"


def test_rebind_needs_capture_graph(fake: FakeDriver) -> None:
    with _stream(fake).capture() as cap:
        pass
    with pytest.raises(CaptureError, match="graph.update"):
        cap.graph.rebind()


def test_first_launch_may_load_inside_capture(fake: FakeDriver, tmp_path) -> None:
    """Loading a crate inside a capture goes through relaxed mode: a kernel's first launch may
    be captured."""
    e = make_entry("axpby", (storage("x"), storage("y"), uniform("p"), scalar("bias")), block=256)
    ks = fake_kernels(fake, tmp_path, [e])
    modes = []
    load = fake.cuLibraryLoadData

    def watching(image, *rest):  # type: ignore[no-untyped-def]
        modes.append(fake.thread_mode)
        return load(image, *rest)

    fake.cuLibraryLoadData = watching  # type: ignore[method-assign]
    st = _stream(fake)
    cache_for(0).entries[bytes(Params(1, 2))] = Upload(0xD200, None, st.handle, None)
    with st.capture():
        ks.axpby(64, DeviceBuffer(0x1000, 64, "float32", 0), DeviceBuffer(0x2000, 64, "float32", 0),
                 Params(1, 2), 0.5)
    assert modes == [CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED]
    assert fake.thread_mode != CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED


# ------------------------------------------------------------------------------ indirect dispatch


class _FakeKernel:
    def __init__(self, plan: LaunchPlan) -> None:
        self._plan = plan
        self.crate = plan.crate
        self.name = plan.entry.name
        self.block_size = tuple(plan.entry.block_size)
        self.direct: list[tuple] = []

    def plan(self, d: int) -> LaunchPlan:
        return self._plan

    def launch(self, grid, block, *args, stream=None, shared_mem=0):  # type: ignore[no-untyped-def]
        self.direct.append((grid, args))

    def check_args(self, *args):  # type: ignore[no-untyped-def]
        diagnose_args(self._plan.entry, args)

    dispatch_indirect = None  # not used: tests call indirect.dispatch_indirect


def _ind(k: _FakeKernel, count, *, grid=None, threads: bool = False, host_read=None) -> None:  # type: ignore[no-untyped-def]
    """The CUDA backend's indirect dispatch of ``k`` on the owned stream."""
    indirect.dispatch_indirect(k, k._plan, count, _kargs(), Device(0).default_stream, grid, threads, host_read)


def _kargs() -> tuple:
    return (DeviceBuffer(0x1000, 64, "float32", 0), DeviceBuffer(0x2000, 64, "float32", 0),
            DeviceBuffer(0xE000, 2, "float32", 0), 0.25)


def test_indirect_device_side_persistent_grid(fake: FakeDriver) -> None:
    plan = _plan(fake)
    k = _FakeKernel(plan)
    count = DeviceBuffer(0xC000, 1, "uint32", 0)
    ip = indirect._indirect_plan(k, plan)
    fake.layouts["IFUNC"] = ip.layout
    assert ip.layout[:-1] == plan.layout and ip.layout[-1][1:] == ((plan.args_size + 7) // 8 * 8, 8)
    _ind(k, count)
    (l,) = fake.launches
    assert l["f"] == "IFUNC" and l["grid"] == (132 * 8, 1, 1) and l["block"] == (256, 1, 1)
    assert struct.unpack("<Q", l["slots"][-1])[0] == 0xC000  # the trailing const uint32_t*
    assert struct.unpack("<Q", l["slots"][0])[0] == 0x1000
    assert "cuStreamSynchronize" not in fake.names() and "cuMemcpyDtoHAsync" not in fake.names()
    _ind(k, count, grid=7)
    assert fake.launches[-1]["grid"] == (7, 1, 1)


def test_indirect_blocks_per_sm_env(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(fake)
    monkeypatch.setenv("KHAL_CUDA_INDIRECT_BLOCKS_PER_SM", "3")
    assert indirect.persistent_grid(_FakeKernel(plan), plan) == 396
    indirect._grids.clear()
    monkeypatch.setenv("KHAL_CUDA_INDIRECT_BLOCKS_PER_SM", "zero")
    with pytest.raises(ValueError, match="KHAL_CUDA_INDIRECT_BLOCKS_PER_SM"):
        indirect.persistent_grid(_FakeKernel(plan), plan)


def test_indirect_thread_count_runs_the_helper_first(fake: FakeDriver) -> None:
    plan = _plan(fake)
    k = _FakeKernel(plan)
    fake.layouts["IFUNC"] = indirect._indirect_plan(k, plan).layout
    threads = DeviceBuffer(0xC100, 1, "uint32", 0)
    _ind(k, threads, threads=True)
    helper, main = fake.launches
    assert helper["f"] == "HELPER" and helper["grid"] == (1, 1, 1) and helper["block"] == (1, 1, 1)
    src, dst, block = (struct.unpack("<Q", helper["slots"][0])[0], struct.unpack("<Q", helper["slots"][1])[0],
                       struct.unpack("<I", helper["slots"][2])[0])
    assert src == 0xC100 and block == 256
    assert struct.unpack("<Q", main["slots"][-1])[0] == dst != src
    _ind(k, threads, threads=True)
    assert fake.names().count("cuModuleLoadData") == 1 and fake.names().count("cuMemAlloc") == 1


def test_indirect_count_checked(fake: FakeDriver) -> None:
    plan = _plan(fake)
    k = _FakeKernel(plan)
    with pytest.raises(ArgumentError, match="uint32"):
        _ind(k, DeviceBuffer(0xC000, 1, "float32", 0))
    with pytest.raises(ArgumentError, match="host memory"):
        _ind(k, np.zeros(1, np.uint32))
    with pytest.raises(ValueError, match="empty"):
        _ind(k, DeviceBuffer(0xC000, 0, "uint32", 0))
    assert not fake.launches


def test_indirect_without_variant_says_what_to_do(fake: FakeDriver) -> None:
    plan = _plan(fake, "old", indirect_fn=None)
    with pytest.raises(KhalError, match="host_read=True"):
        _ind(_FakeKernel(plan), DeviceBuffer(0xC000, 1, "uint32", 0))


@pytest.mark.parametrize("value,threads,grid", [(5, False, 5), (600, True, 3), (512, True, 2), (0, False, None)])
def test_indirect_host_read(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch, tmp_path, capsys,
                            value: int, threads: bool, grid: int | None) -> None:
    plan = _plan(fake)
    k = _FakeKernel(plan)
    fake.host_words[0xC000] = value
    monkeypatch.setenv("KHAL_CUDA_INDIRECT_SYNC", "1")
    monkeypatch.setenv("KHAL_TRACE_INDIRECT", "1")
    monkeypatch.delenv("KHAL_CUDA_TRACE_FILE", raising=False)
    _ind(k, DeviceBuffer(0xC000, 1, "uint32", 0), threads=threads)
    assert "cuStreamSynchronize" in fake.names() and "cuMemcpyDtoHAsync" in fake.names()
    assert [g for g, _ in k.direct] == ([grid] if grid else [])
    err = capsys.readouterr().err
    unit = "threads" if threads else "groups"
    assert f"khal: indirect core.axpby host read count={value} {unit} -> " in err
    assert ("nothing launched" in err) if not grid else (f"grid={grid}" in err)


def test_indirect_host_read_refused_in_capture(fake: FakeDriver) -> None:
    plan = _plan(fake)
    with _stream(fake).capture():
        with pytest.raises(CaptureError, match="host_read=False"):
            _ind(_FakeKernel(plan), DeviceBuffer(0xC000, 1, "uint32", 0), host_read=True)
    assert "cuMemcpyDtoHAsync" not in fake.names()


def test_indirect_device_side_is_capturable(fake: FakeDriver) -> None:
    plan = _plan(fake)
    k = _FakeKernel(plan)
    fake.layouts["IFUNC"] = indirect._indirect_plan(k, plan).layout
    st = _stream(fake)
    with st.capture() as cap:
        _ind(k, DeviceBuffer(0xC100, 1, "uint32", 0), threads=True)
    assert cap.graph.node_count == 2  # helper + persistent kernel, no host read


@pytest.mark.needs_cuda_bindings
def test_helper_ptx_compiles_with_nvjitlink() -> None:
    nvjitlink = pytest.importorskip("cuda.bindings.nvjitlink")
    try:
        h = nvjitlink.create(2, ["-arch=sm_90", "-O3"])
    except Exception as exc:  # libnvJitLink not installed
        pytest.skip(f"nvJitLink unavailable: {exc}")
    try:
        data = indirect.HELPER_PTX
        nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "helper.ptx")
        nvjitlink.complete(h)
        assert nvjitlink.get_linked_cubin_size(h) > 0
    finally:
        nvjitlink.destroy(h)


def test_alloc_trace_off_values_are_off(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    out = tmp_path / "trace.txt"
    monkeypatch.setenv("KHAL_CUDA_TRACE_FILE", str(out))
    for off in ("0", "off", "false", ""):
        monkeypatch.setenv("KHAL_CUDA_ALLOC_TRACE", off)
        DeviceBuffer.alloc(10, "float32")
    assert not out.exists() or out.read_text() == ""
