"""The example shader wheel, built once per session, inspected without a GPU."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from hatch_khal.config import DEFAULT_ARCHS
from hatch_khal.nvrtc import supported_archs
from khal_runtime.binaries import khal_symbols, read_binary, read_cubin, scan_cubin
from khal_runtime.manifest import SCHEMA_VERSION, parse_manifest

from tests.conftest import run
from tests.helpers.paths import PACKAGES, ROOT

EXAMPLE = ROOT / "example_shader_pkg"


@pytest.fixture(scope="module")
def wheel_files(example_wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(example_wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


@pytest.fixture(scope="module")
def manifest(wheel_files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    return parse_manifest(wheel_files["example_shader_pkg/_khal/manifest.json"])


def test_wheel_is_pure(example_wheel: Path) -> None:
    assert example_wheel.name.endswith("-py3-none-any.whl")


def test_two_crates_with_a_shared_local_header(manifest) -> None:  # type: ignore[no-untyped-def]
    assert {c.name for c in manifest.crates} == {"core", "particles", "cccl", "slang", "tutorials"}
    core = manifest.crate("core")
    headers = {s.path for s in core.sources if not s.path.endswith(".cu")}
    assert headers and all(h.startswith("kernels/include/") for h in headers)
    # the example's kernels a user would write
    names = {e.name for c in manifest.crates for e in c.entries}
    assert {"saxpy", "reduce_sum", "gelu", "integrate", "collide_ground"} <= names


def test_every_artifact_present_with_its_sha256(manifest, wheel_files) -> None:  # type: ignore[no-untyped-def]
    for crate in manifest.crates:
        for art in crate.artifacts:
            data = wheel_files[f"example_shader_pkg/{art.path}"]
            assert len(data) == art.size
            assert hashlib.sha256(data).hexdigest() == art.sha256


def test_cubins_cover_default_archs_and_are_elf_for_their_arch(manifest, wheel_files) -> None:  # type: ignore[no-untyped-def]
    want = {a for a in DEFAULT_ARCHS if int(a[3:]) in supported_archs()}
    for crate in manifest.crates:
        # Triton writes arch-specific cubins (sm_90a, sm_100a, sm_120a: each runs on its own arch only)
        cubins = {a.arch.removesuffix("a") if crate.language == "triton" else a.arch: a
                  for a in crate.artifacts if a.kind == "cubin"}
        assert set(cubins) == want, crate.name
        for arch, art in cubins.items():
            data = wheel_files[f"example_shader_pkg/{art.path}"]
            info = read_binary(data)
            assert data[:4] == b"\x7fELF" and info.kind == "cubin" and info.arch == int(arch[3:])
            assert khal_symbols(info) | {} and all(
                khal_symbols(info)[e.name] == e.hash for e in crate.entries
            )
            # the load path's struct reader and pyelftools read the same symbols and probes
            assert scan_cubin(data) == read_cubin(data) == info
            assert bool(info.globals_u64) == (crate.language != "triton")  # layout probes: C++ and Slang


def test_ptx_entries_carry_hashes_and_libdevice_is_resolved(manifest, wheel_files) -> None:  # type: ignore[no-untyped-def]
    for crate in manifest.crates:
        (ptx,) = [a for a in crate.artifacts if a.kind == "ptx"]
        assert ptx.arch == "compute_75"
        text = wheel_files[f"example_shader_pkg/{ptx.path}"].decode()
        for e in crate.entries:
            assert f".entry {e.symbol}(" in text
            if e.triton is None:  # Triton entries have no indirect variant (their grid is of programs)
                assert f".entry {e.indirect_symbol}(" in text
        assert ".extern .func" not in text and "__nv_" not in text  # erff, expf, ... inlined
        assert f".version {ptx.ptx_isa}" in text


def test_the_triton_crate_ships_every_variant_of_its_lock_file(manifest, wheel_files) -> None:  # type: ignore[no-untyped-def]
    """README command 1 builds Triton's tutorial kernels (no GPU) from the example's lock file
    (example_shader_pkg/khal-triton.lock, recorded from record_warmup.py): one entry per variant,
    ``<kernel>__v<digest>``, compiled with exactly the lock's specialisation, constexprs and options,
    hashed like any entry, importable where the package's host code finds them; cubins for the
    default archs (sm_90 as sm_90a) and PTX 8.0 for older drivers to JIT. No instance tables."""
    from hatch_khal.triton import lock

    c = manifest.crate("tutorials")
    assert c.language == "triton"
    variants = lock.read(EXAMPLE / "khal-triton.lock")
    assert len(variants) == 8 and {v.crate for v in variants} == {"tutorials"}
    assert sorted(e.name for e in c.entries) == sorted(lock.entry_name(v) for v in variants)
    for v in variants:
        t = c.entry(lock.entry_name(v)).triton
        assert t.recorded and t.kernel == t.qualname == v.kernel and not t.base
        assert t.module == "example_shader_pkg.triton_kernels.tutorials"
        spelt = {}
        for name, ty in zip(t.names, t.types):
            spelt[name] = ty + (":16" if name in t.divisible else "")
        spelt.update({name: "i32:1" for name in t.ones})
        assert spelt == v.args, v.kernel
        assert t.constexprs == v.constexprs and (t.num_warps, t.num_stages) == (v.num_warps, v.num_stages)
    add = next(e for e in c.entries if e.triton.kernel == "add_kernel" and e.triton.types[0] == "*fp32"
               and "x_ptr" in e.triton.divisible)
    assert add.symbol.endswith(add.hash) and add.block_size == (128, 1, 1)
    assert {e.block_size for e in c.entries if e.triton.kernel == "softmax_kernel"} == {(256, 1, 1)}
    from hatch_khal.triton import TRITON_VERSION

    assert manifest.toolchain.triton_version == TRITON_VERSION == add.triton.triton_version
    (ptx,) = [a for a in c.artifacts if a.kind == "ptx"]
    assert ".version 8.0" in wheel_files[f"example_shader_pkg/{ptx.path}"].decode()
    sm90 = next(a for a in c.artifacts if a.kind == "cubin" and a.arch == "sm_90a")
    assert read_binary(wheel_files[f"example_shader_pkg/{sm90.path}"]).arch == 90


def test_the_triton_entries_record_the_pointers_their_kernels_may_write(manifest) -> None:  # type: ignore[no-untyped-def]
    """The build's write analysis on the tutorials (hatch_khal.triton.effects): each kernel writes
    its output only; x / y, the softmax input and the matmul's a / b are proven read-only."""
    c = manifest.crate("tutorials")
    if os.environ.get("KHAL_TEST_EXAMPLE_WHEEL") and all(e.triton.written is None for e in c.entries):
        pytest.skip("KHAL_TEST_EXAMPLE_WHEEL was built before TritonFacts.written: rebuild it (README command 1)")
    want = {"add": ("output_ptr",), "softmax": ("output_ptr",), "matmul": ("c_ptr",)}
    assert {e.name: e.triton.written for e in c.entries} == {
        e.name: want[e.name.split("_")[0]] for e in c.entries}


