"""Typed kernel stubs (``hatch_khal.stubs``): generated from a manifest, deterministic, loadable,
and what mypy and pyright make of a client's calls (the good ones pass; a wrong call is reported
at the call, naming the entry where the checker names the callee).

The type checkers run in a subprocess; a test for one that is not installed (``pip install mypy
pyright``; pyright also needs ``node``) is skipped saying so."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from functools import lru_cache
from pathlib import Path

import pytest

from khal_runtime.manifest import MANIFEST_DIR, MANIFEST_NAME, Manifest, load_manifest

from hatch_khal.stubs import PY_TYPED, kernels_module, kernels_stub, stub_files
from tests.helpers.kernel_models import models_manifest, scalar, storage

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# the text
# ---------------------------------------------------------------------------------------------
def test_same_manifest_same_bytes_and_a_change_shows() -> None:
    a = kernels_stub(models_manifest(), module_name="khal_models_pkg._khal")
    assert a == kernels_stub(models_manifest(), module_name="khal_models_pkg._khal")  # equal manifests, equal bytes
    assert stub_files(models_manifest()) == stub_files(models_manifest())
    rebuilt = kernels_stub(models_manifest(build="v2"), module_name="khal_models_pkg._khal")
    changed = [(x, y) for x, y in zip(a.splitlines(), rebuilt.splitlines()) if x != y]
    assert len(a.splitlines()) == len(rebuilt.splitlines())
    assert changed and all("hash ``" in x and "hash ``" in y for x, y in changed)  # only the entry hashes moved
    entries = {"core": [("saxpy", (256, 1, 1), (storage("x"), storage("y", writable=True), scalar("a", "float32")))]}
    other = kernels_stub(models_manifest(entries=entries), module_name="khal_models_pkg._khal")
    assert "def __call__(self, n: IntScalar, x: DeviceArray, y: DeviceArray, a: FloatScalar, /, *, " in other
    assert "Uniform, /" not in other


def test_what_the_stub_says() -> None:
    m = models_manifest()
    text = kernels_stub(m, module_name="khal_models_pkg._khal")
    ast.parse(text)
    saxpy = m.crate("core").entry("saxpy")
    assert f'"""``saxpy`` of crate ``core`` (CUDA C++): block (256, 1, 1), hash ``{saxpy.hash}``.' in text
    assert "    - ``x``: storage float32, read only\n    - ``y``: storage float32, written by the kernel\n" \
           "    - ``params``: uniform SaxpyParams (4 bytes)\n" in text
    assert "    - ``h``: scalar bfloat16 (by value)\n    - ``z``: scalar complex64 (by value)\n" in text
    assert ("    def __call__(self, n: IntScalar, x: DeviceArray, y: DeviceArray, params: Uniform, /, *, "
            "stream: StreamLike = ...) -> None: ...") in text
    assert ("    def launch(self, grid: Dim3, block: Dim3 | None, x: DeviceArray, y: DeviceArray, params: Uniform, /, "
            "*, stream: StreamLike = ..., shared_mem: int = ...) -> None: ...") in text
    assert "    def bind(self, x: DeviceArray, y: DeviceArray, params: Uniform, /, *, stream: StreamLike = ...) " \
           "-> BoundLaunch: ..." in text
    assert ("    def dispatch_indirect(self, count: DeviceArray, x: DeviceArray, y: DeviceArray, params: Uniform, "
            "/, *, stream: StreamLike = ..., grid: Dim3 | None = ..., threads: bool = ..., "
            "host_read: bool | None = ...)") in text
    # scalars by family; a Slang entry alike
    assert "a: IntScalar, b: FloatScalar, c: IntScalar, d: FloatScalar, e: IntScalar, f: BoolScalar, g: FloatScalar, " \
           "h: FloatScalar, z: ComplexScalar, /" in text
    assert "class Kernel_shaders__affine(Kernel):\n    \"\"\"``affine`` of crate ``shaders`` (Slang)" in text
    # a keyword or a name the methods use is renamed (positional-only: callers never spell it)
    assert "def __call__(self, n: IntScalar, in_: DeviceArray, threads_: IntScalar, def_: IntScalar, /" in text
    # an entry two crates define is reached through crates only; crates as attributes; typed crates[...]
    kernels_cls = text[text.index("class Kernels(KernelSet):"):]
    assert "    saxpy: Kernel_core__saxpy\n" in kernels_cls and "    scale:" not in kernels_cls
    assert "In several crates, so only through ``crates``: scale." in kernels_cls
    assert "    core: Crate_core\n    extra: Crate_extra\n    shaders: Crate_shaders\n" in kernels_cls
    assert "    def __getitem__(self, key: Literal['extra']) -> Crate_extra: ..." in text
    assert "class Crate_extra(CrateKernels):" in text and "    scale: Kernel_extra__scale\n" in text
    assert text.endswith("\n\nkernels: Kernels\n")


