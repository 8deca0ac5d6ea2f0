"""Hardening, round two (issue #16), the runtime's items: each of these launched silently wrong
work, read outside the project, hung, or ended in a raw traceback before.

CPU only: the fake driver (tests/helpers/fakecuda.py) records what would be launched.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import khal_runtime
from khal_runtime import abi
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import ArgumentError, ArgumentValueError, ArtifactError, ManifestError, ParamLayoutError
from khal_runtime.manifest import parse_manifest
from khal_runtime.verify import verify_package
from tests.helpers.synthetic import CRATE, build_package
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, scalar, storage, uniform  # noqa: F401


class Params(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


@pytest.fixture
def ks(fake: FakeDriver, tmp_path: Path) -> Any:
    return fake_kernels(fake, tmp_path, [
        make_entry("axpby", (storage("x"), storage("y", writable=True), uniform("p"), scalar("bias")), block=256),
        make_entry("flags", (storage("out", "uint32", 4, writable=True), scalar("on", "bool", 1),
                             scalar("h", "bfloat16", 2))),
    ])


def _bufs(n: int = 1024) -> tuple[DeviceBuffer, DeviceBuffer]:
    return DeviceBuffer(0x1000, n, "float32", 0), DeviceBuffer(0x100000, n, "float32", 0)


# -- (1) launch geometry -----------------------------------------------------------------------
@pytest.mark.parametrize("block", [128, (256, 2, 1), (256, 1, 2), (128, 2)])
def test_explicit_launch_refuses_a_block_other_than_the_compiled_one(ks: Any, fake: FakeDriver, block: Any) -> None:
    x, y = _bufs()
    with pytest.raises(ArgumentValueError, match=r"axpby.launch\(\): block .* is not the block size the entry "
                                                 r"was compiled for \(256, 1, 1\)"):
        ks.axpby.launch(4, block, x, y, Params(1, 2), 0.5)
    with pytest.raises(ArgumentValueError, match="compiled for"):
        khal_runtime.launch(None, khal_runtime.LaunchConfig(4, block), ks.axpby, x, y, Params(1, 2), 0.5)
    assert fake.launches == []
    for ok in (None, 256, (256,), (256, 1, 1)):  # the compiled block, spelled any way
        ks.axpby.launch(4, ok, x, y, Params(1, 2), 0.5)
    assert [launch["block"] for launch in fake.launches] == [(256, 1, 1)] * 4


@pytest.mark.parametrize("grid", [(4, 2), (4, 2, 1), (4, 1, 3)])
def test_a_2d_or_3d_grid_is_refused_where_ids_are_1d(ks: Any, fake: FakeDriver, grid: Any) -> None:
    x, y = _bufs()
    with pytest.raises(ArgumentValueError, match=r"grid .* has more than 1 dimension.*thread ids use x only"):
        ks.axpby.launch(grid, None, x, y, Params(1, 2), 0.5)
    with pytest.raises(ArgumentValueError, match=r"grid .* has more than 1 dimension.*thread ids use x only"):
        khal_runtime.launch(None, khal_runtime.LaunchConfig(grid), ks.axpby, x, y, Params(1, 2), 0.5)
    assert fake.launches == []


def test_a_2d_grid_is_launched_where_the_ids_honour_it(fake: FakeDriver, tmp_path: Path) -> None:
    e = make_entry("k2", (storage("x"),), block=(16, 16, 1), grid_dims=3)
    ks = fake_kernels(fake, tmp_path, [e])
    ks.k2.launch((4, 2), (16, 16), DeviceBuffer(0x1000, 64, "float32", 0))
    assert fake.launches[-1]["grid"] == (4, 2, 1) and fake.launches[-1]["block"] == (16, 16, 1)
    with pytest.raises(ArgumentValueError, match=r"grid y = 70000 is more than the 65535"):
        khal_runtime.launch(None, khal_runtime.LaunchConfig((1, 70000)), ks.k2, DeviceBuffer(0x1000, 64, "float32", 0))
    with pytest.raises(ArgumentValueError, match=r"block \(16, 1, 1\) is not the block size"):
        ks.k2.launch(4, 16, DeviceBuffer(0x1000, 64, "float32", 0))  # 16 is bx, not the 16x16 block


def test_geometry_is_checked_in_graphs_too(ks: Any, fake: FakeDriver) -> None:
    x, y = _bufs()
    ks.axpby(1024, x, y, Params(1, 2), 0.5)  # warm up: the uniform is cached
    st = khal_runtime.default_stream()
    with pytest.raises(ArgumentValueError, match="compiled for"):
        with st.capture():
            ks.axpby.launch(4, 128, x, y, Params(1, 2), 0.5)
    assert len(fake.launches) == 1


# -- (4) scalars on every path -----------------------------------------------------------------
@pytest.mark.parametrize("value", ["false", None, [], 2, 1.0, b"\x01"])
def test_a_bool_takes_true_or_false_only_on_every_path(ks: Any, fake: FakeDriver, value: Any) -> None:
    out = DeviceBuffer(0x1000, 16, "uint32", 0)
    for launch in (lambda: ks.flags(16, out, value, 1.0), lambda: ks.flags.launch(1, None, out, value, 1.0),
                   lambda: ks.flags.bind(out, value, 1.0), lambda: ks.flags.check_args(out, value, 1.0)):
        for _ in range(2):  # the first call generates code; the second runs the generated fast path
            with pytest.raises(ArgumentError, match=r"flags\(\): argument 'on' \(scalar bool\): expected a bool"):
                launch()
    assert fake.launches == []
    ks.flags(16, out, np.bool_(True), 1.0)
    ks.flags(16, out, True, 1.0)
    assert [struct.unpack("<?", launch["slots"][2])[0] for launch in fake.launches] == [True, True]


@pytest.mark.parametrize("value", ["1.5", b"1", None, [], 1 + 2j])
def test_a_bfloat16_takes_numbers_only_on_every_path(ks: Any, fake: FakeDriver, value: Any) -> None:
    out = DeviceBuffer(0x1000, 16, "uint32", 0)
    for launch in (lambda: ks.flags(16, out, True, value), lambda: ks.flags.launch(1, None, out, True, value),
                   lambda: ks.flags.bind(out, True, value), lambda: ks.flags.check_args(out, True, value)):
        for _ in range(2):
            with pytest.raises(ArgumentError, match=r"argument 'h' \(scalar bfloat16\): expected a"):
                launch()
    assert fake.launches == []
    ks.flags(16, out, True, 1.5)
    assert struct.unpack("<H", fake.launches[-1]["slots"][3])[0] == abi.bf16_bits(1.5) == 0x3FC0


@pytest.mark.parametrize("value", [np.complex64(3 + 4j), 3 + 4j, np.bool_(True), "0.5", None])
def test_a_float_scalar_takes_real_numbers_only_on_every_path(ks: Any, fake: FakeDriver, value: Any) -> None:
    """A NumPy complex or bool given for a float was packed by the typed call and launch() (as its
    real part / 1.0) while check_args refused it: one set of rules on every path."""
    x, y = _bufs()
    for launch in (lambda: ks.axpby(1024, x, y, Params(1, 2), value),
                   lambda: ks.axpby.launch(4, None, x, y, Params(1, 2), value),
                   lambda: ks.axpby.bind(x, y, Params(1, 2), value),
                   lambda: ks.axpby.check_args(x, y, Params(1, 2), value)):
        for _ in range(2):  # the first call generates code; the second runs the generated fast path
            with pytest.raises(ArgumentError, match=r"axpby\(\): argument .*expected a"):
                launch()
    assert fake.launches == []
    for ok in (np.float32(0.25), 0.25, np.float64(0.25)):
        ks.axpby(1024, x, y, Params(1, 2), ok)
    assert len(fake.launches) == 3


def test_a_uniform_given_a_plain_numpy_number_is_refused(ks: Any, fake: FakeDriver) -> None:
    x, y = _bufs()
    for value in (np.int32(2), np.float64(2.0), np.arange(2, dtype=np.float32)):
        for launch in (lambda: ks.axpby(1024, x, y, value, 0.5), lambda: ks.axpby.launch(4, None, x, y, value, 0.5),
                       lambda: ks.axpby.bind(x, y, value, 0.5), lambda: ks.axpby.check_args(x, y, value, 0.5)):
            for _ in range(2):  # the first call generates code; the second runs the generated fast path
                with pytest.raises(ArgumentError, match=r"argument 'p'.*is a NumPy .* value, not a struct"):
                    launch()
    assert fake.launches == []


# -- (3) byte order ------------------------------------------------------------------------------
_OTHER = ">" if sys.byteorder == "little" else "<"
_NATIVE = "<" if sys.byteorder == "little" else ">"


def test_device_buffers_of_the_other_byte_order_are_refused() -> None:
    other = ">f4" if sys.byteorder == "little" else "<f4"
    with pytest.raises(ArgumentError, match=rf"dtype {other} is .*-endian, not in this machine's byte order.*use {_NATIVE}f4"):
        DeviceBuffer(0x1000, 4, other, 0)
    with pytest.raises(ArgumentError, match="not in this machine's byte order"):
        DeviceBuffer.alloc(4, other)


class _Cai:
    def __init__(self, typestr: str = "<f4", shape: Any = (4,), ptr: int = 0x1000, descr: Any = None) -> None:
        self._cai = {"version": 3, "shape": shape, "typestr": typestr, "data": (ptr, False), "strides": None,
                     "descr": descr}

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._cai


def test_cai_and_struct_uniforms_of_the_other_byte_order_are_refused(ks: Any, fake: FakeDriver) -> None:
    x, y = _bufs()
    other = ">" if sys.byteorder == "little" else "<"
    with pytest.raises(ArgumentError, match=r"argument 'x'.*byte order big-endian|argument 'x'.*little-endian"):
        ks.axpby(4, _Cai(f"{other}f4"), y, Params(1, 2), 0.5)
    rec = np.zeros((), dtype=[("a", f"{other}f4"), ("b", f"{other}f4")])
    with pytest.raises(ArgumentError, match=rf"argument 'p'.*field 'a' \({other}f4\) of dtype .* not in this "
                                            rf"machine's byte order.*use \[\('a', '{_NATIVE}f4'\), \('b', '{_NATIVE}f4'\)\]"):
        ks.axpby(4, x, y, rec, 0.5)  # the suggestion is the native spelling, not the struct's |V8 again
    swapped = ctypes.BigEndianStructure if sys.byteorder == "little" else ctypes.LittleEndianStructure

    class Swapped(swapped):  # type: ignore[valid-type, misc]
        _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]

    with pytest.raises(ArgumentError, match=r"argument 'p'.*-endian ctypes structure"):
        ks.axpby(4, x, y, Swapped(1, 2), 0.5)
    assert fake.launches == []


#: big-endian (on this host, the other byte order) numbers that NumPy's dtype.isnative misses
_HIDDEN = [np.dtype([("v", f"{_OTHER}f4", (3,))]),  # a subarray field
           np.dtype([("s", [("a", f"{_NATIVE}f4"), ("b", f"{_OTHER}i4", (2,))])])]  # nested, then a subarray


@pytest.mark.parametrize("dt", _HIDDEN, ids=["subarray", "nested-subarray"])
def test_a_struct_dtype_with_a_subarray_of_the_other_byte_order_is_refused_everywhere(
        fake: FakeDriver, tmp_path: Path, dt: Any) -> None:
    """NumPy says isnative for a struct whose other-order numbers sit in a subarray; one rule
    (khal_runtime.dtypes.byte_order_problem) looks inside for DeviceBuffer, a CAI descr and a uniform."""
    assert dt.isnative  # what made the per-place checks miss it
    field = "v" if dt.names == ("v",) else "s.b"
    native = str(dt.newbyteorder("="))
    msg = rf"field '{field}' \({_OTHER}[fi]4\) of dtype .* not in this machine's byte order.*use {re.escape(native)}"
    with pytest.raises(ArgumentError, match=rf"DeviceBuffer: {msg}"):
        DeviceBuffer(0x1000, 4, dt, 0)
    with pytest.raises(ArgumentError, match=rf"DeviceBuffer.alloc: {msg}"):
        DeviceBuffer.alloc(4, dt)
    e = make_entry("setp", (storage("out", "uint32", 4, writable=True), uniform("p", size=dt.itemsize)))
    ks = fake_kernels(fake, tmp_path, [e])
    out = DeviceBuffer(0x1000, 16, "uint32", 0)
    cai = _Cai(f"|V{dt.itemsize}", descr=dt.descr)
    with pytest.raises(ArgumentError, match=rf"setp\(\): argument 'p'.*has descr: {msg}"):
        ks.setp(16, out, cai)
    with pytest.raises(ArgumentError, match=rf"setp\(\): argument 'p'.*is a NumPy struct whose {msg}"):
        ks.setp(16, out, np.zeros((), dtype=dt))
    assert fake.launches == []
    good = dt.newbyteorder("=")
    assert DeviceBuffer(0x1000, 4, good, 0).dtype == good
    ks.setp(16, out, np.zeros((), dtype=good))
    ks.setp(16, out, _Cai(f"|V{dt.itemsize}", descr=good.descr))
    assert len(fake.launches) == 2


def test_from_numpy_of_a_big_endian_array_keeps_the_values(fake: FakeDriver) -> None:
    a = np.arange(6, dtype=">f4" if sys.byteorder == "little" else "<f4")
    b = DeviceBuffer.from_numpy(a)
    assert b.dtype.isnative and b.to_numpy().tolist() == a.tolist()


# -- (18, 19) raw errors and NULL pointers ---------------------------------------------------------
def test_thread_counts_grids_and_shared_memory_are_named_errors(ks: Any, fake: FakeDriver) -> None:
    x, y = _bufs()
    p = Params(1, 2)
    for _ in range(2):  # generic path, then generated code
        with pytest.raises(ArgumentValueError, match=r"axpby\(\): 1099511627776 threads need .* blocks of 256"):
            ks.axpby(2**40, x, y, p, 0.5)
        with pytest.raises(ArgumentValueError, match=r"thread count must be >= 0"):
            ks.axpby(-1, x, y, p, 0.5)
    with pytest.raises(ArgumentValueError, match=r"grid x = 8589934592 is more than"):
        ks.axpby.launch(2**33, None, x, y, p, 0.5)
    for bad, cls in ((-1, ArgumentValueError), ("abc", ArgumentError), (1.9, ArgumentError), (2**40, ArgumentValueError)):
        with pytest.raises(cls, match=r"axpby.launch\(\): shared_mem"):
            ks.axpby.launch(4, None, x, y, p, 0.5, shared_mem=bad)
    with pytest.raises(ArgumentValueError, match=r"bound launch|thread"):
        ks.axpby.bind(x, y, p, 0.5)(2**40)
    assert fake.launches == []


@pytest.mark.parametrize("shape,match", [((-5,), "negative extent"), ((2.5,), "not a tuple of integers")])
def test_cai_shapes_are_checked(ks: Any, fake: FakeDriver, shape: Any, match: str) -> None:
    x, y = _bufs()
    with pytest.raises(ArgumentValueError, match=rf"argument 'x'.*{match}"):
        ks.axpby(4, _Cai(shape=shape), y, Params(1, 2), 0.5)
    assert fake.launches == []


def test_a_cai_null_pointer_with_elements_is_refused(ks: Any, fake: FakeDriver) -> None:
    x, y = _bufs()
    with pytest.raises(ArgumentValueError, match=r"argument 'x'.*NULL data pointer for 100 elements"):
        ks.axpby(4, _Cai(shape=(100,), ptr=0), y, Params(1, 2), 0.5)
    ks.axpby(4, _Cai(shape=(0,), ptr=0), y, Params(1, 2), 0.5)  # empty: no memory needed
    assert len(fake.launches) == 1


# -- (22) the parameter layout check -----------------------------------------------------------------
def test_a_binary_whose_parameters_disagree_with_the_manifest_is_refused(fake: FakeDriver, tmp_path: Path) -> None:
    e = make_entry("axpby", (storage("x"), storage("y", writable=True), uniform("p"), scalar("bias")))
    ks = fake_kernels(fake, tmp_path, [e])
    fake.layouts[f"FUNC:{e.symbol}"] = fake.layouts[f"FUNC:{e.symbol}"][:-1]  # the binary lacks 'bias'
    with pytest.raises(ParamLayoutError, match=r"entry 'axpby' \(crate 'c'\).*has 5 kernel parameter\(s\), "
                                               r"the manifest's ABI needs 6 \(missing bias \(scalar float32\)\)"):
        ks.axpby(4, *_bufs(), Params(1, 2), 0.5)
    ks2 = fake_kernels(fake, tmp_path / "b", [e])
    layout = fake.layouts[f"FUNC:{e.symbol}"] = list(fake.layouts[f"FUNC:{e.symbol}"]) + []
    layout[5] = (layout[5][0], layout[5][1], 8)  # a double where the manifest says float
    with pytest.raises(ParamLayoutError, match=r"kernel parameter 5 \(bias \(scalar float32\)\) is 8 bytes"):
        ks2.axpby(4, *_bufs(), Params(1, 2), 0.5)
    assert fake.launches == []


# -- (6) the editable record cannot make the runtime read outside the project ---------------------
def _set_editable(pkg: Any, root: str, sources: list[tuple[str, str]]) -> None:
    data = json.loads(pkg.manifest_path.read_text())
    data["editable"] = {"project_root": root}
    data["crates"][0]["sources"] = [{"path": p, "sha256": h} for p, h in sources]
    pkg.manifest_path.write_text(json.dumps(data))


@pytest.mark.needs_nvrtc
def test_an_editable_record_pointing_elsewhere_reads_nothing(tmp_path: Path) -> None:
    pkg = build_package(tmp_path, "synth_hard_editable")
    _set_editable(pkg, "/dev", [("zero", "0" * 64)])
    with pytest.raises(ManifestError, match=r"editable install of /dev, but the package is at .*outside that project"):
        khal_runtime.load(pkg.package_dir)
    _set_editable(pkg, "/etc", [("passwd", "0" * 64)])
    with pytest.raises(ManifestError, match="outside that project"):
        khal_runtime.load(pkg.package_dir)
    problems = verify_package(pkg.package_dir)
    assert any(p.kind == "manifest" and "outside that project" in p.message for p in problems)


@pytest.mark.needs_nvrtc
def test_editable_sources_are_regular_files_named_inside_the_root(tmp_path: Path) -> None:
    pkg = build_package(tmp_path, "synth_hard_editable2", editable=True)
    outside = tmp_path.parent / "khal-outside-secret.txt"
    outside.write_text("secret")
    (tmp_path / "kernels" / "link.cu").symlink_to(outside)
    os.mkfifo(tmp_path / "kernels" / "fifo.cu")
    src = pkg.manifest.crate(CRATE).sources[0]
    _set_editable(pkg, str(tmp_path), [(src.path, src.sha256), ("kernels/link.cu", "0" * 64),
                                       ("kernels/fifo.cu", "0" * 64)])
    with pytest.raises(khal_runtime.StaleBuildError) as ei:
        khal_runtime.load(pkg.package_dir)  # returns (no hang on the FIFO), naming the first problem
    # the author's own symlink is followed (its target changed: stale); the FIFO is not read
    assert "kernels/link.cu changed" in str(ei.value)
    assert "(and 1 more file(s))" in str(ei.value)
    from khal_runtime.verify import check_sources

    msgs = [p.message for p in check_sources(khal_runtime.manifest.load_manifest(pkg.manifest_path),
                                              pkg.package_dir)]
    assert any("kernels/fifo.cu cannot be read" in m and "not a regular file" in m for m in msgs)
    _set_editable(pkg, str(tmp_path), [("../outside.cu", "0" * 64)])
    with pytest.raises(ManifestError, match="leaves the package"):
        khal_runtime.load(pkg.package_dir)  # a manifest cannot name a path outside the project


# -- (7, 9) manifests that disagree with themselves, or are not manifests ------------------------------
def _edit(pkg: Any, fn: Any) -> None:
    data = json.loads(pkg.manifest_path.read_text())
    fn(data)
    pkg.manifest_path.write_text(json.dumps(data))


def _entry(data: dict[str, Any], name: str = "axpby") -> dict[str, Any]:
    return next(e for e in data["crates"][0]["entries"] if e["name"] == name)


@pytest.mark.parametrize("edit,match", [
    (lambda d: _entry(d)["params"][0].update(element_type="float64", element_size=8), "edited after the build"),
    (lambda d: _entry(d)["params"][3].update(kind="uniform"), "edited after the build|a uniform"),
    (lambda d: _entry(d)["params"][0].update(writable=True), "edited after the build"),
    (lambda d: _entry(d)["params"][3].update(kind="texture"), "unknown parameter kind 'texture'"),
    (lambda d: _entry(d)["params"][0].update(element_size=2**62), "element_size"),
    (lambda d: _entry(d).update(block_size=[0, 1, 1]), "block size"),
    (lambda d: _entry(d).update(block_size=[-256, 1, 1]), "block size"),
    (lambda d: _entry(d).update(block_size=[2**40, 1, 1]), "block size"),
    (lambda d: _entry(d).update(block_size=[64, 64, 1]), "block size"),
    (lambda d: _entry(d).update(params=[]), "params"),
    (lambda d: d["crates"][0]["entries"].append(dict(_entry(d))), "an entry is listed twice"),
    (lambda d: d["crates"].append(dict(d["crates"][0])), "a crate is listed twice"),
    (lambda d: _entry(d)["params"].append(dict(_entry(d)["params"][0])), "two parameters share a name"),
])
@pytest.mark.needs_nvrtc
def test_an_edited_manifest_is_a_manifest_error(tmp_path: Path, edit: Any, match: str) -> None:
    pkg = build_package(tmp_path, "synth_hard_manifest")
    _edit(pkg, edit)
    with pytest.raises(ManifestError, match=match):
        khal_runtime.load(pkg.package_dir)
    problems_or_error: Any
    try:
        problems_or_error = verify_package(pkg.package_dir)
    except ManifestError as exc:
        problems_or_error = exc
    assert isinstance(problems_or_error, ManifestError) or any(
        p.error is ManifestError for p in problems_or_error)


@pytest.mark.needs_nvrtc
def test_deep_nesting_duplicate_keys_and_fifos_are_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="nested deeper"):
        parse_manifest("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ManifestError, match="nested deeper"):
        parse_manifest('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ManifestError, match="key 'schema_version' appears twice"):
        parse_manifest('{"schema_version": 2, "schema_version": 1}')
    pkg = build_package(tmp_path, "synth_hard_fifo")
    pkg.manifest_path.unlink()
    os.mkfifo(pkg.manifest_path)
    with pytest.raises(ManifestError, match="not a regular file"):
        khal_runtime.load(pkg.package_dir)  # answers at once: a FIFO is never opened for a blocking read
    pkg.manifest_path.unlink()
    pkg.manifest_path.symlink_to("/dev/zero")
    with pytest.raises(ManifestError, match="not a regular file"):
        khal_runtime.load(pkg.package_dir)


@pytest.mark.needs_nvrtc
def test_an_artifact_that_is_a_device_or_fifo_is_refused(tmp_path: Path) -> None:
    pkg = build_package(tmp_path, "synth_hard_fifo_art")
    ptx = pkg.artifact_file("ptx")
    ptx.unlink()
    os.mkfifo(ptx)
    problems = verify_package(pkg.package_dir)
    assert any("not a regular file" in p.message for p in problems)


# -- (6, 9) size caps: a manifest, an artifact, an editable source larger than the cap is refused unread
def _sparse(path: Path, size: int) -> None:
    """Replace ``path`` with a sparse file of ``size`` bytes (no disk, no memory)."""
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.mark.needs_nvrtc
def test_a_manifest_over_the_size_cap_is_a_manifest_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime.manifest import MAX_MANIFEST_BYTES

    pkg = build_package(tmp_path, "synth_hard_cap_manifest")
    text = pkg.manifest_path.read_text()
    _sparse(pkg.manifest_path, MAX_MANIFEST_BYTES + 1)
    with pytest.raises(ManifestError, match=rf"the manifest is {MAX_MANIFEST_BYTES + 1} bytes, more than the "
                                            rf"{MAX_MANIFEST_BYTES} allowed"):
        khal_runtime.load(pkg.package_dir)
    pkg.manifest_path.write_text(text)
    monkeypatch.setattr(khal_runtime.manifest, "MAX_MANIFEST_BYTES", len(text) - 1)  # text already in memory
    with pytest.raises(ManifestError, match=rf"{len(text)} bytes, more than a manifest may be \({len(text) - 1}\)"):
        parse_manifest(text)


@pytest.mark.needs_nvrtc
def test_an_artifact_over_the_size_cap_is_refused_unread(tmp_path: Path) -> None:
    from khal_runtime.verify import MAX_ARTIFACT_BYTES

    pkg = build_package(tmp_path, "synth_hard_cap_artifact")
    _sparse(pkg.artifact_file("ptx"), MAX_ARTIFACT_BYTES + 1)
    msg = rf"artifact '_khal/{CRATE}/{CRATE}.compute_75.ptx' is {MAX_ARTIFACT_BYTES + 1} bytes, more than the " \
          rf"{MAX_ARTIFACT_BYTES} allowed"
    problems = verify_package(pkg.package_dir)
    assert any(p.error is ArtifactError and re.search(msg, p.message) for p in problems), problems
    with pytest.raises(ArtifactError, match=msg):
        khal_runtime.check_package(pkg.package_dir)


@pytest.mark.needs_nvrtc
def test_an_editable_source_over_the_size_cap_is_stale_unread(tmp_path: Path) -> None:
    from khal_runtime.verify import MAX_SOURCE_BYTES, check_sources

    pkg = build_package(tmp_path, "synth_hard_cap_source", editable=True)
    _sparse(tmp_path / "kernels" / "core.cu", MAX_SOURCE_BYTES + 1)
    msg = rf"kernels/core.cu cannot be read \(.*source is {MAX_SOURCE_BYTES + 1} bytes, more than the " \
          rf"{MAX_SOURCE_BYTES} allowed\)"
    with pytest.raises(khal_runtime.StaleBuildError, match=msg):
        khal_runtime.load(pkg.package_dir)
    (problem,) = check_sources(khal_runtime.manifest.load_manifest(pkg.manifest_path), pkg.package_dir)
    assert re.search(msg, problem.message) and problem.error is khal_runtime.StaleBuildError


# -- (8) a binary of another arch in an arch's slot ------------------------------------------------------
@pytest.mark.needs_nvrtc
def test_a_cubin_of_another_arch_in_a_slot_is_refused(tmp_path: Path) -> None:
    pkg = build_package(tmp_path, "synth_hard_arch", cubin_archs=("sm_80", "sm_90"))
    import hashlib

    sm80 = pkg.artifact_file("cubin", "sm_80").read_bytes()
    pkg.artifact_file("cubin", "sm_90").write_bytes(sm80)  # the sm_80 cubin in sm_90's slot, sha fixed

    def fix(d: dict[str, Any]) -> None:
        for a in d["crates"][0]["artifacts"]:
            if a["arch"] == "sm_90":
                a.update(sha256=hashlib.sha256(sm80).hexdigest(), size=len(sm80))

    _edit(pkg, fix)
    problems = verify_package(pkg.package_dir)
    assert [p.message for p in problems if p.kind == "binary"] == [
        f"artifact '_khal/{CRATE}/{CRATE}.sm_90.cubin' is a cubin for sm_80, the manifest says sm_90: a binary "
        "of another arch is in its place; rebuild the package (pip wheel . / pip install -e .); if "
        "CUDA_OXIDE_SHADERS_PTX_CORE is set, unset it"]
    with pytest.raises(ArtifactError, match="is a cubin for sm_80, the manifest says sm_90"):
        khal_runtime.check_package(pkg.package_dir)


@pytest.mark.needs_nvrtc
def test_the_loader_refuses_a_cubin_of_another_arch_before_the_driver_sees_it(
        tmp_path: Path, fake: FakeDriver) -> None:
    """The same swap met by a plain load and first launch on an sm_90 device (the fake driver):
    the loader checks the ELF's arch before handing the bytes to the driver."""
    pkg = build_package(tmp_path, "synth_hard_arch_load", cubin_archs=("sm_80", "sm_90"))
    import hashlib

    sm80 = pkg.artifact_file("cubin", "sm_80").read_bytes()
    pkg.artifact_file("cubin", "sm_90").write_bytes(sm80)
    _edit(pkg, lambda d: [a.update(sha256=hashlib.sha256(sm80).hexdigest(), size=len(sm80))
                          for a in d["crates"][0]["artifacts"] if a["arch"] == "sm_90"])
    kernels = khal_runtime.load(pkg.package_dir)  # the manifest is fine: nothing read yet
    out = DeviceBuffer.alloc(16, np.uint32)
    with pytest.raises(ArtifactError, match="is a cubin for sm_80, the manifest says sm_90"):
        kernels.fill(16, out, 7)
    assert fake.launches == []
    assert not [c for c in fake.calls if c[0].startswith("cuModuleLoad") or c[0].startswith("cuLibraryLoad")]


