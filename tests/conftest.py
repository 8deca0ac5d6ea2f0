"""Shared fixtures: the example wheel (built once per session), GPU detection.

Tests marked ``gpu`` are skipped, with the reason, where no CUDA driver or
device is present (CI has none); everything else runs everywhere.
"""

from __future__ import annotations

import importlib
import os
import runpy
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "example_shader_pkg"
#: the khal-runtime distribution's project (the khal_runtime package is ROOT / "khal_runtime");
#: ROOT itself builds hatch-khal, which depends on it: a wheelhouse for isolated builds holds both
RUNTIME = ROOT / "runtime"


@lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA device is usable, else why not."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        return f"cuda-bindings not importable ({exc})"
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # libcuda missing
        return f"no CUDA driver ({exc})"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"no CUDA driver/device (cuInit: {err.name})"
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return "no CUDA device"
    return None


#: Variables the whole test session runs with (the fixtures that clear KHAL_* variables keep them):
#: KHAL_BUILD_DEBUG: a failed build prints one block and exits (hatch_khal.report); with it, it raises its
#: error as before, which the tests that call the hook in this process catch (the processes the tests
#: start inherit it: their output keeps the traceback; tests of the block itself unset it).
#: KHAL_NVRTC_ANY_MINOR: the builds without isolation here use the NVRTC of the test environment (the
#: newest: 13.5), whose PTX needs a newer driver than the default nvrtc-requirement (CUDA 13.0's)
#: promises, which fails a build (hatch_khal.nvrtc.ptx_problem); the tests build with it anyway, as
#: builds did before 0.2.0 (the tests of the check itself unset it).
SESSION_ENV = {"KHAL_BUILD_DEBUG": "1", "KHAL_NVRTC_ANY_MINOR": "1"}
for _k, _v in SESSION_ENV.items():
    os.environ.setdefault(_k, _v)

#: ``KHAL_TEST_HIDE=nvrtc`` / ``cuda-bindings``: run as if they were not installed, here and in the
#: processes the tests start (tests/helpers/hide/sitecustomize.py): the tests that need them then skip
_HIDE = Path(__file__).resolve().parent / "helpers" / "hide"
if os.environ.get("KHAL_TEST_HIDE"):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_HIDE), os.environ.get("PYTHONPATH", "")) if p)
    runpy.run_path(str(_HIDE / "sitecustomize.py"))


@lru_cache(maxsize=1)
def cuda_bindings_unavailable_reason() -> str | None:
    """None when cuda-bindings imports (no driver needed), else why not."""
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError as exc:
        return f"cuda-bindings not importable ({exc})"
    return None


@lru_cache(maxsize=1)
def nvrtc_unavailable_reason() -> str | None:
    """None when the build can load NVRTC (through cuda-bindings, from the NVRTC wheel), else why not."""
    try:
        from hatch_khal.nvrtc import nvrtc_version

        nvrtc_version()
    except Exception as exc:  # KhalBuildError, ConfigError; cuda-bindings' own when libnvrtc is missing
        return f"NVRTC not usable ({exc})"
    return None


