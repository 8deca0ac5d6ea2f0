"""The CUDA runtime on Slang crates and older manifests, through ``khal_runtime.load`` on the fake
driver (tests/helpers/fakecuda.py): a ``dict`` uniform packed by the manifest's CUDA layout, the named
error for a dict to a CUDA C++ crate's uniform, and a schema-1 manifest (SPIR-V status
``not_configured``, no language) that still loads and launches."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import khal_runtime
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import ArgumentError, ArgumentValueError, HashMismatchError
from khal_runtime.manifest import Param, StructField, StructLayout
from khal_runtime.verify import verify_package

from tests.helpers.slang import needs_slang_or_wheel, stale_slang_package
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, storage, uniform  # noqa: F401

#: ``struct P { float a; uint n; float2 w; }`` as CUDA lays it out (what a Slang build records)
P_CUDA = StructLayout(size=16, fields=(
    StructField(name="a", type="float32", offset=0, size=4),
    StructField(name="n", type="uint32", offset=4, size=4),
    StructField(name="w", type="float32", offset=8, size=8, shape=(2,), strides=(4,)),
))


def _slang_uniform() -> Param:
    return Param(name="p", kind="uniform", element_type="P", element_size=16, element_align=8,
                 layouts={"cuda": P_CUDA})


def _uniform_bytes(drv: FakeDriver, launch: dict[str, object], slot: int) -> bytes:
    ptr = struct.unpack("<Q", launch["slots"][slot])[0]  # type: ignore[index]
    return drv.memory[ptr][:16]


def test_a_dict_uniform_to_a_slang_crate_is_packed_by_its_cuda_layout(fake: FakeDriver, tmp_path: Path) -> None:
    e = make_entry("shade", (storage("o", writable=True), _slang_uniform()), block=(64, 1, 1))
    ks = fake_kernels(fake, tmp_path, [e], crate="s", package="slang_dict_pkg", language="slang")
    o = DeviceBuffer.zeros(8, np.float32)
    ks.shade(8, o, {"a": 1.5, "n": 7, "w": (2.0, -3.0)})
    (launch,) = [ln for ln in fake.launches if ln["f"] == f"FUNC:{e.symbol}"]
    assert _uniform_bytes(fake, launch, 2) == struct.pack("<fI2f", 1.5, 7, 2.0, -3.0)
    # the same fields as a NumPy structured scalar: the same bytes (the upload cache's same pointer)
    rec = np.array((1.5, 7, (2.0, -3.0)), dtype=[("a", "<f4"), ("n", "<u4"), ("w", "<f4", (2,))])
    ks.shade(8, o, rec[()])
    assert fake.launches[-1]["slots"][2] == launch["slots"][2]  # type: ignore[index]
    with pytest.raises(ArgumentError, match=r"shade\(\): argument 'p'.*missing field\(s\) 'w'"):
        ks.shade(8, o, {"a": 1.5, "n": 7})
    with pytest.raises(ArgumentError, match=r"shade\(\): argument 'p'.*unknown field\(s\) 'b'"):
        ks.shade(8, o, {"a": 1.5, "n": 7, "w": (0.0, 0.0), "b": 1})
    with pytest.raises(ArgumentValueError, match=r"field 'w' \(float32\[2\]\) expects 2 item"):
        ks.shade(8, o, {"a": 1.5, "n": 7, "w": (1.0, 2.0, 3.0)})


def test_a_dict_uniform_to_a_cuda_cpp_crate_is_a_named_error(fake: FakeDriver, tmp_path: Path) -> None:
    """A CUDA C++ crate records no struct layout (docs/guide/runtime.md): a dict cannot be packed."""
    e = make_entry("axpby", (storage("x"), uniform("p", "AxpbyParams", 8)))
    ks = fake_kernels(fake, tmp_path, [e], crate="c", package="cpp_dict_pkg")
    with pytest.raises(ArgumentError, match=r"axpby\(\): argument 'p'.*a dict of fields needs the struct's "
                                            r"layout, which only Slang crates record; pass a ctypes Structure"):
        ks.axpby(4, DeviceBuffer.zeros(4, np.float32), {"a": 1.0, "b": 2.0})


def test_a_schema_1_manifest_still_loads_and_launches(fake: FakeDriver, tmp_path: Path) -> None:
    """Schema 1 (before Slang crates): no ``language``, SPIR-V status ``not_configured``, entry
    hashes not checked against their signature (that check starts with schema 2)."""
    e = make_entry("fill", (storage("o", "uint32", writable=True),))
    fake_kernels(fake, tmp_path, [e], crate="c", package="old_pkg")
    path = tmp_path / "old_pkg" / "_khal" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["schema_version"] = 1
    crate = doc["crates"][0]
    crate.pop("language", None)
    crate["spirv"] = {"status": "not_configured", "reason": ""}
    for entry in crate["entries"]:
        for k in ("grid_dims", "fixed_block", "launch_bounds", "template", "template_args", "webgpu"):
            entry.pop(k, None)
    path.write_text(json.dumps(doc))

    assert verify_package(tmp_path / "old_pkg") == []
    ks = khal_runtime.load(tmp_path / "old_pkg")
    c = ks.manifest.crate("c")
    assert (c.language, c.spirv.status, c.has_webgpu) == ("cuda", "not_configured", False)
    o = DeviceBuffer.zeros(300, np.uint32)
    ks.fill(300, o)
    (launch,) = [ln for ln in fake.launches if ln["f"] == f"FUNC:{e.symbol}"]
    assert launch["grid"] == (3, 1, 1)  # ceil(300 / 128)


@needs_slang_or_wheel
def test_a_stale_slang_cubin_is_refused_before_loading(fake: FakeDriver, example_wheel: Path,
                                                       tmp_path: Path) -> None:
    """The example's Slang cubin for the fake device (sm_90) beside a manifest rebuilt from an
    edited source: its symbols carry the old hashes: HashMismatchError, and nothing is loaded.
    (On a GPU: tests/runtime/cuda/test_synthetic_gpu.py::test_stale_slang_cubin_rejected.)"""
    pkg = stale_slang_package(example_wheel, tmp_path)
    assert verify_package(pkg), "verify sees the stale symbols too"
    ks = khal_runtime.load(pkg)
    # the whole crate is checked before it loads: the first entry (by name) is named
    first = ks.manifest.crate("slang").entries[0]
    with pytest.raises(HashMismatchError, match=rf"entry '{first.name}' \(crate 'slang'\) in "
                                                rf"_khal/slang/slang\.sm_90\.cubin: the manifest expects hash "
                                                rf"{first.hash}, the binary has [0-9a-f]{{16}}"):
        ks.saxpy_shared(16, DeviceBuffer.zeros(16, np.float32), DeviceBuffer.zeros(16, np.float32), 1.0)
    assert "cuLibraryLoadData" not in fake.names()


def test_a_slice_passes_its_own_element_count(fake: FakeDriver, tmp_path: Path) -> None:
    """What a Slang kernel's GetDimensions returns on CUDA is the count the host passes beside the
    pointer: a slice's, not its allocation's (the GPU check: tests/build/test_example_slang.py)."""
    e = make_entry("shade", (storage("o", writable=True), _slang_uniform()), block=(64, 1, 1))
    ks = fake_kernels(fake, tmp_path, [e], crate="s", package="slang_slice_pkg", language="slang")
    big = DeviceBuffer.zeros(1000, np.float32)
    view = big[64:328]
    ks.shade(1000, view, {"a": 1.0, "n": 1, "w": (0.0, 0.0)})
    slots = fake.launches[-1]["slots"]
    assert struct.unpack("<Q", slots[0])[0] == big.ptr + 64 * 4
    assert struct.unpack("<Q", slots[1])[0] == 264
