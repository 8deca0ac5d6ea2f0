"""Cold start: what loading a shader package imports, and the CUDA driver's early initialisation
(``KHAL_EAGER_INIT``, :mod:`khal_runtime.backends.cuda.driver`) with the fake driver.

The early thread runs ``cuInit`` (and device 0's primary context) while the main thread goes on
importing; these tests check that it really runs in the background, that it never starts where
it must not, and that whatever fails in it is reported at first use exactly as it is without it.
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from khal_runtime import backends
from khal_runtime.backends.cuda import driver as cuda_driver
from khal_runtime.errors import BackendUnavailableError, CudaError, EnvVarError
from tests.helpers.synthetic import build_package
from tests.helpers.fakecuda import FakeDriver, _reset_runtime, fake_kernels, make_entry, storage

ROOT = Path(__file__).resolve().parents[2]
THREAD = "khal-cuda-init"

#: what loading a package must not import (array libraries are probed, never imported; tracing's
#: NVTX, the WebGPU backend, the build side and NVRTC come only when asked for; pydantic validates a
#: manifest the build did not vouch for only: #38 item 18)
HEAVY = ("torch", "cupy", "nvtx", "wgpu", "hatch_khal", "numpy", "pydantic", "pydantic_core")


# ---------------------------------------------------------------------------------------------
# imports (fresh processes)
# ---------------------------------------------------------------------------------------------
def _run(code: str, path: Path | None = None, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([str(path)] if path else []) + [env.get("PYTHONPATH", "")])
    for k in ("KHAL_BACKEND", "KHAL_EAGER_INIT", "KHAL_TRACE", "KHAL_PROFILE", "KHAL_CUDA_TRACE", "KHAL_CUDA_PROFILE",
              "KHAL_CUDA_NVTX"):
        env.pop(k, None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_package(tmp_path_factory.mktemp("cold"), "synth_cold_pkg")


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("eager", ["", "0", "1"])
def test_loading_a_package_imports_nothing_it_does_not_need(pkg: Any, eager: str) -> None:
    """import khal_runtime + the load of a package: no array library, NVTX, wgpu, build side or
    NVRTC; with the early initialisation forced on (KHAL_EAGER_INIT=1, even without a GPU) too,
    counting what its thread imports."""
    r = _run(f"""
        import sys, threading
        import khal_runtime
        import {pkg.name} as p
        for t in threading.enumerate():
            if t.name == {THREAD!r}:
                t.join()
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith('cuda.bindings.nvrtc'))
        print('HEAVY', heavy)
        print('ENTRIES', p.kernels.entries)
    """, pkg.root, **({"KHAL_EAGER_INIT": eager} if eager else {}))
    assert r.returncode == 0, r.stderr + r.stdout
    assert "HEAVY []" in r.stdout, r.stdout
    assert "ENTRIES ['axpby', 'fill', 'scalars']" in r.stdout


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("env", [{}, {"KHAL_TRACE": "1"}, {"KHAL_CUDA_PROFILE": "1"}])
def test_loading_imports_tracing_only_where_a_variable_asks_for_it(pkg: Any, env: dict[str, str]) -> None:
    """load() reads the tracing variables without importing khal_runtime.tracing (its
    dispatcher, profiler, NVTX glue): a process that traces nothing never imports it, and one
    that asks gets its hooks installed at the first load as before."""
    r = _run(f"""
        import sys
        import {pkg.name}
        from khal_runtime.launch_hooks import hooks
        print('TRACING', 'khal_runtime.tracing' in sys.modules, hooks.active)
    """, pkg.root, **env)
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"TRACING {bool(env)} {bool(env)}" in r.stdout, r.stdout + r.stderr


def test_importing_the_runtime_alone_never_starts_the_driver() -> None:
    """The build side, verify and the CLI import the runtime's modules without loading a package:
    no thread, no cuda-bindings, even with KHAL_EAGER_INIT=1."""
    r = _run("""
        import sys, threading
        import khal_runtime, khal_runtime.manifest, khal_runtime.verify, khal_runtime.kernels
        import khal_runtime.backends.cuda
        print('THREADS', sorted(t.name for t in threading.enumerate()))
        print('CUDA', sorted(m for m in sys.modules if m.startswith('cuda')))
    """, KHAL_EAGER_INIT="1")
    assert r.returncode == 0, r.stderr
    assert f"'{THREAD}'" not in r.stdout
    assert "CUDA []" in r.stdout


@pytest.mark.needs_nvrtc
def test_a_shader_package_importing_the_runtime_starts_it_before_its_own_imports(pkg: Any) -> None:
    """A shader package's ``import khal_runtime`` (first line of its __init__) starts the early
    initialisation, so that what the package imports before load() (numpy, its modules)
    overlaps it too; the same import from a package without a manifest does not."""
    init = pkg.package_dir / "__init__.py"
    init.write_text("import khal_runtime\n"
                    "from khal_runtime.backends.cuda import driver as _d\n"
                    "STARTED_AT_IMPORT = _d._early is not None\n"
                    "kernels = khal_runtime.load(__name__)\n")
    plain = pkg.root / "plain_cold_pkg"
    plain.mkdir(exist_ok=True)
    (plain / "__init__.py").write_text(init.read_text().replace("kernels = khal_runtime.load(__name__)\n", ""))
    try:
        r = _run(f"""
            import plain_cold_pkg
            print('PLAIN', plain_cold_pkg.STARTED_AT_IMPORT)
        """, pkg.root, KHAL_EAGER_INIT="1")
        assert r.returncode == 0, r.stderr
        assert "PLAIN False" in r.stdout
        for eager, want in (("1", True), ("0", False)):
            r = _run(f"""
                import {pkg.name} as p
                print('STARTED', p.STARTED_AT_IMPORT)
            """, pkg.root, KHAL_EAGER_INIT=eager)
            assert r.returncode == 0, r.stderr
            assert f"STARTED {want}" in r.stdout
        r = _run(f"""
            try:
                import {pkg.name}  # (KHAL_BACKEND=webgpu: load() may refuse a CUDA-only package)
            except Exception:
                pass
            from khal_runtime.backends.cuda import driver
            print('STARTED', driver._early is not None)
        """, pkg.root, KHAL_EAGER_INIT="1", KHAL_BACKEND="webgpu")
        assert "STARTED False" in r.stdout, r.stderr
    finally:
        init.write_text("import khal_runtime\n\nkernels = khal_runtime.load(__name__)\n")


def test_the_cuda_package_is_light() -> None:
    """Reaching the CUDA driver module (what load() does to start the thread) imports neither
    pydantic nor the launch path; BACKEND still comes on first access."""
    r = _run("""
        import sys
        import khal_runtime.backends.cuda as c
        print('LIGHT', 'pydantic' not in sys.modules and 'khal_runtime.backends.cuda.launch' not in sys.modules)
        print('BACKEND', type(c.BACKEND).__name__, c.CudaDevice.__name__)
    """)
    assert r.returncode == 0, r.stderr
    assert "LIGHT True" in r.stdout and "BACKEND CudaBackend CudaDevice" in r.stdout


# ---------------------------------------------------------------------------------------------
# the early thread, with the fake driver
# ---------------------------------------------------------------------------------------------
class R(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NO_DEVICE = 100


class EarlyFake(FakeDriver):
    """FakeDriver whose cuInit can be held (``gate``) or fail, whose primary-context retain can
    fail, and which records the thread each of the two ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.init_result = R.CUDA_SUCCESS
        self.retain_result = R.CUDA_SUCCESS
        self.threads: dict[str, list[str]] = {}

    def _where(self, name: str) -> None:
        self.threads.setdefault(name, []).append(threading.current_thread().name)

    def cuInit(self, flags: int) -> tuple[Any, ...]:  # noqa: N802
        self._where("cuInit")
        assert self.gate.wait(60), "the test never opened the gate"
        return (self.init_result,)

    def cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple[Any, ...]:  # noqa: N802
        self._where("cuDevicePrimaryCtxRetain")
        if self.retain_result:
            return (self.retain_result, None)
        return super().cuDevicePrimaryCtxRetain(dev)