def test_the_test_packages_triton_tutorials_are_the_examples() -> None:
    """The Triton tutorial kernels exist twice (a crate's sources lie inside its project): the
    example's, in its package (example_shader_pkg/triton_kernels/tutorials.py, served to its host
    code), and tests/packages/triton_kernels_pkg's (its hand-written instance tables, the softmax's
    helper in a module of its own). Every @triton.jit function must be the same code, so that a change
    to one that is not made to the other fails here, not on the GPU."""
    import ast

    def jitted(*paths: Path) -> dict[str, str]:
        out = {}
        for p in paths:
            for node in ast.parse(p.read_text()).body:
                if isinstance(node, ast.FunctionDef):
                    out[node.name] = ast.dump(node)
        return out

    ours = jitted(EXAMPLE / "example_shader_pkg" / "triton_kernels" / "tutorials.py")
    theirs_dir = PACKAGES / "triton_kernels_pkg" / "kernels" / "triton"
    theirs = jitted(theirs_dir / "tutorials.py", theirs_dir / "helpers.py")
    assert set(ours) == {"add_kernel", "softmax_kernel", "matmul_kernel", "masked_sum"}
    for name, code in ours.items():
        assert theirs.get(name) == code, f"{name} differs: change both copies"


def test_abi_of_saxpy(manifest) -> None:  # type: ignore[no-untyped-def]
    saxpy = manifest.crate("core").entry("saxpy")
    kinds = [(p.name, p.kind, p.element_type, p.element_size, p.writable) for p in saxpy.params]
    assert kinds[0][1:] == ("storage", "float32", 4, False)
    assert kinds[1][1:] == ("storage", "float32", 4, True)
    assert kinds[2][1] == "uniform" and kinds[2][3] == 4  # SaxpyParams { float a; }


def test_cli_inspect_and_verify(example_wheel: Path) -> None:
    out = run([sys.executable, "-m", "hatch_khal", "inspect", str(example_wheel)]).stdout
    assert "crate core" in out and "entry saxpy hash" in out and "sm_90" in out
    data = json.loads(run([sys.executable, "-m", "hatch_khal", "inspect", "--json", str(example_wheel)]).stdout)
    assert data["schema_version"] == SCHEMA_VERSION and data["package"] == "example_shader_pkg"
    assert "verify: OK" in run([sys.executable, "-m", "hatch_khal", "verify", str(example_wheel)]).stdout


def test_cli_verify_catches_tampering(example_wheel: Path, tmp_path: Path) -> None:
    bad = tmp_path / example_wheel.name
    with zipfile.ZipFile(example_wheel) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("core.sm_90.cubin"):
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.writestr(item, data)
    proc = run([sys.executable, "-m", "hatch_khal", "verify", str(bad)], check=False)
    assert proc.returncode == 1 and "core.sm_90.cubin" in proc.stderr and "sha256" in proc.stderr


def test_cli_inspect_installed_package_and_bad_paths(example_site: Path, tmp_path: Path) -> None:
    import os

    env = dict(os.environ, PYTHONPATH=str(example_site))
    out = run([sys.executable, "-m", "hatch_khal", "inspect", "example_shader_pkg"], env=env, cwd=tmp_path).stdout
    assert "package example_shader_pkg" in out
    proc = run([sys.executable, "-m", "hatch_khal", "inspect", "no_such_pkg_xyz"], check=False)
    assert proc.returncode == 2 and "neither a file" in proc.stderr
    proc = run([sys.executable, "-m", "hatch_khal", "verify", str(tmp_path)], check=False)
    assert proc.returncode == 2 and "no _khal/manifest.json" in proc.stderr


def test_import_without_gpu_works(example_pkg) -> None:  # type: ignore[no-untyped-def]
    # importing the package reads the manifest only; GPU work is deferred
    assert "saxpy" in dir(example_pkg.kernels) or hasattr(example_pkg.kernels, "saxpy")
