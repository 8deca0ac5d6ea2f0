"""Indirect dispatch: launch a kernel whose workgroup count lives in device memory.

    kernels.compact_alive(n, particles, params, alive_indices, alive_count)   # writes alive_count
    kernels.kinetic_energy.dispatch_indirect(alive_count, particles, alive_indices,
                                             alive_count, energy, threads=True)

``count`` is a device buffer (DeviceBuffer, tensor, CuPy array, ...) of uint32
(or int32) whose first element holds the number of **workgroups**, or, with
``threads=True``, the number of **threads** (rounded up to whole groups of the
entry's block size, as ``kernels.k(n, ...)`` does).

Default path, no host synchronisation, capturable into a CUDA graph: the
entry's generated ``<entry>_indirect_khal_<hash>`` variant is launched on a
persistent grid (SM count x blocks per SM: the occupancy limit of the kernel,
or ``KHAL_CUDA_INDIRECT_BLOCKS_PER_SM``; ``grid=`` overrides it) and loops
``for g = blockIdx.x; g < *count; g += gridDim.x`` over the device-side count,
with ``KHAL_GROUP_ID`` / ``KHAL_NUM_GROUPS`` / ``KHAL_GLOBAL_ID`` taking the
values a direct launch of ``*count`` groups would give. With ``threads=True`` a
one-thread helper kernel (hand-written PTX shipped here, JIT-compiled by the
driver once per device) first turns the thread count into a group count in a
per-stream scratch word.

Host-read path (``host_read=True``, or ``KHAL_CUDA_INDIRECT_SYNC=1`` for every
call that does not say): the count is copied to pinned host memory, the stream
is drained, and the direct kernel is launched on exactly that many groups
(nothing when it is 0). It costs a full stream synchronisation per dispatch, and
raises CaptureError inside a graph capture. ``KHAL_TRACE_INDIRECT=1`` prints one
line per dispatch that paid that synchronisation.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
from typing import Any

from khal_runtime.abi import env_flag
from khal_runtime.arguments import blocks, dim3, misaligned, read_array
from khal_runtime.backends import KernelHandle
from khal_runtime.backends.cuda.driver import check, driver
from khal_runtime.backends.cuda.graphs import relaxed_capture_mode
from khal_runtime.backends.cuda.launch import LaunchPlan
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.capture_state import forbid_in_capture
from khal_runtime.device import Device, Stream, as_stream, ensure_current
from khal_runtime.dtypes import ReadOnly, dtype_info
from khal_runtime.errors import ArgumentError, ArgumentValueError, EnvVarError, KhalError
from khal_runtime.launch_hooks import write_line
from khal_runtime.manifest_records import Entry, Param
from khal_runtime.scratch import stream_key

__all__ = ["HELPER_PTX", "dispatch_indirect", "persistent_grid", "threads_to_groups", "prepare"]

#: ``groups[0] = ceil(threads[0] / block)`` without overflow, one thread. PTX ISA 7.0 / sm_75 so
#: every driver since CUDA 11.0 can JIT it (checked with nvJitLink in the tests).
HELPER_PTX = b"""//
// khal_runtime indirect-dispatch helper (hand-written PTX)
//
.version 7.0
.target sm_75
.address_size 64

