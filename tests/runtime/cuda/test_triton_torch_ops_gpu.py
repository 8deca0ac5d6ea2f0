"""Triton instance families as PyTorch operators on a real GPU (``khal_runtime.torch``,
``khal_runtime.torch_triton``): tests/packages/triton_kernels_pkg's hand-written instances of Triton's
tutorial kernels (``add_fp32`` and its ``__base`` twin, ``softmax_1024``, ``matmul_fp16`` and its twin),
each family one operator ``(SymInt[] grid, <runtime arguments>) -> ()``: eager, under
``torch.compile(fullgraph=True)`` and inside ``torch.cuda.graph``, against torch.

(Until #36 these ran on the example package's instances; the example's Triton crate is now built from
its lock file, one family per recorded variant: tests/runtime/cuda/test_example_triton_gpu.py.)
Needs a CUDA build of torch and Triton (the build); skipped, saying why, without them.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from tests.helpers.paths import PACKAGES

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch() -> Any:
    from tests.helpers.gpu import require_gpu

    require_gpu()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} has no CUDA")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs Triton (the test package is built here)")
    return torch


@pytest.fixture(scope="module")
def kt() -> Any:
    import khal_runtime.torch as kt

    return kt


@pytest.fixture(scope="module")
def ops(torch: Any, kt: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    import khal_runtime
    from tests.helpers.build import build_test_package

    work = tmp_path_factory.mktemp("triton-ops")
    _, pkg, _, _ = build_test_package(PACKAGES / "triton_kernels_pkg", work, "khal_triton_kernels",
                                      tmp_path_factory.mktemp("cache"))
    return kt.register(khal_runtime.load(pkg))


@pytest.fixture(scope="module")
def ns(torch: Any, ops: Any) -> Any:
    assert ops.namespace == "khal_triton_kernels"
    return getattr(torch.ops, ops.namespace)


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


# ---------------------------------------------------------------------------------------------
# Triton families (crate ``tutorials``): ``(SymInt[] grid, <runtime arguments>) -> ()``
# ---------------------------------------------------------------------------------------------
def _tri_add(ns: Any) -> Any:
    def step(x: Any, y: Any, out: Any) -> Any:
        n = x.numel()
        ns.add_fp32([(n + 1023) // 1024], x, y, out, n)
        return out * 2.0  # a torch op reading what the kernel wrote

    return step


def _tri_softmax(torch: Any, ns: Any) -> Any:
    def step(x: Any, y: Any) -> Any:
        rows, cols = x.shape
        ns.softmax_1024([rows], y, x, x.stride(0), y.stride(0), rows, cols)
        return y + 0.0

    return step


def _tri_matmul(ns: Any) -> Any:
    def step(a: Any, b: Any, c: Any) -> Any:
        m, k = a.shape
        n = b.shape[1]
        ns.matmul_fp16([((m + 63) // 64) * ((n + 63) // 64)], a, b, c, m, n, k, a.stride(0), a.stride(1),
                       b.stride(0), b.stride(1), c.stride(0), c.stride(1))
        return c.float()

    return step


def test_triton_ops_schema_and_eager_match_torch(torch: Any, ops: Any, ns: Any) -> None:
    """add / softmax / matmul as operators, eager, on torch's current stream, against torch; the
    misaligned and non-divisible calls take the conservative twin (the family chooses)."""
    if _proved(ops, "add_fp32"):  # x and y only read (TritonFacts.written): plain tensors, never bumped
        assert ops.schema("add_fp32") == ("khal_triton_kernels::add_fp32(SymInt[] grid, Tensor x_ptr, "
                                          "Tensor y_ptr, Tensor(a2!) output_ptr, SymInt n_elements) -> ()")
    else:  # a wheel built before the analysis: every pointer declared written
        assert ops.schema("add_fp32") == ("khal_triton_kernels::add_fp32(SymInt[] grid, Tensor(a0!) x_ptr, "
                                          "Tensor(a1!) y_ptr, Tensor(a2!) output_ptr, SymInt n_elements) -> ()")
    for n, offset in ((98432, 0), (98433, 0), (98432, 1)):
        x = torch.rand(n + offset, device="cuda")[offset:]
        y = torch.rand(n, device="cuda")
        out = torch.full((n,), float("nan"), device="cuda")
        v, vx = out._version, x._version
        _tri_add(ns)(x, y, out)
        assert out._version == v + 1 and torch.equal(out, x + y), (n, offset)
        assert x._version == vx + (0 if _proved(ops, "add_fp32") else 1)
    for rows, cols in ((4096, 1024), (1823, 781)):
        x = torch.randn(rows, cols, device="cuda")
        y = torch.full_like(x, float("nan"))
        got = _tri_softmax(torch, ns)(x, y)
        assert torch.allclose(got, torch.softmax(x, dim=1), atol=1e-6, rtol=1e-5), (rows, cols)
    for m, n, k in ((512, 512, 512), (333, 200, 96)):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        got = _tri_matmul(ns)(a, b, c)
        assert torch.allclose(got, (a @ b).float(), atol=1e-2, rtol=0), (m, n, k)


def _proved(ops: Any, op: str) -> bool:
    """Whether every variant of the family records the pointers it may write (a wheel built with
    ``TritonFacts.written``)."""
    return all(k.entry.triton.written is not None for k in ops._specs[op].kernel.variants)


def test_triton_ops_read_only_inputs_saved_for_backward_keep_autograd_working(torch: Any, ops: Any, ns: Any) -> None:
    """A tensor exp() saved for its backward, then passed to the add / softmax / matmul operators as
    an input they only read: its version is unchanged and backward runs (with every pointer declared
    written it failed: "modified by an inplace operation")."""
    if not all(_proved(ops, op) for op in ("add_fp32", "softmax_1024", "matmul_fp16")):
        pytest.skip("the package was built before TritonFacts.written")
    a = torch.rand(5000, device="cuda", requires_grad=True)
    x = a.exp()  # exp saves its result for backward
    y, out = torch.rand(5000, device="cuda"), torch.empty(5000, device="cuda")
    v = x._version
    _tri_add(ns)(x, y, out)
    assert x._version == v and torch.equal(out, x.detach() + y)
    x.sum().backward()
    assert torch.allclose(a.grad, a.detach().exp())
    s = torch.randn(64, 1024, device="cuda", requires_grad=True)
    se = s.exp()
    sy = torch.empty(64, 1024, device="cuda")
    _tri_softmax(torch, ns)(se, sy)
    se.sum().backward()
    assert torch.allclose(s.grad, s.detach().exp()) and torch.allclose(sy, torch.softmax(se.detach(), dim=1),
                                                                        atol=1e-6, rtol=1e-5)
    m = torch.randn(128, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    me = m.sigmoid()  # (saves its result for backward too)
    b = torch.randn(64, 128, device="cuda", dtype=torch.float16)
    c = torch.empty(128, 128, device="cuda", dtype=torch.float16)
    _tri_matmul(ns)(me, b, c)
    me.float().sum().backward()
    assert m.grad is not None and torch.allclose(c.float(), (me.detach() @ b).float(), atol=2e-2, rtol=1e-2)


def test_triton_ops_refuse_bad_calls_with_the_familys_errors(torch: Any, ops: Any) -> None:
    from khal_runtime.errors import ArgumentError, ArgumentValueError

    x = torch.rand(1024, device="cuda")
    out = torch.empty_like(x)
    with pytest.raises(ArgumentError, match=r"add_fp32\(\): argument 'y_ptr': a tensor on cpu, not on a CUDA"):
        ops.add_fp32([1], x, torch.rand(1024), out, 1024)
    with pytest.raises(ArgumentError, match=r"argument 'y_ptr' is an array of float16, the kernel was built for "
                                            r"\*fp32"):
        ops.add_fp32([1], x, x.half(), out, 1024)
    with pytest.raises(ArgumentValueError, match="grid: expected 1 to 3 dimensions"):
        ops.add_fp32([], x, x, out, 1024)
    with pytest.raises(ArgumentError, match=r"argument 'x_ptr' \(\*fp32\) is a tensor on cpu; khal kernels run on "
                                            r"CUDA tensors"):
        ops.add_fp32([1], torch.rand(4), torch.rand(4), torch.rand(4), 4)


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_triton_ops_compiled_fullgraph_match_torch(torch: Any, ns: Any, backend: str) -> None:
    torch._dynamo.reset()
    x, y = torch.rand(5000, device="cuda"), torch.rand(5000, device="cuda")
    out = torch.full_like(x, float("nan"))
    got = torch.compile(_tri_add(ns), fullgraph=True, backend=backend)(x, y, out)
    assert torch.equal(out, x + y) and torch.equal(got, (x + y) * 2.0)
    s = torch.randn(300, 700, device="cuda")
    sy = torch.full_like(s, float("nan"))
    got = torch.compile(_tri_softmax(torch, ns), fullgraph=True, backend=backend)(s, sy)
    assert torch.allclose(got, torch.softmax(s, dim=1), atol=1e-6, rtol=1e-5)
    assert torch.allclose(sy, torch.softmax(s, dim=1), atol=1e-6, rtol=1e-5)  # the mutation reached the caller
    a = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    b = torch.randn(128, 192, device="cuda", dtype=torch.float16)
    c = torch.full((256, 192), float("nan"), device="cuda", dtype=torch.float16)
    got = torch.compile(_tri_matmul(ns), fullgraph=True, backend=backend, dynamic=True)(a, b, c)
    assert torch.allclose(got, (a @ b).float(), atol=1e-2, rtol=0) and torch.equal(got, c.float())


@pytest.mark.parametrize("compiled", [False, True])
def test_triton_ops_in_a_cuda_graph_replay_new_inputs(torch: Any, ns: Any, compiled: bool) -> None:
    """add, softmax and matmul captured in torch.cuda.graph (after the warm-up it asks for); each
    replay sees the inputs written in place since."""
    torch._dynamo.reset()
    add, soft, mm = _tri_add(ns), _tri_softmax(torch, ns), _tri_matmul(ns)

    def step(x: Any, y: Any, out: Any, s: Any, sy: Any, a: Any, b: Any, c: Any) -> Any:
        return add(x, y, out), soft(s, sy), mm(a, b, c)

    fn = torch.compile(step, fullgraph=True) if compiled else step
    x, y, out = torch.rand(4096, device="cuda"), torch.rand(4096, device="cuda"), torch.empty(4096, device="cuda")
    s, sy = torch.randn(64, 1024, device="cuda"), torch.empty(64, 1024, device="cuda")
    a = torch.randn(128, 64, device="cuda", dtype=torch.float16)
    b = torch.randn(64, 128, device="cuda", dtype=torch.float16)
    c = torch.empty(128, 128, device="cuda", dtype=torch.float16)
    g, (r_add, r_soft, r_mm) = _warm_and_capture(torch, fn, x, y, out, s, sy, a, b, c)
    for seed in range(3):
        torch.manual_seed(seed)
        x.copy_(torch.rand_like(x))
        s.copy_(torch.randn_like(s))
        a.copy_(torch.randn_like(a))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(r_add, (x + y) * 2.0), seed
        assert torch.allclose(r_soft, torch.softmax(s, dim=1), atol=1e-6, rtol=1e-5), seed
        assert torch.allclose(r_mm, (a @ b).float(), atol=1e-2, rtol=0), seed
