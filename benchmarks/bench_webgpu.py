"""WebGPU backend micro-benchmark: per-dispatch host cost and storage-bound bandwidth.

    python benchmarks/bench_webgpu.py [--dispatches 1000] [--rounds 5] [--mb 64] [--json out.json]

Runs on whatever adapter wgpu-py finds (``KHAL_WEBGPU_ADAPTER`` picks one): lavapipe on CPU
machines, the H200 through Vulkan on the lent GPU machine (see shared/device.md).

Dispatch cost, in one process and run, the same pipeline (a one-group WGSL saxpy, scalars in
a uniform block) and the same batch (``--dispatches`` recorded into one open compute pass,
then one submit):

* ``raw wgpu-py``: ``set_pipeline`` / ``set_bind_group`` / ``dispatch_workgroups`` through
  wgpu-py's public methods, a prebuilt bind group: the DESIGN.md yardstick;
* ``raw C calls``: the same three calls straight into wgpu-native (wgpu-py's cffi ``lib``);
* ``typed call``: ``plan.call(n, args)`` (what ``kernels.saxpy(n, y, x, a, n)`` runs),
  same arguments each time (its memo path);
* ``typed call, new scalar``: a different float each call (packing, uniform cache, bind group);
* ``bound``: ``b = plan.bind(args); b(n)``; ``recording replay``: a captured batch replayed.

``record`` is the host time to record one dispatch (nothing submitted while timing; best of the
rounds); ``total`` adds the submit and the wait for the batch to run (median; on lavapipe the
"GPU" is the same two CPU cores, so it mostly measures lavapipe).

Bandwidth: a vec4 copy kernel (``y[i] = x[i]``) and ``copy_buffer_to_buffer`` of the same
bytes (read + write counted), best of ``--rounds`` batches of 10, wall clock around submit and
wait, and the GPU time from timestamp queries where the adapter has them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if not os.path.isdir(os.environ.get("XDG_RUNTIME_DIR", "") or "/nonexistent"):
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="khal-xdg-")

import numpy as np  # noqa: E402

from khal_runtime.manifest import Binding, Entry, Param, ScalarSlot, WebGpuTarget  # noqa: E402


def _entry(name: str, block: int, params: tuple[Param, ...], bindings: tuple[Binding, ...], **kw: Any) -> Entry:
    h = hashlib.sha256(name.encode()).hexdigest()[:16]
    sym = f"{name}_khal_{h}"
    return Entry(name=name, symbol=sym, hash=h, block_size=(block, 1, 1), params=params,
                 webgpu=(WebGpuTarget(target="wgsl", path=f"bench/{name}.wgsl", entry_point=sym,
                                      bindings=bindings, **kw),))


def _storage(name: str, writable: bool = False, et: str = "float32") -> Param:
    return Param(name=name, kind="storage", element_type=et, element_size=4, element_align=4,
                 shape="slice", writable=writable)


def saxpy() -> tuple[Entry, str]:
    e = _entry("saxpy", 64, (_storage("y", True), _storage("x"),
                             Param(name="a", kind="scalar", element_type="float32", element_size=4),
                             Param(name="n", kind="scalar", element_type="uint32", element_size=4)),
               (Binding(param=None, group=0, binding=0, access="uniform"),
                Binding(param="y", group=0, binding=1, access="read_write"),
                Binding(param="x", group=0, binding=2, access="read")),
               scalars="uniform", scalar_block_size=8,
               scalar_slots=(ScalarSlot(param="a", offset=0, size=4), ScalarSlot(param="n", offset=4, size=4)))
    return e, f"""
struct S {{ a: f32, n: u32 }}
@group(0) @binding(0) var<uniform> s: S;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@compute @workgroup_size(64) fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    let i = g.x; if (i < s.n) {{ y[i] = s.a * x[i] + y[i]; }}
}}"""


def copy4() -> tuple[Entry, str]:
    e = _entry("copy4", 256, (_storage("y", True), _storage("x")),
               (Binding(param="y", group=0, binding=0, access="read_write"),
                Binding(param="x", group=0, binding=1, access="read")))
    return e, f"""
