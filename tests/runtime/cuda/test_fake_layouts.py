"""The fake driver's parameter layouts come from the compiled binary, not from the runtime
(issue #29 item 18), and every scalar type of the ABI is packed at the exact width NVRTC gives
its C type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from khal_runtime import abi
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.manifest import symbol_for
from tests.helpers import synthetic as _synthetic
from tests.helpers.fakecuda import (C_TYPES, FakeDriver, cubin_param_layouts, fake, fake_kernels, make_entry,  # noqa: F401
                            ptx_param_layouts, scalar, storage)

#: each ABI scalar's NumPy dtype (bfloat16: none; its bits are float32's top half), and a value
#: whose every byte matters
DTYPES: dict[str, tuple[str | None, object]] = {
    "int8": ("<i1", -100), "int16": ("<i2", -30000), "int32": ("<i4", -2_000_000_000),
    "int64": ("<i8", -(2**62) - 3), "uint8": ("<u1", 200), "uint16": ("<u2", 60000),
    "uint32": ("<u4", 4_000_000_000), "uint64": ("<u8", 2**64 - 5), "float16": ("<f2", 1.5),
    "bfloat16": (None, 1.5), "float32": ("<f4", 0.1), "float64": ("<f8", 0.1), "bool": ("<?", True),
    "complex64": ("<c8", 1.5 - 2.25j), "complex128": ("<c16", 0.1 + 0.2j),
}


def _bytes(element_type: str, value: object) -> bytes:
    dtype, _ = DTYPES[element_type]
    if dtype is None:  # bfloat16: 1.5 is exact, 0x3FC0
        return (np.array(value, "<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return np.array(value, dtype).tobytes()


def test_the_tables_cover_every_abi_scalar() -> None:
    assert set(DTYPES) == set(abi.SCALARS) == set(C_TYPES)


def test_every_scalar_is_packed_at_the_width_nvrtc_gives_its_c_type(fake: FakeDriver, tmp_path: Path) -> None:
    """Per ABI scalar type, an entry (x: storage float32, v: scalar T) in a fake package whose
    PTX has NVRTC's ``.param`` declarations; a launch through the package carries ``v`` as
    exactly NumPy's bytes of the value in that type, at the width and offset NVRTC gave."""
    entries = {name: make_entry(f"s_{name}", (storage("x"), scalar("v", name, t.size)))
               for name, t in abi.SCALARS.items()}
    ks = fake_kernels(fake, tmp_path, list(entries.values()))
    ptx = next((tmp_path / "fakepkg" / "_khal" / "c").glob("*.ptx")).read_bytes()
    declared = ptx_param_layouts(ptx)
    buf = DeviceBuffer(0x1000, 64, "float32", 0)
    for name, entry in entries.items():
        _, offset, width = declared[entry.symbol][2]  # NVRTC's declaration of v
        want = _bytes(name, DTYPES[name][1])
        assert width == len(want), f"{name}: NVRTC declares {width} bytes, NumPy's {name} is {len(want)}"
        getattr(ks, f"s_{name}")(4, buf, DTYPES[name][1])
        launch = fake.launches[-1]
        assert launch["f"] == f"FUNC:{entry.symbol}"
        assert [len(s) for s in launch["slots"]] == [8, 8, width], name
        assert launch["slots"][2] == want, f"{name}: packed {launch['slots'][2].hex()}, want {want.hex()}"


@pytest.mark.needs_nvrtc
def test_the_fake_reads_layouts_from_the_binary_ptx_and_cubin_alike(fake: FakeDriver) -> None:
    """The synthetic crate compiled by NVRTC to PTX and to a cubin: the ``.param`` declarations
    and the cubin's EIATTR_KPARAM_INFO records give the same layouts, and loading either into
    the fake registers them (nothing from the runtime's own layout)."""
    source = _synthetic.cuda_source("layouts")
    ptx = _synthetic.nvrtc_compile(source, "compute_90")
    cubin = _synthetic.nvrtc_compile(source, "sm_90")
    from_ptx = {k: [(o, n) for _, o, n in v] for k, v in ptx_param_layouts(ptx).items()}
    from_cubin = {k: [(o, n) for _, o, n in v] for k, v in cubin_param_layouts(cubin).items()}
    assert from_ptx == from_cubin and len(from_ptx) == len(_synthetic.KERNELS)
    scalars = symbol_for("scalars", _synthetic.entry_hash("scalars", "layouts"))
    # (unsigned long long*, count, signed char, unsigned short, long long, float, unsigned short,
    # bool, double, unsigned short): the C widths, aligned
    assert from_ptx[scalars] == [(0, 8), (8, 8), (16, 1), (18, 2), (24, 8), (32, 4), (36, 2), (38, 1),
                                 (40, 8), (48, 2)]
    for image in (ptx, cubin):
        drv = FakeDriver()
        _, lib = drv.cuLibraryLoadData(image)
        _, fn = drv.cuLibraryGetKernel(lib, scalars.encode())
        assert [(o, n) for _, o, n in drv.layouts[fn]] == from_ptx[scalars]
        assert drv.cuFuncGetParamInfo(fn, 4)[1:] == (24, 8)


@pytest.mark.parametrize("decl, want", [
    (".param .u64 a", [(0, 8)]),
    (".param .u8 a, .param .align 2 .b8 b[2], .param .align 16 .b8 c[32]", [(0, 1), (2, 2), (16, 32)]),
    (".param .u32 a, .param .u64 .ptr .global .align 16 b, .param .f32 c", [(0, 4), (8, 8), (16, 4)]),
    ("", []),
])
def test_ptx_param_declarations(decl: str, want: list[tuple[int, int]]) -> None:
    params = decl.replace(", ", ",\n")
    ptx = f".version 9.0\n.target sm_90\n.visible .entry k(\n{params}\n)\n{{\n ret;\n}}\n"
    assert [(o, n) for _, o, n in ptx_param_layouts(ptx.encode())["k"]] == want
