"""khal kernels as PyTorch custom operators (``khal_runtime.torch``), on CPU with the real torch.

What can be shown without a GPU: registration, naming, idempotence, the schemas (what is declared
mutated), the fake implementation under ``FakeTensorMode`` (CUDA fake tensors work on a CPU-only
torch) and under ``torch.compile(fullgraph=True)``, the uniform helper, and the error paths of the
real implementation. The real launch (eager, compiled, inside ``torch.cuda.graph``) is in
``tests/runtime/test_torch_ops_gpu.py``.

Skipped where torch is not installed. torch is not in the ``test`` extra, so CI skips this file:
PyPI's Linux torch is the CUDA build (a 0.55 GB wheel pulling several GB of CUDA libraries), and
the CPU-only wheels live on download.pytorch.org, a second index. It runs on the GPU machine,
whose torch is a CUDA build (``scripts/gpu-check tests`` runs it after the gpu tests), or
anywhere after ``pip install torch``.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed: not in the test extra (PyPI's Linux torch is the multi-GB CUDA build); "
    "this file runs on the GPU machine (scripts/gpu-check tests) or after pip install torch")

import khal_runtime.torch as khal_torch  # noqa: E402
from khal_runtime.errors import ArgumentError, ArgumentValueError, KhalError  # noqa: E402
from khal_runtime.torch import _OpSpec  # noqa: E402
from tests.helpers.kernel_models import ENTRIES, models_kernels, scalar, storage  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


def _fresh(prefix: str = "khal_t", **kw: Any) -> tuple[Any, Any]:
    """A package of the models' kernels under a namespace no other test used, and its ops."""
    name = f"{prefix}{next(_names)}_{os.getpid()}"
    ks = models_kernels(name, **kw)
    return ks, khal_torch.register(ks)


@pytest.fixture(scope="module")
def pkg() -> tuple[Any, Any]:
    return _fresh("khal_mod")


class SaxpyParams(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float)]


