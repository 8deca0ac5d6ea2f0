"""CUDA graph capture, replay and rebinding on a real GPU, with the example package's particle step.

Also: the capture guards against the real driver, and KHAL_CUDA_TRACE / KHAL_CUDA_PROFILE
on real launches (in a subprocess, since the variables are read at import), and the demo.
"""

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


@pytest.fixture(scope="module")
def K(example_pkg):
    return example_pkg.kernels


@pytest.fixture(scope="module")
def R(example_pkg):
    return example_pkg.reference


def _params(example_pkg, n: int):
    return example_pkg.SimParams(dt=1e-3, gravity=-9.81, restitution=0.5, n=n)


def _step(K, p, params, n, st):
    K.integrate(n, p, params, stream=st)
    K.collide_ground(n, p, params, stream=st)


def test_capture_replay_matches_reference(rt, example_pkg, K, R) -> None:
    n = 100_003
    st = rt.default_stream()
    particles = R.make_particles(n, seed=1)
    params = _params(example_pkg, n)
    p = rt.DeviceBuffer.from_numpy(particles, st)
    warm = rt.DeviceBuffer.from_numpy(particles, st)
    _step(K, warm, params, n, st)  # warm-up: the uniform is cached
    with st.capture(label="step") as cap:
        _step(K, p, params, n, st)
    g = cap.graph
    assert g.node_count == 2
    np.testing.assert_array_equal(p.to_numpy(), particles)  # captured, not run
    g.upload()
    expected = particles
    for _ in range(5):
        g.launch()
        expected = R.collide_ground(R.integrate(expected, params), params)
    assert p.to_numpy().tobytes() == expected.tobytes()
    g.close()


def test_begin_end_capture_and_rebind(rt, example_pkg, K, R) -> None:
    n = 4096
    st = rt.default_stream()
    params = _params(example_pkg, n)
    a0, b0 = R.make_particles(n, seed=2), R.make_particles(n, seed=3)
    a, b = rt.DeviceBuffer.from_numpy(a0, st), rt.DeviceBuffer.from_numpy(b0, st)
    _step(K, rt.DeviceBuffer.from_numpy(a0, st), params, n, st)
    g = rt.capture_graph(_step, K, a, params, n, st, stream=st)
    g.launch()
    assert g.rebind(K, b, params, n, st) is True  # cuGraphExecUpdate, no re-instantiation
    g.launch()
    g.launch()
    one = R.collide_ground(R.integrate(a0, params), params)
    two = R.collide_ground(R.integrate(R.collide_ground(R.integrate(b0, params), params), params), params)
    assert a.to_numpy().tobytes() == one.tobytes()
    assert b.to_numpy().tobytes() == two.tobytes()
    # the stream methods
    st.begin_capture()
    _step(K, a, params, n, st)
    g2 = st.end_capture()
    g2.launch()
    assert a.to_numpy().tobytes() == R.collide_ground(R.integrate(one, params), params).tobytes()
    g.close()
    g2.close()


def test_torch_buffers_in_a_graph(rt, example_pkg, K, R) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    n = 10_000
    st = rt.default_stream()
    params = _params(example_pkg, n)
    x0 = R.make_particles(n, seed=4)
    t = torch.from_numpy(x0.view(np.float32).copy()).cuda()  # 8 floats per particle
    torch.cuda.synchronize()
    view = rt.DeviceBuffer(t.data_ptr(), n, example_pkg.PARTICLE_DTYPE, 0)  # the tensor's memory
    _step(K, rt.DeviceBuffer.from_numpy(x0, st), params, n, st)
    g = rt.capture_graph(_step, K, view, params, n, st, stream=st)
    g.launch()
    st.synchronize()
    got = t.cpu().numpy().view(example_pkg.PARTICLE_DTYPE)
    assert got.tobytes() == R.collide_ground(R.integrate(x0, params), params).tobytes()
    g.close()
    del view, t  # the rule: the tensor outlives the graph


