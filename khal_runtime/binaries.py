"""Reading device binaries without a GPU: PTX text and CUDA ELF cubins.

Used by the build hook (checking prebuilt files), ``python -m hatch_khal
verify`` and the runtime (checking what it is about to load). Parsers return a
result or raise :class:`BinaryFormatError`; never anything else.
"""

from __future__ import annotations

import io
import re
import struct
from dataclasses import dataclass, field

from khal_runtime.errors import ArtifactError
from khal_runtime.abi import split_symbol

__all__ = [
    "DRIVER_BRANCH",
    "PTX_ISA_BY_DRIVER",
    "max_ptx_isa",
    "min_driver_for_ptx_isa",
    "ptx_driver_note",
    "ptx_isa_supported",
    "BinaryFormatError",
    "BinaryInfo",
    "ELF_MAGIC",
    "EM_CUDA",
    "MAX_SYMBOLS",
    "MAX_SYMBOL_NAME",
    "is_elf",
    "khal_symbols",
    "FOLD_TAGGED_GLOBAL",
    "KernelReads",
    "ptx_grid_reads",
    "ptx_kernel_reads",
    "read_binary",
    "read_cubin",
    "scan_cubin",
    "scan_ptx",
    "strip_ptx_comments",
    "webgpu_entry_points",
]

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190

#: A cubin's symbol table holding more symbols than this is refused (a large library's cubin
#: has thousands): each symbol's name is decoded, so the count bounds the work.
MAX_SYMBOLS = 1 << 20
#: A symbol or section name longer than this (bytes) is refused (khal's symbols are under 300
#: bytes; long C++ template manglings stay far below it).
MAX_SYMBOL_NAME = 64 << 10
#: pyelftools reads names through the file: a cubin whose names, shared by many symbols or
#: sections, make it read more than this many times its own size (plus 1 MiB) is refused.
_READ_FACTOR = 16


class BinaryFormatError(ArtifactError, ValueError):
    """The bytes are not a PTX module or a CUDA cubin (or are damaged)."""


@dataclass(frozen=True)
class BinaryInfo:
    kind: str  # "ptx" or "cubin"
    #: Numeric arch: the cubin's SM, or the PTX ``.target``.
    arch: int
    #: Kernel (entry) function names defined in the binary.
    functions: tuple[str, ...]
    #: PTX ``.version`` (PTX only).
    ptx_isa: str | None = None
    #: Initialised 64-bit integer globals: name -> value. Used for the hook's sizeof probes.
    globals_u64: tuple[tuple[str, int], ...] = ()
    #: the PTX text itself (PTX only): the build reads more of it (:func:`ptx_grid_reads`)
    text: bytes | None = field(default=None, repr=False, compare=False)
    #: arch-specific code (``sm_90a``): it runs on its own arch only, never a later one of its
    #: major (a cubin's e_flags accelerator bit, :func:`cubin_arch_specific`; PTX: ``.target sm_90a``)
    arch_specific: bool = False

    @property
    def arch_name(self) -> str:
        """``sm_90a`` / ``sm_90`` for a cubin, ``compute_90a`` / ``compute_80`` for PTX."""
        return f"{'sm' if self.kind == 'cubin' else 'compute'}_{self.arch}{'a' if self.arch_specific else ''}"


def is_elf(data: bytes) -> bool:
    return data[:4] == ELF_MAGIC


_VERSION_RE = re.compile(rb"^\s*\.version\s+(\d+\.\d+)\s*$", re.M)
_TARGET_RE = re.compile(rb"^\s*\.target\s+(sm_|compute_)(\d+)([a-z]?)\b", re.M)
_ENTRY_RE = re.compile(rb"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z_$][A-Za-z0-9_$]*)\s*\(?", re.M)
_GLOBAL_U64_RE = re.compile(
    rb"^\s*(?:\.visible\s+)?\.global\s+(?:\.align\s+\d+\s+)?\.[ub]64\s+([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)\s*;",
    re.M,
)


#: a PTX string (kept: a ``.file`` name may hold ``//``), or a comment (blanked)
_PTX_LEXEME = re.compile(rb'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?(?:\*/|\Z)', re.S)


def _drop_comment(m: re.Match[bytes]) -> bytes:
    s = m.group(0)
    if s[:1] == b'"':
        return s
    return b" " if s[:2] == b"//" else b" " + b"\n" * s.count(b"\n")