def test_importing_the_runtime_or_this_module_imports_no_torch() -> None:
    code = textwrap.dedent("""
        import sys
        import khal_runtime, khal_runtime.kernels, khal_runtime.torch
        from tests.helpers.kernel_models import models_kernels
        ks = models_kernels("khal_noimport")
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
        print("OK")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_one_op_per_entry_named_after_the_package(pkg: tuple[Any, Any]) -> None:
    ks, ops = pkg
    ns = ks.package
    assert ops.namespace == ns
    assert sorted(ops.op_names.values()) == sorted(
        ["saxpy", "core_scale", "scalars", "integrate", "total", "odd", "extra_scale", "fill", "affine"])
    assert len(ops) == sum(len(v) for v in ENTRIES.values())
    # ops.<entry> is torch.ops.<ns>.<entry>; the Slang crate's entry alike
    assert ops.saxpy is getattr(getattr(torch.ops, ns), "saxpy")
    assert ops.affine is getattr(getattr(torch.ops, ns), "affine")
    # a name two crates define: crate-qualified op names, reached through ops.crates
    assert ops.op_names["core.scale"] == "core_scale" and ops.op_names["extra.scale"] == "extra_scale"
    assert ops.crates["core"].scale is getattr(torch.ops, ns).core_scale
    assert ops.crates["extra"].scale is getattr(torch.ops, ns).extra_scale
    assert ops.crates["core"].saxpy is ops.saxpy
    with pytest.raises(AttributeError, match=r"entry 'scale' exists in crates \['core', 'extra'\]; use ops.crates"):
        ops.scale
    with pytest.raises(AttributeError, match="has no entry 'nope'"):
        ops.nope
    with pytest.raises(AttributeError, match="crate 'extra' has no entry 'saxpy'"):
        ops.crates["extra"].saxpy
    assert khal_torch.registered(ns) is ops


def test_package_names_become_namespaces() -> None:
    ks = models_kernels("my-pkg.sub")
    ops = khal_torch.register(ks)
    assert ops.namespace == "my_pkg_sub" and hasattr(torch.ops.my_pkg_sub, "saxpy")
    ops2 = khal_torch.register(models_kernels("khal_named"), namespace="khal_explicit_ns")
    assert ops2.namespace == "khal_explicit_ns" and hasattr(torch.ops.khal_explicit_ns, "fill")


def _args(schema: Any) -> list[tuple[str, str, bool]]:
    """(name, type, written) per argument, from the schema as PyTorch prints it (its argument
    objects print SymInt as int)."""
    text = str(schema)
    out = []
    for part in text[text.index("(") + 1:text.rindex(") ->")].split(", "):
        typ, name = part.rsplit(" ", 1)
        out.append((name, typ.split("(")[0], "!" in typ))
    assert [n for n, _, _ in out] == [a.name for a in schema.arguments]
    assert [w for _, _, w in out] == [bool(a.alias_info and a.alias_info.is_write) for a in schema.arguments]
    return out


def test_schemas_declare_what_the_kernel_writes(pkg: tuple[Any, Any]) -> None:
    ks, ops = pkg
    s = ops.saxpy.default._schema
    assert _args(s) == [("threads", "SymInt", False), ("x", "Tensor", False), ("y", "Tensor", True),
                        ("params", "Tensor", False)]
    assert s.returns == [] and s.is_mutable
    assert ops.schema("saxpy") == f"{ks.package}::saxpy(SymInt threads, Tensor x, Tensor(a1!) y, Tensor params) -> ()"
    # scalars by the family of their ABI type (bfloat16 / float16 as float)
    assert _args(ops.scalars.default._schema) == [
        ("threads", "SymInt", False), ("out", "Tensor", True), ("a", "SymInt", False), ("b", "float", False),
        ("c", "SymInt", False), ("d", "float", False), ("e", "SymInt", False), ("f", "bool", False),
        ("g", "float", False), ("h", "float", False), ("z", "complex", False)]
    # the Slang entry: two written storages, a uniform, loose scalars
    assert _args(ops.affine.default._schema) == [
        ("threads", "SymInt", False), ("x", "Tensor", False), ("y", "Tensor", True), ("k", "Tensor", True),
        ("p", "Tensor", False), ("gain", "float", False), ("base", "SymInt", False), ("count", "SymInt", False)]
    assert ops._specs["affine"].mutates == ("y", "k")


def test_argument_names_the_schema_cannot_take_are_renamed(pkg: tuple[Any, Any]) -> None:
    _, ops = pkg
    # 'in' and 'def' are no identifiers to the schema parser; 'threads' is a parameter here
    assert _args(ops.odd.default._schema) == [("khal_threads", "SymInt", False), ("in_", "Tensor", True),
                                              ("threads", "SymInt", False), ("def_", "SymInt", False)]
    assert ops._specs["odd"].mutates == ("in_",)


def test_ops_are_dispatcher_ops_with_a_cuda_kernel_a_fake_and_a_refusing_fallback(pkg: tuple[Any, Any]) -> None:
    """Defined with torch.library.Library, not custom_op: the launch is the kernel at the CUDA key
    (the dispatcher calls it straight), the fake impl sits at Meta (FakeTensor, torch.compile), and
    every other device reaches a kernel that refuses the tensors by name."""
    from torch._library.custom_ops import _maybe_get_opdef

    ks, ops = pkg
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for spec in ops._specs.values():
        q = spec.qualname
        assert has(q, "CUDA") and has(q, "Meta") and has(q, "CompositeExplicitAutograd"), q
        assert not has(q, "CompositeImplicitAutograd")  # nothing for Inductor to decompose
        assert not has(q, "Autograd") and not has(q, "ADInplaceOrView")  # custom_op's Python layers
        assert _maybe_get_opdef(q) is None
        assert torch.Tag.pt2_compliant_tag in spec.packet.default.tags
    s = ops.saxpy.default._schema
    assert s.is_mutable and [a.name for a in s.arguments if a.alias_info and a.alias_info.is_write] == ["y"]
    assert not ops.crates["core"].saxpy.default._schema.arguments[1].alias_info  # x is read only
    assert ops.library.ns == ks.package and ops.library.kind == "FRAGMENT"
    assert torch._library.simple_registry.singleton.find(ops._specs["saxpy"].qualname).fake_impl.kernel is not None


def test_register_again_defines_nothing_new_and_rebinds_the_launch(pkg: tuple[Any, Any]) -> None:
    ks, ops = pkg
    defs = set(torch.library._defs)
    spec = ops._specs["saxpy"]
    dump = torch._C._dispatch_dump(spec.qualname)  # the schema and every kernel registered
    spec.fast, spec.seen = (object(),), ((0, 1, ()),)  # what launches of the first load would leave
    again = models_kernels(ks.package)
    assert khal_torch.register(again) is ops and khal_torch.register(again) is ops
    assert set(torch.library._defs) == defs  # no operator defined twice
    assert torch._C._dispatch_dump(spec.qualname) == dump and "CUDA" in dump
    assert spec.kernel is again.saxpy and spec.crate_kernels is again.crates["core"]
    assert spec.fast == () and spec.seen == ()  # launches bound to the old load are dropped
    khal_torch.register(ks)
    assert spec.kernel is ks.saxpy


def test_register_is_idempotent(pkg: tuple[Any, Any]) -> None:
    ks, ops = pkg
    assert khal_torch.register(ks) is ops
    again = models_kernels(ks.package)  # another load of the same package (e.g. after a reload)
    assert khal_torch.register(again) is ops
    assert ops.kernels is again and ops._specs["saxpy"].kernel is again.saxpy
    khal_torch.register(ks)
    assert ops.kernels is ks  # back to the first: the ops launch through the newest load


def test_a_namespace_holds_one_package() -> None:
    ks, ops = _fresh()
    other = models_kernels("khal_other_pkg")
    with pytest.raises(KhalError, match=rf"torch.ops.{ks.package} already holds the operators of package "
                                        rf"'{ks.package}'.*namespace='...'"):
        khal_torch.register(other, namespace=ks.package)
    changed = models_kernels(ks.package, entries={"core": [("saxpy", (64, 1, 1), (storage("x"),))]})
    with pytest.raises(KhalError, match="other entries or signatures.*restart Python"):
        khal_torch.register(changed)
    assert khal_torch.register(ks) is ops


def test_another_copy_of_a_package_is_refused_by_name_and_registers_under_its_own_namespace(
        tmp_path: Path) -> None:
    """#38 item 3: the same name, entries and schemas loaded from two directories are two copies
    (two wheels in two paths, a vendored copy), not a reload: the second does not take the first's
    operators."""
    name = f"khal_copy{next(_names)}_{os.getpid()}"
    (tmp_path / "a" / name).mkdir(parents=True)
    (tmp_path / "b" / name).mkdir(parents=True)
    first = models_kernels(name, directory=tmp_path / "a" / name)
    ops = khal_torch.register(first)
    second = models_kernels(name, directory=tmp_path / "b" / name)
    with pytest.raises(KhalError, match=rf"holds the operators of package '{name}' loaded from .*/a/{name}; this is "
                                        rf"another copy of it, loaded from .*/b/{name}"):
        khal_torch.register(second)
    assert ops.kernels is first and ops._specs["saxpy"].kernel is first.saxpy
    reload = models_kernels(name, directory=tmp_path / "a" / ".." / "a" / name)  # the same place, spelt otherwise
    assert khal_torch.register(reload) is ops and ops.kernels is reload
    assert khal_torch.register(second, namespace=f"{name}_b").kernels is second


def test_a_namespace_with_foreign_ops_is_refused() -> None:
    ns = f"khal_foreign{os.getpid()}"
    torch.library.custom_op(f"{ns}::saxpy", lambda x: x.clone(), mutates_args=(), schema="(Tensor x) -> Tensor")
    with pytest.raises(KhalError, match=rf"torch.ops.{ns} already has operator\(s\) saxpy that hatch-khal did "
                                        "not register"):
        khal_torch.register(models_kernels("khal_foreign_pkg"), namespace=ns)
    assert khal_torch.registered(ns) is None


@pytest.mark.parametrize("bad, match", [
    ("aten", "PyTorch uses itself"), ("class", "not a Python identifier"), ("a.b", "not a Python identifier"),
    ("", "non-empty"),
])
def test_bad_namespaces(bad: str, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        khal_torch.register(models_kernels("khal_badns"), namespace=bad)


def test_register_takes_a_kernel_set() -> None:
    with pytest.raises(TypeError, match=r"register\(\) takes the kernels of a package \(khal_runtime.load"):
        khal_torch.register("example_shader_pkg")  # type: ignore[arg-type]


def test_entries_that_would_share_an_op_name_are_refused() -> None:
    with pytest.raises(KhalError, match=r"entries .* would both be the operator .*::a_c.*rename"):
        khal_torch.register(models_kernels(f"khal_clash{os.getpid()}", entries={
            "a": [("c", (32, 1, 1), (storage("y", writable=True),))],
            "b": [("c", (32, 1, 1), (storage("y", writable=True),))],
            "z": [("a_c", (32, 1, 1), (storage("y", writable=True),))]}))


# ---------------------------------------------------------------------------------------------
# the fake implementation
# ---------------------------------------------------------------------------------------------
def test_fake_impl_checks_dtypes_and_sizes_on_fake_cuda_tensors(pkg: tuple[Any, Any]) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    _, ops = pkg
    with FakeTensorMode():
        x = torch.empty(1000, device="cuda")
        y = torch.empty(1000, device="cuda")
        p = torch.empty(4, dtype=torch.uint8, device="cuda")
        assert ops.saxpy(1000, x, y, p) is None  # the fake impl: no GPU touched
        with pytest.raises(ArgumentError, match=r"saxpy\(\) \(entry core.saxpy\): argument 'x' \(storage float32\): "
                                                r"expected a tensor of dtype torch.float32, got torch.float64"):
            ops.saxpy(1000, torch.empty(1000, dtype=torch.float64, device="cuda"), y, p)
        with pytest.raises(ArgumentValueError, match=r"argument 'params' \(uniform SaxpyParams \(4 bytes\)\): the "
                                                     r"tensor holds 2 bytes, the struct needs 4; make it with "
                                                     r"khal_runtime.torch.uniform\(\)"):
            ops.saxpy(1000, x, y, torch.empty(2, dtype=torch.uint8, device="cuda"))
        with pytest.raises(ArgumentValueError, match="thread count must be >= 0"):
            ops.saxpy(-1, x, y, p)
        with pytest.raises(ArgumentValueError,
                           match=r"argument 'y' .* is on cpu, an earlier tensor argument on cuda:0"):
            ops.saxpy(1000, x, torch.empty(1000), p)
        # a storage of struct elements takes any dtype whose bytes hold whole elements
        particles = torch.empty(64, 8, device="cuda")  # 64 x 32-byte Particle
        ops.integrate(64, particles, torch.empty(16, dtype=torch.uint8, device="cuda"))
        with pytest.raises(ArgumentValueError, match=r"'particles' \(storage Particle rw\): the tensor's 20 bytes "
                                                     "are not a whole number of 32-byte elements"):
            ops.integrate(64, torch.empty(5, device="cuda"), torch.empty(16, dtype=torch.uint8, device="cuda"))


def _record_backend(graphs: list[Any]) -> Any:
    def backend(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward
    return backend


def test_compile_fullgraph_traces_the_ops(pkg: tuple[Any, Any]) -> None:
    """Dynamo puts the operators in the graph as they are (no graph break with fullgraph=True)."""
    ks, ops = pkg
    ns = getattr(torch.ops, ks.package)

    def step(x: Any, y: Any, p: Any, s: float) -> Any:
        ns.saxpy(x.numel(), x, y, p)
        ns.core_scale(y.numel(), y, s)
        return y.sum()

    graphs: list[Any] = []
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=_record_backend(graphs))
    x, y, p = torch.ones(8), torch.zeros(8), torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(ArgumentError, match=r"argument 'x' \(storage float32\) is a tensor on cpu; khal kernels run "
                                            r"on CUDA tensors: move it with .cuda\(\)"):
        compiled(x, y, p, 2.0)  # traced (the fake impl), then run: the real impl needs CUDA tensors
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert {f"{ks.package}.saxpy", f"{ks.package}.core_scale"} <= {t.removesuffix(".default") for t in targets}


class _CpuKernels:
    """Stands in for the launch on CPU tensors (what the kernels compute), to run compiled code."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, spec: _OpSpec, threads: Any, args: tuple[Any, ...]) -> None:
        self.calls.append((spec.op_name, int(threads)))
        if spec.op_name == "saxpy":
            x, y, p = args
            (a,) = struct.unpack("<f", bytes(p.numpy().tobytes()))
            n = min(int(threads), x.numel(), y.numel())
            y[:n] += a * x[:n]
        elif spec.op_name == "core_scale":
            y, s = args
            y.mul_(s)
        else:
            raise AssertionError(spec.op_name)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_mutation_reaches_the_caller(pkg: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch,
                                              backend: str, dynamic: bool) -> None:
    """Through AOTAutograd's functionalization the declared mutation is written back to the
    caller's tensor, in order with the surrounding torch ops, as in eager mode."""
    ks, ops = pkg
    cpu = _CpuKernels()
    monkeypatch.setattr(khal_torch, "_launch", cpu)
    ns = getattr(torch.ops, ks.package)

    def step(x: Any, y: Any, p: Any) -> Any:
        ns.saxpy(x.numel(), x, y, p)
        ns.core_scale(y.numel(), y, 0.5)
        return (y * 2).sum()

    p = khal_torch.uniform(ks.saxpy, SaxpyParams(a=3.0), "cpu")
    x = torch.arange(8, dtype=torch.float32)
    y_eager, y_comp = torch.ones(8), torch.ones(8)
    want = step(x, y_eager, p)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend=backend, dynamic=dynamic)(x, y_comp, p)
    assert torch.equal(y_comp, y_eager) and torch.equal(y_eager, (3.0 * x + 1) * 0.5)
    assert float(got) == float(want)
    assert ("saxpy", 8) in cpu.calls and ("core_scale", 8) in cpu.calls


