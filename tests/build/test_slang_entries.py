"""Slang entries onto the khal ABI: detection, kinds, hashes, and every refused construct named
by file:line, entry and parameter (compiled with the real Slang library)."""

from __future__ import annotations

import pytest

from khal_runtime import abi
from khal_runtime.manifest import Entry

from hatch_khal.errors import CompileError, SourceError
from tests.helpers.slang import ENTRY, compile_files, main_crate, needs_slang, one_entry

pytestmark = needs_slang


@pytest.fixture(scope="module")
def crate(tmp_path_factory):  # type: ignore[no-untyped-def]
    return main_crate(str(tmp_path_factory.mktemp("main")))


def test_entries_and_kinds(crate) -> None:  # type: ignore[no-untyped-def]
    entries = {e.name: e for e in crate.entries}
    assert list(entries) == ["pairs", "saxpy"]  # sorted; no SV parameter is a binding
    saxpy = entries["saxpy"]
    assert saxpy.block_size == (256, 1, 1)
    assert [(p.name, p.kind, p.element_type, p.element_size, p.shape, p.writable) for p in saxpy.params] == [
        ("y", "storage", "float32", 4, "slice", True),
        ("x", "storage", "float32", 4, "slice", False),
        ("p", "uniform", "Params", 28, None, False),
        ("scale", "scalar", "float32", 4, None, False),
        ("k", "scalar", "int32", 4, None, False),
    ]
    pairs = entries["pairs"]
    assert pairs.block_size == (8, 4, 2)
    assert [(p.name, p.kind, p.element_type, p.element_size, p.element_align, p.writable) for p in pairs.params] == [
        ("ps", "storage", "Pair", 8, 4, True),  # a struct of an imported module
        ("hits", "storage", "uint32", 4, 4, True),  # RWStructuredBuffer<Atomic<uint>>
        ("unused", "storage", "float32", 4, 4, False),
        ("count", "scalar", "uint32", 4, 4, False),
        ("h", "scalar", "float16", 2, 2, False),
    ]


def test_hashes_and_symbols_follow_the_abi(crate) -> None:  # type: ignore[no-untyped-def]
    for e in crate.entries:
        assert e.hash == abi.entry_hash(crate.content_hash, e.signature())
        assert e.symbol == abi.symbol_for(e.name, e.hash)
        assert e.indirect_symbol == abi.indirect_symbol_for(e.name, e.hash)
        assert all(t.entry_point == e.symbol for t in e.webgpu or ())
        Entry.model_validate(e.model_dump())  # the manifest's own checks hold


def test_uniform_layouts_per_target(crate) -> None:  # type: ignore[no-untyped-def]
    p = next(e for e in crate.entries if e.name == "saxpy").params[2]
    offsets = {t: [(f.name, f.offset) for f in lay.fields] for t, lay in p.layouts.items()}
    assert offsets["cuda"] == [("a", 0), ("v", 4), ("arr", 16), ("n", 24)]
    assert offsets["wgsl"] == offsets["spirv"] == [("a", 0), ("v", 16), ("arr", 32), ("n", 64)]
    assert (p.layouts["cuda"].size, p.layouts["wgsl"].size) == (28, 80)
    v = p.layouts["wgsl"].fields[1]
    assert (v.type, v.shape, v.strides, v.size) == ("float32", (3,), (4,), 12)
    arr = p.layouts["spirv"].fields[2]
    assert (arr.shape, arr.strides) == ((2,), (16,))


def test_syntax_error_names_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CompileError) as exc:
        compile_files(tmp_path, one_entry(body="o[t.x] = 1.0 +;"))
    msg = str(exc.value)
    assert "crate 'demo'" in msg and "k/e.slang:6" in msg and "syntax error" in msg


def test_missing_module_names_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CompileError) as exc:
        compile_files(tmp_path, one_entry(head="import nowhere_mod;\n"))
    msg = str(exc.value)
    assert "k/e.slang:1" in msg and "nowhere_mod" in msg


@pytest.mark.parametrize("param, words", [
    ("uniform Texture2D<float> img", ["Texture2D", "not a khal binding"]),
    ("uniform float2 img", ["float2", "ConstantBuffer struct"]),
    ("uniform bool img", ["bool", "use uint"]),
    ("uniform ConstantBuffer<float> img", ["a uniform must hold a struct"]),
    ("uniform StructuredBuffer<float4> img", ["element type must be a scalar or a struct"]),
])
def test_unsupported_parameter_names_file_entry_parameter(tmp_path, param: str, words: list[str]) -> None:  # type: ignore[no-untyped-def]
    files = one_entry(name="blur", params=",\n        " + param)
    with pytest.raises(SourceError) as exc:
        compile_files(tmp_path, files)
    msg = str(exc.value)
    assert msg.startswith("k/e.slang:5: crate 'demo': entry 'blur' parameter 'img': "), msg
    for w in words:
        assert w in msg


@pytest.mark.parametrize("param, head, body, where", [
    ("uniform StructuredBuffer<Rec> v", "struct Rec { float a; bool on; };\n", "o[t.x] = v[t.x].a;", "field 'on'"),
    ("uniform ConstantBuffer<P> v", "struct In { bool on; };\nstruct P { float a; In inner[2]; };\n",
     "o[t.x] = v.a;", "field 'inner'.on"),
])
def test_a_bool_inside_a_struct_is_refused_by_its_path(tmp_path, param: str, head: str, body: str,  # type: ignore[no-untyped-def]
                                                       where: str) -> None:
    files = one_entry(name="flags", params=",\n        " + param, head=head, body=body)
    with pytest.raises(SourceError) as exc:
        compile_files(tmp_path, files)
    msg = str(exc.value)
    assert f"crate 'demo': entry 'flags' parameter 'v': {where} is a bool" in msg and "use uint" in msg, msg


