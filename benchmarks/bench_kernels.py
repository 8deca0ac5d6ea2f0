"""Section 4, kernels: saxpy and reduce_sum of the example package at sizes well past L2
(>= 1 GiB of traffic), GB/s from CUDA events (median), and the ratio to a measured
device-to-device copy of the same buffer; CuPy doing the same operations for comparison."""

from __future__ import annotations

import statistics
from typing import Any

from _common import Row, guarded

SECTION = "kernels"


def run(args: Any) -> list[Row]:
    import numpy as np

    import example_shader_pkg as ex
    from khal_runtime import Device, DeviceBuffer
    from khal_runtime.backends.cuda import driver as _cuda
    from khal_runtime.backends.cuda.driver import check

    rows: list[Row] = []
    drv = _cuda.driver()
    dev = Device(0)
    dev.use()
    st = dev.default_stream
    n = args.kernel_elems  # floats per buffer (default 2**28: 1 GiB per buffer)
    reps = args.kernel_reps
    flags = drv.CUevent_flags.CU_EVENT_DEFAULT
    e0 = check(drv.cuEventCreate(flags), "cuEventCreate")
    e1 = check(drv.cuEventCreate(flags), "cuEventCreate")

    def timed_ms(fn: Any) -> float:
        fn()
        st.synchronize()
        ts = []
        for _ in range(reps):
            check(drv.cuEventRecord(e0, st.native), "cuEventRecord")
            fn()
            check(drv.cuEventRecord(e1, st.native), "cuEventRecord")
            check(drv.cuEventSynchronize(e1), "cuEventSynchronize")
            ts.append(check(drv.cuEventElapsedTime(e0, e1), "cuEventElapsedTime"))
        return statistics.median(ts)

    x = DeviceBuffer.alloc(n, np.float32)
    y = DeviceBuffer.alloc(n, np.float32)
    x.fill_zero(st)
    y.fill_zero(st)
    out = DeviceBuffer.zeros(1, np.float32)
    nbytes = n * 4
    gbs: dict[str, float] = {}

    def copy() -> None:
        ms = timed_ms(lambda: check(drv.cuMemcpyDtoDAsync(y.ptr, x.ptr, nbytes, st.native), "cuMemcpyDtoDAsync"))
        gbs["copy"] = 2 * nbytes / ms / 1e6
        rows.append(Row(SECTION, "device-to-device copy", gbs["copy"], "GB/s", 1.0, "copy",
                        note=f"{2 * nbytes / 2**30:.1f} GiB moved, {ms:.3f} ms"))

    def saxpy() -> None:
        p = ex.SaxpyParams(a=1.0001)
        th = ex.elementwise_threads(n)
        ms = timed_ms(lambda: ex.kernels.saxpy(th, x, y, p))
        gbs["saxpy"] = 3 * nbytes / ms / 1e6
        r = gbs["saxpy"] / gbs["copy"] if "copy" in gbs else None
        rows.append(Row(SECTION, "saxpy (khal)", gbs["saxpy"], "GB/s", r, "copy", ">= 0.90 copy",
                        r is not None and r >= 0.90, f"{3 * nbytes / 2**30:.1f} GiB, {ms:.3f} ms"))

    def reduce() -> None:
        th = ex.reduce_sum_threads(n)

        def go() -> None:
            out.fill_zero(st)
            ex.kernels.reduce_sum(th, x, out)

        ms = timed_ms(go)
        gbs["reduce"] = nbytes / ms / 1e6
        r = gbs["reduce"] / gbs["copy"] if "copy" in gbs else None
        rows.append(Row(SECTION, "reduce_sum (khal)", gbs["reduce"], "GB/s", r, "copy", ">= 0.85 copy",
                        r is not None and r >= 0.85, f"{nbytes / 2**30:.1f} GiB, {ms:.3f} ms (incl. 4-byte memset)"))

    def cupy_ops() -> None:
        import cupy as cp

        with cp.cuda.ExternalStream(st.handle):
            cx = cp.zeros(n, cp.float32)
            cy = cp.zeros(n, cp.float32)
            a = cp.float32(1.0001)

            def cs() -> None:
                cy.__iadd__(a * cx)

            ms = timed_ms(cs)
            g = 3 * nbytes / ms / 1e6
            rows.append(Row(SECTION, "saxpy (CuPy y += a * x)", g, "GB/s",
                            g / gbs["copy"] if "copy" in gbs else None, "copy",
                            note=f"{ms:.3f} ms; two kernels + a temporary"))
            ms = timed_ms(lambda: cx.sum())
            g = nbytes / ms / 1e6
            rows.append(Row(SECTION, "reduce (CuPy x.sum())", g, "GB/s",
                            g / gbs["copy"] if "copy" in gbs else None, "copy", note=f"{ms:.3f} ms"))
            del cx, cy

    guarded(SECTION, "device-to-device copy", rows, copy)
    guarded(SECTION, "saxpy (khal)", rows, saxpy)
    guarded(SECTION, "reduce_sum (khal)", rows, reduce)
    guarded(SECTION, "CuPy", rows, cupy_ops)
    for b in (x, y, out):
        b.free()
    drv.cuEventDestroy(e0)
    drv.cuEventDestroy(e1)
    return rows
