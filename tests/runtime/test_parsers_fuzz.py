"""Property tests of the parsers on mostly *valid* inputs, with exact expectations.

Each parser gets inputs generated from something real: PTX and cubins that NVRTC built
once per session (tests/helpers/synthetic.py's crate), then mutated in ways whose effect is
known; manifests built through the pydantic models; marker sources generated from the
KHAL_ENTRY grammar. The properties are round trips and exact results (the arch, the
entries and their hashes, the error type and its file:line), so a parser that rejects
everything, accepts everything or finds nothing fails them:
``test_property_tests_catch_broken_parsers`` checks exactly that.

Parsers are called through their modules (``binaries.scan_ptx``), so that the mutation
check can swap them.
"""

from __future__ import annotations

import io
import json
import re
import struct
from functools import lru_cache
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hatch_khal import entries as entries_mod
from hatch_khal.entries import SCALAR_TYPES
from hatch_khal.errors import EntryParseError
from khal_runtime import abi, binaries
from khal_runtime import manifest as manifest_mod
from khal_runtime.binaries import BinaryFormatError, BinaryInfo
from khal_runtime.errors import ManifestError
from khal_runtime.manifest import (
    SCHEMA_VERSION,
    Artifact,
    Crate,
    Editable,
    Entry,
    Manifest,
    Param,
    SourceFile,
    SpirvStatus,
    Toolchain,
)

from tests.helpers import synthetic as _synthetic
from tests.build import test_entries as entry_tests  # (a module: its tests are not collected twice)

