"""Parameter kinds are one table (``khal_runtime.abi.KINDS``): a new kind that reuses a reader
is one entry there, and nothing else; an unknown kind or reader is an error everywhere, never
a scalar by default."""

from __future__ import annotations

import ctypes
import dataclasses
import re
import struct
import tempfile
from pathlib import Path

import pytest

from hatch_khal import codegen
from hatch_khal.entries import ParamDecl, find_entries
from hatch_khal.slang import cuda_abi
from hatch_khal.slang.entries import SlangEntry
from khal_runtime import DeviceBuffer, abi
from khal_runtime.manifest import Param
from khal_runtime.packing import ScalarPacker
from tests.helpers.fakecuda import FakeDriver, fake, fake_kernels, make_entry, stream  # noqa: F401  (fixture)

HEADER = Path(__file__).resolve().parents[1] / "hatch_khal" / "include" / "khal.h"

#: hypothetical kinds, each reusing a reader and declaring its own CUDA C++ marker
NEW_KINDS = {
    "constants": abi.ParamKind("constants", "struct", (None,),
                               (abi.Marker("KHAL_CONSTANTS", None, "const T& name", "*{p}_ptr"),)),
    "count": abi.ParamKind("count", "value", (None,), (abi.Marker("KHAL_COUNT", None, "T name", "{p}"),)),
}


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_float), ("b", ctypes.c_float)]


def test_khal_h_markers_agree_with_the_table() -> None:
    """khal.h's copies of the markers (for editors, compiles outside the hook) say what the
    table says; the hook's unit defines the table's own before including khal.h."""
    text = HEADER.read_text()
    defined = dict(re.findall(r"^#define (KHAL_[A-Z_]+)(\([^)]*\) .+)$", text, re.M))
    table = abi.markers()
    for macro, (_kind, marker) in table.items():
        assert macro in defined, macro
        assert marker.define() == f"#define {macro}{defined[macro]}"
    assert re.search(r"#ifndef KHAL_SCANNED\n(#define KHAL_[A-Z_]+\(.*\n)+#endif", text)
    unit = codegen.generate_unit("c", [], []).text
    for _kind, marker in table.values():
        assert unit.index(marker.define()) < unit.index('#include "khal.h"')


