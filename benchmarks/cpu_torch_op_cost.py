"""Host cost of a khal torch operator's CUDA kernel (``khal_runtime.torch``) with REAL torch
tensors, on CPU: the driver is a no-op (``cpu_launch_cost``), the tensors are plain CPU
``torch.Tensor`` objects that this script makes read as CUDA tensors of device 0
(``torch.Tensor.is_cuda`` / ``get_device`` patched on the class, in this process only).

Rows, timed in turns (``_common.interleaved_per_call_us``), for the operator's kernel at the
``CUDA`` key (called directly: the dispatcher before it costs the same on every row) and the
typed call under it: the same tensors every call, the first tensor one of four in turn, one of
64 in turn (a new object every call, without an allocation), a new ``torch.empty`` every call
(what a compiled graph hands the op), and the allocation alone; the typed call with the same
inference tensors (made under ``torch.inference_mode()``: no version counter). Then the time of single
attribute reads on a real tensor, and a cProfile of the op with a new tensor every call and
with four sets in turn::

    PYTHONPATH=. /tmp/torchvenv/bin/python benchmarks/cpu_torch_op_cost.py [--no-profile]
"""

from __future__ import annotations

import cProfile
import ctypes
import itertools
import pstats
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class BenchParams(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


def attribute_reads(torch: Any) -> dict[str, float]:
    """us per read of one attribute of a plain (unpatched) CPU tensor."""
    t = torch.zeros(1024)
    out = {}
    for stmt in ("t.untyped_storage()", "t._version", "t.data_ptr()", "t.is_contiguous()", "t.dtype",
                 "t.get_device()", "t.is_inference()", "t.is_cuda", "t.numel()"):
        out[stmt] = min(timeit.repeat(stmt, globals={"t": t}, number=100_000, repeat=5)) / 100_000 * 1e6
    out["torch.empty(1024)"] = min(timeit.repeat("torch.empty(1024)", globals={"torch": torch},
                                                 number=20_000, repeat=5)) / 20_000 * 1e6
    return out


def setup() -> tuple[Any, Any, Any, Any]:
    """(torch, the five-argument op's CUDA kernel, the typed call, the stream)."""
    import torch
    from cpu_launch_cost import make_kernels

    import khal_runtime.torch as kt
    from khal_runtime.backends import cuda

    _, five, st, _ = make_kernels()
    kt._torch()
    torch.Tensor.is_cuda = property(lambda self: True)  # type: ignore[assignment,method-assign]
    torch.Tensor.get_device = lambda self: 0  # type: ignore[assignment,method-assign]
    handle = int(st.handle) if hasattr(st, "handle") else 0x1234
    kt._raw_stream = {0: handle}.__getitem__  # a C call, as torch._C._cuda_getCurrentRawStream is
    kt._streams[(0, handle)] = st
    spec = kt._spec(torch, "khal_cpu_bench", "five", five)
    spec.crate_kernels = SimpleNamespace(_modules={0: "module"}, backend=cuda.BACKEND)
    return torch, kt._make_cuda_impl(spec), five, st


def rows(torch: Any, op: Any, five: Any, st: Any) -> dict[str, Callable[[], Any]]:
    n = 1 << 10
    g, z = torch.randn(n), torch.empty(n)
    tp = torch.frombuffer(bytearray(bytes(BenchParams(2.0, 1.0))), dtype=torch.uint8).clone()
    hs = [torch.randn(n) for _ in range(64)]
    with torch.inference_mode():  # serving code's tensors: no version counter (#38 item 19)
        ih, ig, iz = torch.randn(n), torch.randn(n), torch.empty(n)
    c4, c64 = itertools.cycle(hs[:4]), itertools.cycle(hs)
    t4, t64 = itertools.cycle(hs[:4]), itertools.cycle(hs)
    empty = torch.empty
    p = BenchParams(2.0, 1.0)
    return {
        "op: same tensors": lambda: op(n, hs[0], g, z, tp, 0.5),
        "op: h one of 4 in turn": lambda: op(n, next(c4), g, z, tp, 0.5),
        "op: h one of 64 in turn": lambda: op(n, next(c64), g, z, tp, 0.5),
        "op: a new h each call (torch.empty)": lambda: op(n, empty(n), g, z, tp, 0.5),
        "torch.empty alone": lambda: empty(n),
        "typed: same tensors": lambda: five(n, hs[0], g, z, p, 0.5, stream=st),
        "typed: h one of 4 in turn": lambda: five(n, next(t4), g, z, p, 0.5, stream=st),
        "typed: h one of 64 in turn": lambda: five(n, next(t64), g, z, p, 0.5, stream=st),
        "typed: same inference tensors": lambda: five(n, ih, ig, iz, p, 0.5, stream=st),
    }


def profile(fn: Callable[[], Any], title: str, calls: int = 20_000, top: int = 14) -> None:
    for _ in range(200):
        fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    print(f"\n== cProfile, {title}, {calls} calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> None:
    import torch

    from _common import interleaved_per_call_us

    print("attribute reads of a plain CPU tensor (us):")
    for k, v in attribute_reads(torch).items():
        print(f"  {k:24s} {v:6.3f}")
    torch, op, five, st = setup()
    fns = rows(torch, op, five, st)
    got = interleaved_per_call_us(fns, calls=2000, batches=15)
    print("\nper call (us, median of 15 interleaved batches of 2000):")
    for name, v in got.items():
        print(f"  {name:40s} {v['median']:7.2f}   (min {v['min']:.2f})")
    if "--no-profile" not in sys.argv:
        profile(fns["op: h one of 64 in turn"], "op, h one of 64 in turn")
        profile(fns["op: h one of 4 in turn"], "op, h one of 4 in turn")


if __name__ == "__main__":
    main()
