"""Companion crates (issue #36): a Triton crate whose sources are an installed library's modules
(``modules = [...]``), built from tests/packages/fakelib_companion against tests/packages/fakelib_triton
(a stand-in for a library you do not own, installed into the test's build environment): the library
pinned and recorded (``Crate.triton.serves``), its code never copied into the package, the facts each
entry records (the served module and qualname, heuristics, None arguments, dtype and string constexprs),
and the errors of an unpinned or missing library."""

from __future__ import annotations

import hashlib
import importlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pytest

from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.model import PrintReporter
from hatch_khal.triton import companion, lock
from khal_runtime.manifest import TritonDtype

from tests.helpers.paths import PACKAGES

LIBRARY = PACKAGES / "fakelib_triton"
PROJECT = PACKAGES / "fakelib_companion"
HOOK = ("tool", "hatch", "build", "targets", "wheel", "hooks", "khal")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """fakelib-triton installed (not editable: its files are its distribution's) into a folder on
    sys.path, as a build environment's site-packages (the Triton worker gets sys.path too)."""
    target = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(LIBRARY)], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        pytest.fail(f"installing {LIBRARY} failed:\n{run.stdout}{run.stderr}")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(target))
        importlib.invalidate_caches()
        yield target
    importlib.invalidate_caches()


def _crates(root: Path) -> Any:
    table: Any = tomllib.loads((root / "pyproject.toml").read_text())
    for key in HOOK:
        table = table[key]
    return parse_config(table, default_package="fakelib_companion")[1]