def test_global_binding_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SourceError) as exc:
        compile_files(tmp_path, one_entry(head="RWStructuredBuffer<float> gbuf;\n", body="o[t.x] = gbuf[t.x];"))
    assert str(exc.value).startswith("k/e.slang:1: crate 'demo': global shader parameter 'gbuf'")


def test_numthreads_over_1024_names_file_and_entry(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files = {"k/e.slang": ENTRY.format(name="wide", params="", body="o[t.x] = 1.0;").replace("64, 1, 1", "64, 32, 1")}
    with pytest.raises(SourceError) as exc:
        compile_files(tmp_path, files)
    assert str(exc.value).startswith("k/e.slang:3: crate 'demo': entry 'wide': [numthreads(64, 32, 1)] is 2048")


def test_storage_struct_laid_out_differently_per_target(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files = one_entry(name="odd", params=",\n        uniform RWStructuredBuffer<Odd> s", head="struct Odd { float a; float3 v; };\n")
    with pytest.raises(SourceError) as exc:
        compile_files(tmp_path, files)
    msg = str(exc.value)
    assert "entry 'odd' parameter 's'" in msg and "struct 'Odd' is laid out differently in CUDA" in msg
    # a CUDA-only build takes it: the WebGPU layouts do not matter there
    compile_files(tmp_path, files, targets=("cuda",))


def test_entry_name_used_as_a_field_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files = one_entry(name="scale", params=",\n        uniform ConstantBuffer<P> p", head="struct P { float scale; };\n",
                      body="o[t.x] = p.scale;")
    with pytest.raises(SourceError) as exc:
        compile_files(tmp_path, files)
    assert "entry 'scale'" in str(exc.value) and "rename one of them" in str(exc.value)


def test_crate_without_entries(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SourceError, match=r"no entry point in k/e.slang"):
        compile_files(tmp_path, {"k/e.slang": "float f(float x) { return x; }\n"})


def test_entry_without_bindings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files = {"k/e.slang": '[shader("compute")]\n[numthreads(1, 1, 1)]\nvoid idle(uint3 t : SV_DispatchThreadID) {}\n'}
    with pytest.raises(SourceError, match=r"k/e.slang:3: crate 'demo': entry 'idle': has no parameters"):
        compile_files(tmp_path, files)


def test_64_bit_scalars_on_cuda(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = compile_files(tmp_path, one_entry(params=",\n        uniform uint64_t big, uniform double d, uniform int16_t s"),
                        targets=("cuda",))
    assert [(p.element_type, p.element_size) for p in out.entries[0].params[1:]] == [
        ("uint64", 8), ("float64", 8), ("int16", 2)]


#: 64-bit types in a binding: (parameter, struct declarations, body, what the message names)
SIXTY_FOUR = {
    "int64 scalar": ("uniform int64_t v", "", "o[t.x] = float(v);", "parameter 'v': is int64_t"),
    "uint64 scalar": ("uniform uint64_t v", "", "o[t.x] = float(v);", "parameter 'v': is uint64_t"),
    "double scalar": ("uniform double v", "", "o[t.x] = float(v);", "parameter 'v': is double"),
    "uint64 storage": ("uniform StructuredBuffer<uint64_t> v", "", "o[t.x] = float(v[t.x]);",
                       "parameter 'v': its element type is uint64_t"),
    "double storage": ("uniform RWStructuredBuffer<double> v", "", "v[t.x] = 2.0;",
                       "parameter 'v': its element type is double"),
    "struct storage": ("uniform RWStructuredBuffer<Rec> v", "struct Rec { float a; int64_t k; };\n",
                       "o[t.x] = float(v[t.x].k);", "parameter 'v': field 'k' is int64_t"),
    "uniform field": ("uniform ConstantBuffer<P> v", "struct In { double d; };\nstruct P { float a; In inner[2]; };\n",
                      "o[t.x] = float(v.inner[1].d);", "parameter 'v': field 'inner'.d is double"),
}


@pytest.mark.parametrize("case", list(SIXTY_FOUR))
def test_64_bit_types_are_cuda_only(tmp_path, case: str) -> None:  # type: ignore[no-untyped-def]
    """WGSL has no 64-bit types: wgpu rejected the WGSL Slang emits for int64 at pipeline creation
    (the build shipped it) and Slang failed on double with an internal error. A build for WebGPU
    refuses them by file, entry and parameter; the CUDA-only build takes them."""
    param, head, body, names = SIXTY_FOUR[case]
    files = one_entry(name="wide", params=",\n        " + param, head=head, body=body)
    line = 5 + head.count("\n")
    for targets in (("cuda", "wgsl", "spirv"), ("cuda", "spirv"), ("cuda", "wgsl")):
        with pytest.raises(SourceError) as exc:
            compile_files(tmp_path, files, targets=targets)
        msg = str(exc.value)
        assert msg.startswith(f"k/e.slang:{line}: crate 'demo': entry 'wide' {names}, a 64-bit type WebGPU "
                              "does not support"), msg
        assert f"cannot be built for {' / '.join(t.upper() for t in targets if t != 'cuda')};" in msg
        assert "64-bit types are CUDA-only" in msg and "KHAL_SKIP_SPIRV=1" in msg and "spirv = false" in msg
    out = compile_files(tmp_path, files, targets=("cuda",))
    assert out.entries[0].params[1].name == "v" and not out.webgpu_files
