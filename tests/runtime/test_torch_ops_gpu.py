"""The example package's kernels as PyTorch operators on a real GPU (``khal_runtime.torch``):
eager, under ``torch.compile(fullgraph=True)`` and inside ``torch.cuda.graph``, against the typed
call and the NumPy references. Needs a CUDA build of torch; skipped, saying why, without one.

Run on the GPU machine (see the README, "Testing on a GPU"):
``python3 -m pytest -m gpu tests/runtime/test_torch_ops_gpu.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch() -> Any:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} has no CUDA")
    return torch


@pytest.fixture(scope="module")
def kt() -> Any:
    import khal_runtime.torch as kt

    return kt


@pytest.fixture(scope="module")
def ops(torch: Any, kt: Any, example_pkg: Any) -> Any:
    return kt.register(example_pkg.kernels)


@pytest.fixture(scope="module")
def ns(torch: Any, ops: Any) -> Any:
    return getattr(torch.ops, ops.namespace)


def _floats(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + n)
    return rng.standard_normal(n).astype(np.float32) * np.float32(3)


def _cuda(torch: Any, a: np.ndarray) -> Any:
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def test_registered_under_the_package_name(torch: Any, ops: Any, ns: Any, example_pkg: Any, kt: Any) -> None:
    assert ops.namespace == "example_shader_pkg"
    assert ops.saxpy is torch.ops.example_shader_pkg.saxpy and ops.gelu is ns.gelu
    assert kt.register(example_pkg.kernels) is ops


@pytest.mark.parametrize("n", [1, 257, 4099, (1 << 20) + 3])
def test_eager_ops_match_the_typed_call_and_the_reference(torch: Any, ops: Any, kt: Any, example_pkg: Any,
                                                         n: int) -> None:
    K, R = example_pkg.kernels, example_pkg.reference
    x0, y0 = _floats(n, 1), _floats(n, 2)
    threads = example_pkg.elementwise_threads(n)
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=-0.5))
    x, y = _cuda(torch, x0), _cuda(torch, y0)
    xt, yt = x.clone(), y.clone()
    z, zt = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    ops.saxpy(threads, x, y, p)  # on torch's current stream: no synchronisation needed around it
    ops.gelu(threads, y, z)
    st = torch.cuda.current_stream()
    K.saxpy(threads, xt, yt, example_pkg.SaxpyParams(a=-0.5), stream=st)
    K.gelu(threads, yt, zt, stream=st)
    assert torch.equal(y, yt) and torch.equal(z, zt)  # the same kernels, bit for bit
    expected_y = R.saxpy(x0, y0, -0.5)
    np.testing.assert_allclose(y.cpu().numpy(), expected_y, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(z.cpu().numpy(), R.gelu(y.cpu().numpy()), rtol=1e-5, atol=1e-6)
    assert torch.equal(x, _cuda(torch, x0))  # read-only storage untouched


def _warm_and_capture(torch: Any, fn: Any, *args: Any) -> tuple[Any, Any]:
    """Warm ``fn`` up on a side stream, as ``torch.cuda.graph`` asks (loads the kernels,
    compiles), then capture one call: (the graph, what the captured call returned)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*args)
    return g, out


def _make_step(ns: Any) -> Any:
    def step(threads: int, x: Any, y: Any, p: Any, z: Any) -> Any:
        ns.saxpy(threads, x, y, p)  # y = a x + y
        ns.gelu(threads, y, z)      # z = gelu(y)
        return z * 2.0 + 1.0        # a torch op reading what the kernels wrote

    return step


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compiled_fullgraph_matches_eager(torch: Any, ops: Any, ns: Any, kt: Any, example_pkg: Any,
                                          backend: str) -> None:
    n = 100_003
    threads = example_pkg.elementwise_threads(n)
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=1.5))
    x, y0 = _cuda(torch, _floats(n, 3)), _cuda(torch, _floats(n, 4))
    step = _make_step(ns)
    y_e, z_e = y0.clone(), torch.zeros_like(y0)
    out_e = step(threads, x, y_e, p, z_e)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    y_c, z_c = y0.clone(), torch.zeros_like(y0)
    out_c = compiled(threads, x, y_c, p, z_c)
    torch.cuda.synchronize()
    assert torch.equal(y_c, y_e) and torch.equal(z_c, z_e)  # mutations reach the caller's tensors
    torch.testing.assert_close(out_c, out_e, rtol=0, atol=0)
    # again with other values: the compiled graph reads its inputs, nothing was baked in
    kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=-2.0), out=p)
    y_e2, z_e2, y_c2, z_c2 = y0.clone(), torch.zeros_like(y0), y0.clone(), torch.zeros_like(y0)
    torch.testing.assert_close(compiled(threads, x, y_c2, p, z_c2), step(threads, x, y_e2, p, z_e2),
                               rtol=0, atol=0)
    assert torch.equal(y_c2, y_e2)
    np.testing.assert_allclose(y_c2.cpu().numpy(), example_pkg.reference.saxpy(x.cpu().numpy(), y0.cpu().numpy(), -2.0),
                               rtol=1e-6, atol=1e-6)