_SETTINGS = settings(max_examples=40, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BUILD_ID = "fuzz"
HEX = "0123456789abcdef"


@lru_cache(maxsize=None)
def real_binary(arch: str) -> bytes:
    """A real PTX (compute_XY) or cubin (sm_XY) of the synthetic crate, built once."""
    return _synthetic.nvrtc_compile(_synthetic.cuda_source(BUILD_ID), arch)


def expected_symbols() -> dict[str, str]:
    return {n: _synthetic.entry_hash(n, BUILD_ID) for n in _synthetic.KERNELS}


hashes = st.text(alphabet=HEX, min_size=16, max_size=16)


# -- PTX ---------------------------------------------------------------------------------------


@st.composite
def ptx_cases(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    text = real_binary("compute_75").decode()
    arch = draw(st.integers(50, 129))
    isa = f"{draw(st.integers(1, 12))}.{draw(st.integers(0, 9))}"
    text = re.sub(r"^\.target sm_\d+", f".target sm_{arch}", text, flags=re.M)
    text = re.sub(r"^\.version \d+\.\d+", f".version {isa}", text, flags=re.M)
    symbols = {}
    for name, old in expected_symbols().items():  # fresh hashes: renamed everywhere they occur
        new = draw(hashes)
        text = text.replace(f"{name}_khal_{old}", f"{name}_khal_{new}")
        symbols[name] = new
    lines = text.split("\n")
    globals_: dict[str, int] = {}
    for _ in range(draw(st.integers(0, 4))):  # noise and 64-bit globals at line boundaries
        at = draw(st.integers(0, len(lines)))
        if draw(st.booleans()):
            lines.insert(at, "// " + draw(st.text(alphabet="abc .target version(){};", max_size=20)))
        elif at > 0 and lines[at - 1].strip() in ("", "}") or at == len(lines):
            name = f"khal_sizeof_g{len(globals_)}"
            globals_[name] = draw(st.integers(0, 2**63))
            lines.insert(at, f".visible .global .align 8 .u64 {name} = {globals_[name]};")
    return "\n".join(lines).encode(), {"arch": arch, "isa": isa, "symbols": symbols, "globals": globals_}


@pytest.mark.needs_nvrtc
@_SETTINGS
@given(ptx_cases())
def test_scan_ptx_reads_target_version_entries_and_globals(case: tuple[bytes, dict[str, Any]]) -> None:
    data, want = case
    info = binaries.scan_ptx(data, "gen.ptx")
    assert (info.kind, info.arch, info.ptx_isa) == ("ptx", want["arch"], want["isa"])
    assert binaries.khal_symbols(info) == want["symbols"]
    assert set(want["globals"].items()) <= set(info.globals_u64)
    assert binaries.read_binary(data, "gen.ptx") == info


@pytest.mark.needs_nvrtc
@_SETTINGS
@given(ptx_cases(), st.sampled_from(["version", "target", "nul", "elf"]))
def test_scan_ptx_names_what_is_missing(case: tuple[bytes, dict[str, Any]], damage: str) -> None:
    data, _ = case
    if damage == "version":
        data, want = re.sub(rb"^\.version .*$", b"", data, flags=re.M), "no '.version' and '.target'"
    elif damage == "target":
        data, want = re.sub(rb"^\.target .*$", b"", data, flags=re.M), "no '.version' and '.target'"
    elif damage == "nul":
        data, want = data[:50] + b"\x00" + data[50:], "NUL bytes"
    else:
        data, want = b"\x7fELF" + data, "is an ELF file"
    with pytest.raises(BinaryFormatError, match=re.escape(want)) as err:
        binaries.scan_ptx(data, "gen.ptx")
    assert str(err.value).startswith("gen.ptx: ")


# -- cubins ------------------------------------------------------------------------------------


def _elf_header(data: bytes) -> dict[str, int]:
    from elftools.elf.elffile import ELFFile

    e = ELFFile(io.BytesIO(data))
    return {"flags": e["e_flags"], "shend": e["e_shoff"] + e["e_shnum"] * e["e_shentsize"]}


@pytest.mark.needs_nvrtc
@_SETTINGS
@given(st.sampled_from(["sm_80", "sm_90"]), st.integers(10, 255))
def test_read_cubin_reads_the_arch_and_entries(arch: str, new_arch: int) -> None:
    data = real_binary(arch)
    info = binaries.read_cubin(data, "gen.cubin")
    assert (info.kind, info.arch) == ("cubin", int(arch[3:]))
    assert binaries.khal_symbols(info) == expected_symbols()
    # the SM sits in bits 8..15 of e_flags (ELF ABI >= 8): rewrite it, read it back
    flags = (_elf_header(data)["flags"] & ~0xFF00) | (new_arch << 8)
    patched = data[:48] + struct.pack("<I", flags) + data[52:]
    assert binaries.read_binary(patched, "gen.cubin").arch == new_arch


@pytest.mark.needs_nvrtc
@_SETTINGS
@given(st.sampled_from(["sm_80", "sm_90"]), st.data())
def test_read_cubin_truncated_fails_exactly_when_sections_are_cut(arch: str, data: st.DataObject) -> None:
    blob = real_binary(arch)
    whole = binaries.read_cubin(blob, "gen.cubin")
    cut = data.draw(st.integers(4, len(blob) - 1))
    if cut < _elf_header(blob)["shend"]:
        with pytest.raises(BinaryFormatError, match=r"^gen\.cubin: "):
            binaries.read_cubin(blob[:cut], "gen.cubin")
    else:
        assert binaries.read_cubin(blob[:cut], "gen.cubin") == whole


@pytest.mark.needs_nvrtc
@_SETTINGS
@given(st.sampled_from(["sm_80", "sm_90"]), st.lists(st.tuples(st.integers(0, 8187), st.integers(0, 255)),
                                                    min_size=1, max_size=6))
def test_read_cubin_damaged_bytes_give_a_result_or_the_documented_error(arch: str, edits: list[tuple[int, int]]
                                                                       ) -> None:
    blob = bytearray(real_binary(arch))
    for i, v in edits:
        blob[4 + i % (len(blob) - 4)] = v  # the magic stays: it is read as a cubin
    try:
        info = binaries.read_binary(bytes(blob), "gen.cubin")
    except BinaryFormatError as exc:
        assert str(exc).startswith("gen.cubin: ")
    else:
        assert info.kind == "cubin" and 0 < info.arch < 256


@pytest.mark.needs_nvrtc
@_SETTINGS
@given(st.sampled_from(["sm_80", "sm_90"]), st.integers(10, 255), st.data())
def test_scan_cubin_reads_what_pyelftools_reads(arch: str, new_arch: int, data: st.DataObject) -> None:
    """The load path's struct reader (scan_cubin) gives read_cubin's answer on real cubins, with
    their arch rewritten, and on truncated ones it declines (None) or still agrees."""
    blob = real_binary(arch)
    info = binaries.scan_cubin(blob)
    assert info == binaries.read_cubin(blob, "gen.cubin") and binaries.khal_symbols(info) == expected_symbols()
    flags = (_elf_header(blob)["flags"] & ~0xFF00) | (new_arch << 8)
    patched = blob[:48] + struct.pack("<I", flags) + blob[52:]
    assert binaries.scan_cubin(patched) == binaries.read_cubin(patched, "gen.cubin")
    cut = data.draw(st.integers(0, len(blob) - 1))
    short = binaries.scan_cubin(blob[:cut])
    assert short is None or short == binaries.read_cubin(blob[:cut], "gen.cubin")


@pytest.mark.needs_nvrtc
@_SETTINGS
@given(st.sampled_from(["sm_80", "sm_90"]), st.lists(st.tuples(st.integers(0, 8187), st.integers(0, 255)),
                                                    min_size=1, max_size=6))
def test_scan_cubin_on_damaged_bytes_declines_or_agrees(arch: str, edits: list[tuple[int, int]]) -> None:
    blob = bytearray(real_binary(arch))
    for i, v in edits:
        blob[4 + i % (len(blob) - 4)] = v
    fast = binaries.scan_cubin(bytes(blob))  # never raises
    try:
        ref = binaries.read_cubin(bytes(blob), "gen.cubin")
    except BinaryFormatError:
        return  # read_binary then reports pyelftools' error, or scan_cubin's reading of what it can
    assert fast is None or fast == ref


# -- manifests ---------------------------------------------------------------------------------

idents = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True).filter(lambda s: "_khal" not in s)


@st.composite
def params(draw: st.DrawFn, name: str) -> Param:
    kind = draw(st.sampled_from(["storage", "uniform", "scalar"]))
    scalar = abi.SCALARS[draw(st.sampled_from(sorted(abi.SCALARS)))]
    if kind == "scalar":
        return Param(name=name, kind=kind, element_type=scalar.name, element_size=scalar.size,
                     element_align=scalar.align)
    if kind == "uniform":
        return Param(name=name, kind=kind, element_type="P" + name, element_size=draw(st.integers(1, 4096)),
                     element_align=2 ** draw(st.integers(0, 4)))
    shape = draw(st.sampled_from(["slice", "array", "value"]))
    length = {"slice": None, "array": draw(st.integers(1, 1 << 20)), "value": 1}[shape]
    return Param(name=name, kind=kind, element_type=scalar.name, element_size=scalar.size,
                 element_align=scalar.align, shape=shape, length=length, writable=draw(st.booleans()))


@st.composite
def entries(draw: st.DrawFn, name: str) -> Entry:
    h = draw(hashes)
    names = draw(st.lists(idents, min_size=1, max_size=5, unique=True))
    return Entry(name=name, symbol=abi.symbol_for(name, h), hash=h, block_size=(draw(st.integers(1, 1024)), 1, 1),
                 params=tuple(draw(params(n)) for n in names),
                 indirect_symbol=abi.indirect_symbol_for(name, h) if draw(st.booleans()) else None)


@st.composite
def crates(draw: st.DrawFn, name: str) -> Crate:
    archs = draw(st.lists(st.sampled_from(["sm_75", "sm_80", "sm_90", "sm_90a", "sm_120"]), unique=True, max_size=3))
    arts = [Artifact(kind="cubin", arch=a, path=f"_khal/{name}/{name}.{a}.cubin", sha256=draw(st.text(HEX, min_size=64, max_size=64)),
                     size=draw(st.integers(0, 1 << 30))) for a in archs]
    if draw(st.booleans()):
        arts.append(Artifact(kind="ptx", arch="compute_75", path=f"_khal/{name}/{name}.compute_75.ptx",
                             sha256="0" * 64, size=10, ptx_isa="9.0"))
    names = draw(st.lists(idents, min_size=1, max_size=4, unique=True))
    return Crate(name=name, package_dir=f"_khal/{name}", content_hash=draw(st.text(HEX, min_size=64, max_size=64)),
                 sources=tuple(SourceFile(path=f"kernels/{n}.cu", sha256="1" * 64) for n in names),
                 artifacts=tuple(arts), entries=tuple(draw(entries(n)) for n in names),
                 spirv=SpirvStatus(status=draw(st.sampled_from(["skipped", "not_configured", "not_applicable"]))))


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    names = draw(st.lists(idents, min_size=1, max_size=3, unique=True))
    return Manifest(schema_version=SCHEMA_VERSION, package=draw(idents),
                    toolchain=Toolchain(nvrtc_version="13.0", hatch_khal_version="0.1.0"),
                    crates=tuple(draw(crates(n)) for n in names),
                    editable=Editable(project_root="/p") if draw(st.booleans()) else None)


@_SETTINGS
@given(manifests())
def test_manifest_round_trips(m: Manifest) -> None:
    text = m.to_json()
    back = manifest_mod.parse_manifest(text, "gen.json")
    assert back == m and back.to_json() == text


#: (what to break, where the error must point)
_BREAKS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("entry hash", lambda d: d["crates"][0]["entries"][0].update(hash="xyz"), "crates.0.entries.0.hash"),
    ("symbol", lambda d: d["crates"][0]["entries"][0].update(symbol="other_khal_" + "0" * 16), "crates.0.entries.0"),
    ("artifact path", lambda d: d["crates"][0].update(artifacts=[{"kind": "ptx", "arch": "compute_75",
                                                                 "path": "../x.ptx", "sha256": "0" * 64,
                                                                 "size": 1}]), "crates.0.artifacts.0.path"),
    ("unknown field", lambda d: d["crates"][0].update(surprise=1), "crates.0.surprise"),
    ("param kind", lambda d: d["crates"][0]["entries"][0]["params"][0].update(kind="pointer"),
     "crates.0.entries.0.params.0"),
]


