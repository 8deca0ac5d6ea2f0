"""The Slang particle step on CUDA and WebGPU: ``python -m example_shader_pkg.demo``.

    python -m example_shader_pkg.demo [--backend cuda|webgpu|all] [--particles N] [--steps K]
                                      [--mode direct|indirect|graph|all] [--json]

One step of the Slang crate's particle kernels (``kernels/slang/particles_step.slang``):
``slang_integrate`` and ``slang_collide_ground`` over N particles, ``slang_compact_alive`` (the
alive count lands in a device buffer), then ``slang_kinetic_energy`` over the alive list, one
partial sum per group. The same source, the same calls, three ways on each backend:

* ``direct``:   the alive count is read on the host every step and the energy kernel launched
  over exactly that many threads (what one writes without indirect dispatch: one host round
  trip per step);
* ``indirect``: the energy kernel dispatched from the device-side count
  (``dispatch_indirect(count, ..., threads=True)``: CUDA's persistent grid, WebGPU's native
  ``dispatch_workgroups_indirect``), no host round trip;
* ``graph``:    the indirect step captured once and replayed K times (a CUDA graph; on WebGPU a
  recording, replayed as one command encoder and one submit: WebGPU has no graphs).

Every way is checked against the NumPy reference after K steps: the alive count exactly, the
energy to 1e-4, the particle state bit for bit on CUDA (the crate is built with
``--fmad=false`` and written without fused operations) and to 1e-4 on WebGPU (its compilers may
contract ``p + v * dt`` into an FMA, which compounds over the steps; the table says how far it
is).

``--backend all`` (the default) runs each backend this machine can use in a process of its own
(``KHAL_BACKEND`` is chosen once per process) and prints one table. The CUDA C++ crate's
version of the step is ``python -m example_shader_pkg.demo_cuda``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

MODES = ("direct", "indirect", "graph")
BACKENDS = ("cuda", "webgpu")
#: WebGPU's particle state after K steps may differ from the float32 reference by this much per
#: field, relative and absolute (FMA contraction of ``p + v * dt`` by the shader compiler,
#: compounded over the steps; one kernel alone is within ``slang_reference.WEBGPU_ULPS`` ulps)
WEBGPU_TOLERANCE = 1e-4


@dataclass
class Buffers:
    particles: Any
    indices: Any
    count: Any
    partials: Any

    def free(self) -> None:
        for b in (self.particles, self.indices, self.count, self.partials):
            b.free()


@dataclass
class Result:
    backend: str
    mode: str
    steps: int
    seconds: float
    ok: bool
    detail: str
    device: str = ""

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("inf")


def _buffers(rt: Any, particles: np.ndarray, group: int) -> Buffers:
    n = particles.size
    return Buffers(particles=rt.DeviceBuffer.from_numpy(particles),
                   indices=rt.DeviceBuffer.zeros(n, np.uint32),
                   count=rt.DeviceBuffer.zeros(1, np.uint32),
                   partials=rt.DeviceBuffer.zeros(-(-n // group), np.float32))


def step(K: Any, b: Buffers, params: Any, n: int, direct: bool) -> None:
    """One particle step, in order on the current stream."""
    K.slang_integrate(n, b.particles, params)
    K.slang_collide_ground(n, b.particles, params)
    b.count.fill_zero()
    b.partials.fill_zero()
    K.slang_compact_alive(n, b.particles, params, b.indices, b.count)
    if direct:
        alive = int(b.count.to_numpy()[0])  # the host round trip
        K.slang_kinetic_energy(alive, b.particles, b.indices, b.count, b.partials)
    else:
        K.slang_kinetic_energy.dispatch_indirect(b.count, b.particles, b.indices, b.count, b.partials,
                                                 threads=True)


def reference(R: Any, particles: np.ndarray, params: Any, steps: int) -> tuple[np.ndarray, int, float]:
    p = particles
    for _ in range(steps):
        p = R.collide_ground(R.integrate(p, params), params)
    alive = R.compact_alive(p, params)
    return p, int(alive.size), float(R.kinetic_energy_total(p, alive))


def run_mode(mode: str, backend: str, K: Any, R: Any, rt: Any, particles: np.ndarray, params: Any,
             steps: int, expected: tuple[np.ndarray, int, float], group: int) -> Result:
    n = particles.size
    direct = mode == "direct"
    st = rt.default_stream()
    # warm-up on scratch buffers: loads the kernels, builds pipelines / uniforms / bind groups
    scratch = _buffers(rt, particles, group)
    step(K, scratch, params, n, direct)
    st.synchronize()
    b = _buffers(rt, particles, group)
    st.synchronize()
    graph = None
    if mode == "graph":
        graph = rt.capture_graph(step, K, b, params, n, False)
        graph.upload()
        st.synchronize()
    t0 = time.perf_counter()
    if graph is not None:
        for _ in range(steps):
            graph.launch()
    else:
        for _ in range(steps):
            step(K, b, params, n, direct)
    st.synchronize()
    seconds = time.perf_counter() - t0
    got = b.particles.to_numpy()
    count = int(b.count.to_numpy()[0])
    energy = float(np.sum(b.partials.to_numpy(), dtype=np.float64))
    if graph is not None:
        graph.close()
    scratch.free()
    b.free()
    exp_p, exp_count, exp_energy = expected
    problems, notes = [], []
    if got.tobytes() == exp_p.tobytes():
        notes.append("bit-exact")
    else:
        g, w = got.view(np.float32), exp_p.view(np.float32)
        diff = float(np.max(np.abs(g.astype(np.float64) - w))) if g.size else 0.0
        if backend == "webgpu" and np.allclose(g, w, rtol=WEBGPU_TOLERANCE, atol=WEBGPU_TOLERANCE):
            notes.append(f"within {diff:.1e} (FMA contraction), {R.ulp_distance(got, exp_p)} ulp")
        else:
            problems.append(f"particle state differs (max |diff| {diff:.3g}, {R.ulp_distance(got, exp_p)} ulp)")
    if count != exp_count:
        problems.append(f"alive {count} != {exp_count}")
    if abs(energy - exp_energy) > 1e-4 * abs(exp_energy) + 1e-6:
        problems.append(f"energy {energy:.6g} != {exp_energy:.6g}")
    detail = "; ".join(problems) if problems else f"{', '.join(notes)}, alive={count}, energy={energy:.6g}"
    return Result(backend, mode, steps, seconds, not problems, detail)


def _device_name(rt: Any, backend: str) -> str:
    dev = rt.Device(0)
    if backend == "cuda":
        return f"{dev.name} (sm_{''.join(map(str, dev.compute_capability()))})"
    st = rt.backend_status()
    a = st.adapter
    return f"{a.get('name', dev.name)} ({a.get('backend_type', '?')}, {a.get('adapter_type', '?')})"


def run_here(backend: str, modes: tuple[str, ...], n: int, steps: int, seed: int = 0,
             dt: float = 1e-3) -> list[Result]:
    """Every mode on ``backend`` in this process (``KHAL_BACKEND`` must name it or be unset
    before khal_runtime chooses a backend)."""
    os.environ["KHAL_BACKEND"] = backend
    import khal_runtime as rt

    from example_shader_pkg import SimParams, kernels
    from example_shader_pkg import reference as cuda_reference
    from example_shader_pkg import slang_reference as R

    st = rt.backend_status()
    if not st.usable:
        raise rt.BackendUnavailableError(st.reason)
    if st.backend != backend:
        raise RuntimeError(f"this process already runs on {st.backend}")
    particles = cuda_reference.make_particles(n, seed=seed)
    params = SimParams(dt=dt, gravity=-9.81, restitution=0.5, n=n)
    expected = reference(R, particles, params, steps)
    device = _device_name(rt, backend)
    results = []
    for m in modes:
        r = run_mode(m, backend, kernels, R, rt, particles, params, steps, expected, R.PARTICLE_GROUP)
        r.device = device
        results.append(r)
    return results


def run_elsewhere(backend: str, modes: tuple[str, ...], n: int, steps: int, seed: int = 0,
                  dt: float = 1e-3) -> list[Result] | str:
    """Every mode on ``backend`` in a new process: its results, or why it could not run."""
    cmd = [sys.executable, "-m", "example_shader_pkg.demo", "--backend", backend, "--json",
           "--particles", str(n), "--steps", str(steps), "--seed", str(seed), "--dt", repr(dt),
           "--mode", modes[0] if len(modes) == 1 else "all"]
    env = dict(os.environ, KHAL_BACKEND=backend)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if tail.startswith("khal_runtime.errors."):  # the package's import refused the backend
            return tail.partition(": ")[2]
        return f"did not run ({tail})"
    if "unavailable" in doc:
        return str(doc["unavailable"])
    return [Result(**r) for r in doc["results"]]


def benchmark(mode: str, steps: int = 200, particles: int = 1 << 16, seed: int = 0,
              backend: str = "cuda") -> dict[str, Any]:
    """One mode on one backend for ``benchmarks/run.py``: steps/s, checked like the demo (an
    AssertionError when the result is wrong). Runs in a new process unless this one already
    runs on ``backend``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    here = _current_backend()
    got = (run_here(backend, (mode,), particles, steps, seed) if here in (None, backend)
           else run_elsewhere(backend, (mode,), particles, steps, seed))
    if isinstance(got, str):
        raise RuntimeError(f"demo on {backend}: {got}")
    r = got[0]
    if not r.ok:
        raise AssertionError(f"demo {backend} {mode}: {r.detail}")
    return {"steps_per_s": r.steps_per_s, "particles": particles, "steps": steps, "mode": mode,
            "backend": backend, "device": r.device, "detail": r.detail}


