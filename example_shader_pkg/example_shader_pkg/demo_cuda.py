"""The CUDA C++ crate's particle step, three ways: ``python -m example_shader_pkg.demo_cuda
[--particles N] [--steps K]`` (CUDA only; the Slang crate's step, on CUDA and WebGPU, is
``python -m example_shader_pkg.demo``).

One step of the particles crate (``kernels/particles/*.cu``): ``integrate`` and ``collide_ground`` over N
particles, ``compact_alive`` (writes the alive count on the device), then
``kinetic_energy`` over the alive list, dispatched *indirectly* with that
device-side thread count. Run K steps

* ``sync``:   direct launches, the indirect dispatch reads the count on the host
  (``host_read=True``: drains the stream every step);
* ``device``: direct launches, device-side indirect dispatch (persistent grid, no sync);
* ``graph``:  the step captured once as a CUDA graph, replayed K times;

print steps/s for each and check that every mode ends with the particle state
(bit for bit), alive count and energy of the NumPy reference. Needs a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

MODES = ("sync", "device", "graph")


@dataclass
class Buffers:
    particles: Any
    indices: Any
    count: Any
    energy: Any


@dataclass
class Result:
    mode: str
    steps: int
    seconds: float
    ok: bool
    detail: str

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("inf")


def _buffers(rt: Any, particles: np.ndarray, st: Any) -> Buffers:
    n = particles.size
    return Buffers(
        particles=rt.DeviceBuffer.from_numpy(particles, st),
        indices=rt.DeviceBuffer.zeros(n, np.uint32, stream=st),
        count=rt.DeviceBuffer.zeros(1, np.uint32, stream=st),
        energy=rt.DeviceBuffer.zeros(1, np.float32, stream=st),
    )


def step(K: Any, b: Buffers, params: Any, n: int, st: Any, host_read: bool) -> None:
    """One particle step, all on stream ``st``."""
    K.integrate(n, b.particles, params, stream=st)
    K.collide_ground(n, b.particles, params, stream=st)
    b.count.fill_zero(st)
    b.energy.fill_zero(st)
    K.compact_alive(n, b.particles, params, b.indices, b.count, stream=st)
    K.kinetic_energy.dispatch_indirect(b.count, b.particles, b.indices, b.count, b.energy,
                                       threads=True, host_read=host_read, stream=st)


def reference(R: Any, particles: np.ndarray, params: Any, steps: int) -> tuple[np.ndarray, int, float]:
    p = particles
    for _ in range(steps):
        p = R.collide_ground(R.integrate(p, params), params)
    alive = R.compact_alive(p, params)
    return p, int(alive.size), R.kinetic_energy(p, alive)


def run_mode(mode: str, K: Any, R: Any, rt: Any, particles: np.ndarray, params: Any, steps: int,
             expected: tuple[np.ndarray, int, float]) -> Result:
    st = rt.default_stream()
    n = particles.size
    # warm-up on scratch buffers: loads the kernels, caches the uniform, the helper, the grid
    scratch = _buffers(rt, particles, st)
    step(K, scratch, params, n, st, host_read=(mode == "sync"))
    st.synchronize()
    b = _buffers(rt, particles, st)
    st.synchronize()
    graph = None
    if mode == "graph":
        graph = rt.capture_graph(step, K, b, params, n, st, False, stream=st)
        graph.upload(st)
        st.synchronize()
    t0 = time.perf_counter()
    if graph is not None:
        for _ in range(steps):
            graph.launch(st)
    else:
        for _ in range(steps):
            step(K, b, params, n, st, host_read=(mode == "sync"))
    st.synchronize()
    seconds = time.perf_counter() - t0
    got = b.particles.to_numpy()
    count = int(b.count.to_numpy()[0])
    energy = float(b.energy.to_numpy()[0])
    if graph is not None:
        graph.close()
    exp_p, exp_count, exp_energy = expected
    problems = []
    if got.tobytes() != exp_p.tobytes():
        bad = int(np.count_nonzero(got.view(np.uint8).reshape(n, -1) != exp_p.view(np.uint8).reshape(n, -1)))
        problems.append(f"particle state differs ({bad} bytes)")
    if count != exp_count:
        problems.append(f"alive {count} != {exp_count}")
    if abs(energy - exp_energy) > 1e-4 * abs(exp_energy) + 1e-6:
        problems.append(f"energy {energy:.6g} != {exp_energy:.6g}")
    for buf in (scratch, b):
        for x in (buf.particles, buf.indices, buf.count, buf.energy):
            x.free()
    return Result(mode, steps, seconds, not problems, "; ".join(problems) or
                  f"alive={count} energy={energy:.6g}")


def table(results: list[Result], n: int, steps: int, device: str) -> str:
    lines = [f"particle step: {n} particles, {steps} steps, {device}",
             f"{'mode':<8} {'steps/s':>10} {'ms/step':>9}  {'reference':<9}  detail"]
    for r in results:
        lines.append(f"{r.mode:<8} {r.steps_per_s:>10.1f} {1000 / r.steps_per_s:>9.3f}  "
                     f"{'same' if r.ok else 'DIFFERS':<9}  {r.detail}")
    return "\n".join(lines)


#: benchmarks/ names the three ways by what they launch; the demo by how they dispatch.
_ALIASES = {"direct": "sync", "indirect": "device", "graph": "graph"}


def benchmark(mode: str, steps: int = 200, particles: int = 1 << 16, seed: int = 0) -> dict[str, Any]:
    """One mode (``sync``/``direct``, ``device``/``indirect``, ``graph``) for the benchmark
    runner: steps/s, checked against the NumPy reference like the demo itself."""
    import khal_runtime as rt

    from example_shader_pkg import SimParams, kernels
    from example_shader_pkg import reference as R

    mode = _ALIASES.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES + tuple(_ALIASES)}, got {mode!r}")
    p = R.make_particles(particles, seed=seed)
    params = SimParams(dt=1e-3, gravity=-9.81, restitution=0.5, n=particles)
    r = run_mode(mode, kernels, R, rt, p, params, steps, reference(R, p, params, steps))
    if not r.ok:
        raise AssertionError(f"demo mode {mode}: {r.detail}")
    return {"steps_per_s": r.steps_per_s, "particles": particles, "steps": steps, "mode": mode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m example_shader_pkg.demo_cuda", description=__doc__.split("\n\n")[0])
    ap.add_argument("--particles", "-n", type=int, default=1 << 20, help="number of particles (default 2^20)")
    ap.add_argument("--steps", "-k", type=int, default=200, help="steps per mode (default 200)")
    ap.add_argument("--mode", choices=MODES + ("all",), default="all", help="which way(s) to run")
    ap.add_argument("--dt", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.particles < 1 or a.steps < 1:
        ap.error("--particles and --steps must be >= 1")

    import khal_runtime as rt

    from example_shader_pkg import SimParams, kernels
    from example_shader_pkg import reference as R

    dev = rt.Device(0)
    particles = R.make_particles(a.particles, seed=a.seed)
    params = SimParams(dt=a.dt, gravity=-9.81, restitution=0.5, n=a.particles)
    t = time.perf_counter()
    expected = reference(R, particles, params, a.steps)
    print(f"NumPy reference: {a.steps} steps in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    modes = MODES if a.mode == "all" else (a.mode,)
    results = [run_mode(m, kernels, R, rt, particles, params, a.steps, expected) for m in modes]
    print(table(results, a.particles, a.steps, f"{dev.name} (sm_{''.join(map(str, dev.compute_capability()))})"))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