@pytest.fixture
def early(monkeypatch: pytest.MonkeyPatch) -> Iterator[EarlyFake]:
    """The fake driver as the CUDA backend's, nothing probed yet, KHAL_BACKEND unset and the
    early initialisation forced on (this machine may have no NVIDIA driver to see)."""
    drv = EarlyFake()
    monkeypatch.setattr(cuda_driver, "_driver", drv)
    monkeypatch.setenv("KHAL_EAGER_INIT", "1")
    monkeypatch.delenv("KHAL_BACKEND", raising=False)
    _reset_runtime()
    yield drv
    drv.gate.set()
    _reset_runtime()


def _wait_for(cond: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


ENTRY = make_entry("k", (storage("x"),))


def test_load_returns_while_the_driver_initialises(early: EarlyFake, tmp_path: Path) -> None:
    early.gate.clear()  # cuInit blocks until the test says so
    ks = fake_kernels(early, tmp_path, [ENTRY])  # khal_runtime.load(): starts the thread
    _wait_for(lambda: "cuInit" in early.threads, "cuInit in the early thread")
    t = cuda_driver._early
    assert t is not None and t.is_alive()  # load() returned while cuInit still runs
    assert early.threads == {"cuInit": [THREAD]}
    early.gate.set()
    ks.crates["c"].load(0)  # first use: joins the thread, takes its context
    assert early.threads == {"cuInit": [THREAD], "cuDevicePrimaryCtxRetain": [THREAD]}
    from khal_runtime import Device

    assert Device(0).context == "CTX0"
    assert [c[0] for c in early.calls].count("cuLibraryLoadData") == 1


def test_without_it_everything_happens_at_first_use(early: EarlyFake, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KHAL_EAGER_INIT", "0")
    ks = fake_kernels(early, tmp_path, [ENTRY])
    assert cuda_driver._early is None and early.threads == {}
    ks.crates["c"].load(0)
    main = threading.current_thread().name
    assert early.threads == {"cuInit": [main], "cuDevicePrimaryCtxRetain": [main]}


def _first_use_error(drv: EarlyFake, root: Path, eager: str, monkeypatch: pytest.MonkeyPatch,
                     backend: str | None = None) -> tuple[type[BaseException], str, bool, dict[str, list[str]]]:
    """(type, message, chained?, threads) of the error a first use of a fresh package meets."""
    monkeypatch.setenv("KHAL_EAGER_INIT", eager)
    if backend:
        monkeypatch.setenv("KHAL_BACKEND", backend)
    _reset_runtime()
    drv.threads.clear()
    try:
        ks = fake_kernels(drv, root, [ENTRY])  # KHAL_BACKEND=cuda: load() itself needs CUDA
        ks.crates["c"].load(0)
    except (BackendUnavailableError, CudaError) as exc:
        chained = exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__)
        return type(exc), str(exc), chained, dict(drv.threads)
    raise AssertionError("no error")


@pytest.mark.parametrize("backend", [None, "cuda"])
def test_a_cuinit_that_fails_in_the_thread_is_reported_as_without_it(
        early: EarlyFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str | None) -> None:
    early.init_result = R.CUDA_ERROR_NO_DEVICE
    off = _first_use_error(early, tmp_path / "off", "0", monkeypatch, backend)
    on = _first_use_error(early, tmp_path / "on", "1", monkeypatch, backend)
    assert on[:3] == off[:3]
    assert off[0] is BackendUnavailableError and not off[2]
    assert "the driver reports no CUDA-capable device (cuInit -> CUDA_ERROR_NO_DEVICE)" in off[1]
    assert off[3] == {"cuInit": ["MainThread"]} and on[3] == {"cuInit": [THREAD]}


def test_a_context_retain_that_fails_in_the_thread_is_retried_and_reported_as_without_it(
        early: EarlyFake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    early.retain_result = R.CUDA_ERROR_OUT_OF_MEMORY
    off = _first_use_error(early, tmp_path / "off", "0", monkeypatch)
    on = _first_use_error(early, tmp_path / "on", "1", monkeypatch)
    assert on[:3] == off[:3]
    assert off[0] is CudaError and off[1] == "cuDevicePrimaryCtxRetain failed: CUDA_ERROR_OUT_OF_MEMORY"
    assert on[3]["cuDevicePrimaryCtxRetain"] == [THREAD, "MainThread"]  # tried early, then again


def test_no_early_context_when_several_devices_are_visible(early: EarlyFake, tmp_path: Path) -> None:
    """A process that sees several GPUs may work on any: the thread does cuInit only, and no
    context appears on device 0 that the process did not ask for."""
    early.devices = 2
    ks = fake_kernels(early, tmp_path, [ENTRY])
    t = cuda_driver._early
    assert t is not None
    t.join(30)
    assert early.threads == {"cuInit": [THREAD]}
    ks.crates["c"].load(0)
    assert early.threads["cuDevicePrimaryCtxRetain"] == ["MainThread"]


@pytest.mark.parametrize("env", [{"KHAL_BACKEND": "webgpu"}, {"KHAL_BACKEND": "WebGPU"},
                                 {"KHAL_EAGER_INIT": "0"}, {"KHAL_EAGER_INIT": "off"},
                                 {"KHAL_BACKEND": "vulkan"}])
def test_never_started_under_webgpu_or_when_turned_off(early: EarlyFake, monkeypatch: pytest.MonkeyPatch,
                                                       env: dict[str, str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    backends.prestart()  # what khal_runtime.load() calls first; never raises
    assert cuda_driver._early is None and early.threads == {}


def test_not_started_once_cuda_was_probed(early: EarlyFake) -> None:
    cuda_driver.status()
    early.threads.clear()
    backends.prestart()
    assert cuda_driver._early is None and early.threads == {}


def test_it_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default (a process importing a package it never launches from must not initialise
    CUDA or hold a context); KHAL_EAGER_INIT=1 turns it on unless the devices are hidden."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for unset_or_off in (None, "", "0", "off"):
        if unset_or_off is None:
            monkeypatch.delenv("KHAL_EAGER_INIT", raising=False)
        else:
            monkeypatch.setenv("KHAL_EAGER_INIT", unset_or_off)
        assert not cuda_driver._wanted(), unset_or_off
    monkeypatch.setenv("KHAL_EAGER_INIT", "maybe")  # not understood: an error (#38 item 12), not "off"
    with pytest.raises(EnvVarError, match=r"KHAL_EAGER_INIT='maybe' is not understood"):
        cuda_driver._wanted()
    for on in ("1", "yes", "on", "true"):
        monkeypatch.setenv("KHAL_EAGER_INIT", on)
        assert cuda_driver._wanted(), on
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not cuda_driver._wanted()


def test_a_first_use_that_would_wait_does_first_use_work_meanwhile(early: EarlyFake, tmp_path: Path) -> None:
    """while_initialising: CPU work a first use needs is done by the thread that would otherwise
    sit waiting for cuInit."""
    early.gate.clear()
    ran: list[str] = []

    def work() -> None:
        ran.append(threading.current_thread().name)
        early.gate.set()  # only now can cuInit finish: the wait began with this work

    cuda_driver.while_initialising(work)
    try:
        ks = fake_kernels(early, tmp_path, [ENTRY])
        _wait_for(lambda: "cuInit" in early.threads, "cuInit in the early thread")
        ks.crates["c"].load(0)
        assert ran == ["MainThread"]
    finally:
        if work in cuda_driver._idle_work:
            cuda_driver._idle_work.remove(work)
        early.gate.set()


def test_reset_status_waits_for_the_thread_and_forgets_it(early: EarlyFake, tmp_path: Path) -> None:
    fake_kernels(early, tmp_path, [ENTRY])
    assert cuda_driver._early is not None
    cuda_driver.reset_status()
    assert cuda_driver._early is None and cuda_driver._early_ctx == {}