def test_real_impl_refuses_host_tensors_naming_the_parameter(pkg: tuple[Any, Any]) -> None:
    _, ops = pkg
    with pytest.raises(ArgumentError, match=r"torch.ops.\w+.core_scale\(\) \(entry core.scale\): argument 'y' "
                                            r"\(storage float32 rw\) is a tensor on cpu; .*\.cuda\(\)"):
        ops.crates["core"].scale(4, torch.zeros(4), 2.0)


def test_struct_storages_pass_as_a_view_of_the_tensor_bytes(pkg: tuple[Any, Any]) -> None:
    """torch has no struct dtype: a storage of struct elements is the tensor's bytes read as such
    elements, which the launch's own checks accept (checked here with a CUDA-tensor stand-in)."""
    from khal_runtime.arguments import diagnose_args

    _, ops = pkg
    spec = ops._specs["integrate"]
    assert spec.reinterpret == (0,)

    class CudaTensor:  # what _reinterpreted reads of a CUDA tensor
        is_cuda = True

        def __init__(self, nbytes: int, contiguous: bool = True) -> None:
            self.nbytes, self.contiguous = nbytes, contiguous

        def is_contiguous(self) -> bool:
            return self.contiguous

        def numel(self) -> int:
            return self.nbytes // 4

        def element_size(self) -> int:
            return 4

        def data_ptr(self) -> int:
            return 0x7000_0000

        def get_device(self) -> int:
            return 0

    params = bytes(16)  # a SimParams
    (view, _) = khal_torch._reinterpreted(spec, (CudaTensor(64 * 32), params))
    assert (view.ptr, view.count, view.key, view.device) == (0x7000_0000, 64, "V32", 0)
    diagnose_args(spec.entry, (view, params), device=0)  # the launch's checks accept it
    with pytest.raises(ArgumentValueError, match="the tensor's 36 bytes are not a whole number of 32-byte elements"):
        khal_torch._reinterpreted(spec, (CudaTensor(36), params))
    with pytest.raises(ArgumentValueError, match=r"non-contiguous tensor; pass .contiguous\(\)"):
        khal_torch._reinterpreted(spec, (CudaTensor(64, contiguous=False), params))