def test_names_the_runtime_does_not_expose_are_left_out() -> None:
    entries = {
        "core": [("entries", (32, 1, 1), (storage("y", writable=True),)),   # a KernelSet attribute
                 ("name", (32, 1, 1), (storage("y", writable=True),)),      # a CrateKernels attribute
                 ("extra", (32, 1, 1), (storage("y", writable=True),))],    # the name of a crate
        "extra": [("ok", (32, 1, 1), (storage("y", writable=True),))],
        "my-crate": [("go", (32, 1, 1), (storage("y", writable=True),))],
    }
    text = kernels_stub(models_manifest(entries=entries), module_name="p._khal")
    ast.parse(text)
    kernels_cls = text[text.index("class Kernels(KernelSet):"):]
    assert "    entries:" not in kernels_cls and "    name: Kernel_core__name\n" in kernels_cls
    assert "    extra: Kernel_core__extra\n" in kernels_cls and "    extra: Crate_extra" not in kernels_cls
    assert "    my-crate" not in kernels_cls and "class Crate_my_crate(CrateKernels):" in text
    core = text[text.index("class Crate_core(CrateKernels):"):text.index("class Crate_extra")]
    assert "    name:" not in core and "    entries: Kernel_core__entries\n" in core
    assert "def __getitem__(self, key: Literal['my-crate']) -> Crate_my_crate: ..." in text


def test_module_name_must_be_a_module_name() -> None:
    with pytest.raises(ValueError, match="not a dotted module name"):
        kernels_stub(models_manifest(), module_name="not a module")


def test_stub_files_live_beside_the_manifest() -> None:
    files = stub_files(models_manifest())
    assert sorted(files) == [f"{MANIFEST_DIR}/__init__.py", f"{MANIFEST_DIR}/__init__.pyi"]
    assert files[f"{MANIFEST_DIR}/__init__.py"] == kernels_module().encode()
    assert b"Types of ``khal_models_pkg._khal.kernels``" in files[f"{MANIFEST_DIR}/__init__.pyi"]
    ast.parse(kernels_module())


# ---------------------------------------------------------------------------------------------
# a package using it, and the type checkers
# ---------------------------------------------------------------------------------------------
def _write_package(root: Path, manifest: Manifest, name: str) -> Path:
    pkg = root / name
    (pkg / MANIFEST_DIR).mkdir(parents=True)
    (pkg / "__init__.py").write_text("from ._khal import kernels\n\n__all__ = [\"kernels\"]\n")
    (pkg / PY_TYPED).write_text("")
    (pkg / MANIFEST_DIR / MANIFEST_NAME).write_text(manifest.to_json())
    for rel, data in stub_files(manifest).items():
        (pkg / rel).write_bytes(data)
    return pkg


