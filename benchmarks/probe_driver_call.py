"""Probe (not a section): what the cuda-bindings wrapper costs per driver call on this host.

Times, in turns: cuLaunchKernel (the raw path every pure-Python caller uses),
cuLaunchKernelEx with a CUlaunchConfig built once, and cuCtxGetCurrent (a driver call that
does almost nothing: mostly wrapper cost). Run on the GPU machine:
``python benchmarks/probe_driver_call.py``.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import numpy as np

    from _common import bench_kernels_on_device0, interleaved_per_call_us
    from khal_runtime import DeviceBuffer
    from khal_runtime.backends.cuda import driver as _cuda

    drv = _cuda.driver()
    ks, st = bench_kernels_on_device0()
    x = DeviceBuffer.zeros(256, np.float32)
    ks.empty1(256, x)
    st.synchronize()
    f = ks.empty1.plan(0).function
    vals = [ctypes.c_uint64(x.ptr), ctypes.c_uint64(256)]
    arr = (ctypes.c_void_p * 2)(*[ctypes.addressof(v) for v in vals])
    addr = ctypes.addressof(arr)
    cu = st.native
    L, LEx, G = drv.cuLaunchKernel, drv.cuLaunchKernelEx, drv.cuCtxGetCurrent
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = 1, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 256, 1, 1
    cfg.sharedMemBytes, cfg.hStream, cfg.numAttrs = 0, cu, 0
    args = (f, 1, 1, 1, 256, 1, 1, 0, cu, addr, 0)
    fns = {
        "cuLaunchKernel": lambda: L(f, 1, 1, 1, 256, 1, 1, 0, cu, addr, 0),
        "cuLaunchKernel(*prebuilt)": lambda: L(*args),
        "cuLaunchKernelEx(prebuilt config)": lambda: LEx(cfg, f, addr, 0),
        "cuCtxGetCurrent": lambda: G(),
    }
    for fn in fns.values():
        r = fn()
        assert not r[0], r
    st.synchronize()
    res = interleaved_per_call_us(fns, calls=200, batches=60, sync=st.synchronize)
    base = res["cuLaunchKernel"]["median"]
    for k, r in res.items():
        print(f"{k:36s} {r['median']:6.2f} us  {r['median'] / base:5.2f}x  (min {r['min']:.2f})")


if __name__ == "__main__":
    main()