# ---------------------------------------------------------------------------------------------
# uniforms as tensors
# ---------------------------------------------------------------------------------------------
def test_uniform_from_each_kind_of_host_value(pkg: tuple[Any, Any]) -> None:
    ks, ops = pkg
    want = struct.pack("<f", 2.5)
    dt = np.dtype([("a", np.float32)])
    for op in (ops.saxpy, ops.saxpy.default, ks.saxpy, ks.saxpy.entry, f"{ks.package}::saxpy"):
        for value in (SaxpyParams(a=2.5), np.array((2.5,), dtype=dt)[()], want, bytearray(want)):
            t = khal_torch.uniform(op, value, "cpu")
            assert t.dtype == torch.uint8 and t.device.type == "cpu" and bytes(t.numpy()) == want
    t = khal_torch.uniform(ops.saxpy, torch.tensor([2.5]), "cpu")  # a tensor holding the struct
    assert bytes(t.numpy()) == want


def test_uniform_out_writes_in_place(pkg: tuple[Any, Any]) -> None:
    _, ops = pkg
    u = khal_torch.uniform(ops.saxpy, SaxpyParams(a=1.0), "cpu")
    ptr = u.data_ptr()
    assert khal_torch.uniform(ops.saxpy, SaxpyParams(a=4.0), out=u) is u
    assert u.data_ptr() == ptr and bytes(u.numpy()) == struct.pack("<f", 4.0)
    with pytest.raises(ArgumentError, match=r"uniform\(out=...\) takes a contiguous torch.uint8 tensor of 4 elements"):
        khal_torch.uniform(ops.saxpy, SaxpyParams(a=4.0), out=torch.zeros(4))