@lru_cache(maxsize=1)
def triton_unavailable_reason() -> str | None:
    """None when Triton is installed for the build (found, not imported here: the worker imports it),
    else why not."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton==3.6.0; scripts/test installs it)"
    return None


_GPU_SKIP = "GPU test: "
_NEEDS = (("needs_nvrtc", "needs NVRTC: ", nvrtc_unavailable_reason),
          ("needs_cuda_bindings", "needs cuda-bindings: ", cuda_bindings_unavailable_reason),
          ("needs_triton", "needs Triton: ", triton_unavailable_reason))
_SKIP_PREFIXES = (_GPU_SKIP, *(prefix for _, prefix, _ in _NEEDS))


def skip_without(marker: str) -> None:
    """Skip the running test, as ``marker`` would, where what the marker names is missing. For the
    helpers that need it (the fake driver's parameter probes and the in-process builds need NVRTC):
    every test that reaches one skips cleanly without carrying the marker itself."""
    for name, prefix, why in _NEEDS:
        if name == marker:
            reason = why()
            if reason is not None:
                pytest.skip(prefix + reason)
            return
    raise ValueError(f"skip_without: no marker {marker!r}; known: {[name for name, _, _ in _NEEDS]}")


def _builds_the_example(item: pytest.Item) -> bool:
    """The test builds the example wheel (its fixture, directly or through another fixture),
    which needs NVRTC unless KHAL_TEST_EXAMPLE_WHEEL gives a wheel built beforehand."""
    return "example_wheel" in getattr(item, "fixturenames", ()) and not os.environ.get("KHAL_TEST_EXAMPLE_WHEEL")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=_GPU_SKIP + reason))
                continue
        if _builds_the_example(item) and "needs_nvrtc" not in item.keywords:
            item.add_marker(pytest.mark.needs_nvrtc)
        for marker, prefix, why in _NEEDS:
            if marker in item.keywords and why() is not None:
                item.add_marker(pytest.mark.skip(reason=prefix + str(why())))
                break


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """``-ra`` folds skips by (file, line, reason), and a marker's skip is placed at each test:
    one line per GPU test, all saying "no CUDA driver". Placed here instead, they fold into one
    line with their count."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3:
        _, _, message = rep.longrepr
        if str(message).removeprefix("Skipped: ").startswith(_SKIP_PREFIXES):
            rep.longrepr = (__file__, None, message)


def run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
        check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing output; on failure show it all."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    return proc


def build_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["KHAL_CACHE_DIR"] = str(cache_dir)
    env.pop("KHAL_CUDA_ARCHS", None)
    env.pop("KHAL_SKIP_SPIRV", None)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("khal-cache")


@pytest.fixture(scope="session")
def example_wheel(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """The example shader package built once per session (no build isolation: the test
    environment already holds hatchling, hatch-khal and NVRTC).

    ``KHAL_TEST_EXAMPLE_WHEEL=path/to.whl`` uses a wheel built beforehand instead (the GPU
    machine runs the tests against the wheel the README's first command made).
    """
    given = os.environ.get("KHAL_TEST_EXAMPLE_WHEEL")
    if given:
        path = Path(given)
        assert path.is_file(), f"KHAL_TEST_EXAMPLE_WHEEL={given}: no such wheel"
        return path
    out = tmp_path_factory.mktemp("example-wheel")
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
         "-w", str(out), str(EXAMPLE)],
        env=build_env(session_cache),
    )
    wheels = list(out.glob("example_shader_pkg-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="session")
def example_site(tmp_path_factory: pytest.TempPathFactory, example_wheel: Path) -> Path:
    """The example wheel unpacked as an install target (what pip would put in site-packages)."""
    site = tmp_path_factory.mktemp("example-site")
    with zipfile.ZipFile(example_wheel) as zf:
        zf.extractall(site)
    return site


@pytest.fixture(scope="session")
def example_pkg(example_site: Path):  # type: ignore[no-untyped-def]
    """``import example_shader_pkg`` from the built wheel."""
    sys.path.insert(0, str(example_site))
    for name in [m for m in sys.modules if m == "example_shader_pkg" or m.startswith("example_shader_pkg.")]:
        del sys.modules[name]
    try:
        pkg = importlib.import_module("example_shader_pkg")
        importlib.import_module("example_shader_pkg.reference")
        yield pkg
    finally:
        sys.path.remove(str(example_site))


@pytest.fixture(scope="session")
def example_slang(example_wheel: Path):  # type: ignore[no-untyped-def]
    """The example wheel's Slang crate: its manifest entries, WGSL / SPIR-V files and CUDA binaries."""
    from tests.helpers.slang import shipped_crate

    return shipped_crate(example_wheel)


@pytest.fixture(scope="session")
def example_slang_output(example_wheel: Path, session_cache: Path):  # type: ignore[no-untyped-def]
    """The example's Slang stage output (its CUDA unit included) as the session's wheel build cached
    it: no second Slang run (compiled here when the wheel was given, KHAL_TEST_EXAMPLE_WHEEL)."""
    from tests.helpers.slang import cached_example_crate

    return cached_example_crate(session_cache)