@pytest.fixture(scope="module")
def built(site: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    from hatch_khal.builder import build_packages, write_package_output

    root = tmp_path_factory.mktemp("companion") / "p"
    shutil.copytree(PROJECT, root, ignore=shutil.ignore_patterns("_khal", "__pycache__"))
    result = build_packages(root, _crates(root), PrintReporter(), cache=Cache(tmp_path_factory.mktemp("c"), print),
                            jobs=1)
    for out in result.packages:
        write_package_output(out, root / out.package)
    return root, result


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.needs_triton
def test_a_companion_records_the_library_it_serves_and_ships_none_of_its_code(site: Path,
                                                                             built: tuple[Path, Any]) -> None:
    _, result = built
    (out,) = result.packages
    crate = out.manifest.crate("fakelib")
    assert crate.language == "triton" and crate.sources == ()  # the library's modules are not the package's
    assert crate.triton is not None and crate.triton.jit_fallback
    served = crate.triton.serves
    assert served is not None and (served.distribution, served.version) == ("fakelib-triton", "1.0.0")
    # the kernels' module and the module of the @triton.jit helper they call, as installed
    assert served.files == {"fakelib_triton/ops.py": _sha(site / "fakelib_triton" / "ops.py"),
                            "fakelib_triton/helpers.py": _sha(site / "fakelib_triton" / "helpers.py")}
    assert [p for p in out.files if p.endswith(".py")] == ["_khal/__init__.py"]  # khal's loader, no module of the library
    assert [a.kind for a in crate.artifacts] == ["cubin"]  # ptx-arch = "none"


@pytest.mark.slow
@pytest.mark.needs_triton
def test_each_served_kernels_entry_says_where_it_is_and_what_it_was_compiled_with(built: tuple[Path, Any]) -> None:
    root, result = built
    entries = {e.name: e for e in result.packages[0].manifest.crate("fakelib").entries}
    cast_v, even_false, even_true = (lock.entry_name(v) for v in lock.read(root / "khal-triton.lock"))
    assert sorted(entries) == sorted(["cast_fp16", "cast_fp16__base", "cast_bf16", "cast_bf16__base", cast_v,
                                      even_false, even_true])
    for e in entries.values():
        assert e.triton is not None and e.triton.module == "fakelib_triton.ops"
        assert e.triton.qualname == ("scale_kernel" if e.name.startswith("scale") else "cast_kernel")
    scale = entries[even_true].triton
    assert scale is not None and scale.recorded and scale.heuristics == ("EVEN",)
    assert scale.constexprs == {"BLOCK": 128, "EVEN": True} and scale.divisible == ("x_ptr", "out_ptr", "n")
    cast = entries[cast_v].triton
    assert cast is not None and cast.nones == ("bias_ptr",) and cast.maxnreg == 128
    assert cast.names == ("x_ptr", "out_ptr", "n", "clamp") and cast.types == ("*fp32", "*fp16", "i64", "u1")
    assert cast.constexprs == {"OUT_DTYPE": TritonDtype(dtype="fp16"), "MODE": "neg", "BLOCK": 128}
    assert [(p.name, p.constexpr, p.has_default, p.default) for p in cast.params] == [
        ("x_ptr", False, False, None), ("out_ptr", False, False, None), ("bias_ptr", False, False, None),
        ("n", False, False, None), ("clamp", False, False, None), ("OUT_DTYPE", True, False, None),
        ("MODE", True, True, "copy"), ("BLOCK", True, True, 128)]
    # the hand-written instances: a matrix of tables (dtype and warps vary together), defaults applied
    fp16, bf16 = entries["cast_fp16"], entries["cast_bf16"]
    assert fp16.block_size == (64, 1, 1) and bf16.block_size == (128, 1, 1)
    assert bf16.triton is not None and not bf16.triton.recorded and bf16.triton.nones == ()
    assert bf16.triton.constexprs == {"OUT_DTYPE": TritonDtype(dtype="bf16"), "MODE": "copy", "BLOCK": 128}
    assert bf16.triton.types == ("*fp32", "*bf16", "*fp32", "i32", "u1")
    assert [p.element_type for p in bf16.params][:5] == ["uint64", "uint64", "uint64", "int32", "bool"]


@pytest.mark.slow
@pytest.mark.needs_triton
def test_the_companion_loads_and_its_hashes_verify(built: tuple[Path, Any]) -> None:
    import khal_runtime

    root, _ = built
    ks = khal_runtime.load(root / "fakelib_companion")
    assert ks.crates["fakelib"].crate.triton.serves.version == "1.0.0"


@pytest.mark.slow
@pytest.mark.needs_triton
def test_the_librarys_files_are_in_the_content_hash(site: Path, tmp_path: Path) -> None:
    from hatch_khal.plan import plan_crates

    root = tmp_path / "p"
    shutil.copytree(PROJECT, root, ignore=shutil.ignore_patterns("_khal", "__pycache__"))
    before = plan_crates(root, _crates(root), PrintReporter())[0].content_hash
    ops = site / "fakelib_triton" / "ops.py"
    text = ops.read_text()
    try:
        ops.write_text(text + "\n# edited\n")
        assert plan_crates(root, _crates(root), PrintReporter())[0].content_hash != before
    finally:
        ops.write_text(text)
    assert plan_crates(root, _crates(root), PrintReporter())[0].content_hash == before


@pytest.mark.slow
def test_a_served_library_must_be_installed_and_pinned(site: Path, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["fakelib-triton==1.0.0"]\n')
    served = companion.resolve(tmp_path, "lib", ["fakelib_triton.ops"])
    assert (served.distribution, served.version, served.modules) == ("fakelib-triton", "1.0.0",
                                                                     {"fakelib_triton.ops": "fakelib_triton/ops.py"})
    with pytest.raises(ConfigError, match=r"crate 'lib': option 'modules' names 'fakelib_triton.nothere', which is not "
                                          r"installed in the build environment"):
        companion.resolve(tmp_path, "lib", ["fakelib_triton.nothere"])
    with pytest.raises(ConfigError, match=r"option 'modules' names 'nolib.ops', and no installed distribution provides "
                                          r"package 'nolib'"):
        companion.resolve(tmp_path, "lib", ["nolib.ops"])


@pytest.mark.parametrize(("requires", "match"), [
    ('["fakelib-triton"]', r"gives as 'fakelib-triton': pin it to one version \('fakelib-triton==1.0.0'\)"),
    ('["fakelib_triton>=1.0"]', r"gives as 'fakelib_triton>=1.0': pin it to one version"),
    ('["fakelib-triton==1.*"]', r"pin it to one version"),
    ('["hatchling"]', r"crate 'lib' serves fakelib-triton 1.0.0: add 'fakelib-triton==1.0.0' to the project's "
                      r"\[build-system\] requires"),
    ('["Fakelib-Triton==0.9"]', r"pins 'Fakelib-Triton==0.9', but fakelib-triton 1.0.0 is installed"),
])
def test_an_unpinned_library_is_refused_saying_to_pin_it(tmp_path: Path, requires: str, match: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[build-system]\nrequires = {requires}\n")
    with pytest.raises(ConfigError, match=match):
        companion.check_pinned(tmp_path, "lib", "fakelib-triton", "1.0.0")
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = ["fakelib-triton==1.0.0"]\n')
    companion.check_pinned(tmp_path, "lib", "fakelib-triton", "1.0.0")
