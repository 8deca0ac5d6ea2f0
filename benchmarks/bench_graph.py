"""Section 2, graph replay: a captured step of 1000 small launches.

Per-kernel time (device-complete: launch + synchronise, divided by the kernel count) through the
runtime's graph vs raw cuGraphLaunch of an equivalent graph captured with raw cuLaunchKernel, and
the speed-up over 1000 direct typed calls."""

from __future__ import annotations

import ctypes
import statistics
import time
from typing import Any

from _common import Row, bench_kernels_on_device0, guarded

SECTION = "graph"
STEP = 1000


def _time_step(fn: Any, sync: Any, reps: int) -> float:
    fn()
    sync()
    per = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        per.append((time.perf_counter() - t0) / STEP * 1e6)
    return statistics.median(per)


def run(args: Any) -> list[Row]:
    import numpy as np

    from khal_runtime import DeviceBuffer
    from khal_runtime.backends.cuda import driver as _cuda
    from khal_runtime.backends.cuda.driver import check

    rows: list[Row] = []
    drv = _cuda.driver()
    ks, st = bench_kernels_on_device0()
    n = 256
    x, y, z = (DeviceBuffer.zeros(n, np.float32) for _ in range(3))

    class P(ctypes.Structure):
        _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]

    p = P(2.0, 1.0)
    ks.five(n, x, y, z, p, 0.5)
    st.synchronize()
    reps = max(5, args.batches // 3)

    def step() -> None:
        for _ in range(STEP):
            ks.five(n, x, y, z, p, 0.5)

    direct = guarded(SECTION, "direct typed calls", rows, lambda: _time_step(step, st.synchronize, reps))

    def raw_graph() -> float:
        plan = ks.five.plan(0)
        upt = plan.uniforms.fetch(bytes(p), st)
        st.synchronize()
        vals = [ctypes.c_uint64(x.ptr), ctypes.c_uint64(n), ctypes.c_uint64(y.ptr), ctypes.c_uint64(n),
                ctypes.c_uint64(z.ptr), ctypes.c_uint64(n), ctypes.c_uint64(upt), ctypes.c_float(0.5)]
        arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(drv.cuStreamBeginCapture(st.native, mode), "cuStreamBeginCapture")
        for _ in range(STEP):
            check(drv.cuLaunchKernel(plan.function, 1, 1, 1, 256, 1, 1, 0, st.native, ctypes.addressof(arr), 0),
                  "cuLaunchKernel")
        g = check(drv.cuStreamEndCapture(st.native), "cuStreamEndCapture")
        ex = check(drv.cuGraphInstantiate(g, 0), "cuGraphInstantiate")
        check(drv.cuGraphUpload(ex, st.native), "cuGraphUpload")
        try:
            return _time_step(lambda: drv.cuGraphLaunch(ex, st.native), st.synchronize, reps)
        finally:
            drv.cuGraphExecDestroy(ex)
            drv.cuGraphDestroy(g)

    raw = guarded(SECTION, "raw cuGraphLaunch", rows, raw_graph)

    def khal_graph() -> float:
        try:
            from khal_runtime import graphs
        except ImportError:
            raise RuntimeError("not available: khal_runtime.graphs is absent") from None
        begin = getattr(st, "begin_capture", None)
        if begin is not None:
            begin()
            step()
            g = st.end_capture()
        else:
            graphs.begin_capture(st)
            step()
            g = graphs.end_capture(st)
        g.upload(st)
        try:
            return _time_step(lambda: g.launch(st), st.synchronize, reps)
        finally:
            close = getattr(g, "close", None)
            if close:
                close()

    kg = guarded(SECTION, "khal graph (Graph.launch)", rows, khal_graph)
    if raw is not None:
        rows.append(Row(SECTION, "raw cuGraphLaunch", raw, "us/kernel", 1.0, "raw graph"))
    if kg is not None:
        rows.append(Row(SECTION, "khal graph (Graph.launch)", kg, "us/kernel", kg / raw if raw else None,
                        "raw graph", "<= 1.2x raw graph", (kg / raw <= 1.2) if raw else None))
    if direct is not None:
        rows.append(Row(SECTION, "direct typed calls", direct, "us/kernel", direct / raw if raw else None,
                        "raw graph", note=(f"graph speed-up over direct: {direct / kg:.1f}x" if kg else "")))
    return rows
