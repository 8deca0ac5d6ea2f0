"""Hostile cubins (issue #29 item 9): ELF files built here whose symbol and section names decode
to far more than the file holds. Every reader of a cubin (``read_binary``: a prebuilt file at
build, ``verify``, the loader) refuses them with a named BinaryFormatError, within a memory
bound, instead of decoding gigabytes of names."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import pytest

from khal_runtime import binaries
from khal_runtime.binaries import EM_CUDA, BinaryFormatError, read_binary, read_cubin, scan_cubin
from tests.helpers.fakecuda import FakeDriver, fake, make_entry, storage, write_package  # noqa: F401  (fixture)

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB = 1, 2, 3
_STT_FUNC, _STB_GLOBAL = 2, 1


def cubin(symbols: list[bytes], *, shared: bytes | None = None, copies: int = 0, sections: int = 0,
          section_name: bytes | None = None, text_size: int | None = None) -> bytes:
    """A 64-bit little-endian EM_CUDA ELF for sm_90: ``symbols`` as STT_FUNC, plus ``copies``
    more functions all named ``shared``; ``sections`` extra sections all named
    ``section_name``; a ``.text`` whose header claims ``text_size`` bytes."""
    strtab = bytearray(b"\0")
    syms = [_SYM.pack(0, 0, 0, 0, 0, 0)]
    for n in symbols:
        syms.append(_SYM.pack(len(strtab), (_STB_GLOBAL << 4) | _STT_FUNC, 0, 4, 0, 16))
        strtab += n + b"\0"
    if shared is not None:
        at = len(strtab)
        strtab += shared + b"\0"
        syms += [_SYM.pack(at, (_STB_GLOBAL << 4) | _STT_FUNC, 0, 4, 0, 16)] * copies
    shstr = bytearray(b"\0")
    names = {}
    for n in (b".shstrtab", b".strtab", b".symtab", b".text"):
        names[n] = len(shstr)
        shstr += n + b"\0"
    extra_at = len(shstr)
    shstr += (section_name or b".nv.extra") + b"\0"
    symtab = b"".join(syms)
    text = b"\0" * 16
    body = bytearray(b"\0" * _EHDR.size)
    offsets = {}
    for key, blob in ((b".shstrtab", bytes(shstr)), (b".strtab", bytes(strtab)), (b".symtab", symtab),
                      (b".text", text)):
        while len(body) % 8:
            body += b"\0"
        offsets[key] = (len(body), len(blob))
        body += blob
    while len(body) % 8:
        body += b"\0"
    shoff = len(body)
    heads = [_SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
             _SHDR.pack(names[b".shstrtab"], _SHT_STRTAB, 0, 0, *offsets[b".shstrtab"], 0, 0, 1, 0),
             _SHDR.pack(names[b".strtab"], _SHT_STRTAB, 0, 0, *offsets[b".strtab"], 0, 0, 1, 0),
             _SHDR.pack(names[b".symtab"], _SHT_SYMTAB, 0, 0, *offsets[b".symtab"], 2, 1, 8, _SYM.size),
             _SHDR.pack(names[b".text"], _SHT_PROGBITS, 6, 0, offsets[b".text"][0],
                        offsets[b".text"][1] if text_size is None else text_size, 0, 0, 4, 0)]
    heads += [_SHDR.pack(extra_at, _SHT_PROGBITS, 0, 0, offsets[b".text"][0], 0, 0, 0, 1, 0)] * sections
    body += b"".join(heads)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x33, 8]) + b"\0" * 7  # ELF64, LE, CUDA ABI v8
    body[: _EHDR.size] = _EHDR.pack(ident, 2, EM_CUDA, 1, 0, 0, shoff, 90 << 8, _EHDR.size, 0, 0,
                                    _SHDR.size, len(heads), 1)
    return bytes(body)


KHAL = [b"saxpy_khal_0123456789abcdef", b"fill_khal_fedcba9876543210"]


def test_the_crafted_cubin_reads_as_a_cubin() -> None:
    """The builder makes what both readers accept, so the refusals below are the caps'."""
    data = cubin(KHAL, shared=b"helper_" * 10, copies=3, sections=5)
    info = scan_cubin(data)
    assert info is not None and info == read_cubin(data, "x.cubin") == read_binary(data)
    assert info.arch == 90 and binaries.khal_symbols(info) == {"saxpy": "0123456789abcdef",
                                                               "fill": "fedcba9876543210"}