@group(0) @binding(0) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@compute @workgroup_size(256) fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    let i = g.x; if (i < arrayLength(&y)) {{ y[i] = x[i]; }}
}}"""


def _time_batch(st: Any, record: Callable[[int], None], n: int, rounds: int) -> tuple[float, float]:
    """(record us per dispatch, total us per dispatch): the best round for the host cost (the
    least disturbed by other work on the machine), the median for the total."""
    rec, tot = [], []
    for _ in range(rounds):
        st.synchronize()
        t0 = time.perf_counter()
        record(n)
        t1 = time.perf_counter()
        st.flush()
        st.synchronize()
        t2 = time.perf_counter()
        rec.append((t1 - t0) / n * 1e6)
        tot.append((t2 - t0) / n * 1e6)
    return min(rec), statistics.median(tot)


def dispatch_costs(dev: Any, n: int, rounds: int) -> list[tuple[str, float, float]]:
    from khal_runtime.backends.webgpu.arrays import WgpuArray
    from khal_runtime.backends.webgpu.kernel import KernelPlan
    from khal_runtime.backends.webgpu.recording import capture_recording
    from khal_runtime.backends.webgpu.uniforms import uniform_pool

    e, src = saxpy()
    plan = KernelPlan(e, dev, src, "bench")
    st = dev.stream
    st.batch = 10 ** 9  # submit only where the benchmark says
    x = WgpuArray.from_numpy(np.ones(64, np.float32), device=dev)
    y = WgpuArray.zeros(64, device=dev)
    args = (y, x, 1.0, 64)
    bgs, _imm = plan.resolve(args)
    pl = plan.pipeline
    d = dev.device
    bg, dyn = bgs[0].gpu, list(bgs[0].dyn)  # the scalar block's dynamic offset

    def raw_public(k: int) -> None:
        enc = d.create_command_encoder()
        p = enc.begin_compute_pass()
        for _ in range(k):
            p.set_pipeline(pl.gpu)
            p.set_bind_group(0, bg, dyn)
            p.dispatch_workgroups(1, 1, 1)
        p.end()
        st._enc_bench = enc  # submitted below, as one batch

    def raw_c(k: int) -> None:
        lib = st._lib
        enc = d.create_command_encoder()
        p = enc.begin_compute_pass()
        praw, plr, bgr, nd, offs = p._internal, pl.raw, bgs[0].raw, bgs[0].n_dyn, bgs[0].offsets
        sp, sb, dw = (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                      lib.wgpuComputePassEncoderDispatchWorkgroups)
        for _ in range(k):
            sp(praw, plr)
            sb(praw, 0, bgr, nd, offs)
            dw(praw, 1, 1, 1)
        p.end()
        st._enc_bench = enc

    def submit_raw() -> None:
        enc = getattr(st, "_enc_bench", None)
        if enc is not None:
            dev.queue.submit([enc.finish()])
            st._enc_bench = None

    call = plan.call

    def typed(k: int) -> None:
        for _ in range(k):
            call(64, args)

    vals = [float(i % 97) for i in range(n)]

    def typed_new_scalar(k: int) -> None:
        for i in range(k):
            call(64, (y, x, vals[i], 64))

    b = plan.bind(args)

    def bound(k: int) -> None:
        for _ in range(k):
            b(64)

    def step(k: int) -> None:
        for _ in range(k):
            call(64, args)

    rec = capture_recording(step, n, device=dev, label="bench")

    def replay(k: int) -> None:
        rec.launch()

    rows: list[tuple[str, float, float]] = []
    orig_flush = st.flush

    def flush_with_raw() -> None:
        submit_raw()
        orig_flush()

    st.flush = flush_with_raw  # type: ignore[method-assign]
    try:
        for name, fn in (("raw wgpu-py (public methods)", raw_public), ("raw C calls (wgpu-native)", raw_c),
                         ("typed call k(n, *args)", typed), ("typed call, new scalar each call", typed_new_scalar),
                         ("bound b(n)", bound), ("recording replay", replay)):
            fn(min(n, 50))  # warm
            st.synchronize()
            uniform_pool(dev).clear()
            r, t = _time_batch(st, fn, n, rounds)
            rows.append((name, r, t))
    finally:
        st.flush = orig_flush  # type: ignore[method-assign]
        rec.close()
    return rows


def bandwidth(dev: Any, mb: int, rounds: int) -> list[tuple[str, float, float | None]]:
    from khal_runtime.backends.webgpu.arrays import WgpuArray
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    n = (mb << 20) // 4 // 1024 * 1024  # floats, a multiple of 1024 (vec4 x 256 per group)
    nbytes = n * 4
    limit = min(dev.max_storage_binding, dev.max_buffer_size)
    if nbytes > limit:
        n = limit // 4 // 1024 * 1024
        nbytes = n * 4
    e, src = copy4()
    plan = KernelPlan(e, dev, src, "bench")
    x = WgpuArray.from_numpy(np.arange(n, dtype=np.float32), device=dev)
    y = WgpuArray.zeros(n, device=dev)
    st = dev.stream
    groups = n // 4 // 256
    if groups > dev.max_groups:
        raise SystemExit(f"--mb {mb} needs {groups} groups, more than the device's {dev.max_groups}")
    reps = 10

    def kernel() -> None:
        for _ in range(reps):
            plan.launch(groups, None, (y, x))

    def copy() -> None:
        with st.lock:
            enc = st.encoder()
            for _ in range(reps):
                enc.copy_buffer_to_buffer(x.allocation.buffer, 0, y.allocation.buffer, 0, nbytes)

    out: list[tuple[str, float, float | None]] = []
    for name, fn in (("copy kernel (vec4, storage-bound)", kernel), ("copy_buffer_to_buffer", copy)):
        fn()
        st.synchronize()
        best = float("inf")
        for _ in range(rounds):
            st.synchronize()
            t0 = time.perf_counter()
            fn()
            st.synchronize()
            best = min(best, (time.perf_counter() - t0) / reps)
        gpu = None
        if dev.has_timestamps:
            from khal_runtime.backends.webgpu.profiling import disable_profiling, enable_profiling

            if name.startswith("copy kernel"):
                t = enable_profiling(dev)
                try:
                    fn()
                    s = t.stats().get("bench.copy4")
                    gpu = 2 * nbytes / (s["min_us"] * 1e-6) / 1e9 if s and s["min_us"] > 0 else None
                finally:
                    disable_profiling(dev)
        out.append((name, 2 * nbytes / best / 1e9, gpu))
    np.testing.assert_array_equal(y[0:1024].to_numpy(), np.arange(1024, dtype=np.float32))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dispatches", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mb", type=int, default=64, help="MiB copied per pass in the bandwidth rows")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    from khal_runtime.backends.webgpu.device import get_device, status

    st = status()
    if not st.usable:
        print(f"WebGPU unavailable: {st.reason}")
        return 0
    dev = get_device(0)
    rows = dispatch_costs(dev, a.dispatches, a.rounds)
    bw = bandwidth(dev, a.mb, a.rounds)
    raw = rows[0][1]
    raw_c = rows[1][1]
    print(f"\nWebGPU backend on {dev.describe()}; {a.dispatches} dispatches per submit; record: best of "
          f"{a.rounds}, total: median")
    print(f"{'path':<36} {'record us':>10} {'total us':>10} {'/raw':>7} {'/raw C':>7}")
    for name, r, t in rows:
        print(f"{name:<36} {r:>10.2f} {t:>10.2f} {r / raw:>7.2f} {r / raw_c:>7.2f}")
    print(f"\nbandwidth, {a.mb} MiB per pass (read + write), best of {a.rounds}")
    print(f"{'what':<36} {'GB/s wall':>10} {'GB/s GPU':>10} {'/copy':>7}")
    ref = bw[1][1]
    for name, g, gpu in bw:
        gs = f"{gpu:>10.1f}" if gpu else f"{'n/a':>10}"
        print(f"{name:<36} {g:>10.2f} {gs} {g / ref:>7.2f}")
    if not dev.has_timestamps:
        print("(no timestamp-query on this adapter: GPU times not available)")
    if a.json:
        a.json.write_text(json.dumps({"device": dev.describe(), "dispatch": rows, "bandwidth": bw}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
