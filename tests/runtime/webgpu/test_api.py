"""The public runtime API on the WebGPU backend: ``khal_runtime.load``, ``DeviceBuffer``, the typed
call, ``launch``, ``bind``, ``dispatch_indirect``, captures, ``backend_status`` and the
``KHAL_BACKEND`` rules, with a package holding the WebGPU build of the example's Slang crate, on
whatever adapter wgpu-py finds (lavapipe on CPU machines and CI)."""

from __future__ import annotations

import ctypes
import importlib
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import khal_runtime
from khal_runtime import backends
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import (ArgumentError, ArgumentValueError, BackendUnavailableError, HashMismatchError,
                                 KhalError)
from tests.helpers.slang import EXAMPLE, needs_slang_or_wheel, webgpu_package

pytestmark = [pytest.mark.webgpu, needs_slang_or_wheel]

ROOT = Path(__file__).resolve().parents[3]


def _refs() -> Any:
    """example_shader_pkg's reference modules, without importing the package (it loads kernels)."""
    if "example_shader_pkg" not in sys.modules:
        pkg = types.ModuleType("example_shader_pkg")
        pkg.__path__ = [str(EXAMPLE / "example_shader_pkg")]  # type: ignore[attr-defined]
        sys.modules["example_shader_pkg"] = pkg
    return importlib.import_module("example_shader_pkg.slang_reference")


@pytest.fixture(scope="module")
def pkg_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return webgpu_package(tmp_path_factory.mktemp("wgpu-pkg"))