def test_errors_inside_capture(rt, example_pkg, K, R) -> None:
    from khal_runtime.errors import CaptureError

    n = 1024
    st = rt.default_stream()
    p = rt.DeviceBuffer.from_numpy(R.make_particles(n, seed=5), st)
    fresh = example_pkg.SimParams(dt=0.123456, gravity=-1.0, restitution=0.25, n=n)
    with pytest.raises(CaptureError, match="allocate every buffer before begin_capture"):
        with st.capture():
            rt.DeviceBuffer.alloc(16)
    with pytest.raises(CaptureError, match="to_numpy"):
        with st.capture():
            p.to_numpy()
    with pytest.raises(CaptureError, match="Stream.synchronize"):
        with st.capture():
            st.synchronize()
    with pytest.raises(CaptureError, match="Launch once with the same uniform values before capture"):
        with st.capture():
            K.integrate(n, p, fresh, stream=st)
    count = rt.DeviceBuffer.zeros(1, np.uint32)
    idx = rt.DeviceBuffer.zeros(n, np.uint32)
    energy = rt.DeviceBuffer.zeros(1, np.float32)
    with pytest.raises(CaptureError, match="host_read=False"):
        with st.capture():
            K.kinetic_energy.dispatch_indirect(count, p, idx, count, energy, threads=True, host_read=True,
                                               stream=st)
    with pytest.raises(CaptureError, match="legacy NULL stream"):
        rt.Stream(0, 0).begin_capture()
    # after all that the stream works and captures again
    assert not st.is_capturing()
    K.integrate(n, p, fresh, stream=st)
    st.synchronize()
    with st.capture() as cap:
        K.integrate(n, p, fresh, stream=st)
    cap.graph.launch()
    st.synchronize()
    cap.graph.close()


