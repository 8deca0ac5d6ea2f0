"""``KHAL_BACKEND``'s choice between CUDA (the fake driver of tests/helpers/fakecuda.py) and WebGPU (the
adapter wgpu-py finds: lavapipe on CPU machines), with packages cut from the example wheel: its
Slang crate with only some of its binaries, its CUDA C++ crate, its Slang crate as a
``KHAL_SKIP_SPIRV`` build would ship it."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import khal_runtime
from khal_runtime import backends
from khal_runtime.backends.cuda import driver as cuda_driver
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import BackendUnavailableError, NoCompatibleBinaryError
from khal_runtime.manifest import SCHEMA_VERSION, Artifact, Manifest, SpirvStatus, Toolchain, parse_manifest
from tests.helpers.slang import EXAMPLE_CRATE, EXAMPLE_PACKAGE, needs_slang_or_wheel
from tests.helpers.fakecuda import FakeDriver, _reset_runtime

pytestmark = [pytest.mark.webgpu, needs_slang_or_wheel]


def _package(root: Path, wheel: Path, name: str, crate: str, keep: Callable[[Artifact], bool],
             **update: Any) -> Path:
    """A package holding one crate of the example wheel, with only the artifacts ``keep`` keeps."""
    with zipfile.ZipFile(wheel) as zf:
        c = parse_manifest(zf.read(f"{EXAMPLE_PACKAGE}/_khal/manifest.json")).crate(crate)
        arts = tuple(a for a in c.artifacts if keep(a))
        for a in arts:
            (root / name / a.path).parent.mkdir(parents=True, exist_ok=True)
            (root / name / a.path).write_bytes(zf.read(f"{EXAMPLE_PACKAGE}/{a.path}"))
    if not any(a.kind == "ptx" for a in arts):  # no PTX to back the launch facts: the hashed ones
        c = c.model_copy(update={"entries": tuple(e.model_copy(update={"launch": None}) for e in c.entries)})
    c = c.model_copy(update={"artifacts": arts, **update})
    m = Manifest(schema_version=SCHEMA_VERSION, package=name, toolchain=Toolchain(hatch_khal_version="test"),
                 crates=(c,))
    (root / name / "_khal").mkdir(parents=True, exist_ok=True)
    (root / name / "_khal" / "manifest.json").write_text(m.to_json())
    return root / name


def _webgpu_or(*archs: str) -> Callable[[Artifact], bool]:
    return lambda a: a.kind in ("wgsl", "spirv") or a.arch in archs


@pytest.fixture(scope="module")
def pkgs(example_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("choice")
    sl = EXAMPLE_CRATE
    with zipfile.ZipFile(example_wheel) as zf:
        entries = parse_manifest(zf.read(f"{EXAMPLE_PACKAGE}/_khal/manifest.json")).crate(sl).entries
    return {
        # the fake device is sm_90 (CUDA 13.0): a cubin of another major only, and the WebGPU build
        "other_arch": _package(root, example_wheel, "other_arch_pkg", sl, _webgpu_or("sm_100", "sm_120")),
        "sm90": _package(root, example_wheel, "sm90_pkg", sl, _webgpu_or("sm_90")),
        "cuda_cpp": _package(root, example_wheel, "cuda_cpp_pkg", "core", lambda a: a.kind in ("cubin", "ptx")),
        "triton": _package(root, example_wheel, "triton_pkg", "tutorials", lambda a: True),
        "skipped": _package(root, example_wheel, "skipped_pkg", sl, lambda a: a.kind in ("cubin", "ptx"),
                            spirv=SpirvStatus(status="skipped", reason="KHAL_SKIP_SPIRV is set"),
                            entries=tuple(e.model_copy(update={"webgpu": None}) for e in entries)),
    }


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeDriver, list[str]]]:
    """The fake CUDA driver (one sm_90 device), no backend chosen yet, ``KHAL_BACKEND=auto``, and
    auto's fallback reports (BackendFallbackWarning messages) collected."""
    drv = FakeDriver()
    monkeypatch.setenv("KHAL_BACKEND", "auto")
    monkeypatch.setattr(cuda_driver, "_driver", drv)
    _reset_runtime()
    lines: list[str] = []
    monkeypatch.setattr(backends, "_report", lines.append)
    yield drv, lines
    _reset_runtime()


def _saxpy_on(ks: Any) -> np.ndarray:
    n = 300
    dy = DeviceBuffer.from_numpy(np.full(n, 1.0, np.float32))
    dx = DeviceBuffer.from_numpy(np.arange(n, dtype=np.float32))
    ks.saxpy_shared(n, dy, dx, 2.0)
    return dy.to_numpy()