@pytest.fixture
def ks(pkg_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The package loaded with KHAL_BACKEND=webgpu (a fresh backend choice)."""
    monkeypatch.setenv("KHAL_BACKEND", "webgpu")
    backends.reset()
    yield khal_runtime.load(pkg_dir)
    backends.reset()


def test_typed_call_matches_numpy_and_is_the_webgpu_backend(ks: Any) -> None:
    R = _refs()
    n = 10_000
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    y = np.random.default_rng(1).random(n, dtype=np.float32)
    dx, dy = DeviceBuffer.from_numpy(x), DeviceBuffer.from_numpy(y)
    assert dx.device_id == 0 and khal_runtime.Device(0).backend == "webgpu"
    ks.saxpy_shared(n, dy, dx, 2.5)
    want = R.saxpy_shared(x, y, 2.5)
    got = dy.to_numpy()
    assert R.matches(got, want, R.WEBGPU_ULPS), R.ulp_distance(got, want)  # drivers may fuse a*x+y
    for _ in range(3):  # repeated: the memoised path (from what the device computed)
        want = R.saxpy_shared(x, got, 2.5)
        ks.saxpy_shared(n, dy, dx, 2.5)
        got = dy.to_numpy()
        assert R.matches(got, want, R.WEBGPU_ULPS), R.ulp_distance(got, want)
    st = khal_runtime.backend_status()
    assert st.usable and st.backend == "webgpu" and st.adapter["name"] and st.why == "KHAL_BACKEND=webgpu"


def test_explicit_launch_bind_slices_and_atomics(ks: Any) -> None:
    R = _refs()
    vals = np.arange(5000, dtype=np.uint32)
    dv, tot = DeviceBuffer.from_numpy(vals), DeviceBuffer.zeros(1, np.uint32)
    ks.sum_u32(5000, dv, tot)
    assert int(tot.to_numpy()[0]) == R.sum_u32(vals)
    tot.fill_zero()
    block = ks.sum_u32.block_size[0]
    ks.sum_u32.launch((5000 + block - 1) // block, None, dv, tot)
    assert int(tot.to_numpy()[0]) == R.sum_u32(vals)
    b = ks.sum_u32.bind(dv[1024:2048], tot)  # a slice at an aligned offset binds its exact range
    tot.fill_zero()
    b(1024)
    b(1024)
    assert int(tot.to_numpy()[0]) == 2 * R.sum_u32(vals[1024:2048])


def test_an_empty_grid_launches_nothing_on_every_path(ks: Any) -> None:
    """#38 item 5: a grid with a 0 in it (an empty batch) records nothing, on every path; the
    arguments are checked all the same, and a negative grid stays an error."""
    dv, tot = DeviceBuffer.from_numpy(np.arange(256, dtype=np.uint32) + 1), DeviceBuffer.zeros(1, np.uint32)
    plan = ks.sum_u32.ready_plan(0).kp
    for grid in (0, (0,), (0, 1, 1), np.int64(0)):
        ks.sum_u32.launch(grid, None, dv, tot)
        khal_runtime.launch(None, khal_runtime.LaunchConfig(grid), ks.sum_u32, dv, tot)
        plan.launch(grid, None, (dv, tot))
        ks.sum_u32.bind(dv, tot).launch(grid)
    ks.sum_u32(0, dv, tot)
    ks.sum_u32.bind(dv, tot)(0)
    with khal_runtime.default_stream().capture() as cap:
        ks.sum_u32.launch(0, None, dv, tot)
    cap.graph.launch()
    assert int(tot.to_numpy()[0]) == 0  # nothing ran
    with pytest.raises(ArgumentError, match=r"sum_u32\(\): argument 'values' \(storage uint32\): expected element "
                                            r"type uint32 \(4 bytes\), got float32"):
        ks.sum_u32.launch(0, None, DeviceBuffer.zeros(4, np.float32), tot)
    with pytest.raises(ArgumentValueError, match=r"grid: every dimension must be >= 0"):
        ks.sum_u32.launch(-1, None, dv, tot)
    with pytest.raises(ArgumentValueError, match=r"grid: every dimension must be >= 0"):
        plan.launch((2, -1), None, (dv, tot))


def test_a_cluster_at_launch_is_refused_by_name_on_webgpu(ks: Any) -> None:
    from khal_runtime.errors import LaunchAttributeError

    dv, tot = DeviceBuffer.from_numpy(np.arange(256, dtype=np.uint32)), DeviceBuffer.zeros(1, np.uint32)
    with pytest.raises(LaunchAttributeError, match=r"cluster=\(2, 1, 1\) is for CUDA on sm_90\+; the webgpu backend"):
        ks.sum_u32.launch(2, None, dv, tot, cluster=2)
    assert int(tot.to_numpy()[0]) == 0  # nothing ran


def test_uniform_struct_from_ctypes_bytes_and_dict(ks: Any) -> None:
    R = _refs()
    n = 777
    x = np.random.default_rng(2).random(n, dtype=np.float32)
    p = R.Affine()
    p.scale[:] = (1.0, 2.0, 3.0, 4.0)
    p.shift[:] = (0.5, -0.5, 0.25)
    p.taps[:] = (0.125, -0.25)
    p.bias = 1.5
    fields = {f[0]: getattr(p, f[0]) for f in R.Affine._fields_}
    as_dict = {k: (list(v) if hasattr(v, "__len__") else v) for k, v in fields.items()}
    want_y, want_k = R.affine(x, p, 0.5, 3, n)
    dx = DeviceBuffer.from_numpy(x)
    for value in (p, bytes(p), as_dict):
        dy, dk = DeviceBuffer.zeros(n, np.float32), DeviceBuffer.zeros(n, np.int32)
        ks.affine(n, dx, dy, dk, value, 0.5, 3, n)
        assert R.matches(dy.to_numpy(), want_y, R.WEBGPU_ULPS)  # drivers may fuse a*b+c
        np.testing.assert_array_equal(dk.to_numpy(), want_k)
    with pytest.raises(ArgumentError, match=r"affine\(\).*'p'.*(missing|unknown)"):
        ks.affine(n, dx, dy, dk, {"bias": 1.0}, 0.5, 3, n)
    with pytest.raises(ArgumentError, match=r"affine\(\).*'p'.*(missing|unknown)"):
        ks.affine(n, dx, dy, dk, {**as_dict, "nope": 1}, 0.5, 3, n)


def test_bad_arguments_are_named_errors(ks: Any) -> None:
    n = 1024
    dy = DeviceBuffer.zeros(n, np.float32)
    with pytest.raises(ArgumentError, match=r"saxpy_shared\(\): argument 'x'.*float32.*got int32"):
        ks.saxpy_shared(n, dy, DeviceBuffer.zeros(n, np.int32), 1.0)
    with pytest.raises(ArgumentValueError, match=r"argument 'y'.*slice starting at byte 4.*multiple"):
        ks.saxpy_shared(n, dy[1:100], DeviceBuffer.zeros(n, np.float32), 1.0)
    with pytest.raises(ArgumentError, match=r"argument 'x'.*host memory"):
        ks.saxpy_shared(n, dy, np.zeros(n, np.float32), 1.0)
    with pytest.raises(ArgumentValueError, match=r"compiled|differs"):
        ks.saxpy_shared.launch(4, 32, dy, dy, 1.0)
    with pytest.raises(ArgumentError, match=r"takes 3 argument|expects 3|argument"):
        ks.saxpy_shared(n, dy, dy)


def test_indirect_dispatch_groups_and_threads(ks: Any) -> None:
    R = _refs()
    vals = np.ones(4096, dtype=np.uint32)
    dv, tot = DeviceBuffer.from_numpy(vals), DeviceBuffer.zeros(1, np.uint32)
    block = ks.sum_u32.block_size[0]
    for count, threads in ((0, False), (1, False), (3, False), (1000, True), (4096, True)):
        tot.fill_zero()
        c = DeviceBuffer.from_numpy(np.array([count], np.uint32))
        ks.sum_u32.dispatch_indirect(c, dv, tot, threads=threads)
        groups = -(-count // block) if threads else count
        assert int(tot.to_numpy()[0]) == R.sum_u32(vals[:min(groups * block, vals.size)]), (count, threads)


def test_capture_replays_and_refuses_host_reads(ks: Any) -> None:
    n = 4096
    x = np.ones(n, np.float32)
    dx, dy = DeviceBuffer.from_numpy(x), DeviceBuffer.zeros(n, np.float32)
    ks.saxpy_shared(n, dy, dx, 1.0)
    st = khal_runtime.default_stream()
    with st.capture(label="two") as cap:
        ks.saxpy_shared(n, dy, dx, 1.0)
        ks.saxpy_shared(n, dy, dx, 1.0)
        with pytest.raises(khal_runtime.CaptureError, match="to_numpy"):
            dy.to_numpy()
        with pytest.raises(khal_runtime.CaptureError, match="allocat"):
            DeviceBuffer.alloc(4)
    g = cap.graph
    assert g.node_count == 2
    np.testing.assert_array_equal(dy.to_numpy(), 1.0)  # recorded, not run
    g.launch()
    g.launch()
    np.testing.assert_array_equal(dy.to_numpy(), 5.0)
    g2 = khal_runtime.capture_graph(lambda a, b: ks.saxpy_shared(n, a, b, 2.0), dy, dx)
    other = DeviceBuffer.zeros(n, np.float32)
    g2.rebind(other, dx)
    g2.launch()
    np.testing.assert_array_equal(other.to_numpy(), 2.0)
    np.testing.assert_array_equal(dy.to_numpy(), 5.0)


@pytest.mark.needs_nvrtc
def test_a_cuda_only_package_under_webgpu_is_a_named_error(ks: Any, tmp_path: Path) -> None:
    from tests.helpers.synthetic import build_package

    cuda_only = build_package(tmp_path, "synth_cuda_only")
    k = khal_runtime.load(cuda_only.package_dir)
    with pytest.raises(BackendUnavailableError, match=r"crate 'core' of package 'synth_cuda_only' has no "
                                                      r"WebGPU .*CUDA C\+\+"):
        k.fill(16, DeviceBuffer.zeros(16, np.uint32), 1)


def test_a_wgsl_entry_point_with_another_hash_is_refused(pkg_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import shutil

    forged = tmp_path / pkg_dir.name
    shutil.copytree(pkg_dir, forged)
    data = json.loads((forged / "_khal" / "manifest.json").read_text())
    crate = data["crates"][0]
    entry = next(e for e in crate["entries"] if e["name"] == "saxpy_shared")
    art = next(a for a in crate["artifacts"] if a["entry"] == "saxpy_shared" and a["kind"] == "wgsl")
    path = forged / art["path"]
    text = path.read_text().replace(entry["hash"], "0123456789abcdef")
    path.write_text(text)
    art["sha256"], art["size"] = hashlib.sha256(text.encode()).hexdigest(), len(text.encode())
    (forged / "_khal" / "manifest.json").write_text(json.dumps(data))
    problems = khal_runtime.verify_package(forged)
    assert any(p.kind == "hash" and "0123456789abcdef" in p.message for p in problems)
    monkeypatch.setenv("KHAL_BACKEND", "webgpu")
    backends.reset()
    try:
        k = khal_runtime.load(forged)
        with pytest.raises(HashMismatchError, match=r"saxpy_shared"):
            k.saxpy_shared(16, DeviceBuffer.zeros(16), DeviceBuffer.zeros(16), 1.0)
    finally:
        backends.reset()


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
             CUDA_VISIBLE_DEVICES="", **env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)


def test_auto_falls_back_with_one_line_and_cuda_fails_at_load(pkg_dir: Path) -> None:
    code = (f"import khal_runtime, numpy as np\nks = khal_runtime.load({str(pkg_dir)!r})\n"
            "d, e = khal_runtime.DeviceBuffer.zeros(256), khal_runtime.DeviceBuffer.zeros(256)\n"
            "ks.saxpy_shared(256, d, e, 1.0)\n"  # (d, d: one buffer read-only and read-write, refused)
            "print('BACKEND', khal_runtime.backend_status().backend)\n")
    r = _run(code, KHAL_BACKEND="auto")
    assert r.returncode == 0, r.stderr
    assert "BACKEND webgpu" in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if "BackendFallbackWarning" in ln]
    assert len(lines) == 1 and "falls back" not in lines[0]
    assert "using WebGPU" in lines[0] and "because CUDA is not usable" in lines[0]
    r = _run(f"import khal_runtime\nkhal_runtime.load({str(pkg_dir)!r})\n", KHAL_BACKEND="cuda")
    assert r.returncode != 0 and "BackendUnavailableError" in r.stderr
    assert "KHAL_BACKEND=cuda: no CUDA device/driver was found" in r.stderr


@pytest.mark.parametrize("var", ["KHAL_PROFILE", "KHAL_CUDA_PROFILE"])
def test_profile_env_prints_the_webgpu_table_at_exit(pkg_dir: Path, var: str) -> None:
    """KHAL_PROFILE=1 (or its alias) on WebGPU: the table is printed at exit, as on CUDA (the
    WebGPU backend keeps its own timings, which the exit hook did not look at)."""
    code = (f"import khal_runtime, numpy as np\nks = khal_runtime.load({str(pkg_dir)!r})\n"
            "d, e = khal_runtime.DeviceBuffer.zeros(256), khal_runtime.DeviceBuffer.zeros(256)\n"
            "ks.saxpy_shared(256, d, e, 1.0)\nd.to_numpy()\n")
    r = _run(code, KHAL_BACKEND="webgpu", **{var: "1"})
    assert r.returncode == 0, r.stderr
    assert "khal WebGPU profile" in r.stderr and "saxpy_shared" in r.stderr, r.stderr


@pytest.fixture
def traced(ks: Any, tmp_path: Path) -> Any:
    """Tracing and profiling on (as KHAL_CUDA_TRACE=1 KHAL_CUDA_PROFILE=1 would), off after."""
    from khal_runtime import tracing

    log = tmp_path / "trace.log"
    tracing.reset_profile()
    tracing.enable(True, profile=True, nvtx=False, trace_file=str(log))
    yield ks, log
    tracing.disable()
    tracing.reset_profile()


def test_trace_lines_and_profile_table_on_webgpu(traced: Any) -> None:
    from khal_runtime import tracing

    ks, log = traced
    n = 1000
    dx, dy = DeviceBuffer.from_numpy(np.ones(n, np.float32)), DeviceBuffer.zeros(n, np.float32)
    ks.saxpy_shared(n, dy, dx, 2.0)
    ks.saxpy_shared(n, dy, dx, 2.0)
    ks.saxpy_shared.launch(4, None, dy, dx, 1.0)
    count = DeviceBuffer.from_numpy(np.array([n], np.uint32))
    ks.saxpy_shared.dispatch_indirect(count, dy, dx, 1.0, threads=True)
    np.testing.assert_array_equal(dy.to_numpy(), 6.0)  # traced launches still compute
    g = khal_runtime.capture_graph(lambda: ks.saxpy_shared(n, dy, dx, 1.0))
    g.launch()
    np.testing.assert_array_equal(dy.to_numpy(), 7.0)

    lines = log.read_text().splitlines()
    launches = [ln for ln in lines if ln.startswith("khal: launch #")]
    assert len(launches) == 5, lines
    block = "x".join(str(v) for v in ks.saxpy_shared.block_size)
    assert f"saxpy_shared grid=4x1x1 block={block}" in launches[0]
    assert "(webgpu)" in launches[0] and "y=" in launches[0] and "float32[1000]" in launches[0]
    assert "grid=4x1x1" in launches[2]
    assert "grid=indirect" in launches[3]
    assert "(captured)" in launches[4] and "(captured)" not in launches[3]
    assert any(ln.startswith("khal: graph #") for ln in lines)

    stats = tracing.profile_stats()
    name = next(k for k in stats if k.endswith("saxpy_shared"))
    assert stats[name]["calls"] == 4 and stats[name]["total_ms"] > 0  # the captured one is not per-launch
    assert any(k.startswith("recording") and v["calls"] == 1 for k, v in stats.items())
    table = tracing.profile(print_table=False)
    assert "khal WebGPU profile" in table and "timestamp queries" in table and name in table
    assert "CUDA events" not in table


def test_trace_sync_mode_and_profiling_off_again(traced: Any) -> None:
    from khal_runtime import tracing

    ks, log = traced
    n = 256
    dx, dy = DeviceBuffer.from_numpy(np.ones(n, np.float32)), DeviceBuffer.zeros(n, np.float32)
    tracing.enable("sync", profile=False, nvtx=False, trace_file=str(log))
    dev = khal_runtime.Device(0)._impl.handle
    assert dev.stream.timer is None  # profiling turned off on the device's stream
    ks.saxpy_shared(n, dy, dx, 3.0)
    assert dev.stream.pending == 0  # sync: the launch was submitted and waited for
    np.testing.assert_array_equal(dy.to_numpy(), 3.0)
    tracing.disable()
    before = len(log.read_text().splitlines())
    ks.saxpy_shared(n, dy, dx, 3.0)
    assert len(log.read_text().splitlines()) == before  # hooks gone: no line
    np.testing.assert_array_equal(dy.to_numpy(), 6.0)