@_SETTINGS
@given(manifests(), st.sampled_from(range(len(_BREAKS))))
def test_manifest_error_names_the_broken_field(m: Manifest, which: int) -> None:
    doc = json.loads(m.to_json())
    what, breaker, where = _BREAKS[which]
    breaker(doc)
    with pytest.raises(ManifestError, match=re.escape(f"gen.json: invalid manifest at {where}")):
        manifest_mod.parse_manifest(json.dumps(doc), "gen.json")


@_SETTINGS
@given(manifests(), st.integers(SCHEMA_VERSION + 1, 1000))
def test_manifest_newer_schema_is_refused(m: Manifest, version: int) -> None:
    doc = json.loads(m.to_json())
    doc["schema_version"] = version
    with pytest.raises(ManifestError, match="newer than this runtime understands"):
        manifest_mod.parse_manifest(json.dumps(doc), "gen.json")


# -- KHAL_ENTRY markers ------------------------------------------------------------------------

_SEP = st.sampled_from([" ", "", "\n", "  ", " /* c */ ", "\n// note KHAL_ENTRY(x, 1, (y))\n", "\t"])
_TYPES = ["float", "uint32_t", "::ns::Item", "Particle", "double", "int"]
_NOISE = [
    "",
    "// KHAL_ENTRY(fake, 1, (KHAL_SCALAR(int, x)))\n",
    "/* KHAL_ENTRY(fake2, 1,\n (KHAL_SCALAR(int, x))) */\n",
    'const char* s = "KHAL_ENTRY(fake3, 1, (KHAL_SCALAR(int, x)))";\n',
    "#define NOT_AN_ENTRY KHAL_ENTRY(fake4, 1, (KHAL_SCALAR(int, x)))\n",
    "__device__ int helper(int a) { return a * 2; }\n",
]