def test_compiled_with_dynamic_sizes(torch: Any, ns: Any, ops: Any, kt: Any, example_pkg: Any) -> None:
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=0.25))

    def step(x: Any, y: Any) -> None:
        ns.saxpy(x.numel(), x, y, p)  # a SymInt thread count

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for n in (1000, 4099, 70_001):
        x0, y0 = _floats(n, 5), _floats(n, 6)
        x, y = _cuda(torch, x0), _cuda(torch, y0)
        compiled(x, y)
        np.testing.assert_allclose(y.cpu().numpy(), example_pkg.reference.saxpy(x0, y0, 0.25), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True])
def test_cuda_graph_replays_see_inputs_changed_in_place(torch: Any, ops: Any, ns: Any, kt: Any, example_pkg: Any,
                                                        compiled: bool) -> None:
    R = example_pkg.reference
    n = 65_537
    threads = example_pkg.elementwise_threads(n)
    x, y = _cuda(torch, _floats(n, 7)), _cuda(torch, _floats(n, 8))
    z = torch.zeros_like(y)
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=1.0))
    step = _make_step(ns)
    fn = step
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(step, fullgraph=True)
    g, out = _warm_and_capture(torch, fn, threads, x, y, p, z)
    for round_, a in enumerate((0.5, -3.0, 2.0)):
        x0, y0 = _floats(n, 10 + round_), _floats(n, 20 + round_)
        x.copy_(torch.from_numpy(x0))
        y.copy_(torch.from_numpy(y0))
        kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=a), out=p)  # the uniform's bytes, in place
        g.replay()
        torch.cuda.synchronize()
        want_y = R.saxpy(x0, y0, a)
        np.testing.assert_allclose(y.cpu().numpy(), want_y, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(z.cpu().numpy(), R.gelu(y.cpu().numpy()), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out, z * 2.0 + 1.0, rtol=0, atol=0)
    # the same launches, eager, give the same bits as the replay
    y2, z2 = _cuda(torch, _floats(n, 22)), torch.zeros_like(z)
    step(threads, x, y2, p, z2)
    assert torch.equal(y2, y) and torch.equal(z2, z)


def test_struct_storage_as_a_float_tensor(torch: Any, ops: Any, kt: Any, example_pkg: Any) -> None:
    """``integrate`` takes a storage of 32-byte Particle structs: a (n, 8) float32 tensor's bytes."""
    R = example_pkg.reference
    n = 10_007
    particles = R.make_particles(n, seed=3)
    params = example_pkg.SimParams(dt=1e-3, gravity=-9.81, restitution=0.5, n=n)
    t = _cuda(torch, particles.view(np.float32).reshape(n, 8))
    ops.integrate(n, t, kt.uniform(ops.integrate, params))
    got = t.cpu().numpy().reshape(-1).view(example_pkg.PARTICLE_DTYPE)
    assert got.tobytes() == R.integrate(particles, params).tobytes()


def test_ops_launch_on_torchs_current_stream(torch: Any, ops: Any, kt: Any, example_pkg: Any) -> None:
    """Work queued before the op on a side stream is seen by it without any synchronisation."""
    n = 1 << 20
    threads = example_pkg.elementwise_threads(n)
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=2.0))
    x, y = torch.zeros(n, device="cuda"), torch.ones(n, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # keep the stream busy: x is written late
        x.fill_(3.0)
        ops.saxpy(threads, x, y, p)
    s.synchronize()
    assert float(y.min()) == float(y.max()) == 7.0
    dev = torch.cuda.current_device()
    assert (dev, s.cuda_stream) in kt._streams


def test_first_use_inside_a_capture_is_a_clear_error(torch: Any, kt: Any, example_pkg: Any) -> None:
    """A kernel's module cannot be loaded inside torch's (global mode) capture: refused before
    any driver call, so the capture is not invalidated; after a warm-up the same capture works."""
    import khal_runtime
    from khal_runtime.errors import CaptureError

    fresh = khal_runtime.load(Path(example_pkg.__file__).parent)  # nothing of it loaded yet
    ops = kt.register(fresh, namespace="khal_test_first_use")
    n = 4096
    x, y = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=1.0))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match=r"used for the first time on cuda:\d inside a graph capture"):
        with torch.cuda.graph(g):
            ops.saxpy(n, x, y, p)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ops.saxpy(n, x, y, p)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.saxpy(n, x, y, p)
    g.replay()
    torch.cuda.synchronize()
    assert float(y[0]) == 3.0  # 1 (start) + 1 (warm-up) + 1 (replay)


