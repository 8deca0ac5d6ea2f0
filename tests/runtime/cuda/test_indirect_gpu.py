"""Indirect dispatch on a real GPU: device-side (persistent grid) vs host read, and in a graph."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def rt():
    from tests.helpers.gpu import require_gpu

    require_gpu()
    import khal_runtime

    return khal_runtime


def _setup(rt, example_pkg, n: int, seed: int):
    R = example_pkg.reference
    st = rt.default_stream()
    particles = R.make_particles(n, seed=seed)
    params = example_pkg.SimParams(dt=1e-3, gravity=-9.81, restitution=0.5, n=n)
    p = rt.DeviceBuffer.from_numpy(particles, st)
    idx = rt.DeviceBuffer.zeros(max(n, 1), np.uint32, stream=st)
    count = rt.DeviceBuffer.zeros(1, np.uint32, stream=st)
    example_pkg.kernels.compact_alive(n, p, params, idx, count, stream=st)
    alive = R.compact_alive(particles, params)
    return st, particles, p, idx, count, alive


def _energy(rt, K, st, p, idx, count, **kw) -> float:
    e = rt.DeviceBuffer.zeros(1, np.float32, stream=st)
    K.kinetic_energy.dispatch_indirect(count, p, idx, count, e, stream=st, **kw)
    return float(e.to_numpy()[0])


@pytest.mark.parametrize("n", [1, 1000, 1 << 20])
def test_device_side_equals_host_read(rt, example_pkg, n: int) -> None:
    K, R = example_pkg.kernels, example_pkg.reference
    st, particles, p, idx, count, alive = _setup(rt, example_pkg, n, seed=n)
    assert int(count.to_numpy()[0]) == alive.size
    want = R.kinetic_energy(particles, alive)
    tol = 1e-5 * want + 1e-6
    dev = _energy(rt, K, st, p, idx, count, threads=True)
    host = _energy(rt, K, st, p, idx, count, threads=True, host_read=True)
    assert abs(dev - want) <= tol and abs(host - want) <= tol
    # a group count computed on the host side gives the same
    groups = rt.DeviceBuffer.from_numpy(np.array([(alive.size + 127) // 128], np.uint32), st)
    assert abs(_energy_groups(rt, K, st, p, idx, count, groups) - want) <= tol
    assert abs(_energy_groups(rt, K, st, p, idx, count, groups, host_read=True) - want) <= tol
    # tiny and odd persistent grids are still correct (the loop covers every group)
    for grid in (1, 3, 1000):
        assert abs(_energy(rt, K, st, p, idx, count, threads=True, grid=grid) - want) <= tol


def _energy_groups(rt, K, st, p, idx, count, groups, **kw) -> float:
    e = rt.DeviceBuffer.zeros(1, np.float32, stream=st)
    K.kinetic_energy.dispatch_indirect(groups, p, idx, count, e, stream=st, **kw)
    return float(e.to_numpy()[0])


def test_zero_count_launches_nothing_useful(rt, example_pkg) -> None:
    K = example_pkg.kernels
    st, _, p, idx, _, _ = _setup(rt, example_pkg, 1000, seed=9)
    zero = rt.DeviceBuffer.zeros(1, np.uint32, stream=st)
    assert _energy(rt, K, st, p, idx, zero, threads=True) == 0.0
    assert _energy(rt, K, st, p, idx, zero, threads=True, host_read=True) == 0.0


def test_integrate_indirect_matches_direct(rt, example_pkg) -> None:
    """A kernel written for direct dispatch (integrate) runs unchanged through its indirect variant."""
    K, R = example_pkg.kernels, example_pkg.reference
    n = 100_000
    st = rt.default_stream()
    x0 = R.make_particles(n, seed=11)
    params = example_pkg.SimParams(dt=1e-3, gravity=-9.81, restitution=0.5, n=n)
    a = rt.DeviceBuffer.from_numpy(x0, st)
    threads = rt.DeviceBuffer.from_numpy(np.array([n], np.uint32), st)
    K.integrate.dispatch_indirect(threads, a, params, threads=True, stream=st)
    assert a.to_numpy().tobytes() == R.integrate(x0, params).tobytes()


def test_indirect_in_a_graph(rt, example_pkg) -> None:
    K, R = example_pkg.kernels, example_pkg.reference
    n = 50_000
    st, particles, p, idx, count, alive = _setup(rt, example_pkg, n, seed=12)
    e = rt.DeviceBuffer.zeros(1, np.float32, stream=st)
    K.kinetic_energy.dispatch_indirect(count, p, idx, count, e, threads=True, stream=st)  # warm-up
    st.synchronize()

    def energy_step():
        e.fill_zero(st)
        K.kinetic_energy.dispatch_indirect(count, p, idx, count, e, threads=True, stream=st)

    g = rt.capture_graph(energy_step, stream=st)
    assert g.node_count == 3  # memset, helper, persistent kernel
    g.launch()
    want = R.kinetic_energy(particles, alive)
    assert abs(float(e.to_numpy()[0]) - want) <= 1e-5 * want + 1e-6
    # change the count on the device: the same graph follows it
    count.copy_from_numpy(np.array([alive.size // 2], np.uint32), st)
    g.launch()
    half = R.kinetic_energy(particles, np.sort(idx.to_numpy()[: alive.size // 2]))
    assert abs(float(e.to_numpy()[0]) - half) <= 1e-5 * half + 1e-6
    g.close()


def test_env_sync_and_trace_indirect(example_pkg, rt) -> None:
    import example_shader_pkg

    site = os.path.dirname(os.path.dirname(example_shader_pkg.__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    code = """
import numpy as np, khal_runtime as rt
from example_shader_pkg import kernels as K, reference as R, SimParams
n = 3000
p = rt.DeviceBuffer.from_numpy(R.make_particles(n, seed=3))
params = SimParams(dt=1e-3, gravity=-9.81, restitution=0.5, n=n)
idx = rt.DeviceBuffer.zeros(n, np.uint32); c = rt.DeviceBuffer.zeros(1, np.uint32)
e = rt.DeviceBuffer.zeros(1, np.float32)
K.compact_alive(n, p, params, idx, c)
K.kinetic_energy.dispatch_indirect(c, p, idx, c, e, threads=True)
K.kinetic_energy.dispatch_indirect(c, p, idx, c, e, threads=True, host_read=False)
print(int(c.to_numpy()[0]))
"""
    env = dict(os.environ, KHAL_CUDA_INDIRECT_SYNC="1", KHAL_TRACE_INDIRECT="1",
               PYTHONPATH=os.pathsep.join([site, root, os.environ.get("PYTHONPATH", "")]))
    env.pop("KHAL_CUDA_TRACE_FILE", None)
    env.pop("KHAL_TRACE_FILE", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    alive = int(r.stdout.strip())
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("khal: indirect ")]
    assert len(lines) == 1  # only the dispatch that paid a host sync
    assert f"particles.kinetic_energy host read count={alive} threads -> grid={(alive + 127) // 128}" in lines[0]