@st.composite
def param_markers(draw: st.DrawFn, name: str) -> tuple[str, tuple[Any, ...]]:
    s = draw(_SEP)
    macro = draw(st.sampled_from(["KHAL_STORAGE", "KHAL_STORAGE_ARRAY", "KHAL_STORAGE_VALUE", "KHAL_UNIFORM",
                                  "KHAL_SCALAR"]))
    const = draw(st.booleans()) and macro.startswith("KHAL_STORAGE")
    t = draw(st.sampled_from(sorted(SCALAR_TYPES) if macro == "KHAL_SCALAR" else _TYPES))
    tt = ("const " if const else "") + t
    if macro == "KHAL_STORAGE_ARRAY":
        n = draw(st.integers(1, 64))
        return f"{macro}({s}{tt},{s}{n},{s}{name}{s})", (name, "storage", t, const, "array", n)
    text = f"{macro}({s}{tt},{s}{name}{s})"
    if macro == "KHAL_STORAGE":
        return text, (name, "storage", t, const, "slice", None)
    if macro == "KHAL_STORAGE_VALUE":
        return text, (name, "storage", t, const, "value", 1)
    if macro == "KHAL_UNIFORM":
        return text, (name, "uniform", t, True, None, None)
    return text, (name, "scalar", t, False, None, None)


@st.composite
def marker_sources(draw: st.DrawFn, broken: bool = False) -> tuple[str, list[tuple[Any, ...]]]:
    """Source text and the entries in it; with ``broken``, one entry's block size is invalid
    and ``want`` is that entry alone."""
    names = draw(st.lists(idents, min_size=1, max_size=6, unique=True))
    bad_at = draw(st.integers(0, len(names) - 1)) if broken else -1
    text, want = "", []
    for i, name in enumerate(names):
        text += draw(st.sampled_from(_NOISE))
        pnames = draw(st.lists(idents, min_size=1, max_size=5, unique=True))
        ps = [draw(param_markers(p)) for p in pnames]
        s = draw(_SEP)
        block: int | str = draw(st.integers(1, 1024)) if i != bad_at else draw(st.sampled_from(["0", "2048", "N"]))
        line = text.count("\n") + 1
        text += f"KHAL_ENTRY({s}{name},{s}{block},{s}({', '.join(p for p, _ in ps)}){s})\n{{ body(); }}\n"
        if not broken or i == bad_at:
            want.append((name, block, tuple(w for _, w in ps), line))
    return text, want


