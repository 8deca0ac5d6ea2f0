"""Triton instance families as PyTorch operators (``khal_runtime.torch`` with
``khal_runtime.torch_triton``), on CPU with the real torch and the fake CUDA driver.

A family registers as ``(SymInt[] grid, <its runtime arguments>) -> ()``: the grid in programs,
every pointer a mutated ``Tensor``, no scratch pointers, no constexprs. Shown here: the schema,
the fake implementation (FakeTensorMode, ``torch.compile(fullgraph=True)``), functionalization
writing back to the caller, and the CUDA kernel launching the family on torch's stream with the
family's own checks (driven with CUDA-tensor stand-ins: this torch has no CUDA). The real
launches (eager, compiled, captured) are in ``tests/runtime/test_torch_ops_gpu.py``.

Skipped where torch is not installed (CI: torch is not in the test extra); the GPU machine's
"torch CPU tests" stage runs it (``scripts/gpu-check tests``).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed: not in the test extra (PyPI's Linux torch is the multi-GB CUDA build); "
    "this file runs on the GPU machine (scripts/gpu-check tests) or after pip install torch")

import khal_runtime.torch as khal_torch  # noqa: E402
from khal_runtime import abi  # noqa: E402
from khal_runtime.errors import (ArgumentError, ArgumentValueError, CaptureError, KhalError,  # noqa: E402
                                 TritonAssumptionError)
from khal_runtime.manifest import Entry, Param, TritonFacts  # noqa: E402
from khal_runtime.torch_triton import TritonOpSpec  # noqa: E402
from khal_runtime.triton import TritonKernel  # noqa: E402
from tests.helpers.fakecuda import CONTENT, FakeDriver, fake, fake_kernels  # noqa: E402,F401

_names = itertools.count()
_U64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
#: the family: add(x: *fp32, out: *fp32, n: i32, scale: fp32, BLOCK=256), built as ``add`` (x, out
#: 16-byte aligned, n divisible by 16) and its conservative twin ``add__base``
_NAMES = ("x", "out", "n", "scale")
_TYPES = ("*fp32", "*fp32", "i32", "fp32")


def _entry(name: str, family: str, divisible: tuple[str, ...], names: tuple[str, ...] = _NAMES,
           types: tuple[str, ...] = _TYPES, written: tuple[str, ...] | None = None) -> Entry:
    """A Triton entry hashed as a build hashes it (``written``: the pointers the build found it
    may write; None, as a manifest built before the analysis: all)."""
    facts = TritonFacts(kernel="add_kernel", family=family, base=not divisible, num_warps=4, num_stages=3, shared=0,
                        names=names, types=types, divisible=divisible, constexprs={"BLOCK": 256}, cache_key="ck",
                        triton_version="3.6.0", written=written)
    scalars = {"i32": ("int32", 4), "fp32": ("float32", 4), "i1": ("bool", 1), "i64": ("int64", 8)}
    params = []
    for n, t in zip(names, types):
        if t.startswith("*"):
            params.append(Param(name=n, **_U64))
        else:
            et, size = scalars[t]
            params.append(Param(name=n, kind="scalar", element_type=et, element_size=size, element_align=size))
    params += [Param(name="khal_global_scratch", **_U64), Param(name="khal_profile_scratch", **_U64)]
    sig = abi.entry_signature(name, (128, 1, 1), tuple(params), grid_dims=3, attributes=None, triton=facts.record())
    h = abi.entry_hash(CONTENT, sig)
    return Entry(name=name, symbol=abi.symbol_for(name, h), hash=h, block_size=(128, 1, 1), params=tuple(params),
                 grid_dims=3, triton=facts)


def _package(drv: FakeDriver, tmp_path: Path, entries: list[Entry] | None = None) -> tuple[Any, Any]:
    """A Triton crate ``c`` on the fake driver and its operators, under a namespace no other test used."""
    name = f"khal_tri{next(_names)}_{os.getpid()}"
    if entries is None:
        entries = [_entry("add", "add", ("x", "out", "n")), _entry("add__base", "add", ())]
    ks = fake_kernels(drv, tmp_path, entries, package=name, language="triton")
    return ks, khal_torch.register(ks)


def _args(schema: Any) -> list[tuple[str, str, bool]]:
    """(name, type, written) per argument of a parsed schema."""
    return [(a.name, str(a.type), bool(a.alias_info and a.alias_info.is_write)) for a in schema.arguments]


def test_a_family_registers_with_a_grid_of_programs_and_mutable_tensors(fake: FakeDriver, tmp_path: Path) -> None:
    ks, ops = _package(fake, tmp_path)
    assert isinstance(ks.add, TritonKernel)
    ns = ks.package
    # one operator per family (not per variant), the grid first, no scratch pointers, no constexpr
    assert ops.op_names == {"c.add": "add"}
    assert ops.schema("add") == (f"{ns}::add(SymInt[] grid, Tensor(a0!) x, Tensor(a1!) out, SymInt n, float scale) "
                                 "-> ()")
    s = ops.add.default._schema
    assert _args(s) == [("grid", "List[int]", False), ("x", "Tensor", True), ("out", "Tensor", True),
                        ("n", "int", False), ("scale", "float", False)]
    assert s.returns == [] and s.is_mutable
    spec = ops._specs["add"]
    assert isinstance(spec, TritonOpSpec) and spec.kernel is ks.add and spec.mutates == ("x", "out")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has(spec.qualname, "CUDA") and has(spec.qualname, "Meta") and has(spec.qualname, "CompositeExplicitAutograd")
    assert torch.Tag.pt2_compliant_tag in ops.add.default.tags


def test_an_argument_named_grid_and_scalar_types_map_as_triton_spells_them(fake: FakeDriver, tmp_path: Path) -> None:
    names, types = ("grid", "flag", "big"), ("*bf16", "i1", "i64")
    ks, ops = _package(fake, tmp_path, [_entry("odd", "odd", (), names, types)])
    assert [(n, t) for n, t, _ in _args(ops.odd.default._schema)] == [
        ("khal_grid", "List[int]"), ("grid", "Tensor"), ("flag", "bool"), ("big", "int")]


def test_registering_again_rebinds_the_family(fake: FakeDriver, tmp_path: Path) -> None:
    ks, ops = _package(fake, tmp_path)
    spec = ops._specs["add"]
    spec.grids[(1,)] = (1,)
    entries = [_entry("add", "add", ("x", "out", "n")), _entry("add__base", "add", ())]
    again = fake_kernels(fake, tmp_path, entries, package=ks.package, language="triton")  # a reload
    assert khal_torch.register(again) is ops
    assert spec.kernel is again.add and spec.crate_kernels is again.crates["c"] and spec.grids == {}


def test_a_second_copy_of_the_package_does_not_take_over_its_operators(fake: FakeDriver, tmp_path: Path) -> None:
    """#38 item 3: the same package (name, entries, schemas) loaded from another directory (two
    wheels in two paths, a vendored copy) is refused by name; it took the first copy's operators."""
    ks, ops = _package(fake, tmp_path / "a")
    entries = [_entry("add", "add", ("x", "out", "n")), _entry("add__base", "add", ())]
    copy = fake_kernels(fake, tmp_path / "b", entries, package=ks.package, language="triton")
    with pytest.raises(KhalError, match=rf"torch.ops.{ks.package} holds the operators of package '{ks.package}' "
                                        rf"loaded from .*/a/{ks.package}; this is another copy of it, loaded from "
                                        rf".*/b/{ks.package} \(two installs side by side, a vendored copy\).*"
                                        r"register\(kernels, namespace='...'\)"):
        khal_torch.register(copy)
    assert ops._specs["add"].kernel is ks.add and ops.kernels is ks  # the first copy keeps its operators
    theirs = khal_torch.register(copy, namespace=f"{ks.package}_b")
    assert theirs is not ops and theirs._specs["add"].kernel is copy.add
    assert khal_torch.register(ks) is ops


