"""Python-side host cost of a khal launch, on CPU: the driver call is a no-op.

On the GPU the real ``cuLaunchKernel`` adds a roughly constant few microseconds;
everything else khal does per launch is plain Python and shows here. Used by
``bench_launch`` (section ``pycost``) and runnable by itself::

    python benchmarks/cpu_launch_cost.py

The ``triton`` rows are a Triton family's call (``k[grid](...)`` / ``k.launch``): the same
argument objects again (its memo's hit), eight argument sets in turn and a callable grid (every
call read, checked, chosen and packed), and its bound launch.

The second table (:func:`measure_triton`) times, interleaved (rounds in a shuffled order, the best
round of each kept), what ``bench_triton``'s launch-cost section times on the H200, against the
CUDA C++ typed call and bound launch of a comparable entry (five parameters, six ABI slots as the
Triton add's six): the Triton call repeating the same tensors / int addresses with ``stream=``
given, ``bind()`` then ``b(grid)``, the variant's ``LaunchPlan.run`` with its values given.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class BenchParams(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


class _NoopDriver:
    """Stands in for cuda.bindings.driver: cuLaunchKernel returns success at once."""

    class CUstream(int):
        pass

    _OK = (0,)

    def cuLaunchKernel(self, *a: Any) -> tuple[int]:  # noqa: N802
        return self._OK

    class CUlaunchConfig:  # noqa: N801
        pass

    def cuLaunchKernelEx(self, *a: Any) -> tuple[int]:  # noqa: N802
        return self._OK


def _fake_torch_type(versioned: bool = True) -> type:
    """A torch.Tensor look-alike; ``versioned``: with ``_version`` and ``untyped_storage()``,
    as real tensors have (the typed call then memoises it), else read on every launch (as a
    real inference tensor is)."""

    class Tensor:  # what the extractor cache sees as torch: module "torch", data_ptr/is_cuda
        __slots__ = ("_p", "_n", "dtype") + (("_version",) if versioned else ())
        is_cuda = True

        def __init__(self, p: int, n: int) -> None:
            self._p, self._n, self.dtype = p, n, _FakeTorchDtype()
            if versioned:
                self._version = 0

        def untyped_storage(self) -> object:
            return self

        def is_inference(self) -> bool:
            return False

        def get_device(self) -> int:
            return 0

        def is_contiguous(self) -> bool:
            return True

        def data_ptr(self) -> int:
            return self._p

        def numel(self) -> int:
            return self._n

    Tensor.__module__ = "torch"
    return Tensor


class _FakeTorchDtype:
    __module__ = "torch"
    itemsize = 4

    def __str__(self) -> str:
        return "torch.float32"

    def __hash__(self) -> int:
        return 1234

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FakeTorchDtype)


def _fake_cupy_type() -> type:
    import numpy as np

    class ndarray:  # noqa: N801
        __slots__ = ("data", "size", "dtype", "_c_contiguous", "device")

        def __init__(self, p: int, n: int) -> None:
            self.data = SimpleNamespace(ptr=p)
            self.size = n
            self.dtype = np.dtype(np.float32)
            self._c_contiguous = True
            self.device = SimpleNamespace(id=0)

    ndarray.__module__ = "cupy"
    return ndarray


def _entry(name: str, params: list[tuple[str, str]], block: tuple[int, int, int] = (256, 1, 1),
           grid_dims: int = 1) -> Any:
    from khal_runtime.manifest import Entry, Param, symbol_for

    ps = []
    for pname, kind in params:
        if kind == "storage":
            ps.append(Param(name=pname, kind="storage", element_type="float32", element_size=4,
                            element_align=4, shape="slice", writable=True))
        elif kind == "uniform":
            ps.append(Param(name=pname, kind="uniform", element_type="BenchParams", element_size=8,
                            element_align=4))
        else:
            ps.append(Param(name=pname, kind="scalar", element_type="float32", element_size=4,
                            element_align=4))
    h = "0123456789abcdef"
    return Entry(name=name, symbol=symbol_for(name, h), hash=h, block_size=block, params=tuple(ps),
                 grid_dims=grid_dims)


class _Uniforms:
    def __init__(self) -> None:
        from khal_runtime.backends.cuda.uniform_cache import Upload

        self.entries: dict[bytes, Any] = {}
        self._upload = Upload

    def fetch(self, data: bytes, stream: Any) -> int:
        e = self.entries.setdefault(bytes(data), self._upload(0xD000_0000, None, 0, None))
        return int(e.ptr)


def make_kernels() -> tuple[Any, ...]:
    """(empty1 kernel, five-binding kernel, stream, the five-binding kernel as a 2-D entry)
    wired to a no-op driver, device 0."""
    from khal_runtime.backends import cuda
    from khal_runtime.backends.cuda import driver
    from khal_runtime.backends.cuda.launch import LaunchPlan
    from khal_runtime.device import Stream, _tls
    from khal_runtime.kernels import Kernel

    driver._driver = _NoopDriver()  # type: ignore[assignment]
    st = Stream(0x1234, 0, native=0x1234, backend=cuda.BACKEND)
    _tls.stream = st
    _tls.dev = 0
    _tls.ready = st
    # the crate stand-in: its backend already chosen (Kernel._stream reads `_backend`)
    runtime = SimpleNamespace(name="bench", backend=cuda.BACKEND, _backend=cuda.BACKEND)
    out = []
    five = [("x", "storage"), ("y", "storage"), ("z", "storage"), ("p", "uniform"), ("s", "scalar")]
    for name, params, block, dims in (("empty1", [("x", "storage")], (256, 1, 1), 1),
                                      ("five", five, (256, 1, 1), 1), ("five2d", five, (16, 16, 1), 2)):
        e = _entry(name, params, block, dims)
        k = Kernel(runtime, e)  # type: ignore[arg-type]
        plan = LaunchPlan(e, "bench", 0, object(), _Uniforms(), kernel=k)  # type: ignore[arg-type]
        k._plans[0] = plan
        if dims == 1:  # as Kernel.plan(): 2-D / 3-D entries keep the generic call
            k.adopt(plan, ())
        out.append(k)
    return out[0], out[1], st, out[2]


def make_triton_kernel(configs: int = 0) -> Any:
    """A Triton family (``add`` over x, y, out: ``*fp32:16``, n: ``i32:16``, and its ``__base``
    twin) over two Kernels wired to the no-op driver, as :func:`make_kernels` wires them.
    ``configs``: an autotuned family of that many configs (each with its twin; key ``n``; the
    crate's rule picks the last, so that no timing is needed on the no-op driver)."""
    from khal_runtime.backends import cuda
    from khal_runtime.backends.cuda.launch import LaunchPlan
    from khal_runtime.kernels import Kernel
    from khal_runtime.manifest import Entry, Param, TritonFacts, symbol_for
    from khal_runtime.triton import TritonKernel

    runtime = SimpleNamespace(name="bench", backend=cuda.BACKEND, _backend=cuda.BACKEND)
    u64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
    params = (*(Param(name=n, **u64) for n in ("x", "y", "out")),  # type: ignore[arg-type]
              Param(name="n", kind="scalar", element_type="int32", element_size=4, element_align=4),
              *(Param(name=n, **u64) for n in ("khal_global_scratch", "khal_profile_scratch")))  # type: ignore[arg-type]
    variants = []
    tune: list[dict[str, Any]] = [{}] if not configs else [
        {"config": j, "autotune_key": ("n",), "choose": configs - 1} for j in range(configs)]
    for name, divisible, t in ((f"add{'__c' + str(t['config']) if t else ''}{base}", div, t)
                               for t in tune for base, div in (("", ("x", "y", "out", "n")), ("__base", ()))):
        facts = TritonFacts(kernel="add_kernel", family="add", base=not divisible, num_warps=4, num_stages=3, shared=0,
                            names=("x", "y", "out", "n"), types=("*fp32", "*fp32", "*fp32", "i32"),
                            divisible=divisible, constexprs={"BLOCK_SIZE": 1024}, cache_key="k", triton_version="3.6.0",
                            **t)
        h = "0123456789abcdef"
        e = Entry(name=name, symbol=symbol_for(name, h), hash=h, block_size=(128, 1, 1), params=params, grid_dims=3,
                  triton=facts)
        k = Kernel(runtime, e)  # type: ignore[arg-type]
        k._plans[0] = LaunchPlan(e, "bench", 0, object(), _Uniforms())  # type: ignore[arg-type]
        variants.append(k)
    return TritonKernel("add", "bench", variants)


def make_triton_function(heuristics: bool = False) -> Any:
    """A Triton kernel's own call (``kernels.add_kernel``, :class:`~khal_runtime.triton_call.TritonFunction`)
    over the variants :func:`make_triton_kernel` makes (x, y, out: ``*fp32:16``, n: ``i32:16``, and
    the conservative one), with the kernel's signature ``add_kernel(x, y, out, n, BLOCK_SIZE:
    tl.constexpr = 1024)``. ``heuristics``: ``@triton.heuristics({"EVEN": n % BLOCK_SIZE == 0})``
    over it, a constexpr ``EVEN`` (variants for True and False), from an adopted host object."""
    from khal_runtime.backends import cuda
    from khal_runtime.backends.cuda.launch import LaunchPlan
    from khal_runtime.kernels import Kernel
    from khal_runtime.manifest import Entry, Param, TritonFacts, TritonParam, symbol_for
    from khal_runtime.triton_call import TritonFunction

    runtime = SimpleNamespace(name="bench", backend=cuda.BACKEND, _backend=cuda.BACKEND,
                              crate=SimpleNamespace(triton=None))
    u64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
    params = (*(Param(name=n, **u64) for n in ("x", "y", "out")),  # type: ignore[arg-type]
              Param(name="n", kind="scalar", element_type="int32", element_size=4, element_align=4),
              *(Param(name=n, **u64) for n in ("khal_global_scratch", "khal_profile_scratch")))  # type: ignore[arg-type]
    tparams = [TritonParam(name=n) for n in ("x", "y", "out", "n")]
    tparams.append(TritonParam(name="BLOCK_SIZE", constexpr=True, default=1024, has_default=True))
    evens = (True, False) if heuristics else (None,)
    if heuristics:
        tparams.append(TritonParam(name="EVEN", constexpr=True))
    variants = []
    for even in evens:
        for name, divisible in (("add", ("x", "y", "out", "n")), ("add__base", ())):
            cx: dict[str, Any] = {"BLOCK_SIZE": 1024}
            if even is not None:
                cx["EVEN"] = even
                name += f"_{even}"
            facts = TritonFacts(kernel="add_kernel", family=name, num_warps=4, num_stages=3, shared=0,
                                names=("x", "y", "out", "n"), types=("*fp32", "*fp32", "*fp32", "i32"),
                                divisible=divisible, constexprs=cx, cache_key="k", triton_version="3.6.0",
                                params=tuple(tparams), heuristics=("EVEN",) if heuristics else ())
            h = "0123456789abcdef"
            e = Entry(name=name, symbol=symbol_for(name, h), hash=h, block_size=(128, 1, 1), params=params,
                      grid_dims=3, triton=facts)
            k = Kernel(runtime, e)  # type: ignore[arg-type]
            k._plans[0] = LaunchPlan(e, "bench", 0, object(), _Uniforms())  # type: ignore[arg-type]
            variants.append(k)
    f = TritonFunction(runtime, "add_kernel", variants)
    if heuristics:
        f.adopt_host(SimpleNamespace(values={"EVEN": lambda a: a["n"] % a["BLOCK_SIZE"] == 0}, fn=lambda: None))
    return f


def _cuda_launch() -> Any:
    from khal_runtime.backends.cuda import driver

    return driver.driver().cuLaunchKernel


def per_call_us(fn: Callable[[], Any], number: int = 2000, repeat: int = 60) -> float:
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def measure() -> dict[str, float]:
    from khal_runtime import DeviceBuffer

    empty1, five, st, five2d = make_kernels()
    n = 1 << 20
    bufs = [DeviceBuffer(0x1000_0000 * (i + 1), n, "float32", 0) for i in range(3)]
    T, TU, C = _fake_torch_type(), _fake_torch_type(versioned=False), _fake_cupy_type()
    tens = [T(0x1000_0000 * (i + 1), n) for i in range(3)]
    tens_u = [TU(0x1000_0000 * (i + 1), n) for i in range(3)]
    cps = [C(0x1000_0000 * (i + 1), n) for i in range(3)]
    p = BenchParams(2.0, 1.0)
    rows: dict[str, float] = {}
    rows["python no-op call"] = per_call_us(lambda: None)
    L, f, cu = _cuda_launch(), object(), st.native
    rows["no-op driver call (raw equivalent)"] = per_call_us(lambda: L(f, 4096, 1, 1, 256, 1, 1, 0, cu, 0, 0))
    rows["empty1 typed call (DeviceBuffer)"] = per_call_us(lambda: empty1(n, bufs[0]))
    rows["five typed call (DeviceBuffer)"] = per_call_us(lambda: five(n, bufs[0], bufs[1], bufs[2], p, 0.5))
    pdev = DeviceBuffer(0x7000, 8, "uint8", 0)
    rows["five typed call (DeviceBuffer, uniform too)"] = per_call_us(
        lambda: five(n, bufs[0], bufs[1], bufs[2], pdev, 0.5))
    rows["five typed call (torch-like)"] = per_call_us(lambda: five(n, tens[0], tens[1], tens[2], p, 0.5))
    rows["five typed call (torch-like, no version)"] = per_call_us(
        lambda: five(n, tens_u[0], tens_u[1], tens_u[2], p, 0.5))
    rows["torch-like tensor made (for the row below)"] = per_call_us(lambda: T(0x1000_0000, n))
    rows["five typed call (torch-like, a new first tensor each call)"] = per_call_us(
        lambda: five(n, T(0x1000_0000, n), tens[1], tens[2], p, 0.5))
    rows["five typed call (cupy-like)"] = per_call_us(lambda: five(n, cps[0], cps[1], cps[2], p, 0.5))
    bound = five.bind(bufs[0], bufs[1], bufs[2], DeviceBuffer(0x7000, 8, "uint8", 0), 0.5, stream=st)
    rows["five bound launch (bind once)"] = per_call_us(lambda: bound(n))
    rows["five explicit launch (DeviceBuffer)"] = per_call_us(
        lambda: five.launch(4096, 256, bufs[0], bufs[1], bufs[2], p, 0.5, stream=st))
    rows["five 2-D typed call (DeviceBuffer)"] = per_call_us(
        lambda: five2d((1024, 1024), bufs[0], bufs[1], bufs[2], p, 0.5))
    tri = make_triton_kernel()
    rows["triton k[grid] (DeviceBuffer)"] = per_call_us(lambda: tri[(1024,)](bufs[0], bufs[1], bufs[2], n))
    rows["triton launch (DeviceBuffer)"] = per_call_us(lambda: tri.launch(1024, bufs[0], bufs[1], bufs[2], n))
    rows["triton launch (torch-like)"] = per_call_us(lambda: tri.launch(1024, tens[0], tens[1], tens[2], n))
    rows["triton k[grid] (torch-like)"] = per_call_us(lambda: tri[(1024,)](tens[0], tens[1], tens[2], n))
    # eight argument sets in turn (more than a thread's memo slots): every call reads, checks and packs
    sets = [[T(0x2000_0000 * (j + 1) + 0x1000_0000 * i, n) for i in range(3)] for j in range(8)]
    turn = itertools.cycle(sets)
    rows["triton launch (torch-like, 8 sets in turn)"] = per_call_us(lambda: tri.launch(1024, *next(turn), n))
    rows["triton k[lambda] (torch-like, grid callable)"] = per_call_us(
        lambda: tri[lambda meta: (n // meta["BLOCK_SIZE"],)](tens[0], tens[1], tens[2], n))
    rows["triton launch (int addresses)"] = per_call_us(
        lambda: tri.launch(1024, bufs[0].ptr, bufs[1].ptr, bufs[2].ptr, n))
    # an autotuned family (two configs, key n): the choice is cached, the same paths as above
    tb = tri.bind(tens[0], tens[1], tens[2], n, stream=st)
    g = (1024,)
    rows["triton bound launch (bind once)"] = per_call_us(lambda: tb(g))
    tuned = make_triton_kernel(configs=2)
    rows["triton autotuned launch (torch-like)"] = per_call_us(lambda: tuned.launch(1024, tens[0], tens[1], tens[2], n))
    rows["triton autotuned launch (torch-like, 8 sets in turn)"] = per_call_us(
        lambda: tuned.launch(1024, *next(turn), n))
    # the kernel's own call (kernels.<kernel>: keywords, the JIT's specialisation, its families)
    own, heur = make_triton_function(), make_triton_function(heuristics=True)
    rows["triton kernel's call k[grid](torch-like)"] = per_call_us(lambda: own[(1024,)](tens[0], tens[1], tens[2], n))
    rows["triton kernel's call k[grid](torch-like, n=, BLOCK_SIZE=)"] = per_call_us(
        lambda: own[(1024,)](tens[0], tens[1], tens[2], n=n, BLOCK_SIZE=1024))
    rows["triton kernel's call, num_warps=4"] = per_call_us(
        lambda: own[(1024,)](tens[0], tens[1], tens[2], n, num_warps=4))
    rows["triton kernel's call, grid callable"] = per_call_us(
        lambda: own[lambda meta: (n // meta["BLOCK_SIZE"],)](tens[0], tens[1], tens[2], n))
    rows["triton kernel's call, with heuristics (EVEN)"] = per_call_us(
        lambda: heur[(1024,)](tens[0], tens[1], tens[2], n))
    rows["triton kernel's call (torch-like, 8 sets in turn)"] = per_call_us(lambda: own[(1024,)](*next(turn), n))
    return rows


def measure_triton(rounds: int = 20, number: int = 2000) -> dict[str, float]:
    """The Triton launch paths and the CUDA C++ typed call and bound launch, timed interleaved
    (module docstring): per row the best of ``rounds`` shuffled rounds, us per call."""
    import random

    from khal_runtime import DeviceBuffer

    _, five, st, _ = make_kernels()
    tri = make_triton_kernel()
    n = 4096
    T = _fake_torch_type()  # noqa: N806
    x, y, o = (T(0x1000_0000 * (i + 1), n) for i in range(3))
    bufs = [DeviceBuffer(0x1000_0000 * (i + 1), n, "float32", 0) for i in range(3)]
    pdev = DeviceBuffer(0x7000, 8, "uint8", 0)
    go = tri[(n // 1024,)]
    go(x, y, o, n, stream=st)  # (the plan's run is generated at its first launch)
    xp, yp, op = x.data_ptr(), y.data_ptr(), o.data_ptr()
    variant = tri.variants[0]
    run, bx, shmem = variant._plans[0].run, variant.entry.block_size[0], variant.entry.triton.shared
    packed = (xp, yp, op, n, 0, 0)
    bound = tri.bind(x, y, o, n, stream=st)
    alone = make_triton_kernel()[(n // 1024,)]  # a family whose memo holds this one launch only
    own = make_triton_function()[(n // 1024,)]
    own(x, y, o, n, stream=st)
    cbound = five.bind(bufs[0], bufs[1], bufs[2], pdev, 0.5, stream=st)
    g4 = (n // 1024,)
    L, f, cu = _cuda_launch(), object(), st.native  # noqa: N806
    fns: dict[str, Callable[[], Any]] = {
        "raw launch call (no-op driver)": lambda: L(f, 4, 1, 1, bx, 1, 1, shmem, cu, 0, 0),
        "triton k[grid](tensors, stream=st), same again": lambda: go(x, y, o, n, stream=st),
        "triton k[grid](int addresses, stream=st)": lambda: go(xp, yp, op, n, stream=st),
        "triton k[grid](tensors, stream=st), its family's only launch": lambda: alone(x, y, o, n, stream=st),
        "triton kernel's own call k[grid](tensors, n=n, BLOCK_SIZE=1024, stream=st)":
            lambda: own(x, y, o, n=n, BLOCK_SIZE=1024, stream=st),
        "triton b = k.bind(...); b(grid)": lambda: bound(g4),
        "triton variant's LaunchPlan.run, values given": lambda: run(4, 1, 1, bx, 1, 1, shmem, st, packed),
        "cuda five typed call (DeviceBuffer, stream=st)": lambda: five(n, bufs[0], bufs[1], bufs[2], pdev, 0.5,
                                                                       stream=st),
        "cuda five typed call (torch-like, stream=st)": lambda: five(n, x, y, o, pdev, 0.5, stream=st),
        "cuda five bound launch": lambda: cbound(n),
    }
    for fn in fns.values():
        for _ in range(20):  # past the first calls: the memo's slots and snapshots filled
            fn()
    got: dict[str, float] = {k: float("inf") for k in fns}
    order = list(fns)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            got[k] = min(got[k], min(timeit.repeat(fns[k], number=number, repeat=3)) / number * 1e6)
    return got


def main() -> None:
    rows = measure()
    base = rows["no-op driver call (raw equivalent)"]
    for k, v in rows.items():
        extra = "" if k.startswith(("python", "no-op")) else f"   (+{v - base:5.2f} over the raw call)"
        print(f"{k:40s} {v:6.2f} us{extra}")
    print("\ninterleaved (bench_triton's launch-cost rows, and the CUDA C++ call of a comparable entry):")
    tri = measure_triton()
    base = tri["raw launch call (no-op driver)"]
    for k, v in tri.items():
        print(f"{k:62s} {v:6.3f} us   (+{v - base:5.3f} over the raw call)")


if __name__ == "__main__":
    main()
