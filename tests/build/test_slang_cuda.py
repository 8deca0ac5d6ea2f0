"""The CUDA translation unit of a Slang crate: demoted bodies, khal-ABI wrappers, #line
attribution, FMA policy and the errors of the rewrite."""

from __future__ import annotations

import re

import pytest

from khal_runtime.manifest import Param

from hatch_khal.errors import CompileError
from hatch_khal.slang.cuda_abi import DEFAULT_NVRTC_OPTIONS, build_cuda_unit, nvrtc_options
from hatch_khal.slang.entries import SlangEntry
from tests.helpers.slang import main_crate, needs_slang


def _nvrtc(unit: str, options: list[str], name: str = "demo.slang.cu") -> str:
    from hatch_khal.nvrtc import compile_unit

    return compile_unit(unit, name, "compute_90", options, "demo").data.decode()


def test_nvrtc_options() -> None:
    assert DEFAULT_NVRTC_OPTIONS == ["-std=c++17", "-diag-suppress=1444,222,177", "--fmad=false"]
    assert nvrtc_options([]) == DEFAULT_NVRTC_OPTIONS
    assert nvrtc_options(["--fmad=true", "-lineinfo"]) == ["-std=c++17", "-diag-suppress=1444,222,177",
                                                           "--fmad=true", "-lineinfo"]


@needs_slang
def test_unit_structure(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    out = main_crate(str(tmp_path_factory.mktemp("main")))
    text = out.cuda_unit
    define = text.index("#define blockIdx khal_bid_\n#define gridDim khal_gdim_\n")
    first_line = re.search(r'#line \d+ "k/main.slang"', text).start()  # type: ignore[union-attr]
    generated = text.index('#line 1 "<generated>"')
    assert define < first_line < text.index("#undef blockIdx") < generated
    assert text.count("#line 1 \"<generated>\"") == 1
    for e in out.entries:
        assert f'extern "C" __global__ void {e.name}(' not in text
        assert text.count(f"static __device__ __forceinline__ void {e.name}(uint3 khal_bid_, dim3 khal_gdim_, ") == 1
        assert text.count(f"    {e.name}(blockIdx, gridDim, ") == 1  # the direct wrapper: real values
        assert text.count(f"        {e.name}(make_uint3(khal_g_, 0, 0), dim3(khal_n_, 1, 1), ") == 1
    assert "#define SLANG_CUDA_ENABLE_HALF 1\n" in text and out.system_includes == ("cuda_fp16.h",)


@needs_slang
def test_fmad_off_by_default_and_overridable(example_slang_output, example_slang) -> None:  # type: ignore[no-untyped-def]
    out = example_slang_output
    assert "--fmad=false" in out.nvrtc_options
    body = lambda p, sym: p[p.index(f".entry {sym}("):].split(".entry", 2)[1]  # noqa: E731
    saxpy = next(e for e in out.entries if e.name == "saxpy_shared")
    assert "fma.rn.f32" not in body(example_slang.ptx, saxpy.symbol)  # the PTX the example wheel ships
    fused = _nvrtc(out.cuda_unit, nvrtc_options(["--fmad=true"]))
    assert "fma.rn.f32" in body(fused, saxpy.symbol)


@pytest.mark.needs_nvrtc
@needs_slang
def test_line_directives_blame_the_right_file(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    out = main_crate(str(tmp_path_factory.mktemp("main")))
    from hatch_khal.headers import resolve_headers
    from hatch_khal.nvrtc import nvrtc_version

    opts = list(out.nvrtc_options) + [f"-I{d}" for d in resolve_headers("wheels", nvrtc_version()[0]).include_dirs]
    with pytest.raises(CompileError) as exc:
        _nvrtc(out.cuda_unit + "\nkhal_no_such_type_ x;\n", opts)
    assert re.search(r"<generated>\(\d+\): error", str(exc.value)) and ".slang(" not in str(exc.value)
    m = re.search(r'#line (\d+) "k/main.slang"\n', out.cuda_unit)
    assert m is not None
    broken = out.cuda_unit.replace(m.group(0), m.group(0) + "no_such_slang_name_ y;\n", 1)
    with pytest.raises(CompileError, match=rf"k/main\.slang\({m.group(1)}\): error"):
        _nvrtc(broken, opts)


def _entry(name: str = "f") -> SlangEntry:
    p = Param(name="o", kind="storage", element_type="float32", element_size=4, element_align=4, shape="slice",
              writable=True)
    return SlangEntry(name=name, block_size=(64, 1, 1), params=(p,), hash="0123456789abcdef", where="k/e.slang:3")


PRELUDE = "// prelude\n"
BODY = 'extern "C" __global__ void f(RWStructuredBuffer<float> o_0)\n{\n    o_0[(blockIdx * blockDim + threadIdx).x] = 1;\n}\n'


def test_rewrite_of_a_well_formed_module() -> None:
    unit = build_cuda_unit("demo", PRELUDE + BODY, len(PRELUDE), [_entry()], [])
    assert "static __device__ __forceinline__ void f(uint3 khal_bid_, dim3 khal_gdim_, RWStructuredBuffer" in unit.text
    assert 'void __launch_bounds__(64) f_khal_0123456789abcdef(' in unit.text
    assert 'void __launch_bounds__(64) f_indirect_khal_0123456789abcdef(' in unit.text
    assert "khal_sizeof_f_0" in unit.text and "khal_alignof_f_0" in unit.text
    assert unit.system_includes == ()


@pytest.mark.parametrize("module, words", [
    ("", "holds 0 definitions"),
    (BODY + BODY, "holds 2 definitions"),
    (BODY + "__device__ uint g() { return blockIdx.x; }\n", "reads blockIdx outside an entry function"),
])
def test_rewrite_errors(module: str, words: str) -> None:
    with pytest.raises(CompileError, match=re.escape(words)) as exc:
        build_cuda_unit("demo", PRELUDE + module, len(PRELUDE), [_entry()], [])
    assert str(exc.value).startswith("crate 'demo': ")


def test_output_without_the_prelude_is_refused() -> None:
    with pytest.raises(CompileError, match="does not start with its CUDA prelude"):
        build_cuda_unit("demo", BODY, -1, [_entry()], [])
