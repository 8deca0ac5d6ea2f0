"""Section "attrs" (issue #26): kernels that use the whole GPU, from tests/packages/attrs_kernels_pkg.

- the WMMA GEMM tile with 64 KB of dynamic shared memory (``KHAL_SHARED_MEM(65536)``), TFLOP/s vs
  ``torch.matmul`` of the same fp16 sizes (reported, no bar: a teaching kernel against cuBLAS);
- the cooperative grid-sync reduction (one launch) vs the two-pass reduction (two launches), us per sum;
- a dependent pair with and without PDL (``KHAL_PDL``), us per pair, replayed from a graph of 200 pairs
  (device-bound: what PDL hides is the gap between the two kernels) and launched directly;
- launch overhead of an entry with attributes (the PDL consumer: cuLaunchKernelEx with its attribute
  list) through the typed call and a bound launch vs raw ``cuLaunchKernelEx`` with the same attributes
  and config prebuilt (bar: typed call within 1.15x, DESIGN.md).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from _common import ROOT, Row, build_test_package, device_complete_us, guarded, interleaved_per_call_us

SECTION = "attrs"
PKG = "khal_attrs_kernels"


def _build() -> Any:
    """tests/packages/attrs_kernels_pkg, imported: from the wheel KHAL_TEST_ATTRS_WHEEL names (built where
    the CUDA headers are: the GPU machine's NVRTC lacks crt/mma.h), else built in-process by the
    hook's builder."""
    wheel = os.environ.get("KHAL_TEST_ATTRS_WHEEL")
    if wheel:
        site = Path(tempfile.mkdtemp(prefix="khal-bench-attrs-"))
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
        sys.path.insert(0, str(site))
        return importlib.import_module(PKG).kernels
    return build_test_package(ROOT / "tests" / "packages" / "attrs_kernels_pkg", PKG)[0]


def run(args: Any) -> list[Row]:
    import numpy as np

    from khal_runtime import Device, DeviceBuffer
    from khal_runtime.backends.cuda import driver as _cuda

    rows: list[Row] = []
    drv = _cuda.driver()
    K = _build()  # noqa: N806
    dev = Device(0)
    dev.use()
    st = dev.default_stream
    sync = st.synchronize
    reps = max(5, args.batches // 3)

    # -- GEMM tile, 64 KB of dynamic shared memory ------------------------------------------------
    def gemm() -> None:
        m = n = k = 4096
        rng = np.random.default_rng(0)
        a = DeviceBuffer.from_numpy(rng.uniform(-1, 1, m * k).astype(np.float16), st)
        bt = DeviceBuffer.from_numpy(rng.uniform(-1, 1, n * k).astype(np.float16), st)
        c = DeviceBuffer.zeros(m * n, np.float32, stream=st)
        grid = (m // 128) * (n // 128)
        us = device_complete_us(lambda: K.gemm_tile.launch(grid, None, a, bt, c, m, n, k, shared_mem=65536), sync, reps)
        tflops = 2 * m * n * k / (us * 1e-6) / 1e12
        ref = None
        try:
            import torch

            ta = torch.randn(m, k, device="cuda", dtype=torch.float16)
            tb = torch.randn(k, n, device="cuda", dtype=torch.float16)
            tus = device_complete_us(lambda: torch.matmul(ta, tb), torch.cuda.synchronize, reps)
            ref = 2 * m * n * k / (tus * 1e-6) / 1e12
        except Exception as exc:  # noqa: BLE001
            rows.append(Row(SECTION, "torch.matmul fp16 4096^3", note=f"not measured: {exc}"))
        rows.append(Row(SECTION, "gemm_tile (64 KB dyn. shared) 4096^3", tflops, "TFLOP/s",
                        tflops / ref if ref else None, "torch.matmul", note="reported (WMMA teaching kernel vs cuBLAS)"))
        if ref:
            rows.append(Row(SECTION, "torch.matmul fp16 4096^3", ref, "TFLOP/s", 1.0, "torch.matmul"))

    guarded(SECTION, "gemm_tile", rows, gemm)

    # -- cooperative reduction vs two passes ------------------------------------------------------
    def reduction() -> None:
        n = 1 << 26
        x = DeviceBuffer.from_numpy(np.ones(n, np.float32), st)
        grid = dev.sm_count * 4  # 256-thread blocks: 4 per SM co-resident on sm_90
        partial = DeviceBuffer.zeros(grid, np.float32, stream=st)
        out = DeviceBuffer.zeros(1, np.float32, stream=st)
        coop = device_complete_us(lambda: K.reduce_coop.launch(grid, None, x, partial, out, n), sync, reps)

        def two() -> None:
            K.reduce_pass1.launch(grid, None, x, partial, n)
            K.reduce_pass2.launch(1, None, partial, out, grid)

        twop = device_complete_us(two, sync, reps)
        got = float(out.to_numpy()[0])
        rows.append(Row(SECTION, "cooperative reduction (1 launch, grid.sync)", coop, "us/sum", coop / twop,
                        "two-pass", note=f"2^26 floats, grid {grid}; sum {got:.0f}"))
        rows.append(Row(SECTION, "two-pass reduction (2 launches)", twop, "us/sum", 1.0, "two-pass"))

    guarded(SECTION, "reduction", rows, reduction)

    # -- a dependent pair with and without PDL ----------------------------------------------------
    def pdl() -> None:
        n = 1 << 16
        x = DeviceBuffer.from_numpy(np.ones(n, np.float32), st)
        y, z = DeviceBuffer.zeros(n, np.float32, stream=st), DeviceBuffer.zeros(n, np.float32, stream=st)
        pairs = 200
        figures = {}
        for label, prod, cons in (("PDL", K.pdl_producer, K.pdl_consumer),
                                  ("no PDL", K.plain_producer, K.plain_consumer)):
            bp, bc = prod.bind(x, y, n, stream=st), cons.bind(y, z, n, stream=st)

            def step(bp: Any = bp, bc: Any = bc) -> None:
                for _ in range(pairs):
                    bp(n)
                    bc(n)

            step()
            sync()
            with st.capture() as cap:
                step()
            g = cap.graph
            g.upload(st)
            figures[label] = (device_complete_us(lambda g=g: g.launch(st), sync, reps, pairs), device_complete_us(step, sync, reps, pairs))
            g.close()
        (pg, pd), (ng, nd) = figures["PDL"], figures["no PDL"]
        rows.append(Row(SECTION, "dependent pair with PDL (graph)", pg, "us/pair", pg / ng, "no PDL (graph)"))
        rows.append(Row(SECTION, "dependent pair without PDL (graph)", ng, "us/pair", 1.0, "no PDL (graph)"))
        rows.append(Row(SECTION, "dependent pair with PDL (bound launches)", pd, "us/pair", pd / nd, "no PDL (bound)"))
        rows.append(Row(SECTION, "dependent pair without PDL (bound launches)", nd, "us/pair", 1.0, "no PDL (bound)"))

    guarded(SECTION, "pdl", rows, pdl)

    # -- launch overhead of an entry with attributes ----------------------------------------------
    def overhead() -> None:
        n = 256
        y, z = DeviceBuffer.zeros(n, np.float32, stream=st), DeviceBuffer.zeros(n, np.float32, stream=st)
        k = K.pdl_consumer
        k(n, y, z, n)
        plan = k.plan(0)
        vals = [ctypes.c_uint64(y.ptr), ctypes.c_uint64(n), ctypes.c_uint64(z.ptr), ctypes.c_uint64(n),
                ctypes.c_uint32(n)]
        arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        at = drv.CUlaunchAttribute()
        at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        at.value.programmaticStreamSerializationAllowed = 1
        cfg = drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = 1, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 256, 1, 1
        cfg.sharedMemBytes, cfg.hStream = 0, st.native
        cfg.attrs, cfg.numAttrs = [at], 1
        ex, f, addr = drv.cuLaunchKernelEx, plan.function, ctypes.addressof(arr)
        b = k.bind(y, z, n, stream=st)
        fns = {"typed": lambda: k(n, y, z, n), "bound": lambda: b(n), "raw": lambda: ex(cfg, f, addr, 0)}
        got = interleaved_per_call_us(fns, calls=args.calls, batches=args.batches, sync=sync)
        raw = got["raw"]["median"]
        rows.append(Row(SECTION, "PDL entry: raw cuLaunchKernelEx, attributes prebuilt", raw, "us/launch", 1.0, "raw Ex"))
        for key, label, bar in (("typed", "PDL entry: typed call", 1.15), ("bound", "PDL entry: bind()", 1.10)):
            v = got[key]["median"]
            rows.append(Row(SECTION, label, v, "us/launch", v / raw, "raw Ex", f"<= {bar}x raw", v / raw <= bar,
                            f"min {got[key]['min']:.2f}"))

    guarded(SECTION, "launch overhead with attributes", rows, overhead)
    return rows
