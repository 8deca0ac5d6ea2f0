"""Where the host time of a khal launch goes (run by hand on a GPU machine; not a test)."""

from __future__ import annotations

import cProfile
import ctypes
import pstats
import sys
import tempfile
import timeit
from pathlib import Path

import numpy as np

import khal_runtime
from khal_runtime import Device, DeviceBuffer
from tests.helpers.synthetic import build_package


class P(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


def per_call(fn, k: int = 20000) -> float:
    fn()
    return min(timeit.repeat(fn, number=k, repeat=5)) / k * 1e6


def main() -> None:
    from cuda.bindings import driver

    pkg = build_package(Path(tempfile.mkdtemp()), "prof_pkg")
    ks = khal_runtime.load(pkg.package_dir)
    n = 1024
    x, y = DeviceBuffer.alloc(n, np.float32), DeviceBuffer.alloc(n, np.float32)
    p = P(1, 1)
    s = Device(0).default_stream
    ks.axpby(n, x, y, p, 0.0)
    s.synchronize()
    plan = ks.axpby.plan(0)
    up = plan.uniforms.fetch(bytes(p), s)
    vals = [ctypes.c_uint64(x.ptr), ctypes.c_uint64(n), ctypes.c_uint64(y.ptr), ctypes.c_uint64(n),
            ctypes.c_uint64(up), ctypes.c_float(0.0)]
    arr = (ctypes.c_void_p * 6)(*[ctypes.addressof(v) for v in vals])
    addr = ctypes.addressof(arr)
    f, cu, L = plan.function, s._cu, driver.cuLaunchKernel
    args = (x, y, p, 0.0)
    run = plan.run
    rows = {
        "raw cuLaunchKernel": lambda: L(f, 4, 1, 1, 256, 1, 1, 0, cu, addr, 0),
        "plan.run": lambda: run(4, 1, 1, 256, 1, 1, 0, s, args),
        "ks.axpby": lambda: ks.axpby(n, x, y, p, 0.0),
        "ks.axpby bytes uniform": lambda: ks.axpby(n, x, y, bytes(p), 0.0),
        "python noop": lambda: None,
        "bytes(p)": lambda: bytes(p),
        "pack_into": lambda: plan.struct.pack_into(plan._tls.s[0], 0, 1, 2, 3, 4, 5, 0.5),
    }
    for name, fn in rows.items():
        us = per_call(fn)
        s.synchronize()
        print(f"{name:28s} {us:7.2f} us")
    e = plan.uniforms.entries.get(bytes(p))
    print("uniform entry:", e.ptr, e.pending, e.stream)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20000):
        ks.axpby(n, x, y, p, 0.0)
    pr.disable()
    s.synchronize()
    pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
