"""Host code as written (#36 item 4) and companions (item 5, run-time side), on the fake driver.

A package whose own host module is Triton code (``import triton``, ``@triton.jit``,
``kernel[grid](..., BLOCK=...)``) runs unchanged against its built variants: in a process where
Triton is not installed (``KHAL_TEST_HIDE=triton``: khal's stand-in serves the imports while the
module executes, and is gone after), and in one where it is installed but ``triton.compile``
raises. A companion built for another version of the library, or other module files, refuses to
serve it by name. A served module imported before ``load()`` is patched at ``load()``.

The tests run against ``CrateKernels.triton_functions()``; where the tree does not have it yet,
a stand-in ``TritonFunction`` (tests/helpers/triton_serving.py) plays it.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import khal_runtime
from khal_runtime import triton_serve, triton_standin
from khal_runtime.errors import ManifestError, TritonServeError, TritonStandInError
from tests.helpers.fakecuda import FakeDriver, fake, ptx_param_layouts  # noqa: F401
from tests.helpers.runtime import Tensor
from tests.helpers.triton_serving import (
    OPS,
    drop_standin_functions,
    reset_serving,
    run_fake,
    sha256,
    use_standin_functions,
    write_served_package,
)

_names = itertools.count()


def _name(stem: str) -> str:
    """A package name no other test (of any process) imported."""
    return f"khal_{stem}{next(_names)}_{os.getpid()}"


@pytest.fixture
def serving(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """``tmp_path`` on ``sys.path``, the stand-in functions where the tree has none, and serving
    forgotten after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    added = use_standin_functions()
    yield tmp_path
    reset_serving()
    if added:
        drop_standin_functions()
    for name in [m for m in sys.modules if m.startswith("khal_serve") or m.startswith("khal_lib")]:
        del sys.modules[name]


def _tensors() -> tuple[Tensor, Tensor, Tensor]:
    """x, y, out: torch-like tensors of 1024 float32 at 16-byte-aligned addresses."""
    return Tensor(0x10000, 1024), Tensor(0x20000, 1024), Tensor(0x30000, 1024)


def _layouts(drv: FakeDriver, pkg: Path) -> None:
    for ptx in pkg.rglob("*.ptx"):
        drv.layouts.update({f"FUNC:{n}": layout for n, layout in ptx_param_layouts(ptx.read_bytes()).items()})


#: the script of both processes: import the host module, call its host functions, report
_RUN = '''
import importlib.util, json
import {pkg}.ops as ops
from {pkg} import kernels
from tests.helpers.runtime import Tensor
fn = kernels.crates["c"].triton_functions()[("{pkg}.ops", "add_kernel")]
x, y, out = Tensor(0x10000, 1024), Tensor(0x20000, 1024), Tensor(0x30000, 1024)
ops.add(x, y, out, 1024)
ops.add_by_meta(x, y, out, 1000)
print(json.dumps({{
    "served": ops.add_kernel is fn,
    "host": type(fn.host).__module__ + "." + type(fn.host).__name__,
    "launches": [[str(l["f"]), list(l["grid"])] for l in drv.launches],
    "symbols": {{e.name: e.symbol for e in kernels.manifest.crates[0].entries}},
    "find_spec": repr(importlib.util.find_spec("triton")),
    "in_modules": sorted(m for m in sys.modules if m == "triton" or m.startswith("triton.")),
    "ops_triton": type(ops.triton).__name__ + ":" + str(getattr(ops.triton, "__version__", None)),
    "calls": [{{k: (v.data_ptr() if hasattr(v, "data_ptr") else v) for k, v in c.items() if k != "stream"}}
              for c in getattr(fn, "calls", [])],
}}))
'''