def test_uniform_from_a_dict_uses_the_slang_layout(pkg: tuple[Any, Any]) -> None:
    _, ops = pkg
    value = {"scale": [1.0, 2.0, 3.0, 4.0], "shift": (0.5, -0.5, 0.25), "bias": 7.0, "step": -3, "mask": 255,
             "taps": np.array([0.125, 0.75], dtype=np.float32)}
    got = bytes(khal_torch.uniform(ops.affine, value, "cpu").numpy())
    assert got == struct.pack("<4f3ffiI2f", 1, 2, 3, 4, 0.5, -0.5, 0.25, 7.0, -3, 255, 0.125, 0.75)
    with pytest.raises(ArgumentError, match=r"missing field\(s\) 'taps'"):
        khal_torch.uniform(ops.affine, {k: v for k, v in value.items() if k != "taps"}, "cpu")
    with pytest.raises(ArgumentValueError,
                       match=r"field 'scale' \(float32\[4\]\) expects 4 item\(s\) along this axis, got 3"):
        khal_torch.uniform(ops.affine, dict(value, scale=[1.0, 2.0, 3.0]), "cpu")
    with pytest.raises(ArgumentValueError, match=r"field 'mask' \(uint32\): .*out of range"):
        khal_torch.uniform(ops.affine, dict(value, mask=-1), "cpu")
    # a CUDA C++ crate records no layout: a dict cannot be packed
    with pytest.raises(ArgumentError, match=r"a dict of fields needs the struct's layout, which only Slang crates record"):
        khal_torch.uniform(ops.saxpy, {"a": 1.0}, "cpu")


def test_uniform_errors_name_the_entry_and_parameter(pkg: tuple[Any, Any]) -> None:
    ks, ops = pkg
    with pytest.raises(ArgumentValueError, match=r"argument 'params' \(uniform SaxpyParams \(4 bytes\)\): expected 4 "
                                                 r"bytes, got 8"):
        khal_torch.uniform(ops.saxpy, bytes(8), "cpu")
    with pytest.raises(ArgumentError, match=r"argument 'params' .*expected a uniform struct"):
        khal_torch.uniform(ops.saxpy, 2.5, "cpu")
    with pytest.raises(ArgumentError, match="has no uniform parameter"):
        khal_torch.uniform(ops.fill, bytes(4), "cpu")
    with pytest.raises(ArgumentError, match="has no uniform parameter 'q'; its uniforms: params"):
        khal_torch.uniform(ops.saxpy, bytes(4), "cpu", param="q")
    with pytest.raises(TypeError, match=r"uniform\(\): expected a kernel .* got 'nope'"):
        khal_torch.uniform("nope", bytes(4), "cpu")


def test_two_uniforms_need_a_param_name() -> None:
    from tests.helpers.kernel_models import uniform as u

    ks, ops = _fresh(entries={"core": [("two", (32, 1, 1), (u("a", "A", 4), u("b", "B", 8), scalar("n", "uint32")))]})
    with pytest.raises(ArgumentError, match=r"several uniform parameters \(a, b\): pass param='<name>'"):
        khal_torch.uniform(ops.two, bytes(4), "cpu")
    assert khal_torch.uniform(ops.two, bytes(range(8)), "cpu", param="b").numel() == 8


