"""Every driver call khal_runtime makes exists in the installed cuda-bindings, with the arity
the runtime calls it with: cuda-bindings 12.x (12.9, for CUDA 12 drivers) and 13.x (for
CUDA 13 drivers) alike. No GPU needed: the functions are inspected, not called.

The calls are read from khal_runtime's source (``<driver>.cuXxx(...)``), plus the ones made
through generated code or ``getattr`` (the launch paths, enum members by name). Run it under
both majors: ``pip install 'cuda-bindings~=12.9.0'`` in a scratch environment, then this file.
"""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_cuda_bindings
driver = pytest.importorskip("cuda.bindings.driver")  # (the marker selects; this skips the module's import)

RUNTIME = Path(__file__).resolve().parents[3] / "khal_runtime"

#: calls that the AST does not show: generated launch code (launchgen: ``cuLaunchKernel(function,
#: gx, gy, gz, bx, by, bz, shmem, stream, addr, 0)``) and launch.launch_call's prepared tuples
EXTRA_CALLS = {"cuLaunchKernel": {11}, "cuLaunchKernelEx": {4}}
#: enum members the runtime looks up by name (getattr), enum class -> members
ENUM_MEMBERS = {
    "CUdevice_attribute": ["CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
                           "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
                           "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"],
    "CUstreamCaptureMode": ["CU_STREAM_CAPTURE_MODE_GLOBAL", "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL",
                            "CU_STREAM_CAPTURE_MODE_RELAXED"],
    "CUstreamCaptureStatus": ["CU_STREAM_CAPTURE_STATUS_NONE"],
    "CUstream_flags": ["CU_STREAM_NON_BLOCKING"],
    "CUevent_flags": ["CU_EVENT_DEFAULT", "CU_EVENT_DISABLE_TIMING"],
}
#: CUlaunchConfig fields set by launch.launch_call
LAUNCH_CONFIG_FIELDS = ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
                        "sharedMemBytes", "hStream", "numAttrs")


def runtime_calls() -> dict[str, set[int]]:
    """Driver function name -> the positional-argument counts it is called with."""
    calls: dict[str, set[int]] = defaultdict(set)
    for path in RUNTIME.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name = node.func.attr
            if name.startswith("cu") and name[2:3].isupper():
                assert not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args), \
                    f"{path.name}:{node.lineno}: {name}: keep driver calls positional (the test counts them)"
                calls[name].add(len(node.args))
    for name, counts in EXTRA_CALLS.items():
        calls[name] |= counts
    return dict(calls)


def test_the_scan_finds_the_driver_calls() -> None:
    calls = runtime_calls()
    assert len(calls) > 40
    assert {"cuInit", "cuLibraryLoadData", "cuGraphInstantiate", "cuStreamBeginCapture"} <= calls.keys()


@pytest.mark.parametrize("name", sorted(runtime_calls()))
def test_driver_function_exists_with_the_arity_used(name: str) -> None:
    fn = getattr(driver, name, None)
    assert fn is not None, f"cuda.bindings.driver {driver_version()} has no {name}"
    params = inspect.signature(fn).parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    for n in runtime_calls()[name]:
        assert required <= n <= len(positional), (
            f"khal_runtime calls {name} with {n} arguments; cuda.bindings {driver_version()} "
            f"takes {inspect.signature(fn)}")


def test_enums_and_launch_config() -> None:
    for enum, members in ENUM_MEMBERS.items():
        for m in members:
            assert hasattr(getattr(driver, enum), m), f"{enum}.{m}"
    cfg = driver.CUlaunchConfig()
    for f in LAUNCH_CONFIG_FIELDS:
        assert hasattr(cfg, f), f
    cfg.numAttrs = 0
    assert hasattr(driver, "CUresult") and driver.CUresult.CUDA_SUCCESS == 0


def driver_version() -> str:
    import cuda.bindings

    return str(getattr(cuda.bindings, "__version__", "?"))


def test_bindings_newer_than_the_driver_are_named() -> None:
    from types import SimpleNamespace

    from khal_runtime.backends.cuda.driver import bindings_mismatch

    b13 = SimpleNamespace(CUDA_VERSION=13000)
    note = bindings_mismatch(b13, (12, 4))
    assert note is not None and "built for CUDA 13" in note and "cuda-bindings~=12.9" in note
    assert bindings_mismatch(b13, (13, 0)) is None
    assert bindings_mismatch(SimpleNamespace(CUDA_VERSION=12090), (13, 0)) is None  # 12.x on a 13 driver: fine
    assert bindings_mismatch(SimpleNamespace(), (12, 4)) is None  # a fake driver without CUDA_VERSION
    assert bindings_mismatch(b13, None) is None
    assert driver.CUDA_VERSION // 1000 == int(driver_version().split(".")[0])