def _current_backend() -> str | None:
    """The backend this process chose already, None if none was chosen yet."""
    if "khal_runtime" not in sys.modules:
        return None
    from khal_runtime import backends

    return backends.chosen()


def table(results: list[Result], skipped: dict[str, str], n: int, steps: int) -> str:
    lines = [f"Slang particle step: {n} particles, {steps} steps",
             f"{'backend':<8} {'mode':<9} {'steps/s':>10} {'ms/step':>9}  {'reference':<9}  detail"]
    for r in results:
        lines.append(f"{r.backend:<8} {r.mode:<9} {r.steps_per_s:>10.1f} {1000 / r.steps_per_s:>9.3f}  "
                     f"{'same' if r.ok else 'DIFFERS':<9}  {r.detail}")
    devices = {r.backend: r.device for r in results}
    for b, d in devices.items():
        lines.append(f"{b}: {d}")
    for b, why in skipped.items():
        lines.append(f"{b}: not run: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m example_shader_pkg.demo",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--backend", choices=BACKENDS + ("all",), default="all",
                    help="where to run (default: every backend this machine can use)")
    ap.add_argument("--particles", "-n", type=int, default=1 << 16, help="number of particles (default 2^16)")
    ap.add_argument("--steps", "-k", type=int, default=200, help="steps per mode (default 200)")
    ap.add_argument("--mode", choices=MODES + ("all",), default="all", help="which way(s) to run")
    ap.add_argument("--dt", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the results as JSON (one backend)")
    a = ap.parse_args(argv)
    if a.particles < 1 or a.steps < 1:
        ap.error("--particles and --steps must be >= 1")
    modes = MODES if a.mode == "all" else (a.mode,)
    if a.json and a.backend == "all":
        ap.error("--json runs one backend: pass --backend cuda or --backend webgpu")

    results: list[Result] = []
    skipped: dict[str, str] = {}
    if a.backend == "all":
        for b in BACKENDS:
            got = run_elsewhere(b, modes, a.particles, a.steps, a.seed, a.dt)
            if isinstance(got, str):
                skipped[b] = got
            else:
                results += got
        if not results:
            print(table(results, skipped, a.particles, a.steps))
            return 2
    else:
        try:
            results = run_here(a.backend, modes, a.particles, a.steps, a.seed, a.dt)
        except Exception as exc:  # noqa: BLE001 - the backend cannot run here: say why
            from khal_runtime.errors import KhalError

            if not isinstance(exc, KhalError):
                raise
            if a.json:
                print(json.dumps({"unavailable": str(exc)}))
            else:
                print(f"{a.backend}: not run: {exc}", file=sys.stderr)
            return 2
        if a.json:
            print(json.dumps({"results": [asdict(r) for r in results]}))
            return 0 if all(r.ok for r in results) else 1
    print(table(results, skipped, a.particles, a.steps))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
