"""Issue #29 item 4 and issue #25 on WebGPU: a buffer bound read-only and read-write in one
dispatch is refused at that launch, naming both parameters, and never costs another launch its
work; the launch geometry is read by the CUDA path's one ``dim3``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from khal_runtime.errors import ArgumentError
from tests.runtime.webgpu import _kernels as K

pytestmark = pytest.mark.webgpu

_plans: dict[str, Any] = {}


def plan(name: str, wdev: Any) -> Any:
    from khal_runtime.backends.webgpu.kernel import KernelPlan

    p = _plans.get(name)
    if p is None:
        e, src = getattr(K, name)()
        p = _plans[name] = KernelPlan(e, wdev, src.encode(), "tests")
    return p


def arr(a: Any, wdev: Any) -> Any:
    from khal_runtime.backends.webgpu.arrays import WgpuArray

    return WgpuArray.from_numpy(np.asarray(a), device=wdev)


# -- issue #25: one dim3 ----------------------------------------------------------------------------
@pytest.mark.parametrize("grid", [True, False, (2, True)])
def test_a_bool_grid_is_refused_as_on_cuda(wdev: Any, stream: Any, grid: Any) -> None:
    from khal_runtime import arguments

    k = plan("saxpy", wdev)
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    with pytest.raises(ArgumentError, match=r"grid: expected an integer or up to 3 integers"):
        arguments.dim3(grid)  # the CUDA path's rule
    with pytest.raises(ArgumentError, match=r"grid: expected an integer or up to 3 integers"):
        k.launch(grid, None, (y, x, 1.0, 64))
    with pytest.raises(ArgumentError, match=r"grid: expected an integer or up to 3 integers"):
        k.bind((y, x, 1.0, 64)).launch(grid)
    stream.flush()
    assert not y.to_numpy().any()


def test_webgpu_has_no_dim3_of_its_own() -> None:
    from khal_runtime import arguments
    from khal_runtime.backends.webgpu import kernel

    assert kernel.dim3 is arguments.dim3


# -- item 4: one buffer bound read-only and read-write in one dispatch ---------------------------------
def _views(wdev: Any, kind: str) -> tuple[Any, Any, Any]:
    """(the allocation, y's view, x's view) of one allocation: the same view, overlapping slices or
    disjoint ones (WebGPU tracks a buffer's usage as a whole: all three are refused)."""
    step = wdev.storage_align // 4
    a = arr(np.ones(4 * step, np.float32), wdev)
    return a, *{"same": (a, a), "overlapping": (a[0:2 * step], a[step:3 * step]),
                "disjoint": (a[0:step], a[step:2 * step])}[kind]


@pytest.mark.parametrize("kind", ["same", "overlapping", "disjoint"])
def test_read_only_and_read_write_use_of_one_buffer_is_refused_at_that_launch(wdev: Any, stream: Any,
                                                                              kind: str) -> None:
    from khal_runtime.errors import ArgumentValueError

    k = plan("saxpy", wdev)
    stream.batch = 1000
    x, out = arr(np.arange(64, dtype=np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    k.call(64, (out, x, 2.0, 64))  # an earlier valid launch, still recorded, not submitted
    _, y, xv = _views(wdev, kind)
    msg = (r"tests.saxpy\(\): argument 'x' \(read-only storage\) and argument 'y' \(read-write storage\) are the "
           r"same WebGPU buffer")
    with pytest.raises(ArgumentValueError, match=msg):
        k.call(64, (y, xv, 1.0, 64))
    with pytest.raises(ArgumentValueError, match=msg):
        k.launch(1, None, (y, xv, 1.0, 64))
    with pytest.raises(ArgumentValueError, match=msg):
        k.bind((y, xv, 1.0, 64))
    with pytest.raises(ArgumentValueError, match=msg):
        k.check_args((y, xv, 1.0, 64))
    count = arr(np.array([1], np.uint32), wdev)
    with pytest.raises(ArgumentValueError, match=msg):
        k.dispatch_indirect(count, (y, xv, 1.0, 64))
    # the earlier launch's work is not lost: no invalid dispatch reached the batch
    np.testing.assert_array_equal(out.to_numpy(), 2 * np.arange(64, dtype=np.float32))


def test_two_read_write_or_two_read_only_bindings_of_one_buffer_are_fine(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.kernel import KernelPlan
    from khal_runtime.manifest import Binding

    e = K.entry("add3", 64, (K.storage("a", writable=True), K.storage("b", writable=True), K.storage("c"),
                             K.storage("d")),
                (Binding(param="a", group=0, binding=0, access="read_write"),
                 Binding(param="b", group=0, binding=1, access="read_write"),
                 Binding(param="c", group=0, binding=2, access="read"),
                 Binding(param="d", group=0, binding=3, access="read")))
    src = f"""
@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read> c: array<f32>;
@group(0) @binding(3) var<storage, read> d: array<f32>;
@compute @workgroup_size(64) fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    if (g.x < arrayLength(&a)) {{ a[g.x] = c[g.x] + d[g.x]; b[g.x] = b[g.x] + 1.0; }}
}}"""
    k = KernelPlan(e, wdev, src, "tests")
    step = wdev.storage_align // 4
    w = arr(np.zeros(2 * step, np.float32), wdev)
    r = arr(np.arange(step, dtype=np.float32), wdev)
    k.call(step, (w[0:step], w[step:2 * step], r, r))
    got = w.to_numpy()
    np.testing.assert_array_equal(got[:step], 2 * np.arange(step, dtype=np.float32))
    np.testing.assert_array_equal(got[step:], np.ones(step, np.float32))


def test_the_conflict_is_seen_across_bind_groups(wdev: Any, stream: Any) -> None:
    from khal_runtime.backends.webgpu.kernel import KernelPlan
    from khal_runtime.errors import ArgumentValueError
    from khal_runtime.manifest import Binding

    e = K.entry("two_groups_rw", 64, (K.storage("y", writable=True), K.storage("x")),
                (Binding(param="y", group=0, binding=0, access="read_write"),
                 Binding(param="x", group=1, binding=0, access="read")))
    src = f"""
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<storage, read> x: array<f32>;
@compute @workgroup_size(64) fn {e.symbol}(@builtin(global_invocation_id) g: vec3<u32>) {{
    if (g.x < arrayLength(&y)) {{ y[g.x] = y[g.x] + x[g.x]; }}
}}"""
    k = KernelPlan(e, wdev, src, "tests")
    x, y = arr(np.ones(64, np.float32), wdev), arr(np.zeros(64, np.float32), wdev)
    k.call(64, (y, x))
    _, yv, xv = _views(wdev, "disjoint")
    with pytest.raises(ArgumentValueError, match=r"tests.two_groups_rw\(\): argument 'x' .*argument 'y'"):
        k.call(64, (yv, xv))
    np.testing.assert_array_equal(y.to_numpy(), np.ones(64, np.float32))
