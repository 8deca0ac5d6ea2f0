"""Issue #26: launch attributes (dynamic shared memory above 48 KB, cooperative grids, clusters, PDL)
and module globals, on the fake driver: the marker grammar, the hash, the manifest, what reaches
cuFuncSetAttribute / cuLaunchKernelEx, the limits with their figures, the refusals by name."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hatch_khal.codegen import generate_unit, has_indirect
from hatch_khal.entries import scan_source
from hatch_khal.errors import EntryParseError
from khal_runtime import DeviceBuffer, abi
from khal_runtime.binaries import ptx_module_globals
from khal_runtime.errors import ArtifactError, KhalError, LaunchAttributeError, ManifestError
from khal_runtime.manifest import LaunchAttributes
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, scalar, storage, write_package  # noqa: F401
from tests.helpers.paths import PACKAGES

SHARED = LaunchAttributes(max_dynamic_shared=65536)
COOP = LaunchAttributes(cooperative=True)
PDL = LaunchAttributes(pdl=True)
CLUSTER = LaunchAttributes(cluster_dims=(2, 1, 1))
COOP_ATTR = [("CU_LAUNCH_ATTRIBUTE_COOPERATIVE", 1)]
PDL_ATTR = [("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION", 1)]
PARAMS = (storage("x", writable=True), scalar("n", "uint32", 4))


def _kernels(drv: FakeDriver, attributes: LaunchAttributes | None, name: str = "k", indirect: bool = True,
             **kw: Any) -> Any:
    e = make_entry(name, PARAMS, 128, indirect=indirect, attributes=attributes,
                   **({"indirect_reason": "cooperative"} if not indirect else {}))
    return fake_kernels(drv, Path(tempfile.mkdtemp(prefix="khal-attrs-")), [e], **kw)


def _buf(n: int = 4096) -> DeviceBuffer:
    return DeviceBuffer(0x10000, n, "float32", 0)


# -- the marker grammar ------------------------------------------------------------------------
def _scan(marker: str) -> Any:
    return scan_source(f"{marker} {{ }}\n", "k.cu").entries[0]


def test_markers_after_the_parameters_give_the_attributes_in_any_order() -> None:
    d = _scan("KHAL_ENTRY(g, 256, (KHAL_STORAGE(float, x)), KHAL_PDL, KHAL_SHARED_MEM(65536), KHAL_LAUNCH_BOUNDS(512))")
    assert d.attributes == {"max_dynamic_shared": 65536, "pdl": True}
    assert (d.fixed_block, d.launch_bounds) == (False, 512)
    assert _scan("KHAL_ENTRY(g, 256, (KHAL_STORAGE(float, x)), KHAL_COOPERATIVE)").attributes == {"cooperative": True}
    assert _scan("KHAL_ENTRY(g, 64, (KHAL_STORAGE(float, x)), KHAL_CLUSTER(2))").attributes == {"cluster_dims": (2, 1, 1)}
    assert _scan("KHAL_ENTRY(g, 64, (KHAL_STORAGE(float, x)))").attributes == {}


@pytest.mark.parametrize(("marker", "message"), [
    ("KHAL_SHARED_MEM(0)", "KHAL_SHARED_MEM\\(bytes\\)"),
    ("KHAL_SHARED_MEM(64k)", "KHAL_SHARED_MEM\\(bytes\\)"),
    ("KHAL_CLUSTER(2, 0)", "must be positive"),
    ("KHAL_CLUSTER(8, 8)", "at most 32"),
    ("KHAL_COOPERATIVE(1)", "takes no arguments"),
    ("KHAL_PDL, KHAL_PDL", "given twice"),
    ("KHAL_COOPERATIVE, KHAL_CLUSTER(2)", "cannot be combined"),
    ("KHAL_SHARED(4)", "none of KHAL_LAUNCH_BOUNDS"),
])
def test_bad_attribute_markers_are_named(marker: str, message: str) -> None:
    with pytest.raises(EntryParseError, match=message):
        _scan(f"KHAL_ENTRY(g, 64, (KHAL_STORAGE(float, x)), {marker})")


def test_attributes_are_hashed_only_when_set() -> None:
    plain = _scan("KHAL_ENTRY(g, 64, (KHAL_STORAGE(float, x)))")
    assert "attributes" not in plain.signature()  # entries without attributes hash as before
    shared = _scan("KHAL_ENTRY(g, 64, (KHAL_STORAGE(float, x)), KHAL_SHARED_MEM(65536))")
    assert shared.signature()["attributes"] == {"max_dynamic_shared": 65536}
    assert abi.entry_hash("0" * 64, plain.signature()) != abi.entry_hash("0" * 64, shared.signature())
    # a manifest Entry hashes what the marker hashed
    assert abi.attributes_signature(LaunchAttributes()) == {}
    e = make_entry("k", PARAMS, attributes=SHARED)
    assert e.signature()["attributes"] == {"max_dynamic_shared": 65536}


def test_clusters_are_compiled_in_and_cooperative_entries_have_no_indirect_variant() -> None:
    coop = _scan("KHAL_ENTRY(g, 64, (KHAL_STORAGE(float, x)), KHAL_COOPERATIVE)")
    clus = _scan("KHAL_ENTRY(c, 64, (KHAL_STORAGE(float, x)), KHAL_CLUSTER(2, 1, 1))")
    pdl = _scan("KHAL_ENTRY(p, 64, (KHAL_STORAGE(float, x)), KHAL_PDL)")
    assert not has_indirect(coop) and not has_indirect(clus) and has_indirect(pdl)
    unit = generate_unit("c", [], [(clus, "0" * 16)])
    assert "__launch_bounds__(64) __cluster_dims__(2, 1, 1) c_khal_0000000000000000(" in unit.text


# -- dynamic shared memory -----------------------------------------------------------------------
def test_shared_memory_above_48k_is_set_once_per_function_at_load(fake: FakeDriver) -> None:
    ks = _kernels(fake, SHARED)
    x = _buf()
    for _ in range(12):  # full read, memo slots, shared snapshots
        ks.k(4096, x, 7)
    ks.k.launch(4, None, x, 7, shared_mem=65536)
    ks.k.bind(x, 7)(256)
    sets = [(f, int(a), v) for f, a, v in fake.func_attributes]
    sym, isym = ks.k.entry.symbol, ks.k.entry.indirect_symbol
    assert sets == [(f"FUNC:{sym}", 8, 65536), (f"FUNC:{isym}", 8, 65536)]  # once each, at load
    assert {rec["shmem"] for rec in fake.launches} == {65536}  # the typed call launches with the declaration


def test_shared_memory_beyond_the_declaration_or_the_device_is_refused_with_figures(fake: FakeDriver) -> None:
    ks = _kernels(fake, SHARED)
    with pytest.raises(LaunchAttributeError, match=r"shared_mem=70000 bytes is more than the entry declares \(65536"):
        ks.k.launch(4, None, _buf(), 7, shared_mem=70000)
    plain = _kernels(fake, None, name="p")
    with pytest.raises(LaunchAttributeError, match=r"declare KHAL_SHARED_MEM\(65536\)"):
        plain.p.launch(4, None, _buf(), 7, shared_mem=65536)
    plain.p.launch(4, None, _buf(), 7, shared_mem=49152)  # up to 48 KB needs no declaration
    assert fake.launches[-1]["shmem"] == 49152


def test_shared_memory_beyond_the_device_is_refused_at_load_with_the_figure(fake: FakeDriver) -> None:
    fake.attributes[fake.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN] = 50000
    small = _kernels(fake, SHARED, name="s")
    with pytest.raises(LaunchAttributeError, match=r"KHAL_SHARED_MEM\(65536\).*\(50000 bytes, CU_DEVICE_ATTRIBUTE_MAX_SHARED"):
        small.s(128, _buf(), 7)


# -- cooperative ---------------------------------------------------------------------------------
def test_cooperative_attribute_reaches_every_launch_path(fake: FakeDriver) -> None:
    ks = _kernels(fake, COOP, indirect=False)
    x = _buf(1 << 20)
    for _ in range(12):
        ks.k(4096, x, 7)
    ks.k.launch(8, None, x, 7)
    ks.k.launch((8, 1, 1), 128, x, 7)
    ks.k.bind(x, 7)(1024)
    assert fake.launches and all(rec["attrs"] == COOP_ATTR for rec in fake.launches)
    assert len(fake.launches) == 15
    # computed once per (threads, shared)
    assert len({(t, s) for _, t, s in fake.occupancy_calls}) == len(fake.occupancy_calls) == 1


def test_a_cooperative_grid_that_cannot_be_co_resident_is_refused_with_the_figure(fake: FakeDriver) -> None:
    fake.occupancy = 2  # 2 per SM x 132 SMs = 264 blocks
    ks = _kernels(fake, COOP, indirect=False)
    x = _buf(1 << 20)
    assert ks.k.max_cooperative_grid() == 264
    ks.k.launch(264, None, x, 7)
    with pytest.raises(LaunchAttributeError, match=r"265 blocks cannot be co-resident.*at most 264 \(2 per SM.*132 SMs"):
        ks.k.launch(265, None, x, 7)
    with pytest.raises(LaunchAttributeError, match="at most 264"):
        ks.k(265 * 128, x, 7)
    with pytest.raises(LaunchAttributeError, match="at most 264"):
        ks.k.bind(x, 7)(265 * 128)
    assert len(fake.launches) == 1


def test_cooperative_indirect_dispatch_is_refused_by_name(fake: FakeDriver) -> None:
    ks = _kernels(fake, COOP, indirect=False)
    with pytest.raises(LaunchAttributeError, match="not a cooperative entry"):
        _kernels(fake, None, name="p").p.max_cooperative_grid()
    count = DeviceBuffer(0x20000, 1, "uint32", 0)
    with pytest.raises(KhalError, match="no indirect .*cooperative"):
        ks.k.dispatch_indirect(count, _buf(), 7)


# -- PDL, clusters ---------------------------------------------------------------------------------
def test_pdl_reaches_launches_and_graphs(fake: FakeDriver) -> None:
    ks = _kernels(fake, PDL)
    x = _buf()
    for _ in range(12):
        ks.k(4096, x, 7)
    ks.k.launch(2, None, x, 7)
    st = ks.k.resolve_stream(None)
    st.begin_capture()
    ks.k(4096, x, 7)
    ks.k.bind(x, 7)(128)
    g = st.end_capture()
    assert len(fake.launches) == 15 and all(rec["attrs"] == PDL_ATTR for rec in fake.launches)
    assert g.node_count == 2
    # indirect dispatch carries it too (the variant's function, its own prebuilt list)
    count = DeviceBuffer(0x20000, 1, "uint32", 0)
    ks.k.dispatch_indirect(count, x, 7)
    assert fake.launches[-1]["f"] == f"FUNC:{ks.k.entry.indirect_symbol}" and fake.launches[-1]["attrs"] == PDL_ATTR


def test_entries_without_attributes_launch_as_before(fake: FakeDriver) -> None:
    ks = _kernels(fake, None)
    for _ in range(12):
        ks.k(4096, _buf(), 7)
    assert all(rec["attrs"] == [] and rec["shmem"] == 0 for rec in fake.launches)
    assert fake.func_attributes == []


def test_cluster_grids_must_be_whole_clusters_and_the_device_must_have_them(fake: FakeDriver) -> None:
    ks = _kernels(fake, CLUSTER, indirect=False)
    x = _buf(1 << 20)
    ks.k.launch(4, None, x, 7)
    assert fake.launches[-1]["attrs"] == []  # compiled in (__cluster_dims__): no attribute at launch
    with pytest.raises(LaunchAttributeError, match=r"grid \(3, 1, 1\) is not a whole number of its clusters \(2, 1, 1\)"):
        ks.k.launch(3, None, x, 7)


def test_a_device_without_clusters_refuses_a_clustered_entry_at_load(fake: FakeDriver) -> None:
    fake.attributes[fake.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH] = 0
    ks = _kernels(fake, CLUSTER, indirect=False)
    with pytest.raises(LaunchAttributeError, match=r"clustered \(KHAL_CLUSTER\(2, 1, 1\)\).*no thread-block clusters"):
        ks.k.launch(4, None, _buf(), 7)


def test_a_cluster_given_at_launch_is_a_launch_attribute_checked_against_grid_and_device(fake: FakeDriver) -> None:
    """``launch(..., cluster=...)`` for a kernel compiled without __cluster_dims__: the cluster rides
    on cuLaunchKernelEx (with the entry's own attributes), the grid must be whole clusters, and the
    device must have clusters; the typed call and other launches stay as they were."""
    ks = _kernels(fake, None, indirect=False)
    x = _buf(1 << 20)
    ks.k.launch(8, None, x, 7, cluster=2)
    ks.k.launch(8, None, x, 7, cluster=(4, 1))
    cl = "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION"
    assert [rec["attrs"] for rec in fake.launches[-2:]] == [[(cl, (2, 1, 1))], [(cl, (4, 1, 1))]]
    assert fake.launches[-1]["grid"] == (8, 1, 1)
    ks.k.launch(8, None, x, 7)  # without: no attribute
    assert fake.launches[-1]["attrs"] == []
    with pytest.raises(LaunchAttributeError, match=r"grid \(3, 1, 1\) is not a whole number of its clusters \(2, 1, 1\)"):
        ks.k.launch(3, None, x, 7, cluster=2)
    with pytest.raises(LaunchAttributeError, match="a cluster of 16 blocks is more than the portable 8"):
        ks.k.launch(16, None, x, 7, cluster=16)
    with pytest.raises(ValueError, match=r"k.launch\(\): cluster"):
        ks.k.launch(8, None, x, 7, cluster=0)
    n = len(fake.launches)
    # with the entry's own attributes (PDL): both on the one launch
    pk = _kernels(fake, PDL, name="p", indirect=False)
    pk.p.launch(4, None, x, 7, cluster=(4, 1, 1))
    assert fake.launches[-1]["attrs"] == [*PDL_ATTR, (cl, (4, 1, 1))] and len(fake.launches) == n + 1


def test_a_cluster_at_launch_is_refused_where_it_cannot_run(fake: FakeDriver) -> None:
    x = _buf(1 << 20)
    ks = _kernels(fake, CLUSTER, name="c", indirect=False)
    ks.c.launch(4, None, x, 7, cluster=(2, 1, 1))  # what it was compiled with: as without
    assert fake.launches[-1]["attrs"] == []
    with pytest.raises(LaunchAttributeError, match=r"compiled with clusters of \(2, 1, 1\).*leave cluster= out"):
        ks.c.launch(4, None, x, 7, cluster=4)


def test_a_device_without_clusters_refuses_a_cluster_at_launch(fake: FakeDriver) -> None:
    fake.attributes[fake.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH] = 0
    x = _buf(1 << 20)
    plain = _kernels(fake, None, name="q", indirect=False)
    with pytest.raises(LaunchAttributeError, match=r"cluster=\(2, 1, 1\): the device .* no thread-block clusters"):
        plain.q.launch(4, None, x, 7, cluster=2)


# -- the manifest --------------------------------------------------------------------------------
def test_tampered_attributes_are_a_hash_mismatch(tmp_path: Path) -> None:
    import khal_runtime

    e = make_entry("k", PARAMS, attributes=SHARED)
    pkg = write_package(tmp_path, [e])
    path = pkg / "_khal" / "manifest.json"
    data = json.loads(path.read_text())
    data["crates"][0]["entries"][0]["attributes"]["max_dynamic_shared"] = 32768
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="edited after the build .*launch attributes"):
        khal_runtime.load(pkg)
    del data["crates"][0]["entries"][0]["attributes"]  # dropped: also a mismatch
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="edited after the build"):
        khal_runtime.load(pkg)


def test_cluster_dims_are_re_derived_from_the_shipped_ptx_at_load(fake: FakeDriver, tmp_path: Path) -> None:
    import khal_runtime

    e = make_entry("k", PARAMS, attributes=CLUSTER, indirect=False, indirect_reason="clustered")
    plain = make_entry("k", PARAMS, indirect=False, indirect_reason="clustered")
    ptx = write_package(tmp_path / "other", [plain]).joinpath("_khal/c/c.compute_90.ptx").read_bytes()
    ptx = ptx.replace(plain.symbol.encode(), e.symbol.encode())  # the right symbol, compiled without clusters
    ks = khal_runtime.load(write_package(tmp_path, [e], ptx=ptx))
    with pytest.raises(ManifestError, match=r"cluster dims \(2, 1, 1\) are not the shipped PTX's \(None"):
        ks.k.launch(2, None, _buf(), 7)


def test_inspect_shows_attributes_and_globals(tmp_path: Path) -> None:
    from hatch_khal.__main__ import _describe
    from khal_runtime.manifest import load_manifest

    pkg = write_package(tmp_path, [make_entry("k", PARAMS, attributes=LaunchAttributes(max_dynamic_shared=65536, pdl=True))],
                        globals=[{"name": "table", "space": "constant", "type": "f32", "element_size": 4, "size": 1024}])
    text = "\n".join(_describe(load_manifest(pkg / "_khal" / "manifest.json")))
    assert "launch attributes: dynamic shared 65536 B, PDL" in text
    assert "global table: constant f32 x 256 (1024 B)" in text


def test_webgpu_refuses_attributes_by_name() -> None:
    from types import SimpleNamespace

    from khal_runtime.backends.webgpu.backend import WebGpuBackend

    kernel = SimpleNamespace(entry=make_entry("k", PARAMS, attributes=COOP, indirect=False))
    module = SimpleNamespace(crate=SimpleNamespace(name="c", crate=SimpleNamespace(globals=())))
    with pytest.raises(LaunchAttributeError, match=r"c\.k needs launch attributes \(cooperative\) that WebGPU"):
        WebGpuBackend.plan(None, kernel, module, 0)  # type: ignore[arg-type]


# -- module globals ------------------------------------------------------------------------------
PTX_GLOBALS = b"""
.version 9.0
.target sm_90
.address_size 64
.visible .const .align 4 .b8 table[1024];
.visible .global .align 4 .u32 counter;
.visible .global .align 8 .u64 khal_probe_size_0 = 8;
.global .align 4 .u32 whole_program;
.visible .global .align 4 .f32 grid2[4][8] = {0f00000000};
.visible .const .align 4 .b8 _ZN2ns5tableE[16];
// .visible .const .align 4 .b8 commented[16];
"""


def test_the_build_finds_module_globals_in_the_ptx() -> None:
    assert ptx_module_globals(PTX_GLOBALS) == [("table", "constant", "b8", 1, 1024),
                                               ("counter", "device", "u32", 4, 4),
                                               ("whole_program", "device", "u32", 4, 4),
                                               ("grid2", "device", "f32", 4, 128)]


GLOBALS = [{"name": "table", "space": "constant", "type": "b8", "element_size": 1, "size": 1024},
           {"name": "counter", "space": "device", "type": "u32", "element_size": 4, "size": 4}]


def test_module_globals_are_device_views_copyable_both_ways(fake: FakeDriver) -> None:
    fake.globals = {"table": (0x7700000, 1024), "counter": (0x7800000, 4)}
    ks = _kernels(fake, None, globals=GLOBALS)
    g = ks.crates["c"].globals
    assert sorted(g) == ["counter", "table"]
    table = g["table"]
    values = np.arange(256, dtype=np.float32)
    table.copy_from_numpy(values)
    assert fake.memory[0x7700000] == values.tobytes()
    assert np.array_equal(table.to_numpy(np.float32), values)
    g["counter"].fill_zero()
    assert fake.memory[0x7800000] == b"\0" * 4
    assert g["counter"].to_numpy().dtype == np.uint32
    with pytest.raises(KhalError, match=r"table is 1024 bytes .*the array is 512 bytes"):
        table.copy_from_numpy(np.zeros(128, np.float32))
    with pytest.raises(KeyError, match="no module global 'tabel'; it has table, counter"):
        g["tabel"]
    # a device-to-device refill is captured (a graph refills the table on replay)
    src = DeviceBuffer(0x30000, 256, "float32", 0)
    st = ks.k.resolve_stream(None)
    st.begin_capture()
    table.copy_from(src)
    st.end_capture()
    assert ("cuMemcpyDtoDAsync", 0x7700000, 0x30000, 1024, st.native) in fake.calls
    assert table.as_buffer("float32").size == 256


def test_a_stale_global_is_an_error_at_load(fake: FakeDriver) -> None:
    fake.globals = {"table": (0x7700000, 1024)}  # the binary has no 'counter'
    ks = _kernels(fake, None, globals=GLOBALS)
    with pytest.raises(ArtifactError, match="lists the global 'counter'.*does not define"):
        ks.k(128, _buf(), 7)
    fake.globals = {"table": (0x7700000, 512), "counter": (0x7800000, 4)}
    ks = _kernels(fake, None, name="j", globals=GLOBALS)
    with pytest.raises(ArtifactError, match="'table' is 512 bytes in .*the manifest says 1024"):
        ks.j(128, _buf(), 7)


# -- a real build (NVRTC, sm_90): tests/packages/attrs_kernels_pkg --------------------------------------
ATTRS_PKG = PACKAGES / "attrs_kernels_pkg"


@pytest.fixture(scope="module")
def attrs_build(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Any:
    from tests.helpers.build import build_test_package

    m, out, _rep, _files = build_test_package(ATTRS_PKG, tmp_path_factory.mktemp("attrs"), "khal_attrs_kernels",
                                              session_cache)
    return m, out


def test_the_build_records_attributes_and_globals(attrs_build: Any) -> None:
    m, _ = attrs_build
    (crate,) = m.crates
    got = {e.name: e.attributes.describe() if e.attributes else "" for e in crate.entries}
    assert got == {"gemm_tile": "dynamic shared 65536 B", "reduce_coop": "cooperative", "cluster_pair_sum": "cluster 2x1x1",
                   "cluster_pair_sum_spread": "cluster 2x1x1, cluster scheduling spread", "pdl_producer": "PDL", "pdl_consumer": "PDL", "plain_producer": "", "plain_consumer": "",
                   "reduce_pass1": "", "reduce_pass2": "", "table_lookup": "",
                   "cluster_pair_sum_at_launch": "", "cluster_shape": ""}  # their clusters are given at launch
    by = {e.name: e for e in crate.entries}
    assert by["reduce_coop"].indirect_symbol is None and "cooperative" in (by["reduce_coop"].indirect_reason or "")
    assert by["cluster_pair_sum"].indirect_symbol is None and by["pdl_producer"].indirect_symbol is not None
    assert [(g.name, g.space, g.size) for g in crate.globals or ()] == [("lut", "constant", 1024), ("hits", "device", 4)]
    from khal_runtime.binaries import ptx_cluster_dims

    (ptx,) = [a for a in crate.artifacts if a.kind == "ptx"]
    assert ptx_cluster_dims((attrs_build[1] / ptx.path).read_bytes()) == {by["cluster_pair_sum"].symbol: (2, 1, 1),
                                                                          by["cluster_pair_sum_spread"].symbol: (2, 1, 1)}


def test_the_built_package_loads_and_launches_with_its_attributes(attrs_build: Any, fake: FakeDriver) -> None:
    import khal_runtime

    _, out = attrs_build
    fake.globals = {"lut": (0x7700000, 1024), "hits": (0x7800000, 4)}
    ks = khal_runtime.load(out)
    x = DeviceBuffer(0x10000, 1 << 16, "float16", 0)
    c = DeviceBuffer(0x90000, 1 << 16, "float32", 0)
    ks.gemm_tile.launch(4, None, x, x, c, 256, 256, 64, shared_mem=65536)
    assert fake.launches[-1]["shmem"] == 65536
    assert [v for _, a, v in fake.func_attributes if int(a) == 8] == [65536, 65536]  # the kernel and its indirect variant
    y = DeviceBuffer(0x20000, 1 << 16, "float32", 0)
    ks.pdl_consumer(1 << 16, y, y, 1 << 16)
    assert fake.launches[-1]["attrs"] == PDL_ATTR
    ks.cluster_pair_sum_spread.launch(4, None, y, y)  # a row added (#40 item 2): from the marker to the launch
    assert fake.launches[-1]["attrs"] == [("CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE", 1)]
    ks.crates["whole"].globals["lut"].copy_from_numpy(np.arange(256, dtype=np.float32))
    assert fake.memory[0x7700000] == np.arange(256, dtype=np.float32).tobytes()


def test_traced_launches_carry_the_attributes_too(fake: FakeDriver, capsys: pytest.CaptureFixture[str]) -> None:
    from khal_runtime import tracing

    ks = _kernels(fake, LaunchAttributes(max_dynamic_shared=65536, pdl=True))
    x = _buf()
    tracing.enable(trace=True)
    try:
        for _ in range(12):
            ks.k(4096, x, 7)
        ks.k.launch(2, None, x, 7)
        ks.k.bind(x, 7)(128)
    finally:
        tracing.disable()
    assert len(fake.launches) == 14
    assert [(rec["attrs"], rec["shmem"]) for rec in fake.launches] == [(PDL_ATTR, 65536)] * 14
    assert "k" in capsys.readouterr().err