def _report(proc: Any) -> dict[str, Any]:
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _check_launches(out: dict[str, Any]) -> None:
    sym = out["symbols"]
    # n = 1024: every pointer aligned and n divisible by 16 -> the as-written variant; n = 1000 -> its twin
    assert out["launches"] == [[f"FUNC:{sym['add_kernel']}", [4, 1, 1]], [f"FUNC:{sym['add_kernel__base']}", [4, 1, 1]]]
    assert out["served"] is True


def test_host_code_as_written_runs_without_triton_installed(tmp_path: Path) -> None:
    """(a) and (b): no Triton in the process; the host module imports triton (the stand-in), its
    kernel global is the crate's function, both host calls launch the built variants, and after
    the import no ``triton`` is left: ``find_spec`` finds none."""
    pkg = _name("serve_hidden")
    write_served_package(tmp_path, pkg)
    out = _report(run_fake(tmp_path, _RUN.format(pkg=pkg), hide_triton=True))
    _check_launches(out)
    assert out["host"] == "khal_runtime.triton_standin.runtime.JITFunction"
    assert out["find_spec"] == "None"
    assert out["in_modules"] == []
    assert out["ops_triton"] == "module:3.6.0"  # the module keeps the stand-in it imported
    # Triton's call as written: the constexpr and the option by keyword, arguments by keyword
    assert out["calls"] in ([], [  # (the real TritonFunction keeps no record of calls)
        {"x_ptr": 0x10000, "y_ptr": 0x20000, "out_ptr": 0x30000, "n": 1024, "BLOCK": 256, "num_warps": 4},
        {"x_ptr": 0x10000, "y_ptr": 0x20000, "out_ptr": 0x30000, "n": 1000, "BLOCK": 256}])


def test_host_code_as_written_runs_with_triton_installed_and_its_compiler_unreachable(tmp_path: Path) -> None:
    """(a): Triton installed, ``triton.compile`` patched to raise: the module's kernels are real
    JITFunctions until it has run, then the crate's functions; nothing compiles."""
    pytest.importorskip("triton", reason="Triton is not installed")
    pkg = _name("serve_real")
    write_served_package(tmp_path, pkg)
    script = '''
import triton, triton.compiler
def unreachable(*a, **k):
    raise AssertionError("triton.compile was called")
triton.compile = unreachable
triton.compiler.compile = unreachable
''' + _RUN.format(pkg=pkg)
    out = _report(run_fake(tmp_path, script, hide_triton=False))
    _check_launches(out)
    assert out["host"] == "triton.runtime.jit.JITFunction"
    assert out["ops_triton"].startswith("module:3.")


def test_torch_sees_no_triton_after_a_served_module_ran(tmp_path: Path) -> None:
    """(b) with torch: torch imported while the stand-in is visible (by the served module, after its
    ``import triton``) and asked after: no Triton."""
    pytest.importorskip("torch", reason="torch is not installed")
    pkg = _name("serve_torch")
    write_served_package(tmp_path, pkg, ops=OPS.replace("import triton\n", "import triton\nimport torch\n", 1))
    out = run_fake(tmp_path, f'''
import {pkg}.ops
from torch.utils._triton import has_triton, has_triton_package
print(has_triton_package(), has_triton())
''', hide_triton=True)
    assert out.stdout.split()[-2:] == ["False", "False"]


def test_a_module_of_another_package_imported_meanwhile_sees_no_stand_in(tmp_path: Path) -> None:
    """Only the served package's modules see the stand-in: a module of another package that the
    served module imports after ``import triton`` finds no Triton, and a module of the served
    package it imports finds the stand-in."""
    pkg = _name("serve_scope")
    write_served_package(tmp_path, pkg, ops="import triton\nimport khal_other_probe\nfrom . import helper\n" + OPS)
    (tmp_path / "khal_other_probe.py").write_text(
        "import importlib.util\nSPEC = importlib.util.find_spec('triton')\n"
        "try:\n    import triton\n    IMPORTED = True\nexcept ImportError:\n    IMPORTED = False\n")
    (tmp_path / pkg / "helper.py").write_text("import triton\nBLOCK = triton.next_power_of_2(200)\n")
    out = run_fake(tmp_path, f'''
import {pkg}.ops
import khal_other_probe, {pkg}.helper
print(khal_other_probe.SPEC, khal_other_probe.IMPORTED, {pkg}.helper.BLOCK, "triton" in sys.modules)
''', hide_triton=True)
    assert out.stdout.split()[-4:] == ["None", "False", "256", "False"]


