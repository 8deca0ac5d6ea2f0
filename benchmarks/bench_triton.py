"""Section "triton" (issue #30): Triton tutorial kernels compiled at build time by the hook (the
example wheel's crate ``tutorials`` when ``--site`` holds it, else tests/packages/triton_kernels_pkg built
here), against Triton's own JIT of the same source in the same run.

The family timed is the one whose variant has every pointer aligned (:func:`_family`): the example's
lock variant (``add_kernel__v<digest>``, a family of one), the test package's instance family
(``add_fp32``, with its ``__base`` twin). The kernel's own call (``kernels.add_kernel[grid](...,
BLOCK_SIZE=1024)``) is timed beside it.

- host cost per launch of the vector add (4 programs): the khal call ``k[grid](...)`` with the
  same tensors again (its memo's hit) vs raw ``cuLaunchKernel`` of the same cubin with a prepacked
  ``void**`` (bar <= 1.10x) and vs Triton's JIT launcher ``add_kernel[grid](...)`` (bar: at least 2x
  cheaper; the khal row's note and the JIT row both say it), torch tensors for all three; also
  eight tensor sets in turn (every call read, checked and packed), ``bind()``, int addresses and
  the variant's ``LaunchPlan.run`` given its values;
- kernel time, khal's cubin vs the JIT's compile of the same source and options (CUDA events; bar
  within 3%): vector add of 2^26 floats, fused softmax 4096x1024, matmul fp16 4096^3, and the matmul
  against ``torch.matmul`` (reported, no bar);
- cold start in fresh processes (the interpreter's own start not counted): ``import`` of the built
  package + first launch + synchronize, vs ``import torch, triton`` + first call with a warm Triton
  cache and with an empty one (bar: below both).
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from _common import ROOT, Row, build_test_package, guarded, interleaved_per_call_us

SECTION = "triton"
PKG = "khal_triton_kernels"
PROJ = ROOT / "tests" / "packages" / "triton_kernels_pkg"
SOURCES = PROJ / "kernels" / "triton"


def _family(K: Any, kernel: str, pointee: str) -> tuple[str, Any]:  # noqa: N803
    """The instance family of crate ``tutorials`` for ``kernel`` on ``pointee`` arrays whose variant
    assumes the most (every pointer aligned, where one does): (its name, the family)."""
    (crate,) = [c for c in K.manifest.crates if c.name == "tutorials"]
    fams = [e.triton for e in crate.entries if e.triton is not None and not e.triton.base
            and e.triton.kernel == kernel and e.triton.types[0] == pointee]
    if not fams:
        raise RuntimeError(f"crate tutorials has no variant of {kernel} on {pointee}")
    best = max(fams, key=lambda t: (len(t.divisible) + len(t.ones), t.family))
    return best.family, K.crates["tutorials"][best.family]


def _example() -> tuple[Any, Path, str] | None:
    """The example wheel's Triton crate (built by README command 1, on the site ``--site`` names)."""
    try:
        import example_shader_pkg
    except ImportError:
        return None
    if "tutorials" not in example_shader_pkg.kernels.crates:
        return None
    return example_shader_pkg.kernels, Path(example_shader_pkg.__file__).resolve().parent.parent, "example_shader_pkg"


def _build() -> tuple[Any, Path, str]:
    """tests/packages/triton_kernels_pkg built in-process by the hook's builder, imported."""
    kernels, site = build_test_package(PROJ, PKG)
    return kernels, site, PKG


def _tutorials() -> Any:
    sys.path.insert(0, str(SOURCES))
    try:
        return importlib.import_module("tutorials")  # the same source, through Triton's JIT
    finally:
        sys.path.pop(0)


