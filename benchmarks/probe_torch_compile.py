"""Probe (not a section): where the ``torch.compile``d model step with the khal op spends its time
against the same step written in torch alone (issue #28's 1.05x bar).

For each of the two steps of ``bench_torch`` (a 1024x1024 matmul, the elementwise ``a*h + b*g + s``
as torch code or as the khal op, a sum), compiled with ``fullgraph=True``: the median device-complete
step time over many reps, the median host time to enqueue one step (no sync), the code Inductor
generated (written to ``$OUT/compiled_<name>.py`` when ``OUT`` is set), and a profiler table of ten
steps (CPU and CUDA time per op). Run on the GPU machine: ``python benchmarks/probe_torch_compile.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import torch
    from torch._inductor.utils import run_and_get_code

    import khal_runtime.torch as kt
    from _common import build_bench_package, import_bench_package
    from bench_torch import BenchParams

    ks = import_bench_package(build_bench_package()).kernels
    ops = kt.register(ks)
    m = k = 1024
    n = m * k
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(k, k, device="cuda") / k ** 0.5
    g = torch.randn(m, k, device="cuda")
    z = torch.empty(m, k, device="cuda")
    tp = kt.uniform(ops.five, BenchParams(2.0, 1.0))
    five = ops.five

    def step_torch(x, w, g, z):  # type: ignore[no-untyped-def]
        h = x @ w
        z.copy_(2.0 * h + 1.0 * g + 0.5)
        return z.sum()

    def step_khal(x, w, g, z):  # type: ignore[no-untyped-def]
        h = x @ w
        five(n, h, g, z, tp, 0.5)
        return z.sum()

    out = os.environ.get("OUT")
    fns = {"torch eager": step_torch, "khal eager": step_khal}
    for name, fn in (("torch compiled", step_torch), ("khal compiled", step_khal)):
        c = torch.compile(fn, fullgraph=True)
        _, codes = run_and_get_code(c, x, w, g, z)
        if out:
            Path(out, f"compiled_{name.split()[0]}.py").write_text("\n\n# ----\n".join(codes))
        print(f"{name}: {len(codes)} generated module(s); copy_ in code: {any('copy_(' in s for s in codes)}; "
              f"extern calls: {sum(s.count('torch.ops.') for s in codes)}")
        fns[name] = c
    sync = torch.cuda.synchronize
    for fn in fns.values():
        for _ in range(20):
            fn(x, w, g, z)
    sync()
    full: dict[str, list[float]] = {name: [] for name in fns}
    host: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(300):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(x, w, g, z)
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            host[name].append((t1 - t0) * 1e6)
            full[name].append((t2 - t0) * 1e6)
    print(f"{'step':<16} {'device-complete us':>20} {'host enqueue us':>16}")
    for name in fns:
        print(f"{name:<16} {statistics.median(full[name]):>20.1f} {statistics.median(host[name]):>16.1f}")
    # the op alone, host time per call (interleaved): what the compiled step pays for it
    from _common import interleaved_per_call_us

    from khal_runtime.device import as_stream

    st = as_stream(torch.cuda.current_stream())
    params = BenchParams(2.0, 1.0)
    h0 = x @ w
    default = torch.ops.khal_bench_kernels.five.default
    only_op = torch.compile(lambda h, g, z: five(n, h, g, z, tp, 0.5), fullgraph=True)
    only_pw = torch.compile(lambda h, g, z: z.copy_(2.0 * h + 1.0 * g + 0.5), fullgraph=True)
    fresh = [torch.empty_like(h0) for _ in range(4)]
    turn = iter(lambda: fresh[int(time.perf_counter_ns()) & 3], None)
    parts = {
        "typed call, same h": lambda: ks.five(n, h0, g, z, params, 0.5, stream=st),
        "op.default, same h": lambda: default(n, h0, g, z, tp, 0.5),
        "op.default, h in turn (4)": lambda: default(n, next(turn), g, z, tp, 0.5),
        "compiled: the op alone, same h": lambda: only_op(h0, g, z),
        "compiled: torch pointwise, same h": lambda: only_pw(h0, g, z),
        "empty_like alone": lambda: torch.empty_like(h0),
    }
    got = interleaved_per_call_us(parts, calls=100, batches=30, sync=sync)
    print(f"\n{'the op alone':<40} {'host us/call':>12}")
    for name, v in got.items():
        print(f"{name:<40} {v['median']:>12.2f}")

    from torch.profiler import ProfilerActivity, profile

    for name in ("torch compiled", "khal compiled"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fns[name](x, w, g, z)
            sync()
        print(f"\n== {name}: profiler, 10 steps")
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=18, max_name_column_width=60))


if __name__ == "__main__":
    main()