def _peak(fn: object) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:  # noqa: BLE001
            return exc, tracemalloc.get_traced_memory()[1]
        return None, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_one_long_name_shared_by_many_symbols_is_refused_in_bounded_memory() -> None:
    """The issue's file, scaled down: 100 functions sharing one 1 MB name (100 MB of names from
    a 1 MB file, decoded by every reader before the cap)."""
    data = cubin(KHAL, shared=b"n" * (1 << 20), copies=100)
    assert len(data) < (1 << 20) + 8192
    exc, peak = _peak(lambda: read_binary(data, "bomb.cubin"))
    assert isinstance(exc, BinaryFormatError), exc
    assert str(exc).startswith("bomb.cubin: symbol name of ") and f"more than the {binaries.MAX_SYMBOL_NAME} allowed" in str(exc)
    assert peak < 24 << 20, f"peak {peak >> 20} MiB while refusing a 1 MiB cubin"


def test_many_sections_sharing_one_name_are_refused_in_bounded_memory() -> None:
    """Section names are decoded too (each section looked up by name): 4000 sections sharing
    one 60 KB name (under the name cap) would decode to 240 MB."""
    data = cubin(KHAL, sections=4000, section_name=b"s" * (60 << 10))
    exc, peak = _peak(lambda: read_binary(data, "bomb.cubin"))
    assert isinstance(exc, BinaryFormatError), exc
    assert "took more than" in str(exc) and "names shared by many symbols or sections" in str(exc)
    assert peak < 48 << 20, f"peak {peak >> 20} MiB"


def test_names_within_the_caps_shared_by_many_symbols_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the name cap but over the total: 2000 symbols sharing one 60 KB name."""
    data = cubin(KHAL, shared=b"m" * (60 << 10), copies=2000)
    assert scan_cubin(data) is None  # the fast reader declines: the names decoded pass its total
    with pytest.raises(BinaryFormatError, match=r"^bomb\.cubin: reading its symbol and section names took more"):
        read_binary(data, "bomb.cubin")


def test_a_symbol_count_over_the_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binaries, "MAX_SYMBOLS", 50)
    data = cubin([b"f%d" % i for i in range(60)])
    assert scan_cubin(data) is None
    with pytest.raises(BinaryFormatError, match=r"^x\.cubin: 61 symbols, more than the 50 allowed"):
        read_binary(data, "x.cubin")


def test_a_section_past_the_end_of_the_file_is_refused() -> None:
    data = cubin(KHAL, text_size=1 << 40)
    with pytest.raises(BinaryFormatError, match=r"^x\.cubin: section '\.text' \(1099511627776 bytes at offset \d+\) "
                                                r"runs past the end of the file"):
        read_binary(data, "x.cubin")


def test_verify_and_the_loader_refuse_the_bomb_before_the_driver(tmp_path: Path, fake: FakeDriver) -> None:
    """The bomb as a package's sm_90 cubin (its size and sha256 right in the manifest): ``verify``
    reports it, and the first launch raises before anything reaches the driver."""
    import hashlib
    import json

    import khal_runtime
    from khal_runtime.buffers import DeviceBuffer
    from khal_runtime.errors import ArtifactError
    from khal_runtime.verify import verify_package

    e = make_entry("k", (storage("x"),))
    pkg = write_package(tmp_path, [e], package="bomb_pkg")
    bomb = cubin([e.symbol.encode()], shared=b"n" * (1 << 20), copies=100)
    (pkg / "_khal" / "c" / "c.sm_90.cubin").write_bytes(bomb)
    doc = json.loads((pkg / "_khal" / "manifest.json").read_text())
    doc["crates"][0]["artifacts"] = [{"kind": "cubin", "arch": "sm_90", "path": "_khal/c/c.sm_90.cubin",
                                      "sha256": hashlib.sha256(bomb).hexdigest(), "size": len(bomb)}]
    (pkg / "_khal" / "manifest.json").write_text(json.dumps(doc))
    (problem,) = verify_package(pkg)
    assert problem.kind == "binary" and "symbol name of 1048576 characters" in problem.message
    ks = khal_runtime.load(pkg)
    with pytest.raises(ArtifactError, match=r"symbol name of 1048576 characters, more than the 65536 allowed"):
        ks.k(4, DeviceBuffer(0x1000, 4, "float32", 0))
    assert fake.launches == [] and "cuLibraryLoadData" not in fake.names()