def test_an_unserved_kernel_and_a_triton_api_the_stand_in_lacks_are_named(tmp_path: Path) -> None:
    """Without Triton: launching a kernel no package serves, or host code calling a Triton API
    beyond the stand-in's, raises TritonStandInError naming it."""
    pkg = _name("serve_limits")
    ops = OPS + '''

@triton.jit
def other_kernel(x_ptr, BLOCK: tl.constexpr):
    pass


def unserved():
    other_kernel[(1,)](None, BLOCK=16)


def props():
    return triton.runtime.driver.active.get_current_device()
'''
    write_served_package(tmp_path, pkg, ops=ops)
    out = run_fake(tmp_path, f'''
import {pkg}.ops as ops
from khal_runtime.errors import TritonStandInError
for f in (ops.unserved, ops.props):
    try:
        f()
    except TritonStandInError as e:
        print("ERR", e)
''', hide_triton=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert len(lines) == 2
    assert f"kernel {pkg}.ops.other_kernel: no loaded khal package serves it, and Triton is not installed" in lines[0]
    assert "triton.runtime.driver.active.get_current_device: Triton is not installed" in lines[1]


def test_a_served_module_imported_before_load_is_patched_at_load(serving: Path, fake: FakeDriver) -> None:
    """(d): the host module imported (with Triton) before the package that serves it loads: its
    kernel global, and another module's name for the same kernel, are replaced at ``load()``."""
    pytest.importorskip("triton", reason="Triton is not installed")
    lib = _name("lib_before")
    (serving / lib).mkdir()
    (serving / lib / "__init__.py").write_text("")
    (serving / lib / "ops.py").write_text(OPS)
    (serving / lib / "user.py").write_text("from .ops import add_kernel as the_kernel\n")
    ops = importlib.import_module(f"{lib}.ops")
    user = importlib.import_module(f"{lib}.user")
    original = ops.add_kernel
    assert type(original).__name__ == "JITFunction"
    companion = _name("serve_companion")
    pkg = write_served_package(serving, companion, kernel_package=companion, module=f"{lib}.ops")
    _layouts(fake, pkg)
    ks = khal_runtime.load(companion)
    fn = ks.crates["c"].triton_functions()[(f"{lib}.ops", "add_kernel")]
    assert ops.add_kernel is fn and user.the_kernel is fn
    assert fn.host is original
    ops.add(*_tensors(), 1024)
    assert [launch["f"] for launch in fake.launches] == [f"FUNC:{ks.manifest.crates[0].entries[0].symbol}"]


def test_a_served_module_imported_after_load_is_patched_when_it_runs(serving: Path, fake: FakeDriver) -> None:
    """The finder: the host module imported after ``load()`` has the crate's function, and keeps its
    own loader (``__loader__``, ``__spec__.loader``: what inspect and importlib.resources read)."""
    pytest.importorskip("triton", reason="Triton is not installed")
    pkg = _name("serve_after")
    write_served_package(serving, pkg)
    _layouts(fake, serving / pkg)
    importlib.import_module(pkg)
    ops = importlib.import_module(f"{pkg}.ops")
    ks = sys.modules[pkg].kernels  # type: ignore[attr-defined]
    assert ops.add_kernel is ks.crates["c"].triton_functions()[(f"{pkg}.ops", "add_kernel")]
    assert type(ops.__loader__).__name__ == "SourceFileLoader" and ops.__spec__.loader is ops.__loader__
    # (other packages a test of this process loaded may be served too)
    assert triton_serve.served_modules()[f"{pkg}.ops"] == ("add_kernel",)


def test_the_kernel_under_its_decorators_is_found_by_its_function(serving: Path, fake: FakeDriver) -> None:
    """A kernel bound under another name than its function's (``add_kernel = heuristics(jit(_impl))``):
    the global holding the outermost object is replaced, that object adopted (its heuristics give
    the call its constexpr), the plain function left alone."""
    pytest.importorskip("triton", reason="Triton is not installed")
    pkg = _name("serve_decorated")
    ops_text = '''import triton
import triton.language as tl


def _impl(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pass


add_kernel = triton.heuristics({"BLOCK": lambda args: 256})(triton.jit(_impl))


def add(x, y, out, n):
    add_kernel[(4,)](x, y, out, n)
'''
    write_served_package(serving, pkg, ops=ops_text, qualname="_impl", heuristics=("BLOCK",))
    _layouts(fake, serving / pkg)
    ops = importlib.import_module(f"{pkg}.ops")
    ks = sys.modules[pkg].kernels  # type: ignore[attr-defined]
    fn = ks.crates["c"].triton_functions()[(f"{pkg}.ops", "_impl")]
    assert ops.add_kernel is fn and callable(ops._impl) and ops._impl is not fn
    assert type(fn.host).__name__ == "Heuristics" and fn.host.fn.fn is ops._impl
    ops.add(*_tensors(), 1024)
    assert [launch["f"] for launch in fake.launches] == [f"FUNC:{ks.manifest.crates[0].entries[0].symbol}"]


def test_loading_the_package_again_serves_its_new_functions(serving: Path, fake: FakeDriver) -> None:
    """A second ``load()`` of the package: the module's kernel is the new crate's function, which
    adopted the original kernel (not the first function)."""
    pytest.importorskip("triton", reason="Triton is not installed")
    pkg = _name("serve_again")
    write_served_package(serving, pkg)
    _layouts(fake, serving / pkg)
    ops = importlib.import_module(f"{pkg}.ops")
    first = ops.add_kernel
    again = khal_runtime.load(pkg)
    fn = again.crates["c"].triton_functions()[(f"{pkg}.ops", "add_kernel")]
    assert ops.add_kernel is fn and fn is not first and fn.host is first.host
    assert type(fn.host).__name__ == "JITFunction"


def test_a_served_name_that_is_no_kernel_is_said_and_left(serving: Path, fake: FakeDriver) -> None:
    pkg = _name("serve_nokernel")
    write_served_package(serving, pkg, ops="def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK):\n    pass\n")
    _layouts(fake, serving / pkg)
    with pytest.warns(RuntimeWarning, match=rf"serves {pkg}\.ops\.add_kernel, but {pkg}\.ops holds function, "
                                            "not a Triton kernel: its launches are not served"):
        ops = importlib.import_module(f"{pkg}.ops")
    assert type(ops.add_kernel).__name__ == "function"


# --- companions -------------------------------------------------------------------------------------

def _library(root: Path, name: str, version: str) -> Path:
    """An installed distribution ``name`` (a dist-info with its RECORD) holding ``<name>/ops.py``."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    (root / name / "ops.py").write_text(OPS)
    dist = root / f"{name}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (dist / "RECORD").write_text(f"{name}/__init__.py,,\n{name}/ops.py,,\n")
    return root / name / "ops.py"


def _companion(serving: Path, fake: FakeDriver, lib: str, version: str, digest: str) -> str:
    companion = _name("serve_companion")
    pkg = write_served_package(serving, companion, kernel_package=companion, module=f"{lib}.ops",
                               serves={"distribution": lib, "version": version,
                                       "files": {f"{lib}/ops.py": digest}})
    _layouts(fake, pkg)
    return companion


def test_a_companion_serves_the_library_version_it_was_built_for(serving: Path, fake: FakeDriver) -> None:
    pytest.importorskip("triton", reason="Triton is not installed")
    lib = _name("lib_ok")
    ops_file = _library(serving, lib, "1.2.0")
    importlib.invalidate_caches()
    companion = _companion(serving, fake, lib, "1.2.0", sha256(ops_file))
    importlib.import_module(companion)
    ops = importlib.import_module(f"{lib}.ops")
    assert type(ops.add_kernel).__name__ != "JITFunction"
    ops.add(*_tensors(), 1024)
    assert len(fake.launches) == 1


def test_a_companion_for_another_library_version_refuses_by_name(serving: Path, fake: FakeDriver) -> None:
    """(c): built for 1.2.0, 1.3.0 installed: the companion's import fails naming both versions and
    what to do, and nothing of the library is served."""
    lib = _name("lib_version")
    ops_file = _library(serving, lib, "1.3.0")
    importlib.invalidate_caches()
    companion = _companion(serving, fake, lib, "1.2.0", sha256(ops_file))
    with pytest.raises(TritonServeError) as err:
        importlib.import_module(companion)
    msg = str(err.value)
    assert f"package {companion!r} (crate 'c') serves the Triton kernels of {lib} 1.2.0, but {lib} 1.3.0 is installed" \
        in msg
    assert f"pip install '{lib}==1.2.0'" in msg and "rebuild" in msg
    assert isinstance(err.value, ImportError)
    assert not [m for m in triton_serve.served_modules() if m.split(".")[0] == lib]  # none of the library's


def test_a_companion_whose_library_files_differ_refuses_by_name(serving: Path, fake: FakeDriver) -> None:
    """(c): the same version, an edited module file: refused naming the file."""
    lib = _name("lib_digest")
    ops_file = _library(serving, lib, "1.2.0")
    importlib.invalidate_caches()
    companion = _companion(serving, fake, lib, "1.2.0", "0" * 64)
    with pytest.raises(TritonServeError, match=rf"{lib} 1\.2\.0 is installed, but its {lib}/ops\.py .* is not the file"):
        importlib.import_module(companion)
    assert not [m for m in triton_serve.served_modules() if m.split(".")[0] == lib]  # none of the library's


def test_a_companion_of_a_library_not_installed_refuses_by_name(serving: Path, fake: FakeDriver) -> None:
    lib = _name("lib_missing")
    companion = _companion(serving, fake, lib, "1.2.0", "0" * 64)
    with pytest.raises(TritonServeError, match=rf"{lib} is not installed: pip install '{lib}==1\.2\.0'"):
        importlib.import_module(companion)


# --- the stand-in ------------------------------------------------------------------------------------

def test_the_stand_in_objects_carry_what_the_run_time_reads() -> None:
    tl = triton_standin.module("triton.language")
    triton = triton_standin.module("triton")

    def f(x_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        pass

    jit = triton.jit(do_not_specialize=["n"])(f)
    assert jit.fn is f and jit.arg_names == ["x_ptr", "n", "BLOCK"] and jit.do_not_specialize == ["n"]
    assert triton.jit(f).do_not_specialize == []
    h = triton.heuristics({"EVEN": lambda args: args["n"] % 16 == 0})(jit)
    assert h.fn is jit and h.values["EVEN"]({"n": 32}) is True
    a = triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2, maxnreg=128)], key=["n"])(h)
    c = a.configs[0]
    assert (a.fn, a.keys, c.kwargs, c.num_warps, c.num_stages, c.num_ctas, c.maxnreg) == \
        (h, ["n"], {"BLOCK": 64}, 2, 3, 1, 128)
    assert triton.cdiv(1000, 256) == 4 and [triton.next_power_of_2(n) for n in (0, 1, 5, 64, 65)] == [0, 1, 8, 64, 128]
    assert tl.constexpr(0).value == 0 and tl.constexpr(tl.constexpr(3)) == 3
    assert tl.float32.name == "fp32" and str(tl.bfloat16) == "bf16" and tl.float8e4nv.name == "fp8e4nv"
    assert tl.int8 == tl.dtype("int8") and tl.float32 != tl.float16
    with pytest.raises(TritonStandInError, match=r"triton\.language\.program_id: Triton is not installed"):
        tl.program_id(0)
    with pytest.raises(TritonStandInError, match="cannot call a @triton.jit function outside a kernel"):
        jit(1, 2)


def test_the_stand_in_dtypes_are_tritons() -> None:
    """Every dtype value of the installed ``triton.language``, with its name and width."""
    tl = pytest.importorskip("triton.language", reason="Triton is not installed")
    mine = triton_standin.module("triton.language")
    real = {n: getattr(tl, n) for n in dir(tl) if isinstance(getattr(tl, n), tl.dtype)}
    assert real
    for n, d in real.items():
        s = getattr(mine, n)
        assert isinstance(s, mine.dtype), n
        assert (s.name, str(s), repr(s)) == (d.name, str(d), repr(d)), n
        assert getattr(s, "primitive_bitwidth", None) == getattr(d, "primitive_bitwidth", None), n
        assert (s.is_floating(), s.is_int(), s.is_ptr()) == (d.is_floating(), d.is_int(), d.is_ptr()), n


def test_liger_kernels_ops_import_without_triton(tmp_path: Path) -> None:
    """A real library's host modules (Liger-Kernel's ``liger_kernel.ops``, every module of it, as
    installed: never copied here) import through the stand-in when one of them is served and
    Triton is not installed; afterwards no Triton is left. Skipped where Liger-Kernel or torch is
    not installed (``pip install liger-kernel --no-deps`` beside torch)."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("liger_kernel", reason="Liger-Kernel is not installed")
    companion = _name("serve_liger")
    write_served_package(tmp_path, companion, kernel_package=companion, module="liger_kernel.ops.rms_norm",
                         qualname="_rms_norm_forward_kernel")
    out = run_fake(tmp_path, f'''
import importlib.util
import {companion}
import liger_kernel.ops.rms_norm as r
from torch.utils._triton import has_triton_package
print(type(r._rms_norm_forward_kernel).__name__ != "JITFunction", type(r._rms_norm_backward_kernel).__module__,
      importlib.util.find_spec("triton"), has_triton_package())
''', hide_triton=True)
    assert out.stdout.split()[-4:] == ["True", "khal_runtime.triton_standin.runtime", "None", "False"]


