"""Hook configuration: strict validation, clear errors, hatch's reserved keys tolerated."""

from __future__ import annotations

import pytest

from hatch_khal.config import DEFAULT_ARCHS, env_var_for_crate, parse_config
from hatch_khal.errors import ConfigError

CRATE = {"name": "core", "sources": ["k/*.cu"]}


def parse(raw, **kw):  # type: ignore[no-untyped-def]
    return parse_config(raw, default_package="pkg", **kw)


def test_defaults() -> None:
    cfg, (crate,) = parse({"crates": [CRATE]})
    assert crate.archs == list(DEFAULT_ARCHS) and crate.ptx_arch == "compute_75"
    assert crate.package == "pkg" and not crate.archs_explicit
    assert cfg.nvrtc_requirement.startswith("nvidia-cuda-nvrtc")


def test_hatch_reserved_keys_are_tolerated() -> None:
    parse({"crates": [CRATE], "dependencies": ["x"], "enable-by-default": True,
           "require-runtime-dependencies": False, "require-runtime-features": []})


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"crates": [CRATE], "bogus": 1}, "unknown option 'bogus'"),
        ({"crates": [{**CRATE, "sorces": ["x"]}]}, r"unknown option 'crates\[0\].sorces'"),
        ({}, "option 'crates' is required"),
        ({"crates": []}, "option 'crates'"),
        ({"crates": [{"name": "core"}]}, r"option 'crates\[0\].sources' is required"),
        ({"crates": [{**CRATE, "sources": "k/*.cu"}]}, r"'crates\[0\].sources'.*valid list"),
        ({"crates": [{**CRATE, "archs": ["sm90"]}]}, r"'crates\[0\].archs'.*not a cubin arch"),
        ({"crates": [CRATE], "archs": []}, "at least one arch"),
        ({"crates": [CRATE], "ptx-arch": "sm_75"}, "not a PTX arch"),
        ({"crates": [{**CRATE, "name": "1x"}]}, "must start with a letter"),
        ({"crates": [CRATE, CRATE]}, "crate names must be unique"),
        ({"crates": [CRATE, {**CRATE, "name": "CORE"}]}, "CUDA_OXIDE_SHADERS_PTX_CORE"),
        ({"crates": [{**CRATE, "defines": {"1A": "x"}}]}, "not a C identifier"),
        ({"crates": [{**CRATE, "options": "-O3"}]}, r"'crates\[0\].options'"),
        ({"crates": [CRATE], "nvrtc-requirement": "numpy"}, "nvidia-cuda-nvrtc"),
        ({"crates": [CRATE], "nvrtc-requirement": "not a req !"}, "not a valid requirement"),
        ({"crates": [{**CRATE, "spirv": "yes"}]}, r"'crates\[0\].spirv'"),
    ],
)
def test_invalid_config_names_option_and_hook(raw, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=match) as err:
        parse(raw, where="build hook `khal`")
    assert "build hook `khal`" in str(err.value)


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KHAL_CUDA_ARCHS", "sm_90, sm_80")
    monkeypatch.setenv("KHAL_PTX_ARCH", "compute_80")
    _, (crate,) = parse({"crates": [CRATE]})
    assert crate.archs == ["sm_80", "sm_90"] and crate.ptx_arch == "compute_80" and crate.archs_explicit


def test_bad_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KHAL_CUDA_ARCHS", "ampere")
    with pytest.raises(ConfigError, match="KHAL_CUDA_ARCHS"):
        parse({"crates": [CRATE]})


def test_crate_settings_merge_with_hook_level() -> None:
    _, (crate,) = parse({
        "crates": [{**CRATE, "options": ["-lineinfo"], "defines": {"B": "2"}, "include-dirs": ["c"], "ptx-arch": "none"}],
        "options": ["-O3"], "defines": {"A": "1", "B": "1"}, "include-dirs": ["h"], "archs": ["sm_90"],
    })
    assert crate.options == ["-O3", "-lineinfo"] and crate.defines == {"A": "1", "B": "2"}
    assert crate.include_dirs == ["h", "c"] and crate.ptx_arch is None and crate.archs == ["sm_90"]


def test_env_var_name() -> None:
    assert env_var_for_crate("my-shaders") == "CUDA_OXIDE_SHADERS_PTX_MY_SHADERS"


def test_no_package_anywhere() -> None:
    with pytest.raises(ConfigError, match="'package' is not set"):
        parse_config({"crates": [CRATE]}, default_package=None)


@pytest.mark.parametrize(
    "key, level, right",
    [
        ("include_dirs", "crate", "include-dirs"),
        ("includes", "crate", "include-dirs"),
        ("arch", "crate", "archs"),
        ("ptx_arch", "crate", "ptx-arch"),
        ("cuda_headers", "crate", "cuda-headers"),
        ("source", "crate", "sources"),
        ("define", "crate", "defines"),
        ("include_dirs", "hook", "include-dirs"),
        ("nvrtc_requirement", "hook", "nvrtc-requirement"),
        ("ptx_arch", "hook", "ptx-arch"),
        ("crate", "hook", "crates"),
    ],
)
def test_near_miss_keys_name_the_right_one(key: str, level: str, right: str) -> None:
    value: object = ["x"] if key not in ("ptx_arch", "cuda_headers", "nvrtc_requirement") else "x"
    raw = {"crates": [{**CRATE, key: value}]} if level == "crate" else {"crates": [CRATE], key: value}
    loc = f"crates[0].{key}" if level == "crate" else key
    with pytest.raises(ConfigError, match=rf"unknown option '{loc.replace('[', '.').replace(']', '.')}'; "
                                          rf"did you mean '{right}'\?"):
        parse(raw)


def test_hook_level_option_in_a_crate_says_where_it_belongs() -> None:
    with pytest.raises(ConfigError, match=r"'nvrtc-requirement' is an option of the hook table, not of a crate"):
        parse({"crates": [{**CRATE, "nvrtc-requirement": "nvidia-cuda-nvrtc"}]})


@pytest.mark.parametrize("arch", ["sm_9", "sm_90x", "compute_90", "sm90", "SM_90"])
def test_archs_are_parsed_by_the_abi(arch: str) -> None:
    with pytest.raises(ConfigError, match=rf"'{arch}' is not a cubin arch like 'sm_90'"):
        parse({"crates": [{**CRATE, "archs": [arch]}]})


def test_suffixed_archs_sort_by_number() -> None:
    _, (crate,) = parse({"crates": [{**CRATE, "archs": ["sm_100a", "sm_90a", "sm_90", "sm_120f"]}]})
    assert crate.archs == ["sm_90", "sm_90a", "sm_100a", "sm_120f"]


def test_a_crate_may_name_its_language_and_an_unknown_name_says_where_languages_come_from() -> None:
    _, (c,) = parse_config({"crates": [{"name": "a", "sources": ["k/*.h"], "language": "cuda"}]}, default_package="p")
    assert c.language == "cuda"
    with pytest.raises(ConfigError, match=r"crates\[0\] 'a': option 'language' = 'fortran' names no language of this "
                                          r"build \(it has: cuda, slang, triton\); .*entry-point group "
                                          r"'hatch_khal.languages': list its distribution in \[build-system\] requires"):
        parse_config({"crates": [{"name": "a", "sources": ["k/*.f90"], "language": "fortran"}]}, default_package="p")
