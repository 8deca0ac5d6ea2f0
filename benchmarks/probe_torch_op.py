"""Probe (not a section): what one eager ``torch.ops.<pkg>.five.default`` call costs when its
tensors change between calls (a compiled graph's intermediates, a model's activations), against
the same tensors every call: host us per call, then a cProfile of the changing case. Run on the
GPU machine: ``python benchmarks/probe_torch_op.py``."""

from __future__ import annotations

import cProfile
import itertools
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch

    import khal_runtime.torch as kt
    from _common import build_bench_package, import_bench_package, interleaved_per_call_us
    from bench_torch import BenchParams

    ks = import_bench_package(build_bench_package()).kernels
    kt.register(ks)
    n = 1 << 16
    g, z = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    tp = kt.uniform(torch.ops.khal_bench_kernels.five, BenchParams(2.0, 1.0))
    op = torch.ops.khal_bench_kernels.five.default
    hs = [torch.randn(n, device="cuda") for _ in range(8)]
    c2, c4, c8 = itertools.cycle(hs[:2]), itertools.cycle(hs[:4]), itertools.cycle(hs)
    fns = {"same h": lambda: op(n, hs[0], g, z, tp, 0.5),
           "h in turn of 2": lambda: op(n, next(c2), g, z, tp, 0.5),
           "h in turn of 4": lambda: op(n, next(c4), g, z, tp, 0.5),
           "h in turn of 8": lambda: op(n, next(c8), g, z, tp, 0.5),
           "a new h each call": lambda: op(n, torch.empty(n, device="cuda"), g, z, tp, 0.5)}
    got = interleaved_per_call_us(fns, calls=100, batches=20, sync=torch.cuda.synchronize)
    for name, v in got.items():
        print(f"{name:<24} {v['median']:8.2f} us/call")
    for name in ("h in turn of 4", "a new h each call"):
        fn = fns[name]
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        print(f"\n== cProfile, {name}, 2000 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
