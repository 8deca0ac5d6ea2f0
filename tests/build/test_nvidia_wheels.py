"""The NVIDIA wheel families (CUDA 13 names, CUDA 12 ``-cu12`` names): requirement parsing,
header requirements, library and header lookup. No NVRTC is loaded here."""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet

from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.headers import header_hint, header_packages, header_requirements
from hatch_khal.nvidia_wheels import (
    FAMILIES,
    admitted_majors,
    family_for_major,
    header_spec,
    library_major,
    parse_nvrtc_requirement,
)

CRATE = {"name": "a", "sources": ["k/*.cu"]}


@pytest.mark.parametrize(
    "text, nvrtc, majors",
    [
        ("nvidia-cuda-nvrtc>=12.8", "nvidia-cuda-nvrtc", list(range(13, 40))),  # the default: 13 and later
        ("nvidia-cuda-nvrtc~=13.0.0", "nvidia-cuda-nvrtc", [13]),
        ("nvidia-cuda-nvrtc-cu12~=12.9", "nvidia-cuda-nvrtc-cu12", [12]),
        ("nvidia_cuda_nvrtc_cu12==12.9.86", "nvidia-cuda-nvrtc-cu12", [12]),
        ("NVIDIA-CUDA-NVRTC-CU12>=12.4", "nvidia-cuda-nvrtc-cu12", [12]),
    ],
)
def test_requirement_names_its_family(text: str, nvrtc: str, majors: list[int]) -> None:
    req, fam = parse_nvrtc_requirement(text)
    assert fam.nvrtc == nvrtc
    assert admitted_majors(req.specifier, fam.lo, fam.hi) == majors


def test_cuda_12_under_cuda_13_names_points_at_cu12() -> None:
    with pytest.raises(ValueError, match=r"admits no release of nvidia-cuda-nvrtc \(CUDA 13 and later\).*"
                                         r"require nvidia-cuda-nvrtc-cu12~=12\.9"):
        parse_nvrtc_requirement("nvidia-cuda-nvrtc~=12.9")
    with pytest.raises(ValueError, match=r"admits no release of nvidia-cuda-nvrtc-cu12 \(CUDA 12\).*"
                                         r"require nvidia-cuda-nvrtc==13\.0\.\*"):
        parse_nvrtc_requirement("nvidia-cuda-nvrtc-cu12==13.0.*")