def strip_ptx_comments(data: bytes) -> bytes:
    """PTX text without its ``//`` and ``/* */`` comments (each one a space; a block comment keeps its
    newlines, so lines stay lines); strings kept whole. A directive inside a comment is no directive:
    ptxas ignores it."""
    if b"/" not in data:
        return data
    return _PTX_LEXEME.sub(_drop_comment, data)


def scan_ptx(data: bytes | str, source: str = "PTX") -> BinaryInfo:
    """Entry names, ``.target`` and ``.version`` of PTX text (comments are not read)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if is_elf(data):
        raise BinaryFormatError(f"{source}: is an ELF file, not PTX text")
    if b"\x00" in data.rstrip(b"\x00"):
        raise BinaryFormatError(f"{source}: contains NUL bytes; not PTX text")
    code = strip_ptx_comments(data)
    version = _VERSION_RE.search(code)
    target = _TARGET_RE.search(code)
    if version is None or target is None:
        raise BinaryFormatError(
            f"{source}: not PTX (no '.version' and '.target' directives outside comments); "
            "expected PTX text or a CUDA cubin (ELF)"
        )
    functions = tuple(m.group(1).decode("ascii") for m in _ENTRY_RE.finditer(code))
    globals_u64 = tuple(
        (m.group(1).decode("ascii"), int(m.group(2))) for m in _GLOBAL_U64_RE.finditer(code)
    )
    return BinaryInfo(
        kind="ptx",
        arch=int(target.group(2)),
        functions=functions,
        ptx_isa=version.group(1).decode("ascii"),
        globals_u64=globals_u64,
        text=data,
        arch_specific=target.group(3) == b"a",
    )


_MODULE_GLOBAL_RE = re.compile(
    rb"^[ \t]*(?:\.visible[ \t]+)?\.(const|global)[ \t]+(?:\.align[ \t]+\d+[ \t]+)?\.([bfsu])(8|16|32|64)[ \t]+"
    rb"([A-Za-z_][A-Za-z0-9_]*)[ \t]*((?:\[[ \t]*\d+[ \t]*\][ \t]*)*)[ \t]*[=;]",
    re.M,
)


def ptx_module_globals(data: bytes) -> list[tuple[str, str, str, int, int]]:
    """The module globals a PTX declares that a host may read and write: (name, "constant" /
    "device", PTX type, element bytes, bytes in all) of every module-scope ``.const`` / ``.global``
    variable with a C name (not mangled, not a hatch-khal probe: no ``khal`` in it; not ``__``-reserved).
    NVRTC declares a whole-program ``__constant__`` / ``__device__`` variable without ``.visible``;
    the driver finds it by name all the same (``cuLibraryGetGlobal``, checked at load)."""
    out = []
    for m in _MODULE_GLOBAL_RE.finditer(strip_ptx_comments(data)):
        name = m.group(4).decode("ascii")
        if name.startswith("_Z") or "khal" in name.lower() or name.startswith("__"):
            continue
        elem = int(m.group(3)) // 8
        count = 1
        for d in re.findall(rb"\d+", m.group(5)):
            count *= int(d)
        if count < 1:
            continue
        space = "constant" if m.group(1) == b"const" else "device"
        out.append((name, space, (m.group(2) + m.group(3)).decode("ascii"), elem, elem * count))
    return out


_CLUSTER_RE = re.compile(
    rb"\.entry[ \t]+([A-Za-z_$][\w$]*)[ \t]*\([^)]*\)([^{]*)\{", re.S)
_REQ_CLUSTER_RE = re.compile(rb"\.reqnctapercluster[ \t]+(\d+)(?:[ \t]*,[ \t]*(\d+))?(?:[ \t]*,[ \t]*(\d+))?")


def ptx_cluster_dims(data: bytes) -> dict[str, tuple[int, int, int]]:
    """Kernel name -> its compiled cluster dims (``.reqnctapercluster``, what ``__cluster_dims__``
    compiles to), for the kernels of a PTX that have them."""
    out: dict[str, tuple[int, int, int]] = {}
    for m in _CLUSTER_RE.finditer(strip_ptx_comments(data)):
        r = _REQ_CLUSTER_RE.search(m.group(2))
        if r is not None:
            out[m.group(1).decode("ascii")] = (int(r.group(1)), int(r.group(2) or 1), int(r.group(3) or 1))
    return out


_FUNC_HEAD_RE = re.compile(
    rb"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+|\.extern[ \t]+)?\.(entry|func)[ \t]+(?:\([^)]*\)[ \t]*)?"
    rb"([A-Za-z_$][A-Za-z0-9_$]*)", re.M)
_INLINE_ASM_RE = re.compile(rb"//[ \t]*begin inline asm.*?//[ \t]*end inline asm", re.S)
_CALL_RE = re.compile(rb"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?(%?[A-Za-z_$][A-Za-z0-9_$]*)")


def _ptx_functions(text: bytes) -> dict[str, bytes]:
    """Name -> body of every function and kernel defined in PTX text (declarations skipped)."""
    out: dict[str, bytes] = {}
    for m in _FUNC_HEAD_RE.finditer(text):
        i = m.end()
        # the parameter list, then the body (a ';' first: a declaration)
        depth = 0
        while i < len(text):
            c = text[i:i + 1]
            if c == b"(":
                depth += 1
            elif c == b")":
                depth -= 1
            elif depth == 0 and c in (b"{", b";"):
                break
            i += 1
        if i >= len(text) or text[i:i + 1] != b"{":
            continue
        depth, j = 0, i
        while j < len(text):
            c = text[j:j + 1]
            if c == b"{":
                depth += 1
            elif c == b"}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        out[m.group(2).decode("ascii", "replace")] = text[i:j + 1]
    return out


#: tags the hook puts in the comments of its own inline asm (:mod:`hatch_khal.codegen`):
#: ``khal:loop`` reads the persistent grid of an indirect variant (the variant's own reads, not
#: the body's); ``khal:fold.<axis>`` multiplies a block id by the compiled block size (the ids
#: ``KHAL_GLOBAL_ID`` and kin fold it in: non-volatile asm with an output, deleted by the
#: compiler where the id is unused, so its presence means the code that runs uses such an id)
_TAG_RE = re.compile(rb"//[ \t]*khal:(loop|fold\.[xyz])\b")
#: every special register of the launch geometry (``%tid``, ``%ntid``, ``%ctaid``, ``%nctaid``)
_GEOMETRY_RE = re.compile(rb"%(n?ctaid|n?tid)\.([xyz])")
#: the global the hook compiles into every unit whose ids carry ``khal:fold`` tags: PTX without
#: it (an older build, a prebuilt file) has untagged ids, so its block counts as folded
FOLD_TAGGED_GLOBAL = "khal_fold_tagged"


@dataclass(frozen=True)
class KernelReads:
    """What one kernel (``.entry``) of PTX text reads of the launch geometry, through every
    function it calls (directly or not), inline asm included."""

    #: (register, function reading it): ``("ctaid.y", "_Z6helperv")``; the hook's own persistent-grid
    #: reads (``khal:loop``) excepted; ``("call", "<indirect call>")`` for a call through a register
    reads: tuple[tuple[str, str], ...]
    #: the axes whose ids fold the compiled block size (``khal:fold.<axis>`` reached)
    folds: tuple[str, ...]

    @property
    def registers(self) -> tuple[str, ...]:
        return tuple(sorted({r for r, _ in self.reads if r != "call"}))

    @property
    def grid_axes(self) -> int:
        """How many grid axes the kernel tells apart: the highest axis whose block id (``%ctaid``)
        it reads (1 when it reads none)."""
        regs = self.registers
        return 3 if "ctaid.z" in regs else 2 if "ctaid.y" in regs else 1


def ptx_kernel_reads(text: bytes) -> dict[str, KernelReads]:
    """Per kernel (``.entry``) of PTX text: the geometry special registers its code reads (in
    plain instructions and in inline asm, the hook's ``khal:loop`` asm excepted), each with the
    function that reads it (the kernel itself or a ``.func`` it reaches), and the ``khal:fold``
    tags it reaches. A call through a register, which cannot be followed, reads as
    ``("call", "<indirect call>")``."""
    funcs = _ptx_functions(text)
    own: dict[str, set[tuple[str, str]]] = {}
    folds: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for name, body in funcs.items():
        own[name], folds[name] = set(), set()

        def asm_block(m: re.Match[bytes], into: set[str] = folds[name]) -> bytes:
            tags = {t.group(1).decode() for t in _TAG_RE.finditer(m.group(0))}
            into.update(t.split(".")[1] for t in tags if t.startswith("fold."))
            return b"" if "loop" in tags else m.group(0)

        body = _INLINE_ASM_RE.sub(asm_block, body)
        own[name] = {(f"{m.group(1).decode()}.{m.group(2).decode()}", name) for m in _GEOMETRY_RE.finditer(body)}
        calls[name] = set()
        for m in _CALL_RE.finditer(body):
            target = m.group(1).decode("ascii", "replace")
            if target.startswith("%"):
                own[name].add(("call", "<indirect call>"))
            else:
                calls[name].add(target)
    entries = {m.group(2).decode("ascii", "replace") for m in _FUNC_HEAD_RE.finditer(text) if m.group(1) == b"entry"}
    out: dict[str, KernelReads] = {}
    for e in entries:
        seen: set[str] = set()
        todo = [e]
        found: set[tuple[str, str]] = set()
        axes: set[str] = set()
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            found |= own.get(f, set())
            axes |= folds.get(f, set())
            todo.extend(calls.get(f, ()))
        out[e] = KernelReads(tuple(sorted(found)), tuple(sorted(axes)))
    return out


def ptx_grid_reads(text: bytes) -> dict[str, tuple[tuple[str, str], ...]]:
    """Per kernel (``.entry``) of PTX text: the grid special registers (``ctaid.y``,
    ``nctaid.x``; ``blockIdx`` / ``gridDim`` in CUDA C++) its code reads, inline asm included
    (:func:`ptx_kernel_reads`), each with the function that reads it. A call through a register
    reads as ``("call", "<indirect call>")``. The hook's indirect variants read the grid only
    through their ``khal:loop`` asm: anything listed for one of them is a read the variant
    cannot remap."""
    return {k: tuple(r for r in v.reads if r[0] == "call" or "ctaid" in r[0])
            for k, v in ptx_kernel_reads(text).items()}


def _cubin_arch(e_flags: int, abi_version: int) -> int:
    # CUDA ELF ABI >= 8 keeps the SM in bits 8..15; older ones in bits 0..7.
    return (e_flags >> 8) & 0xFF if abi_version >= 8 else e_flags & 0xFF


def cubin_arch_specific(e_flags: int, abi_version: int) -> bool:
    """Whether a cubin is arch-specific (``sm_90a``, ``sm_100a``): the accelerator flag,
    ``EF_CUDA_ACCELERATORS`` (0x800) up to ELF ABI 7, 0x8 from ABI 8 (ptxas: ``sm_90`` 0x5a055a,
    ``sm_90a`` 0x5a0d5a; ``sm_100`` 0x6006402, ``sm_100a`` 0x600640a)."""
    return bool(e_flags & (0x8 if abi_version >= 8 else 0x800))


class _BudgetStream(io.BytesIO):
    """The cubin's bytes as pyelftools reads them, with a cap on everything read: names are
    read through the stream, so a name shared by many symbols cannot decode to more than the
    cap (a 1 MB name behind 300 symbols was 286 MiB of names)."""

    def __init__(self, data: bytes, source: str) -> None:
        super().__init__(data)
        self.source, self.size = source, len(data)
        self.left = self.budget = _READ_FACTOR * len(data) + (1 << 20)

    def read(self, n: int | None = -1) -> bytes:
        out = super().read(n)
        self.left -= len(out)
        if self.left < 0:
            raise BinaryFormatError(
                f"{self.source}: reading its symbol and section names took more than {self.budget} bytes "
                f"from a file of {self.size} (names shared by many symbols or sections); not a cubin a "
                "CUDA compiler writes")
        return out


def _name_check(name: str, what: str, source: str) -> str:
    if len(name) > MAX_SYMBOL_NAME:
        raise BinaryFormatError(f"{source}: {what} name of {len(name)} characters, more than the "
                                f"{MAX_SYMBOL_NAME} allowed; not a cubin a CUDA compiler writes")
    return name


def read_cubin(data: bytes, source: str = "cubin") -> BinaryInfo:
    """Arch and kernel symbols of a CUDA ELF cubin (via pyelftools). Capped: every section lies
    inside the file, at most :data:`MAX_SYMBOLS` symbols, names of at most
    :data:`MAX_SYMBOL_NAME` bytes, and a bound on all that is read (:class:`_BudgetStream`)."""
    from elftools.common.exceptions import ELFError  # lazy: cubins only
    from elftools.elf.elffile import ELFFile

    if not is_elf(data):
        raise BinaryFormatError(f"{source}: not an ELF file (no \\x7fELF header)")
    try:
        elf = ELFFile(_BudgetStream(data, source))
        machine = elf["e_machine"]
        if machine not in ("EM_CUDA", EM_CUDA):
            raise BinaryFormatError(
                f"{source}: ELF for machine {machine}, not a CUDA cubin (EM_CUDA); "
                "point the variable at a .cubin made for a GPU"
            )
        arch = _cubin_arch(elf["e_flags"], elf["e_ident"]["EI_ABIVERSION"])
        specific = cubin_arch_specific(elf["e_flags"], elf["e_ident"]["EI_ABIVERSION"])
        symtab = None
        for sec in elf.iter_sections():
            name = _name_check(sec.name, "section", source)
            off, size = sec["sh_offset"], sec["sh_size"]
            if sec["sh_type"] != "SHT_NOBITS" and off + size > len(data):
                raise BinaryFormatError(f"{source}: section {name!r} ({size} bytes at offset {off}) runs past "
                                        f"the end of the file ({len(data)} bytes); damaged or truncated ELF")
            if symtab is None and name == ".symtab":
                symtab = sec
        if symtab is None:
            raise BinaryFormatError(f"{source}: cubin has no symbol table")
        count = symtab.num_symbols()  # type: ignore[attr-defined]
        if count > MAX_SYMBOLS:
            raise BinaryFormatError(f"{source}: {count} symbols, more than the {MAX_SYMBOLS} allowed; "
                                    "not a cubin a CUDA compiler writes")
        functions = tuple(
            sorted(
                _name_check(s.name, "symbol", source)
                for s in symtab.iter_symbols()  # type: ignore[attr-defined]
                if s["st_info"]["type"] == "STT_FUNC" and s.name
            )
        )
        globals_u64 = _cubin_u64_globals(elf, symtab)
    except BinaryFormatError:
        raise
    except (ELFError, ValueError, KeyError, TypeError, IndexError, AttributeError, ZeroDivisionError,
            UnicodeDecodeError, AssertionError, OverflowError, MemoryError) as exc:
        raise BinaryFormatError(f"{source}: damaged or truncated ELF ({exc})") from None
    except Exception as exc:  # pyelftools raises construct errors on truncated data
        if type(exc).__module__.startswith(("construct", "elftools")):
            raise BinaryFormatError(f"{source}: damaged or truncated ELF ({exc})") from None
        raise
    if arch == 0:
        raise BinaryFormatError(f"{source}: CUDA ELF with no SM arch in its header")
    return BinaryInfo(kind="cubin", arch=arch, functions=functions, globals_u64=globals_u64, arch_specific=specific)


def _cubin_u64_globals(elf, symtab) -> tuple[tuple[str, int], ...]:  # type: ignore[no-untyped-def]
    """8-byte initialised objects in ``.nv.global.init`` (the hook's ``khal_*of_*`` probes)."""
    init = elf.get_section_by_name(".nv.global.init")
    if init is None:
        return ()
    index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".nv.global.init")
    blob = init.data()
    out = []
    for s in symtab.iter_symbols():
        if s["st_info"]["type"] == "STT_OBJECT" and s["st_shndx"] == index and s["st_size"] == 8:
            off = s["st_value"]
            if 0 <= off and off + 8 <= len(blob):
                out.append((s.name, int.from_bytes(blob[off : off + 8], "little")))
    return tuple(sorted(out))


_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # ELF64 file header
_SHDR = struct.Struct("<IIQQQQIIQQ")  # ELF64 section header
_SYM = struct.Struct("<IBBHQQ")  # ELF64 symbol
_STT_OBJECT, _STT_FUNC, _SHT_SYMTAB, _SHT_NOBITS = 1, 2, 2, 8


def scan_cubin(data: bytes) -> BinaryInfo | None:
    """:func:`read_cubin`'s answer for a well-formed 64-bit little-endian CUDA ELF (every cubin
    NVRTC and nvcc write), read with :mod:`struct` in well under a millisecond; None for
    anything else, which :func:`read_cubin` then reads (and explains) with pyelftools; also
    for one past :func:`read_cubin`'s caps (symbol count, name length, names decoded), which
    that then refuses by name.

    Written by hand for the load path: importing pyelftools and walking a cubin's symbol table
    in pure Python cost a large share of the cold-start bar (benchmarks/RESULTS.md, 2026-11-30,
    "Figures formerly in code comments"); a test checks that both readers agree on every cubin
    the example builds.
    """
    try:
        (ident, _type, machine, _ver, _entry, _phoff, shoff, flags, _ehsize, _phentsize, _phnum,
         shentsize, shnum, shstrndx) = _EHDR.unpack_from(data, 0)
        if ident[:4] != ELF_MAGIC or ident[4] != 2 or ident[5] != 1 or machine != EM_CUDA:
            return None
        if shentsize != _SHDR.size or shnum == 0 or shoff + shnum * _SHDR.size > len(data):
            return None
        sections = [_SHDR.unpack_from(data, shoff + i * _SHDR.size) for i in range(shnum)]
        if any(sh[1] != _SHT_NOBITS and sh[4] + sh[5] > len(data) for sh in sections):
            return None  # a section past the end of the file: read_cubin names it

        def blob(i: int) -> bytes:
            off, size = sections[i][4], sections[i][5]
            if off + size > len(data):
                raise ValueError("section past the end of the file")
            return data[off : off + size]

        decoded = [0]  # every name decoded: at most the file's size (plus one name)

        def name(table: bytes, at: int) -> str:
            end = table.index(b"\0", at, at + MAX_SYMBOL_NAME + 1)  # ValueError past the cap
            decoded[0] += end - at
            if decoded[0] > len(data) + MAX_SYMBOL_NAME:
                raise ValueError("names shared by many symbols")
            return table[at:end].decode()

        shstr = blob(shstrndx)
        names = [name(shstr, sh[0]) for sh in sections]
        symtab = next((i for i, n in enumerate(names) if n == ".symtab"), None)
        if symtab is None or sections[symtab][1] != _SHT_SYMTAB or sections[symtab][9] != _SYM.size:
            return None
        if sections[symtab][5] // _SYM.size > MAX_SYMBOLS:
            return None
        strtab = blob(sections[symtab][6])
        init = next((i for i, n in enumerate(names) if n == ".nv.global.init"), None)
        init_blob = blob(init) if init is not None else b""
        functions: list[str] = []
        globals_u64: list[tuple[str, int]] = []
        for st_name, st_info, _other, shndx, value, size in _SYM.iter_unpack(blob(symtab)):
            kind = st_info & 0xF
            if kind == _STT_FUNC and st_name:
                functions.append(name(strtab, st_name))
            elif (kind == _STT_OBJECT and init is not None and shndx == init and size == 8
                  and value + 8 <= len(init_blob)):
                globals_u64.append((name(strtab, st_name), int.from_bytes(init_blob[value : value + 8], "little")))
    except (struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None
    arch = _cubin_arch(flags, ident[8])
    if arch == 0:
        return None
    return BinaryInfo(kind="cubin", arch=arch, functions=tuple(sorted(f for f in functions if f)),
                      globals_u64=tuple(sorted(globals_u64)), arch_specific=cubin_arch_specific(flags, ident[8]))


def read_binary(data: bytes, source: str = "binary") -> BinaryInfo:
    """PTX or cubin, told apart by the ELF magic (as khal-builder does); a cubin through
    :func:`scan_cubin`, or pyelftools (:func:`read_cubin`) where that declines."""
    if not data:
        raise BinaryFormatError(f"{source}: empty file")
    if not is_elf(data):
        return scan_ptx(data, source)
    return scan_cubin(data) or read_cubin(data, source)


def khal_symbols(info: BinaryInfo) -> dict[str, str]:
    """Entry name -> hash for every khal-generated kernel symbol in the binary."""
    out: dict[str, str] = {}
    for fn in info.functions:
        split = split_symbol(fn)
        if split is not None:
            out[split[0]] = split[1]
    return out


_WGSL_ENTRY_RE = re.compile(r"@compute\b[^{;]*?\bfn\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.S)
_SPIRV_MAGIC = 0x07230203
_OP_ENTRY_POINT = 15


def webgpu_entry_points(data: bytes, kind: str, source: str = "shader") -> tuple[str, ...]:
    """Names of the compute entry points of a WGSL (text) or SPIR-V (binary) module."""
    if kind == "wgsl":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BinaryFormatError(f"{source}: WGSL that is not UTF-8 ({exc.reason})") from None
        return tuple(_WGSL_ENTRY_RE.findall(text))
    if kind != "spirv":
        raise BinaryFormatError(f"{source}: {kind!r} is not a WebGPU shader kind")
    if len(data) < 20 or len(data) % 4:
        raise BinaryFormatError(f"{source}: not SPIR-V (size {len(data)} is not whole words)")
    words = memoryview(data).cast("I")
    if words[0] != _SPIRV_MAGIC:
        raise BinaryFormatError(f"{source}: not SPIR-V (magic 0x{words[0]:08x})")
    names: list[str] = []
    i = 5
    while i < len(words):
        op, count = words[i] & 0xFFFF, words[i] >> 16
        if count == 0 or i + count > len(words):
            raise BinaryFormatError(f"{source}: damaged SPIR-V (instruction at word {i})")
        if op == _OP_ENTRY_POINT and count > 3:
            raw = bytes(words[i + 3:i + count]).split(b"\0", 1)[0]
            names.append(raw.decode("utf-8", "replace"))
        i += count
    return tuple(names)


# ---------------------------------------------------------------------------------------------
# PTX ISA <-> driver (binary selection: khal_runtime.backends.cuda.loader; inspect)
# ---------------------------------------------------------------------------------------------
#: Highest PTX ISA each driver (CUDA version) can JIT. Between entries the lower one holds.
PTX_ISA_BY_DRIVER: dict[tuple[int, int], tuple[int, int]] = {
    (11, 0): (7, 0), (11, 1): (7, 1), (11, 2): (7, 2), (11, 3): (7, 3), (11, 4): (7, 4),
    (11, 5): (7, 5), (11, 6): (7, 6), (11, 7): (7, 7), (11, 8): (7, 8),
    (12, 0): (8, 0), (12, 1): (8, 1), (12, 2): (8, 2), (12, 3): (8, 3), (12, 4): (8, 4),
    (12, 5): (8, 5), (12, 6): (8, 5), (12, 8): (8, 7), (12, 9): (8, 8),
    (13, 0): (9, 0), (13, 1): (9, 1), (13, 2): (9, 2),
}


#: The driver branch (R-number, as nvidia-smi's driver version begins) that first shipped each CUDA
#: version of the table above, where NVIDIA's release notes name one.
DRIVER_BRANCH: dict[tuple[int, int], int] = {
    (12, 0): 525, (12, 1): 530, (12, 2): 535, (12, 3): 545, (12, 4): 550, (12, 5): 555,
    (12, 6): 560, (12, 8): 570, (12, 9): 575, (13, 0): 580,
}


def min_driver_for_ptx_isa(isa: str | None) -> tuple[int, int] | None:
    """The oldest driver (its CUDA version) that JITs PTX of ISA ``isa``: the inverse of
    :data:`PTX_ISA_BY_DRIVER`. Past the table, ISA 9.N is CUDA 13.N's (the pattern of 13.0 to 13.2:
    each CUDA 13 minor brings the PTX ISA of the same minor); None for an ISA it cannot place."""
    got = _isa_tuple(isa)
    if got is None:
        return None
    for drv, top in sorted(PTX_ISA_BY_DRIVER.items()):
        if top >= got:
            return drv
    if got[0] == 9:
        return (13, got[1])
    return None


def ptx_driver_note(isa: str | None) -> str:
    """``needs a CUDA >= 13.0 driver (R580+)`` for PTX of ISA ``isa`` ("" when it cannot be placed)."""
    drv = min_driver_for_ptx_isa(isa)
    if drv is None:
        return ""
    branch = DRIVER_BRANCH.get(drv)
    return f"needs a CUDA >= {drv[0]}.{drv[1]} driver" + (f" (R{branch}+)" if branch else "")


def max_ptx_isa(driver: tuple[int, int]) -> tuple[int, int] | None:
    """Highest PTX ISA the driver JITs; None when the driver is newer than this table (try)."""
    if driver > max(PTX_ISA_BY_DRIVER):
        return None
    best: tuple[int, int] = (6, 0)
    for drv, isa in sorted(PTX_ISA_BY_DRIVER.items()):
        if drv <= driver:
            best = isa
    return best


def _isa_tuple(isa: str | None) -> tuple[int, int] | None:
    if not isa:
        return None
    m = re.fullmatch(r"(\d+)\.(\d+)", isa.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def ptx_isa_supported(isa: str | None, driver: tuple[int, int]) -> bool:
    limit = max_ptx_isa(driver)
    got = _isa_tuple(isa)
    return limit is None or got is None or got <= limit