def test_a_recorded_process_runs_tritons_jit_not_the_packages_kernels(serving: Path, fake: FakeDriver,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """While ``python -m hatch_khal triton record`` runs (``KHAL_TRITON_RECORDING``), a built package's
    host module keeps Triton's own kernels (the recording needs the JIT's launches), and a package not
    built yet loads as unbuilt instead of failing at its import."""
    pytest.importorskip("triton", reason="Triton is not installed")
    monkeypatch.setenv("KHAL_TRITON_RECORDING", str(serving / "recording.json"))
    pkg = _name("serve_recorded")
    write_served_package(serving, pkg)
    _layouts(fake, serving / pkg)
    importlib.import_module(pkg)
    ops = importlib.import_module(f"{pkg}.ops")
    assert type(ops.add_kernel).__name__ == "JITFunction"
    assert triton_serve.served_modules().get(f"{pkg}.ops") is None
    unbuilt = _name("serve_unbuilt")
    (serving / unbuilt).mkdir()
    (serving / unbuilt / "__init__.py").write_text("import khal_runtime\nkernels = khal_runtime.load(__name__)\n")
    mod = importlib.import_module(unbuilt)
    with pytest.raises(ManifestError, match="is not built yet .* run under Triton's JIT"):
        mod.kernels.add_kernel  # type: ignore[attr-defined]  # noqa: B018
