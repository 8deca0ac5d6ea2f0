"""Slang-made WGSL and SPIR-V (fixtures/, made by fixtures/make_fixtures.py from kernels.slang)
through the backend, with the targets a Slang build describes: the WGSL scalar block at binding
0 (std140), the SPIR-V scalars in push constants, ``ConstantBuffer<Params>`` in std140."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from khal_runtime.manifest import Binding, Entry, Param, ScalarSlot, WebGpuTarget
from tests.runtime.webgpu import _kernels as K
from tests.runtime.webgpu.fixtures.make_fixtures import symbol

pytestmark = pytest.mark.webgpu
FIX = Path(__file__).resolve().parent / "fixtures"


def _saxpy(target: str) -> Entry:
    sym = symbol("saxpy")
    slots = (ScalarSlot(param="a", offset=0, size=4), ScalarSlot(param="n", offset=4, size=4))
    if target == "wgsl":
        t = WebGpuTarget(target="wgsl", path="f/saxpy.wgsl", entry_point=sym, bindings=(
            Binding(param=None, group=0, binding=0, access="uniform"),
            Binding(param="y", group=0, binding=1, access="read_write"),
            Binding(param="x", group=0, binding=2, access="read")),
            scalars="uniform", scalar_block_size=16, scalar_slots=slots)
    else:
        t = WebGpuTarget(target="spirv", path="f/saxpy.spv", entry_point=sym, bindings=(
            Binding(param="y", group=0, binding=0, access="read_write"),
            Binding(param="x", group=0, binding=1, access="read")),
            scalars="push_constants", scalar_block_size=8, scalar_slots=slots)
    return Entry(name="saxpy", symbol=sym, hash=sym[-16:], block_size=(64, 1, 1),
                 params=(K.storage("y", writable=True), K.storage("x"), K.scalar("a", "float32"),
                         K.scalar("n", "uint32")), webgpu=(t,))


def _read_params(target: str) -> Entry:
    sym = symbol("read_params")
    p = Param(name="p", kind="uniform", element_type="Params", element_size=64, element_align=16,
              layouts={"cuda": K.CUDA_PARAMS, "wgsl": K.WGSL_PARAMS, "spirv": K.WGSL_PARAMS})
    t = WebGpuTarget(target=target, path=f"f/read_params.{'wgsl' if target == 'wgsl' else 'spv'}",
                     entry_point=sym, bindings=(Binding(param="out", group=0, binding=0, access="read_write"),
                                                Binding(param="p", group=0, binding=1, access="uniform")))
    return Entry(name="read_params", symbol=sym, hash=sym[-16:], block_size=(1, 1, 1),
                 params=(K.storage("out", writable=True), p), webgpu=(t,))


def _plan(entry: Entry, target: str, wdev: Any) -> Any:
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    ext = "wgsl" if target == "wgsl" else "spv"
    return KernelPlan(entry, wdev, (FIX / f"{entry.name}.{ext}").read_bytes(), f"slang_{target}",
                      target=entry.target(target))


@pytest.mark.parametrize("target", ["wgsl", "spirv"])
def test_slang_saxpy(wdev: Any, stream: Any, target: str) -> None:
    from khal_runtime.backends.webgpu.arrays import WgpuArray

    if target == "spirv" and not wdev.has_immediates:
        pytest.skip(f"{wdev.describe()} has no 'immediates' feature (SPIR-V push constants)")
    k = _plan(_saxpy(target), target, wdev)
    x = WgpuArray.from_numpy(np.arange(1000, dtype=np.float32), device=wdev)
    y = WgpuArray.from_numpy(np.ones(1000, np.float32), device=wdev)
    for a in (2.0, 0.5, -1.0):  # three scalar blocks in one batch
        k.call(1000, (y, x, a, 900))
    want = np.ones(1000, np.float32)
    want[:900] += 1.5 * np.arange(900, dtype=np.float32)
    np.testing.assert_array_equal(y.to_numpy(), want)


@pytest.mark.parametrize("target", ["wgsl", "spirv"])
def test_slang_constant_buffer_struct(wdev: Any, stream: Any, target: str) -> None:
    from khal_runtime.backends.webgpu.arrays import WgpuArray
    from tests.runtime.webgpu.test_packing import VALUES, _ctypes_value

    k = _plan(_read_params(target), target, wdev)
    want = np.array([1.5, -7, 1, 2, 3, 4, 5, 6, 7, 42, 8, 9], np.float32)
    for value in (_ctypes_value(), VALUES):
        out = WgpuArray.zeros(12, device=wdev)
        k.call(1, (out, value))
        np.testing.assert_array_equal(out.to_numpy(), want)


def test_fixtures_are_what_the_source_makes() -> None:
    """The committed artifacts name the entry as a build would (``<entry>_khal_<hash>``)."""
    assert symbol("saxpy").encode() in (FIX / "saxpy.spv").read_bytes()
    text = (FIX / "saxpy.wgsl").read_text()
    assert f"fn {symbol('saxpy')}(" in text and "@binding(0) @group(0) var<uniform>" in text