# ---------------------------------------------------------------------------------------------
# the fake implementation
# ---------------------------------------------------------------------------------------------
def test_the_fake_impl_checks_grid_device_and_dtype_with_the_familys_errors(fake: FakeDriver, tmp_path: Path) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, ops = _package(fake, tmp_path)
    with FakeTensorMode():
        x, out = torch.empty(1000, device="cuda"), torch.empty(1000, device="cuda")
        assert ops.add([4], x, out, 1000, 2.0) is None and ops.add([4, 2, 1], x, out, 1000, 2.0) is None
        with pytest.raises(ArgumentValueError, match=r"add\(\) \(Triton kernel c.add\): grid: expected 1 to 3 "
                                                     r"dimensions \(programs along x, y, z\), got \[\]"):
            ops.add([], x, out, 1000, 2.0)
        with pytest.raises(ArgumentValueError, match="expected 1 to 3 dimensions"):
            ops.add([1, 1, 1, 1], x, out, 1000, 2.0)
        assert ops.add([0], x, out, 0, 2.0) is None and ops.add([4, 0], x, out, 0, 2.0) is None  # empty: traced
        with pytest.raises(ArgumentValueError, match=r"add\[grid\]: grid: every dimension must be >= 0"):
            ops.add([-1], x, out, 1000, 2.0)
        with pytest.raises(ArgumentError, match=r"add\(\): argument 'out' is an array of float16, the kernel was "
                                                r"built for \*fp32 \(float32\)"):
            ops.add([4], x, torch.empty(1000, dtype=torch.float16, device="cuda"), 1000, 2.0)
        with pytest.raises(ArgumentValueError, match=r"argument 'out' \(\*fp32\) is on cpu, an earlier tensor "
                                                     r"argument on cuda:0"):
            ops.add([4], x, torch.empty(1000), 1000, 2.0)


