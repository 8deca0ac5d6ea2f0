"""The WebGPU backend end to end, on whatever adapter there is (lavapipe on CPU machines)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from khal_runtime.errors import ArgumentError, ArgumentValueError, CaptureError, KhalError
from tests.runtime.webgpu import _kernels as K

pytestmark = pytest.mark.webgpu

_plans: dict[str, Any] = {}


def plan(name: str, wdev: Any) -> Any:
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    p = _plans.get(name)
    if p is None:
        e, src = getattr(K, name)()
        p = _plans[name] = KernelPlan(e, wdev, src.encode(), "tests")
    return p


def arr(a: Any, wdev: Any) -> Any:
    from khal_runtime.backends.webgpu.arrays import WgpuArray

    return WgpuArray.from_numpy(np.asarray(a), device=wdev)


# ---------------------------------------------------------------------------------------------
# device, memory
# ---------------------------------------------------------------------------------------------
def test_status_names_the_adapter(wdev: Any) -> None:
    from khal_runtime.backends.webgpu.device import get_device, status

    st = status()
    assert st.usable and st.adapter is not None
    assert st.adapter.backend_type and st.adapter.adapter_type
    assert get_device(0) is wdev
    assert wdev.max_groups >= 65535 and wdev.storage_align >= 4
    with pytest.raises(ValueError, match="adapter"):
        get_device(99)


def test_limits_raised_to_the_adapter(wdev: Any) -> None:
    alim = wdev.adapter.limits
    for k in ("max-compute-workgroups-per-dimension", "max-storage-buffer-binding-size",
              "max-buffer-size", "max-storage-buffers-per-shader-stage"):
        assert wdev.limits[k] == alim[k], k
    if "immediates" in wdev.adapter.features:
        assert wdev.has_immediates and wdev.max_immediate_size > 0


def test_roundtrip_slices_zero_copy(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.arrays import WgpuArray

    a = np.arange(100, dtype=np.float32)
    x = arr(a, wdev)
    np.testing.assert_array_equal(x.to_numpy(), a)
    np.testing.assert_array_equal(x[10:20].to_numpy(), a[10:20])
    x[8:16].copy_from_numpy(np.full(8, -1, np.float32))
    b = a.copy()
    b[8:16] = -1
    np.testing.assert_array_equal(x.to_numpy(), b)
    z = WgpuArray.zeros(7, "float32", device=wdev)
    np.testing.assert_array_equal(z.to_numpy(), np.zeros(7, np.float32))
    y = arr(np.ones(100, np.float32), wdev)
    y.fill_zero()
    y[0:50].copy_from(x[0:50])
    np.testing.assert_array_equal(y.to_numpy(), np.concatenate([b[:50], np.zeros(50, np.float32)]))
    u8 = arr(np.arange(7, dtype=np.uint8), wdev)  # not a multiple of 4 bytes: padded words
    u8[3:5].copy_from_numpy(np.array([200, 201], np.uint8))
    np.testing.assert_array_equal(u8.to_numpy(), [0, 1, 2, 200, 201, 5, 6])
    np.testing.assert_array_equal(u8[1:6].to_numpy(), [1, 2, 200, 201, 5])
    assert len(WgpuArray.alloc(0, device=wdev).to_numpy()) == 0


def test_copy_within_one_buffer(wdev: Any, stream: Any) -> None:
    x = arr(np.arange(16, dtype=np.float32), wdev)
    x[8:16].copy_from(x[0:8])
    np.testing.assert_array_equal(x.to_numpy(), np.tile(np.arange(8, dtype=np.float32), 2))


# ---------------------------------------------------------------------------------------------
# storage bindings, uniforms, scalars
# ---------------------------------------------------------------------------------------------
def test_exact_ranges_arraylength_sees_the_count(wdev: Any, stream: Any) -> None:
    k = plan("lengths", wdev)
    step = wdev.storage_align // 4  # float32 elements per alignment step
    out = arr(np.zeros(5, np.uint32), wdev)
    a = arr(np.arange(4 * step + 10, dtype=np.float32), wdev)
    b = arr(np.zeros(4 * step + 10, np.float32), wdev)
    k.call(64 * 8, (out, a[step:step + 13], b[2 * step:2 * step + 7]))
    np.testing.assert_array_equal(out.to_numpy()[:3], [5, 13, 7])
    got = b.to_numpy()
    np.testing.assert_array_equal(got[2 * step:2 * step + 7], np.arange(step, step + 7) + 100)
    got[2 * step:2 * step + 7] = 0
    assert not got.any(), "a write landed outside the bound range"


def test_uniform_struct_from_ctypes_bytes_numpy_and_dict(wdev: Any, stream: Any) -> None:
    from tests.runtime.webgpu.test_packing import VALUES, _ctypes_value

    k = plan("params_struct", wdev)
    want = np.array([1.5, -7, 1, 2, 3, 4, 5, 6, 7, 42, 8, 9], np.float32)
    rec = np.zeros((), dtype=K.params_dtype())
    for f, v in VALUES.items():
        rec[f] = v
    c = _ctypes_value()
    for value in (c, bytes(c), rec, rec[()], VALUES):
        out = arr(np.zeros(12, np.float32), wdev)
        k.call(1, (out, value))
        np.testing.assert_array_equal(out.to_numpy(), want, err_msg=type(value).__name__)


class _FirstWrite:
    """A stand-in for the device's queue: its first ``write_buffer`` runs ``action`` first (which
    may raise, as wgpu-py reporting an earlier error does, or flush, as a finalizer does); every
    other call goes to the real queue."""

    def __init__(self, real: Any, action: Any) -> None:
        self.real, self.action, self.done = real, action, False

    def write_buffer(self, *a: Any) -> Any:
        if not self.done:
            self.done = True
            self.action()
        return self.real.write_buffer(*a)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_uniform_write_that_raises_is_written_at_the_next_submit(wdev: Any, stream: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """wgpu-py reports an earlier error of the device at its next call, which can be the uniform
    pool's ``write_buffer`` before a submit: the region must still reach the GPU at the next submit
    (the pool dropped the slab from its dirty list before writing it, and every later region of
    that slab read as zeros for the rest of the process)."""
    from khal_runtime.errors import WebGpuError

    k = plan("params_struct", wdev)
    want = np.array([1.5, -7, 1, 2, 3, 4, 5, 6, 7, 42, 8, 9], np.float32)
    from tests.runtime.webgpu.test_packing import _ctypes_value

    real = wdev.queue

    def fail() -> None:
        raise RuntimeError("an earlier validation error")

    c = _ctypes_value()
    c.n = 4242  # bytes no earlier test uploaded
    want[9] = 4242
    out = arr(np.zeros(12, np.float32), wdev)
    monkeypatch.setattr(wdev, "queue", _FirstWrite(real, fail))
    k.call(1, (out, c))
    with pytest.raises(WebGpuError, match="writing uniforms"):
        stream.flush()
    monkeypatch.setattr(wdev, "queue", real)
    k.call(1, (out, c))  # the same bytes: the region already made
    np.testing.assert_array_equal(out.to_numpy(), want)


def test_a_flush_inside_the_uniform_write_still_writes_before_it_submits(wdev: Any, stream: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A finalizer that the garbage collector runs inside the pool's ``write_buffer`` can flush the
    stream (freeing memory does): that nested submit must not run the dispatch before its uniform is
    written (it read zeros, in one CI run out of the suite's order)."""
    from tests.runtime.webgpu.test_packing import _ctypes_value

    k = plan("params_struct", wdev)
    want = np.array([1.5, -7, 1, 2, 3, 4, 5, 6, 7, 4343, 8, 9], np.float32)
    real = wdev.queue
    # what a finalizer freeing a buffer does inside the write, before the write lands
    queue = _FirstWrite(real, stream.flush)
    c = _ctypes_value()
    c.n = 4343  # bytes no earlier test uploaded
    out = arr(np.zeros(12, np.float32), wdev)
    monkeypatch.setattr(wdev, "queue", queue)
    k.call(1, (out, c))
    got = out.to_numpy()
    monkeypatch.setattr(wdev, "queue", real)
    assert queue.done
    np.testing.assert_array_equal(got, want)


