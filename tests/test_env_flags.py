"""One reader of boolean KHAL_* variables for the build and the runtime (#29 item 14): "0", "false",
"no", "off" (any case) and empty mean off everywhere; "1" and any other value mean on."""

from __future__ import annotations

import pytest

from hatch_khal.cache import default_cache_dir
from hatch_khal.config import parse_config
from hatch_khal.slang.language import spirv_status
from khal_runtime import abi
from khal_runtime import launch_hooks as hooks

OFF = ["", "0", "false", "FALSE", " no ", "off", "Off"]
ON = ["1", "true", "yes", "on", "anything"]


@pytest.mark.parametrize("value", OFF)
def test_off_values_turn_nothing_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("KHAL_NO_CACHE", value)
    monkeypatch.setenv("KHAL_CACHE_DIR", "/tmp/khal-cache-test")
    assert default_cache_dir() is not None
    monkeypatch.setenv("KHAL_SKIP_SPIRV", value)
    assert spirv_status(_slang_crate()).status == "built"
    monkeypatch.setenv("KHAL_CUDA_ALLOC_TRACE", value)
    assert not hooks.alloc_trace_on()
    assert not abi.env_flag(value)


@pytest.mark.parametrize("value", ON)
def test_on_values_turn_the_switch_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("KHAL_NO_CACHE", value)
    assert default_cache_dir() is None
    monkeypatch.setenv("KHAL_SKIP_SPIRV", value)
    assert spirv_status(_slang_crate()).status == "skipped"
    monkeypatch.setenv("KHAL_CUDA_ALLOC_TRACE", value)
    assert hooks.alloc_trace_on()
    assert abi.env_flag(value)


def test_the_runtime_and_the_build_share_the_reader() -> None:
    assert hooks.FALSE_VALUES is abi.FALSE_VALUES
    assert abi.env_flag(None) is False


def _slang_crate():  # type: ignore[no-untyped-def]
    _, (crate,) = parse_config({"crates": [{"name": "demo", "sources": ["k/*.slang"]}]}, default_package="pkg")
    return crate