@pytest.mark.parametrize("name", sorted(NEW_KINDS))
def test_a_new_kind_is_one_table_entry(name: str, fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scan, generate, describe in the manifest and launch a kind nothing but abi.KINDS knows."""
    new = NEW_KINDS[name]
    monkeypatch.setitem(abi.KINDS, name, new)
    macro = new.markers[0].macro
    arg_type = "Pair" if new.reader == "struct" else "uint32_t"
    src = f"""
    struct Pair {{ float a; float b; }};
    KHAL_ENTRY(k, 64, (KHAL_STORAGE(float, out), {macro}({arg_type}, extra))) {{ }}
    """
    # the build's scanner reads the marker
    (decl,) = find_entries(src, "k.cu")
    p = decl.params[1]
    assert (p.name, p.kind, p.ctype, p.writable) == ("extra", name, arg_type, False)
    # the generated unit defines the marker and passes what the reader says the kernel receives
    unit = codegen.generate_unit("c", [], [(decl, "0" * 16)]).text
    assert f"#define {macro}(T, name) {new.markers[0].declares}" in unit
    t = "khal_sig_k::arg<1>"
    if new.reader == "struct":
        assert f"const ::khal::value_t<{t}>* khal_p1_ptr" in unit and ", *khal_p1_ptr);" in unit
    else:
        assert f"::khal::value_t<{t}> khal_p1)" in unit and ", khal_p1);" in unit
    # the manifest takes it, describes it and lays it out
    et, size = ("Pair", 8) if new.reader == "struct" else ("uint32", 4)
    param = Param(name="extra", kind=name, element_type=et, element_size=size, element_align=4)
    assert param.describe() == new.describe(et, size)
    assert [s.what for s in param.slots] == (["pointer"] if new.reader == "struct" else ["value"])
    # and the runtime launches it through its generic paths (the generated call and bind)
    out = Param(name="out", kind="storage", element_type="float32", element_size=4, element_align=4,
                shape="slice", writable=True)
    ks = fake_kernels(fake, Path(tempfile.mkdtemp(prefix="khal-kinds-")), [make_entry("k", (out, param))])
    buf = DeviceBuffer(0x1000, 64, "float32", 0)
    value = Pair(2.0, 3.0) if new.reader == "struct" else 7
    st = stream()
    ks.k(64, buf, value, stream=st)
    ks.k.bind(buf, value, stream=st)(64)
    assert len(fake.launches) == 2
    for launch in fake.launches:
        slots = launch["slots"]
        assert struct.unpack("<Q", slots[0])[0] == 0x1000 and struct.unpack("<Q", slots[1])[0] == 64
        if new.reader == "struct":  # a device copy of the struct's bytes
            assert struct.unpack("<Q", slots[2])[0] not in (0, 0x1000)
        else:
            assert struct.unpack("<I", slots[2][:4])[0] == 7
    with pytest.raises(Exception, match="extra"):  # the kind's checks are its reader's
        ks.k(64, buf, "seven", stream=st)


# ---------------------------------------------------------------------------------------------
# unknown kinds and readers
# ---------------------------------------------------------------------------------------------
ODD = abi.ParamKind("odd", "pixels", (None,), (abi.Marker("KHAL_ODD", None, "T name", "{p}"),))


def test_unknown_kind_and_reader_in_the_table() -> None:
    with pytest.raises(ValueError, match=r"unknown parameter kind 'mystery'; the ABI has storage, uniform, scalar"):
        abi.kind("mystery")
    with pytest.raises(ValueError, match=r"kind 'odd' has reader 'pixels'.*implements array, struct, value"):
        ODD.slots("float32", 4, 4)
    with pytest.raises(ValueError, match="pixels"):
        ODD.validate("float32", 4, None, None, False)
    with pytest.raises(ValueError, match="unknown parameter reader 'pixels'"):
        abi.reader("pixels")


def test_codegen_refuses_an_unknown_kind_or_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    (decl,) = find_entries("KHAL_ENTRY(k, 64, (KHAL_SCALAR(int, x))) { }", "k.cu")
    bad = dataclasses.replace(decl, params=(ParamDecl("x", "mystery", "int", False),))
    with pytest.raises(ValueError, match="unknown parameter kind 'mystery'"):
        codegen.generate_unit("c", [], [(bad, "0" * 16)])
    monkeypatch.setitem(abi.KINDS, "odd", ODD)
    odd = dataclasses.replace(decl, params=(ParamDecl("x", "odd", "int", False),))
    with pytest.raises(ValueError, match="reader 'pixels'"):
        codegen.generate_unit("c", [], [(odd, "0" * 16)])


def test_slang_cuda_wrapper_refuses_an_unknown_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(abi.KINDS, "odd", ODD)
    p = Param.model_construct(name="x", kind="odd", element_type="float32", element_size=4, element_align=4)
    e = SlangEntry(name="k", block_size=(64, 1, 1), params=(p,), hash="0" * 16, where="k.slang:1")
    with pytest.raises(ValueError, match=r"Slang CUDA wrapper of entry 'k'.*reader 'pixels'"):
        cuda_abi._entry_code(e)


def test_cuda_launch_path_refuses_an_unknown_reader(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind whose reader the CUDA path does not implement fails when the kernel is planned,
    naming it: never launched as a scalar."""
    x = Param(name="x", kind="scalar", element_type="float32", element_size=4, element_align=4)
    ks = fake_kernels(fake, Path(tempfile.mkdtemp(prefix="khal-kinds-")), [make_entry("k", (x,))])
    monkeypatch.setitem(abi.KINDS, "scalar", dataclasses.replace(abi.KINDS["scalar"], reader="pixels"))
    with pytest.raises(ValueError, match=r"parameter kind 'scalar' has reader 'pixels', which this path does not"):
        ks.k(64, 1.0, stream=stream())
    assert fake.launches == []


def test_webgpu_scalar_block_refuses_an_unknown_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(abi.KINDS, "odd", ODD)
    p = Param.model_construct(name="x", kind="odd", element_type="float32", element_size=4, element_align=4)
    with pytest.raises(ValueError, match="pixels"):
        ScalarPacker("k", (p,), None, 0)  # type: ignore[arg-type]
