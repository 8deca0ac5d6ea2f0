"""Triton crates (issue #30) on the CPU: the instance tables and their errors, one real build of
tests/packages/triton_kernels_pkg (shared by the module: Triton compiles are slow), the entries and
artifacts it makes, entry hashes that follow a called @triton.jit helper, and the runtime on the
fake driver (packing, scratch pointers, the variant chosen by alignment / divisibility, a stale
manifest refused, no ``import triton`` at run time)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import textwrap

import numpy as np
import pytest

from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.model import PrintReporter
from hatch_khal.triton.instances import parse_instances
from hatch_khal.triton.language import merge_ptx, rename_kernel
from khal_runtime.errors import HashMismatchError, TritonAssumptionError
from khal_runtime.triton import TritonKernel

from tests.helpers.fakecuda import FakeDriver, fake, ptx_param_layouts  # noqa: F401
from tests.helpers.paths import PACKAGES

PKG = PACKAGES / "triton_kernels_pkg"
HOOK = ("tool", "hatch", "build", "targets", "wheel", "hooks", "khal")


def _hook(pyproject: Path) -> dict[str, Any]:
    table: Any = tomllib.loads(pyproject.read_text())
    for key in HOOK:
        table = table[key]
    return dict(table)


def _build(root: Path, package: str, cache: Path) -> Any:
    from hatch_khal.builder import build_packages, write_package_output

    _, crates = parse_config(_hook(root / "pyproject.toml"), default_package=package)
    result = build_packages(root, crates, PrintReporter(), cache=Cache(cache, print), jobs=1)
    for out in result.packages:
        write_package_output(out, root / out.package)
    return result


# -- instances (no Triton) ------------------------------------------------------------------------

def test_a_matrix_expands_and_a_specialised_instance_gets_its_conservative_twin() -> None:
    got = parse_instances("k", [{"kernel": "add", "name": "add_{T}_{B}",
                                 "signature": {"x": "*{T}:16", "n": "i32:16", "B": "{B}"},
                                 "matrix": {"T": ["fp32", "fp16"], "B": [256, 1024]}}])
    assert [i.name for i in got][:4] == ["add_fp32_256", "add_fp32_256__base", "add_fp32_1024", "add_fp32_1024__base"]
    assert len(got) == 8
    first, base = got[0], got[1]
    assert first.triton_signature() == {"x": "*fp32", "n": "i32", "B": "constexpr"}
    assert first.constexprs() == {"B": 256} and first.divisible() == ["x", "n"]
    assert base.divisible() == [] and base.family == "add_fp32_256" and base.base
    plain = parse_instances("k", [{"kernel": "add", "signature": {"x": "*fp32", "n": "i32", "B": 64}}])
    assert [i.name for i in plain] == ["add"]  # nothing assumed: no twin
    (one, twin) = parse_instances("k", [{"kernel": "mm", "signature": {"x": "*fp32", "s": "i32:1", "B": 64}}])
    assert one.triton_signature() == {"x": "*fp32", "s": "constexpr", "B": "constexpr"} and one.ones() == ["s"]
    assert one.constexprs() == {"B": 64} and one.compile_constexprs() == {"B": 64, "s": 1}
    assert twin.name == "mm__base" and twin.ones() == [] and twin.triton_signature()["s"] == "i32"
    assert parse_instances("k", [{"kernel": "add", "fallback": False,
                                  "signature": {"x": "*fp32:16", "B": 64}}])[0].name == "add"


@pytest.mark.parametrize(("table", "match"), [
    ({"kernel": "add", "signature": {"x": "*fp33"}}, r"instances\[0\] \(add\): signature field 'x': 'fp33'.*not a Triton pointee"),
    ({"kernel": "add", "signature": {"x": "*fp32:8"}}, r"field 'x': ':8'.*not a specialisation"),
    ({"kernel": "add", "signature": {"x": "*fp32:1"}}, r"field 'x'.*':1' in '\*fp32:1' applies to integers only"),
    ({"kernel": "add", "signature": {"f": "fp32:16"}}, r"field 'f'.*pointers and integers only"),
    ({"kernel": "add", "signature": {"x": "*{T}"}}, r"names \{T\}, which the instance's 'matrix' does not give"),
    ({"kernel": "add", "signature": {"x": "*fp32"}, "num_warps": 3}, r"option 'num_warps' is 3, not a power of two"),
    ({"kernel": "add", "signature": {"x": "*fp32"}, "warps": 4}, r"unknown option\(s\) 'warps'"),
    ({"kernel": "add", "signature": ["*fp32"]}, r"option 'signature' must be a table"),
    ({"signature": {"x": "*fp32"}}, r"option 'kernel' must name a @triton.jit function"),
    ({"kernel": "add", "name": "a__b", "signature": {"x": "*fp32"}}, r"entry name 'a__b'"),
])
def test_a_bad_instance_is_a_config_error_naming_crate_instance_and_field(table: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=r"crate 'k': instances\[0\]") as info:
        parse_instances("k", [table])
    assert info.match(match)


def test_two_instances_of_one_name_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"entry name 'add' is also the name of crate 'k': instances\[0\]"):
        parse_instances("k", [{"kernel": "add", "signature": {"x": "*fp32"}},
                              {"kernel": "add", "signature": {"x": "*fp16"}}])


def test_the_language_follows_py_sources_and_instances_belong_to_triton_crates() -> None:
    _, (c,) = parse_config({"crates": [{"name": "t", "sources": ["k/*.py"], "instances": [
        {"kernel": "a", "signature": {"x": "*fp32"}}]}]}, default_package="p")
    assert c.language == "triton" and c.instances[0]["kernel"] == "a"
    # instances may come from the lock file alone (#36): a crate with neither is refused when planned
    _, (bare,) = parse_config({"crates": [{"name": "t", "sources": ["k/*.py"]}]}, default_package="p")
    from hatch_khal.triton.language import TRITON

    with pytest.raises(ConfigError, match=r"crate 't': a Triton crate needs variants to build: 'instances' tables .* "
                                          r"or variants of the crate in the lock file \(khal-triton.lock"):
        TRITON.plan(Path("/nonexistent"), bare)
    with pytest.raises(ConfigError, match=r"option 'instances' is for Triton crates"):
        parse_config({"crates": [{"name": "t", "sources": ["k/*.cu"], "instances": []}]}, default_package="p")
    with pytest.raises(ConfigError, match=r"mixes CUDA C\+\+ sources .* with Triton"):
        parse_config({"crates": [{"name": "t", "sources": ["k/*.cu", "k/*.py"]}]}, default_package="p")


def test_ptx_of_several_kernels_merges_with_one_header_and_renamed_kernels() -> None:
    def one(name: str) -> str:
        return (f"//\n.version 8.0\n.target sm_80\n.address_size 64\n\n.extern .shared .align 16 .b8 global_smem[];\n"
                f".visible .entry {name}(\n\t.param .u64 {name}_param_0\n)\n{{\n\tret;\n}}\n")
    a = rename_kernel(one("k"), "k", "a_khal_0123456789abcdef")
    b = rename_kernel(one("k"), "k", "b_khal_0123456789abcdef")
    merged = merge_ptx("c", "compute_80", [a, b])
    assert merged.count(".version 8.0") == 1 and merged.count("global_smem[]") == 1
    assert ".entry a_khal_0123456789abcdef(" in merged and ".entry b_khal_0123456789abcdef(" in merged
    assert "k_param_0" in merged  # parameter names are local to their entry: left as Triton wrote them
    with pytest.raises(Exception, match="both define"):
        merge_ptx("c", "compute_80", [a, a])


# -- the assumption checks (no build) -------------------------------------------------------------

def _variant(name: str, divisible: tuple[str, ...], launches: list[Any], ones: tuple[str, ...] = ()) -> Any:
    facts = SimpleNamespace(kernel="add_kernel", constexprs={"BLOCK_SIZE": 1024}, types=("*fp32", "*fp32", "i32"),
                            names=("x", "out", "n"), divisible=divisible, shared=64, ones=ones)
    params = tuple(SimpleNamespace(name=n) for n in ("x", "out", "n", "khal_global_scratch", "khal_profile_scratch"))
    entry = SimpleNamespace(name=name, triton=facts, params=params)
    return SimpleNamespace(entry=entry, launch=lambda *a, **kw: launches.append((name, a, kw)))


def test_the_most_specialised_variant_whose_assumptions_hold_is_launched() -> None:
    launches: list[Any] = []
    k = TritonKernel("add", "c", [_variant("add__base", (), launches), _variant("add", ("x", "out", "n"), launches)])
    k[lambda meta: (4096 // meta["BLOCK_SIZE"],)](0x1000, 0x2000, 4096)
    assert launches[-1] == ("add", (4, None, 0x1000, 0x2000, 4096, 0, 0), {"stream": None, "shared_mem": 64})
    k.launch((3, 2), 0x1004, 0x2000, 4096)  # x not 16-byte aligned
    assert launches[-1][0] == "add__base" and launches[-1][1][:2] == ((3, 2), None)
    assert k.chosen(0x1000, 0x2000, 4095) == "add__base"  # n not divisible by 16
    assert k.chosen(0x1000, 0x2000, 4096) == "add"
    assert set(k._chosen) == {0b111, 0b110, 0b011}  # one choice per set of assumptions that held

    class Tensor:  # torch's spelling of a device pointer
        is_cuda = True

        def data_ptr(self) -> int:
            return 0x3000

    assert k.chosen(Tensor(), Tensor(), 16) == "add"

    class Half(Tensor):
        dtype = "torch.float16"

    with pytest.raises(TypeError, match=r"add\(\): argument 'x' is an array of float16, the kernel was built for "
                                        r"\*fp32 \(float32\)"):
        k.chosen(Half(), Tensor(), 16)


def test_an_argument_assumed_1_is_checked_and_left_out_of_the_variant_that_assumes_it() -> None:
    launches: list[Any] = []
    k = TritonKernel("add", "c", [_variant("add__base", (), launches), _variant("add", ("x",), launches, ("n",))])
    k.launch(2, 0x1000, 0x2000, 1)
    assert launches[-1][:2] == ("add", (2, None, 0x1000, 0x2000, 0, 0))  # n compiled in: not passed
    k.launch(2, 0x1000, 0x2000, 2)
    assert launches[-1][:2] == ("add__base", (2, None, 0x1000, 0x2000, 2, 0, 0))
    only = TritonKernel("add", "c", [_variant("add", (), launches, ("n",))])
    with pytest.raises(TritonAssumptionError, match=r"n = 3 is not 1"):
        only.launch(1, 0x1000, 0x2000, 3)


def test_a_call_breaking_every_shipped_variant_names_the_argument_and_the_assumption() -> None:
    k = TritonKernel("add", "c", [_variant("add", ("x", "out", "n"), [])])
    with pytest.raises(TritonAssumptionError, match=r"add: .*x = 0x1004 is not 16-byte aligned; n = 100 is not "
                                                    r"divisible by 16"):
        k.launch(1, 0x1004, 0x2000, 100)
    with pytest.raises(TypeError, match=r"add\(\) takes 3 argument\(s\) \(x, out, n\), got 2"):
        k.launch(1, 0x1000, 0x2000)
    with pytest.raises(TypeError, match=r"argument 'x'.*not a device pointer"):
        k.launch(1, "x", 0x2000, 16)
    with pytest.raises(ValueError, match=r"add\(\): argument 'out' \(\*fp32\) points at 0x2002, not a multiple of 4"):
        k.launch(1, 0x1000, 0x2002, 16)


# -- one real build --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("tri") / "pkg"
    shutil.copytree(PKG, root, ignore=shutil.ignore_patterns("_khal", "__pycache__"))
    result = _build(root, "khal_triton_kernels", tmp_path_factory.mktemp("cache"))
    return root, result


@pytest.mark.needs_triton
def test_the_build_makes_one_entry_per_instance_variant_named_with_its_hash(built: tuple[Path, Any]) -> None:
    root, result = built
    (out,) = result.packages
    m = out.manifest
    assert m.toolchain.triton_version == "3.6.0"
    assert sorted(c.name for c in m.crates) == ["hopper", "tutorials"]
    crate = m.crate("tutorials")
    assert crate.language == "triton"
    names = [e.name for e in crate.entries]
    assert names == ["add_fp32", "add_fp32__base", "add_fp16", "add_fp16__base", "softmax_1024", "matmul_fp16",
                     "matmul_fp16__base", "matmul_fp16_big"]
    assert 0 < crate.entry("matmul_fp16").triton.shared <= 48 * 1024  # type: ignore[union-attr]
    assert crate.entry("matmul_fp16").attributes is None  # within 48 KB: no attribute, hashed as before
    big = crate.entry("matmul_fp16_big")
    assert big.triton is not None and big.triton.shared > 48 * 1024
    assert big.attributes is not None and big.attributes.max_dynamic_shared == big.triton.shared
    add = crate.entry("add_fp32")
    assert add.symbol == f"add_fp32_khal_{add.hash}" and add.block_size == (128, 1, 1) and add.grid_dims == 3
    assert [p.name for p in add.params] == ["x_ptr", "y_ptr", "output_ptr", "n_elements", "khal_global_scratch",
                                            "khal_profile_scratch"]
    assert [(p.kind, p.element_type) for p in add.params[:4]] == [("scalar", "uint64")] * 3 + [("scalar", "int32")]
    assert add.triton is not None and add.triton.divisible == ("x_ptr", "y_ptr", "output_ptr", "n_elements")
    assert add.triton.constexprs == {"BLOCK_SIZE": 1024} and add.triton.types[0] == "*fp32"
    assert crate.entry("add_fp32__base").triton.divisible == ()  # type: ignore[union-attr]
    soft = crate.entry("softmax_1024")
    assert soft.block_size == (256, 1, 1) and soft.triton.shared > 0  # type: ignore[union-attr]
    kinds = sorted((a.kind, a.arch, a.ptx_isa) for a in crate.artifacts)
    assert kinds == [("cubin", "sm_90a", "8.0"), ("ptx", "compute_80", "8.0")]  # Triton's sm_90 code is sm_90a
    ptx = out.files[next(a.path for a in crate.artifacts if a.kind == "ptx")].decode()
    assert ".version 8.0" in ptx and ".entry add_kernel(" not in ptx
    for e in crate.entries:
        assert f".entry {e.symbol}(" in ptx
    assert str(root) not in ptx  # no line info: no build-machine path in the binaries
    assert not list((root / "kernels").rglob("__pycache__"))  # the worker wrote no bytecode beside them


@pytest.mark.needs_triton
def test_the_sm_90a_cubin_is_recorded_arch_specific_and_serves_sm_90_only(built: tuple[Path, Any]) -> None:
    import struct

    from khal_runtime.backends.cuda.loader import select_candidates
    from khal_runtime.binaries import read_binary

    root, result = built
    (out,) = result.packages
    crate = out.manifest.crate("tutorials")
    cubin = next(a for a in crate.artifacts if a.kind == "cubin")
    assert cubin.path.endswith("tutorials.sm_90a.cubin")
    data = out.files[cubin.path]
    assert struct.unpack_from("<I", data, 48)[0] & 0x800  # ELF ABI 7: EF_CUDA_ACCELERATORS
    info = read_binary(data)
    assert info.arch == 90 and info.arch_specific and info.arch_name == "sm_90a"
    ptx = read_binary(out.files[next(a.path for a in crate.artifacts if a.kind == "ptx")])
    assert not ptx.arch_specific and ptx.arch_name == "compute_80"  # .target sm_80: JITs on later GPUs
    assert [a.arch for a in select_candidates(crate, (9, 0), (13, 0))] == ["sm_90a", "compute_80"]
    # a later GPU of the major (hypothetical sm_91 / a Blackwell) gets the PTX, never the sm_90a cubin
    assert [a.arch for a in select_candidates(crate, (9, 1), (13, 0))] == ["compute_80"]
    assert [a.arch for a in select_candidates(crate, (10, 0), (13, 0))] == ["compute_80"]


@pytest.mark.needs_triton
def test_a_rebuild_compiles_nothing_and_a_changed_helper_changes_the_hashes_of_its_callers(
        built: tuple[Path, Any], tmp_path: Path) -> None:
    root, result = built
    cache = tmp_path / "cache"
    root2 = tmp_path / "pkg"
    shutil.copytree(root, root2, ignore=shutil.ignore_patterns("_khal", "__pycache__"))
    # the softmax instance alone (a small, quick build), before and after its helper changes
    pyproject = root2 / "pyproject.toml"
    text = pyproject.read_text()
    start = text.index("[[tool.hatch.build.targets.wheel.hooks.khal.crates.instances]]\nkernel = \"add_kernel\"")
    end = text.index("[[tool.hatch.build.targets.wheel.hooks.khal.crates.instances]]\nkernel = \"softmax_kernel\"")
    pyproject.write_text(text[:start] + text[end:text.index("# 03-matrix-multiplication.py")])
    first = _build(root2, "khal_triton_kernels", cache)
    again = _build(root2, "khal_triton_kernels", cache)
    assert again.compiled == 0
    helper = root2 / "kernels" / "triton" / "helpers.py"
    helper.write_text(helper.read_text().replace("return tl.sum(x, axis=0)", "return tl.sum(x, axis=0) * 1.0"))
    changed = _build(root2, "khal_triton_kernels", cache)

    def hashes(r: Any) -> dict[str, str]:
        return {e.name: e.hash for e in r.packages[0].manifest.crates[0].entries}

    assert hashes(first) == hashes(again)
    assert hashes(first)["softmax_1024"] != hashes(changed)["softmax_1024"]


# A @triton.jit function called from outside the crate's sources (refused before #37) is covered by
# what the compile read: tests/build/test_triton_reads.py


# -- the runtime, on the fake driver -----------------------------------------------------------------

def _load(root: Path, drv: FakeDriver) -> Any:
    import khal_runtime

    pkg = root / "khal_triton_kernels"
    for ptx in (pkg / "_khal").rglob("*.ptx"):
        drv.layouts.update({f"FUNC:{n}": lay for n, lay in ptx_param_layouts(ptx.read_bytes()).items()})
    return khal_runtime.load(pkg)


@pytest.mark.needs_triton
def test_a_call_packs_pointers_scalars_and_null_scratch_and_picks_the_variant(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer

    root, _ = built
    ks = _load(root, fake)
    add = ks.add_fp32
    assert isinstance(add, TritonKernel)
    assert set(ks.crates["tutorials"].instances) >= {"add_fp32", "add_fp32__base"}
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    add[(4,)](x, y, out, 4096)
    launch = fake.launches[-1]
    e = ks.crates["tutorials"].instances["add_fp32"].entry
    assert launch["f"] == f"FUNC:{e.symbol}"
    assert launch["grid"] == (4, 1, 1) and launch["block"] == (128, 1, 1) and launch["shmem"] == 0
    slots = [int.from_bytes(s, "little") for s in launch["slots"]]
    assert slots == [x.ptr, y.ptr, out.ptr, 4096, 0, 0]
    add[(4,)](x, y, out, 4004)  # not divisible by 16: the conservative twin
    assert fake.launches[-1]["f"] == f"FUNC:{ks.crates['tutorials'].instances['add_fp32__base'].entry.symbol}"
    add[(4,)](x.ptr + 4, y, out, 4096)  # a pointer 4 bytes in: the conservative twin
    assert fake.launches[-1]["f"].startswith("FUNC:add_fp32__base_khal_")
    a, b, c = (DeviceBuffer.zeros(64 * 64, np.float16) for _ in range(3))
    ks.matmul_fp16[(1,)](a, b, c, 64, 64, 64, 64, 1, 64, 1, 64, 1)
    mm = ks.crates["tutorials"].instances["matmul_fp16"].entry
    assert fake.launches[-1]["f"] == f"FUNC:{mm.symbol}" and mm.triton.ones == ("stride_ak", "stride_bn", "stride_cn")
    slots = [int.from_bytes(s, "little") for s in fake.launches[-1]["slots"]]
    assert slots == [a.ptr, b.ptr, c.ptr, 64, 64, 64, 64, 64, 64, 0, 0]  # the unit strides compiled in
    ks.matmul_fp16[(1,)](a, b, c, 64, 64, 64, 1, 64, 64, 1, 64, 1)  # a column-major A: stride_ak is not 1
    assert fake.launches[-1]["f"].startswith("FUNC:matmul_fp16__base_khal_")
    assert len(fake.launches[-1]["slots"]) == 14
    soft = ks.softmax_1024
    soft[(8,)](out, x, 1024, 1024, 4, 1000)
    assert fake.launches[-1]["shmem"] == soft.entry.triton.shared > 0
    assert fake.launches[-1]["block"] == (256, 1, 1)
    big = ks.matmul_fp16_big
    shared = big.entry.triton.shared
    assert shared > 48 * 1024
    assert [v for f, a, v in fake.func_attributes if f == f"FUNC:{big.entry.symbol}" and int(a) == 8] == [shared]
    for _ in range(2):
        big[(1,)](a, b, c, 64, 64, 64, 64, 1, 64, 1, 64, 1)
        assert fake.launches[-1]["f"] == f"FUNC:{big.entry.symbol}" and fake.launches[-1]["shmem"] == shared
    assert len([1 for f, _, _ in fake.func_attributes if f == f"FUNC:{big.entry.symbol}"]) == 1  # once, at load


def _count_slow_launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the variants launched through ``Kernel.launch`` (the Triton call's checked path)."""
    from khal_runtime.kernels import Kernel

    slow: list[str] = []
    generic = Kernel.launch

    def counted(self: Any, *a: Any, **kw: Any) -> None:
        slow.append(self.name)
        generic(self, *a, **kw)

    monkeypatch.setattr(Kernel, "launch", counted)
    return slow