GOOD = '''\
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

import khal_runtime
from khal_runtime import DeviceBuffer
from khal_models_pkg import kernels


class SaxpyParams(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float)]


class CaiArray:
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {}


def step(x: DeviceBuffer, y: DeviceBuffer, n: int) -> None:
    kernels.saxpy(n, x, y, SaxpyParams(2.0))
    kernels.saxpy(n, CaiArray(), y, b"\\0\\0\\0\\0", stream=None)
    kernels.saxpy(n, x, y, np.zeros((), dtype=[("a", np.float32)])[()])
    kernels.saxpy.launch(4, None, x, y, SaxpyParams(2.0), shared_mem=0)
    kernels.saxpy.launch((4, 1), 256, x, y, SaxpyParams(2.0))
    bound = kernels.saxpy.bind(x, y, SaxpyParams(2.0))
    bound(n)
    kernels.crates["core"].scale(n, y, 2.0)
    kernels.crates["extra"].scale(n, y, np.float32(0.5))
    kernels.core.saxpy(n, x, y, {"a": 1.0})
    kernels.scalars(1, y, 1, 2.0, np.int64(3), 4, 5, True, 7.0, 8.0, 1j)
    kernels.affine(n, x, y, y, {"scale": [1, 2, 3, 4]}, 1.0, -2, np.uint32(3))
    kernels.fill.dispatch_indirect(y, y, 7, threads=True)
    kernels["saxpy"](n, x, y, bytes(4))
    kernels.odd(n, y, 1, 2)
    kernels.saxpy.check_args(x, y, bytes(4))
    k: khal_runtime.Kernel = kernels.saxpy
    ks: khal_runtime.KernelSet = kernels
    print(k.name, ks.package, kernels.saxpy.block_size, kernels.crates["shaders"].affine.entry.hash)
'''

BAD = '''\
from __future__ import annotations

from khal_runtime import DeviceBuffer
from khal_models_pkg import kernels


def step(x: DeviceBuffer, y: DeviceBuffer, n: int) -> None:
    kernels.saxpy(n, x, y)
    kernels.fill(n, y, 1.5)
    kernels.crates["extra"].scale(n, "y", 2.0)
'''


@lru_cache(maxsize=None)
def _checker(name: str) -> list[str] | None:
    """The command running ``name`` (mypy / pyright) on this interpreter, None if it cannot run."""
    if name == "mypy":
        cmd = [sys.executable, "-m", "mypy"]
    else:
        exe = shutil.which("pyright", path=str(Path(sys.executable).parent)) or shutil.which("pyright")
        if exe is None:
            return None
        cmd = [exe, "--pythonpath", sys.executable]
    try:
        r = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cmd if r.returncode == 0 else None


def _require(name: str) -> list[str]:
    cmd = _checker(name)
    if cmd is None:
        pytest.skip(f"{name} cannot run here (pip install {name}{'; it needs node' if name == 'pyright' else ''})")
    return cmd


def _problems(name: str, cwd: Path, files: list[str], strict: bool = True) -> list[tuple[str, int, str]]:
    """(file, line, message) of every error the checker reports."""
    cmd = _require(name)
    env = dict(os.environ)
    env.pop("MYPYPATH", None)
    if name == "mypy":
        args = [*cmd, "--no-incremental", "--cache-dir", os.devnull, "--show-error-codes", "--no-error-summary",
                *(["--strict"] if strict else []), *files]
        r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        out = []
        for line in r.stdout.splitlines():
            parts = line.split(":", 3)
            if len(parts) == 4 and parts[2].strip() == "error":
                out.append((Path(parts[0]).name, int(parts[1]), parts[3].strip()))
        assert r.returncode in (0, 1), r.stdout + r.stderr
        return out
    args = [*cmd, "--outputjson", *files]
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    try:
        data = json.loads(r.stdout)
    except ValueError:
        raise AssertionError(r.stdout + r.stderr) from None
    return [(Path(d["file"]).name, d["range"]["start"]["line"] + 1, d["message"])
            for d in data["generalDiagnostics"] if d["severity"] == "error"]


