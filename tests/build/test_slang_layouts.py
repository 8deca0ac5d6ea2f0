"""The manifest's WebGPU bindings, scalar blocks and struct layouts, and the CUDA ABI, checked
against the compiled artifacts themselves (WGSL text, SPIR-V words, NVRTC's PTX), read with the
independent readers of tests/helpers/slang_artifacts.py: for a crate the stage compiled here ("main") and
for every Slang entry of the example wheel ("wheel": its manifest against its own files)."""

from __future__ import annotations

import pytest

from khal_runtime.manifest import Entry, StructLayout

from tests.helpers.slang import main_crate, needs_slang
from tests.helpers.slang_artifacts import (
    DEC_ARRAY_STRIDE, DEC_BINDING, DEC_NON_WRITABLE, DEC_SET, SC_PUSH_CONSTANT, SC_STORAGE_BUFFER, SC_UNIFORM,
    ptx_params, read_spirv, read_wgsl, slang_name,
)

pytestmark = needs_slang


@pytest.fixture(scope="module", params=["main", pytest.param("wheel", marks=pytest.mark.needs_nvrtc)])
def crate(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    if request.param == "main":
        return main_crate(str(tmp_path_factory.mktemp("main")))
    return request.getfixturevalue("example_slang")


def test_the_wheel_ships_every_slang_entry_for_every_target(example_slang) -> None:  # type: ignore[no-untyped-def]
    names = {e.name for e in example_slang.entries}
    assert {"saxpy_shared", "sum_u32", "histogram256", "affine", "slang_integrate", "slang_collide_ground",
            "slang_count_active", "slang_compact_alive", "slang_kinetic_energy"} <= names
    for e in example_slang.entries:
        assert sorted(t.target for t in e.webgpu or ()) == ["spirv", "wgsl"], e.name
    assert len(example_slang.webgpu_files) == 2 * len(names)


def _entries(crate) -> list[Entry]:  # type: ignore[no-untyped-def]
    return list(crate.entries)


def _check_wgsl_struct(wgsl, struct_name: str, layout: StructLayout) -> None:  # type: ignore[no-untyped-def]
    members = wgsl.structs[struct_name]
    assert [slang_name(m.name) for m in members] == [f.name for f in layout.fields]
    for m, f in zip(members, layout.fields):
        assert m.offset == f.offset, (struct_name, f.name)
        if f.shape and f.strides and len(f.shape) > (1 if m.type.startswith("vec") else 0):
            # an array: Slang's std140 arrays are wrapped in a struct whose one member is the array
            inner = wgsl.structs.get(m.type)
            array_type = inner[0].type if inner else m.type
            element = array_type[len("array<"):].rsplit(",", 1)[0]
            assert wgsl.stride(element) == f.strides[0], (struct_name, f.name)
    assert wgsl.layout(struct_name)[0] <= layout.size


def test_wgsl_bindings_and_layouts_match_the_wgsl(crate) -> None:  # type: ignore[no-untyped-def]
    for e in _entries(crate):
        t = e.target("wgsl")
        assert t is not None
        wgsl = read_wgsl(crate.webgpu_files[t.path].decode())
        assert wgsl.entry_point == e.symbol == t.entry_point
        assert wgsl.workgroup_size == e.block_size
        declared = {(v.group, v.binding): v for v in wgsl.vars}
        assert set(declared) == {(b.group, b.binding) for b in t.bindings}, e.name
        params = {p.name: p for p in e.params}
        for b in t.bindings:
            v = declared[(b.group, b.binding)]
            if b.param is None:  # the scalar block
                assert v.space == "uniform" and slang_name(v.name) == "entryPointParams"
                members = wgsl.structs[v.type]
                slots = {s.param: s for s in t.scalar_slots}
                assert {slang_name(m.name) for m in members} == set(slots)
                for m in members:
                    s = slots[slang_name(m.name)]
                    assert (m.offset, m.size) == (s.offset, s.size), (e.name, s.param)
                assert wgsl.layout(v.type)[0] == t.scalar_block_size
                continue
            assert slang_name(v.name) == b.param
            p = params[b.param]
            if p.kind == "uniform":
                assert v.space == "uniform" and b.access == "uniform"
                _check_wgsl_struct(wgsl, v.type, p.layouts["wgsl"])
            else:
                assert v.space == ("storage, read_write" if p.writable else "storage, read"), (e.name, p.name)
                assert b.access == ("read_write" if p.writable else "read")
                element = v.type[len("array<"):-1]
                element = element.removeprefix("atomic<").removesuffix(">")
                assert wgsl.stride(element) == p.element_size, (e.name, p.name)


def test_spirv_bindings_and_layouts_match_the_spirv(crate) -> None:  # type: ignore[no-untyped-def]
    for e in _entries(crate):
        t = e.target("spirv")
        assert t is not None
        spv = read_spirv(crate.webgpu_files[t.path])
        assert spv.entry_points == [(5, e.symbol)]  # GLCompute, named with the hash
        assert spv.local_size == e.block_size
        bound = {v: (spv.decorations[v][DEC_SET][0], spv.decorations[v][DEC_BINDING][0])
                 for v in spv.variables if DEC_BINDING in spv.decorations.get(v, {})}
        assert sorted(bound.values()) == sorted((b.group, b.binding) for b in t.bindings), e.name
        params = {p.name: p for p in e.params}
        for b in t.bindings:
            var = spv.variable_named(f"entryPointParams.{b.param}")
            assert bound[var] == (b.group, b.binding)
            p = params[b.param]
            struct_id = spv.pointee(var)
            storage_class = spv.variables[var][1]
            if p.kind == "uniform":
                assert storage_class == SC_UNIFORM
                layout = p.layouts["spirv"]
                members = spv.struct_members(struct_id)
                assert [m[0] for m in members] == [f.name for f in layout.fields]
                for (_, off, tid), f in zip(members, layout.fields):
                    assert off == f.offset, (e.name, f.name)
                    if f.shape and spv.types[tid][0] == 30:  # Slang wraps std140 arrays in a struct
                        arr = spv.struct_members(tid)[0][2]
                        assert spv.decorations[arr][DEC_ARRAY_STRIDE][0] == f.strides[0]
                assert spv.size_of(struct_id) <= layout.size
            else:
                assert storage_class == SC_STORAGE_BUFFER
                runtime_array = spv.struct_members(struct_id)[0][2]
                assert spv.decorations[runtime_array][DEC_ARRAY_STRIDE][0] == p.element_size
                read_only = DEC_NON_WRITABLE in spv.member_decorations.get((struct_id, 0), {}) or \
                    DEC_NON_WRITABLE in spv.decorations.get(var, {})
                assert read_only == (not p.writable) == (b.access == "read"), (e.name, p.name)
        push = [v for v, (_, sc) in spv.variables.items() if sc == SC_PUSH_CONSTANT]
        if t.scalars == "push_constants":
            if push:  # absent when the shader reads no scalar
                members = spv.struct_members(spv.pointee(push[0]))
                slots = {s.param: s for s in t.scalar_slots}
                for name, off, tid in members:
                    assert (off, spv.size_of(tid)) == (slots[name].offset, slots[name].size), (e.name, name)
                assert spv.size_of(spv.pointee(push[0])) <= t.scalar_block_size
        else:
            assert not push


def _ptx_of(crate) -> tuple[str, object]:  # type: ignore[no-untyped-def]
    """(PTX text, BinaryInfo): compiled here from a stage output, or the one the wheel ships."""
    from hatch_khal.headers import resolve_headers
    from hatch_khal.nvrtc import compile_unit, nvrtc_version
    from khal_runtime.binaries import read_binary

    if not hasattr(crate, "cuda_unit"):
        return crate.ptx, read_binary(crate.ptx.encode())
    opts = list(crate.nvrtc_options)
    if crate.system_includes:
        opts += [f"-I{d}" for d in resolve_headers("wheels", nvrtc_version()[0]).include_dirs]
    r = compile_unit(crate.cuda_unit, crate.unit_name, "compute_90", opts, crate.crate)
    assert r.log == ""  # the prelude's warnings are silenced
    return r.data.decode(), read_binary(r.data)


@pytest.mark.needs_nvrtc
def test_ptx_parameters_follow_the_khal_abi(crate) -> None:  # type: ignore[no-untyped-def]
    ptx, info = _ptx_of(crate)
    entries = ptx_params(ptx)
    scalar_ptx = {"float32": "f32", "int32": "u32", "uint32": "u32", "float16": "b8[2]",
                  "float64": "f64", "int64": "u64", "uint64": "u64"}
    probes = dict(info.globals_u64)  # type: ignore[attr-defined]
    for e in crate.entries:
        expected: list[str] = []
        for i, p in enumerate(e.params):
            expected += {"storage": ["u64", "u64"], "uniform": ["u64"]}.get(p.kind, [scalar_ptx.get(p.element_type, "?")])
            # NVRTC's sizeof / alignof of each element (the probes) are the manifest's sizes
            assert probes[f"khal_sizeof_{e.name}_{i}"] == p.element_size, (e.name, p.name)
            assert probes[f"khal_alignof_{e.name}_{i}"] == p.element_align, (e.name, p.name)
        threads = e.block_size[0] * e.block_size[1] * e.block_size[2]
        assert entries[e.symbol] == (expected, (threads, 1, 1)), e.name
        assert entries[e.indirect_symbol] == (expected + ["u64"], (threads, 1, 1)), e.name


def test_cuda_struct_layouts_match_nvrtc(example_slang_output, example_slang) -> None:  # type: ignore[no-untyped-def]
    """The wheel's CUDA offsets of the example's Affine struct against offsetof() in NVRTC (compiling
    the crate's unit, as the build cached it, with offsetof probes appended)."""
    from hatch_khal.nvrtc import compile_unit
    from khal_runtime.binaries import read_binary

    crate = example_slang_output
    # the unit of the wheel's build (the wheel's entries add the launch facts NVRTC's PTX gives)
    assert crate.entries == tuple(e.model_copy(update={"launch": None}) for e in example_slang.entries)
    e = next(x for x in crate.entries if x.name == "affine")
    p = next(x for x in e.params if x.kind == "uniform")
    layout = p.layouts["cuda"]
    i = e.params.index(p)
    probes = "".join(
        f'extern "C" __device__ const unsigned long long test_off_{f.name} = '
        f"__builtin_offsetof(khal_deref_<khal_t_affine_{i}>::type, {f.name}_0);\n"
        for f in layout.fields
    )
    r = compile_unit(crate.cuda_unit + probes, crate.unit_name, "compute_90", list(crate.nvrtc_options), crate.crate)
    got = dict(read_binary(r.data).globals_u64)
    ptx = r.data.decode()
    assert all(f"test_off_{f.name}" in ptx for f in layout.fields)
    # a zero offset is emitted without an initializer
    assert {f.name: got.get(f"test_off_{f.name}", 0) for f in layout.fields} == {f.name: f.offset for f in layout.fields}
    assert layout.size == p.element_size == 48
    assert p.layouts["wgsl"].size == p.layouts["spirv"].size == 80