def _record_backend(graphs: list[Any]) -> Any:
    def backend(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward
    return backend


def test_compile_fullgraph_traces_the_op_and_the_real_impl_refuses_host_tensors(fake: FakeDriver,
                                                                                 tmp_path: Path) -> None:
    ks, _ = _package(fake, tmp_path)
    ns = getattr(torch.ops, ks.package)

    def step(x: Any, out: Any) -> Any:
        n = x.numel()
        ns.add([(n + 255) // 256], x, out, n, 2.0)
        return out.sum()

    graphs: list[Any] = []
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=_record_backend(graphs))
    with pytest.raises(ArgumentError, match=r"add\(\) \(Triton kernel c.add\): argument 'x' \(\*fp32\) is a tensor "
                                            r"on cpu; khal kernels run on CUDA tensors: move it with .cuda\(\)"):
        compiled(torch.ones(8), torch.zeros(8))  # traced (the fake impl), then run: CPU tensors are refused
    assert len(graphs) == 1
    targets = {str(n.target).removesuffix(".default") for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert f"{ks.package}.add" in targets


def test_an_empty_grid_traces_under_compile_and_launches_nothing(fake: FakeDriver, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """#38 item 5: an empty batch (``cdiv(0, BLOCK)`` programs) is traced by the fake impl and
    reaches the kernel, which launches nothing; it was refused in the trace before."""
    ks, _ = _package(fake, tmp_path)
    ns = getattr(torch.ops, ks.package)
    calls: list[list[int]] = []
    monkeypatch.setattr(khal_torch, "_triton_elsewhere", lambda spec, grid, args: calls.append(list(grid)))

    def step(x: Any, out: Any) -> Any:
        n = x.numel()
        ns.add([(n + 255) // 256], x, out, n, 2.0)
        return out.sum()

    for dynamic in (False, True):
        torch._dynamo.reset()
        got = torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=dynamic)(torch.ones(0), torch.zeros(0))
        assert float(got) == 0.0
    assert calls and all(g == [0] for g in calls)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_mutation_of_every_pointer_reaches_the_caller(fake: FakeDriver, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, dynamic: bool) -> None:
    """Every pointer is declared written: through AOTAutograd's functionalization what the kernel
    writes (here a CPU stand-in for it: out = x * scale, and x zeroed) reaches the caller's
    tensors, in order with the torch ops around it."""
    ks, _ = _package(fake, tmp_path)
    ns = getattr(torch.ops, ks.package)
    calls: list[tuple[list[int], int]] = []

    def kernel_on_cpu(spec: Any, grid: Any, args: tuple[Any, ...]) -> None:
        x, out, n, scale = args
        calls.append((list(grid), int(n)))
        out[:n] = x[:n] * scale
        x.zero_()

    monkeypatch.setattr(khal_torch, "_triton_elsewhere", kernel_on_cpu)

    def step(x: Any, out: Any) -> Any:
        x.add_(1)
        n = x.numel()
        ns.add([(n + 255) // 256], x, out, n, 3.0)
        return (out * 2).sum() + x.sum()

    x_eager, out_eager = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    x_comp, out_comp = x_eager.clone(), out_eager.clone()
    want = step(x_eager, out_eager)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend="aot_eager", dynamic=dynamic)(x_comp, out_comp)
    assert torch.equal(out_comp, out_eager) and torch.equal(out_eager, (torch.arange(8.0) + 1) * 3)
    assert torch.equal(x_comp, torch.zeros(8)) and float(got) == float(want)
    assert calls[0] == ([1], 8) and calls[-1] == ([1], 8)


# ---------------------------------------------------------------------------------------------
# the CUDA kernel: the family launched on torch's stream (CUDA-tensor stand-ins, fake driver)
# ---------------------------------------------------------------------------------------------
class _CudaTensor:
    """What the CUDA kernel and the family read of a CUDA tensor."""

    is_cuda = True

    def __init__(self, ptr: int, dtype: Any = None, device: int = 0) -> None:
        self.ptr, self._dtype, self.device_id, self.v = ptr, dtype or torch.float32, device, 0
        self.dtype_reads = 0

    @property
    def dtype(self) -> Any:
        self.dtype_reads += 1
        return self._dtype

    @property
    def device(self) -> str:
        return f"cuda:{self.device_id}"

    @property
    def _version(self) -> int:
        return self.v

    def get_device(self) -> int:
        return self.device_id

    def data_ptr(self) -> int:
        return self.ptr


class _CpuTensor(_CudaTensor):
    is_cuda = False
    device = "cpu"  # type: ignore[assignment]

    def get_device(self) -> int:
        return -1


@pytest.fixture
def cuda_op(fake: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(the add op's CUDA kernel, the package, the fake driver, torch's stream handle per device)."""
    from tests.helpers.fakecuda import stream

    ks, ops = _package(fake, tmp_path)
    handles = {0: 0x100}

    def bump(ts: tuple[Any, ...]) -> None:
        for t in ts:
            t.v += 1

    def stream_for(spec: Any, dev: int, h: int) -> Any:
        st = khal_torch._streams[(dev, h)] = stream(h, native=f"TORCH{h:#x}", device_id=dev)
        return st

    monkeypatch.setattr(khal_torch, "_raw_stream", lambda dev: handles[dev])
    monkeypatch.setattr(khal_torch, "_bump", bump)
    monkeypatch.setattr(khal_torch, "_streams", {})
    monkeypatch.setattr(khal_torch, "_stream_for", stream_for)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return khal_torch._make_triton_cuda_impl(ops._specs["add"]), ks, fake, handles


def _slots(launch: dict[str, Any]) -> list[int]:
    return [int.from_bytes(s, "little") for s in launch["slots"]]


def test_the_cuda_kernel_launches_the_family_on_torchs_stream_and_bumps_every_pointer(cuda_op: Any) -> None:
    impl, ks, drv, _ = cuda_op
    spec = khal_torch.registered(ks.package)._specs["add"]
    x, out = _CudaTensor(0x10000), _CudaTensor(0x20000)
    impl([4], x, out, 1024, 2.0)
    la = drv.launches[-1]
    base = ks.crates["c"].instances["add__base"].entry
    assert la["f"] == f"FUNC:{ks.add.entry.symbol}"  # aligned and divisible: the specialised variant
    assert la["grid"] == (4, 1, 1) and la["block"] == (128, 1, 1) and la["stream"] == "TORCH0x100"
    assert _slots(la)[:3] == [0x10000, 0x20000, 1024] and _slots(la)[4:] == [0, 0]  # null scratch, the family's
    assert (x.v, out.v) == (1, 1)  # every pointer is declared written: every one bumped, after the launch
    impl([3, 2], _CudaTensor(0x10004), out, 1000, 2.0)  # x misaligned for 16 bytes, n not divisible: the twin
    assert drv.launches[-1]["f"] == f"FUNC:{base.symbol}" and drv.launches[-1]["grid"] == (3, 2, 1)
    n = len(drv.launches)
    for _ in range(3):
        impl([4], x, out, 1024, 2.0)  # the same grid value: one tuple object, which the family's memo sees again
    assert len(drv.launches) == n + 3 and (x.v, out.v) == (4, 5)
    assert list(spec.grids) == [(4,), (3, 2)]  # one tuple per grid value, kept for the family's memo
    reads = x.dtype_reads
    for s in ("2.0", "2.0", "2.0"):  # the dispatcher hands over a new float each call: an equal one hits
        impl([4], x, out, 1024, float(s))
    assert x.dtype_reads == reads + 3 and len(drv.launches) == n + 6  # a hit reads data_ptr() and dtype only
    impl([4], x, out, 1024, float("-0.0"))  # 0.0 == -0.0, but not the same bits: read and packed again
    impl([4], x, out, 1024, float("0.0"))
    assert x.dtype_reads == reads + 3 + 2  # (each read in full: the memo fails at the float first)
    assert _slots(drv.launches[-2])[3] == 0x80000000 and _slots(drv.launches[-1])[3] == 0


def test_the_cuda_kernel_gets_the_familys_named_errors_and_bumps_nothing_then(cuda_op: Any) -> None:
    impl, ks, drv, _ = cuda_op
    x, out = _CudaTensor(0x10000), _CudaTensor(0x20000)
    n = len(drv.launches)
    with pytest.raises(ArgumentError, match=r"add\(\): argument 'out': a tensor on cpu, not on a CUDA device"):
        impl([4], x, _CpuTensor(0x30000), 1024, 2.0)
    with pytest.raises(ArgumentError, match=r"add\(\): argument 'x' is an array of float16, the kernel was built for "
                                            r"\*fp32"):
        impl([4], _CudaTensor(0x10000, torch.float16), out, 1024, 2.0)
    with pytest.raises(ArgumentValueError, match=r"argument 'x' \(\*fp32\) points at 0x10002, not a multiple of 4"):
        impl([4], _CudaTensor(0x10002), out, 1024, 2.0)
    with pytest.raises(ArgumentValueError, match="grid: expected 1 to 3 dimensions"):
        impl([], x, out, 1024, 2.0)
    with pytest.raises(ArgumentValueError, match=r"every dimension must be >= 0 \(0: launch nothing\), got \(-1, 1, 1\)"):
        impl([-1], x, out, 1024, 2.0)
    with pytest.raises(ArgumentValueError, match=r"argument 'out' \(\*fp32\) is on cuda:1, an earlier tensor "
                                                 r"argument on cuda:0"):
        impl([4], x, _CudaTensor(0x20000, device=1), 1024, 2.0)
    assert len(drv.launches) == n and (x.v, out.v) == (0, 0)
    impl([0], x, out, 0, 2.0)  # an empty grid (an empty batch): nothing launched, and no error
    impl([4, 0], x, out, 0, 2.0)
    assert len(drv.launches) == n


def test_a_family_without_its_twin_refuses_a_broken_assumption_by_name(fake: FakeDriver, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, ops = _package(fake, tmp_path, [_entry("add", "add", ("x", "out", "n"))])  # fallback = false
    monkeypatch.setattr(khal_torch, "_raw_stream", lambda dev: 0)
    monkeypatch.setattr(khal_torch, "_bump", lambda ts: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    impl = khal_torch._make_triton_cuda_impl(ops._specs["add"])
    with pytest.raises(TritonAssumptionError, match=r"n = 1000 is not divisible by 16"):
        impl([4], _CudaTensor(0x10000), _CudaTensor(0x20000), 1000, 2.0)


def test_a_first_use_inside_a_capture_is_refused_before_the_family_loads(cuda_op: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    impl, ks, drv, _ = cuda_op
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(CaptureError, match=r"add\(\) \(Triton kernel c.add\) is used for the first time on cuda:0 "
                                           r"inside a graph capture.*kernels.crates\['c'\].load\(0\)"):
        impl([4], _CudaTensor(0x10000), _CudaTensor(0x20000), 1024, 2.0)
    assert drv.launches == [] and 0 not in ks.crates["c"]._modules


def test_a_repeated_call_is_a_hit_of_the_familys_memo_with_new_grid_lists_and_floats(cuda_op: Any) -> None:
    """The dispatcher hands the kernel a new grid list and a new float object on every call; the
    family's memo compares the grid and floats by identity: the operator passes one tuple per grid
    value and the float object of the last call when equal (not -0.0 for 0.0), so a repeat hits."""
    impl, ks, drv, _ = cuda_op
    x, out = _CudaTensor(0x10000), _CudaTensor(0x20000)

    def hits() -> int:
        slots = getattr(ks.add._tls, "s", None)
        return sum(m.hits for m in slots.all) if slots is not None else 0

    for _ in range(2):  # the checked call, then the full read that fills a memo slot
        impl([4], x, out, 1024, float("2.5"))
    before = hits()
    for _ in range(3):
        impl([4], x, out, 1024, float("2.5"))
    assert hits() == before + 3
    assert struct_floats(drv.launches[-1]) == 2.5
    impl([4], x, out, 1024, float("-0.0"))
    impl([4], x, out, 1024, 0.0)  # equal to -0.0, but another value to pack
    assert [struct_floats(la) for la in drv.launches[-2:]] == [-0.0, 0.0]
    assert str(struct_floats(drv.launches[-2])) == "-0.0" and str(struct_floats(drv.launches[-1])) == "0.0"


def struct_floats(launch: dict[str, Any]) -> float:
    import struct

    return float(struct.unpack("<f", bytes(launch["slots"][3])[:4])[0])


# ---------------------------------------------------------------------------------------------
# pointers the build proved read-only (TritonFacts.written)
# ---------------------------------------------------------------------------------------------
def _proved(written: tuple[str, ...] | None = ("out",), twin: tuple[str, ...] | None = ("out",)) -> list[Entry]:
    return [_entry("add", "add", ("x", "out", "n"), written=written),
            _entry("add__base", "add", (), written=twin)]


def test_a_pointer_every_variant_only_reads_is_a_plain_tensor_in_the_schema(fake: FakeDriver, tmp_path: Path) -> None:
    ks, ops = _package(fake, tmp_path, _proved())
    assert ops.schema("add") == (f"{ks.package}::add(SymInt[] grid, Tensor x, Tensor(a1!) out, SymInt n, "
                                 "float scale) -> ()")
    assert _args(ops.add.default._schema)[1:3] == [("x", "Tensor", False), ("out", "Tensor", True)]
    spec = ops._specs["add"]
    assert spec.mutates == ("out",) and spec.written == (1,) and spec.pointers == (0, 1)


@pytest.mark.parametrize("written, twin", [(("out",), None), (("x", "out"), ("out",)), (("out",), ("x", "out"))])
def test_a_pointer_some_variant_may_write_or_does_not_say_stays_mutated(fake: FakeDriver, tmp_path: Path,
                                                                       written: Any, twin: Any) -> None:
    ks, ops = _package(fake, tmp_path, _proved(written, twin))
    assert _args(ops.add.default._schema)[1:3] == [("x", "Tensor", True), ("out", "Tensor", True)]
    assert ops._specs["add"].written == (0, 1)


def test_only_the_written_pointers_are_version_bumped(fake: FakeDriver, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor autograd saved for another op's backward, passed to the kernel as an input it only
    reads, keeps its version: backward does not fail with "modified by an inplace operation"."""
    _, ops = _package(fake, tmp_path, _proved())
    bumped: list[tuple[Any, ...]] = []
    monkeypatch.setattr(khal_torch, "_raw_stream", lambda dev: 0)
    monkeypatch.setattr(khal_torch, "_bump", lambda ts: (bumped.append(ts), [setattr(t, "v", t.v + 1) for t in ts]))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    impl = khal_torch._make_triton_cuda_impl(ops._specs["add"])
    x, out = _CudaTensor(0x10000), _CudaTensor(0x20000)
    impl([4], x, out, 1024, 2.0)
    impl([4], x, out, 1000, 2.0)  # the twin: it too only reads x
    assert (x.v, out.v) == (0, 2) and all(ts == (out,) for ts in bumped)


def test_compiled_a_read_only_input_is_not_functionalized(fake: FakeDriver, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile only ``out`` is a base AOTAutograd functionalizes (and writes back);
    ``x`` reaches the operator as the graph's input, with no copy, and the result is eager's."""
    from torch._dynamo.backends.common import aot_autograd

    def run(entries: list[Entry]) -> tuple[Any, Any, Any]:
        ks, _ = _package(fake, tmp_path / str(next(_names)), entries)
        ns = getattr(torch.ops, ks.package)

        def step(x: Any, out: Any) -> Any:
            ns.add([1], x, out, x.numel(), 3.0)
            return (out * 2).sum() + x.sum()

        graphs: list[Any] = []

        def fw(gm: Any, example_inputs: Any) -> Any:
            graphs.append(gm)
            return gm.forward

        x, out = torch.arange(8.0), torch.zeros(8)
        torch._dynamo.reset()
        got = torch.compile(step, fullgraph=True, backend=aot_autograd(fw_compiler=fw))(x, out)
        (node,) = [n for n in graphs[0].graph.nodes if n.op == "call_function" and "auto_functionalized" in str(n.target)]
        outputs = next(n for n in graphs[0].graph.nodes if n.op == "output").args[0]
        assert torch.equal(out, torch.arange(8.0) * 3) and float(got) == float((out * 2).sum() + x.sum())
        return node, outputs, graphs[0]

    def kernel_on_cpu(spec: Any, grid: Any, args: tuple[Any, ...]) -> None:
        x, out, n, scale = args
        out[:n] = x[:n] * scale

    monkeypatch.setattr(khal_torch, "_triton_elsewhere", kernel_on_cpu)
    node, outputs, gm = run(_proved())
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(node.kwargs["_all_bases"]) == 1 and node.kwargs["x"] is inputs[0]  # x: the input itself
    assert len(outputs) == 2  # out's new value (written back) and the result: nothing for x
    node, outputs, _ = run(_proved(None, None))  # an older manifest: both functionalized, both written back
    assert len(node.kwargs["_all_bases"]) == 2 and len(outputs) == 3