def test_first_use_inside_a_capture_is_refused_before_any_driver_call(pkg: tuple[Any, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a crate cannot be captured in PyTorch's (global) mode: the error says to warm up
    (the GPU test checks the same inside a real torch.cuda.graph)."""
    from khal_runtime.errors import CaptureError

    _, ops = pkg
    spec = ops._specs["saxpy"]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(CaptureError, match=r"saxpy\(\) \(entry core.saxpy\) is used for the first time on cuda:0 "
                                           r"inside a graph capture.*kernels.crates\['core'\].load\(0\)"):
        khal_torch._first_use(spec, 0)


# ---------------------------------------------------------------------------------------------
# the CUDA kernel's fast path (a bound launch per argument set seen twice on a stream)
# ---------------------------------------------------------------------------------------------
class _CudaTensor:
    """What the CUDA kernel reads of a CUDA tensor (torch here has no CUDA): ``_version`` raises
    once the tensor is an inference tensor, as torch's does."""

    is_cuda = True
    dtype = torch.float32

    def __init__(self, ptr: int, n: int = 8, device: int = 0) -> None:
        self.ptr, self.n, self.device_id, self.v, self.inference = ptr, n, device, 0, False

    @property
    def _version(self) -> int:
        if self.inference:
            raise RuntimeError("Inference tensors do not track version counter.")
        return self.v

    def get_device(self) -> int:
        return self.device_id

    def is_contiguous(self) -> bool:
        return True

    def data_ptr(self) -> int:
        return self.ptr

    def numel(self) -> int:
        _CudaTensor.numel_reads += 1  # read by a full facts read only (never by a bound launch's check)
        return self.n

    def is_inference(self) -> bool:
        return self.inference

    numel_reads = 0


class _RecordingKernel:
    """Stands in for the entry's Kernel: records typed calls, binds and bound launches."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, tuple[Any, ...], Any]] = []
        self.binds = 0

    def __call__(self, n: int, *args: Any, stream: Any) -> None:
        # the scalars only: holding the tensors would keep a freed one's id from being reused
        self.calls.append(("typed", n, tuple(a if isinstance(a, (int, float)) else None for a in args), stream))

    def bind(self, *args: Any, stream: Any) -> Any:
        self.binds += 1
        return lambda n: self.calls.append(("bound", n, args, stream))


@pytest.fixture
def fast_op(pkg: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """(call(op, threads, *args), the recording kernel, stream handles by device, bumps) with
    the real CUDA kernel of a fresh spec of the models' entries, the driver side recorded."""
    _, ops = pkg
    handles = {0: 0x100, 1: 0x200}
    bumps: list[tuple[Any, ...]] = []
    rec = _RecordingKernel()

    class Crate:
        _modules = {0: "module", 1: "module"}

    def bump(ts: tuple[Any, ...]) -> None:
        bumps.append(tuple(map(id, ts)))  # (not the tensors: a freed one's id must be free to reuse)
        for t in ts:
            t.v += 1

    monkeypatch.setattr(khal_torch, "_raw_stream", lambda dev: handles[dev])
    monkeypatch.setattr(khal_torch, "_bump", bump)
    monkeypatch.setattr(khal_torch, "_streams", {})
    monkeypatch.setattr(khal_torch, "_stream_for", lambda spec, dev, h: ("stream", dev, h))
    impls: dict[str, Any] = {}

    def call(name: str, threads: int, *args: Any) -> None:
        if name not in impls:
            s = ops._specs[name]
            spec = _OpSpec(s.namespace, s.op_name, s.crate, s.entry, rec, s.arg_names, s.schema,  # type: ignore[arg-type]
                           s.mutates, s.first_tensor, s.reinterpret, s.tensors, s.written, crate_kernels=Crate())
            impls[name] = khal_torch._make_cuda_impl(spec)
        impls[name](threads, *args)

    return call, rec, handles, bumps


def _kinds(rec: _RecordingKernel) -> list[tuple[str, Any]]:
    out = [(kind, stream) for kind, _, _, stream in rec.calls]
    rec.calls.clear()
    return out


def test_an_argument_set_seen_twice_is_bound_once_and_reused(fast_op: Any) -> None:
    call, rec, handles, bumps = fast_op
    x, y, p = _CudaTensor(0x1000), _CudaTensor(0x2000), _CudaTensor(0x3000, n=4)
    s0 = ("stream", 0, 0x100)
    for n in (8, 8, 8, 16):
        call("saxpy", n, x, y, p)
    assert _kinds(rec) == [("typed", s0), ("bound", s0), ("bound", s0), ("bound", s0)]
    assert rec.binds == 1
    assert bumps == [(id(y),)] * 4 and (x.v, y.v, p.v) == (0, 4, 0)  # the written tensor, after each launch
    y.v += 1  # an in-place op elsewhere (y.add_(1)): same facts, the bound launch still holds
    call("saxpy", 8, x, y, p)
    assert _kinds(rec) == [("bound", s0)] and rec.binds == 1
    y.v, y.n = y.v + 1, 4  # resize_(4): the launch would pack another count
    call("saxpy", 8, x, y, p)
    assert _kinds(rec) == [("bound", s0)] and rec.binds == 2  # bound again, on the new facts
    y.ptr = 0x9000  # .data = other (the version does not move)
    call("saxpy", 8, x, y, p)
    assert rec.binds == 3
    call("saxpy", 8, x, _CudaTensor(0x2000), p)  # another tensor object: not this argument set
    assert _kinds(rec)[-1] == ("typed", s0) and rec.binds == 3


def test_a_new_tensor_each_call_is_never_bound(fast_op: Any) -> None:
    """A compiled graph hands the op a new intermediate each call, often at the address (id) of
    the one freed after the last call: that is no argument set seen twice."""
    call, rec, _, _ = fast_op
    x, p = _CudaTensor(0x1000), _CudaTensor(0x3000, n=4)
    for _ in range(6):
        y = _CudaTensor(0x2000)
        call("saxpy", 8, x, y, p)
        del y
    assert [k for k, _ in _kinds(rec)] == ["typed"] * 6 and rec.binds == 0
    ys = [_CudaTensor(0x2000), _CudaTensor(0x2100)]  # ping-pong between two buffers: both bound
    for i in range(6):
        call("saxpy", 8, x, ys[i % 2], p)
    assert [k for k, _ in _kinds(rec)] == ["typed", "typed", "bound", "bound", "bound", "bound"] and rec.binds == 2


def test_sets_used_in_turn_are_each_bound_and_accept_the_ops_own_bumps(fast_op: Any) -> None:
    """Four argument sets in turn sharing the written tensor (a model's layers writing one
    buffer): each is bound, and the version bump one set's launch made is accepted by the next
    set without reading the tensor's facts again; an in-place op by anything else is not."""
    call, rec, _, bumps = fast_op
    y = _CudaTensor(0x2000)
    sets = [(_CudaTensor(0x1000 + 0x100 * k), y, _CudaTensor(0x3000 + 0x100 * k, n=4)) for k in range(4)]
    for x, yy, p in sets * 2:
        call("saxpy", 8, x, yy, p)
    assert [k for k, _ in _kinds(rec)] == ["typed"] * 4 + ["bound"] * 4 and rec.binds == 4
    reads = _CudaTensor.numel_reads
    for x, yy, p in sets * 3:
        call("saxpy", 8, x, yy, p)
    assert [k for k, _ in _kinds(rec)] == ["bound"] * 12 and rec.binds == 4
    assert _CudaTensor.numel_reads == reads  # y's version moved under every set: no facts read for it
    assert y.v == len(bumps) == 20
    y.v += 1  # an in-place op elsewhere (y.mul_(2)): the same facts, read again, then bound still
    call("saxpy", 8, *sets[0])
    assert _CudaTensor.numel_reads > reads and _kinds(rec) == [("bound", ("stream", 0, 0x100))]
    assert rec.binds == 4


def test_a_bump_of_the_ops_own_launch_is_not_taken_for_facts_it_did_not_check(fast_op: Any) -> None:
    """Set A was bound while y held 8 elements; y is resized, set B bound on the new size and
    launched: y's version is the one B's launch left, but A packed the old size: A is not used."""
    call, rec, _, _ = fast_op
    y = _CudaTensor(0x2000)
    a = (_CudaTensor(0x1000), y, _CudaTensor(0x3000, n=4))
    b = (_CudaTensor(0x1100), y, _CudaTensor(0x3100, n=4))
    for _ in range(2):
        call("saxpy", 8, *a)
    y.v, y.n = y.v + 1, 4  # y.resize_(4)
    for _ in range(2):
        call("saxpy", 8, *b)
    assert rec.binds == 2
    rec.calls.clear()
    call("saxpy", 8, *a)  # A's bound launch would pack 8 elements: bound again on 4
    assert rec.binds == 3 and rec.calls[-1][0] == "bound" and rec.calls[-1][2][1] is y


def test_a_bound_launch_follows_the_current_stream_and_device(fast_op: Any) -> None:
    call, rec, handles, _ = fast_op
    x, y, p = _CudaTensor(0x1000), _CudaTensor(0x2000), _CudaTensor(0x3000, n=4)
    call("saxpy", 8, x, y, p)
    call("saxpy", 8, x, y, p)
    handles[0] = 0x101  # with torch.cuda.stream(side):
    call("saxpy", 8, x, y, p)
    call("saxpy", 8, x, y, p)
    call("saxpy", 8, x, y, p)
    handles[0] = 0x100  # back on the first stream: its bound launch is still kept
    call("saxpy", 8, x, y, p)
    a, b = ("stream", 0, 0x100), ("stream", 0, 0x101)
    assert _kinds(rec) == [("typed", a), ("bound", a), ("typed", b), ("bound", b), ("bound", b), ("bound", a)]
    assert rec.binds == 2
    u, v, q = _CudaTensor(0x5000, device=1), _CudaTensor(0x6000, device=1), _CudaTensor(0x7000, n=4, device=1)
    for _ in range(3):
        call("saxpy", 8, u, v, q)
    c = ("stream", 1, 0x200)
    assert _kinds(rec) == [("typed", c), ("bound", c), ("bound", c)]


def test_scalars_match_by_value_but_not_a_signed_zero(fast_op: Any) -> None:
    call, rec, _, _ = fast_op
    y = _CudaTensor(0x2000)
    s = ("stream", 0, 0x100)
    for value in ("2.5", "2.5", "2.5"):
        call("core_scale", 8, y, float(value))  # a new float object each call
    assert _kinds(rec) == [("typed", s), ("bound", s), ("bound", s)] and rec.binds == 1
    call("core_scale", 8, y, -0.0)
    call("core_scale", 8, y, -0.0)
    call("core_scale", 8, y, 0.0)
    got = [(kind, args[1]) for kind, _, args, _ in rec.calls]
    assert [k for k, _ in got] == ["typed", "bound", "typed"] and rec.binds == 2  # 0.0 is another set
    assert [repr(v) for _, v in got] == ["-0.0", "-0.0", "0.0"]  # each launch packs its own zero


def test_a_dtype_changed_at_the_same_address_is_not_the_bound_set(fast_op: Any) -> None:
    """#38 item 4: ``t.data = t.data.view(torch.int32)`` keeps the version and the address: the
    bound launch packed for float32 is not repeated on int32 data (also when the version moved by
    the op's own bump, which the bound set accepts without reading the facts)."""
    call, rec, _, _ = fast_op
    x, y, p = _CudaTensor(0x1000), _CudaTensor(0x2000), _CudaTensor(0x3000, n=4)
    for _ in range(3):
        call("saxpy", 8, x, y, p)
    assert rec.binds == 1
    x.dtype = torch.int32  # x.data = x.data.view(torch.int32): no version bump, the same pointer
    call("saxpy", 8, x, y, p)
    assert rec.binds == 2 and rec.calls[-1][0] == "bound"  # bound again on the new facts (the kernel's checks)
    y.dtype = torch.int32  # y's version moved by the op's own bump since the bind (the accepted case)
    call("saxpy", 8, x, y, p)
    assert rec.binds == 3


def test_inference_tensors_are_never_bound(fast_op: Any) -> None:
    call, rec, _, bumps = fast_op
    x, y, p = _CudaTensor(0x1000), _CudaTensor(0x2000), _CudaTensor(0x3000, n=4)
    y.inference = True  # no version counter: nothing could tell an in-place change
    for _ in range(3):
        call("saxpy", 8, x, y, p)
    assert [k for k, _ in _kinds(rec)] == ["typed"] * 3 and rec.binds == 0
    y.inference = False  # (swapped back): the set was seen, so it is bound now
    call("saxpy", 8, x, y, p)
    call("saxpy", 8, x, y, p)
    assert rec.binds == 1
    y.inference = True  # torch.utils.swap_tensors made it one: reading _version now raises
    call("saxpy", 8, x, y, p)
    assert [k for k, _ in _kinds(rec)] == ["bound", "bound", "typed"] and rec.binds == 1


def test_a_first_launch_inside_a_capture_is_refused_before_the_kernel_runs(
        fast_op: Any, pkg: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime.errors import CaptureError

    call, rec, _, _ = fast_op
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    x, y, p = _CudaTensor(0x1000, device=2), _CudaTensor(0x2000, device=2), _CudaTensor(0x3000, n=4, device=2)
    monkeypatch.setattr(khal_torch, "_raw_stream", lambda dev: 0x300)
    with pytest.raises(CaptureError, match=r"used for the first time on cuda:2 inside a graph capture"):
        call("saxpy", 8, x, y, p)
    assert rec.calls == [] and rec.binds == 0
    call("saxpy", 8, _CudaTensor(0x1000), _CudaTensor(0x2000), _CudaTensor(0x3000, n=4))  # cuda:0 is loaded
    assert len(rec.calls) == 1


@pytest.mark.slow
def test_inductor_calls_the_op_on_the_callers_tensors_without_copies(pkg: tuple[Any, Any],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor (on CPU: its C++ backend) re-inplaces the functionalized call: the compiled code
    calls the operator through the dispatcher on the caller's tensor and an intermediate,
    and copies nothing back."""
    from torch._inductor.utils import run_and_get_code

    ks, ops = pkg
    cpu = _CpuKernels()
    monkeypatch.setattr(khal_torch, "_launch", cpu)
    ns = getattr(torch.ops, ks.package)

    def step(x: Any, w: Any, y: Any, p: Any) -> Any:
        h = x @ w
        ns.saxpy(h.numel(), h.view(-1), y, p)  # y = a h + y
        return y.sum()

    p = khal_torch.uniform(ks.saxpy, SaxpyParams(a=2.0), "cpu")
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    y_eager, y_comp = torch.ones(16), torch.ones(16)
    want = step(x, w, y_eager, p)
    torch._dynamo.reset()
    got, codes = run_and_get_code(torch.compile(step, fullgraph=True, backend="inductor"), x, w, y_comp, p)
    assert torch.equal(y_comp, y_eager) and torch.allclose(got, want)
    code = "\n".join(codes)
    assert f"torch.ops.{ks.package}.saxpy.default(" in code
    assert "copy_(" not in code and "clone(" not in code, code