@pytest.mark.needs_triton
def test_a_repeated_call_takes_the_generated_fast_call_and_keeps_every_check(
        built: tuple[Path, Any], fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.errors import ArgumentError

    root, _ = built
    ks = _load(root, fake)
    add = ks.add_fp32
    assert add._fast is None  # made at the first call, not when the package loads (#38 item 18)
    slow = _count_slow_launches(monkeypatch)
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    add[(4,)](x, y, out, 4096)
    assert "def launch(grid, a0=MISSING, a1=MISSING, a2=MISSING, a3=MISSING, *more, stream=None):" in add.source
    add[(4,)](x, y, out, 4096)
    add.launch(4, x, y, out, 4096)
    add[lambda meta: (4096 // meta["BLOCK_SIZE"],)](x, y, out, 4096)
    assert slow == ["add_fp32"]  # the generic checks ran once for this combination of bits and types
    e = ks.crates["tutorials"].instances["add_fp32"].entry
    assert all(la["f"] == f"FUNC:{e.symbol}" and la["grid"] == (4, 1, 1) for la in fake.launches[-4:])
    assert [int.from_bytes(s, "little") for s in fake.launches[-1]["slots"]] == [x.ptr, y.ptr, out.ptr, 4096, 0, 0]
    add[(4,)](x, y, out, 4004)  # new bits: the slow path once, then fast
    add[(4,)](x, y, out, 4004)
    assert slow == ["add_fp32", "add_fp32__base"]
    assert fake.launches[-1]["f"].startswith("FUNC:add_fp32__base_khal_")
    add[(2, 3)](x, y, out, 4096)  # a 2-D grid: fast, checked inline
    assert slow == ["add_fp32", "add_fp32__base"] and fake.launches[-1]["grid"] == (2, 3, 1)
    with pytest.raises(ArgumentError, match="an array of float16"):  # a new dtype: the slow path's check
        add[(4,)](DeviceBuffer.zeros(4096, np.float16), y, out, 4096)
    with pytest.raises(ValueError, match="points at .*not a multiple of 4"):
        add[(4,)](x, y, out.ptr + 2, 4096)
    with pytest.raises(ValueError, match="grid"):
        add[(-1,)](x, y, out, 4096)
    add[(0,)](x, y, out, 4096)  # an empty grid: nothing launched (#38 item 5)
    with pytest.raises(TypeError, match="takes 4 argument"):
        add[(4,)](x, y, out)
    gone = DeviceBuffer.zeros(4096, np.float32)
    add[(4,)](gone, y, out, 4096)
    gone.free()
    with pytest.raises(ValueError, match="freed"):
        add[(4,)](gone, y, out, 4096)
    soft = ks.softmax_1024
    for _ in range(2):
        soft[(8,)](out, x, 1024, 1024, 4, 1000)
        assert fake.launches[-1]["shmem"] == soft.entry.triton.shared > 0


def _copy(root: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    pkg = tmp_path / "khal_triton_kernels"
    shutil.copytree(root / "khal_triton_kernels", pkg)
    return pkg, json.loads((pkg / "_khal" / "manifest.json").read_text())


def _tutorials(m: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in m["crates"] if c["name"] == "tutorials")  # type: ignore[no-any-return]


@pytest.mark.needs_triton
def test_a_manifest_whose_triton_facts_were_edited_is_refused(built: tuple[Path, Any], tmp_path: Path) -> None:
    import khal_runtime
    from khal_runtime.errors import ManifestError

    root, _ = built
    pkg, m = _copy(root, tmp_path)
    e = next(e for e in _tutorials(m)["entries"] if e["name"] == "softmax_1024")
    e["triton"]["shared"] = 0  # a launch with too little shared memory
    (pkg / "_khal" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="entry 'softmax_1024'.*the manifest was edited after the build"):
        khal_runtime.load(pkg)


@pytest.mark.needs_triton
def test_a_stale_binary_is_refused_with_a_hash_mismatch(built: tuple[Path, Any], tmp_path: Path,
                                                         fake: FakeDriver) -> None:  # noqa: F811
    import hashlib

    root, _ = built
    pkg, m = _copy(root, tmp_path)
    crate = _tutorials(m)
    soft = next(e for e in crate["entries"] if e["name"] == "softmax_1024")
    for art in crate["artifacts"]:
        path = pkg / art["path"]
        data = path.read_bytes().replace(soft["hash"].encode(), b"0123456789abcdef")  # another build's kernel
        path.write_bytes(data)
        art["sha256"], art["size"] = hashlib.sha256(data).hexdigest(), len(data)
    (pkg / "_khal" / "manifest.json").write_text(json.dumps(m))
    ks = _load(tmp_path, fake)
    with pytest.raises(HashMismatchError, match="softmax_1024"):
        ks.softmax_1024[(1,)](0x1000, 0x2000, 1024, 1024, 1, 1000)


@pytest.mark.needs_triton
def test_the_runtime_loads_and_chooses_with_triton_unimportable(built: tuple[Path, Any]) -> None:
    root, _ = built
    code = (
        "import sys\nsys.modules['triton'] = None\n"
        "import khal_runtime\n"
        f"ks = khal_runtime.load({str(root / 'khal_triton_kernels')!r})\n"
        "print(ks.add_fp16.chosen(0x1000, 0x2000, 0x3000, 64), ks.add_fp16.chosen(0x1002, 0x2000, 0x3000, 64))\n"
        "assert 'triton' not in [m for m in sys.modules if sys.modules[m] is not None and m.split('.')[0] == 'triton']\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KHAL_BACKEND"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["add_fp16", "add_fp16__base"]


@pytest.mark.needs_triton
def test_the_typed_stub_names_each_family_a_triton_kernel_and_type_checks(built: tuple[Path, Any],
                                                                           tmp_path: Path) -> None:
    import importlib.util

    from hatch_khal.stubs import kernels_stub

    _, result = built
    stub = kernels_stub(result.packages[0].manifest, module_name="trik._khal")
    assert "    add_fp32: TritonKernel" in stub and "    softmax_1024: TritonKernel" in stub
    # the conservative twins are the launcher's, not attributes: only the family's docstring names them
    assert not re.search(r"^\s*\w+__base\s*:", stub, re.MULTILINE)
    assert "``add_fp32__base`` of crate ``tutorials``" in stub
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (test extra)")
    pkg = tmp_path / "trik" / "_khal"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "__init__.pyi").write_text(stub)
    (tmp_path / "use.py").write_text("from trik._khal import kernels\nkernels.add_fp32[(4,)](1, 2, 3, 4)\n"
                                     "kernels['softmax_1024'].launch(1, 1, 2, 3, 4, 5, 6)\n")
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "use.py", "trik"],
                         cwd=tmp_path, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_isolated_build_gets_triton_and_no_nvrtc_for_triton_crates(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from hatch_khal.plugin import KhalBuildHook
    from hatch_khal.triton import TRITON_REQUIREMENT

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").touch()
    meta = SimpleNamespace(core=SimpleNamespace(raw_name="pkg"))
    tri = {"name": "t", "sources": ["k/*.py"], "instances": [{"kernel": "k", "signature": {"x": "*fp32"}}]}
    hook = KhalBuildHook(str(tmp_path), {"crates": [tri]}, None, meta, str(tmp_path), "wheel")
    assert hook.dependencies() == [TRITON_REQUIREMENT] == ["triton==3.6.0"]
    both = KhalBuildHook(str(tmp_path), {"crates": [tri, {"name": "c", "sources": ["k/*.cu"]}]}, None, meta,
                         str(tmp_path), "wheel")
    deps = both.dependencies()
    assert TRITON_REQUIREMENT in deps and any(d.startswith("nvidia-cuda-nvrtc") for d in deps)


def test_clusters_and_scratch_memory_build_and_what_the_runtime_cannot_launch_is_refused() -> None:
    from hatch_khal.triton.language import _refusal

    (inst,) = parse_instances("k", [{"kernel": "mm", "name": "mm", "signature": {"a": "*fp16"}}])
    ok = {"shared": 1024, "num_ctas": 1, "launch_pdl": False, "launch_cooperative_grid": False,
          "global_scratch_size": 0, "global_scratch_align": 1, "profile_scratch_size": 0, "profile_scratch_align": 1,
          "num_warps": 4}
    assert _refusal("k", inst, "sm_90", ok) is None
    for fine in ({"shared": 65536}, {"launch_pdl": True}, {"launch_cooperative_grid": True}, {"num_ctas": 8},
                 {"global_scratch_size": 384, "global_scratch_align": 128}, {"profile_scratch_size": 64}):
        assert _refusal("k", inst, "sm_90", {**ok, **fine}) is None  # launched by the runtime now
    for change, match in (({"num_ctas": 16}, r"num_ctas=16: a cluster of more than 8 CTAs is not portable"),
                          ({"global_scratch_size": 64, "global_scratch_align": 512},
                           r"global scratch memory aligned to 512 bytes")):
        why = _refusal("k", inst, "sm_90", {**ok, **change})
        assert why is not None and why.startswith("crate 'k': instance 'mm' (mm) for sm_90")
        assert re.search(match, why), why
    with pytest.raises(ConfigError, match=r"option 'num_ctas' is 3, not 1, 2, 4 or 8"):
        parse_instances("k", [{"kernel": "mm", "signature": {"a": "*fp16"}, "num_ctas": 3}])


def test_tritons_metadata_becomes_the_entrys_launch_attributes_and_they_are_hashed() -> None:
    from hatch_khal.triton.language import launch_attributes
    from khal_runtime import abi
    from khal_runtime.manifest import LaunchAttributes

    md = {"shared": 1024, "launch_pdl": False, "launch_cooperative_grid": False}
    assert launch_attributes([md, md]) is None  # within 48 KB: passed at launch, hashed as before
    big = launch_attributes([md, {**md, "shared": 98304}])  # the largest over the targets
    assert big == LaunchAttributes(max_dynamic_shared=98304)
    assert launch_attributes([{**md, "launch_pdl": True}]) == LaunchAttributes(pdl=True)
    assert launch_attributes([{**md, "launch_cooperative_grid": True}]) == LaunchAttributes(cooperative=True)
    sig = abi.entry_signature("mm", (128, 1, 1), [], grid_dims=3, triton={})
    assert abi.entry_signature("mm", (128, 1, 1), [], grid_dims=3, attributes=big, triton={}) != sig


def test_a_triton_entry_above_48_kb_without_its_opt_in_attribute_is_refused() -> None:
    from pydantic import ValidationError

    from khal_runtime import abi
    from khal_runtime.manifest import Entry, LaunchAttributes, Param, TritonFacts

    scratch = (Param(name="khal_global_scratch", kind="scalar", element_type="uint64", element_size=8,
                     element_align=8),)
    facts = TritonFacts(kernel="mm", family="mm", num_warps=8, num_stages=3, shared=98304, names=(), types=(),
                        cache_key="k", triton_version="3.6.0")
    h = "0123456789abcdef"
    with pytest.raises(ValidationError, match="98304 bytes of dynamic shared memory records them"):
        Entry(name="mm", symbol=abi.symbol_for("mm", h), hash=h, block_size=(256, 1, 1), params=scratch, grid_dims=3,
              triton=facts)
    Entry(name="mm", symbol=abi.symbol_for("mm", h), hash=h, block_size=(256, 1, 1), params=scratch, grid_dims=3,
          triton=facts, attributes=LaunchAttributes(max_dynamic_shared=98304))


@pytest.mark.needs_triton
def test_the_built_package_verifies_and_a_prebuilt_binary_is_refused(built: tuple[Path, Any], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime.verify import verify_package

    root, _ = built
    assert verify_package(root / "khal_triton_kernels") == []
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_TUTORIALS", str(tmp_path / "x.ptx"))
    (tmp_path / "x.ptx").write_text(".version 8.0\n.target sm_80\n.address_size 64\n")
    with pytest.raises(ConfigError, match=r"CUDA_OXIDE_SHADERS_PTX_TUTORIALS gives a prebuilt binary, which Triton "
                                          r"crates do not take"):
        _build(root, "khal_triton_kernels", tmp_path / "cache")


@pytest.mark.needs_triton
def test_the_content_hash_follows_instances_and_tritons_knobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hatch_khal.triton.language import TRITON

    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "k.py").write_text("import triton\n")
    table = {"archs": ["sm_90"], "crates": [{"name": "t", "sources": ["k/*.py"], "instances": [
        {"kernel": "k", "signature": {"x": "*fp32", "B": 64}}]}]}

    def content(**change: Any) -> str:
        t = json.loads(json.dumps(table))
        t["crates"][0]["instances"][0].update(change)
        _, (crate,) = parse_config(t, default_package="pkg")
        return TRITON.plan(tmp_path, crate).content_hash

    base = content()
    assert content(num_warps=8) != base and content(num_stages=2) != base
    assert content(signature={"x": "*fp32", "B": 128}) != base and content(signature={"x": "*fp32:16", "B": 64}) != base
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert content() != base
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION")
    assert content() == base  # where Triton caches is not what it compiles


def test_a_missing_triton_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    from hatch_khal.errors import KhalBuildError
    from hatch_khal.triton import language

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(language.metadata, "version", missing)
    with pytest.raises(KhalBuildError, match=r"a Triton crate needs Triton in the build environment: install "
                                             r"triton==3\.6\.0"):
        language.triton_version()


@pytest.mark.needs_triton
def test_inspect_names_the_triton_toolchain_and_each_instance(built: tuple[Path, Any]) -> None:
    from hatch_khal.__main__ import _describe

    _, result = built
    text = "\n".join(_describe(result.packages[0].manifest))
    assert "Triton 3.6.0" in text and "crate tutorials: Triton" in text
    assert "entry add_fp32 = add_kernel hash" in text
    assert ("      triton add_kernel(x_ptr: *fp32:16, y_ptr: *fp32:16, output_ptr: *fp32:16, n_elements: i32:16, "
            "BLOCK_SIZE = 1024)\n      num_warps = 4, num_stages = 3; 0 B shared\n") in text


@pytest.mark.needs_triton
def test_a_cached_build_is_compiled_again_when_a_project_module_its_sources_import_changes(tmp_path: Path) -> None:
    from hatch_khal.builder import build_packages

    root = tmp_path / "p"
    for d in ("k", "lib", "pkg"):
        (root / d).mkdir(parents=True)
    consts = root / "lib" / "consts.py"
    consts.write_text("import triton.language as tl\nSCALE = tl.constexpr(2)\n")
    (root / "k" / "k.py").write_text(
        "import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'lib'))\n"
        "import triton\nimport triton.language as tl\nfrom consts import SCALE\n\n"
        "@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n"
        "    o = tl.arange(0, BLOCK)\n    tl.store(x_ptr + o, tl.load(x_ptr + o) * SCALE)\n")
    _, crates = parse_config({"archs": ["sm_90"], "ptx-arch": "none", "crates": [
        {"name": "t", "sources": ["k/*.py"], "instances": [{"kernel": "k", "signature": {"x_ptr": "*fp32",
                                                                                       "BLOCK": 64}}]}]},
        default_package="pkg")
    cache = Cache(tmp_path / "c", print)

    def entry_hash() -> tuple[str, int]:
        r = build_packages(root, crates, PrintReporter(), cache=cache, jobs=1)
        return r.packages[0].manifest.crates[0].entries[0].hash, r.compiled

    first, compiled = entry_hash()
    assert compiled > 0 and entry_hash() == (first, 0)
    consts.write_text("import triton.language as tl\nSCALE = tl.constexpr(3)\n")
    again, compiled = entry_hash()
    assert compiled > 0 and again != first


def _fake_ptxas(path: Path, release: str) -> Path:
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    path.chmod(0o755)
    return path


def test_cubins_are_assembled_by_the_ptxas_triton_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRITON_PTXAS_PATH makes Triton write the PTX ISA of that ptxas (9.0 for CUDA 13): the cubin
    step must use the same tool (the one Triton ships refuses ``.version 9.0``), and its release
    is a fact of the build."""
    from hatch_khal.errors import KhalBuildError
    from hatch_khal.triton import language

    pytest.importorskip("triton")
    from hatch_khal.triton.ptxas import tool_release

    tool_release.cache_clear()
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    bundled, bundled_release = language.ptxas_tool(90)
    assert bundled.name == "ptxas" and bundled.parent == language._ptxas_dir()
    mine = _fake_ptxas(tmp_path / "ptxas", "13.0")
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(mine))
    assert language.ptxas_tool(90) == (mine, "13.0 (V13.0.1)")
    # Blackwell has its own variable, as in Triton's knobs
    assert language.ptxas_tool(100)[0].name == "ptxas-blackwell"
    # a TRITON_PTXAS_PATH that does not run falls back to Triton's own, as Triton does
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(tmp_path / "missing"))
    assert language.ptxas_tool(90) == (bundled, bundled_release)
    monkeypatch.setattr(language, "_ptxas_dir", lambda: tmp_path / "nowhere")
    with pytest.raises(KhalBuildError, match=r"Triton's ptxas, which does not run here .*TRITON_PTXAS_PATH="):
        language.ptxas_tool(90)


@pytest.mark.needs_triton
def test_the_fast_call_on_a_borrowed_stream_in_a_fresh_thread(
        built: tuple[Path, Any], fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """torch's stream passed in a thread where khal never made a context current (what a torch user
    does): the first call makes it current, the next ones take the generated call. (Written while
    finding why a call cost 10 us on the H200: not this; the generated front and the tensor reads.)"""
    import threading

    from khal_runtime.buffers import DeviceBuffer

    from tests.helpers.fakecuda import stream

    root, _ = built
    ks = _load(root, fake)
    add = ks.add_fp32
    slow = _count_slow_launches(monkeypatch)
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    borrowed = stream(0x77, native="TORCH")
    errors: list[BaseException] = []

    def user() -> None:
        try:
            for _ in range(3):
                add[(4,)](x, y, out, 4096, stream=borrowed)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=user)
    t.start()
    t.join()
    assert not errors, errors
    assert slow == ["add_fp32"]
    assert [la["stream"] for la in fake.launches[-3:]] == [borrowed.native] * 3


@pytest.mark.needs_triton
def test_k_of_a_grid_keeps_its_launcher_and_still_checks_every_grid(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer

    root, _ = built
    ks = _load(root, fake)
    add = ks.add_fp32
    assert add[(4,)] is add[(4,)] and add[4] is add[4] and add[(4,)] is not add[(2, 2)]
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    add[(4,)](x, y, out, 4096)
    add[(2, 2)](x, y, out, 4096)
    assert [la["grid"] for la in fake.launches[-2:]] == [(4, 1, 1), (2, 2, 1)]
    kept = len(add._grids)
    add[([3],)](x, y, out, 4096)  # unhashable inside: not kept, launched as before (a list is a dim3)
    assert fake.launches[-1]["grid"] == (3, 1, 1) and len(add._grids) == kept
    for g in range(100):  # more grids than are kept: each still launches its own
        add[(g + 1,)](x, y, out, 4096)
    assert fake.launches[-1]["grid"] == (100, 1, 1) and len(add._grids) <= 64


@pytest.mark.needs_triton
def test_bind_checks_once_and_launches_the_chosen_variant_with_its_shared_memory(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    """``k.bind(*args)`` then ``b(grid)``: the variant a call would choose, its dynamic shared
    memory (Triton's, below 48 KB: no attribute), the two null scratch pointers, grids of programs."""
    from khal_runtime.buffers import DeviceBuffer

    root, _ = built
    ks = _load(root, fake)
    a, b, c = (DeviceBuffer.zeros(64 * 64, np.float16) for _ in range(3))
    mm = ks.matmul_fp16
    args = (a, b, c, 64, 64, 64, 64, 1, 64, 1, 64, 1)
    bound = mm.bind(*args)
    assert bound.variant.entry.name == mm.chosen(*args) == "matmul_fp16"
    shared = bound.variant.entry.triton.shared
    assert 0 < shared <= 48 * 1024
    for grid in ((1,), (1,), 1, lambda meta: (64 // meta["BLOCK_SIZE_M"],)):
        bound(grid)
        la = fake.launches[-1]
        assert la["f"] == f"FUNC:{bound.variant.entry.symbol}" and la["grid"] == (1, 1, 1) and la["shmem"] == shared
    ones = set(bound.variant.entry.triton.ones)  # compiled in: not passed
    want = [v for name, v in zip(mm.arg_names, [a.ptr, b.ptr, c.ptr, 64, 64, 64, 64, 1, 64, 1, 64, 1])
            if name not in ones] + [0, 0]
    assert [int.from_bytes(s, "little") for s in fake.launches[-1]["slots"]] == want
    mm[(1,)](*args)  # the call launches with the same shared memory
    assert fake.launches[-1]["shmem"] == shared
    base = mm.bind(a, b, c, 60, 64, 64, 64, 1, 64, 1, 64, 1)  # M not divisible by 16: the twin
    assert base.variant.entry.name == "matmul_fp16__base"
    base((2, 1, 1))
    assert fake.launches[-1]["grid"] == (2, 1, 1)


@pytest.mark.needs_triton
def test_a_bound_launch_takes_each_grid_as_given_and_refuses_a_buffer_freed_since(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    """``b(grid)`` is the variant's bound launch itself (no frame of its own, the block packed at
    bind): each call launches the grid it is given. The same tuple or an equal int again reuses
    the blocks computed for it; a callable grid and a list are read on every call (one changed
    since launches its new grid); a grid past the limits is refused by name; a buffer freed after
    binding is refused (the arguments as given are checked again), with nothing launched. Launch
    hooks (tracing, profiling) see each bound launch with its grid."""
    import functools

    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.errors import ArgumentValueError
    from khal_runtime.launch_hooks import hooks

    root, _ = built
    add = _load(root, fake).add_fp32
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    b = add.bind(x, y, out, 4096)
    assert isinstance(b, functools.partial) and b.variant.entry.name == "add_fp32"
    g4, programs, dims = (4,), [4], [5]

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (programs[0],)

    want = []
    for g, expect in ((g4, (4, 1, 1)), ((2, 2), (2, 2, 1)), (g4, (4, 1, 1)), (int("7"), (7, 1, 1)),
                      (int("7"), (7, 1, 1)), (grid, (4, 1, 1))):
        b(g)
        want.append(expect)
    programs[0] = 3  # the same callable again, what it returns changed: its new grid
    b(grid)
    b(dims)
    dims[0] = 6  # the same list again, changed
    b(dims)
    want += [(3, 1, 1), (5, 1, 1), (6, 1, 1)]
    launched = fake.launches[-len(want):]
    assert [la["grid"] for la in launched] == want
    assert all(_pointers(la) == [x.ptr, y.ptr, out.ptr, 4096, 0, 0] and la["block"] == (128, 1, 1)
               for la in launched)
    seen: list[Any] = []

    def dispatch(plan: Any, grid: Any, block: Any, shmem: int, stream: Any, args: Any, launch: Any) -> None:
        seen.append((plan.entry.name, grid))
        launch()

    hooks.install(dispatch)  # a traced bound launch still reaches the hooks, with its grid
    try:
        b(g4)
        b((2, 2))
    finally:
        hooks.uninstall()
    assert seen == [("add_fp32", (4, 1, 1)), ("add_fp32", (2, 2, 1))]
    assert [la["grid"] for la in fake.launches[-2:]] == [(4, 1, 1), (2, 2, 1)]
    count = len(fake.launches)
    with pytest.raises(ArgumentValueError, match=r"add_fp32\[grid\]: grid: \(1, 70000, 1\) programs, more than"):
        b((1, 70000))
    b(0)  # an empty grid: nothing launched (#38)
    with pytest.raises(ArgumentValueError, match=r"add_fp32\[grid\]: grid: every dimension must be >= 0"):
        b(-1)
    y.free()
    with pytest.raises(ValueError, match="freed"):
        b(g4)
    with pytest.raises(ValueError, match="freed"):  # and on every call after it
        b(g4)
    assert len(fake.launches) == count


@pytest.mark.needs_triton
def test_a_launch_repeated_past_promotion_is_shared_with_other_threads_and_keeps_every_check(
        built: tuple[Path, Any], fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A remembered launch hit ``PROMOTE_AFTER`` times becomes a shared snapshot (its block copied,
    the launch call prebuilt): another thread calling with the same objects, grid and stream launches
    it with nothing read again but each tensor's address and dtype (its own memo slots are empty), and it
    still keeps the memo's checks:
    a moved tensor is read again, a freed buffer is refused."""
    import threading

    from khal_runtime import triton as khal_triton
    from khal_runtime.buffers import DeviceBuffer

    from tests.helpers.fakecuda import stream

    root, _ = built
    add = _load(root, fake).add_fp32
    slow = _count_slow_launches(monkeypatch)
    shared = stream(0x66, native="SHARED")
    x, y, out = _Tensor(0x10000), _Tensor(0x20000), _Tensor(0x30000)
    go = add[(4,)]
    for _ in range(khal_triton.PROMOTE_AFTER + 3):
        go(x, y, out, 4096, stream=shared)
    reads = x.dtype_reads
    errors: list[BaseException] = []

    def other() -> None:
        try:
            from khal_runtime.device import ensure_current

            ensure_current(0)
            for _ in range(3):
                go(x, y, out, int("4096"), stream=shared)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert not errors, errors
    assert x.dtype_reads == reads + 3  # the other thread read the dtype alone: the shared snapshot
    assert slow == ["add_fp32"]
    assert all(_pointers(la) == [0x10000, 0x20000, 0x30000, 4096, 0, 0] and la["stream"] == shared.native
               for la in fake.launches[-3:])
    x.add_()  # written in place: the snapshot still holds
    go(x, y, out, 4096, stream=shared)
    assert x.dtype_reads == reads + 4
    x.set_(0x40000)  # moved: read again
    go(x, y, out, 4096, stream=shared)
    assert _pointers(fake.launches[-1])[:3] == [0x40000, 0x20000, 0x30000] and x.dtype_reads > reads + 4
    a, b, c = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    for _ in range(khal_triton.PROMOTE_AFTER + 3):
        go(a, b, c, 4096, stream=shared)
    assert any(snap[0] is a for snap in add._shared)
    count = len(fake.launches)
    a.free()  # a free forgets every snapshot
    assert all(snap[0] is not a for snap in add._shared)
    with pytest.raises(ValueError, match="freed"):
        go(a, b, c, 4096, stream=shared)
    assert len(fake.launches) == count


class _Dtype:
    """A torch dtype's look-alike (``str`` gives ``torch.float32``)."""

    def __init__(self, name: str = "float32") -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


class _Tensor:
    """A torch tensor's look-alike: ``data_ptr()`` (``set_`` moves it, as ``.data =`` / ``set_`` do),
    ``_version`` (an in-place write bumps it), and counts of the reads of its dtype."""

    is_cuda = True

    def __init__(self, ptr: int, dtype: str = "float32") -> None:
        self.ptr, self._version, self._dtype, self.dtype_reads = ptr, 0, _Dtype(dtype), 0

    @property
    def dtype(self) -> _Dtype:
        self.dtype_reads += 1
        return self._dtype

    def data_ptr(self) -> int:
        return self.ptr

    def get_device(self) -> int:
        return 0

    def add_(self) -> None:  # an in-place write: the memory changes, the tensor does not move
        self._version += 1

    def set_(self, ptr: int) -> None:
        self.ptr = ptr
        self._version += 1


_Tensor.__module__ = "torch"


def _pointers(launch: dict[str, Any]) -> list[int]:
    return [int.from_bytes(s, "little") for s in launch["slots"]]


@pytest.mark.needs_triton
def test_a_repeated_call_launches_its_remembered_block_without_reading_the_arguments_again(
        built: tuple[Path, Any], fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The family's memo: the same tensors, grid and stream again launch the block packed the first
    time the direct path saw them (its address and dtype compared, no pack); an in-place write keeps it (the
    address is what was packed), a moved tensor, another grid, stream or scalar do not."""
    from tests.helpers.fakecuda import stream

    root, _ = built
    add = _load(root, fake).add_fp32
    slow = _count_slow_launches(monkeypatch)
    x, y, out = _Tensor(0x10000), _Tensor(0x20000), _Tensor(0x30000)
    go = add[(4,)]
    for _ in range(4):
        go(x, y, out, 4096)
    assert slow == ["add_fp32"] and len(fake.launches) == 4
    reads = x.dtype_reads
    ex = fake.ex_calls
    for _ in range(3):
        go(x, y, out, 4096)
    assert x.dtype_reads == reads + 3  # remembered: its address and dtype compared, nothing else read
    assert fake.ex_calls == ex + 3
    for _ in range(3):  # a size computed each call (``x.numel()``): an equal int, another object
        go(x, y, out, int("4096"))
    assert x.dtype_reads == reads + 6 and fake.ex_calls == ex + 6
    ex = fake.ex_calls  # the prebuilt launch call (cuLaunchKernelEx, its configuration made once)
    assert all(_pointers(la) == [0x10000, 0x20000, 0x30000, 4096, 0, 0] and la["grid"] == (4, 1, 1)
               for la in fake.launches[-10:])
    x.add_()  # written in place: the same address
    go(x, y, out, 4096)
    assert _pointers(fake.launches[-1])[:3] == [0x10000, 0x20000, 0x30000]
    x.set_(0x40000)  # moved (set_ / .data =): read again
    go(x, y, out, 4096)
    go(x, y, out, 4096)
    assert _pointers(fake.launches[-1])[:3] == [0x40000, 0x20000, 0x30000]
    add[(2, 3)](x, y, out, 4096)  # another grid
    assert fake.launches[-1]["grid"] == (2, 3, 1)
    go(x, y, out, 4096)
    assert fake.launches[-1]["grid"] == (4, 1, 1)
    other = stream(0x99, native="OTHER")
    go(x, y, out, 4096, stream=other)  # another stream
    go(x, y, out, 4096, stream=other)
    assert [la["stream"] for la in fake.launches[-2:]] == [other.native] * 2
    go(x, y, out, 4096)
    assert fake.launches[-1]["stream"] != other.native
    go(x, y, out, 2048)  # a changed scalar
    assert _pointers(fake.launches[-1])[3] == 2048
    go(x, y, out, 4096)
    assert _pointers(fake.launches[-1])[3] == 4096
    programs = [4]
    grid = add[lambda meta: (programs[0],)]  # one callable: evaluated on every call
    for g in (4, 4, 3, 3):
        programs[0] = g
        grid(x, y, out, 4096)
        assert fake.launches[-1]["grid"] == (g, 1, 1)
    assert slow == ["add_fp32"]  # every one of these on the generated call


@pytest.mark.needs_triton
def test_a_remembered_call_whose_argument_breaks_an_assumption_switches_variant_or_refuses(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer

    root, _ = built
    ks = _load(root, fake)
    add = ks.add_fp32
    base = ks.crates["tutorials"].instances["add_fp32__base"].entry.symbol
    x, y, out = _Tensor(0x10000), _Tensor(0x20000), _Tensor(0x30000)
    go = add[(4,)]
    for _ in range(3):
        go(x, y, out, 4096)
    assert fake.launches[-1]["f"] == f"FUNC:{add.entry.symbol}"
    x.set_(0x10004)  # no longer 16-byte aligned: the conservative twin
    go(x, y, out, 4096)
    go(x, y, out, 4096)
    assert [la["f"] for la in fake.launches[-2:]] == [f"FUNC:{base}"] * 2
    assert _pointers(fake.launches[-1])[0] == 0x10004
    x.set_(0x10002)  # not a multiple of 4 bytes: refused, nothing launched
    count = len(fake.launches)
    with pytest.raises(ValueError, match=r"argument 'x_ptr' \(\*fp32\) points at 0x10002, not a multiple of 4"):
        go(x, y, out, 4096)
    x._dtype = _Dtype("float16")  # .data = a tensor of another dtype at another address
    x.set_(0x50000)
    with pytest.raises(TypeError, match="an array of float16"):
        go(x, y, out, 4096)
    assert len(fake.launches) == count
    mm = ks.matmul_fp16
    p, q, r = _Tensor(0x60000, "float16"), _Tensor(0x70000, "float16"), _Tensor(0x80000, "float16")
    unit = (p, q, r, 64, 64, 64, 64, 1, 64, 1, 64, 1)  # the unit strides the specialised variant compiles in
    column = (p, q, r, 64, 64, 64, 1, 64, 64, 1, 64, 1)  # stride_ak is not 1: the twin, every value passed
    for args, variant, values in ((unit, "matmul_fp16", 11), (column, "matmul_fp16__base", 14),
                                  (unit, "matmul_fp16", 11)):
        for _ in range(3):
            mm[(1,)](*args)
            la = fake.launches[-1]
            assert la["f"].startswith(f"FUNC:{variant}_khal_") and len(la["slots"]) == values
    count = len(fake.launches)
    a, b, c = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    for _ in range(3):
        go(a, b, c, 4096)
    a.free()  # a freed buffer: every memo forgets it
    with pytest.raises(ValueError, match="freed"):
        go(a, b, c, 4096)
    assert len(fake.launches) == count + 3
    whole = DeviceBuffer.zeros(8192, np.float32)
    view = whole[4096:]  # a view: remembered (its address cannot move), forgotten when its base is freed
    for _ in range(3):
        go(view, b, c, 4096)
    assert _pointers(fake.launches[-1])[0] == whole.ptr + 4096 * 4
    whole.free()
    with pytest.raises(ValueError, match="freed"):
        go(view, b, c, 4096)
    count = len(fake.launches)
    with pytest.raises(ValueError, match=r"argument 'n_elements' \(scalar int32\).*out of range for int32"):
        go(b, b, c, 2**40)  # the direct path's pack refuses it: the slow path names it
    assert len(fake.launches) == count


@pytest.mark.needs_triton
def test_a_remembered_call_still_reaches_the_launch_hooks_and_reports_a_failed_launch(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    from khal_runtime.errors import CudaError
    from khal_runtime.launch_hooks import hooks

    from tests.helpers.fakecuda import CUresult

    root, _ = built
    add = _load(root, fake).add_fp32
    x, y, out = _Tensor(0x10000), _Tensor(0x20000), _Tensor(0x30000)
    go = add[(4,)]
    for _ in range(3):
        go(x, y, out, 4096)
    seen: list[Any] = []

    def dispatch(plan: Any, grid: Any, block: Any, shmem: int, stream: Any, args: Any, launch: Any) -> None:
        seen.append((plan.entry.name, grid, tuple(args)))
        launch()

    hooks.install(dispatch)
    try:
        go(x, y, out, 4096)
        go(x, y, out, 4096)
    finally:
        hooks.uninstall()
    assert seen == [("add_fp32", (4, 1, 1), (0x10000, 0x20000, 0x30000, 4096, 0, 0))] * 2
    go(x, y, out, 4096)
    fake.fail["cuLaunchKernel"] = CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError, match=r"add_fp32.*CUDA_ERROR_INVALID_VALUE.*grid \(4, 1, 1\)"):
        go(x, y, out, 4096)  # the remembered launch
    with pytest.raises(CudaError, match=r"add_fp32.*CUDA_ERROR_INVALID_VALUE"):
        go(x, y, out, 2048)  # the direct one


@pytest.mark.needs_triton
def test_threads_remember_their_own_launches(built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    """Each thread's memo slots are its own: two threads cycling through their own argument sets
    (more sets than slots, so slots are refilled while the other thread hits) launch exactly what
    each call passed."""
    import sys
    import threading

    from tests.helpers.fakecuda import stream

    root, _ = built
    add = _load(root, fake).add_fp32
    add[(4,)](_Tensor(0x1000), _Tensor(0x2000), _Tensor(0x3000), 64)  # the checked first call
    errors: list[BaseException] = []
    streams = [stream(0x50 + t, native=f"S{t}") for t in range(2)]
    sets = [[(_Tensor(0x100000 * (t + 1) + 0x1000 * j), _Tensor(0x200000 + 0x1000 * j), _Tensor(0x300000), 64 * j)
             for j in range(1, 7)] for t in range(2)]
    want = {streams[t].native: {(a.ptr, b.ptr, c.ptr, n) for a, b, c, n in sets[t]} for t in range(2)}

    def user(t: int) -> None:
        try:
            from khal_runtime.device import ensure_current

            ensure_current(0)
            for i in range(300):
                add[(4,)](*sets[t][i % 6 if i % 3 else 0], stream=streams[t])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: inside a launch too
    try:
        threads = [threading.Thread(target=user, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
    launched = [la for la in fake.launches if la["stream"] in want]
    assert len(launched) == 600
    assert all(tuple(_pointers(la)[:4]) in want[la["stream"]] for la in launched)


# -- scratch memory and clusters (the hopper crate: sm_90 only) ------------------------------------

@pytest.mark.needs_triton
def test_a_tensor_descriptor_kernel_records_its_scratch_and_a_num_ctas_kernel_its_cluster(
        built: tuple[Path, Any]) -> None:
    from khal_runtime.manifest import TritonScratch

    _, result = built
    (out,) = result.packages
    crate = out.manifest.crate("hopper")
    assert [(a.kind, a.arch) for a in crate.artifacts] == [("cubin", "sm_90a")]
    desc = crate.entry("desc_add_fp32")
    assert desc.triton is not None and desc.attributes is None
    # Triton 3.6 on sm_90: three device-side descriptors, 128 bytes each, per program
    assert desc.triton.global_scratch == TritonScratch(size=384, align=128) and desc.triton.profile_scratch is None
    assert desc.triton.num_ctas is None and "global_scratch" in desc.triton.record()
    assert [p.name for p in desc.params][-2:] == ["khal_global_scratch", "khal_profile_scratch"]
    cl = crate.entry("add_cluster_fp32")
    assert cl.triton is not None and cl.triton.num_ctas == 2 and cl.triton.global_scratch is None
    assert cl.attributes is not None and cl.attributes.cluster_dims == (2, 1, 1)
    assert cl.symbol.encode() in out.files[crate.artifacts[0].path]
    plain = out.manifest.crate("tutorials").entry("add_fp32").triton
    assert plain is not None and not {"num_ctas", "global_scratch", "profile_scratch"} & set(plain.record())


@pytest.mark.needs_triton
def test_an_edited_scratch_size_is_refused_and_a_manifest_without_the_fields_loads(
        built: tuple[Path, Any], tmp_path: Path) -> None:
    import khal_runtime
    from khal_runtime.errors import ManifestError

    root, _ = built
    pkg, m = _copy(root, tmp_path)
    hopper = next(c for c in m["crates"] if c["name"] == "hopper")
    assert all("num_ctas" not in e["triton"] and "global_scratch" not in e["triton"] for e in _tutorials(m)["entries"])
    desc = next(e for e in hopper["entries"] if e["name"] == "desc_add_fp32")
    desc["triton"]["global_scratch"]["size"] = 128  # too little scratch for the kernel's descriptors
    (pkg / "_khal" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="entry 'desc_add_fp32'.*the manifest was edited after the build"):
        khal_runtime.load(pkg)


def _hopper(root: Path, drv: FakeDriver) -> Any:
    """The built package on the fake driver, its hopper crate's cubin (no PTX) declaring its layouts."""
    from tests.helpers.fakecuda import cubin_param_layouts

    pkg = root / "khal_triton_kernels"
    cubin = next((pkg / "_khal" / "hopper").glob("*.cubin")).read_bytes()
    drv.layouts.update({f"FUNC:{n}": lay for n, lay in cubin_param_layouts(cubin).items()})
    return _load(root, drv)


def _allocs(drv: FakeDriver) -> list[int]:
    return [c[1] for c in drv.calls if c[0] == "cuMemAlloc"]


@pytest.mark.needs_triton
def test_a_scratch_kernel_gets_the_streams_buffer_grown_when_a_grid_needs_more_and_kept(
        built: tuple[Path, Any], fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from khal_runtime import scratch
    from khal_runtime.buffers import DeviceBuffer
    from tests.helpers.fakecuda import stream

    root, _ = built
    ks = _hopper(root, fake)
    desc = ks.desc_add_fp32
    slow = _count_slow_launches(monkeypatch)
    x, y, out = (DeviceBuffer.zeros(64 * 64, np.float32) for _ in range(3))
    fake.calls.clear()
    desc[(2, 2)](x, y, out, 64, 64)  # the checked path
    la = fake.launches[-1]
    assert la["grid"] == (2, 2, 1) and la["block"] == (128, 1, 1)
    first = _pointers(la)[5]
    assert _pointers(la)[:5] == [x.ptr, y.ptr, out.ptr, 64, 64] and _pointers(la)[6] == 0
    assert first != 0 and first % 256 == 0 and _allocs(fake) == [4 * 384]  # 4 programs x 384 B
    for _ in range(3):  # the generated call: full read, then the memo
        desc[(2, 2)](x, y, out, 64, 64)
        assert _pointers(fake.launches[-1])[5] == first
    assert slow == ["desc_add_fp32"] and len(_allocs(fake)) == 1  # kept, not an allocation per launch
    desc[(1,)](x, y, out, 64, 64)  # fewer programs: the same buffer
    assert _pointers(fake.launches[-1])[5] == first and len(_allocs(fake)) == 1
    desc[(8, 8)](x, y, out, 64, 64)  # 64 programs need 24576 B: grown (at least doubled)
    grown = _pointers(fake.launches[-1])[5]
    assert grown != first and _allocs(fake)[1] == 64 * 384 and first not in fake.freed  # the old one kept
    desc[(2, 2)](x, y, out, 64, 64)  # a remembered launch may keep the old buffer: valid, only this stream's
    assert _pointers(fake.launches[-1])[5] in (first, grown)
    assert scratch.held() == {"pools": 64 * 384, "retired": 4 * 384, "foreign": 0}
    other = stream(0x99, native="OTHER")
    desc[(2, 2)](x, y, out, 64, 64, stream=other)  # another stream: a buffer of its own
    mine = _pointers(fake.launches[-1])[5]
    assert fake.launches[-1]["stream"] == other.native and mine not in (first, grown) and len(_allocs(fake)) == 3
    b = desc.bind(x, y, out, 64, 64)  # bind(): the pointer for each grid
    b((2, 2))
    assert fake.launches[-1]["grid"] == (2, 2, 1) and _pointers(fake.launches[-1])[5] == grown
    b((16, 16))  # 256 programs: grown again, and bound again with the new pointer
    assert fake.launches[-1]["grid"] == (16, 16, 1) and _allocs(fake)[-1] == 256 * 384
    assert _pointers(fake.launches[-1])[5] not in (first, grown, mine)
    scratch.release()
    assert scratch.held() == {"pools": 0, "retired": 0, "foreign": 0} and first in fake.freed
    desc[(2, 2)](x, y, out, 64, 64)  # allocated again (release emptied the memo: DeviceBuffer.free)
    assert _pointers(fake.launches[-1])[5] not in fake.freed and len(_allocs(fake)) == 5


@pytest.mark.needs_triton
def test_a_num_ctas_kernel_launches_num_ctas_blocks_per_program_on_every_path(
        built: tuple[Path, Any], fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer

    root, _ = built
    ks = _hopper(root, fake)
    add = ks.add_cluster_fp32
    slow = _count_slow_launches(monkeypatch)
    x, y, out = (DeviceBuffer.zeros(4096, np.float32) for _ in range(3))
    for _ in range(3):  # checked, full read, memo
        add[(4,)](x, y, out, 4096)
        la = fake.launches[-1]
        assert la["grid"] == (8, 1, 1) and la["block"] == (128, 1, 1) and _pointers(la) == [x.ptr, y.ptr, out.ptr,
                                                                                          4096, 0, 0]
    assert slow == ["add_cluster_fp32"]
    add[lambda meta: (3, 2)](x, y, out, 4096)
    assert fake.launches[-1]["grid"] == (6, 2, 1)
    b = add.bind(x, y, out, 4096)
    b(5)
    assert fake.launches[-1]["grid"] == (10, 1, 1) and fake.launches[-1]["block"] == (128, 1, 1)
    assert not [c for c in fake.calls if c[0] == "cuMemAlloc" and c[1] != 4096 * 4]  # no scratch


@pytest.mark.needs_triton
def test_a_captured_scratch_launch_takes_the_streams_buffer_for_its_graph_and_refuses_to_allocate(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.device import default_stream
    from khal_runtime.errors import CaptureError

    root, _ = built
    ks = _hopper(root, fake)
    desc = ks.desc_add_fp32
    st = default_stream()
    x, y, out = (DeviceBuffer.zeros(64 * 64, np.float32) for _ in range(3))
    with pytest.raises(CaptureError, match=r"needs 1536 bytes of scratch memory .* holds 0 bytes .* run the step "
                                           r"once on the stream before capturing"):
        with st.capture():
            desc[(2, 2)](x, y, out, 64, 64, stream=st)  # no warm-up: nothing to take, and no allocating
    for _ in range(2):  # the warm-up (twice: the second launch is remembered)
        desc[(2, 2)](x, y, out, 64, 64, stream=st)
    warm = _pointers(fake.launches[-1])[5]
    n = len(_allocs(fake))
    with st.capture() as cap:
        desc[(2, 2)](x, y, out, 64, 64, stream=st)
        desc[(1, 2)](x, y, out, 64, 64, stream=st)  # fits: the capture's buffer again
        with pytest.raises(CaptureError, match="needs 24576 bytes"):
            desc[(8, 8)](x, y, out, 64, 64, stream=st)  # more than the warm-up allocated
    graph = cap.graph
    captured = [_pointers(la)[5] for la in fake.launches[-2:]]
    assert captured == [warm, warm] and len(_allocs(fake)) == n and graph.scratch_bytes >= 4 * 384
    for _ in range(2):  # eager again: the graph's buffer is the graph's; the stream gets a new one
        desc[(2, 2)](x, y, out, 64, 64, stream=st)
        assert _pointers(fake.launches[-1])[5] != warm
    assert len(_allocs(fake)) == n + 1
    b = desc.bind(x, y, out, 64, 64, stream=st)
    b((2, 2))
    eager = _pointers(fake.launches[-1])[5]
    with st.capture() as cap2:
        b((2, 2))  # a bound launch in a capture: bound again, to the capture's own buffer
    assert _pointers(fake.launches[-1])[5] == eager and cap2.graph.scratch_bytes > 0
    b((2, 2))
    assert _pointers(fake.launches[-1])[5] != eager  # and out of it again
    before = len(_allocs(fake))
    graph.update(lambda: desc[(2, 2)](x, y, out, 64, 64, stream=st))  # a re-capture: the graph's own buffer
    assert _pointers(fake.launches[-1])[5] == warm and len(_allocs(fake)) == before
    assert graph.scratch_bytes >= 4 * 384


def _triton_entry(name: str, attributes: Any) -> Any:
    """A Triton entry (``x: *fp32, n: i32``) with launch attributes, hashed as a build hashes it."""
    from khal_runtime import abi
    from khal_runtime.manifest import Entry, Param, TritonFacts
    from tests.helpers.fakecuda import CONTENT

    facts = TritonFacts(kernel="k", family=name, num_warps=4, num_stages=3, shared=0, names=("x", "n"),
                        types=("*fp32", "i32"), cache_key="ck", triton_version="3.6.0")
    u64 = {"kind": "scalar", "element_type": "uint64", "element_size": 8, "element_align": 8}
    params = (Param(name="x", **u64), Param(name="n", kind="scalar", element_type="int32", element_size=4,
                                            element_align=4),
              Param(name="khal_global_scratch", **u64), Param(name="khal_profile_scratch", **u64))
    sig = abi.entry_signature(name, (128, 1, 1), params, grid_dims=3, attributes=attributes, triton=facts.record())
    h = abi.entry_hash(CONTENT, sig)
    return Entry(name=name, symbol=abi.symbol_for(name, h), hash=h, block_size=(128, 1, 1), params=params,
                 grid_dims=3, attributes=attributes, triton=facts)


def test_tritons_pdl_and_cooperative_metadata_reach_every_launch_of_the_family(
        fake: FakeDriver, tmp_path: Path) -> None:  # noqa: F811
    """``launch_pdl`` / ``launch_cooperative_grid`` (the entry's attributes, from Triton's metadata)
    are on each launch's cuLaunchKernelEx, whichever path launches it: checked, generated, remembered,
    bound, captured."""
    from khal_runtime.manifest import LaunchAttributes
    from tests.helpers.fakecuda import fake_kernels

    entries = [_triton_entry("pdl", LaunchAttributes(pdl=True)),
               _triton_entry("coop", LaunchAttributes(cooperative=True)),
               _triton_entry("plain", None)]
    ks = fake_kernels(fake, tmp_path, entries, language="triton")
    want = {"pdl": [("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION", 1)],
            "coop": [("CU_LAUNCH_ATTRIBUTE_COOPERATIVE", 1)], "plain": []}
    for name, attrs in want.items():
        k = getattr(ks, name)
        assert isinstance(k, TritonKernel)
        n = len(fake.launches)
        for _ in range(3):
            k[(4,)](0x1000, 64)
        k.bind(0x1000, 64)(2)
        st = k.variants[0].resolve_stream(None)
        with st.capture():
            k[(4,)](0x1000, 64)
        got = fake.launches[n:]
        assert len(got) == 5 and all(la["attrs"] == attrs for la in got), (name, [la["attrs"] for la in got])
        assert all(la["f"] == f"FUNC:{k.entry.symbol}" for la in got)
    assert fake.occupancy_calls  # the cooperative grid checked against what can be co-resident


@pytest.mark.needs_triton
def test_a_scratch_launch_in_another_librarys_capture_takes_the_streams_buffer_for_good(
        built: tuple[Path, Any], fake: FakeDriver) -> None:  # noqa: F811
    """A capture the runtime did not begin (``torch.cuda.graph``: the driver says the stream is
    capturing): the launch takes the stream's buffer, kept for the process, and the stream's next
    eager launch allocates a new one."""
    from khal_runtime import scratch
    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.errors import CaptureError
    from tests.helpers.fakecuda import CUstreamCaptureMode, stream

    root, _ = built
    desc = _hopper(root, fake).desc_add_fp32
    x, y, out = (DeviceBuffer.zeros(64 * 64, np.float32) for _ in range(3))
    theirs = stream(0x77, native="TORCH")
    desc[(2, 2)](x, y, out, 64, 64, stream=theirs)  # the warm-up
    warm = _pointers(fake.launches[-1])[5]
    fake.capturing[theirs.native] = CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL  # their capture begins
    fake.captured[theirs.native] = []
    desc[(2, 2)](x, y, out, 64, 64, stream=theirs)
    desc[(2, 1)](x, y, out, 64, 64, stream=theirs)
    assert [_pointers(la)[5] for la in fake.captured[theirs.native]] == [warm, warm]
    with pytest.raises(CaptureError, match="needs 24576 bytes of scratch memory"):
        desc[(8, 8)](x, y, out, 64, 64, stream=theirs)
    del fake.capturing[theirs.native]  # it ends
    assert scratch.held()["foreign"] == 4 * 384 and scratch.held()["pools"] == 0
    desc[(2, 2)](x, y, out, 64, 64, stream=theirs)
    assert _pointers(fake.launches[-1])[5] != warm and scratch.held()["pools"] == 4 * 384


# -- what each kernel may write (hatch_khal.triton.effects) ----------------------------------------

@pytest.mark.needs_triton
def test_each_instance_records_the_pointers_its_kernel_may_write(built: tuple[Path, Any]) -> None:
    _, result = built
    (out,) = result.packages
    got = {e.name: e.triton.written for c in out.manifest.crates for e in c.entries if e.triton is not None}
    want = {"add": ("output_ptr",), "softmax": ("output_ptr",), "matmul": ("c_ptr",), "desc_add": ("out_ptr",)}
    for name, written in got.items():
        family = next((f for f in want if name.startswith(f)), None)
        if family is not None:
            assert written == want[family], name
    assert {n for n in got if n.startswith(tuple(want))} >= {"add_fp32", "add_fp32__base", "softmax_1024",
                                                            "matmul_fp16", "matmul_fp16_big", "desc_add_fp32",
                                                            "add_cluster_fp32"}
    rec = out.manifest.crate("tutorials").entry("add_fp32").triton.record()  # type: ignore[union-attr]
    assert rec["written"] == ["output_ptr"]


@pytest.mark.needs_triton
@pytest.mark.parametrize("edit", [["x_ptr", "output_ptr"], [], None])
def test_an_edited_written_list_is_refused_as_an_edited_manifest(built: tuple[Path, Any], tmp_path: Path,
                                                                 edit: list[str] | None) -> None:
    import khal_runtime
    from khal_runtime.errors import ManifestError

    root, _ = built
    pkg, m = _copy(root, tmp_path)
    e = next(e for e in _tutorials(m)["entries"] if e["name"] == "add_fp32")
    assert e["triton"]["written"] == ["output_ptr"]
    if edit is None:
        del e["triton"]["written"]  # (a manifest without the field: every pointer written, but this one's hash has it)
    else:
        e["triton"]["written"] = edit
    (pkg / "_khal" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="entry 'add_fp32'.*the manifest was edited after the build"):
        khal_runtime.load(pkg)


@pytest.mark.needs_triton
def test_a_kernel_inside_the_package_may_import_its_siblings_relatively(tmp_path: Path) -> None:
    """A Triton source inside the wheel's package is compiled as its module there (``pkg.ops.add``):
    ``from .helpers import ...`` and ``from . import consts`` find its siblings, without running the
    package's ``__init__`` (which would import the kernels being built)."""
    root = tmp_path / "proj"
    ops = root / "relpkg" / "ops"
    ops.mkdir(parents=True)
    (root / "relpkg" / "__init__.py").write_text("raise ImportError('the package __init__ must not run at build')\n")
    (ops / "__init__.py").write_text("")
    (ops / "consts.py").write_text("SCALE = 3.0\n")
    (ops / "helpers.py").write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
                                    "def scaled(x, s):\n    return x * s\n")
    (ops / "add.py").write_text(
        "import triton\nimport triton.language as tl\n\nfrom . import consts\nfrom .helpers import scaled\n\n"
        "S = tl.constexpr(consts.SCALE)\n\n\n@triton.jit\n"
        "def add_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    mask = offs < n\n"
        "    tl.store(out_ptr + offs, scaled(tl.load(x_ptr + offs, mask=mask), S), mask=mask)\n")
    (root / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.hatch.build.targets.wheel.hooks.khal]
        archs = ["sm_90"]
        ptx-arch = "none"

        [[tool.hatch.build.targets.wheel.hooks.khal.crates]]
        name = "rel"
        sources = ["relpkg/ops/add.py"]
        package = "relpkg"

        [[tool.hatch.build.targets.wheel.hooks.khal.crates.instances]]
        kernel = "add_kernel"
        signature = { x_ptr = "*fp32:16", out_ptr = "*fp32:16", n = "i32", BLOCK = 128 }
    """))
    result = _build(root, "relpkg", tmp_path / "cache")
    (crate,) = result.packages[0].manifest.crates
    assert {e.triton.module for e in crate.entries} == {"relpkg.ops.add"}  # type: ignore[union-attr]
    # the helper's and the constant's files are among what the build read (their edits rebuild it)
    assert {"relpkg/ops/helpers.py", "relpkg/ops/consts.py"} <= {s.path for s in crate.sources}
