"""Probe (not a section): where the typed call with torch tensors spends its time over the same
call with DeviceBuffers, on this host.

Times, in turns, on the five-binding kernel (uniform in device memory): the raw
cuLaunchKernelEx (config built once), the typed call with DeviceBuffers and with torch tensors,
the raw call preceded by the reuse check's six torch reads, and the raw call preceded by the
reuse check spelled as the generated code does it. Also reports whether the torch launches
came from a shared snapshot. Run on the GPU machine:
``python benchmarks/probe_torch_launch.py``.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import numpy as np
    import torch

    from _common import bench_kernels_on_device0, interleaved_per_call_us
    from khal_runtime import DeviceBuffer
    from khal_runtime.backends.cuda import driver as _cuda
    from khal_runtime.backends.cuda.launch import launch_call

    drv = _cuda.driver()
    ks, st = bench_kernels_on_device0()
    n = 256
    x, y, z = (DeviceBuffer.zeros(n, np.float32) for _ in range(3))
    pdev = DeviceBuffer.zeros(8, np.uint8)
    tx, ty, tz = (torch.zeros(n, dtype=torch.float32, device="cuda") for _ in range(3))
    torch.cuda.synchronize()
    for _ in range(20):
        ks.five(n, x, y, z, pdev, 0.5)
        ks.five(n, tx, ty, tz, pdev, 0.5)
    st.synchronize()
    plan = ks.five.plan(0)
    vals = [ctypes.c_uint64(x.ptr), ctypes.c_uint64(n), ctypes.c_uint64(y.ptr), ctypes.c_uint64(n),
            ctypes.c_uint64(z.ptr), ctypes.c_uint64(n), ctypes.c_uint64(pdev.ptr), ctypes.c_float(0.5)]
    arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    lx, args = launch_call(drv)
    call = args(plan.function, (1, 1, 1), (256, 1, 1), 0, st.native, ctypes.addressof(arr))
    k = next(s for s in plan._shared if s[0] is tx)  # the torch snapshot
    v0, p0 = plan.memo.s_tensor[0][:2]
    v1, p1 = plan.memo.s_tensor[1][:2]
    v2, p2 = plan.memo.s_tensor[2][:2]

    def raw() -> None:
        lx(*call)

    def reads_raw() -> None:
        (tx._version, tx.data_ptr(), ty._version, ty.data_ptr(), tz._version, tz.data_ptr())
        lx(*call)

    def check_raw() -> None:
        if ((k[v0] is None or (tx._version == k[v0] and tx.data_ptr() == k[p0]))
                and (k[v1] is None or (ty._version == k[v1] and ty.data_ptr() == k[p1]))
                and (k[v2] is None or (tz._version == k[v2] and tz.data_ptr() == k[p2]))):
            lx(*call)

    fns = {"raw cuLaunchKernelEx": raw,
           "typed call, DeviceBuffers": lambda: ks.five(n, x, y, z, pdev, 0.5),
           "typed call, torch tensors": lambda: ks.five(n, tx, ty, tz, pdev, 0.5),
           "6 torch reads + raw": reads_raw,
           "generated reuse check + raw": check_raw}
    before = [s[0] for s in plan._shared]
    out = interleaved_per_call_us(fns, calls=200, batches=60, sync=st.synchronize)
    after = [s[0] for s in plan._shared]
    base = out["raw cuLaunchKernelEx"]["median"]
    for name, r in out.items():
        print(f"{name:32s} {r['median']:6.2f} us  {r['median'] / base:5.2f}x  +{r['median'] - base:5.2f} us")
    print("torch snapshot kept through the timing:", any(s is tx for s in before) and any(s is tx for s in after))


if __name__ == "__main__":
    main()