@pytest.mark.parametrize(
    "text, match",
    [
        ("numpy", r"must be a requirement on nvidia-cuda-nvrtc \(CUDA 13 and later\) or "
                  r"nvidia-cuda-nvrtc-cu12 \(CUDA 12\), got 'numpy'"),
        ("nvidia-cuda-nvrtc-cu11", "got 'nvidia-cuda-nvrtc-cu11'"),
        ("nvidia-cuda-nvrtc >= ", "is not a valid requirement"),
    ],
)
def test_bad_requirements_are_config_errors_naming_the_option(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_nvrtc_requirement(text)
    with pytest.raises(ConfigError, match=r"option 'nvrtc-requirement': .*" + match):
        parse_config({"crates": [CRATE], "nvrtc-requirement": text}, default_package="pkg", where="hook")
    with pytest.raises(ConfigError, match=r"option 'nvrtc-requirement': .*" + match):
        header_requirements(text)


def test_cu12_requirement_is_accepted_by_the_config() -> None:
    hook, _ = parse_config({"crates": [CRATE], "nvrtc-requirement": "nvidia-cuda-nvrtc-cu12~=12.9"},
                           default_package="pkg", where="hook")
    assert hook.nvrtc_requirement == "nvidia-cuda-nvrtc-cu12~=12.9"


@pytest.mark.parametrize(
    "nvrtc, headers",
    [
        # CUDA 12: no crt wheel; CCCL numbered like CUDA, so it takes NVRTC's specifier too
        ("nvidia-cuda-nvrtc-cu12~=12.9", ["nvidia-cuda-runtime-cu12~=12.9", "nvidia-cuda-cccl-cu12~=12.9"]),
        # patch numbers differ between one release's wheels: the headers follow to the minor only
        ("nvidia-cuda-nvrtc-cu12==12.9.86", ["nvidia-cuda-runtime-cu12==12.9.*", "nvidia-cuda-cccl-cu12==12.9.*"]),
        ("nvidia-cuda-nvrtc-cu12>=12.4.1,<12.9", ["nvidia-cuda-runtime-cu12<12.9,>=12.4",
                                                  "nvidia-cuda-cccl-cu12<12.9,>=12.4"]),
        # CUDA 13: crt is a wheel of its own, CCCL has its own numbers (pinned to the major)
        ("nvidia-cuda-nvrtc~=13.0.0", ["nvidia-cuda-runtime~=13.0.0", "nvidia-cuda-crt~=13.0.0",
                                       "nvidia-cuda-cccl>=13,<14"]),
        ("nvidia-cuda-nvrtc==13.5.37", ["nvidia-cuda-runtime==13.5.*", "nvidia-cuda-crt==13.5.*",
                                        "nvidia-cuda-cccl>=13,<14"]),
        ("nvidia-cuda-nvrtc>=12.8", ["nvidia-cuda-runtime>=12.8", "nvidia-cuda-crt>=12.8", "nvidia-cuda-cccl>=13"]),
    ],
)
def test_header_requirements_per_family(nvrtc: str, headers: list[str]) -> None:
    assert header_requirements(nvrtc) == headers


@pytest.mark.parametrize(
    "spec, out",
    [("==12.9.86", "==12.9.*"), (">=12.4.1", ">=12.4"), ("<12.8.5", "<12.9"), ("<=12.8.0", "<12.9"),
     ("~=12.9", "~=12.9"), ("~=13.0.0", "~=13.0.0"), ("~=12.9.1", "==12.9.*"), ("!=12.9.1,>=12.8", ">=12.8"),
     ("==12.*", "==12.*")],
)
def test_header_spec_drops_the_patch(spec: str, out: str) -> None:
    assert header_spec(SpecifierSet(spec)) == out


def test_families_and_library_names() -> None:
    assert family_for_major(12) is not None and family_for_major(12).nvrtc == "nvidia-cuda-nvrtc-cu12"  # type: ignore[union-attr]
    assert family_for_major(13) is FAMILIES[0] and family_for_major(14) is FAMILIES[0]
    assert family_for_major(11) is None
    assert header_packages(12) == ("nvidia-cuda-runtime-cu12", "nvidia-cuda-cccl-cu12")
    assert header_packages(13) == header_packages(None) == ("nvidia-cuda-runtime", "nvidia-cuda-crt",
                                                           "nvidia-cuda-cccl")
    assert library_major("libnvrtc.so.12") == 12 and library_major("libnvrtc.so.13") == 13
    assert library_major("nvrtc64_120_0.dll") == 12 and library_major("nvrtc64_130_0.dll") == 13
    assert library_major("libnvrtc.so") is None
    cu12 = family_for_major(12)
    assert cu12 is not None
    assert cu12.include_subdirs("cccl", 12) == ("nvidia/cuda_cccl/include",)
    assert cu12.include_subdirs("cudart", 12) == ("nvidia/cuda_runtime/include",)
    assert FAMILIES[0].include_subdirs("cccl", 13) == ("nvidia/cu13/include/cccl",)


def test_header_hints_name_the_wheels_of_nvrtcs_major() -> None:
    assert "nvidia-cuda-cccl-cu12" in header_hint("cub/cub.cuh", "wheels", 12)
    assert "nvidia-cuda-runtime-cu12" in header_hint("cuda_fp16.h", "wheels", 12)
    assert "nvidia-cuda-cccl wheel" in header_hint("cub/cub.cuh", "wheels", 13)
    assert "no wheel of crt/ headers" in header_hint("crt/host_defines.h", "wheels", 12)
    assert "nvidia-cuda-crt" in header_hint("crt/host_defines.h", "wheels", 13)


def test_the_nvrtc_library_follows_the_requirement(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from hatch_khal import nvrtc

    cu13 = tmp_path / "a" / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13"
    cu12 = tmp_path / "b" / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    for lib in (cu13, cu12, cu12.with_name("libnvrtc.alt.so.12"), cu12.with_name("libnvrtc-builtins.so.12.9")):
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(b"")
    monkeypatch.setattr("sys.path", [str(tmp_path / "a"), str(tmp_path / "b")])
    monkeypatch.delenv(nvrtc.REQUIREMENT_ENV, raising=False)
    assert nvrtc._find_wheel_nvrtc() == cu13  # no requirement: the newest
    with nvrtc.requirement("nvidia-cuda-nvrtc-cu12~=12.9"):
        assert nvrtc._find_wheel_nvrtc() == cu12
    with nvrtc.requirement("nvidia-cuda-nvrtc~=13.0.0"):
        assert nvrtc._find_wheel_nvrtc() == cu13
    assert nvrtc.REQUIREMENT_ENV not in __import__("os").environ  # restored