def _slang_ops(ops: Any, example_pkg: Any) -> tuple[Any, Any]:
    """The operators of the example's Slang ``saxpy_shared`` and ``affine`` (a crate of
    example_shader_pkg/pyproject.toml, kernels/slang/)."""
    entries = {e.name: c.name for c in example_pkg.kernels.manifest.crates if c.language == "slang"
               for e in c.entries}
    assert {"saxpy_shared", "affine"} <= set(entries), f"the example's Slang entries: {sorted(entries)}"
    return ops.crates[entries["saxpy_shared"]].saxpy_shared, ops.crates[entries["affine"]].affine


def _affine_fields(round_: int) -> dict[str, Any]:
    """Field values of the Slang ``struct Affine`` (a vector, an array, mixed scalars), per round."""
    return {"scale": [1.5, -2.0, 0.25, 3.0 + round_], "shift": [0.5, -0.25, 0.125 * (round_ + 1)],
            "bias": 0.75 - round_, "step": 3 + round_, "mask": 0x3FF >> round_, "taps": [0.1, -0.2 * (round_ + 1)]}


def _affine_struct(S: Any, fields: dict[str, Any]) -> Any:
    """The same values as the CUDA-layout ctypes struct the reference takes."""
    return S.Affine(tuple(fields["scale"]), tuple(fields["shift"]), fields["bias"], fields["step"], fields["mask"],
                    tuple(fields["taps"]))


def test_slang_entry_through_torch(torch: Any, ops: Any, kt: Any, example_pkg: Any) -> None:
    """Eager and torch.compile(fullgraph=True); a dict uniform packed by the Slang (CUDA) layout."""
    from example_shader_pkg import slang_reference as S

    op, affine = _slang_ops(ops, example_pkg)
    n = 70_001
    x0, y0 = _floats(n, 30), _floats(n, 31)
    x, y = _cuda(torch, x0), _cuda(torch, y0)
    op(n, y, x, 1.75)  # (y, x, a) in the Slang declaration's order
    np.testing.assert_array_equal(y.cpu().numpy(), S.saxpy_shared(x0, y0, 1.75))
    torch._dynamo.reset()
    y2 = _cuda(torch, y0)
    torch.compile(lambda a, b: op(n, a, b, 1.75), fullgraph=True)(y2, x)
    assert torch.equal(y2, y)
    # a dict of fields: the bytes of the CUDA-layout struct, and the kernel sees them
    fields = _affine_fields(0)
    p = kt.uniform(affine, fields)
    assert p.dtype == torch.uint8 and p.is_cuda and p.numel() == 48
    assert bytes(p.cpu().numpy()) == bytes(_affine_struct(S, fields))
    ay, ak = torch.zeros(n, device="cuda"), torch.zeros(n, dtype=torch.int32, device="cuda")
    affine(n, x, ay, ak, p, 1.25, -40, n - 5)
    want_y, want_k = S.affine(x0, _affine_struct(S, fields), 1.25, -40, n - 5)
    np.testing.assert_array_equal(ay.cpu().numpy(), want_y)
    np.testing.assert_array_equal(ak.cpu().numpy(), want_k)
    torch._dynamo.reset()
    cy, ck = torch.zeros_like(ay), torch.zeros_like(ak)
    torch.compile(lambda a, b, c, q: affine(n, a, b, c, q, 1.25, -40, n - 5), fullgraph=True)(x, cy, ck, p)
    assert torch.equal(cy, ay) and torch.equal(ck, ak)


