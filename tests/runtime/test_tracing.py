"""KHAL_CUDA_TRACE / KHAL_CUDA_PROFILE / NVTX on CPU, against the fake driver (tests/helpers/fakecuda.py)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from khal_runtime import graphs, tracing
from khal_runtime.backends.cuda.launch import LaunchPlan
from khal_runtime.backends.cuda.uniform_cache import Upload, cache_for
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.device import Device
from khal_runtime.errors import CudaError
from khal_runtime.launch_hooks import hooks
from tests.helpers.fakecuda import (  # noqa: F401 - fixture
    CUresult,
    FakeDriver,
    fake,
    make_entry,
    scalar,
    storage,
    uniform,
)


class Params(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


def _plan(fake: FakeDriver) -> LaunchPlan:
    e = make_entry("axpby", (storage("x"), storage("y", writable=True), uniform("p", "AxpbyParams"),
                             scalar("bias")), block=256)
    plan = LaunchPlan(e, "core", 0, "FUNC:axpby", cache_for(0), None)
    fake.layouts["FUNC:axpby"] = plan.layout
    cache_for(0).entries[bytes(Params(1, 2))] = Upload(0xD000, None, 0, None)
    return plan


def _st():
    return Device(0).default_stream


def _args() -> tuple:
    return (DeviceBuffer(0x1000, 100, "float32", 0), DeviceBuffer(0x2000, 3 << 20, "float32", 0),
            Params(1, 2), 0.5)


@pytest.fixture(autouse=True)
def _fresh_profile():
    tracing._profiler.stats.clear()
    tracing._profiler.pending.clear()
    tracing._profiler.captured.clear()
    yield
    tracing.disable()


# ------------------------------------------------------------------------------ env parsing


@pytest.mark.parametrize("env,want", [
    ({}, dict(trace=False, sync=False, profile=False, nvtx=False)),
    ({"KHAL_CUDA_TRACE": "1"}, dict(trace=True, sync=False)),
    ({"KHAL_CUDA_TRACE": "ON"}, dict(trace=True, sync=False)),
    ({"KHAL_CUDA_TRACE": "sync"}, dict(trace=True, sync=True)),
    ({"KHAL_CUDA_TRACE": "0", "KHAL_CUDA_PROFILE": "yes"}, dict(trace=False, profile=True)),
    ({"KHAL_CUDA_NVTX": "1"}, dict(nvtx=True, trace=False)),
    ({"KHAL_CUDA_TRACE": "1", "KHAL_CUDA_TRACE_FILE": "/x/t.log"}, dict(trace_file="/x/t.log")),
    ({"KHAL_CUDA_PROFILE": "1", "KHAL_CUDA_PROFILE_FILE": "p.txt"}, dict(profile_file="p.txt")),
    # the backend-neutral names; the KHAL_CUDA_* ones are their aliases, and the name wins
    ({"KHAL_TRACE": "sync"}, dict(trace=True, sync=True)),
    ({"KHAL_PROFILE": "1", "KHAL_PROFILE_FILE": "q.txt"}, dict(profile=True, profile_file="q.txt")),
    ({"KHAL_TRACE": "1", "KHAL_TRACE_FILE": "t2.log"}, dict(trace=True, trace_file="t2.log")),
    ({"KHAL_TRACE": "0", "KHAL_CUDA_TRACE": "1"}, dict(trace=False)),
    ({"KHAL_PROFILE": "off", "KHAL_CUDA_PROFILE": "1"}, dict(profile=False)),
    ({"KHAL_TRACE_FILE": "new.log", "KHAL_CUDA_TRACE_FILE": "old.log", "KHAL_TRACE": "1"}, dict(trace_file="new.log")),
])
def test_parse_env(env: dict, want: dict) -> None:
    cfg = tracing.parse_env(env)
    for k, v in want.items():
        assert getattr(cfg, k) == v, k
    assert not cfg.warnings


def test_parse_env_refuses_nonsense() -> None:
    """An unknown value is an EnvVarError naming the variable as set (#38 item 12; it was taken as 1)."""
    from khal_runtime.errors import EnvVarError

    with pytest.raises(EnvVarError, match=r"KHAL_CUDA_TRACE='loud' is not understood: use 1/sync/"):
        tracing.parse_env({"KHAL_CUDA_TRACE": "loud"})
    with pytest.raises(EnvVarError, match=r"KHAL_TRACE='loud' is not understood"):
        tracing.parse_env({"KHAL_TRACE": "loud"})


def test_trace_describes_a_dict_uniform_without_an_error() -> None:
    """A dict uniform is packed by the launch (into the struct's layout): the trace line says so
    instead of ``p=<dict: expected a uniform struct ...>`` for a launch that worked."""
    from tests.helpers.fakecuda import uniform as _uniform

    text = tracing.describe_arg(_uniform("p", "AxpbyParams", 8), {"a": 1.0, "b": 2.0})
    assert text == "p=uniform AxpbyParams (8 B, from a dict)", text


def test_write_line_follows_khal_trace_file(tmp_path, monkeypatch) -> None:
    from khal_runtime.launch_hooks import write_line

    monkeypatch.delenv("KHAL_CUDA_TRACE_FILE", raising=False)
    monkeypatch.setenv("KHAL_TRACE_FILE", str(tmp_path / "t.log"))
    write_line("khal: hello")
    assert (tmp_path / "t.log").read_text() == "khal: hello\n"


def test_env_installs_hooks_when_a_package_is_loaded(tmp_path) -> None:
    from tests.helpers.fakecuda import fake_kernels

    e = make_entry("axpby", (storage("x"), storage("y", writable=True), uniform("p", "AxpbyParams"),
                             scalar("bias")), block=256)
    fake_kernels(FakeDriver(), tmp_path, [e])
    code = ("import khal_runtime, khal_runtime.tracing as t; from khal_runtime.launch_hooks import hooks as h; "
            f"khal_runtime.load({str(tmp_path / 'fakepkg')!r}); "
            "print(h.active, type(h.dispatch).__name__, *([t._current.cfg.trace, t._current.cfg.sync] "
            "if t._current else []))")
    for value, expect in (("sync", "True Dispatcher True True"), ("", "False NoneType")):
        env = dict(os.environ, KHAL_CUDA_TRACE=value)
        env.pop("KHAL_CUDA_PROFILE", None)
        env.pop("KHAL_TRACE", None)
        env.pop("KHAL_PROFILE", None)
        env.pop("KHAL_CUDA_NVTX", None)
        out = subprocess.run([sys.executable, "-c", code], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == expect


# ------------------------------------------------------------------------------ trace lines


def test_trace_line_format(fake: FakeDriver, capsys) -> None:
    plan = _plan(fake)
    tracing.enable(trace=True, nvtx=False)
    assert hooks.active
    plan.run(4, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert len(fake.launches) == 1
    line = capsys.readouterr().err.strip()
    assert line == (
        "khal: launch #1 core.axpby grid=4x1x1 block=256x1x1 shmem=0 stream=0x5000 args: "
        "x=storage float32[100] (400 B @0x1000), y=storage float32[3145728] (12.0 MiB @0x2000), "
        "p=uniform AxpbyParams (8 B, host), bias=scalar float32 (4 B) = 0.5")


def test_trace_to_file_and_device_uniform(fake: FakeDriver, tmp_path) -> None:
    plan = _plan(fake)
    out = tmp_path / "trace.log"
    tracing.enable(trace=True, trace_file=str(out), nvtx=False)
    x, y, _, b = _args()
    plan.run(1, 1, 1, 256, 1, 1, 0, _st(), (x, y, DeviceBuffer(0xBEE0, 2, "float32", 0), b))
    plan.run(1, 1, 1, 256, 1, 1, 0, _st(), (x, y, Params(1, 2), b))
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    assert "p=uniform AxpbyParams (8 B, device @0xbee0)" in lines[0] and lines[1].startswith("khal: launch #2 ")


def test_trace_marks_captured_launches(fake: FakeDriver, capsys) -> None:
    plan = _plan(fake)
    tracing.enable(trace=True, nvtx=False)
    with _st().capture(label="step") as cap:
        plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert "(captured)" in capsys.readouterr().err
    assert cap.kernels == ["core.axpby"] and cap.graph.kernels == ["core.axpby"]
    cap.graph.launch()
    assert "khal: graph #2 step kernels=1 stream=0x5000" in capsys.readouterr().err


def test_trace_sync_names_the_failing_kernel(fake: FakeDriver, capsys) -> None:
    plan = _plan(fake)
    tracing.enable(trace="sync", nvtx=False)
    plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert fake.names().count("cuStreamSynchronize") == 1
    fake.fail["cuStreamSynchronize"] = CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(CudaError, match=r"kernel core.axpby \(launch #2, grid=9x1x1 block=256x1x1\) "
                                        r"failed: CUDA_ERROR_ILLEGAL_ADDRESS") as ei:
        plan.run(9, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert ei.value.code == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert "first launch whose stream synchronisation failed" in capsys.readouterr().err


def test_trace_sync_launch_error_named(fake: FakeDriver) -> None:
    plan = _plan(fake)
    tracing.enable(trace="sync", nvtx=False)
    fake.fail["cuLaunchKernel"] = CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError, match="KHAL_TRACE=sync: launch #1 of core.axpby failed"):
        plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())


def test_sync_skipped_inside_capture(fake: FakeDriver) -> None:
    plan = _plan(fake)
    tracing.enable(trace="sync", nvtx=False)
    with _st().capture():
        plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert "cuStreamSynchronize" not in fake.names()


def test_disable_restores_the_fast_path(fake: FakeDriver) -> None:
    tracing.enable(trace=True, nvtx=False)
    tracing.disable()
    assert not hooks.active and hooks.dispatch is None


# ------------------------------------------------------------------------------ profile


def test_profile_events_not_synchronised(fake: FakeDriver) -> None:
    plan = _plan(fake)
    tracing.enable(profile=True, nvtx=False)
    for _ in range(4):
        plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    names = fake.names()
    assert names.count("cuEventRecord") == 8 and "cuStreamSynchronize" not in names
    assert "cuEventSynchronize" not in names  # resolved lazily, at report time
    # order per launch: start event, kernel, end event
    assert names[:3] == ["cuEventRecord", "cuLaunchKernel", "cuEventRecord"]
    stats = tracing.profile_stats()
    s = stats["core.axpby"]
    assert s["calls"] == 4 and s["total_ms"] == pytest.approx(4.0)
    assert s["min_us"] == pytest.approx(500) and s["max_us"] == pytest.approx(1500)
    # events went back to the pool: more launches create no new events
    before = next(fake.event_ids)
    plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert next(fake.event_ids) == before + 1


def test_profile_table_and_graphs(fake: FakeDriver, capsys) -> None:
    plan = _plan(fake)
    tracing.enable(profile=True, nvtx=False)
    plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    with _st().capture(label="step") as cap:
        plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
        plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    for _ in range(3):
        cap.graph.launch()
    text = tracing.profile()
    assert capsys.readouterr().err.strip() == text
    lines = text.splitlines()
    assert lines[0] == "khal profile: GPU time per kernel (CUDA events, 4 timed launches)"
    assert lines[1].split() == ["kernel", "calls", "total", "ms", "mean", "us", "min", "us", "max", "us", "%"]
    rows = {ln.split()[0] + (" " + ln.split()[1] if ln.startswith("graph") else ""): ln.split()
            for ln in lines[2:] if ln and not ln.startswith((" ", "launches"))}
    assert rows["graph step"][2] == "3" and rows["core.axpby"][1] == "1"
    assert "    captured kernels: core.axpby, core.axpby" in text
    assert "launches captured into graphs" in text and "core.axpby x2" in text
    import khal_runtime

    assert khal_runtime.profile(print_table=False) == text
    tracing.reset_profile()
    assert "(no timed launches)" in tracing.profile(print_table=False)


def test_profile_collects_when_many_pending(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(fake)
    monkeypatch.setattr(tracing.Profiler, "COLLECT_AT", 3)
    tracing.enable(profile=True, nvtx=False)
    for _ in range(7):
        plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert len(tracing._profiler.pending) < 3
    assert "cuEventSynchronize" not in fake.names()  # only queried, never waited


def test_profile_at_exit_in_a_subprocess(tmp_path) -> None:
    """KHAL_CUDA_PROFILE=1: the table is printed at exit (here with no launches: nothing)."""
    from tests.helpers.fakecuda import fake_kernels

    fake_kernels(FakeDriver(), tmp_path, [make_entry("k", (storage("x"),))])
    env = dict(os.environ, KHAL_CUDA_PROFILE="1")
    code = (f"import khal_runtime; khal_runtime.load({str(tmp_path / 'fakepkg')!r}); "
            "from khal_runtime.launch_hooks import hooks; print(hooks.active)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "True" and "khal profile" not in r.stderr


# ------------------------------------------------------------------------------ nvtx


def test_nvtx_ranges_pushed_and_popped(fake: FakeDriver) -> None:
    plan = _plan(fake)
    events: list[tuple[str, str]] = []

    class FakeNvtx:
        def push(self, name: str) -> None:
            events.append(("push", name))

        def pop(self) -> None:
            events.append(("pop", ""))

    d = tracing.enable(nvtx=False)  # nothing on: uninstalled
    assert not hooks.active
    d = tracing.Dispatcher(tracing.TraceConfig(nvtx=True), FakeNvtx())  # type: ignore[arg-type]
    hooks.install(d)
    plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    fake.fail["cuLaunchKernel"] = CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError):
        plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert events == [("push", "core.axpby"), ("pop", ""), ("push", "core.axpby"), ("pop", "")]


def test_real_nvtx_package_if_installed(fake: FakeDriver) -> None:
    pytest.importorskip("nvtx")
    plan = _plan(fake)
    d = tracing.enable(nvtx=True)
    assert d.nvtx is not None and hooks.active
    plan.run(1, 1, 1, 256, 1, 1, 0, _st(), _args())
    assert len(fake.launches) == 1


def test_graph_launch_without_hooks_is_plain(fake: FakeDriver) -> None:
    with _st().capture() as cap:
        pass
    cap.graph.launch()
    assert fake.names()[-1] == "cuGraphLaunch"
    assert graphs.capturing() is False
