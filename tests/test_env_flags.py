"""One reader of boolean KHAL_* variables for the build and the runtime (#29 item 14): "0", "false",
"no", "off" (any case) and empty mean off everywhere; "1", "true", "yes", "on" mean on; any other value
is an EnvVarError naming the variable and the accepted spellings (#38 item 12: ``KHAL_SKIP_SPIRV=flase``
turned the switch on). Every variable's bad value, boolean or not, is that one class (#38 item 17)."""

from __future__ import annotations

import pytest

from hatch_khal.cache import default_cache_dir
from hatch_khal.config import parse_config
from hatch_khal.slang.language import spirv_status
from khal_runtime import abi
from khal_runtime import launch_hooks as hooks
from khal_runtime.errors import BackendUnavailableError, EnvVarError, KhalError

OFF = ["", "0", "false", "FALSE", " no ", "off", "Off"]
ON = ["1", "true", "yes", "on", " ON "]


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


# -- unknown values: EnvVarError, one class for every variable (#38 items 12, 17) ------------------------
def _eager() -> bool:
    from khal_runtime.backends.cuda import driver

    return driver._wanted()


def _indirect_sync() -> bool:
    from khal_runtime.backends.cuda import indirect

    return indirect._env_true("KHAL_CUDA_INDIRECT_SYNC")


def _trace() -> object:
    from khal_runtime import tracing

    return tracing.parse_env()


def _any_minor() -> object:
    from hatch_khal.nvrtc import ANY_MINOR_ENV, ptx_problem, requirement

    with requirement("nvidia-cuda-nvrtc~=13.0.0"):
        return ptx_problem()


BOOLEANS = [("KHAL_NO_CACHE", default_cache_dir), ("KHAL_SKIP_SPIRV", lambda: spirv_status(_slang_crate())),
            ("KHAL_CUDA_ALLOC_TRACE", hooks.alloc_trace_on), ("KHAL_EAGER_INIT", _eager),
            ("KHAL_CUDA_INDIRECT_SYNC", _indirect_sync), ("KHAL_TRACE", _trace), ("KHAL_PROFILE", _trace),
            ("KHAL_CUDA_NVTX", _trace), ("KHAL_NVRTC_ANY_MINOR", _any_minor)]


@pytest.mark.parametrize("value", ["flase", "2", "enable", "y"])
@pytest.mark.parametrize("name, read", BOOLEANS, ids=[n for n, _ in BOOLEANS])
def test_an_unknown_value_of_a_boolean_variable_is_an_error_naming_the_spellings(
        monkeypatch: pytest.MonkeyPatch, name: str, read: object, value: str) -> None:
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(EnvVarError) as exc:
        read()  # type: ignore[operator]
    msg = str(exc.value)
    assert msg.startswith(f"{name}={value!r} is not understood: use 1/"), msg
    assert "true/yes/on (on) or 0/false/no/off (off" in msg, msg
    assert (exc.value.variable, exc.value.value) == (name, value)


def test_khal_trace_takes_sync_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KHAL_TRACE", "sync")
    assert _trace().sync  # type: ignore[attr-defined]
    monkeypatch.setenv("KHAL_TRACE", "synk")
    with pytest.raises(EnvVarError, match=r"KHAL_TRACE='synk' is not understood: use 1/sync/true/yes/on"):
        _trace()


def _batch() -> object:
    from khal_runtime.backends.webgpu.stream import _batch_size

    return _batch_size()


def _shader() -> object:
    from khal_runtime.backends.webgpu.pipeline import select_target

    return select_target(None)  # type: ignore[arg-type]  # the variable is read first


def _blocks_per_sm() -> object:
    from types import SimpleNamespace

    from khal_runtime.backends.cuda import indirect

    plan = type("Plan", (), {"device_id": 0})()  # hashable: the grid is remembered per plan
    return indirect.persistent_grid(SimpleNamespace(block_size=(64, 1, 1)), plan)  # type: ignore[arg-type]


def _backend() -> object:
    from khal_runtime import backends

    return backends.backend_mode()


OTHERS = [("KHAL_BACKEND", "vulkan", _backend, "use one of auto, cuda, webgpu"),
          ("KHAL_WEBGPU_BATCH", "0", _batch, "expected an integer >= 1"),
          ("KHAL_WEBGPU_SHADER", "glsl", _shader, "expected wgsl (the default) or spirv"),
          ("KHAL_CUDA_INDIRECT_BLOCKS_PER_SM", "zero", _blocks_per_sm, "expected an integer >= 1")]


@pytest.mark.parametrize("name, value, read, says", OTHERS, ids=[o[0] for o in OTHERS])
def test_every_bad_variable_value_is_one_class(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                               read: object, says: str) -> None:
    """They were ValueError, KhalError, BackendUnavailableError, ArgumentValueError: now EnvVarError,
    still a ValueError (and a KhalError), so handlers of the ValueError ones keep working."""
    if name == "KHAL_CUDA_INDIRECT_BLOCKS_PER_SM":
        pytest.importorskip("cuda.bindings")
    if name in ("KHAL_WEBGPU_BATCH", "KHAL_WEBGPU_SHADER"):
        pytest.importorskip("wgpu")
    monkeypatch.setenv(name, value)
    with pytest.raises(EnvVarError) as exc:
        read()  # type: ignore[operator]
    assert str(exc.value).startswith(f"{name}={value!r}") and says in str(exc.value), str(exc.value)
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, KhalError)
    assert exc.value.variable == name
    if name == "KHAL_BACKEND":  # what it raised before: handlers written for 0.1.0 keep catching it
        assert isinstance(exc.value, BackendUnavailableError)
