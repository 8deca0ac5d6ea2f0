"""Build-side hardening (issue #29): each test failed on the code before its fix."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from khal_runtime.abi import parse_arch, split_symbol


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")):
            monkeypatch.delenv(k)


def _crate(**kw: Any) -> dict[str, Any]:
    return {"name": "alpha", "sources": ["k/*.cu"], **kw}


# -- (12) names and values are matched whole: a trailing newline is no part of a name ---------------


@pytest.mark.parametrize("table, named", [
    ({"crates": [_crate(name="alpha\n")]}, "crates[0].name"),
    ({"crates": [_crate(archs=["sm_090"])]}, "crates[0].archs"),
    ({"archs": ["sm_90\n"], "crates": [_crate()]}, "archs"),
    ({"crates": [_crate(**{"ptx-arch": "compute_075"})]}, "crates[0].ptx-arch"),
    ({"ptx-arch": "compute_75\n", "crates": [_crate()]}, "ptx-arch"),
    ({"defines": {"X\n": 1}, "crates": [_crate()]}, "defines"),
    ({"crates": [_crate(defines={"Y\n": "2"})]}, "crates[0].defines"),
], ids=["name-newline", "arch-leading-zero", "arch-newline", "ptx-leading-zero", "ptx-newline",
        "define-newline", "crate-define-newline"])
def test_names_and_values_are_matched_whole(table: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=rf"option {re.escape(repr(named))}"):
        parse_config(table, default_package="p")


@pytest.mark.parametrize("value", ["sm_090", "sm_90,compute_075"])
def test_env_archs_are_matched_whole(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("KHAL_CUDA_ARCHS", value)
    with pytest.raises(ConfigError, match="KHAL_CUDA_ARCHS"):
        parse_config({"crates": [_crate()]}, default_package="p")


def test_runtime_parsers_are_matched_whole() -> None:
    for bad in ("sm_90\n", "sm_090", "compute_075", "compute_75\n"):
        with pytest.raises(ValueError):
            parse_arch(bad)
    assert split_symbol("saxpy_khal_0123456789abcdef") == ("saxpy", "0123456789abcdef")
    assert split_symbol("saxpy_khal_0123456789abcdef\n") is None
