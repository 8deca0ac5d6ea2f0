"""WebGPU backend benchmark: dispatch overhead of the typed call, bandwidth, the particle demo.

    python benchmarks/bench_webgpu.py [--dispatches 1000] [--rounds N] [--mb N] [--demo-steps 0]
                                      [--package DIR] [--json out.json]
    python benchmarks/bench_webgpu.py --build-only DIR     # the kernels' package, nothing timed

Standalone it prints its own table; ``benchmarks/run.py`` (section ``webgpu``) runs it in a
process of its own, because the backend is chosen once per process and the runner's CUDA
sections come first, and turns its ``--json`` into rows. It sets ``KHAL_BACKEND=webgpu`` for
itself and runs on whatever adapter wgpu-py finds (``KHAL_WEBGPU_ADAPTER`` picks one): lavapipe
on CPU machines, the H200 through Vulkan on the lent GPU machine (see shared/device.md).

The kernels come from a package built here the way the hook builds one (Slang -> WGSL +
SPIR-V, a manifest, loaded with ``khal_runtime.load``): the example's Slang crate
(``example_shader_pkg/kernels/slang``, for ``saxpy_shared``) and a small crate of this
benchmark (:data:`BENCH_SLANG`: plain saxpy, a float4 saxpy, a float4 copy). Building it needs
slangpy (the Slang compiler); where it is missing (the lent H200: its wheel is larger than what a
device run may carry) build it on a machine that has it with ``--build-only DIR`` and pass
``--package DIR`` (``run.py --webgpu-package DIR``).

Dispatch overhead. One pipeline, ``saxpy_shared`` (one workgroup per dispatch), the same
arguments every call; ``--dispatches`` dispatches recorded, then one submit, for every row
(``KHAL_WEBGPU_BATCH`` is set above that, so the typed call's stream never submits by itself
in the middle of a timed batch); the rows are timed in turns (round r runs one batch of each,
in an order rotated every round), the median of ``--rounds`` rounds taken:

* ``raw wgpu-py``: a command encoder and compute pass, then per dispatch ``set_pipeline``,
  ``set_bind_group`` (the typed call's own bind group and dynamic offset, prebuilt: the same
  pipeline object and the same uniform block) and ``dispatch_workgroups`` through wgpu-py's
  public methods: the DESIGN.md yardstick;
* ``typed call``: ``kernels.saxpy_shared(n, y, x, a)`` on DeviceBuffers, the user-facing call;
* informative: the same three calls straight into wgpu-native's C API; raw wgpu-py setting
  the pipeline and bind group once per batch (what the typed call's stream does: it skips state
  already set); a different scalar each call; ``bind()``; a captured graph replayed.

``record`` is the host time to record one dispatch, nothing submitted (the bar is on it: the
host enqueue cost, as the CUDA launch bar); ``total`` adds ending the pass, the submit and the
wait until the batch has run (``synchronize()``: a 4-byte read-back after it, for every row; the
typed rows' read-back goes into the batch's own command buffer, the raw rows' into a second one,
so raw pays one submit more per batch: ~60 us per 1000 dispatches on the H200).

Bandwidth: ``y = a * x + y`` (12 bytes per element: x and y read, y written) through the
typed call against ``copy_buffer_to_buffer`` of the same buffer (8 bytes per element: read
+ write). The bar's kernel is ``bw_saxpy4`` (one float4 per thread, grid-stride); the plain
one-float-per-thread ``bw_saxpy``, the example's ``saxpy_shared`` (stages x through
groupshared memory with a barrier, one thread per element, so at most 65535 x 256 elements)
and a float4 copy kernel are informative. Each figure is the best of ``--rounds`` rounds of a
batch of reps: GPU time from timestamp queries (an empty timestamped compute pass before and
after the batch, in the same command buffer) where the adapter has ``timestamp-query``, else
the wall clock around submit + wait (both are reported). On a CPU adapter (lavapipe) these are
CPU figures: a memcpy against LLVM-compiled shaders on the same cores; the bar is not judged.

CPU adapters get smaller defaults (``--mb``, reps, rounds) so the whole run stays short.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "webgpu"
PKG = "khal_webgpu_bench"
DISPATCH_BAR = 1.25  # typed call / raw wgpu-py, record time (DESIGN.md)
BANDWIDTH_BAR = 0.85  # saxpy / WebGPU buffer copy
CPU_DEFAULTS = {"mb": 16, "rounds": 9, "bw_rounds": 3, "reps": 3}
GPU_DEFAULTS = {"mb": 256, "rounds": 15, "bw_rounds": 5, "reps": 20}

#: the benchmark's own crate: bandwidth kernels that a GPU can run at full speed (grid-stride,
#: so any size fits the 65535-group limit; ``stride`` = the threads launched)
BENCH_SLANG = """\
// Bandwidth kernels of benchmarks/bench_webgpu.py.
struct F4 { float4 v; };