def test_capture_unsupported_driver_error_is_capture_error(rt) -> None:
    """The real driver refuses capture on the legacy stream; check() turns that into CaptureError."""
    from cuda.bindings import driver

    from khal_runtime.backends.cuda.driver import check
    from khal_runtime.errors import CaptureError

    rt.Device(0).set_current()
    res = driver.cuStreamBeginCapture(driver.CUstream(0),
                                      driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
    if not res[0]:  # pragma: no cover - a driver that allows it
        driver.cuStreamEndCapture(driver.CUstream(0))
        pytest.skip("this driver captures the legacy stream")
    with pytest.raises(CaptureError, match="CUDA_ERROR_STREAM_CAPTURE"):
        check(res, "cuStreamBeginCapture")


def _run_py(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import example_shader_pkg

    e = dict(os.environ)
    for k in ("KHAL_TRACE", "KHAL_PROFILE", "KHAL_TRACE_FILE", "KHAL_PROFILE_FILE",
              "KHAL_CUDA_TRACE", "KHAL_CUDA_PROFILE", "KHAL_CUDA_TRACE_FILE", "KHAL_CUDA_NVTX",
              "KHAL_TRACE_INDIRECT", "KHAL_CUDA_INDIRECT_SYNC"):
        e.pop(k, None)
    e.update(env)
    site = os.path.dirname(os.path.dirname(example_shader_pkg.__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    e["PYTHONPATH"] = os.pathsep.join([site, root, e.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)


_SCRIPT = """
import numpy as np, khal_runtime as rt
from example_shader_pkg import kernels as K, reference as R, SimParams
n = 5000
st = rt.default_stream()
p = rt.DeviceBuffer.from_numpy(R.make_particles(n, seed=6), st)
params = SimParams(dt=1e-3, gravity=-9.81, restitution=0.5, n=n)
for _ in range(3):
    K.integrate(n, p, params)
    K.collide_ground(n, p, params)
g = rt.capture_graph(lambda: (K.integrate(n, p, params), K.collide_ground(n, p, params)), stream=st)
for _ in range(4):
    g.launch()
st.synchronize()
print("done")
"""


def test_trace_on_real_launches(example_pkg, rt, tmp_path) -> None:
    out = tmp_path / "trace.log"
    r = _run_py(_SCRIPT, KHAL_CUDA_TRACE="1", KHAL_CUDA_TRACE_FILE=str(out))
    assert r.returncode == 0, r.stderr
    lines = out.read_text().splitlines()
    launches = [ln for ln in lines if ln.startswith("khal: launch ")]
    assert len(launches) == 8, lines
    assert "particles.integrate grid=40x1x1 block=128x1x1 shmem=0" in launches[0]
    assert "particles=storage Particle[5000] (156.2 KiB @0x" in launches[0]
    assert "params=uniform SimParams (16 B, host)" in launches[0]
    assert launches[-1].endswith("(16 B, host)") and "(captured)" in launches[-1]
    assert sum(ln.startswith("khal: graph ") for ln in lines) == 4


def test_trace_sync_on_real_launches(example_pkg, rt) -> None:
    r = _run_py(_SCRIPT, KHAL_CUDA_TRACE="sync")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("khal: launch ") == 8


def test_profile_on_real_launches(example_pkg, rt) -> None:
    r = _run_py(_SCRIPT, KHAL_CUDA_PROFILE="1")
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert "khal profile: GPU time per kernel (CUDA events, 10 timed launches)" in err, err
    rows = {ln.split()[0]: ln.split() for ln in err.splitlines() if ln.startswith("particles.")}
    assert rows["particles.integrate"][1] == "3" and rows["particles.collide_ground"][1] == "3"
    assert float(rows["particles.integrate"][3]) > 0  # mean us
    graph_rows = [ln for ln in err.splitlines() if ln.startswith("graph ")]
    assert len(graph_rows) == 1 and graph_rows[0].split()[2] == "4"
    assert "captured kernels: particles.integrate, particles.collide_ground" in err


def test_demo_small(example_pkg, rt) -> None:
    import example_shader_pkg

    site = os.path.dirname(os.path.dirname(example_shader_pkg.__file__))
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "example_shader_pkg.demo_cuda", "--particles", "20000", "--steps", "20"],
                       env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    body = {ln.split()[0]: ln.split() for ln in lines[2:]}
    assert set(body) == {"sync", "device", "graph"}
    assert all(row[3] == "same" for row in body.values()), r.stdout


def test_slang_demo_small_on_cuda(example_pkg, rt) -> None:
    """The Slang particle step, direct / indirect / graph on CUDA, bit-exact against NumPy."""
    import example_shader_pkg

    site = os.path.dirname(os.path.dirname(example_shader_pkg.__file__))
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "example_shader_pkg.demo", "--backend", "cuda", "--particles", "20000",
                        "--steps", "20"], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln.split() for ln in r.stdout.strip().splitlines()[2:] if ln.startswith("cuda ")]
    assert {row[1] for row in rows} == {"direct", "indirect", "graph"}, r.stdout
    assert all(row[4] == "same" and "bit-exact" in " ".join(row) for row in rows), r.stdout


def test_buffer_dropped_inside_capture_is_freed_after_it(rt, example_pkg, K, R) -> None:
    """cuMemFree inside a capture would invalidate it: a buffer released there (a temporary,
    or one the launch memo lets go of) is freed when the capture ends."""
    from khal_runtime import capture_state

    n = 2048
    st = rt.default_stream()
    params = _params(example_pkg, n)
    a0 = R.make_particles(n, seed=6)
    tmp = rt.DeviceBuffer.from_numpy(a0, st)
    _step(K, tmp, params, n, st)  # the memo of integrate/collide_ground now holds tmp
    p = rt.DeviceBuffer.from_numpy(a0, st)
    st.synchronize()
    extra = rt.DeviceBuffer.from_numpy(a0, st)
    st.synchronize()
    with st.capture(label="drop") as cap:
        del tmp  # the memo still holds it ...
        _step(K, p, params, n, st)  # ... until this launch replaces the memo
        extra.free()  # explicit free inside the capture
        assert capture_state.pending_releases()  # waiting for the capture to end
    assert not capture_state.pending_releases()
    cap.graph.launch()
    assert p.to_numpy().tobytes() == R.collide_ground(R.integrate(a0, params), params).tobytes()
    cap.graph.close()
