"""Issue #19, the build side and the runtime on the CPU: kernels as their authors wrote them.

Templated entries and their instantiations, element types resolved by the compiler (typedefs,
macros, multi-word builtins, complex), 2-D / 3-D launch shapes and launch bounds, indirect
variants that are correct or absent, preprocessor conditions, one source built as several
crates, and the runtime's side of each (dtype mapping, the struct-element rule, N-D typed
calls, blocks within launch bounds, dispatch_indirect saying why). The GPU half is
tests/runtime/cuda/test_real_kernels_gpu.py, on the package tests/packages/real_kernels_pkg.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hatch_khal.entries import find_entries, scan_crate
from hatch_khal.preprocessor import MacroEnv
from hatch_khal.errors import CompileError, EntryParseError, KhalBuildError, SourceError
from khal_runtime import abi
from khal_runtime.arguments import dtype_ok
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.dtypes import dtype_info
from khal_runtime.errors import ArgumentError, ArgumentValueError, KhalError, ManifestError
from khal_runtime.manifest import Entry, Param, parse_manifest
from khal_runtime.verify import check_manifest, verify_package

from tests.helpers.projects import make_project
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, scalar, storage  # noqa: F401
from tests.helpers.build import build, manifest_of
from tests.helpers.paths import PACKAGES
from tests.conftest import SESSION_ENV

REAL_PKG = PACKAGES / "real_kernels_pkg"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV and k != "KHAL_CACHE_DIR":
            monkeypatch.delenv(k)


# =============================================================================================
# the scanner: templates, launch shapes, spellings, conditions
# =============================================================================================

TEMPLATED = """\
#include <cuda/std/complex>
template <typename T>
KHAL_ENTRY(scale, 256, (KHAL_STORAGE(T, x), KHAL_SCALAR(T, a)))
{ uint64_t i = KHAL_GLOBAL_ID; if (i < x.len) x[i] = x[i] * a; }
KHAL_INSTANTIATE(scale, scale_f32, float)
KHAL_INSTANTIATE(scale, scale_c64, cuda::std::complex<float>)
template <typename T, int N = 4>
KHAL_ENTRY(window, 64, (KHAL_STORAGE_ARRAY(const T, 8, lut), KHAL_STORAGE(Vec<T>, out))) { }
KHAL_INSTANTIATE(window, window_f64, double)
KHAL_INSTANTIATE(window, window_f64_8, double, 8)
"""


def test_templated_entries_are_one_entry_per_instantiation() -> None:
    got = {e.name: e for e in find_entries(TEMPLATED, "t.cu")}
    assert sorted(got) == ["scale_c64", "scale_f32", "window_f64", "window_f64_8"]
    f32, c64 = got["scale_f32"], got["scale_c64"]
    assert (f32.template, f32.template_args, f32.line, f32.function) == ("scale", ("float",), 5, "scale")
    assert c64.template_args == ("cuda::std::complex<float>",) and c64.line == 6
    assert [p.ctype for p in f32.params] == ["T", "T"]  # as spelled: the compiler resolves T
    assert got["window_f64_8"].template_args == ("double", "8")
    assert got["window_f64"].spelled("Vec<T>") == "Vec<double>"
    # each instantiation hashes differently (the arguments are in its signature)
    assert len({abi.entry_hash("c" * 64, e.signature()) for e in got.values()}) == 4


@pytest.mark.parametrize("src, err, match", [
    ("template <typename T>\nKHAL_ENTRY(k, 32, (KHAL_STORAGE(T, x))) {}\n", EntryParseError,
     r"t\.cu:2: .*template entry 'k' has no KHAL_INSTANTIATE; .*KHAL_INSTANTIATE\(k, k_f32, float\)"),
    ("KHAL_INSTANTIATE(nope, n_f32, float)\n", EntryParseError,
     r"t\.cu:1: crate 'c': KHAL_INSTANTIATE\(nope, n_f32, \.\.\.\): no templated KHAL_ENTRY"),
    ("KHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) {}\nKHAL_INSTANTIATE(k, k2, float)\n", EntryParseError,
     r"t\.cu:2: .*entry 'k' \(t\.cu:1\) is not templated"),
    ("template <typename T, typename U>\nKHAL_ENTRY(k, 32, (KHAL_STORAGE(T, x))) {}\nKHAL_INSTANTIATE(k, k2, float)\n",
     EntryParseError, r"t\.cu:3: .*gives 1 template argument.*takes 2 \(T, U\)"),
    ("template <typename... T>\nKHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) {}\n", EntryParseError,
     r"t\.cu:2: .*variadic"),
    ("template <typename T>\nKHAL_ENTRY(k, 32, (KHAL_STORAGE(T, x))) {}\nKHAL_INSTANTIATE(k, k, float)\n",
     SourceError, r"instantiation 'k' has the name of its template"),
    ("template <typename T>\nKHAL_ENTRY(k, 32, (KHAL_STORAGE(T, x))) {}\nKHAL_INSTANTIATE(k, k1, float)\n"
     "KHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) {}\n", SourceError, r"t\.cu:4: .*the name of the template entry"),
    ("KHAL_INSTANTIATE(k)\n", EntryParseError, r"t\.cu:1: KHAL_INSTANTIATE takes"),
])
def test_template_mistakes_are_named(src: str, err: type[Exception], match: str) -> None:
    with pytest.raises(err, match=match):
        scan_crate([("t.cu", src)], "c")


@pytest.mark.parametrize("marker, block, dims, fixed, bounds", [
    ("KHAL_ENTRY(k, 256, (KHAL_STORAGE(float, x))) { x[KHAL_GLOBAL_ID] = 0; }", (256, 1, 1), 1, True, None),
    ("KHAL_ENTRY(k, (16, 16), (KHAL_STORAGE(float, x))) { }", (16, 16, 1), 2, True, None),
    ("KHAL_ENTRY(k, (8, 8, 4), (KHAL_STORAGE(float, x))) { }", (8, 8, 4), 3, True, None),
    ("KHAL_ENTRY(k, 128, (KHAL_STORAGE(float, x))) { int b = blockIdx.y; }", (128, 1, 1), 2, True, None),
    ("KHAL_ENTRY(k, 128, (KHAL_STORAGE(float, x))) { int b = gridDim . z; }", (128, 1, 1), 3, True, None),
    ("KHAL_ENTRY(k, 64, (KHAL_STORAGE(float, x))) { x[KHAL_GLOBAL_ID_Y] = KHAL_NUM_GROUPS_X; }", (64, 1, 1), 2, True,
     None),
    ("KHAL_ENTRY(k, 64, (KHAL_STORAGE(float, x)), KHAL_LAUNCH_BOUNDS(1024)) { }", (64, 1, 1), 1, False, 1024),
    ("KHAL_ENTRY(k, (16, 8), (KHAL_STORAGE(float, x)), KHAL_LAUNCH_BOUNDS(none)) { }", (16, 8, 1), 2, False, None),
])
def test_launch_shapes(marker: str, block: tuple[int, int, int], dims: int, fixed: bool, bounds: int | None) -> None:
    (e,) = find_entries(marker, "s.cu")
    assert (e.block, e.grid_dims, e.fixed_block, e.launch_bounds) == (block, dims, fixed, bounds)


def test_type_spellings_are_kept_for_the_compiler() -> None:
    src = ("KHAL_ENTRY(k, 32, (KHAL_STORAGE(const float __restrict__, a), KHAL_STORAGE(unsigned long long int, b),"
           " KHAL_STORAGE(signed   char, c), KHAL_STORAGE(::ns::Vec< float >, d), KHAL_STORAGE(volatile int, e),"
           " KHAL_SCALAR(cuda::std::complex<double>, z), KHAL_UNIFORM(struct Params, p), KHAL_SCALAR(long, n),"
           " KHAL_STORAGE(float const, f))) { }")
    (e,) = find_entries(src, "s.cu")
    got = [(p.ctype, p.const, p.restrict, p.writable) for p in e.params]
    assert got == [("float", True, True, False), ("unsigned long long int", False, False, True),
                   ("signed char", False, False, True), ("::ns::Vec<float>", False, False, True),
                   ("int", False, False, True), ("cuda::std::complex<double>", False, False, False),
                   ("Params", True, False, False), ("long", False, False, False), ("float", True, False, False)]


def _names(src: str, defines: dict[str, str] | None = None, files: dict[str, str] | None = None) -> dict[str, Any]:
    all_files = [("k.cu", src)] + sorted((files or {}).items())
    return {e.name: e for e in scan_crate(all_files, "c", defines or {})}


def test_conditions_the_scanner_decides() -> None:
    src = """\