def _event_us(fns: dict[str, Callable[[], Any]], per: int = 20, rounds: int = 15) -> dict[str, float]:
    """Median device time (us) of one call of each of ``fns``, by CUDA events around ``per`` calls,
    the methods in turns. The stream first sleeps on the GPU for longer than the host takes to
    enqueue the ``per`` calls (50 us each), so the events time the kernels back to back and not the
    launchers: a 1024^3 matmul runs shorter than Triton's JIT launcher takes to launch it."""
    import torch

    cycles = per * 100_000  # 50 us a call at 2 GHz (the H200 boosts to 1.98 GHz)

    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    for r in range(rounds):
        names = list(fns)[r % len(fns):] + list(fns)[: r % len(fns)]
        for name in names:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)
            a.record()
            for _ in range(per):
                fns[name]()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) * 1e3 / per)
    return {k: statistics.median(v) for k, v in times.items()}


COLD_KHAL = r"""
import time, sys
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import importlib
m = importlib.import_module(sys.argv[2])
from khal_runtime import DeviceBuffer
import numpy as np
n = 4096
x = DeviceBuffer.from_numpy(np.ones(n, np.float32)); y = DeviceBuffer.from_numpy(np.ones(n, np.float32))
o = DeviceBuffer.zeros(n, np.float32)
m.kernels.crates["tutorials"][sys.argv[3]][(n // 1024,)](x, y, o, n)
got = float(o.to_numpy()[0])
t1 = time.perf_counter()
import json; print(json.dumps({"ms": (t1 - t0) * 1e3, "ok": got == 2.0}))
"""

COLD_KHAL_TORCH = r"""
import time, sys
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import torch
import importlib
m = importlib.import_module(sys.argv[2])
from khal_runtime.device import as_stream
n = 4096
x, y = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
o = torch.zeros(n, device="cuda")
m.kernels.crates["tutorials"][sys.argv[3]][(n // 1024,)](x, y, o, n, stream=as_stream(torch.cuda.current_stream()))
got = float(o[0])
t1 = time.perf_counter()
import json; print(json.dumps({"ms": (t1 - t0) * 1e3, "ok": got == 2.0}))
"""

COLD_TRITON = r"""
import time, sys
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import torch, triton
import tutorials
n = 4096
x, y = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
o = torch.zeros(n, device="cuda")
tutorials.add_kernel[(n // 1024,)](x, y, o, n, BLOCK_SIZE=1024)
got = float(o[0])
t1 = time.perf_counter()
import json; print(json.dumps({"ms": (t1 - t0) * 1e3, "ok": got == 2.0}))
"""


def _fresh(code: str, arg: str, env: dict[str, str], pkg: str = "", family: str = "") -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", code, arg, pkg, family], capture_output=True, text=True, env=env,
                       timeout=300, check=False)
    if r.returncode:
        tail = (r.stderr or r.stdout).strip().splitlines()
        raise RuntimeError(tail[-1] if tail else f"exit {r.returncode}")
    got: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    if not got["ok"]:
        raise RuntimeError("the first launch gave a wrong result")
    return got