def test_auto_without_a_cuda_binary_for_the_device_falls_back_to_webgpu(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path]) -> None:
    drv, lines = fake_cuda
    ks = khal_runtime.load(pkgs["other_arch"])
    np.testing.assert_array_equal(_saxpy_on(ks), 1.0 + 2.0 * np.arange(300, dtype=np.float32))
    st = khal_runtime.backend_status()
    assert st.backend == "webgpu"
    assert len(lines) == 1
    assert lines[0].startswith("KHAL_BACKEND=auto: no CUDA binary for sm_90 in package "
                               "'other_arch_pkg' crate 'slang' (it ships: cubin sm_100, cubin sm_120); "
                               "using WebGPU (")
    assert st.adapter["name"] in lines[0]
    assert "no CUDA binary for sm_90" in st.why and "fell back to WebGPU" in st.why
    assert "cuLibraryLoadData" not in drv.names()  # asked, not loaded


def test_auto_with_a_cuda_binary_for_the_device_stays_on_cuda(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path]) -> None:
    _, lines = fake_cuda
    khal_runtime.load(pkgs["sm90"])
    st = khal_runtime.backend_status()
    assert (st.backend, st.why, lines) == ("cuda", "CUDA is usable", [])


def test_auto_stays_on_cuda_when_webgpu_cannot_run_every_loaded_package(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path]) -> None:
    """A CUDA C++ package that runs on CUDA is not given up for one without a binary: CUDA stays,
    and the package without a binary fails at load with the selection error."""
    _, lines = fake_cuda
    khal_runtime.load(pkgs["cuda_cpp"])
    ks = khal_runtime.load(pkgs["other_arch"])
    st = khal_runtime.backend_status()
    assert st.backend == "cuda" and lines == []
    assert "no CUDA binary for sm_90 in package 'other_arch_pkg'" in st.why
    with pytest.raises(NoCompatibleBinaryError, match=r"no binary for the device .*\(sm_90\)"):
        _saxpy_on(ks)