#if 0
KHAL_ENTRY(off, 32, (KHAL_STORAGE(NoSuchType, x))) {}
#endif
#define LOCAL_FLAG 2
#if LOCAL_FLAG >= 2 && !defined(OTHER)
KHAL_ENTRY(on, 32, (KHAL_STORAGE(float, x))) {}
#endif
#ifdef USE_DOUBLE
KHAL_ENTRY(k, 32, (KHAL_STORAGE(double, x))) {}
#elif VARIANT == 3
KHAL_ENTRY(k, 32, (KHAL_STORAGE(int, x))) {}
#else
KHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) {}
#endif
"""
    assert sorted(_names(src)) == ["k", "on"]
    assert _names(src)["k"].params[0].ctype == "float"
    assert _names(src, {"USE_DOUBLE": ""})["k"].params[0].ctype == "double"
    assert _names(src, {"VARIANT": "3"})["k"].params[0].ctype == "int"
    assert _names(src, {"VARIANT": "1+2"})["k"].params[0].ctype == "int"
    assert all(e.compiled is True for e in _names(src).values())


def test_undecided_conditions_merge_equal_entries_and_refuse_different_ones() -> None:
    same = """\
#if __CUDA_ARCH__ >= 800
KHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) { fast(); }
#else
KHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) { slow(); }
#endif
"""
    (k,) = _names(same).values()
    assert k.compiled is None and k.line == 2 and "__CUDA_ARCH__" in str(k.conds[0])
    different = same.replace("(KHAL_STORAGE(float, x))) { slow", "(KHAL_STORAGE(double, x))) { slow")
    with pytest.raises(SourceError, match=r"k\.cu:4: crate 'c': entry 'k' is declared differently here and at "
                                          r"k\.cu:2, under conditions hatch-khal cannot decide.*__CUDA_ARCH__"):
        _names(different)
    # a macro another file of the crate defines is undecided here (include order is not followed)
    header = {"flags.cuh": "#define FROM_HEADER 1\n"}
    other = "#if FROM_HEADER\nKHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) {}\n#endif\n"
    assert _names(other, files=header)["k"].compiled is None
    assert "k" not in _names(other)  # defined nowhere: off


def test_the_same_entry_twice_where_both_compile_is_refused() -> None:
    src = "#if 1\nKHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) {}\n#endif\nKHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) {}\n"
    with pytest.raises(SourceError, match=r"k\.cu:4: crate 'c': entry 'k' is defined twice \(first at k\.cu:2\)"):
        _names(src)


@pytest.mark.parametrize("expr, value", [
    ("0", 0), ("1 + 2 * 3", 7), ("(1 << 4) | 1", 17), ("10 / 3", 3), ("-7 / 2", -3), ("-7 % 2", -1),
    ("0x10 == 16", 1), ("010", 8), ("1 ? 2 : 3", 2), ("!defined(KNOWN)", 0), ("defined KNOWN && KNOWN > 2", 1),
    ("UNKNOWN_X || 1", 1), ("UNKNOWN_X && 0", 0), ("UNKNOWN_X + 1", None), ("__has_include(<x.h>)", None),
    ("1 / 0", None), ("'a' == 97", None), ("100UL > 99u", 1),
])
def test_conditional_expressions(expr: str, value: int | None) -> None:
    env = MacroEnv({"KNOWN": 3}, closed=False)
    assert env.evaluate(expr) == value


def test_grid_reads_outside_entry_bodies_are_found() -> None:
    src = """\