.visible .entry khal_threads_to_groups(
    .param .u64 p_threads,
    .param .u64 p_groups,
    .param .u32 p_block
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [p_threads];
    ld.param.u64 %rd2, [p_groups];
    ld.param.u32 %r1, [p_block];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.u32 %r2, [%rd3];
    div.u32 %r3, %r2, %r1;
    mul.lo.u32 %r4, %r3, %r1;
    setp.ne.u32 %p1, %r4, %r2;
    selp.u32 %r5, 1, 0, %p1;
    add.u32 %r6, %r3, %r5;
    st.global.u32 [%rd4], %r6;
    ret;
}
\x00"""
HELPER_NAME = b"khal_threads_to_groups"

_lock = threading.Lock()
_helpers: dict[int, Any] = {}           # device -> CUfunction
_iplans: dict[Any, Any] = {}            # direct LaunchPlan -> LaunchPlan of the indirect variant
_grids: dict[Any, int] = {}             # direct LaunchPlan -> persistent grid size
#: (device, stream handle, thread token or 0: ``scratch.stream_key``) -> DeviceBuffer (1 x uint32)
_scratch: dict[tuple[int, ...], Any] = {}
_helper_args: dict[tuple[int, int, int], tuple[Any, Any, int]] = {}
_tls = threading.local()


def _env_true(name: str) -> bool:
    return env_flag(os.environ.get(name), name)


# ---------------------------------------------------------------------------------------------
# pieces
# ---------------------------------------------------------------------------------------------
def _helper(device_id: int) -> Any:
    f = _helpers.get(device_id)
    if f is None:
        with _lock:
            f = _helpers.get(device_id)
            if f is None:
                drv = driver()
                ensure_current(device_id)
                with relaxed_capture_mode():
                    mod = check(drv.cuModuleLoadData(HELPER_PTX), "cuModuleLoadData(indirect helper)")
                    f = check(drv.cuModuleGetFunction(mod, HELPER_NAME), "cuModuleGetFunction")
                _helpers[device_id] = f
    return f


def prepare(device: int = 0) -> None:
    """Load the thread-count helper on ``device`` now (it is loaded on first use otherwise)."""
    _helper(int(device))


def _indirect_plan(kernel: KernelHandle, plan: LaunchPlan) -> LaunchPlan:
    ip = _iplans.get(plan)
    if ip is None:
        e = plan.entry
        if not e.indirect_symbol or plan.indirect_function is None:
            why = e.indirect_reason or "none is in its binary (built by an older hatch-khal?): rebuild the package"
            raise KhalError(
                f"entry {kernel.crate}.{e.name} has no indirect (persistent-grid) variant: {why}. Pass "
                "host_read=True to read the count on the host and launch that many groups directly")
        entry = Entry.construct(  # (a manifest record, as the loaded package's: khal_runtime.manifest_load)
            name=f"{e.name}_indirect", symbol=e.indirect_symbol, hash=e.hash,
            block_size=e.block_size, indirect_symbol=None, grid_dims=1, webgpu=None, attributes=e.attributes,
            params=tuple(e.params) + (Param.construct(name="khal_group_count", kind="uniform",
                                                      element_type="uint32", element_size=4,
                                                      element_align=4),),
        )
        ip = LaunchPlan(entry, plan.crate, plan.device_id, plan.indirect_function, plan.uniforms,
                        attributes=plan.indirect_attributes)
        with _lock:
            ip = _iplans.setdefault(plan, ip)
    return ip  # type: ignore[no-any-return]


def persistent_grid(kernel: KernelHandle, plan: LaunchPlan) -> int:
    """Blocks of the persistent grid for ``kernel``'s indirect variant on ``plan``'s device: SM
    count x blocks per SM (``KHAL_CUDA_INDIRECT_BLOCKS_PER_SM``, else the kernel's occupancy
    limit, else 4)."""
    d = plan.device_id
    g = _grids.get(plan)
    if g is None:
        raw = os.environ.get("KHAL_CUDA_INDIRECT_BLOCKS_PER_SM", "").strip()
        per_sm = 0
        if raw:
            try:
                per_sm = int(raw)
            except ValueError:
                per_sm = 0
            if per_sm < 1:
                raise EnvVarError(f"KHAL_CUDA_INDIRECT_BLOCKS_PER_SM={raw!r}: expected an integer >= 1 (blocks per "
                                  "SM of the persistent grid), or unset for the kernel's occupancy limit",
                                  variable="KHAL_CUDA_INDIRECT_BLOCKS_PER_SM", value=raw)
        dev = Device(d)
        if not per_sm:
            bx, by, bz = kernel.block_size
            fn = plan.indirect_function if plan.indirect_function is not None else plan.function
            try:
                res = driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, bx * by * bz, plan.shared)
                per_sm = int(res[1]) if not res[0] else 0
            except Exception:
                per_sm = 0
            per_sm = per_sm if per_sm > 0 else 4
        g = max(1, dev.sm_count * per_sm)
        _grids[plan] = g
    return g


def _scratch_for(device_id: int, stream: Any) -> Any:
    # (a per-thread stream is another stream in each thread, whose helpers run concurrently: a word each)
    key = (device_id, *stream_key(stream)[1:])
    buf = _scratch.get(key)
    if buf is None:
        ensure_current(device_id)
        with relaxed_capture_mode():  # an internal word, allocated once per stream
            dptr = check(driver().cuMemAlloc(4), "cuMemAlloc")
        buf = DeviceBuffer(int(dptr), 1, "uint32", device_id, alloc=dptr, backend=stream.backend_impl)
        with _lock:
            buf = _scratch.setdefault(key, buf)
    return buf


def _helper_block(src: int, dst: int, block: int) -> int:
    key = (src, dst, block)
    e = _helper_args.get(key)
    if e is None:
        raw = ctypes.create_string_buffer(struct.pack("<QQI", src, dst, block), 24)
        base = ctypes.addressof(raw)
        ptrs = (ctypes.c_void_p * 3)(base, base + 8, base + 16)
        e = (raw, ptrs, ctypes.addressof(ptrs))
        with _lock:
            if len(_helper_args) > 4096:
                _helper_args.clear()
            _helper_args[key] = e
    return e[2]


def threads_to_groups(threads: Any, block: int, out: Any = None, stream: Any = None) -> Any:
    """Enqueue ``out[0] = ceil(threads[0] / block)`` on ``stream`` (device-side, capturable).

    ``out`` defaults to a per-stream scratch word (valid until the next call on that stream)."""
    st = as_stream(stream)
    src = _count_ptr(threads, "threads")
    if out is None:
        out = _scratch_for(st.device_id, st)
    dst = _count_ptr(out, "out", written=True)
    if not 1 <= int(block) <= 1024:
        raise ArgumentValueError(f"threads_to_groups: block must be 1..1024, got {block}")
    f = _helper(st.device_id)
    addr = _helper_block(src, dst, int(block))
    err = driver().cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, st.native, addr, 0)[0]
    if err:
        check((err,), "cuLaunchKernel(khal_threads_to_groups)")
    return out


def _count_ptr(count: Any, what: str = "count", written: bool = False) -> int:
    """The device pointer of a count word (``written``: the helper kernel writes it), or the
    named error: not a uint32 array, empty, read-only where written, or misaligned (a u32 read
    at an odd address is a sticky CUDA_ERROR_MISALIGNED_ADDRESS that ruins the context)."""
    where = f"dispatch_indirect: {what}"
    ptr, n, key = read_array(where, count)
    if type(key) is ReadOnly:
        if written:
            raise ArgumentError(f"{where} is a read-only array and the count is written there; pass a "
                                "writable uint32 device buffer")
        key = key.dtype
    name, _ = dtype_info(key)
    if name not in ("uint32", "int32"):
        raise ArgumentError(f"{where} must be a device buffer of uint32, got {name}")
    if n < 1:
        raise ArgumentValueError(f"{where} is empty; it must hold the count")
    if ptr & 3:
        raise ArgumentValueError(misaligned(where, ptr, 4, "uint32"))
    return int(ptr)


def _pinned_word() -> int:
    p = getattr(_tls, "pinned", None)
    if p is None:
        p = int(check(driver().cuMemHostAlloc(8, 0), "cuMemHostAlloc"))
        _tls.pinned = p
    return p


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------
def dispatch_indirect(kernel: KernelHandle, plan: LaunchPlan, count: Any, args: tuple[Any, ...], st: Stream,
                      grid: Any = None, threads: bool = False, host_read: bool | None = None) -> None:
    """``kernel`` over the workgroup (``threads=True``: thread) count in device buffer ``count``
    on ``plan``'s device (its context current).

    ``grid``: blocks of the persistent grid (device-side path only; default
    :func:`persistent_grid`). ``host_read``: read the count on the host and launch the
    direct kernel (None: ``KHAL_CUDA_INDIRECT_SYNC``)."""
    if host_read is None:
        host_read = _env_true("KHAL_CUDA_INDIRECT_SYNC")
    if host_read:
        _dispatch_host_read(kernel, count, args, st, threads)
        return
    ip = _indirect_plan(kernel, plan)  # (cooperative / clustered entries have none: refused by name)
    _count_ptr(count)
    groups = threads_to_groups(count, kernel.block_size[0], stream=st) if threads else count
    gx = persistent_grid(kernel, plan) if grid is None else dim3(grid, "grid")[0]
    bx, by, bz = kernel.block_size
    ip.run(gx, 1, 1, bx, by, bz, plan.shared, st, args + (groups,))


def _dispatch_host_read(kernel: KernelHandle, count: Any, args: tuple[Any, ...], st: Stream, threads: bool) -> None:
    name = f"{kernel.crate}.{kernel.name}"
    forbid_in_capture(
        f"indirect dispatch of {name} with a host read of its count "
        "(host_read=True / KHAL_CUDA_INDIRECT_SYNC=1)",
        "the host cannot read a count that captured work has not produced; use the device-side "
        "path (host_read=False, unset KHAL_CUDA_INDIRECT_SYNC), which is capturable", st)
    src = _count_ptr(count)
    kernel.check_args(*args)  # before paying the synchronisation
    drv = driver()
    host = _pinned_word()
    t0 = time.perf_counter()
    check(drv.cuMemcpyDtoHAsync(host, src, 4, st.native), "cuMemcpyDtoHAsync")
    check(drv.cuStreamSynchronize(st.native), "cuStreamSynchronize")
    waited = time.perf_counter() - t0
    value = ctypes.c_uint32.from_address(host).value
    bx = kernel.block_size[0]
    groups = blocks(value, bx) if threads else value
    if _env_true("KHAL_TRACE_INDIRECT"):
        unit = "threads" if threads else "groups"
        launched = f"grid={groups}" if groups else "nothing launched"
        write_line(f"khal: indirect {name} host read count={value} {unit} -> {launched} "
                   f"(stream 0x{st.handle:x} drained, {waited * 1e6:.0f} us)")
    if groups:
        kernel.launch(groups, None, *args, stream=st)