def test_scalars_in_a_uniform_block(wdev: Any, stream: Any) -> None:
    k = plan("saxpy", wdev)
    x = arr(np.arange(300, dtype=np.float32), wdev)
    y = arr(np.ones(300, np.float32), wdev)
    k.call(300, (y, x, 2.0, 250))  # n=250: the kernel stops there
    want = np.ones(300, np.float32)
    want[:250] += 2 * np.arange(250, dtype=np.float32)
    np.testing.assert_array_equal(y.to_numpy(), want)


def test_scalars_in_push_constants(wdev: Any, stream: Any) -> None:
    if not wdev.has_immediates:
        pytest.skip(f"{wdev.describe()} has no 'immediates' feature (push constants)")
    k = plan("saxpy_push", wdev)
    assert k.pipeline.immediate_size == 8
    x = arr(np.arange(300, dtype=np.float32), wdev)
    y = arr(np.ones(300, np.float32), wdev)
    k.call(300, (y, x, 3.0, 299))
    k.call(300, (y, x, -1.0, 10))  # other push constants in the same pass
    want = np.ones(300, np.float32)
    want[:299] += 3 * np.arange(299, dtype=np.float32)
    want[:10] -= np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(y.to_numpy(), want)


def test_same_uniform_bytes_reuse_region_and_bind_group(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.uniform_pool import uniform_pool

    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    pool = uniform_pool(wdev)
    k.call(64, (y, x, 1.25, 64))
    up, made = pool.uploads, k.launcher.groups_cache.created
    for _ in range(10):
        k.call(64, (y, x, 1.25, 64))
        k._call_slow(64, (y, x, 1.25, 64))  # the full path too, not only the memo
    assert pool.uploads == up and k.launcher.groups_cache.created == made
    np.testing.assert_array_equal(y.to_numpy(), np.full(64, 21 * 1.25, np.float32))


def test_ordering_upload_dispatch_upload_dispatch(wdev: Any, stream: Any) -> None:
    k = plan("saxpy", wdev)
    x, y = arr(np.ones(128, np.float32), wdev), arr(np.zeros(128, np.float32), wdev)
    k.call(128, (y, x, 1.0, 128))
    x.copy_from_numpy(np.full(128, 2, np.float32))   # must not overtake the dispatch before it
    k.call(128, (y, x, 1.0, 128))
    x.copy_from_numpy(np.full(128, 4, np.float32))
    k.call(128, (y, x, 1.0, 128))
    y[0:64].fill_zero()                                # a clear in the command stream, in order
    k.call(128, (y, x, 1.0, 128))
    np.testing.assert_array_equal(y.to_numpy(), np.r_[np.full(64, 4.0), np.full(64, 11.0)].astype(np.float32))


def test_batching_1000_dispatches_one_submit(wdev: Any, stream: Any) -> None:
    import gc

    k = plan("saxpy", wdev)
    stream.batch = 1000
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    # earlier tests' arrays freed by a collection during the loop would flush (freeing memory does):
    # collected first, and no collection while the batch fills
    gc.collect()
    stream.flush()
    gc.disable()
    try:
        s0 = stream.submits
        for _ in range(999):
            k.call(64, (y, x, 1.0, 64))
        assert stream.submits == s0 and stream.pending == 999
        k.call(64, (y, x, 1.0, 64))
        assert stream.submits == s0 + 1 and stream.pending == 0
    finally:
        gc.enable()
    np.testing.assert_array_equal(y.to_numpy(), np.full(64, 1000, np.float32))


def test_bind_launches_like_the_call(wdev: Any, stream: Any) -> None:
    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    b = k.bind((y, x, 0.5, 64))
    for _ in range(8):
        b(64)
    b.launch((1, 1, 1))
    np.testing.assert_array_equal(y.to_numpy(), np.full(64, 4.5, np.float32))
    y.free()
    with pytest.raises(ArgumentValueError, match=r"argument 'y'.*freed"):
        b(64)


# ---------------------------------------------------------------------------------------------
# indirect
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("threads", [False, True])
def test_indirect_counts(wdev: Any, stream: Any, threads: bool) -> None:
    k = plan("hits", wdev)
    G = k.block[0]
    h = arr(np.zeros(64 * (G + 2), np.uint32), wdev)
    count = arr(np.zeros(1, np.uint32), wdev)
    for c in (0, 1, G - 1, G, G + 1):
        h.fill_zero()
        count.copy_from_numpy(np.array([c], np.uint32))
        k.dispatch_indirect(count, (h,), threads=threads)
        groups = -(-c // G) if threads else c
        got = h.to_numpy()
        assert got.max(initial=0) <= 1, "a group ran twice"
        assert int(got.sum()) == min(groups * G, h.size), (c, threads)
        assert got[:groups * G].all()


@pytest.mark.parametrize("threads", [False, True])
def test_indirect_counts_above_the_limit_are_clamped_on_the_device(wdev: Any, stream: Any,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   threads: bool) -> None:
    """The conversion kernel clamps the group count to the device's limit (WebGPU would drop the
    whole dispatch): with the limit lowered to 3 groups, 10 groups (or 1000 threads, 16 groups)
    run as 3."""
    k = plan("hits", wdev)
    G = k.block[0]
    monkeypatch.setattr(wdev, "max_groups", 3)
    h = arr(np.zeros(G * 20, np.uint32), wdev)
    count = arr(np.array([1000 if threads else 10], np.uint32), wdev)
    k.dispatch_indirect(count, (h,), threads=threads)
    got = h.to_numpy()
    assert int(got.sum()) == 3 * G and got[:3 * G].all() and got.max() == 1


def test_an_indirect_count_over_the_real_limit_still_runs(wdev: Any, stream: Any) -> None:
    """One group over the adapter's max_compute_workgroups_per_dimension: clamped, it runs (the
    first groups write; unclamped, WebGPU drops the dispatch and nothing is written)."""
    k = plan("hits", wdev)
    G = k.block[0]
    h = arr(np.zeros(G * 2, np.uint32), wdev)
    count = arr(np.array([wdev.max_groups + 1], np.uint32), wdev)
    k.dispatch_indirect(count, (h,))
    np.testing.assert_array_equal(h.to_numpy(), 1)


def test_indirect_count_written_by_a_kernel(wdev: Any, stream: Any) -> None:
    # the count comes from device work recorded just before, in the same pass
    k, s = plan("hits", wdev), plan("saxpy", wdev)
    fcount = arr(np.zeros(1, np.float32), wdev)
    s.call(1, (fcount, arr(np.ones(1, np.float32), wdev), 3.0, 1))  # fcount = 3.0
    count = arr(np.array([3], np.uint32), wdev)
    h = arr(np.zeros(64 * 4, np.uint32), wdev)
    k.dispatch_indirect(count, (h,))
    assert int(h.to_numpy().sum()) == 3 * 64


def test_indirect_count_errors(wdev: Any, stream: Any) -> None:
    k = plan("hits", wdev)
    h = arr(np.zeros(64, np.uint32), wdev)
    with pytest.raises(ArgumentError, match="count must be a device array of uint32, got float32"):
        k.dispatch_indirect(arr(np.zeros(1, np.float32), wdev), (h,))
    with pytest.raises(ArgumentError, match="host memory"):
        k.dispatch_indirect(np.zeros(1, np.uint32), (h,))


# ---------------------------------------------------------------------------------------------
# recordings
# ---------------------------------------------------------------------------------------------
def test_recording_replay_and_rebind(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.recording import capture, capture_recording

    k, hk = plan("saxpy", wdev), plan("hits", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    count = arr(np.array([1], np.uint32), wdev)
    h = arr(np.zeros(64, np.uint32), wdev)

    def step(y: Any, x: Any) -> None:
        k.call(64, (y, x, 2.0, 64))
        k.call(64, (y, x, 0.5, 64))   # new scalar bytes inside the capture: allowed on WebGPU
        hk.dispatch_indirect(count, (h,))

    s0 = stream.submits
    rec = capture_recording(step, y, x, device=wdev)
    assert stream.submits == s0 and rec.dispatch_count == 4  # 2 + the conversion + the indirect one
    np.testing.assert_array_equal(y.to_numpy(), np.zeros(64, np.float32))  # nothing ran
    s1 = stream.submits
    for _ in range(3):
        rec.launch()
    assert stream.submits == s1 + 3
    np.testing.assert_array_equal(y.to_numpy(), np.full(64, 7.5, np.float32))
    np.testing.assert_array_equal(h.to_numpy(), np.full(64, 3, np.uint32))
    y2 = arr(np.full(64, 100, np.float32), wdev)
    rec.rebind(y2, x)
    rec.launch()
    np.testing.assert_array_equal(y2.to_numpy(), np.full(64, 102.5, np.float32))
    np.testing.assert_array_equal(y.to_numpy(), np.full(64, 7.5, np.float32))
    with capture(wdev) as cap:
        y.fill_zero()
        k.call(64, (y, x, 1.0, 64))
    cap.recording.launch()
    np.testing.assert_array_equal(y.to_numpy(), np.ones(64, np.float32))
    y2.free()
    with pytest.raises(CaptureError, match="was freed"):
        rec.launch()


def test_a_devices_first_indirect_dispatch_may_be_captured(wdev: Any, stream: Any) -> None:
    """The indirect helper's scratch buffer is made on the device's first indirect dispatch: inside a
    capture that was refused as "a device allocation" the user never made (the replay test failed
    whenever it ran before any other indirect dispatch)."""
    from khal_runtime.backends.webgpu.recording import capture_recording

    hk = plan("hits", wdev)
    count = arr(np.array([1], np.uint32), wdev)
    h = arr(np.zeros(64, np.uint32), wdev)
    wdev.caches.pop("indirect", None)  # as on a device that has made no indirect dispatch yet
    rec = capture_recording(lambda h: hk.dispatch_indirect(count, (h,)), h, device=wdev)
    rec.launch()
    rec.launch()
    np.testing.assert_array_equal(h.to_numpy(), np.full(64, 2, np.uint32))


def test_capture_refuses_host_work(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.arrays import WgpuArray
    from khal_runtime.backends.webgpu.recording import capture

    x = arr(np.ones(4, np.float32), wdev)
    for what, fn in (("allocation", lambda: WgpuArray.alloc(4, device=wdev)),
                     ("host read", lambda: x.to_numpy()),
                     ("synchronisation", lambda: wdev.stream.synchronize()),
                     ("host upload", lambda: x.copy_from_numpy(np.zeros(4, np.float32)))):
        with capture(wdev, label="t") as cap:
            with pytest.raises(CaptureError, match=f"{what}.*during WebGPU capture \\('t'"):
                fn()
        assert cap.recording is not None and cap.recording.dispatch_count == 0


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
def test_unaligned_slice_is_a_named_error(wdev: Any, stream: Any) -> None:
    from khal_runtime.errors import UnalignedViewError

    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    with pytest.raises(UnalignedViewError, match=(
            rf"saxpy\(\): argument 'x' \(storage float32\): a slice starting at byte 4 .*multiples of "
            rf"{wdev.storage_align} bytes \(min_storage_buffer_offset_alignment\).*"
            rf"multiple of {wdev.storage_align // 4} element")):
        k.call(8, (y[0:8], x[1:9], 1.0, 8))
    assert isinstance(UnalignedViewError("x"), ArgumentValueError)
    with pytest.raises(ArgumentValueError, match="argument 'x'.*empty"):
        k.call(8, (y, x[0:0], 1.0, 8))


def test_argument_errors(wdev: Any, stream: Any) -> None:
    k, p = plan("saxpy", wdev), plan("params_struct", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    with pytest.raises(ArgumentError, match=r"saxpy\(\) takes 4 argument\(s\) \(y, x, a, n\)"):
        k.call(64, (y, x, 1.0))
    with pytest.raises(ArgumentError,
                       match=r"argument 'x' \(storage float32\): expected element type float32.*got int32"):
        k.call(64, (y, arr(np.ones(64, np.int32), wdev), 1.0, 64))
    with pytest.raises(ArgumentError, match="argument 'x'.*host memory"):
        k.call(64, (y, np.ones(64, np.float32), 1.0, 64))
    with pytest.raises(ArgumentValueError, match=r"argument 'n' \(scalar uint32\): -1 is out of range"):
        k.call(64, (y, x, 1.0, -1))
    with pytest.raises(ArgumentValueError, match=r"read_params\(\): argument 'p'.*expected 64 bytes"):
        p.call(1, (y, b"\0" * 60))
    with pytest.raises(ArgumentError, match=r"argument 'p'.*missing field\(s\) 'b'"):
        p.call(1, (y, {"a": 1.0}))
    with pytest.raises(ArgumentError, match=r"argument 'p'.*unknown field\(s\) 'q'"):
        p.call(1, (y, {"a": 1.0, "b": 1, "v": [0] * 4, "w": [0] * 3, "n": 1, "c": [0, 0], "q": 0}))
    with pytest.raises(ArgumentValueError, match="block .* differs"):
        k.launch(1, 32, (y, x, 1.0, 64))
    with pytest.raises(ArgumentError, match="thread count"):
        k.call(1.5, (y, x, 1.0, 64))
    k.call(0, (y, x, 1.0, 64))  # checks only
    with pytest.raises(ArgumentValueError):
        k.call(0, (y, x, 1.0, -5))


def test_group_limit(wdev: Any, stream: Any) -> None:
    from khal_runtime.errors import GroupLimitError

    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    lim = wdev.max_groups
    with pytest.raises(GroupLimitError, match=rf"saxpy: {lim + 1}x1x1 workgroups exceed the limit of {lim} "
                       rf"per dimension of WebGPU device 0: .*max_compute_workgroups_per_dimension"):
        k.call(64 * (lim + 1), (y, x, 1.0, 64))
    with pytest.raises(GroupLimitError):
        k.launch((1, lim + 1), None, (y, x, 1.0, 64))
    assert stream.pending == 0  # nothing was recorded: the batch is intact


def test_pipeline_error_names_the_entry(wdev: Any) -> None:
    from khal_runtime.errors import PipelineCreationError
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    from khal_runtime.manifest import Binding

    e = K.entry("broken", 64, (K.storage("h", "uint32", writable=True),),
                (Binding(param="h", group=0, binding=0, access="read_write"),))
    src = K.hits()[1].replace(K.hits()[0].symbol, e.symbol).replace("h[g.x] + 1u", "h[g.x] + 1.0")
    with pytest.raises(PipelineCreationError, match=r"entry tests\.broken \(wgsl, k/broken\.wgsl\): WebGPU "
                       r"could not create its pipeline on WebGPU device 0"):
        KernelPlan(e, wdev, src.encode(), "tests")
    wrong = src.replace(e.symbol, "other_name")  # the entry point is not in the shader
    e3 = K.entry("broken2", 64, e.params, e.webgpu[0].bindings)  # type: ignore[index]
    with pytest.raises(PipelineCreationError, match=r"entry tests\.broken2"):
        KernelPlan(e3, wdev, wrong.replace("1.0", "1u").encode(), "tests")


def test_profiling_table(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.profiling import disable_profiling, enable_profiling

    if not wdev.has_timestamps:
        pytest.skip(f"{wdev.describe()} has no timestamp-query")
    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    t = enable_profiling(wdev)
    try:
        for _ in range(5):
            k.call(64, (y, x, 1.0, 64))
        np.testing.assert_array_equal(y.to_numpy(), np.full(64, 5, np.float32))
        stats = t.stats()
        assert stats["tests.saxpy"]["count"] == 5 and stats["tests.saxpy"]["total_ms"] >= 0
        assert "tests.saxpy" in t.table()
    finally:
        disable_profiling(wdev)


def test_no_wgpu_import_and_missing_wgpu_message() -> None:
    code = (
        "import sys\n"
        "import khal_runtime.backends.webgpu as w\n"
        "from khal_runtime.backends.webgpu import kernel, recording, profiling, indirect, backend\n"
        "from khal_runtime import packing\n"
        "assert 'wgpu' not in sys.modules, 'importing the backend imported wgpu'\n"
        "sys.modules['wgpu'] = None\n"
        "from khal_runtime.backends.webgpu.device import status, get_device\n"
        "st = status(); assert not st.usable; print(st.reason)\n"
        "from khal_runtime.errors import BackendUnavailableError\n"
        "try:\n    get_device(0)\nexcept BackendUnavailableError as e:\n    print('raised', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install khal-runtime[webgpu] (or pip install wgpu)" in out.stdout
    assert "raised the WebGPU backend needs wgpu-py" in out.stdout


def test_adapter_env_matching_nothing() -> None:
    import os

    code = ("from khal_runtime.backends.webgpu.device import status\n"
            "st = status(); print(st.usable, st.reason)\n")
    env = dict(os.environ, KHAL_WEBGPU_ADAPTER="no-such-gpu-xyz")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False KHAL_WEBGPU_ADAPTER='no-such-gpu-xyz' matches none")


def test_errors_are_khal_errors() -> None:
    from khal_runtime import errors

    for cls in (errors.WebGpuError, errors.PipelineCreationError, errors.GroupLimitError,
                errors.UnalignedViewError):
        assert issubclass(cls, KhalError)


def test_the_errors_old_module_still_imports() -> None:
    """In 0.2.0 the backend's errors had a module of their own; imports of it keep working."""
    import khal_runtime.backends.webgpu.errors as old
    from khal_runtime.backends.webgpu.errors import WebGpuError

    import khal_runtime.errors

    assert old is khal_runtime.errors and WebGpuError is khal_runtime.errors.WebGpuError


# ---------------------------------------------------------------------------------------------
# more layouts, failures, threads, lifetimes
# ---------------------------------------------------------------------------------------------
def test_several_bind_groups_and_a_gap(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.kernel import KernelPlan
    from khal_runtime.manifest import Binding

    e = K.entry("two_groups", 64, (K.storage("y", writable=True), K.storage("x"), K.scalar("a", "float32")),
                (Binding(param="y", group=1, binding=0, access="read_write"),
                 Binding(param="x", group=2, binding=3, access="read"),
                 Binding(param=None, group=2, binding=0, access="uniform")),
                "uniform", 4, (K.ScalarSlot(param="a", offset=0, size=4),))
    src = f"""
struct S {{ a: f32 }}
@group(2) @binding(0) var<uniform> s: S;
@group(1) @binding(0) var<storage, read_write> y: array<f32>;
@group(2) @binding(3) var<storage, read> x: array<f32>;
@compute @workgroup_size(64) fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    if (g.x < arrayLength(&y)) {{ y[g.x] = y[g.x] + s.a * x[g.x]; }}
}}"""
    k = KernelPlan(e, wdev, src, "tests")
    assert [g.group for g in k.pipeline.groups] == [0, 1, 2] and not k.pipeline.groups[0].bindings
    x, y = arr(np.arange(64, dtype=np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    k.call(64, (y, x, 2.0))
    k.call(64, (y, x, 1.0))
    np.testing.assert_array_equal(y.to_numpy(), 3 * np.arange(64, dtype=np.float32))


def test_a_rejected_dispatch_is_named_and_the_rest_of_its_batch_runs(wdev: Any, stream: Any) -> None:
    from khal_runtime.errors import WebGpuError
    from khal_runtime.backends.webgpu.kernel import KernelPlan
    from khal_runtime.manifest import Binding, StructField, StructLayout

    # the manifest says 16 bytes, the shader reads 64: WebGPU rejects the dispatch at submit
    small = StructLayout(size=16, fields=(StructField(name="a", type="float32", offset=0, size=4),))
    p = K.Param(name="p", kind="uniform", element_type="Big", element_size=16, element_align=4,
                layouts={"cuda": small, "wgsl": small})
    e = K.entry("lying_layout", 1, (K.storage("out", writable=True), p),
                (Binding(param="out", group=0, binding=0, access="read_write"),
                 Binding(param="p", group=0, binding=1, access="uniform")))
    src = f"""
struct Big {{ a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32> }}
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Big;
@compute @workgroup_size(1) fn {e.symbol}() {{ out[0] = p.d.x; }}"""
    k, good = KernelPlan(e, wdev, src, "tests"), plan("saxpy", wdev)
    out = arr(np.zeros(4, np.float32), wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    good.call(64, (y, x, 1.0, 64))
    k.call(1, (out, {"a": 1.0}))
    out.fill_zero()  # a clear after it: in the batch too, and replayed in order
    good.call(64, (y, x, 1.0, 64))
    with pytest.raises(WebGpuError, match=r"WebGPU rejected 1 dispatch\(es\) of tests.lying_layout .*Those did not "
                       r"run; the other 3 command\(s\) of their batch ran, in order"):
        stream.flush()
    # only the invalid dispatch was lost: both saxpy launches around it ran
    np.testing.assert_array_equal(y.to_numpy(), 2 * np.ones(64, np.float32))
    good.call(64, (y, x, 1.0, 64))  # and the stream works again
    np.testing.assert_array_equal(y.to_numpy(), 3 * np.ones(64, np.float32))


def test_threads_launch_on_one_device(wdev: Any, stream: Any) -> None:
    import threading

    k = plan("saxpy", wdev)
    x = arr(np.ones(64, np.float32), wdev)
    ys = [arr(np.zeros(64, np.float32), wdev) for _ in range(4)]
    errors: list[BaseException] = []

    def work(y: Any) -> None:
        try:
            for _ in range(300):
                k.call(64, (y, x, 1.0, 64))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(y,)) for y in ys]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    for y in ys:
        np.testing.assert_array_equal(y.to_numpy(), np.full(64, 300, np.float32))


def test_free_and_drop_with_work_pending(wdev: Any, stream: Any) -> None:
    import gc

    k = plan("saxpy", wdev)
    y = arr(np.zeros(64, np.float32), wdev)
    x = arr(np.ones(64, np.float32), wdev)
    k.call(64, (y, x, 1.0, 64))
    x.free()  # the pending dispatch that reads it is submitted first
    x.free()  # idempotent
    for i in range(5):
        t = arr(np.full(64, i, np.float32), wdev)
        k.call(64, (y, t, 1.0, 64))
        del t  # dropped with the dispatch still recorded: wgpu keeps it until it ran
        gc.collect()
    np.testing.assert_array_equal(y.to_numpy(), np.full(64, 11, np.float32))
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*freed"):
        k.call(64, (y, x, 1.0, 64))
    with pytest.raises(ArgumentValueError, match="freed"):
        x.to_numpy()


def test_struct_elements_and_fixed_arrays(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.kernel import KernelPlan
    from khal_runtime.manifest import Binding

    pair = K.Param(name="pts", kind="storage", element_type="Pair", element_size=8, element_align=4,
                   shape="slice", writable=True)
    fixed = K.Param(name="w", kind="storage", element_type="float32", element_size=4, element_align=4,
                    shape="array", length=4)
    e = K.entry("pairs", 64, (pair, fixed), (Binding(param="pts", group=0, binding=0, access="read_write"),
                                             Binding(param="w", group=0, binding=1, access="read")))
    src = f"""
struct Pair {{ a: f32, b: f32 }}
@group(0) @binding(0) var<storage, read_write> pts: array<Pair>;
@group(0) @binding(1) var<storage, read> w: array<f32, 4>;
@compute @workgroup_size(64) fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    if (g.x < arrayLength(&pts)) {{ pts[g.x].b = pts[g.x].a * w[3]; }}
}}"""
    k = KernelPlan(e, wdev, src, "tests")
    dt = np.dtype([("a", "<f4"), ("b", "<f4")])
    host = np.zeros(10, dt)
    host["a"] = np.arange(10)
    pts = arr(host, wdev)
    k.call(10, (pts, arr(np.array([0, 0, 0, 3], np.float32), wdev)))
    np.testing.assert_array_equal(pts.to_numpy()["b"], 3 * np.arange(10, dtype=np.float32))
    with pytest.raises(ArgumentValueError, match=r"argument 'w'.*needs 4 elements, got 3"):
        k.call(10, (pts, arr(np.zeros(3, np.float32), wdev)))
    with pytest.raises(ArgumentError, match=r"argument 'pts'.*struct Pair \(8 bytes\)"):
        k.call(10, (arr(np.zeros(10, np.float64), wdev), arr(np.zeros(4, np.float32), wdev)))


def test_memoised_call_sees_frees_and_pool_recycling(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.uniform_pool import uniform_pool

    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    args = (y, x, 1.0, 64)
    k.call(64, args)
    k.call(64, args)           # the memo path
    uniform_pool(wdev).clear()  # regions forgotten: the next call must bind anew
    k.call(64, args)
    np.testing.assert_array_equal(y.to_numpy(), np.full(64, 3, np.float32))
    x.free()
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*freed"):
        k.call(64, args)


def test_many_distinct_uniform_values_recycle_the_pool(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.uniform_pool import uniform_pool

    k = plan("saxpy", wdev)
    pool = uniform_pool(wdev)
    old = pool.max_entries
    pool.max_entries = 50
    try:
        x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
        gen = pool.generation
        for i in range(130):
            k.call(64, (y, x, float(i), 64))
        assert pool.generation >= gen + 2
        np.testing.assert_array_equal(y.to_numpy(), np.full(64, sum(range(130)), np.float32))
    finally:
        pool.max_entries = old


def test_profiling_a_replay(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.profiling import disable_profiling, enable_profiling
    from khal_runtime.backends.webgpu.recording import capture

    if not wdev.has_timestamps:
        pytest.skip(f"{wdev.describe()} has no timestamp-query")
    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    with capture(wdev, label="step") as cap:
        for _ in range(3):
            k.call(64, (y, x, 1.0, 64))
    t = enable_profiling(wdev)
    try:
        cap.recording.launch()
        cap.recording.launch()
        np.testing.assert_array_equal(y.to_numpy(), np.full(64, 6, np.float32))
        assert t.stats()["recording step (3 dispatches)"]["count"] == 2
    finally:
        disable_profiling(wdev)


def test_shader_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime.backends.webgpu.pipeline import select_target

    e, _ = K.saxpy()
    assert select_target(e).target == "wgsl"
    monkeypatch.setenv("KHAL_WEBGPU_SHADER", "spirv")
    with pytest.raises(KhalError, match=r"entry c.saxpy has no spirv build \(KHAL_WEBGPU_SHADER=spirv\); it has wgsl"):
        select_target(e, "c")
    monkeypatch.setenv("KHAL_WEBGPU_SHADER", "glsl")
    with pytest.raises(KhalError, match="expected wgsl"):
        select_target(e)


def test_public_wgpu_py_path(wdev: Any, stream: Any) -> None:
    """Without wgpu-native's C functions (another wgpu-py layout) the stream records through
    wgpu-py's public methods: same results."""
    from khal_runtime.backends.webgpu.recording import capture

    k, h = plan("saxpy", wdev), plan("hits", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    hits = arr(np.zeros(128, np.uint32), wdev)
    count = arr(np.array([2], np.uint32), wdev)
    lib = stream._lib
    stream.flush()
    stream._lib = None
    stream._update_mode()
    try:
        k.call(64, (y, x, 1.0, 64))
        k.call(64, (y, x, 2.0, 64))
        h.dispatch_indirect(count, (hits,))
        with capture(wdev) as cap:
            k.call(64, (y, x, 4.0, 64))
        cap.recording.launch()
        if wdev.has_immediates:
            kp = plan("saxpy_push", wdev)
            kp.call(64, (y, x, 8.0, 64))
        np.testing.assert_array_equal(y.to_numpy(), np.full(64, 15.0 if wdev.has_immediates else 7.0, np.float32))
        np.testing.assert_array_equal(hits.to_numpy(), np.ones(128, np.uint32))
    finally:
        stream.flush()
        stream._lib = lib
        stream._update_mode()


def test_launcher_dispatch_with_views_and_packed_bytes(wdev: Any, stream: Any) -> None:
    """The low-level API: views per storage parameter, uniform bytes in the target layout, the
    packed scalar block."""
    import struct

    from khal_runtime.backends.webgpu.launch import Launcher
    from khal_runtime.packing import UniformPacker
    from tests.runtime.webgpu.test_packing import VALUES

    sax = Launcher(plan("saxpy", wdev).pipeline)
    x, y = arr(np.arange(64, dtype=np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    sax.dispatch((1, 1, 1), [y.view, x.view], None, struct.pack("<fI", 2.0, 64))
    sax.dispatch((0, 1, 1), [y.view, x.view], None, struct.pack("<fI", 100.0, 64))  # no groups: nothing
    np.testing.assert_array_equal(y.to_numpy(), 2 * np.arange(64, dtype=np.float32))
    p = plan("params_struct", wdev)
    out = arr(np.zeros(12, np.float32), wdev)
    packed = UniformPacker("read_params", p.params[1], "wgsl").pack(VALUES)
    Launcher(p.pipeline).dispatch((1, 1, 1), [out.view], {"p": packed})
    assert out.to_numpy()[9] == 42
    with pytest.raises(ArgumentError, match=r"2 storage view\(s\) expected \(y, x\), got 1"):
        sax.dispatch((1, 1, 1), [y.view], None, b"\0" * 8)
    with pytest.raises(ArgumentError, match="the scalar block was not given"):
        sax.dispatch((1, 1, 1), [y.view, x.view])
    with pytest.raises(ArgumentValueError, match="a slice starting at byte 4"):
        sax.dispatch((1, 1, 1), [y.view, x[1:9].view], None, b"\0" * 8)