@pytest.mark.parametrize("compiled", [False, True])
def test_slang_entries_in_a_cuda_graph(torch: Any, ops: Any, kt: Any, example_pkg: Any, compiled: bool) -> None:
    """Two Slang ops (the second reads what the first wrote) captured in torch.cuda.graph; between
    replays the inputs and the dict-packed uniform change in place."""
    from example_shader_pkg import slang_reference as S

    saxpy, affine = _slang_ops(ops, example_pkg)
    n, count = 65_537, 65_530

    def step(x: Any, y: Any, ay: Any, ak: Any, p: Any) -> Any:
        saxpy(n, y, x, -0.5)                          # y = -0.5 x + y
        affine(n, y, ay, ak, p, 1.25, -40, count)     # ay, ak from the new y
        return ay * 2.0                               # a torch op reading what the kernel wrote

    fn = step
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(step, fullgraph=True)
    x, y = _cuda(torch, _floats(n, 40)), _cuda(torch, _floats(n, 41))
    ay, ak = torch.zeros(n, device="cuda"), torch.zeros(n, dtype=torch.int32, device="cuda")
    p = kt.uniform(affine, _affine_fields(0))
    g, out = _warm_and_capture(torch, fn, x, y, ay, ak, p)
    for round_ in range(1, 4):
        x0, y0 = _floats(n, 40 + 2 * round_), _floats(n, 41 + 2 * round_)
        x.copy_(torch.from_numpy(x0))
        y.copy_(torch.from_numpy(y0))
        ay.zero_()
        ak.zero_()
        fields = _affine_fields(round_)
        kt.uniform(affine, fields, out=p)  # the uniform's bytes, in place
        g.replay()
        torch.cuda.synchronize()
        want = S.saxpy_shared(x0, y0, -0.5)
        np.testing.assert_array_equal(y.cpu().numpy(), want)
        want_y, want_k = S.affine(want, _affine_struct(S, fields), 1.25, -40, count)
        np.testing.assert_array_equal(ay.cpu().numpy(), want_y)
        np.testing.assert_array_equal(ak.cpu().numpy(), want_k)
        torch.testing.assert_close(out, ay * 2.0, rtol=0, atol=0)


