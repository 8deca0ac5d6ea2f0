"""Section ``torch``: khal kernels as PyTorch operators (``khal_runtime.torch``), on the GPU.

1. Launch cost, host us per call (median of batches, the methods timed in turns): the 5-binding
   ``five`` kernel of the launch-bench crate with torch tensors (3 storages, the uniform as a
   uint8 CUDA tensor, one scalar) through (op) ``torch.ops.khal_bench_kernels.five(...)``,
   (op.default) the overload compiled code calls, (a) the typed call on the same stream (torch's
   current one), (a') the typed call given ``stream=torch.cuda.current_stream()``, and (c) raw
   ``cuLaunchKernel`` with a prepacked ``void**`` on that stream; a tiny torch op for scale; and
   what a torch user would otherwise write: an operator whose implementation launches the same
   kernel through ``cuda.core.launch`` with the tensors' ``data_ptr()`` on torch's current stream,
   made with (cc_op) ``torch.library.custom_op`` and (cc_lib) ``torch.library.Library.define`` +
   ``impl`` at the CUDA key (a fake impl beside it). Ratios to (c). Bars (issue #28): (op) <= 1.5x
   (a), and below (cc_op) and (cc_lib).
2. Graph replay, us per kernel (device-complete): a ``torch.cuda.graph`` holding 1000 khal ops
   vs the runtime's own ``capture_graph`` of the same 1000 typed launches (bar: <= 1.2x of it),
   and raw ``cuGraphLaunch`` of a graph of 1000 raw launches for scale.
3. A small ``torch.compile`` model step (a matmul, an elementwise ``a*h + b*g + s``, a sum), us
   per step (device-complete): torch only vs the elementwise step as the khal op, both compiled
   with ``fullgraph=True`` (inductor) and both eager. Bars (issue #28): compiled <= 1.05x the
   torch-only compiled step, eager <= 1.0x torch eager.

Skipped, saying why, without a usable GPU or without a CUDA build of torch. Standalone:
``python benchmarks/bench_torch.py``; in ``benchmarks/run.py`` as the section ``torch``.
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Row, device_complete_us, gpu_status, guarded, interleaved_per_call_us  # noqa: E402

SECTION = "torch"
N = 256  # one block: the kernel does (almost) nothing; the host cost is what is measured
STEP = 1000  # launches per captured graph


class BenchParams(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


def torch_unavailable() -> str | None:
    """None when torch can launch on a CUDA device here, else why not."""
    ok, why = gpu_status()
    if not ok:
        return f"no usable GPU: {why}"
    try:
        import torch
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has no CUDA"
    return None


class _RawStream:
    """A raw CUstream handle as cuda.core takes a stream (``__cuda_stream__``)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _cuda_core_ops(torch: Any, pkg: Any, tag: str) -> tuple[Any, Any]:
    """(custom_op, Library op) launching ``five`` through ``cuda.core.launch`` with ``data_ptr()``
    on torch's current stream: what a torch user writes without khal. Each looks its
    ``cuda.core`` stream up by torch's raw handle (made once per handle)."""
    import numpy as np
    from bench_launch import _cuda_core_api, _cuda_core_kernel

    Dev, LaunchConfig, launch = _cuda_core_api()
    cdev = Dev(torch.cuda.current_device())
    cdev.set_current()
    kern = _cuda_core_kernel(pkg, pkg.symbols["five"])
    bx = 256
    raw = torch._C._cuda_getCurrentRawStream
    streams: dict[int, Any] = {}
    configs: dict[int, Any] = {}
    f32 = np.float32

    def five(n: int, x: Any, y: Any, z: Any, p: Any, s: float) -> None:
        h = raw(x.get_device())
        st = streams.get(h)
        if st is None:
            st = streams[h] = cdev.create_stream(_RawStream(h))
        cfg = configs.get(n)
        if cfg is None:
            cfg = configs[n] = LaunchConfig(grid=(n + bx - 1) // bx, block=bx)
        c = np.uint64(x.numel())
        launch(st, cfg, kern, np.uint64(x.data_ptr()), c, np.uint64(y.data_ptr()), c, np.uint64(z.data_ptr()), c,
               np.uint64(p.data_ptr()), f32(s))

    schema = "(SymInt n, Tensor x, Tensor(a!) y, Tensor(b!) z, Tensor p, float s) -> ()"
    ns = f"khal_bench_cc_{tag}"
    cop = torch.library.custom_op(f"{ns}::five_custom_op", five, mutates_args=("y", "z"), schema=schema)
    cop.register_fake(lambda *a: None)
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define("five_library" + schema)
    lib.impl("five_library", five, "CUDA")
    torch.library.register_fake(f"{ns}::five_library", lambda *a: None, lib=lib)
    _keep.append((lib, cop, kern, streams))
    return getattr(torch.ops, ns).five_custom_op, getattr(torch.ops, ns).five_library


_keep: list[Any] = []


def _launch_rows(args: Any, torch: Any, ks: Any, ops: Any, drv: Any, pkg: Any = None) -> list[Row]:
    import khal_runtime.torch as kt

    rows: list[Row] = []
    n = N
    tx, ty, tz = (torch.zeros(n, dtype=torch.float32, device="cuda") for _ in range(3))
    p = BenchParams(2.0, 1.0)
    tp = kt.uniform(ops.five, p)
    op, op_default = ops.five, ops.five.default
    op(n, tx, ty, tz, tp, 0.5)  # loads, warms the runtime's memo
    torch.cuda.synchronize()
    dev = torch.cuda.current_device()
    handle = torch.cuda.current_stream().cuda_stream
    khal_stream = kt._streams[(dev, handle)]  # the runtime's Stream the op launches on
    torch_stream = torch.cuda.current_stream()
    plan = ks.five.plan(dev)
    vals = [ctypes.c_uint64(tx.data_ptr()), ctypes.c_uint64(n), ctypes.c_uint64(ty.data_ptr()), ctypes.c_uint64(n),
            ctypes.c_uint64(tz.data_ptr()), ctypes.c_uint64(n), ctypes.c_uint64(tp.data_ptr()), ctypes.c_float(0.5)]
    arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    addr = ctypes.addressof(arr)
    f, cu, L = plan.function, drv.CUstream(handle), drv.cuLaunchKernel
    bx = ks.five.block_size[0]
    gx = (n + bx - 1) // bx
    five = ks.five
    fns: dict[str, Callable[[], Any]] = {
        "c": lambda: L(f, gx, 1, 1, bx, 1, 1, 0, cu, addr, 0),
        "op": lambda: op(n, tx, ty, tz, tp, 0.5),
        "op_default": lambda: op_default(n, tx, ty, tz, tp, 0.5),
        "a": lambda: five(n, tx, ty, tz, tp, 0.5, stream=khal_stream),
        "a_torch_stream": lambda: five(n, tx, ty, tz, tp, 0.5, stream=torch_stream),
        "torch_add": lambda: tz.add_(1.0),
    }
    cc_why = ""
    if pkg is not None:
        try:
            cc_op, cc_lib = _cuda_core_ops(torch, pkg, str(id(ops)))
            cc_op(n, tx, ty, tz, tp, 0.5)
            cc_lib(n, tx, ty, tz, tp, 0.5)
            torch.cuda.synchronize()
            fns["cc_op"] = lambda: cc_op(n, tx, ty, tz, tp, 0.5)
            fns["cc_lib"] = lambda: cc_lib(n, tx, ty, tz, tp, 0.5)
        except Exception as exc:  # noqa: BLE001 - cuda.core missing or too old: say so in the table
            cc_why = f"{type(exc).__name__}: {exc}"[:200]
    res = interleaved_per_call_us(fns, calls=args.calls, batches=args.batches, sync=torch.cuda.synchronize)
    raw = res["c"]["median"]
    labels = {
        "c": ("(c) raw cuLaunchKernel, prepacked void**, torch's stream", ""),
        "op": ("(op) torch.ops.khal_bench_kernels.five(...) eager", ""),
        "op_default": ("(op.default) the overload compiled code calls", ""),
        "a": ("(a) typed call on torch's stream", "same tensors, uniform tensor, same stream"),
        "a_torch_stream": ("(a') typed call, stream=torch.cuda.current_stream()", ""),
        "torch_add": ("(info) a tiny torch op: tz.add_(1.0)", "PyTorch's own dispatch, for scale"),
        "cc_op": ("(cc_op) torch.library.custom_op launching through cuda.core, data_ptr()",
                  "what a torch user writes without khal"),
        "cc_lib": ("(cc_lib) Library.define + impl(CUDA) launching through cuda.core, data_ptr()",
                   "the same, registered at the CUDA key"),
    }
    for key, (label, note) in labels.items():
        if key not in res:
            rows.append(Row(SECTION, label, note=f"ERROR: not measured: {cc_why or 'no bench package'}"))
            continue
        r = res[key]
        rows.append(Row(SECTION, label, r["median"], "us/launch", r["median"] / raw, "(c)", note=note,
                        extra={"min": r["min"], "max": r["max"]}))
    op = res["op"]["median"]
    op_ratio = op / res["a"]["median"]
    rows.append(Row(SECTION, "(op) / (a): the operator's dispatch on top of the typed call", None, "",
                    op_ratio, "(a)", "<= 1.5x", op_ratio <= 1.5,
                    note=f"+{op - res['a']['median']:.2f} us per call"))
    for key, what in (("cc_op", "custom_op + cuda.core"), ("cc_lib", "Library + cuda.core")):
        if key in res:
            ratio = op / res[key]["median"]
            rows.append(Row(SECTION, f"(op) / ({key}): khal's op vs {what}", None, "", ratio, f"({key})",
                            "< 1.0x", ratio < 1.0))
    return rows


def _graph_rows(args: Any, torch: Any, ks: Any, ops: Any, drv: Any) -> list[Row]:
    import khal_runtime
    import khal_runtime.torch as kt
    from khal_runtime.backends.cuda.driver import check

    rows: list[Row] = []
    n = N
    tx, ty, tz = (torch.zeros(n, dtype=torch.float32, device="cuda") for _ in range(3))
    tp = kt.uniform(ops.five, BenchParams(2.0, 1.0))
    reps = max(5, args.batches // 3)
    st = khal_runtime.Device(0).default_stream
    five, op = ks.five, ops.five

    def typed_step(stream: Any) -> None:
        for _ in range(STEP):
            five(n, tx, ty, tz, tp, 0.5, stream=stream)

    def op_step() -> None:
        for _ in range(STEP):
            op(n, tx, ty, tz, tp, 0.5)

    typed_step(st)
    op_step()
    torch.cuda.synchronize()
    st.synchronize()

    def khal_graph() -> float:
        g = khal_runtime.capture_graph(typed_step, st, stream=st)
        g.upload(st)
        try:
            return device_complete_us(lambda: g.launch(st), st.synchronize, reps, STEP)
        finally:
            g.close()

    def torch_graph() -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            op_step()  # warm-up on the capture's kind of stream, as torch.cuda.graph asks
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            op_step()
        g.replay()
        torch.cuda.synchronize()
        return device_complete_us(g.replay, torch.cuda.synchronize, reps, STEP)

    def raw_graph() -> float:
        plan = five.plan(0)
        vals = [ctypes.c_uint64(tx.data_ptr()), ctypes.c_uint64(n), ctypes.c_uint64(ty.data_ptr()),
                ctypes.c_uint64(n), ctypes.c_uint64(tz.data_ptr()), ctypes.c_uint64(n),
                ctypes.c_uint64(tp.data_ptr()), ctypes.c_float(0.5)]
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
            return device_complete_us(lambda: drv.cuGraphLaunch(ex, st.native), st.synchronize, reps, STEP)
        finally:
            drv.cuGraphExecDestroy(ex)
            drv.cuGraphDestroy(g)

    kg = guarded(SECTION, "khal capture_graph replay", rows, khal_graph)
    tg = guarded(SECTION, "torch.cuda.graph of khal ops, replay", rows, torch_graph)
    rg = guarded(SECTION, "raw cuGraphLaunch", rows, raw_graph)
    direct_op = guarded(SECTION, "1000 eager khal ops", rows,
                        lambda: device_complete_us(op_step, torch.cuda.synchronize, reps, STEP))
    if kg is not None:
        rows.append(Row(SECTION, f"khal capture_graph replay ({STEP} launches)", kg, "us/kernel",
                        kg / rg if rg else None, "raw graph"))
    if tg is not None:
        rows.append(Row(SECTION, f"torch.cuda.graph of {STEP} khal ops, replay", tg, "us/kernel",
                        tg / kg if kg else None, "khal graph", "<= 1.2x khal graph",
                        (tg / kg <= 1.2) if kg else None))
    if rg is not None:
        rows.append(Row(SECTION, f"raw cuGraphLaunch ({STEP} raw launches)", rg, "us/kernel", 1.0, "raw graph"))
    if direct_op is not None:
        rows.append(Row(SECTION, f"{STEP} eager khal ops (no graph)", direct_op, "us/kernel",
                        direct_op / tg if tg else None, "torch graph",
                        note=f"graph speed-up {direct_op / tg:.1f}x" if tg else ""))
    return rows


def _compile_rows(args: Any, torch: Any, ks: Any, ops: Any) -> list[Row]:
    import khal_runtime.torch as kt

    rows: list[Row] = []
    m, k = 1024, 1024
    n = m * k
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(k, k, device="cuda") / k ** 0.5
    g = torch.randn(m, k, device="cuda")
    z = torch.empty(m, k, device="cuda")
    p = BenchParams(2.0, 1.0)
    tp = kt.uniform(ops.five, p)
    five = ops.five

    def step_torch(x: Any, w: Any, g: Any, z: Any) -> Any:
        h = x @ w
        z.copy_(2.0 * h + 1.0 * g + 0.5)
        return z.sum()

    def step_khal(x: Any, w: Any, g: Any, z: Any) -> Any:
        h = x @ w
        five(n, h, g, z, tp, 0.5)  # z = a h + b g + s
        return z.sum()

    torch._dynamo.reset()
    steps: dict[str, Callable[..., Any]] = {"torch eager": step_torch, "khal eager": step_khal}
    for name, fn in (("torch compiled", step_torch), ("khal compiled", step_khal)):
        steps[name] = torch.compile(fn, fullgraph=True)
        steps[name](x, w, g, z)  # compile
    # device-complete steps, the four in turns (these steps are host-bound: timed one after the
    # other, 30 steps each, the compiled ratio swung from 1.12x to 2.09x between two runs)
    samples: dict[str, list[float]] = {name: [] for name in steps}
    sync = torch.cuda.synchronize
    for r in range(max(300, args.batches * 5)):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn(x, w, g, z)
            sync()
            if r >= 10:
                samples[name].append((time.perf_counter() - t0) * 1e6)
    results = {name: statistics.median(v) for name, v in samples.items()}
    want = step_torch(x, w, g, z.clone())
    got = step_khal(x, w, g, z)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-2)  # same step, same answer
    bars = {"khal compiled": 1.05, "khal eager": 1.0}  # issue #28
    for name in ("torch eager", "khal eager", "torch compiled", "khal compiled"):
        ref = "torch compiled" if "compiled" in name else "torch eager"
        ratio = results[name] / results[ref]
        bar = bars.get(name)
        rows.append(Row(SECTION, f"model step, {name} ({m}x{k} matmul + elementwise + sum)", results[name],
                        "us/step", ratio, ref, f"<= {bar}x" if bar else "", ratio <= bar if bar else None,
                        note="fullgraph=True, inductor" if "compiled" in name else ""))
    return rows


def run(args: Any) -> list[Row]:
    why = torch_unavailable()
    if why is not None:
        return [Row(SECTION, "(section skipped)", note=why)]
    import torch

    import khal_runtime.torch as kt
    from _common import build_bench_package, import_bench_package
    from khal_runtime.backends.cuda import driver as _cuda

    drv = _cuda.driver()
    pkg = build_bench_package()
    ks = import_bench_package(pkg).kernels
    ops = kt.register(ks)
    torch.cuda.set_device(0)
    rows: list[Row] = []
    rows += guarded(SECTION, "launch cost", rows, lambda: _launch_rows(args, torch, ks, ops, drv, pkg)) or []
    rows += guarded(SECTION, "graph replay", rows, lambda: _graph_rows(args, torch, ks, ops, drv)) or []
    rows += guarded(SECTION, "torch.compile model step", rows, lambda: _compile_rows(args, torch, ks, ops)) or []
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="launches per timed batch")
    ap.add_argument("--batches", type=int, default=60, help="timed batches (median taken)")
    args = ap.parse_args(argv)
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(1, root)
    from run import table

    rows = run(args)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