# -- (#29 item 17) the CUDA load path checks the artifact's own bytes ------------------------------
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_ptx_body_is_refused_at_first_launch_before_the_driver(
        fake: FakeDriver, tmp_path: Path, damage: str) -> None:
    """A byte of a PTX body flipped (the symbols untouched, so the symbol check passes), or the
    PTX cut short: the first launch through the package raises ArtifactError (sha256, size) and
    nothing reaches the driver. ``verify`` is not asked: this is the loader's own check."""
    e = make_entry("axpby", (storage("x"), storage("y", writable=True), uniform("p"), scalar("bias")))
    ks = fake_kernels(fake, tmp_path, [e])
    ptx = next((tmp_path / "fakepkg" / "_khal" / "c").glob("*.ptx"))
    data = ptx.read_bytes()
    if damage == "flip":
        at = data.index(b"ret;")  # an instruction of a kernel body, no symbol
        ptx.write_bytes(data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1:])
        match = r"has sha256 .*the manifest says .*changed after the build"
    else:
        ptx.write_bytes(data[:-2])  # the last body's closing brace and newline
        match = rf"is {len(data) - 2} bytes, the manifest says {len(data)}"
    from khal_runtime.binaries import khal_symbols, read_binary

    assert khal_symbols(read_binary(ptx.read_bytes()))["axpby"] == e.hash  # only the bytes tell
    with pytest.raises(ArtifactError, match=match):
        ks.axpby(4, *_bufs(), Params(1, 2), 0.5)
    assert fake.launches == []
    assert not [c for c in fake.calls if c[0].startswith(("cuModuleLoad", "cuLibraryLoad"))], fake.names()