#define IDX (blockIdx.x * blockDim.x + threadIdx.x)
__device__ unsigned helper() { return gridDim.x; }
KHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) { x[blockIdx.x] = gridDim.x; }
"""
    (e,) = scan_crate([("h.cu", src)], "c", system_includes=["cooperative_groups.h"])
    assert e.reads_grid and e.grid_reads_elsewhere == ("h.cu:1", "h.cu:2", "<cooperative_groups.h>")


def test_signatures_of_entries_without_the_new_fields_are_unchanged() -> None:
    """Slang entries and old manifests hash as before: the new keys appear only when used."""
    params = [{"name": "x", "kind": "storage", "element_type": "float32", "shape": "slice", "length": None,
               "writable": True}]
    assert abi.entry_signature("k", (64, 1, 1), params) == {"name": "k", "block_size": [64, 1, 1], "params": params}
    with_ctype = abi.entry_signature("k", (64, 1, 1), [dict(params[0], ctype="real_t")])
    assert with_ctype["params"][0]["ctype"] == "real_t" and "element_type" not in with_ctype["params"][0]
    shaped = abi.entry_signature("k", (16, 16, 1), params, grid_dims=2, fixed_block=False, launch_bounds=512,
                                 template="t", template_args=("float",))
    assert (shaped["grid_dims"], shaped["fixed_block"], shaped["launch_bounds"], shaped["template"]) == \
        (2, False, 512, ["t", ["float"]])


# =============================================================================================
# the build: the real-kernels package (tests/packages/real_kernels_pkg), once per module
# =============================================================================================


@pytest.fixture(scope="module")
def real_build(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Any:
    from tests.helpers.build import build_test_package

    m, out, rep, _files = build_test_package(REAL_PKG, tmp_path_factory.mktemp("real"), "khal_real_kernels",
                                             session_cache)
    return m, out, rep


#: (crate, entry, parameter) -> (element type, size) as the compiler resolves the spelling
RESOLVED = {
    ("real", "spellings", "r"): ("float32", 4),  # const real_t __restrict__ (typedef float)
    ("real", "spellings", "l"): ("int64", 8),  # long
    ("real", "spellings", "u"): ("uint32", 4),  # unsigned int
    ("real", "spellings", "ll"): ("int64", 8),  # INDEX_T (#define ... long long)
    ("real", "spellings", "sc"): ("int8", 1),  # signed char
    ("real", "spellings", "li"): ("int64", 8),  # long int
    ("real", "spellings", "tn"): ("float64", 8),  # TYPE_NAME from the crate's defines
    ("real", "spellings", "k"): ("uint32", 4),  # typedef unsigned int uint_t
    ("real", "spellings", "offset"): ("int64", 8),
    ("real", "move", "p"): ("Particle", 16),
    ("real", "scale_f32", "x"): ("float32", 4), ("real", "scale_f64", "a"): ("float64", 8),
    ("real", "scale_c64", "x"): ("complex64", 8), ("real", "scale_c128", "a"): ("complex128", 16),
    ("real", "abs2_c64", "inp"): ("complex64", 8), ("real", "abs2_c64", "out"): ("float32", 4),
    ("real", "cmul_thrust", "a"): ("complex64", 8), ("real", "cmul_thrust", "w"): ("complex64", 8),
    ("real", "cexp_std", "w"): ("complex128", 16),
    ("variant_f32", "axpy", "x"): ("float32", 4), ("variant_f64", "axpy", "x"): ("float64", 8),
}


@pytest.mark.needs_nvrtc
def test_the_compiler_resolves_every_spelling(real_build: Any) -> None:
    m, _, _ = real_build
    for (crate, entry, param), want in RESOLVED.items():
        p = next(p for p in m.crate(crate).entry(entry).params if p.name == param)
        assert (p.element_type, p.element_size) == want, (crate, entry, param)
    assert m.crate("real").entry("cexp_std").params[2].element_align == 16  # complex<double>: alignas(16)
    assert m.crate("real").entry("spellings").params[0].ctype == "real_t"
    assert check_manifest(m) == []


@pytest.mark.needs_nvrtc
def test_templates_shapes_and_indirect_variants_in_the_manifest(real_build: Any) -> None:
    m, _, _ = real_build
    real = m.crate("real")
    assert (real.entry("scale_c64").template, real.entry("scale_c64").template_args) == \
        ("scale", ("cuda::std::complex<float>",))
    assert (real.entry("add2d").block_size, real.entry("add2d").grid_dims) == ((16, 16, 1), 2)
    assert (real.entry("grid3d").block_size, real.entry("grid3d").grid_dims) == ((8, 8, 4), 3)
    assert real.entry("batch_scale").grid_dims == 2  # a 1-D block, but the body reads blockIdx.y
    any_block = real.entry("iota_any_block")
    assert (any_block.fixed_block, any_block.launch_bounds, any_block.max_block_threads) == (False, 1024, 1024)
    # bodies reading blockIdx / gridDim keep a (remapped) indirect variant ...
    for name in ("stamp", "block_sum", "abs2_c64", "scale_f32", "spellings", "move"):  # typedef-typed too
        assert real.entry(name).indirect_symbol is not None, name
    # ... a helper reading the real blockIdx makes it absent, saying why; so does a 2-D shape
    helper = real.entry("stamp_helper")
    assert helper.indirect_symbol is None and "blockIdx.x" in (helper.indirect_reason or "") \
        and "my_block" in (helper.indirect_reason or "")
    assert real.entry("add2d").indirect_symbol is None and "2-D" in (real.entry("add2d").indirect_reason or "")


@pytest.mark.needs_nvrtc
def test_one_source_as_two_crates(real_build: Any) -> None:
    m, _, _ = real_build
    f32, f64 = m.crate("variant_f32"), m.crate("variant_f64")
    assert [e.name for e in f32.entries] == [e.name for e in f64.entries] == ["axpy", "path"]
    assert f32.entry("axpy").hash != f64.entry("axpy").hash
    assert "retired" not in [e.name for e in f32.entries]  # under #if 0


@pytest.mark.needs_nvrtc
def test_the_built_package_verifies_and_an_edited_element_type_is_caught(real_build: Any, tmp_path: Path) -> None:
    m, out, _ = real_build
    assert verify_package(out, sources=False) == []
    pkg = tmp_path / "khal_real_kernels"
    shutil.copytree(out, pkg)
    path = pkg / "_khal" / "manifest.json"
    doc = json.loads(path.read_text())
    entry = next(e for c in doc["crates"] if c["name"] == "real" for e in c["entries"] if e["name"] == "spellings")
    entry["params"][1]["element_type"] = "uint64"  # 'long' is int64: the hash covers the spelling, not this
    path.write_text(json.dumps(doc))
    problems = verify_package(pkg, sources=False)
    assert problems and all("parameter 'l' (long): the manifest says element type uint64 (8 bytes)" in p.message
                            and "compiled with int64 (8 bytes)" in p.message for p in problems)


# =============================================================================================
# the build: errors after the compiler has spoken
# =============================================================================================

_ONE = '[[tool.hatch.build.targets.wheel.hooks.khal.crates]]\nname = "alpha"\nsources = ["kernels/alpha/*.cu"]\n'


def _project(tmp_path: Path, src: str, hook: str = 'archs = ["sm_90"]\nptx-arch = "compute_75"\n') -> Path:
    return make_project(tmp_path / "p", hook=hook, crates=_ONE, files={"kernels/alpha/scale.cu": src})


@pytest.mark.needs_nvrtc
def test_a_compile_error_in_generated_code_names_the_authors_marker(tmp_path: Path) -> None:
    src = ("template <typename T>\nKHAL_ENTRY(scale, 64, (KHAL_STORAGE(T, x))) { }\n"
           "KHAL_INSTANTIATE(scale, scale_f32, float)\n\nKHAL_INSTANTIATE(scale, scale_bad, undefined_type_t)\n")
    with pytest.raises(CompileError) as err:
        build(_project(tmp_path, src), None)
    assert re.search(r'kernels/alpha/scale\.cu\(5\): error: identifier "undefined_type_t" is undefined', str(err.value))
    assert ".khal.cu(" not in str(err.value)


@pytest.mark.parametrize("decl, match", [
    ("KHAL_SCALAR(P, x)", r"scale\.cu:2: crate 'alpha': entry 'k' parameter 'x': KHAL_SCALAR type 'P' is a struct "
                          r"\(8 bytes\).*pass structs as KHAL_UNIFORM"),
    ("KHAL_STORAGE(long double, x)", r"scale\.cu:2: .*parameter 'x': type 'long double' is a 16-byte float on the "
                                     r"device, which the ABI has no scalar for"),
])
@pytest.mark.needs_nvrtc
def test_types_the_abi_cannot_carry_are_refused_after_the_compile(tmp_path: Path, decl: str, match: str) -> None:
    src = f"struct P {{ float a, b; }};\nKHAL_ENTRY(k, 64, ({decl})) {{ }}\n"
    with pytest.raises(KhalBuildError, match=match):
        build(_project(tmp_path, src), None)


@pytest.mark.needs_nvrtc
def test_size_t_and_a_struct_called_half_are_what_the_compiler_says(tmp_path: Path) -> None:
    src = "struct float32 { float v; };\nstruct half { unsigned short bits; };\n" \
          "KHAL_ENTRY(k, 64, (KHAL_SCALAR(size_t, n), KHAL_STORAGE(half, h), KHAL_STORAGE(float32, f))) { }\n"
    result, rep = build(_project(tmp_path, src), None)
    (k,) = manifest_of(result)[0].crate("alpha").entries
    assert [(p.element_type, p.element_size) for p in k.params] == [("uint64", 8), ("half", 2), ("struct float32", 4)]
    (w,) = [w for w in rep.warnings if "'half'" in w]
    assert "scale.cu:3" in w and "is a struct (2 bytes) on the device, not a scalar" in w and "include the header" in w


@pytest.mark.needs_nvrtc
def test_without_ptx_the_indirect_check_reads_the_sources(tmp_path: Path) -> None:
    src = ("__device__ unsigned mine() { return blockIdx.x; }\n"
           "KHAL_ENTRY(k, 64, (KHAL_STORAGE(unsigned, x))) { x[blockIdx.x] = gridDim.x; }\n")
    result, _ = build(_project(tmp_path, src, 'archs = ["sm_90"]\nptx-arch = "none"\n'), None)
    (k,) = manifest_of(result)[0].crate("alpha").entries
    assert k.indirect_symbol is None and "kernels/alpha/scale.cu:1" in (k.indirect_reason or "") \
        and 'ptx-arch = "none"' in (k.indirect_reason or "")
    clean = "KHAL_ENTRY(k, 64, (KHAL_STORAGE(unsigned, x))) { x[blockIdx.x] = gridDim.x; }\n"
    result, _ = build(_project(tmp_path / "2", clean, 'archs = ["sm_90"]\nptx-arch = "none"\n'), None)
    assert manifest_of(result)[0].crate("alpha").entries[0].indirect_symbol is not None


@pytest.mark.needs_nvrtc
def test_an_instantiation_made_by_a_macro_is_reported(tmp_path: Path) -> None:
    src = ("template <typename T>\nKHAL_ENTRY(scale, 64, (KHAL_STORAGE(T, x))) { }\n"
           "KHAL_INSTANTIATE(scale, scale_f32, float)\n#define MORE(n, t) KHAL_INSTANTIATE(scale, n, t)\n"
           "MORE(scale_f64, double)\n")
    with pytest.raises(EntryParseError, match=r"kernels/alpha/scale\.cu:5: .*'scale_f64'.*made by a macro"):
        build(_project(tmp_path, src), None)


@pytest.mark.needs_nvrtc
def test_header_claims_thrust_complex_and_cuda_std_complex_compile(tmp_path: Path) -> None:
    """The README's CUDA header claims, with the two complex headers of issue #19: each
    included by a crate, compiled by NVRTC from the wheels, element types from the probes."""
    src = """\
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <thrust/complex.h>
#include <cuda/std/complex>
KHAL_ENTRY(k, 128, (KHAL_STORAGE(__half, h), KHAL_STORAGE(__nv_bfloat16, b), KHAL_STORAGE(thrust::complex<double>, t),
                    KHAL_STORAGE(cuda::std::complex<float>, c), KHAL_STORAGE(float, sum)))
{
    typedef cub::BlockReduce<float, 128> R;
    __shared__ typename R::TempStorage tmp;
    auto block = cooperative_groups::this_thread_block();
    float v = R(tmp).Sum(__half2float(h[KHAL_GLOBAL_ID]) + __bfloat162float(b[KHAL_GLOBAL_ID]));
    block.sync();
    t[0] = thrust::exp(t[0]) * thrust::abs(t[1]);
    c[0] = cuda::std::sqrt(c[0]);
    if (threadIdx.x == 0) sum[0] = v;
}
"""
    result, _ = build(_project(tmp_path, src), None)
    (k,) = manifest_of(result)[0].crate("alpha").entries
    assert [p.element_type for p in k.params] == ["float16", "bfloat16", "complex128", "complex64", "float32"]


# =============================================================================================
# the runtime (fake driver)
# =============================================================================================


class _TorchDtype:
    """Stands in for a torch.dtype (recognised by module and str())."""

    __module__ = "torch"

    def __init__(self, name: str, itemsize: int) -> None:
        self.name, self.itemsize = name, itemsize

    def __str__(self) -> str:
        return f"torch.{self.name}"


def test_complex_dtypes_of_every_library() -> None:
    assert dtype_info(np.dtype(np.complex64)) == ("complex64", 8)
    assert dtype_info("<c16") == ("complex128", 16)
    assert dtype_info((5, 64, 1)) == ("complex64", 8) and dtype_info((5, 128, 1)) == ("complex128", 16)
    assert dtype_info(_TorchDtype("complex64", 8)) == ("complex64", 8)
    assert dtype_info(_TorchDtype("cdouble", 16)) == ("complex128", 16)
    p = storage("z", "complex64", 8)
    assert dtype_ok(p, np.dtype(np.complex64))[0] and dtype_ok(p, (5, 64, 1))[0]
    assert not dtype_ok(p, np.dtype(np.float64))[0] and not dtype_ok(p, np.dtype(np.complex128))[0]


@pytest.mark.parametrize("dtype, ok", [
    (np.dtype([("x", "<f4"), ("y", "<f4")]), True), (np.dtype("V8"), True),
    (np.dtype(np.complex64), False), (np.dtype(np.int64), False), (np.dtype(np.float64), False),
    (np.dtype("datetime64[ns]"), False), (np.dtype("S8"), False), ((5, 64, 1), False), ((2, 64, 1), False),
    (_TorchDtype("complex64", 8), False), (np.dtype([("x", "<f4")]), False),
])
def test_a_struct_element_takes_a_structured_dtype_of_its_size_only(dtype: Any, ok: bool) -> None:
    assert dtype_ok(storage("p", "Pair", 8), dtype)[0] is ok


def test_complex_scalars_and_storage_through_the_launch(fake: FakeDriver, tmp_path: Path) -> None:
    e = make_entry("cscale", (storage("x", "complex64", 8), scalar("a", "complex64", 8),
                              scalar("w", "complex128", 16)))
    ks = fake_kernels(fake, tmp_path, [e])
    x = DeviceBuffer(0x1000, 10, np.complex64, 0)
    ks.cscale(10, x, 1.5 - 2j, np.complex128(3 + 4j))
    slots = fake.launches[-1]["slots"]
    assert struct.unpack("<ff", slots[2]) == (1.5, -2.0) and struct.unpack("<dd", slots[3]) == (3.0, 4.0)
    bound = ks.cscale.bind(x, 2, 0.5j)
    bound(10)
    assert struct.unpack("<ff", fake.launches[-1]["slots"][2]) == (2.0, 0.0)
    with pytest.raises(ArgumentError, match=r"argument 'a' \(scalar complex64\): expected a number, got str"):
        ks.cscale(10, x, "1+2j", 1)
    with pytest.raises(ArgumentError, match=r"expected element type complex64 \(8 bytes\), got complex128"):
        ks.cscale(10, DeviceBuffer(0x1000, 10, np.complex128, 0), 1, 1)


def test_a_struct_element_refuses_a_same_sized_scalar_array(fake: FakeDriver, tmp_path: Path) -> None:
    ks = fake_kernels(fake, tmp_path, [make_entry("move", (storage("p", "Pair", 8),))])
    ks.move(4, DeviceBuffer(0x1000, 4, np.dtype([("x", "<f4"), ("y", "<f4")]), 0))
    with pytest.raises(ArgumentError, match=r"expected element type Pair \(8 bytes\), got complex64 \(8 bytes\); "
                                            r"a struct element takes .*np\.dtype\('V8'\)"):
        ks.move(4, DeviceBuffer(0x1000, 4, np.complex64, 0))


def _grid_kernels(fake: FakeDriver, tmp_path: Path) -> Any:
    return fake_kernels(fake, tmp_path, [
        make_entry("k2", (storage("x"),), block=(16, 16, 1), grid_dims=2, indirect=False,
                   indirect_reason="it is a 2-D entry"),
        make_entry("k3", (storage("x"),), block=(8, 8, 4), grid_dims=3, indirect=False),
        make_entry("k1", (storage("x"),), block=256),
        make_entry("anyb", (storage("x"),), block=256, fixed_block=False, launch_bounds=512),
    ])


def test_a_2d_and_3d_typed_call_launches_a_thread_grid(fake: FakeDriver, tmp_path: Path) -> None:
    ks = _grid_kernels(fake, tmp_path)
    x = DeviceBuffer(0x1000, 64, "float32", 0)
    ks.k2((100, 50), x)
    assert fake.launches[-1]["grid"] == (7, 4, 1) and fake.launches[-1]["block"] == (16, 16, 1)
    ks.k3([9, 8, 5], x)
    assert fake.launches[-1]["grid"] == (2, 1, 2) and fake.launches[-1]["block"] == (8, 8, 4)
    n = len(fake.launches)
    ks.k2((0, 50), x)  # nothing to launch (the arguments are still checked)
    assert len(fake.launches) == n
    with pytest.raises(ArgumentError, match=r"k2\(\): the entry is 2-D \(its ids use x and y\): pass its thread "
                                            r"count as \(nx, ny\), got 100"):
        ks.k2(100, x)
    with pytest.raises(ArgumentError, match=r"k3\(\): the entry is 3-D .*\(nx, ny, nz\), got \(1, 2\)"):
        ks.k3((1, 2), x)
    with pytest.raises(ArgumentError, match=r"k1\(\): the entry is 1-D \(its ids use x only\): its thread count is "
                                            r"an integer, got \(100, 2\)"):
        ks.k1((100, 2), x)
    with pytest.raises(ArgumentValueError, match=r"2000000 threads along y need 125000 blocks of 16, more than the 65535"):
        ks.k2((16, 2_000_000), x)
    with pytest.raises(ArgumentError, match=r"each axis is an integer >= 0, got 2\.5"):
        ks.k2((16, 2.5), x)
    b = ks.k2.bind(x)
    b((33, 17))
    assert fake.launches[-1]["grid"] == (3, 2, 1)
    with pytest.raises(ArgumentError, match="the entry is 2-D"):
        b(33)
    ks.k1(1000, x)  # the 1-D typed call is the generated fast path, as before
    assert fake.launches[-1]["grid"] == (4, 1, 1)


def test_a_block_within_launch_bounds(fake: FakeDriver, tmp_path: Path) -> None:
    ks = _grid_kernels(fake, tmp_path)
    x = DeviceBuffer(0x1000, 64, "float32", 0)
    ks.anyb(1000, x)
    assert fake.launches[-1]["block"] == (256, 1, 1)  # the typed call: the default block
    ks.anyb.launch(3, 384, x)
    assert fake.launches[-1]["block"] == (384, 1, 1) and fake.launches[-1]["grid"] == (3, 1, 1)
    ks.anyb.launch(2, (16, 32), x)
    assert fake.launches[-1]["block"] == (16, 32, 1)
    with pytest.raises(ArgumentValueError, match=r"block \(1024, 1, 1\) has 1024 threads; the entry was compiled "
                                                 r"for blocks of at most 512"):
        ks.anyb.launch(1, 1024, x)
    with pytest.raises(ArgumentValueError, match="is not the block size the entry was compiled for"):
        ks.k1.launch(1, 128, x)  # a fixed block stays fixed


def test_dispatch_indirect_of_an_entry_without_the_variant_says_why(fake: FakeDriver, tmp_path: Path) -> None:
    reason = "code it runs reads blockIdx.x outside the entry body (in my_block)"
    ks = fake_kernels(fake, tmp_path, [make_entry("h", (storage("x", "uint32", 4),), indirect=False,
                                                  indirect_reason=reason)])
    count = DeviceBuffer(0x2000, 1, "uint32", 0)
    with pytest.raises(KhalError, match=r"entry c\.h has no indirect \(persistent-grid\) variant: code it runs reads "
                                        r"blockIdx\.x .*\. Pass host_read=True"):
        ks.h.dispatch_indirect(count, DeviceBuffer(0x1000, 64, "uint32", 0))


@pytest.mark.needs_nvrtc
def test_dispatch_indirect_of_a_2d_entry_says_it_is_2d(fake: FakeDriver, tmp_path: Path, real_build: Any) -> None:
    """The build's reason for the 2-D ``add2d`` (no indirect variant) is what dispatch_indirect says;
    host_read=True still launches the direct kernel, that many blocks along x."""
    m, _, _ = real_build
    built = m.crate("real").entry("add2d")
    assert built.indirect_symbol is None and built.grid_dims == 2
    params = (storage("a"), storage("out"), scalar("nx", "int32"), scalar("ny", "int32"))
    ks = fake_kernels(fake, tmp_path, [make_entry("add2d", params, block=built.block_size, grid_dims=2,
                                                  indirect=False, indirect_reason=built.indirect_reason)])
    count = DeviceBuffer(0x2000, 1, "uint32", 0)
    a, out = DeviceBuffer(0x1000, 64 * 64, "float32", 0), DeviceBuffer(0x9000, 64 * 64, "float32", 0)
    launched = len(fake.launches)
    with pytest.raises(KhalError, match=r"entry c\.add2d has no indirect \(persistent-grid\) variant: it is a 2-D "
                                        r"entry, and indirect dispatch counts groups along x only\. Pass host_read=True"):
        ks.add2d.dispatch_indirect(count, a, out, 64, 64)
    with pytest.raises(KhalError, match=r"it is a 2-D entry"):
        ks.add2d.dispatch_indirect(count, a, out, 64, 64, threads=True)
    assert len(fake.launches) == launched  # nothing launched
    fake.host_words[0x2000] = 3
    ks.add2d.dispatch_indirect(count, a, out, 64, 64, host_read=True)
    assert fake.launches[-1]["grid"] == (3, 1, 1) and fake.launches[-1]["block"] == (16, 16, 1)


def test_one_entry_name_in_two_crates_at_run_time(fake: FakeDriver, tmp_path: Path) -> None:
    ks = fake_kernels(fake, tmp_path, [make_entry("axpy", (storage("x"),)), make_entry("only_a", (storage("x"),))],
                      crate="variant_a")
    doc = json.loads((tmp_path / "fakepkg" / "_khal" / "manifest.json").read_text())
    twin = json.loads(json.dumps(doc["crates"][0]))
    twin["name"], twin["package_dir"] = "variant_b", "_khal/variant_b"
    twin["entries"] = [e for e in twin["entries"] if e["name"] == "axpy"]
    art = twin["artifacts"][0]
    art["path"] = art["path"].replace("variant_a", "variant_b")
    (tmp_path / "fakepkg" / "_khal" / "variant_b").mkdir()
    shutil.copy(tmp_path / "fakepkg" / doc["crates"][0]["artifacts"][0]["path"], tmp_path / "fakepkg" / art["path"])
    doc["crates"].append(twin)
    (tmp_path / "fakepkg" / "_khal" / "manifest.json").write_text(json.dumps(doc))
    import khal_runtime

    ks = khal_runtime.load(tmp_path / "fakepkg")
    with pytest.raises(AttributeError, match=r"entry 'axpy' exists in crates \['variant_a', 'variant_b'\]"):
        ks.axpy  # noqa: B018
    assert ks.only_a.crate == "variant_a"
    assert ks.variant_b.axpy.crate == "variant_b" and ks.crates["variant_a"].axpy.crate == "variant_a"
    ks.variant_b.axpy(10, DeviceBuffer(0x1000, 64, "float32", 0))
    assert fake.launches[-1]["grid"] == (1, 1, 1)


def _entry(**kw: Any) -> dict[str, Any]:
    e = make_entry("k", (storage("x"),), block=kw.pop("block", 64))
    return {**e.model_dump(mode="json", exclude_none=True), **kw}


@pytest.mark.parametrize("fields, match", [
    ({"launch_bounds": 512}, "launch bounds are for blocks that are not fixed"),
    ({"fixed_block": False, "launch_bounds": 32}, "more threads than its launch bounds"),
    ({"indirect_reason": "why"}, "has an indirect variant and a reason"),
    ({"template": "t"}, "names its template and arguments"),
    ({"template": "9t", "template_args": ["float"]}, "not a C identifier"),
    ({"grid_dims": 4}, "grid_dims"),
])
def test_new_manifest_fields_are_validated(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Entry.model_validate(_entry(**fields))


def test_param_ctype_round_trips_and_is_hashed() -> None:
    p = Param(name="x", kind="storage", element_type="float32", element_size=4, shape="slice", ctype="real_t")
    e = make_entry("k", (p,))
    assert Entry.model_validate_json(e.model_dump_json()) == e
    assert "ctype" in json.dumps(e.signature()) and "element_type" not in json.dumps(e.signature()["params"])


def test_older_manifests_still_load(tmp_path: Path) -> None:
    doc = {"schema_version": 2, "package": "p", "toolchain": {"hatch_khal_version": "0.1.0"},
           "crates": [{"name": "c", "package_dir": "_khal/c", "sources": [], "content_hash": "c0" * 32,
                       "artifacts": [], "entries": [json.loads(make_entry("k", (storage("x"),)).model_dump_json(
                           exclude_none=True))]}]}
    m = parse_manifest(json.dumps(doc))
    assert m.crates[0].entries[0].grid_dims == 1 and m.crates[0].entries[0].fixed_block
    assert check_manifest(m) == []
    doc["schema_version"] = 3  # before the launch facts: launches follow the marker's facts
    e3 = parse_manifest(json.dumps(doc)).crates[0].entries[0]
    assert (e3.launch, e3.launch_dims, e3.launch_block_fixed) == (None, 1, True)
    doc["schema_version"] = 5
    with pytest.raises(ManifestError, match="schema version 5 is newer than this runtime understands \\(4\\)"):
        parse_manifest(json.dumps(doc))



# =============================================================================================
# the scanner on directive soup: a result or the documented errors, never anything else
# =============================================================================================

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SOUP = ["#if ", "#ifdef ", "#ifndef ", "#elif ", "#else", "#endif", "#define ", "#undef ", "0", "1", "08",
         "X", "Y", "defined", "(", ")", "&&", "||", "!", "<<", "?", ":", "/", "%", " ", "\n", "'a'", "\\\n",
         "(" * 40, "0x", "99999999999999999999 * 9999999999999999999",
         "KHAL_ENTRY(k, 32, (KHAL_STORAGE(float, x))) {}\n", "template <typename T>\n",
         "KHAL_INSTANTIATE(k, k2, float)\n"]


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.sampled_from(_SOUP), max_size=40), st.booleans())
def test_directive_soup_scans_or_fails_by_name(parts: list[str], closed: bool) -> None:
    text = "".join(parts)
    try:
        scan = scan_crate([("f.cu", text)], "c", {"X": "2"}) if closed else find_entries(text, "f.cu")
    except (EntryParseError, SourceError) as exc:
        assert re.match(r"^f\.cu:\d+: ", str(exc)), str(exc)
        return
    for e in scan:
        assert e.file == "f.cu" and 1 <= e.line <= text.count("\n") + 1