def _cuda_core_add(site: Path, pkg: str, symbol: str, st: Any, x: Any, y: Any, o: Any, n: int, bx: int,
                   shmem: int) -> Callable[[], Any]:
    """``launch()`` of the vector add's cubin through ``cuda.core`` on the runtime's stream, given
    the tensors' ``data_ptr()`` at every launch (what a cuda.core user writes)."""
    import numpy as np
    import torch

    try:
        from cuda.core import Device, LaunchConfig, ObjectCode, launch
    except ImportError:
        from cuda.core.experimental import Device, LaunchConfig, ObjectCode, launch  # type: ignore[no-redef]
    from khal_runtime.manifest import load_manifest

    man = load_manifest(site / pkg / "_khal" / "manifest.json")
    cc = "sm_{}{}".format(*torch.cuda.get_device_capability())
    arts = [a for c in man.crates for a in c.artifacts
            if a.kind == "cubin" and (a.arch == cc or a.arch == cc + "a") and any(e.symbol == symbol for e in c.entries)]
    if not arts:
        raise RuntimeError(f"no {cc} cubin holds {symbol}")
    kern = ObjectCode.from_cubin((site / pkg / arts[0].path).read_bytes()).get_kernel(symbol)
    dev = Device(torch.cuda.current_device())
    dev.set_current()
    cst = dev.create_stream(st)
    cfg = LaunchConfig(grid=n // 1024, block=bx, shmem_size=shmem)
    nn, zero = np.int32(n), np.uint64(0)
    launch(cst, cfg, kern, x.data_ptr(), y.data_ptr(), o.data_ptr(), nn, zero, zero)
    return lambda: launch(cst, cfg, kern, x.data_ptr(), y.data_ptr(), o.data_ptr(), nn, zero, zero)


def run(args: Any) -> list[Row]:
    import torch

    from khal_runtime.backends.cuda import driver as _cuda
    from khal_runtime.device import as_stream

    rows: list[Row] = []
    drv = _cuda.driver()
    K, site, pkg = _example() or _build()  # noqa: N806
    T = _tutorials()  # noqa: N806
    add_name, add_family = _family(K, "add_kernel", "*fp32")
    _, softmax_family = _family(K, "softmax_kernel", "*fp32")
    _, matmul_family = _family(K, "matmul_kernel", "*fp16")
    torch.cuda.init()
    st = as_stream(torch.cuda.current_stream())
    sync = torch.cuda.synchronize

    # -- host cost per launch ---------------------------------------------------------------------
    def launch_cost() -> None:
        n = 4096
        x, y, o = (torch.rand(n, device="cuda") for _ in range(3))
        add = add_family
        go = add[(n // 1024,)]
        go(x, y, o, n, stream=st)
        sync()
        variant = add.variants[0]
        assert add.chosen(x, y, o, n) == variant.entry.name
        plan = variant.plan(0)
        vals = [ctypes.c_uint64(x.data_ptr()), ctypes.c_uint64(y.data_ptr()), ctypes.c_uint64(o.data_ptr()),
                ctypes.c_int32(n), ctypes.c_uint64(0), ctypes.c_uint64(0)]  # + the two scratch pointers
        arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        f, cu, L, addr = plan.function, st.native, drv.cuLaunchKernel, ctypes.addressof(arr)
        bx, shmem = variant.entry.block_size[0], variant.entry.triton.shared
        jit = T.add_kernel[(n // 1024,)]
        jit(x, y, o, n, BLOCK_SIZE=1024)
        xp, yp, op = x.data_ptr(), y.data_ptr(), o.data_ptr()
        run = plan.run
        packed = (xp, yp, op, n, 0, 0)
        bound = add.bind(x, y, o, n, stream=st)
        g4 = (n // 1024,)
        # eight argument sets in turn, more than the call's memo slots: every call reads, checks,
        # chooses and packs (what a wrapper making its output tensor per call costs)
        sets = [tuple(torch.rand(n, device="cuda") for _ in range(3)) for _ in range(8)]
        turn = itertools.cycle(sets)
        fns = {"khal": lambda: go(x, y, o, n, stream=st),
               "khal_new": lambda: go(*next(turn), n, stream=st),
               "bound": lambda: bound(g4),
               "khal_int": lambda: go(xp, yp, op, n, stream=st),
               "plan_run": lambda: run(4, 1, 1, bx, 1, 1, shmem, st, packed),
               "raw": lambda: L(f, 4, 1, 1, bx, 1, 1, shmem, cu, addr, 0),
               "jit": lambda: jit(x, y, o, n, BLOCK_SIZE=1024),
               # Triton's idiom: the grid tuple and the size made anew on every call
               "khal_idiom": lambda: add[((x.numel() + 1023) // 1024,)](x, y, o, x.numel(), stream=st),
               "jit_idiom": lambda: T.add_kernel[((x.numel() + 1023) // 1024,)](x, y, o, x.numel(), BLOCK_SIZE=1024)}
        # the family as a torch operator (khal_runtime.torch.register), eager, on torch's stream
        def torch_op() -> Callable[[], Any]:
            import khal_runtime.torch as kt

            op = getattr(kt.register(K), add_name).default
            g = [n // 1024]
            op(g, x, y, o, n)
            return lambda: op(g, x, y, o, n)

        # the kernel's own call (kernels.add_kernel: Triton's call, keyword constexpr, the JIT's
        # specialisation choosing the variant), where the build recorded the kernel's signature
        from khal_runtime.triton_call import TritonFunction

        own_fn = getattr(K.crates["tutorials"], "add_kernel", None)
        if isinstance(own_fn, TritonFunction):
            own = own_fn[(n // 1024,)]
            own(x, y, o, n, BLOCK_SIZE=1024, stream=st)
            fns["khal_own"] = lambda: own(x, y, o, n, BLOCK_SIZE=1024, stream=st)
            fns["khal_own_idiom"] = lambda: own_fn[((x.numel() + 1023) // 1024,)](x, y, o, x.numel(), BLOCK_SIZE=1024)
        top = guarded(SECTION, "vector add: torch op", rows, torch_op)
        if top is not None:
            fns["torch_op"] = top
        # what a user of cuda.core writes for the same cubin: data_ptr() per launch, no checks (the
        # torch bar's comparison, DESIGN.md; the two scratch pointers as 0)
        cc = guarded(SECTION, "vector add: cuda.core.launch", rows,
                     lambda: _cuda_core_add(site, pkg, variant.entry.symbol, st, x, y, o, n, bx, shmem))
        if cc is not None:
            fns["cuda_core"] = cc
        got = interleaved_per_call_us(fns, calls=args.calls, batches=args.batches, sync=sync)
        raw, ours, theirs = got["raw"]["median"], got["khal"]["median"], got["jit"]["median"]
        rows.append(Row(SECTION, "vector add: raw cuLaunchKernel, void** prepacked", raw, "us/launch", 1.0, "raw"))
        rows.append(Row(SECTION, "vector add: khal k[grid](...), torch tensors (the same again)", ours, "us/launch",
                        ours / raw, "raw", "<= 1.10x raw", ours / raw <= 1.10,
                        f"min {got['khal']['min']:.2f}; Triton JIT / khal = {theirs / ours:.2f}x (bar >= 2x: "
                        f"{'met' if theirs / ours >= 2.0 else 'NOT met'})"))
        v = got["bound"]["median"]
        rows.append(Row(SECTION, "vector add: khal b = k.bind(...); b(grid)", v, "us/launch", v / raw, "raw",
                        "<= 1.10x raw", v / raw <= 1.10, f"min {got['bound']['min']:.2f}"))
        v = got["khal_new"]["median"]
        rows.append(Row(SECTION, "vector add: khal k[grid](...), 8 tensor sets in turn (no memo hit)", v, "us/launch",
                        v / raw, "raw", note=f"min {got['khal_new']['min']:.2f}; Triton JIT / this = "
                                             f"{theirs / v:.2f}x"))
        v, vj = got["khal_idiom"]["median"], got["jit_idiom"]["median"]
        rows.append(Row(SECTION, "vector add: khal k[(cdiv(n, B),)](..., x.numel()), grid and size new each call", v,
                        "us/launch", v / raw, "raw", note=f"min {got['khal_idiom']['min']:.2f}; the JIT called so: "
                                                          f"{vj:.2f} us, {vj / v:.2f}x this"))
        for key, label in (("khal_int", "vector add: khal k[grid](...), addresses as ints (no tensor reads)"),
                           ("plan_run", "vector add: the variant's LaunchPlan.run, values given (pack + launch)")):
            v = got[key]["median"]
            rows.append(Row(SECTION, label, v, "us/launch", v / raw, "raw", note=f"min {got[key]['min']:.2f}"))
        if "torch_op" in got:
            v = got["torch_op"]["median"]
            rows.append(Row(SECTION, f"vector add: torch.ops.<pkg>.{add_name}.default([4], x, y, o, n) eager", v,
                            "us/launch", v / raw, "raw", note=f"min {got['torch_op']['min']:.2f}; / khal typed call "
                                                              f"{v / ours:.2f}x; Triton JIT / this {theirs / v:.2f}x"))
        if "cuda_core" in got:
            v = got["cuda_core"]["median"]
            rows.append(Row(SECTION, "vector add: cuda.core.launch, torch tensors' data_ptr() per launch, no checks", v,
                            "us/launch", v / raw, "raw", note=f"min {got['cuda_core']['min']:.2f}; khal typed call "
                                                              f"(same tensors) / this = {ours / v:.2f}x"))
        if "khal_own" in got:
            v = got["khal_own"]["median"]
            cc_v = got["cuda_core"]["median"] if "cuda_core" in got else None
            rows.append(Row(SECTION, "vector add: khal kernels.add_kernel[grid](x, y, o, n, BLOCK_SIZE=1024), the "
                            "kernel's own call", v, "us/launch", v / cc_v if cc_v else v / raw,
                            "cuda_core" if cc_v else "raw", "<= 1.10x cuda.core" if cc_v else "",
                            (v / cc_v <= 1.10) if cc_v else None,
                            f"min {got['khal_own']['min']:.2f}; / the family's call {v / ours:.2f}x; Triton JIT / "
                            f"this {theirs / v:.2f}x"))
            v = got["khal_own_idiom"]["median"]
            rows.append(Row(SECTION, "vector add: kernels.add_kernel[(cdiv(n, B),)](..., x.numel(), BLOCK_SIZE=1024), "
                            "torch's stream", v, "us/launch", v / raw, "raw",
                            note=f"min {got['khal_own_idiom']['min']:.2f}; the JIT called so: {vj:.2f} us, "
                                 f"{vj / v:.2f}x this"))
        rows.append(Row(SECTION, "vector add: Triton JIT launcher", theirs, "us/launch", theirs / ours, "khal",
                        ">= 2x khal", theirs / ours >= 2.0, f"min {got['jit']['min']:.2f}"))

    guarded(SECTION, "launch cost", rows, launch_cost)

    # -- kernel time: the same source through khal's build and Triton's JIT -----------------------
    def kernel_time() -> None:
        n = 1 << 26
        x, y, o = (torch.rand(n, device="cuda") for _ in range(3))
        g = (n // 1024,)
        add = _event_us({"khal": lambda: add_family[g](x, y, o, n, stream=st),
                         "jit": lambda: T.add_kernel[g](x, y, o, n, BLOCK_SIZE=1024)})
        rows.append(Row(SECTION, "vector add 2^26 fp32: khal", add["khal"], "us", add["khal"] / add["jit"], "JIT",
                        "within 3% of JIT", abs(add["khal"] / add["jit"] - 1) <= 0.03))
        rows.append(Row(SECTION, "vector add 2^26 fp32: Triton JIT", add["jit"], "us", 1.0, "JIT"))

        rows_, cols = 65536, 1024  # 256 MB moved: the launchers' host cost (the JIT's ~20 us) stays hidden
        a = torch.randn(rows_, cols, device="cuda")
        b = torch.empty_like(a)
        sg = (rows_,)
        soft = _event_us({
            "khal": lambda: softmax_family[sg](b, a, a.stride(0), b.stride(0), rows_, cols, stream=st),
            "jit": lambda: T.softmax_kernel[sg](b, a, a.stride(0), b.stride(0), rows_, cols, BLOCK_SIZE=1024,
                                                num_warps=8),
            "torch": lambda: torch.softmax(a, dim=1)})
        rows.append(Row(SECTION, "softmax 65536x1024: khal", soft["khal"], "us", soft["khal"] / soft["jit"], "JIT",
                        "within 3% of JIT", abs(soft["khal"] / soft["jit"] - 1) <= 0.03,
                        f"chose {softmax_family.chosen(b, a, a.stride(0), b.stride(0), rows_, cols)}"))
        rows.append(Row(SECTION, "softmax 65536x1024: Triton JIT", soft["jit"], "us", 1.0, "JIT"))
        rows.append(Row(SECTION, "softmax 65536x1024: torch.softmax", soft["torch"], "us", soft["torch"] / soft["jit"],
                        "JIT", note="reported"))

        for m in (1024, 4096):
            A = torch.randn(m, m, device="cuda", dtype=torch.float16)  # noqa: N806
            B = torch.randn(m, m, device="cuda", dtype=torch.float16)  # noqa: N806
            C = torch.empty(m, m, device="cuda", dtype=torch.float16)  # noqa: N806
            grid = ((m // 64) * (m // 64),)
            mm = (A, B, C, m, m, m, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1))
            meta = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8, num_warps=4, num_stages=3)
            t = _event_us({"khal": lambda mm=mm, grid=grid: matmul_family[grid](*mm, stream=st),
                           "jit": lambda mm=mm, grid=grid: T.matmul_kernel[grid](*mm, **meta),
                           "torch": lambda A=A, B=B: torch.matmul(A, B)}, per=10 if m > 2048 else 20)
            fl = 2 * m ** 3 / 1e12
            rows.append(Row(SECTION, f"matmul fp16 {m}^3: khal", fl / (t["khal"] * 1e-6), "TFLOP/s",
                            t["khal"] / t["jit"], "JIT time", "time within 3% of JIT",
                            abs(t["khal"] / t["jit"] - 1) <= 0.03,
                            f"{t['khal']:.1f} us; chose {matmul_family.chosen(*mm)}"))
            rows.append(Row(SECTION, f"matmul fp16 {m}^3: Triton JIT", fl / (t["jit"] * 1e-6), "TFLOP/s", 1.0,
                            "JIT time", note=f"{t['jit']:.1f} us"))
            rows.append(Row(SECTION, f"matmul fp16 {m}^3: torch.matmul", fl / (t["torch"] * 1e-6), "TFLOP/s",
                            t["torch"] / t["jit"], "JIT time", note=f"{t['torch']:.1f} us (reported, no bar)"))

    guarded(SECTION, "kernel time", rows, kernel_time)

    # -- cold start -------------------------------------------------------------------------------
    def cold() -> None:
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as bench_load: time imports, not the bytecode compiler
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        warm_cache = tempfile.mkdtemp(prefix="khal-bench-triton-cache-")
        runs = 5
        for code, arg in ((COLD_KHAL, str(site)), (COLD_KHAL_TORCH, str(site))):
            _fresh(code, arg, env, pkg, add_name)  # bytecode written once, as for an installed wheel
        _fresh(COLD_TRITON, str(SOURCES), dict(env, TRITON_CACHE_DIR=warm_cache))
        figs: dict[str, list[float]] = {"khal": [], "khal_torch": [], "warm": [], "empty": []}
        for _ in range(runs):
            figs["khal"].append(_fresh(COLD_KHAL, str(site), env, pkg, add_name)["ms"])
            figs["khal_torch"].append(_fresh(COLD_KHAL_TORCH, str(site), env, pkg, add_name)["ms"])
            figs["warm"].append(_fresh(COLD_TRITON, str(SOURCES), dict(env, TRITON_CACHE_DIR=warm_cache))["ms"])
            empty = tempfile.mkdtemp(prefix="khal-bench-triton-empty-")
            figs["empty"].append(_fresh(COLD_TRITON, str(SOURCES), dict(env, TRITON_CACHE_DIR=empty))["ms"])
        med = {k: statistics.median(v) for k, v in figs.items()}
        best = min(med["warm"], med["empty"])
        rows.append(Row(SECTION, "cold: import torch, triton + first JIT call, warm Triton cache", med["warm"], "ms",
                        1.0, "warm JIT", note=f"median of {runs} fresh processes"))
        rows.append(Row(SECTION, "cold: import torch, triton + first JIT call, empty Triton cache", med["empty"],
                        "ms", med["empty"] / med["warm"], "warm JIT"))
        rows.append(Row(SECTION, f"cold: import {pkg} + first launch (DeviceBuffers, no torch)", med["khal"], "ms",
                        med["khal"] / med["warm"], "warm JIT", "below both", med["khal"] < best))
        rows.append(Row(SECTION, "cold: import torch + package + first launch (torch tensors)", med["khal_torch"],
                        "ms", med["khal_torch"] / med["warm"], "warm JIT", "below both", med["khal_torch"] < best))

    guarded(SECTION, "cold start", rows, cold)
    return rows