@pytest.fixture(scope="module")
def models_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stub-client")
    _write_package(root, models_manifest(), "khal_models_pkg")
    (root / "good.py").write_text(GOOD)
    (root / "bad.py").write_text(BAD)
    return root


def test_the_generated_module_loads_the_package(models_project: Path) -> None:
    code = textwrap.dedent("""
        import sys
        import khal_models_pkg
        from khal_models_pkg._khal import kernels
        assert kernels is khal_models_pkg.kernels
        print(type(kernels).__name__, kernels.entries, 'torch' in sys.modules)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(models_project), str(ROOT),
                                                      os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], cwd=models_project, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "KernelSet ['affine', 'fill', 'integrate', 'odd', 'saxpy', 'scalars', 'total'] False"


@pytest.mark.parametrize("checker", ["mypy", "pyright"])
def test_type_checkers_accept_good_calls_and_report_a_wrong_one(models_project: Path, checker: str) -> None:
    assert _problems(checker, models_project, ["good.py"]) == []  # mypy: --strict, the stub included
    bad = _problems(checker, models_project, ["bad.py"])
    lines = BAD.splitlines()
    assert sorted({line for _, line, _ in bad}) == [8, 9, 10], bad
    assert all(f == "bad.py" for f, _, _ in bad)
    assert "kernels.saxpy(n, x, y)" in lines[8 - 1]
    by_line = {line: msg for _, line, msg in bad}
    if checker == "mypy":  # mypy names the callee: the entry's class
        assert by_line[8] == 'Too few arguments for "__call__" of "Kernel_core__saxpy"  [call-arg]'
        assert 'of "Kernel_extra__fill" has incompatible type "float"; expected "SupportsIndex"' in by_line[9]
    else:  # pyright reports the call site and the parameter
        assert "1 more positional argument" in by_line[8]
        assert 'parameter "value"' in by_line[9] and 'parameter "y"' in by_line[10]


# ---------------------------------------------------------------------------------------------
# 2-D / 3-D entries: the 2-D and 3-D launches of tests/packages/real_kernels_pkg, built alone
# ---------------------------------------------------------------------------------------------
REAL_GRIDS = ROOT / "tests" / "packages" / "real_kernels_pkg" / "kernels" / "real" / "grids.cu"

GOOD_ND = '''\
from __future__ import annotations

from khal_runtime import DeviceBuffer
from khal_real_kernels import kernels


def step(a: DeviceBuffer, out: DeviceBuffer, u: DeviceBuffer, count: DeviceBuffer, nx: int, ny: int) -> None:
    kernels.add2d((nx, ny), a, out, nx, ny)
    kernels.add2d([nx, ny], a, out, nx, ny, stream=None)
    shape: list[int] = [nx, ny]
    kernels.add2d(shape, a, out, nx, ny)
    kernels.grid3d((4, 4, 4), u, 4, 4, 4)
    kernels.batch_scale((nx, 3), a, out, nx)
    kernels.add2d.launch((4, 2), None, a, out, nx, ny)
    kernels.add2d.launch((4, 2), (16, 16), a, out, nx, ny)
    kernels.add2d.bind(a, out, nx, ny)((nx, ny))
    kernels.grid3d.bind(u, 4, 4, 4)((4, 4, 4))
    kernels.add2d.dispatch_indirect(count, a, out, nx, ny, host_read=True)
    kernels.iota_any_block(64, u, u)
    kernels.iota_any_block.bind(u, u)(64)
    kernels.iota_any_block.dispatch_indirect(count, u, u, threads=True)
    kernels.iota_any_block.launch(1, 512, u, u)
'''

BAD_ND = '''\
from __future__ import annotations

from khal_runtime import DeviceBuffer
from khal_real_kernels import kernels


def step(a: DeviceBuffer, out: DeviceBuffer, u: DeviceBuffer, count: DeviceBuffer, nx: int, ny: int) -> None:
    kernels.add2d(64, a, out, nx, ny)
    kernels.grid3d((4, 4), u, 4, 4, 4)
    kernels.iota_any_block((64, 1), u, u)
    kernels.add2d.dispatch_indirect(count, a, out, nx, ny)
    kernels.add2d.bind(a, out, nx, ny)(64)
'''


@pytest.fixture(scope="module")
def grids_project(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> tuple[Path, Manifest]:
    from tests.helpers.projects import make_project
    from tests.helpers.build import build, manifest_of

    tmp = tmp_path_factory.mktemp("grids")
    crates = '[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "real"\nsources = ["kernels/real/*.cu"]\n'
    proj = make_project(tmp / "proj", name="khal-real-kernels", crates=crates,
                        files={"kernels/real/grids.cu": REAL_GRIDS.read_text()})
    manifest = manifest_of(build(proj, session_cache)[0])[0].model_copy(update={"package": "khal_real_kernels"})
    root = tmp / "client"
    _write_package(root, manifest, "khal_real_kernels")
    (root / "good_nd.py").write_text(GOOD_ND)
    (root / "bad_nd.py").write_text(BAD_ND)
    return root, manifest


@pytest.mark.needs_nvrtc
def test_2d_and_3d_entries_take_their_count_as_the_runtime_does(grids_project: tuple[Path, Manifest]) -> None:
    _, m = grids_project
    real = m.crate("real")
    assert sorted((e.name, e.grid_dims, e.indirect_symbol is not None) for e in real.entries) == \
        [("add2d", 2, False), ("batch_scale", 2, False), ("grid3d", 3, False), ("iota_any_block", 1, True)]
    text = kernels_stub(m, module_name="khal_real_kernels._khal")
    ast.parse(text)
    def cls_of(entry: str) -> str:
        start = text.index(f"class Kernel_real__{entry}(Kernel):")
        return text[start:text.index("\n\n\nclass ", start)]

    cls = cls_of("add2d")
    assert "def __call__(self, n: Count2D, a: DeviceArray, out: DeviceArray, nx: IntScalar, ny: IntScalar, /, *, " \
           "stream: StreamLike = ...) -> None: ..." in cls
    assert "-> BoundLaunch2D: ..." in cls
    assert ("def dispatch_indirect(self, count: DeviceArray, a: DeviceArray, out: DeviceArray, nx: IntScalar, "
            "ny: IntScalar, /, *, stream: StreamLike = ..., threads: bool = ..., host_read: Literal[True]) "
            "-> None: ...") in cls
    assert "``kernels.add2d((nx, ny), a, out, nx, ny)`` runs a 2-D grid of threads " \
           "(grid = (ceil(nx / 16), ceil(ny / 16)))" in cls
    assert "No indirect variant (it is a 2-D entry" in cls
    cls3 = cls_of("grid3d")
    assert "def __call__(self, n: Count3D, out: DeviceArray, " in cls3 and "-> BoundLaunch3D: ..." in cls3
    one = cls_of("iota_any_block")
    assert "def __call__(self, n: IntScalar, out: DeviceArray" in one and "-> BoundLaunch: ..." in one
    assert "grid: Dim3 | None = ..., threads: bool = ..., host_read: bool | None = ...) -> None" in one


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("checker", ["mypy", "pyright"])
def test_type_checkers_check_2d_and_3d_counts(grids_project: tuple[Path, Manifest], checker: str) -> None:
    root, _ = grids_project
    assert _problems(checker, root, ["good_nd.py"]) == []
    bad = _problems(checker, root, ["bad_nd.py"])
    assert sorted({line for _, line, _ in bad}) == [8, 9, 10, 11, 12], bad
    if checker == "mypy":
        by_line = {line: msg for _, line, msg in bad}
        assert by_line[8].startswith('Argument 1 to "__call__" of "Kernel_real__add2d" has incompatible type "int"')
        assert by_line[11].startswith('Missing named argument "host_read" for "dispatch_indirect"')


# ---------------------------------------------------------------------------------------------
# the example wheel
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def example_with_stub(example_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("example-typed")
    with zipfile.ZipFile(example_wheel) as zf:
        zf.extractall(site)
    pkg = site / "example_shader_pkg"
    # the build wrote the typed module and the package ships py.typed: nothing is added here
    assert (pkg / MANIFEST_DIR / "__init__.pyi").is_file() and (pkg / MANIFEST_DIR / "__init__.py").is_file()
    assert (pkg / PY_TYPED).is_file()
    (site / "client.py").write_text(textwrap.dedent('''\
        from __future__ import annotations

        from khal_runtime import DeviceBuffer
        from example_shader_pkg import SaxpyParams, SimParams, elementwise_threads, kernels


        def step(x: DeviceBuffer, y: DeviceBuffer, particles: DeviceBuffer, n: int) -> None:
            kernels.saxpy(elementwise_threads(n), x, y, SaxpyParams(a=2.0))
            kernels.gelu(n, x, y)
            kernels.integrate(n, particles, SimParams(dt=1e-3, gravity=-9.8, restitution=0.5, n=n))
            kernels.crates["core"].reduce_sum(n, x, y)
            kernels.histogram_digits(n, x, y, 8)


        def triton_calls(x: DeviceBuffer, y: DeviceBuffer, out: DeviceBuffer, n: int) -> None:
            # a Triton kernel's own call (TritonFunction), beside the lock variants' families
            kernels.add_kernel[(n // 1024,)](x, y, out, n, BLOCK_SIZE=1024)
            kernels.crates["tutorials"].softmax_kernel[(1,)](out, x, 1, 1, 1, 1, BLOCK_SIZE=1024, num_warps=8)
    '''))
    (site / "client_bad.py").write_text(textwrap.dedent('''\
        from __future__ import annotations

        from khal_runtime import DeviceBuffer
        from example_shader_pkg import kernels


        def step(x: DeviceBuffer, y: DeviceBuffer, n: int) -> None:
            kernels.saxpy(n, x, y)
    '''))
    return site


def test_example_wheel_stub(example_with_stub: Path) -> None:
    pkg = example_with_stub / "example_shader_pkg"
    manifest = load_manifest(pkg / MANIFEST_DIR / MANIFEST_NAME)
    text = (pkg / MANIFEST_DIR / "__init__.pyi").read_text()
    assert text == kernels_stub(manifest, module_name="example_shader_pkg._khal")
    ast.parse(text)
    for c in manifest.crates:
        for e in c.entries:
            assert f"``{e.name}`` of crate ``{c.name}``" in text and f"hash ``{e.hash}``" in text
    code = textwrap.dedent("""
        import example_shader_pkg
        from example_shader_pkg._khal import kernels
        assert kernels.entries == example_shader_pkg.kernels.entries, kernels.entries
        assert kernels.saxpy.entry == example_shader_pkg.kernels.saxpy.entry
        print("OK")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(example_with_stub), str(ROOT),
                                                      os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], cwd=example_with_stub, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("checker", ["mypy", "pyright"])
def test_example_wheel_calls_type_check(example_with_stub: Path, checker: str) -> None:
    # only the clients' lines: installed, the package's own modules are not reported (mypy checks
    # this unpacked copy as source, and has a word on the example's structs.py)
    assert [p for p in _problems(checker, example_with_stub, ["client.py"], strict=False)
            if p[0].startswith("client")] == []
    bad = [p for p in _problems(checker, example_with_stub, ["client_bad.py"], strict=False)
           if p[0].startswith("client")]
    assert [(f, line) for f, line, _ in bad] == [("client_bad.py", 8)], bad
    if checker == "mypy":
        assert bad[0][2] == 'Too few arguments for "__call__" of "Kernel_core__saxpy"  [call-arg]'