// y = a * x + y, one float per thread per step.
[shader("compute")]
[numthreads(256, 1, 1)]
void bw_saxpy(uint3 gid : SV_DispatchThreadID, uniform RWStructuredBuffer<float> y,
              uniform StructuredBuffer<float> x, uniform float a, uniform uint stride)
{
    uint ny, nx, s;
    y.GetDimensions(ny, s);
    x.GetDimensions(nx, s);
    const uint n = min(nx, ny);
    for (uint i = gid.x; i < n; i += stride)
        y[i] = a * x[i] + y[i];
}

// y = a * x + y, one float4 per thread per step.
[shader("compute")]
[numthreads(256, 1, 1)]
void bw_saxpy4(uint3 gid : SV_DispatchThreadID, uniform RWStructuredBuffer<F4> y,
               uniform StructuredBuffer<F4> x, uniform float a, uniform uint stride)
{
    uint ny, nx, s;
    y.GetDimensions(ny, s);
    x.GetDimensions(nx, s);
    const uint n = min(nx, ny);
    for (uint i = gid.x; i < n; i += stride)
        y[i].v = a * x[i].v + y[i].v;
}

// y = x, one float4 per thread per step.
[shader("compute")]
[numthreads(256, 1, 1)]
void bw_copy4(uint3 gid : SV_DispatchThreadID, uniform RWStructuredBuffer<F4> y,
              uniform StructuredBuffer<F4> x, uniform uint stride)
{
    uint ny, nx, s;
    y.GetDimensions(ny, s);
    x.GetDimensions(nx, s);
    const uint n = min(nx, ny);
    for (uint i = gid.x; i < n; i += stride)
        y[i].v = x[i].v;
}
"""


# =============================================================================================
# The measuring side (runs with KHAL_BACKEND=webgpu)
# =============================================================================================
def build_package(where: Path) -> Path:
    """``where/khal_webgpu_bench``: the WebGPU build (WGSL + SPIR-V) of the example's Slang crate
    and of :data:`BENCH_SLANG`, written as the hook writes a package (as tests/helpers/slang.py's
    ``webgpu_package`` does for the example crate alone)."""
    from hatch_khal.slang.stage import plan_slang_crate
    from khal_runtime.manifest import SCHEMA_VERSION, Manifest, Toolchain

    pkg = where / PKG
    (pkg / "_khal").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="khal-webgpu-bench-src-") as tmp:  # the sources: not shipped
        proj = Path(tmp)
        (proj / "kernels").mkdir(parents=True, exist_ok=True)
        (proj / "kernels" / "bench.slang").write_text(BENCH_SLANG)
        crates = [_compile_crate(pkg, plan_slang_crate(ROOT / "example_shader_pkg", "slang_examples",
                                                       ["kernels/slang/*.slang"], ["kernels/slang/modules"], {}, [])),
                  _compile_crate(pkg, plan_slang_crate(proj, "bench", ["kernels/*.slang"], [], {}, []))]
    m = Manifest(schema_version=SCHEMA_VERSION, package=PKG, toolchain=Toolchain(hatch_khal_version="bench"),
                 crates=tuple(crates))
    (pkg / "_khal" / "manifest.json").write_text(m.to_json())
    (pkg / "__init__.py").write_text("import khal_runtime\n\nkernels = khal_runtime.load(__name__)\n")
    return pkg


def _compile_crate(pkg: Path, plan: Any) -> Any:
    """Compile one Slang crate for WebGPU into ``pkg``; its manifest Crate."""
    from hatch_khal.slang.stage import compile_slang_crate
    from khal_runtime.manifest import Crate, SpirvStatus

    out = compile_slang_crate(plan, {"wgsl", "spirv"})
    for rel, data in out.webgpu_files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_bytes(data)
    return Crate(name=plan.crate, language="slang", package_dir=f"_khal/{plan.crate}",
                 sources=plan.manifest_sources, content_hash=plan.content_hash,
                 artifacts=tuple(out.webgpu_artifacts()), entries=tuple(out.entries),
                 spirv=SpirvStatus(status="built"))


def find_package(where: str | Path) -> Path:
    """The bench package in ``where`` (the directory ``--build-only`` wrote, or the package itself)."""
    p = Path(where).resolve()
    for cand in (p / PKG, p):
        if (cand / "_khal" / "manifest.json").is_file():
            return cand
    raise FileNotFoundError(f"{where}: no {PKG} package (with _khal/manifest.json) there; make one with "
                            f"python benchmarks/bench_webgpu.py --build-only {where}")


def _rounds(methods: dict[str, tuple[Callable[[int], None], Callable[[], None]]], n: int, rounds: int,
            sync: Callable[[], None], warmup: int = 2) -> dict[str, dict[str, float]]:
    """Per method ``(record(k), finish())``: us per dispatch, record and total, over ``rounds``
    rounds that each time one batch of every method, in an order rotated every round (drift
    then weighs on every method alike)."""
    names = list(methods)
    rec: dict[str, list[float]] = {k: [] for k in names}
    tot: dict[str, list[float]] = {k: [] for k in names}
    for r in range(warmup + rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            record, finish = methods[name]
            sync()
            t0 = time.perf_counter()
            record(n)
            t1 = time.perf_counter()
            finish()
            t2 = time.perf_counter()
            if r >= warmup:
                rec[name].append((t1 - t0) / n * 1e6)
                tot[name].append((t2 - t0) / n * 1e6)
    return {k: {"record_us": statistics.median(rec[k]), "record_min_us": min(rec[k]),
                "total_us": statistics.median(tot[k]), "total_min_us": min(tot[k])} for k in names}


def dispatch_costs(ks: Any, dev: Any, n: int, rounds: int) -> list[dict[str, Any]]:
    """The dispatch-overhead rows (see the module docstring)."""
    import numpy as np

    import khal_runtime as rt
    from khal_runtime.backends.webgpu._wgpu import native

    st = rt.default_stream()
    k = ks.saxpy_shared
    threads = int(k.block_size[0])  # one workgroup per dispatch
    y = rt.DeviceBuffer.zeros(threads, np.float32)
    x = rt.DeviceBuffer.from_numpy(np.ones(threads, np.float32))
    a = 1.0
    k(threads, y, x, a)  # loads the pipeline, uploads the uniform block
    st.synchronize()
    kp = k.plan(st.device_id).kp  # the kernel's WebGPU plan: its pipeline, its bind group
    pl = kp.pipeline
    bgs, imm = kp.resolve((y, x, a))
    if len(bgs) != 1:
        raise RuntimeError(f"saxpy_shared binds {len(bgs)} groups; the raw rows assume one")
    bg = bgs[0]
    gpu_bg, dyn = bg.gpu, list(bg.dyn)
    d, q = dev.device, dev.queue
    lib = native()[0] if native() is not None else None
    held: dict[str, Any] = {}

    def raw_public(m: int) -> None:
        enc = d.create_command_encoder()
        p = enc.begin_compute_pass()
        for _ in range(m):
            p.set_pipeline(pl.gpu)
            p.set_bind_group(0, gpu_bg, dyn)
            if imm is not None:
                p.set_immediates(0, imm.data, 0, imm.size)
            p.dispatch_workgroups(1, 1, 1)
        held["enc"], held["pass"] = enc, p

    def raw_state_once(m: int) -> None:
        enc = d.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(pl.gpu)
        p.set_bind_group(0, gpu_bg, dyn)
        if imm is not None:
            p.set_immediates(0, imm.data, 0, imm.size)
        for _ in range(m):
            p.dispatch_workgroups(1, 1, 1)
        held["enc"], held["pass"] = enc, p

    def raw_c(m: int) -> None:
        enc = d.create_command_encoder()
        p = enc.begin_compute_pass()
        praw, plr, bgr, nd, offs = p._internal, pl.raw, bg.raw, bg.n_dyn, bg.offsets
        sp, sb, dw = (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                      lib.wgpuComputePassEncoderDispatchWorkgroups)
        si = lib.wgpuComputePassEncoderSetImmediates
        for _ in range(m):
            sp(praw, plr)
            sb(praw, 0, bgr, nd, offs)
            if imm is not None:
                si(praw, 0, imm.cdata, imm.size)
            dw(praw, 1, 1, 1)
        held["enc"], held["pass"] = enc, p

    def raw_finish() -> None:
        held.pop("pass").end()
        q.submit([held.pop("enc").finish()])
        st.synchronize()  # the same wait as the typed rows: a 4-byte read-back after the batch

    def typed(m: int) -> None:
        for _ in range(m):
            k(threads, y, x, a)

    vals = [float(i % 97 + 1) for i in range(n)]

    def typed_new_scalar(m: int) -> None:
        for i in range(m):
            k(threads, y, x, vals[i])

    b = k.bind(y, x, a)

    def bound(m: int) -> None:
        for _ in range(m):
            b(threads)

    def step() -> None:
        for _ in range(n):
            k(threads, y, x, a)

    typed_new_scalar(n)  # every value's uniform block uploaded before timing
    st.synchronize()
    graph = rt.capture_graph(step, label="bench")

    def replay(m: int) -> None:
        assert m == n
        graph.launch()

    sync = st.synchronize
    methods: dict[str, tuple[Callable[[int], None], Callable[[], None]]] = {
        "raw": (raw_public, raw_finish),
        "typed": (typed, sync),
        "raw_c": (raw_c, raw_finish),
        "raw_state_once": (raw_state_once, raw_finish),
        "typed_new_scalar": (typed_new_scalar, sync),
        "bound": (bound, sync),
        "replay": (replay, sync),
    }
    if lib is None:
        del methods["raw_c"]
    res = _rounds(methods, n, rounds, sync)
    labels = {
        "raw": ("raw wgpu-py dispatch (public methods)",
                "set_pipeline + set_bind_group + dispatch_workgroups per dispatch, prebuilt bind group"),
        "typed": ("typed call kernels.saxpy_shared(n, y, x, a)", "DeviceBuffers, same arguments every call"),
        "raw_c": ("raw C calls (wgpu-native cffi)", "the same three calls without wgpu-py's wrappers"),
        "raw_state_once": ("raw wgpu-py, pipeline + bind group set once",
                           "dispatch_workgroups only: the typed stream also skips state already set"),
        "typed_new_scalar": ("typed call, scalar changes every call",
                             "97 values cycled: uniform block found by content, new bind-group offset"),
        "bound": ("bound b = k.bind(...); b(n)", ""),
        "replay": ("captured graph replay (capture_graph)", f"{n} dispatches per replay; record = launch() incl. its submit"),
    }
    out = []
    for key, r in res.items():
        name, note = labels[key]
        out.append({"key": key, "name": name, "note": note, **r})
    return out


class _Brackets:
    """GPU time of a batch of commands on the device's stream: an empty compute pass writing
    timestamps before the batch and another after it, in the same command buffer."""

    def __init__(self, dev: Any) -> None:
        import wgpu

        from khal_runtime.backends.webgpu import profiling

        self.dev = dev
        self.qs = dev.device.create_query_set(type="timestamp", count=4)
        self.resolve = dev.device.create_buffer(size=32, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.read = dev.device.create_buffer(size=32, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        try:
            self.period_ns = profiling._period(dev)  # ns per tick (wgpuQueueGetTimestampPeriod)
        except Exception:  # noqa: BLE001
            self.period_ns = 1.0

    def mark(self, i: int) -> None:
        st = self.dev.stream
        with st.lock:
            p = st.encoder().begin_compute_pass(timestamp_writes={
                "query_set": self.qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
            p.end()

    def finish(self) -> None:
        st = self.dev.stream
        with st.lock:
            enc = st.encoder()
            enc.resolve_query_set(self.qs, 0, 4, self.resolve, 0)
            enc.copy_buffer_to_buffer(self.resolve, 0, self.read, 0, 32)

    def seconds(self) -> float | None:
        """After the batch ran: from the first pass's start to the second pass's end."""
        import struct

        import wgpu

        self.read.map_sync(wgpu.MapMode.READ)
        try:
            t = struct.unpack("<4Q", bytes(self.read.read_mapped()))
        finally:
            self.read.unmap()
        if not (0 < t[0] <= t[1] <= t[2] <= t[3]):
            return None
        return (t[3] - t[0]) * self.period_ns * 1e-9


def bandwidth(ks: Any, dev: Any, mb: int, reps: int, rounds: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The bandwidth rows (see the module docstring) and what was measured."""
    import numpy as np

    import khal_runtime as rt

    st = rt.default_stream()
    ws = dev.stream
    limit = min(dev.max_storage_binding, dev.max_buffer_size)
    n = min(mb << 20, limit) // 4 // 1024 * 1024  # floats, a multiple of 1024 (256 float4s)
    nbytes = n * 4
    max_threads = dev.max_groups * 256
    f4 = np.dtype([("v", np.float32, (4,))])
    xs = (np.arange(n) % 64).astype(np.float32)  # a * x + y stays exact for the check below
    a = 0.5
    x = rt.DeviceBuffer.from_numpy(xs)
    y = rt.DeviceBuffer.zeros(n, np.float32)
    x4 = rt.DeviceBuffer.from_numpy(xs.view(f4))
    y4 = rt.DeviceBuffer.zeros(n // 4, f4)
    m = min(n, max_threads // 1024 * 1024)  # saxpy_shared: one thread per element
    ys, xsh = y[:m], x[:m]
    brackets = _Brackets(dev) if dev.has_timestamps else None

    def grid(items: int) -> int:
        return min(items, max_threads) // 256 * 256 or 256

    t1, t4 = grid(n), grid(n // 4)
    xb, yb = x._native.allocation.buffer, y._native.allocation.buffer
    xo, yo = x._native.offset, y._native.offset

    def copy() -> None:
        with ws.lock:
            enc = ws.encoder()
            for _ in range(reps):
                enc.copy_buffer_to_buffer(xb, xo, yb, yo, nbytes)

    def saxpy4() -> None:
        for _ in range(reps):
            ks.bw_saxpy4(t4, y4, x4, a, t4)

    def saxpy() -> None:
        for _ in range(reps):
            ks.bw_saxpy(t1, y, x, a, t1)

    def shared() -> None:
        for _ in range(reps):
            ks.saxpy_shared(m, ys, xsh, a)

    def copy4() -> None:
        for _ in range(reps):
            ks.bw_copy4(t4, y4, x4, t4)

    cases = [  # key, name, function, bytes per rep, output to zero first, check
        ("copy", "WebGPU copy_buffer_to_buffer", copy, 2 * nbytes, y, "copy"),
        ("saxpy4", "saxpy, bw_saxpy4 (float4 per thread, grid-stride)", saxpy4, 3 * nbytes, y4, "saxpy"),
        ("saxpy", "saxpy, bw_saxpy (one float per thread, grid-stride)", saxpy, 3 * nbytes, y, "saxpy"),
        ("saxpy_shared", "saxpy, example saxpy_shared (groupshared tile)", shared, 3 * m * 4, ys, "saxpy"),
        ("copy4", "copy kernel, bw_copy4 (float4 per thread)", copy4, 2 * nbytes, y4, "copy"),
    ]
    out = []
    for key, name, fn, nb, outbuf, check in cases:
        outbuf.fill_zero()
        fn()  # warm: pipelines, bind groups, uniforms
        st.synchronize()
        walls, gpus = [], []
        for _ in range(rounds):
            st.synchronize()
            t0 = time.perf_counter()
            if brackets:
                brackets.mark(0)
            fn()
            if brackets:
                brackets.mark(1)
                brackets.finish()
            st.synchronize()
            walls.append(time.perf_counter() - t0)
            if brackets:
                g = brackets.seconds()
                if g is not None:
                    gpus.append(g)
        runs = (rounds + 1) * reps
        _check(key, check, outbuf, xs, a, runs, f4)
        wall = nb * reps / min(walls) / 1e9
        gpu = nb * reps / min(gpus) / 1e9 if gpus else None
        out.append({"key": key, "name": name, "bytes": nb, "wall_gbs": wall, "gpu_gbs": gpu,
                    "gbs": gpu if gpu is not None else wall, "clock": "gpu" if gpu is not None else "wall",
                    "ms": (min(gpus) if gpus else min(walls)) / reps * 1e3})
    info = {"floats": n, "mib_per_buffer": nbytes / 2**20, "saxpy_shared_floats": m, "reps": reps,
            "rounds": rounds, "timestamps": brackets is not None,
            "period_ns": brackets.period_ns if brackets else None}
    return out, info


def _check(key: str, kind: str, buf: Any, xs: Any, a: float, runs: int, f4: Any) -> None:
    """The result of ``runs`` runs is right (x is small integers and a is 0.5: exact)."""
    import numpy as np

    got = buf.to_numpy()
    if got.dtype == f4:
        got = got.view(np.float32).reshape(-1)
    want = xs[:got.size] if kind == "copy" else (np.float32(a * runs) * xs[:got.size]).astype(np.float32)
    if not np.array_equal(got, want):
        bad = int(np.flatnonzero(got != want)[0])
        raise AssertionError(f"{key}: wrong result at element {bad}: {got[bad]} != {want[bad]}")


def demo_rows(steps: int) -> list[dict[str, Any]]:
    """The Slang particle demo on WebGPU (``example_shader_pkg.demo.benchmark``), each mode."""
    try:
        from example_shader_pkg import demo  # type: ignore[attr-defined]
    except ImportError as exc:
        return [{"name": "particle demo", "error": None,
                 "note": f"not available: example_shader_pkg.demo ({exc}); pass --site with the "
                         "installed example wheel"}]
    out = []
    for mode in getattr(demo, "MODES", ("direct", "indirect", "graph")):
        try:
            r = demo.benchmark(mode, backend="webgpu", steps=steps)
            out.append({"name": f"Slang particle step, WebGPU, {mode}", "mode": mode,
                        "steps_per_s": float(r["steps_per_s"]), "result": r})
        except Exception as exc:  # noqa: BLE001 - one mode failing must not lose the others
            out.append({"name": f"Slang particle step, WebGPU, {mode}", "mode": mode,
                        "error": f"{type(exc).__name__}: {exc}"})
    return out


def measure(a: argparse.Namespace) -> dict[str, Any]:
    """Everything, as the JSON ``run.py`` reads."""
    from khal_runtime.backends.webgpu.device import get_device, status

    st = status()
    if not st.usable:
        return {"usable": False, "reason": st.reason}
    dev = get_device(0)
    cpu = dev.info.adapter_type == "CPU"
    dflt = CPU_DEFAULTS if cpu else GPU_DEFAULTS
    mb = a.mb or dflt["mb"]
    rounds = a.rounds or dflt["rounds"]
    bw_rounds = a.rounds or dflt["bw_rounds"]
    reps = a.reps or dflt["reps"]
    import wgpu

    import khal_runtime as rt

    res: dict[str, Any] = {
        "usable": True,
        "adapter": {"name": dev.info.name, "adapter_type": dev.info.adapter_type,
                    "backend_type": dev.info.backend_type, "vendor": dev.info.vendor,
                    "describe": dev.info.describe(), "timestamps": dev.has_timestamps,
                    "max_groups": dev.max_groups},
        "cpu_adapter": cpu, "wgpu": getattr(wgpu, "__version__", "?"),
        "settings": {"dispatches": a.dispatches, "rounds": rounds, "mb": mb, "reps": reps, "bw_rounds": bw_rounds,
                     "batch_env": os.environ.get("KHAL_WEBGPU_BATCH"),
                     "shader": os.environ.get("KHAL_WEBGPU_SHADER") or "wgsl",
                     "defaults": "CPU adapter: reduced sizes" if cpu else "GPU"},
        "errors": {},
    }
    t0 = time.perf_counter()
    res["package"] = str(Path(a.package).resolve()) if a.package else "built here (Slang)"
    try:
        if a.package:
            pkg = find_package(a.package)
        else:  # removed when the process ends (the kernels read their code at first use)
            tmp = tempfile.TemporaryDirectory(prefix="khal-webgpu-bench-")
            atexit.register(tmp.cleanup)
            pkg = build_package(Path(tmp.name))
        ks = rt.load(str(pkg))
    except Exception as exc:  # noqa: BLE001 - nothing to time without the kernels: say why
        res["errors"]["package"] = _err(exc)
        return res
    res["build_s"] = time.perf_counter() - t0
    try:
        res["dispatch"] = dispatch_costs(ks, dev, a.dispatches, rounds)
    except Exception as exc:  # noqa: BLE001 - report it, go on with the others
        res["errors"]["dispatch"] = _err(exc)
    try:
        res["bandwidth"], res["bandwidth_info"] = bandwidth(ks, dev, mb, reps, bw_rounds)
    except Exception as exc:  # noqa: BLE001
        res["errors"]["bandwidth"] = _err(exc)
    if a.demo_steps > 0:
        res["demo"] = demo_rows(a.demo_steps)
    return res


def _err(exc: BaseException) -> dict[str, str]:
    import traceback

    return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def print_table(res: dict[str, Any]) -> None:
    if not res.get("usable"):
        print(f"WebGPU unavailable: {res.get('reason')}")
        return
    s = res["settings"]
    print(f"\nWebGPU on {res['adapter']['describe']} (wgpu-py {res['wgpu']}); {s['defaults']}")
    disp = res.get("dispatch")
    if disp:
        raw = next(r for r in disp if r["key"] == "raw")
        print(f"\ndispatch overhead: saxpy_shared, {s['dispatches']} dispatches per submit, median of "
              f"{s['rounds']} rounds in turns; the bar ({DISPATCH_BAR}x) is on record")
        print(f"{'path':<48} {'record us':>10} {'/raw':>6} {'total us':>10} {'/raw':>6}")
        for r in disp:
            print(f"{r['name']:<48} {r['record_us']:>10.2f} {r['record_us'] / raw['record_us']:>6.2f} "
                  f"{r['total_us']:>10.2f} {r['total_us'] / raw['total_us']:>6.2f}")
    bw = res.get("bandwidth")
    if bw:
        info = res["bandwidth_info"]
        ref = next(r for r in bw if r["key"] == "copy")
        print(f"\nbandwidth: {info['mib_per_buffer']:.0f} MiB per buffer, {info['reps']} reps per round, best of "
              f"{info['rounds']} rounds; GB/s counts bytes read + written"
              + ("" if info["timestamps"] else " (no timestamp-query: wall clock only)"))
        print(f"{'what':<52} {'GB/s GPU':>9} {'GB/s wall':>10} {'/copy':>6}")
        for r in bw:
            g = f"{r['gpu_gbs']:>9.2f}" if r["gpu_gbs"] is not None else f"{'n/a':>9}"
            print(f"{r['name']:<52} {g} {r['wall_gbs']:>10.2f} {r['gbs'] / ref['gbs']:>6.2f}")
        if res["cpu_adapter"]:
            print("(CPU adapter: these are CPU memory figures, the bandwidth bar is for GPUs)")
    for r in res.get("demo") or ():
        if "steps_per_s" in r:
            print(f"{r['name']}: {r['steps_per_s']:,.1f} steps/s")
        else:
            print(f"{r['name']}: {r.get('error') or r.get('note')}")
    for what, e in res["errors"].items():
        print(f"\n{what} FAILED: {e['traceback']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dispatches", type=int, default=1000, help="dispatches per timed batch (one submit)")
    ap.add_argument("--rounds", type=int, default=0,
                    help=f"timed rounds (default: dispatch {GPU_DEFAULTS['rounds']}, bandwidth "
                         f"{GPU_DEFAULTS['bw_rounds']}; on a CPU adapter {CPU_DEFAULTS['rounds']} / "
                         f"{CPU_DEFAULTS['bw_rounds']})")
    ap.add_argument("--mb", type=int, default=0,
                    help=f"MiB per buffer in the bandwidth rows (default {GPU_DEFAULTS['mb']}, CPU adapter "
                         f"{CPU_DEFAULTS['mb']})")
    ap.add_argument("--reps", type=int, default=0, help="kernels / copies per bandwidth round")
    ap.add_argument("--demo-steps", type=int, default=0,
                    help="also run the Slang particle demo on WebGPU, this many steps per mode (0: no)")
    ap.add_argument("--package", help="a prebuilt kernels package (--build-only's DIR) instead of building one")
    ap.add_argument("--build-only", type=Path, metavar="DIR",
                    help=f"build the kernels' package into DIR/{PKG} (needs slangpy, no GPU) and stop")
    ap.add_argument("--json", type=Path, help="write every figure here")
    a = ap.parse_args(argv)
    root = str(ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)
    if a.build_only:
        a.build_only.mkdir(parents=True, exist_ok=True)
        print(f"built {build_package(a.build_only.resolve())}")
        return 0
    if a.dispatches < 1:
        ap.error("--dispatches must be >= 1")
    # this process measures WebGPU: the backend, before khal_runtime chooses one; a batch larger
    # than a timed one, so the typed call submits where the raw path does (after the batch)
    os.environ["KHAL_BACKEND"] = "webgpu"
    os.environ["KHAL_WEBGPU_BATCH"] = str(max(a.dispatches + 1, 1000))
    if not os.path.isdir(os.environ.get("XDG_RUNTIME_DIR", "") or "/nonexistent"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="khal-xdg-")
    res = measure(a)
    print_table(res)
    if a.json:
        a.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


# =============================================================================================
# The runner's side (benchmarks/run.py, section "webgpu"): a subprocess, its JSON as rows
# =============================================================================================
def run(args: Any) -> list[Any]:
    """Section ``webgpu`` of ``run.py``: this script in a process of its own with
    ``KHAL_BACKEND=webgpu``; its JSON turned into rows."""
    from _common import Row, env_with_path

    sections = getattr(args, "sections", None) or []
    demo_here = "demo" not in sections
    out_json = Path(tempfile.mkstemp(prefix="khal-webgpu-", suffix=".json")[1])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", str(out_json),
           "--dispatches", str(getattr(args, "webgpu_dispatches", 1000)),
           "--demo-steps", str(args.demo_steps if demo_here else 0)]
    if getattr(args, "webgpu_mb", 0):
        cmd += ["--mb", str(args.webgpu_mb)]
    if getattr(args, "webgpu_package", ""):
        cmd += ["--package", os.path.abspath(args.webgpu_package)]
    env = env_with_path([str(ROOT), os.path.abspath(args.site) if getattr(args, "site", "") else ""])
    env["KHAL_BACKEND"] = "webgpu"
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False,
                           timeout=getattr(args, "webgpu_timeout", 900))
    except subprocess.TimeoutExpired as exc:
        return [Row(SECTION, "(section failed)", note=f"ERROR: {exc}")]
    try:
        res = json.loads(out_json.read_text()) if out_json.stat().st_size else None
    finally:
        out_json.unlink(missing_ok=True)
    if p.returncode != 0 or res is None:
        tail = (p.stderr or p.stdout or "").strip().splitlines()[-12:]
        return [Row(SECTION, "(section failed)", note=f"ERROR: bench_webgpu.py exited {p.returncode}: "
                    f"{' | '.join(tail)[-300:]}", extra={"traceback": p.stderr})]
    return rows_from(res, demo_here, args)


def rows_from(res: dict[str, Any], demo_here: bool, args: Any = None) -> list[Any]:
    from _common import Row

    if not res.get("usable"):
        return [Row(SECTION, "(section skipped)", note=f"no WebGPU adapter: {res.get('reason')}")]
    ad = res["adapter"]
    cpu = res["cpu_adapter"]
    s = res["settings"]
    rows = [Row(SECTION, "adapter", note=f"{ad['describe']}, wgpu-py {res['wgpu']}, {s['shader']}"
                + ("; CPU adapter: smaller sizes, bandwidth bar not judged" if cpu else ""),
                extra={k: v for k, v in res.items() if k not in ("dispatch", "bandwidth", "demo")})]
    if "package" in res["errors"]:
        e = res["errors"]["package"]
        hint = ("; build it where slangpy is installed (python benchmarks/bench_webgpu.py --build-only DIR) "
                "and pass --webgpu-package DIR") if res.get("package", "").startswith("built here") else ""
        rows.append(Row(SECTION, "kernels package", note=f"ERROR: {e['error'][:240]}{hint}",
                        extra={"traceback": e["traceback"]}))
    disp = res.get("dispatch")
    if disp:
        by = {r["key"]: r for r in disp}
        raw = by["raw"]
        for r in disp:
            ratio = r["record_us"] / raw["record_us"]
            bar, ok, note = "", None, r["note"]
            if r["key"] == "typed":
                bar, ok = f"<= {DISPATCH_BAR}", ratio <= DISPATCH_BAR
                note = f"{note}; bar on record (host enqueue, as the CUDA launch bar)"
            note = "; ".join(x for x in (note, f"total {r['total_us']:.2f} us") if x)
            rows.append(Row(SECTION, f"dispatch: {r['name']}", r["record_us"], "us record", ratio,
                            "raw wgpu-py", bar, ok, note, extra=r))
        for key in ("raw", "typed"):
            r = by[key]
            rows.append(Row(SECTION, f"dispatch total: {r['name']}", r["total_us"], "us total",
                            r["total_us"] / raw["total_us"], "raw wgpu-py",
                            note=f"record + end pass + submit + wait, {s['dispatches']} per submit, median of "
                                 f"{s['rounds']}" + ("; lavapipe runs the dispatches on the CPU" if cpu else ""),
                            extra=r))
    elif "dispatch" in res["errors"]:
        e = res["errors"]["dispatch"]
        rows.append(Row(SECTION, "dispatch overhead", note=f"ERROR: {e['error'][:300]}",
                        extra={"traceback": e["traceback"]}))
    bw = res.get("bandwidth")
    if bw:
        info = res["bandwidth_info"]
        ref = next(r for r in bw if r["key"] == "copy")
        for r in bw:
            ratio = r["gbs"] / ref["gbs"]
            bar, ok = "", None
            note = (f"{r['bytes'] / 2**20:.0f} MiB per run, {r['ms']:.3f} ms, {r['clock']} clock"
                    + (f", wall {r['wall_gbs']:.2f} GB/s" if r["clock"] == "gpu" else ""))
            if r["key"] == "saxpy4":
                bar = f">= {BANDWIDTH_BAR}"
                ok = None if cpu else ratio >= BANDWIDTH_BAR
                if cpu:
                    note += "; CPU adapter: CPU memory figures, bar not judged"
            rows.append(Row(SECTION, f"bandwidth: {r['name']}", r["gbs"], "GB/s", ratio, "WebGPU copy",
                            bar, ok, note, extra={**r, **info}))
    elif "bandwidth" in res["errors"]:
        e = res["errors"]["bandwidth"]
        rows.append(Row(SECTION, "bandwidth", note=f"ERROR: {e['error'][:300]}",
                        extra={"traceback": e["traceback"]}))
    if not demo_here:
        rows.append(Row(SECTION, "particle demo (WebGPU)",
                        note="see the demo section's 'Slang particle step, WebGPU' rows (not run twice)"))
    else:
        base = None
        for r in res.get("demo") or ():
            if "steps_per_s" in r:
                v = r["steps_per_s"]
                if r["mode"] == "direct":
                    base = v
                rows.append(Row(SECTION, r["name"], v, "steps/s", v / base if base else None, "direct",
                                note=str(r["result"].get("device", "")), extra=r["result"]))
            elif r.get("error"):
                rows.append(Row(SECTION, r["name"], note=f"ERROR: {r['error'][:300]}"))
            else:
                rows.append(Row(SECTION, r["name"], note=r.get("note", "")))
    return rows


def cross_rows(rows: list[Any]) -> list[Any]:
    """WebGPU bandwidth against CUDA's device copy, when the ``kernels`` section ran in the same
    run (DESIGN.md: reported against CUDA's device copy too)."""
    from _common import Row

    cuda = next((r for r in rows if r.section == "kernels" and r.name == "device-to-device copy"
                 and r.value), None)
    adapter = next((r for r in rows if r.section == SECTION and r.name == "adapter"), None)
    if cuda is None or adapter is None or adapter.extra.get("cpu_adapter", True):
        return []  # no CUDA copy in this run, or WebGPU ran on a CPU adapter: not the same device
    out = []
    for r in rows:
        if r.section == SECTION and r.name.startswith("bandwidth: ") and r.value and \
                r.extra.get("key") in ("copy", "saxpy4"):
            out.append(Row(SECTION, f"{r.name} vs CUDA", r.value, "GB/s", r.value / cuda.value,
                           "CUDA d2d copy", note=f"CUDA's cuMemcpyDtoD from the kernels section; WebGPU on {adapter.extra['adapter']['name']}"))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