def test_explicit_cuda_refuses_a_package_without_a_binary_for_the_device(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _, lines = fake_cuda
    monkeypatch.setenv("KHAL_BACKEND", "cuda")
    ks = khal_runtime.load(pkgs["other_arch"])
    with pytest.raises(NoCompatibleBinaryError,
                       match=r"crate 'slang' of package 'other_arch_pkg': no binary for the device .*\(sm_90\) "
                             r"with driver CUDA 13\.0; the package ships: cubin sm_100, cubin sm_120"):
        _saxpy_on(ks)
    assert khal_runtime.backend_status().backend == "cuda" and lines == []


def _nvidiactl(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    """Whether this machine shows an NVIDIA device (/dev/nvidiactl, the driver's /proc entry)."""
    real = os.path.exists
    monkeypatch.setattr(backends.os.path, "exists", lambda p: present if str(p) in (
        "/dev/nvidiactl", "/proc/driver/nvidia/version") else real(p))


@pytest.mark.parametrize("nvidiactl", [True, False], ids=["nvidiactl", "no-nvidiactl"])
def test_auto_with_unusable_cuda_says_why_and_hints_at_a_visible_nvidia_device(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        nvidiactl: bool) -> None:
    drv, lines = fake_cuda
    drv.devices = 0  # the driver loads but sees no device: CUDA is not usable
    _nvidiactl(monkeypatch, nvidiactl)
    ks = khal_runtime.load(pkgs["other_arch"])
    np.testing.assert_array_equal(_saxpy_on(ks)[:3], [1.0, 3.0, 5.0])
    assert len(lines) == 1 and "because CUDA is not usable: no CUDA device/driver was found" in lines[0]
    hint = "An NVIDIA device is visible (/dev/nvidiactl): this probably hides a broken CUDA setup"
    assert (hint in lines[0]) is nvidiactl
    st = khal_runtime.backend_status()
    assert st.backend == "webgpu"
    assert st.why.startswith("CUDA is not usable (no CUDA device/driver was found") and "fell back" in st.why


@pytest.mark.parametrize("nvidiactl", [True, False], ids=["nvidiactl", "no-nvidiactl"])
def test_explicit_cuda_without_usable_cuda_fails_at_load_with_the_hint(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        nvidiactl: bool) -> None:
    drv, _ = fake_cuda
    drv.devices = 0
    monkeypatch.setenv("KHAL_BACKEND", "cuda")
    _nvidiactl(monkeypatch, nvidiactl)
    with pytest.raises(BackendUnavailableError) as exc:
        khal_runtime.load(pkgs["sm90"])
    assert "package 'sm90_pkg': KHAL_BACKEND=cuda: no CUDA device/driver was found" in str(exc.value)
    assert ("An NVIDIA device is visible (/dev/nvidiactl)" in str(exc.value)) is nvidiactl


@pytest.mark.parametrize("which, crate, why", [
    ("cuda_cpp", "core", "CUDA C++ source: it builds for CUDA only"),
    ("skipped", "slang", "its WebGPU stage was skipped at build time (KHAL_SKIP_SPIRV is set)"),
    ("triton", "tutorials", "Triton source: it builds for CUDA only"),
])
def test_auto_without_cuda_on_a_cuda_only_package_has_nothing_to_fall_back_to(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path], which: str, crate: str, why: str) -> None:
    """The reason a crate cannot fall back comes from its own manifest (#38 item 17: a Triton crate's
    said "CUDA C++ sources, or built with KHAL_SKIP_SPIRV")."""
    drv, lines = fake_cuda
    drv.devices = 0
    ks = khal_runtime.load(pkgs[which])
    with pytest.raises(BackendUnavailableError,
                       match=rf"no CUDA device/driver was found.*; and crate '{crate}' of package "
                             rf"'{which}_pkg' has no WebGPU build to fall back to \({re.escape(why)}") as exc:
        ks.crates[crate].load()
    assert (which == "cuda_cpp") is ("CUDA C++" in str(exc.value))
    assert lines == []


def test_a_slang_crate_built_without_its_webgpu_stage_under_webgpu_is_a_named_error(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KHAL_BACKEND", "webgpu")
    ks = khal_runtime.load(pkgs["skipped"])
    with pytest.raises(BackendUnavailableError,
                       match=r"crate 'slang' of package 'skipped_pkg' has no WebGPU \(WGSL / SPIR-V\) artifacts: "
                             r"it was built without its WebGPU stage \(KHAL_SKIP_SPIRV is set\): rebuild "
                             r"without KHAL_SKIP_SPIRV"):
        _saxpy_on(ks)


@pytest.mark.parametrize("value", ["vulkan", "CUDA12", "metal"])
def test_an_invalid_khal_backend_is_a_named_error_listing_the_valid_values(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        value: str) -> None:
    """A bad value is an EnvVarError, the one class of every variable's bad value (#38 item 17)."""
    monkeypatch.setenv("KHAL_BACKEND", value)
    msg = rf"KHAL_BACKEND='{value}' is not a backend khal_runtime provides; use one of auto, cuda, webgpu"
    with pytest.raises(khal_runtime.EnvVarError, match=msg) as exc:
        khal_runtime.load(pkgs["sm90"])
    assert exc.value.variable == "KHAL_BACKEND" and exc.value.value == value
    st = khal_runtime.backend_status()
    assert not st.usable and f"KHAL_BACKEND='{value}'" in st.reason


def test_auto_fallback_is_a_filterable_warning_once(pkgs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback line is a BackendFallbackWarning (a UserWarning users can filter), not a print
    to stderr, and it comes once per process (the choice is made once)."""
    drv = FakeDriver()
    drv.devices = 0
    monkeypatch.setenv("KHAL_BACKEND", "auto")
    monkeypatch.setattr(cuda_driver, "_driver", drv)
    _reset_runtime()
    try:
        ks = khal_runtime.load(pkgs["other_arch"])
        with pytest.warns(khal_runtime.BackendFallbackWarning, match=r"^KHAL_BACKEND=auto: using WebGPU .*because "
                          r"CUDA is not usable") as rec:
            _saxpy_on(ks)
            _saxpy_on(ks)
        assert len([w for w in rec if issubclass(w.category, khal_runtime.BackendFallbackWarning)]) == 1
        assert issubclass(khal_runtime.BackendFallbackWarning, UserWarning)
    finally:
        _reset_runtime()


def _no_wgpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime.backends import BackendStatus

    wg = backends.get("webgpu")
    monkeypatch.setattr(type(wg), "status", lambda self: BackendStatus(
        False, "wgpu-py is not installed: pip install hatch-khal[webgpu] (or pip install wgpu)", "webgpu"))


def test_without_gpu_the_wgpu_hint_comes_only_when_a_loaded_package_has_webgpu_artifacts(
        fake_cuda: tuple[FakeDriver, list[str]], pkgs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA and no wgpu: installing wgpu can help a Slang package (it ships WGSL / SPIR-V), never
    a CUDA C++ one, so the first error says so instead of naming pip install wgpu."""
    drv, _ = fake_cuda
    drv.devices = 0
    _no_wgpu(monkeypatch)
    khal_runtime.load(pkgs["cuda_cpp"])
    with pytest.raises(BackendUnavailableError) as exc:
        DeviceBuffer.zeros(4)
    msg = str(exc.value)
    assert "pip install" not in msg and "wgpu" not in msg, msg
    assert "'cuda_cpp_pkg' ship no WebGPU build" in msg
    _reset_runtime()
    khal_runtime.load(pkgs["other_arch"])
    with pytest.raises(BackendUnavailableError, match=r"no WebGPU fallback: wgpu-py is not installed: pip install"):
        DeviceBuffer.zeros(4)


def test_webgpu_host_array_hint_names_the_public_api() -> None:
    """A host array passed for a storage binding on WebGPU: the hint names khal_runtime.DeviceBuffer,
    the API users have, not the backend's internal WgpuArray."""
    from khal_runtime.backends.webgpu.kernel import _not_storage
    from khal_runtime.errors import ArgumentError

    with pytest.raises(ArgumentError) as exc:
        _not_storage(np.ones(4, np.float32))
    assert "khal_runtime.DeviceBuffer.from_numpy(a)" in str(exc.value) and "WgpuArray" not in str(exc.value)
