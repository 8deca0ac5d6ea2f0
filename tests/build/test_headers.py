"""CUDA headers from PyPI wheels: include path, hashing by package version, clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hatch_khal import cuda as cuda_lang
from hatch_khal.errors import CompileError
from hatch_khal.headers import HeaderSet, header_hint, header_requirements, resolve_headers

from tests.helpers.build import build, manifest_of
from tests.helpers.projects import HALF_CU, make_project
from tests.conftest import SESSION_ENV

ONE_ARCH = 'archs = ["sm_90"]\nptx-arch = "none"\n'


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV:
            monkeypatch.delenv(k)


def test_header_requirements_follow_nvrtc() -> None:
    assert header_requirements("nvidia-cuda-nvrtc~=13.0.0") == [
        "nvidia-cuda-runtime~=13.0.0", "nvidia-cuda-crt~=13.0.0", "nvidia-cuda-cccl>=13,<14"]
    assert header_requirements("nvidia-cuda-nvrtc==13.5.37")[2] == "nvidia-cuda-cccl>=13,<14"


def test_wheel_headers_are_found() -> None:
    hs = resolve_headers("wheels", None)
    assert any((d / "cuda_fp16.h").is_file() for d in hs.include_dirs)
    assert any((d / "cub" / "cub.cuh").is_file() for d in hs.include_dirs)
    assert dict(hs.fingerprint).keys() >= {"nvidia-cuda-runtime", "nvidia-cuda-cccl"}


@pytest.mark.needs_nvrtc
def test_fp16_cub_and_cooperative_groups_compile_from_wheels(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", hook=ONE_ARCH, files={"kernels/beta/fill.cu": HALF_CU})
    m, _ = manifest_of(build(root, None)[0])
    (halve,) = m.crate("beta").entries
    assert [(p.element_type, p.element_size) for p in halve.params] == [("float16", 2), ("float16", 2)]


@pytest.mark.needs_nvrtc
def test_header_versions_enter_the_hash_of_including_crates_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p", hook=ONE_ARCH, files={"kernels/beta/fill.cu": HALF_CU})
    before, _ = manifest_of(build(root, None)[0])
    real = cuda_lang.resolve_headers

    def upgraded(mode: str, major: int | None) -> HeaderSet:
        hs = real(mode, major)
        return HeaderSet(hs.mode, hs.include_dirs, tuple((p, "99.0") for p, _ in hs.fingerprint))

    monkeypatch.setattr(cuda_lang, "resolve_headers", upgraded)
    after, _ = manifest_of(build(root, None)[0])
    assert after.crate("beta").entries[0].hash != before.crate("beta").entries[0].hash  # includes CCCL
    assert after.crate("alpha").entries[0].hash == before.crate("alpha").entries[0].hash  # local headers only


@pytest.mark.parametrize(
    "include, hook, expect",
    [
        ("<cub/not_a_header.cuh>", "", "nvidia-cuda-cccl"),
        ("<cuda_fp16.h>", 'cuda-headers = "none"\n', "'cuda-headers' is \"none\""),
        ("<stdint.h>", "", "NVRTC does not have"),
        ('"missing_local.cuh"', "", "include-dirs"),
        ("<nvfunctional>", "", "no PyPI wheel ships"),
    ],
)
@pytest.mark.needs_nvrtc
def test_missing_header_names_header_and_provider(tmp_path: Path, include: str, hook: str, expect: str) -> None:
    src = f"#include {include}\nKHAL_ENTRY(fill, 64, (KHAL_STORAGE(float, o))) {{ }}\n"
    root = make_project(tmp_path / "p", hook=ONE_ARCH + hook, files={"kernels/beta/fill.cu": src})
    with pytest.raises(CompileError) as err:
        build(root, None)
    msg = str(err.value)
    assert include.strip('<>"') in msg and expect in msg and "fill.cu(1)" in msg


@pytest.mark.needs_nvrtc
def test_a_toolkit_only_header_is_not_sent_to_include_dirs(tmp_path: Path) -> None:
    """<nvfunctional> (nvstd::function) is in no wheel: NVRTC cannot open it, and the hint says so
    and what to write instead, not "check 'include-dirs'"."""
    src = "#include <nvfunctional>\nKHAL_ENTRY(fill, 64, (KHAL_STORAGE(float, o))) { }\n"
    root = make_project(tmp_path / "p", hook=ONE_ARCH, files={"kernels/beta/fill.cu": src})
    with pytest.raises(CompileError) as err:
        build(root, None)
    msg = str(err.value)
    assert 'cannot open source file "nvfunctional"' in msg  # what NVRTC itself says
    (hint,) = [line for line in msg.splitlines() if line.startswith("hint: ")]
    assert "include-dirs" not in hint
    assert "<nvfunctional> (nvstd::function) is a header of the full CUDA toolkit that no PyPI wheel ships" in hint
    assert "take the callable as a template parameter" in hint and "'cuda-headers' = \"system\"" in hint
    system = header_hint("nvfunctional", "system", 13)
    assert "CUDA_HOME / CUDA_PATH has none in its include folder" in system and "'cuda-headers'" not in system
    assert "nvidia-cuda-runtime-cu12" in header_hint("nvfunctional", "wheels", 12)