def _found(text: str) -> list[tuple[Any, ...]]:
    return [(e.name, e.block_size, tuple((p.name, p.kind, p.ctype, p.const, p.shape, p.length) for p in e.params),
             e.line) for e in entries_mod.find_entries(text, "gen.cu")]


@_SETTINGS
@given(marker_sources())
def test_find_entries_returns_exactly_the_generated_entries(case: tuple[str, list[tuple[Any, ...]]]) -> None:
    text, want = case
    assert _found(text) == want


@_SETTINGS
@given(marker_sources(broken=True))
def test_find_entries_error_names_file_and_line(case: tuple[str, list[tuple[Any, ...]]]) -> None:
    text, [(name, _, _, line)] = case
    with pytest.raises(EntryParseError, match=rf"^gen\.cu:{line}: entry {name!r}: block_size"):
        entries_mod.find_entries(text, "gen.cu")


# -- the property tests above must catch a broken parser ---------------------------------------


def _reject(error: type[Exception]) -> Callable[..., Any]:
    def parser(*args: Any, **kwargs: Any) -> Any:
        raise error("rejected")

    return parser


_EMPTY_PTX = BinaryInfo(kind="ptx", arch=75, functions=(), ptx_isa="9.0")
_EMPTY_CUBIN = BinaryInfo(kind="cubin", arch=90, functions=())

#: (module, parser, stand-in, the property tests that must then fail)
_BROKEN: list[tuple[Any, str, Callable[..., Any], list[Callable[..., None]]]] = [
    (binaries, "scan_ptx", _reject(BinaryFormatError), [test_scan_ptx_reads_target_version_entries_and_globals]),
    (binaries, "scan_ptx", lambda *a, **k: _EMPTY_PTX,
     [test_scan_ptx_reads_target_version_entries_and_globals, test_scan_ptx_names_what_is_missing]),
    (binaries, "read_cubin", _reject(BinaryFormatError), [test_read_cubin_reads_the_arch_and_entries]),
    (binaries, "read_cubin", lambda *a, **k: _EMPTY_CUBIN,
     [test_read_cubin_reads_the_arch_and_entries, test_read_cubin_truncated_fails_exactly_when_sections_are_cut]),
    (binaries, "scan_cubin", lambda *a, **k: _EMPTY_CUBIN,
     [test_scan_cubin_reads_what_pyelftools_reads]),
    (binaries, "scan_cubin", lambda *a, **k: None, [test_scan_cubin_reads_what_pyelftools_reads]),
    (manifest_mod, "parse_manifest", _reject(ManifestError), [test_manifest_round_trips]),
    (manifest_mod, "parse_manifest", lambda text, source="": Manifest.model_validate_json(text),
     [test_manifest_error_names_the_broken_field]),
    (manifest_mod, "parse_manifest", lambda *a, **k: None, [test_manifest_round_trips]),
    (entries_mod, "find_entries", _reject(EntryParseError),
     [test_find_entries_returns_exactly_the_generated_entries, test_find_entries_error_names_file_and_line,
      entry_tests.test_parser_fuzz_noise_around_a_known_entry, entry_tests.test_parser_fuzz_arbitrary_text]),
    (entries_mod, "find_entries", lambda *a, **k: [],
     [test_find_entries_returns_exactly_the_generated_entries, test_find_entries_error_names_file_and_line,
      entry_tests.test_parser_fuzz_noise_around_a_known_entry]),
]


@pytest.mark.parametrize("module, parser, stand_in, tests", _BROKEN,
                         ids=[f"{p}-{i}" for i, (_, p, _, _) in enumerate(_BROKEN)])
def test_property_tests_catch_broken_parsers(monkeypatch: pytest.MonkeyPatch, module: Any, parser: str,
                                            stand_in: Callable[..., Any], tests: list[Callable[..., None]]) -> None:
    monkeypatch.setattr(module, parser, stand_in)
    for prop in tests:
        # no shrinking here: that the property fails is all this test needs to see
        quick = settings(getattr(prop, "_hypothesis_internal_use_settings"), phases=[Phase.generate])
        monkeypatch.setattr(prop, "_hypothesis_internal_use_settings", quick, raising=False)
        try:
            prop()
        except (Exception, pytest.fail.Exception):  # any failure of the property counts
            continue
        raise AssertionError(f"{prop.__name__} passed with {parser} replaced by a broken stand-in")