def test_repeated_calls_reuse_a_bound_launch_that_follows_changes(torch: Any, ops: Any, kt: Any,
                                                                  example_pkg: Any) -> None:
    """The CUDA kernel binds an argument set it sees twice on a stream and reuses it: new values
    written in place, a tensor given other memory (``.data =``), a resize and another stream
    each give the right result, and each call bumps the written tensor's version."""
    R = example_pkg.reference
    n = 4099
    threads = example_pkg.elementwise_threads(n)
    spec = ops._specs["saxpy"]
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=2.0))
    x0, y0 = _floats(n, 31), _floats(n, 32)
    x, y = _cuda(torch, x0), _cuda(torch, y0)
    want = y0
    for _ in range(3):
        v = y._version
        ops.saxpy(threads, x, y, p)
        assert y._version > v
        want = R.saxpy(x0, want, 2.0)
    assert any(b.args[1] is y for b in spec.fast)  # bound, and reused on the third call
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    x0 = _floats(n, 33)
    x.copy_(torch.from_numpy(x0))  # new values in place
    y.data = _cuda(torch, _floats(n, 34))  # other memory, same object
    want = R.saxpy(x0, _floats(n, 34), 2.0)
    ops.saxpy(threads, x, y, p)
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    y.resize_(n // 2)  # fewer elements, same memory: the launch must not write past them
    ops.saxpy(threads, x, y, p)
    ops.saxpy(threads, x, y, p)
    np.testing.assert_allclose(y.cpu().numpy(), R.saxpy(x0, R.saxpy(x0, want, 2.0), 2.0)[: n // 2], rtol=1e-5,
                               atol=1e-5)
    whole = torch.empty(0, device="cuda").set_(y.untyped_storage(), 0, (n,))
    np.testing.assert_array_equal(whole[n // 2:].cpu().numpy(), want[n // 2:])
    s = torch.cuda.Stream()
    y2 = torch.ones(n, device="cuda")
    for _ in range(2):  # bind on the default stream
        ops.saxpy(threads, x, y2, p)
    torch.cuda.synchronize()
    y2.fill_(1.0)
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # keep the side stream busy: x is written late
        x.fill_(3.0)
        ops.saxpy(threads, x, y2, p)  # must launch on the side stream, after the fill
    s.synchronize()
    assert float(y2.min()) == float(y2.max()) == 7.0


def test_sets_in_turn_and_a_new_tensor_each_call_give_the_reference(torch: Any, ops: Any, kt: Any,
                                                                    example_pkg: Any) -> None:
    """Four argument sets in turn writing one tensor (each bound; each accepts the version the
    previous set's launch left), a resize of that tensor between rounds, and a new input tensor
    every call (never bound, never stored by the typed call's memo): every launch computes the
    reference."""
    R = example_pkg.reference
    n = 4099
    threads = example_pkg.elementwise_threads(n)
    spec = ops._specs["saxpy"]
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=2.0))
    xs0 = [_floats(n, 40 + k) for k in range(4)]
    xs = [_cuda(torch, a) for a in xs0]
    want = _floats(n, 50)
    y = _cuda(torch, want)
    for _ in range(3):
        for x, x0 in zip(xs, xs0):
            ops.saxpy(threads, x, y, p)
            want = R.saxpy(x0, want, 2.0)
    assert sum(b.args[1] is y for b in spec.fast) == 4  # all four bound
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-4, atol=1e-4)
    y.resize_(n // 2)  # fewer elements: no set may launch on the old count
    want = want[: n // 2]
    for x, x0 in zip(xs, xs0):
        ops.saxpy(threads, x, y, p)
        want = R.saxpy(x0[: n // 2], want, 2.0)
    np.testing.assert_allclose(y.cpu().numpy(), want, rtol=1e-4, atol=1e-4)
    y2 = torch.zeros(n, device="cuda")
    for k in range(6):
        x = torch.full((n,), float(k + 1), device="cuda")  # a new tensor each call
        ops.saxpy(threads, x, y2, p)
    assert float(y2.min()) == float(y2.max()) == 2.0 * sum(range(1, 7))


def test_a_write_to_a_tensor_saved_for_backward_is_caught(torch: Any, ops: Any, kt: Any, example_pkg: Any) -> None:
    """The op bumps the version of what it writes, as PyTorch's in-place operators do: autograd
    refuses a backward through a tensor the kernel changed after it was saved."""
    n = 1024
    threads = example_pkg.elementwise_threads(n)
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=2.0))
    w = torch.ones(n, device="cuda", requires_grad=True)
    x, y = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
    loss = (w * y).sum()  # saves y
    ops.saxpy(threads, x, y, p)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_inductor_calls_the_ops_in_place_without_copies(torch: Any, ops: Any, ns: Any, kt: Any,
                                                       example_pkg: Any) -> None:
    """The compiled step's code calls the operators through the dispatcher on the caller's
    tensors (functionalized, then re-inplaced by Inductor) and copies nothing back."""
    from torch._inductor.utils import run_and_get_code

    n = 4099
    threads = example_pkg.elementwise_threads(n)
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=1.5))
    x, y0 = _cuda(torch, _floats(n, 41)), _cuda(torch, _floats(n, 42))
    step = _make_step(ns)
    y_e, z_e = y0.clone(), torch.zeros_like(y0)
    out_e = step(threads, x, y_e, p, z_e)
    torch._dynamo.reset()
    y_c, z_c = y0.clone(), torch.zeros_like(y0)
    out_c, codes = run_and_get_code(torch.compile(step, fullgraph=True), threads, x, y_c, p, z_c)
    torch.cuda.synchronize()
    assert torch.equal(y_c, y_e) and torch.equal(z_c, z_e)
    torch.testing.assert_close(out_c, out_e, rtol=0, atol=0)
    code = "\n".join(codes)
    assert "torch.ops.example_shader_pkg.saxpy.default(" in code and "torch.ops.example_shader_pkg.gelu.default(" in code
    assert "copy_(" not in code and "clone(" not in code, code


def test_a_capture_that_binds_replays_every_launch(torch: Any, ops: Any, kt: Any, example_pkg: Any) -> None:
    """Three calls with one argument set inside ``torch.cuda.graph``: the second binds (during
    the capture), the third reuses the bound launch; the replay runs all three."""
    n = 4096
    threads = example_pkg.elementwise_threads(n)
    p = kt.uniform(ops.saxpy, example_pkg.SaxpyParams(a=1.0))
    x, y = torch.ones(n, device="cuda"), torch.zeros(n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ops.saxpy(threads, x, y, p)  # warm-up: loads the crate
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(3):
            ops.saxpy(threads, x, y, p)
    torch.cuda.synchronize()
    assert float(y[0]) == 1.0  # captured, not run
    g.replay()
    torch.cuda.synchronize()
    assert float(y.min()) == float(y.max()) == 4.0


# Triton instance families as operators (the example's Triton crate is built from a lock file, one
# family per variant): tests/runtime/cuda/test_triton_torch_ops_gpu.py, on tests/packages/triton_kernels_pkg.
