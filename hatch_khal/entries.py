"""Finding and parsing ``KHAL_ENTRY`` markers in kernel sources.

The grammar is deliberately small so it can be read without a C++ parser::

    entry    := [ template < tparams > ] KHAL_ENTRY ( IDENT , block , ( param { , param } ) { , option } )
    block    := INT | ( INT , INT [ , INT ] )
    option   := KHAL_LAUNCH_BOUNDS ( INT | none )      any block within the bounds
              | attribute                              a launch attribute
    attribute:= the marker of a row of khal_runtime.launch_attributes.ATTRIBUTES, with the arguments
                 its row parses (KHAL_SHARED_MEM ( INT ), KHAL_COOPERATIVE, KHAL_CLUSTER ( INT [ , INT
                 [ , INT ] ] ), KHAL_PDL, ...: docs/guide/writing-kernels.md has the table)
    (each option at most once, in any order)
    instance := KHAL_INSTANTIATE ( IDENT , IDENT { , targ } )
    param    := KHAL_STORAGE ( type , IDENT )
              | KHAL_STORAGE_ARRAY ( type , INT , IDENT )
              | KHAL_STORAGE_VALUE ( type , IDENT )
              | KHAL_UNIFORM ( type , IDENT )
              | KHAL_SCALAR ( type , IDENT )
    type     := { qualifier } name { qualifier }        qualifier := const | volatile | __restrict__
    name     := builtin words (unsigned long long, signed char, ...)
              | [ :: ] IDENT [ < ... > ] { :: IDENT [ < ... > ] }

What a type *is* (which ABI scalar, or a struct; its size and alignment) is not decided here:
the compiler resolves it (``khal::type_id`` probes, :mod:`hatch_khal.probes`). Here a type is
only checked to be a type (no pointer, reference or array) and kept as spelled.

Comments and string literals are blanked first (line numbers kept), and preprocessor lines
are skipped, so a ``#define`` that mentions the marker is not an entry. Conditional
directives are evaluated where the scanner can (:class:`hatch_khal.preprocessor.MacroEnv`: literals, the crate's
``defines``, macros the file itself defines): a marker in a branch that is off is not an
entry; one under a condition the scanner cannot decide is kept and reported by name if the
compiler leaves it out; two markers of one name under such conditions must agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from khal_runtime import abi, launch_attributes

from hatch_khal.errors import EntryParseError, SourceError
from hatch_khal.preprocessor import DEFINE_NAME, Cond, MacroEnv, blank_preprocessor, line_states, strip_comments

__all__ = [
    "SCALAR_TYPES",
    "EntryDecl",
    "ParamDecl",
    "SourceScan",
    "TemplateDecl",
    "find_entries",
    "scan_crate",
    "scan_source",
]

#: C type name -> (manifest element_type, size in bytes): the spellings the ABI table knows.
#: (Any other spelling is resolved by the compiler.)
SCALAR_TYPES: dict[str, tuple[str, int]] = {
    c: (name, abi.SCALARS[name].size) for c, name in abi.C_SCALARS.items()
}

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IDENT_RE = re.compile(_IDENT)  # matched whole (fullmatch): "$" accepts a trailing newline
_IDENT_ANY = re.compile(_IDENT)
_INT_RE = re.compile(r"0|[1-9][0-9]*")  # fullmatch
_MARKER_RE = re.compile(r"\b(KHAL_ENTRY|KHAL_INSTANTIATE)\b")
_GRID_READ_RE = re.compile(r"\b(blockIdx|gridDim)\b")

_MAX_BLOCK = abi.MAX_BLOCK_THREADS
_MAX_BLOCK_DIMS = (1024, 1024, 64)
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict"}
_BUILTIN_WORDS = {"signed", "unsigned", "short", "long", "int", "char", "float", "double", "bool"}


# ---------------------------------------------------------------------------------------------
# declarations
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParamDecl:
    name: str
    kind: str  # a name in khal_runtime.abi.KINDS
    ctype: str  # the type as spelled, qualifiers removed, whitespace normalised
    const: bool
    shape: str | None = None  # the marker's (khal_runtime.abi.Marker.shape)
    length: int | None = None
    #: ``__restrict__`` was written: the kernel's pointer parameter carries it
    restrict: bool = False

    @property
    def element_type(self) -> str:
        """The ABI scalar the spelling names if the ABI table knows it (``float``), else the
        spelling. Only a first guess: the build records what the compiler says."""
        t = abi.c_scalar(self.ctype)
        return t.name if t is not None else self.ctype

    @property
    def writable(self) -> bool:
        return abi.kind(self.kind).strategy.writable and not self.const

    def signature(self) -> dict[str, object]:
        """What of this parameter feeds the entry hash: its spelling (``ctype``), not its
        element type, which only the compiler knows (:func:`khal_runtime.abi.entry_signature`)."""
        return {"name": self.name, "kind": self.kind, "ctype": self.ctype,
                "shape": self.shape, "length": self.length, "writable": self.writable}


@dataclass(frozen=True)
class EntryDecl:
    name: str
    #: as written: an int (1-D) or (x, y, z)
    block_size: int | tuple[int, int, int]
    params: tuple[ParamDecl, ...]
    file: str  # display path
    line: int
    #: grid dimensions the entry's ids honour: the block's dimensions as written, or more if the
    #: body reads a y / z id (``KHAL_GLOBAL_ID_Y``, ``blockIdx.z``, ...)
    grid_dims: int = 1
    #: False: ``KHAL_LAUNCH_BOUNDS`` was given; any block within them may be launched
    fixed_block: bool = True
    launch_bounds: int | None = None
    #: an instantiation: the template entry it instantiates, its arguments, the parameter names
    template: str | None = None
    template_args: tuple[str, ...] = ()
    template_params: tuple[str, ...] = ()
    #: the body reads ``blockIdx`` / ``gridDim`` itself (remapped in the indirect variant)
    reads_grid: bool = False
    #: True: compiled for sure; None: under conditions the scanner could not decide (``conds``)
    compiled: bool | None = True
    conds: tuple[Cond, ...] = ()
    #: where the crate reads ``blockIdx`` / ``gridDim`` outside entry bodies (``file:line``; CUDA
    #: headers known to: ``<cooperative_groups.h>``): the text check of the indirect variant,
    #: used when the build has no PTX to check
    grid_reads_elsewhere: tuple[str, ...] = ()
    #: launch attributes (``KHAL_SHARED_MEM`` / ``KHAL_COOPERATIVE`` / ``KHAL_CLUSTER`` / ...: the
    #: markers of launch_attributes.ATTRIBUTES): (manifest field, value) pairs of those given, in row order
    launch_attributes: tuple[tuple[str, object], ...] = ()

    @property
    def attributes(self) -> dict[str, object]:
        """The launch attributes given (manifest ``LaunchAttributes`` fields), empty if none."""
        return dict(self.launch_attributes)

    @property
    def block(self) -> tuple[int, int, int]:
        b = self.block_size
        return (b, 1, 1) if isinstance(b, int) else b

    @property
    def threads(self) -> int:
        x, y, z = self.block
        return x * y * z

    @property
    def function(self) -> str:
        """The name after ``khal_entry_`` of the device function the kernel calls."""
        return self.template or self.name

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def spelled(self, ctype: str) -> str:
        """``ctype`` with this instantiation's template arguments put in (for messages and
        struct names): ``Vec<T>`` of ``T = float2`` is ``Vec<float2>``."""
        if not self.template_params:
            return ctype
        subst = dict(zip(self.template_params, self.template_args))
        return re.sub(_IDENT, lambda m: subst.get(m.group(0), m.group(0)), ctype)

    def signature(self) -> dict[str, object]:
        """:func:`khal_runtime.abi.entry_signature` of this entry."""
        return abi.entry_signature(self.name, self.block, [p.signature() for p in self.params],
                                   grid_dims=self.grid_dims, fixed_block=self.fixed_block,
                                   launch_bounds=self.launch_bounds, template=self.template,
                                   template_args=self.template_args, attributes=self.attributes or None)


@dataclass(frozen=True)
class TemplateDecl:
    """A templated ``KHAL_ENTRY``: an entry for each of its ``KHAL_INSTANTIATE`` lines."""

    entry: EntryDecl  # name: the template's; params spelled with its template parameters
    params: tuple[str, ...]  # template parameter names
    required: int  # how many have no default


@dataclass(frozen=True)
class InstanceDecl:
    template: str
    name: str
    args: tuple[str, ...]
    file: str
    line: int
    compiled: bool | None = True
    conds: tuple[Cond, ...] = ()


@dataclass
class SourceScan:
    """What one file holds: entries, templates, instantiations, and where it reads
    ``blockIdx`` / ``gridDim`` outside entry bodies (helpers, macros)."""

    file: str
    entries: list[EntryDecl] = field(default_factory=list)
    templates: list[TemplateDecl] = field(default_factory=list)
    instances: list[InstanceDecl] = field(default_factory=list)
    grid_reads_outside: list[int] = field(default_factory=list)



def _split_top(args: str, angles: bool = False) -> list[str]:
    """Split on commas not inside parentheses (and, with ``angles``, not inside ``<...>``)."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    angle = 0
    for ch in args:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif angles and ch == "<":
            angle += 1
        elif angles and ch == ">" and angle:
            angle -= 1
        if ch == "," and depth == 0 and angle == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def _balanced(text: str, start: int, open_: str = "(", close: str = ")") -> int:
    """Index just past the ``close`` matching the ``open_`` at ``start``; -1 if unbalanced."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# markers
# ---------------------------------------------------------------------------------------------
def _parse_type(raw: str, where: str, what: str) -> tuple[str, bool, bool]:
    """(spelling, const, restrict) of a parameter type; EntryParseError if it is not one."""
    text = " ".join(raw.split())
    bad = EntryParseError(
        f"{where}: {what}: type {raw!r} is not supported; use a type name: optionally const, "
        "'::'-qualified, with template arguments (no pointers, references or arrays; a type whose "
        "template arguments hold a comma needs a typedef)"
    )
    words: list[str] = []
    pos = 0
    const = restrict = False
    while pos < len(text):
        if text[pos] == " ":
            pos += 1
            continue
        if text.startswith("::", pos):
            words.append("::")
            pos += 2
            continue
        if text[pos] == "<":
            end = _balanced(text, pos, "<", ">")
            if end < 0 or not words or words[-1] in ("::",) or words[-1] in _BUILTIN_WORDS:
                raise bad
            inner = text[pos + 1 : end - 1]
            if any(c in inner for c in ";{}") or inner.count("(") != inner.count(")"):
                raise bad
            words[-1] += "<" + ", ".join(" ".join(a.split()) for a in _split_top(inner, angles=True)) + ">"
            pos = end
            continue
        m = _IDENT_ANY.match(text, pos)
        if m is None:
            raise bad
        w = m.group(0)
        pos = m.end()
        if w == "const":
            const = True
        elif w == "__restrict__":
            restrict = True
        elif w in ("__restrict", "restrict"):
            # the marker's type is also the element type in the source, where C++ refuses a restrict
            # qualifier; the generated code defines __restrict__ away and moves it to the pointer
            raise EntryParseError(
                f"{where}: {what}: type {raw!r}: write '__restrict__', not {w!r}: hatch-khal puts "
                "__restrict__ on the pointer the kernel receives, and the element type cannot carry a "
                "restrict qualifier (the compiler refuses it)"
            )
        elif w == "volatile":
            pass  # kept in the kernel's pointer type by the compiler, not in the spelling
        elif w in ("struct", "class", "typename", "enum"):
            continue
        else:
            words.append(w)
    if not words:
        raise bad
    if all(w in _BUILTIN_WORDS for w in words):
        return " ".join(words), const, restrict
    # a (qualified) name: IDENT { :: IDENT }, possibly starting with ::
    name = ""
    expect_ident = True
    for w in words:
        if w == "::":
            if not expect_ident and name:
                name += "::"
                expect_ident = True
            elif not name:
                name = "::"
            else:
                raise bad
            continue
        if not expect_ident or w.split("<")[0] in _BUILTIN_WORDS or w.split("<")[0] in _QUALIFIERS:
            raise bad
        name += w
        expect_ident = False
    if expect_ident:
        raise bad
    return name, const, restrict


def _parse_param(raw: str, where: str, entry: str) -> ParamDecl:
    """One parameter marker (``KHAL_STORAGE(const float, x)``): the markers, their arguments and
    what they declare are :data:`khal_runtime.abi.KINDS`' (:func:`khal_runtime.abi.markers`)."""
    known = abi.markers()
    m = re.match(rf"^({_IDENT})\s*\(", raw)
    if not m or m.group(1) not in known:
        raise EntryParseError(
            f"{where}: entry {entry!r}: parameter {raw!r} is not one of "
            + ", ".join(f"{k}(...)" for k in known)
        )
    macro = m.group(1)
    kind, marker = known[macro]
    end = _balanced(raw, m.end() - 1)
    if end != len(raw):
        raise EntryParseError(f"{where}: entry {entry!r}: malformed parameter {raw!r}")
    args = _split_top(raw[m.end() : end - 1])
    if len(args) != len(marker.args):
        raise EntryParseError(
            f"{where}: entry {entry!r}: {macro} takes {len(marker.args)} arguments, got {len(args)} in {raw!r}"
            + (" (a type whose template arguments hold a comma needs a typedef)" if "<" in raw else "")
        )
    name = args[-1]
    if not _IDENT_RE.fullmatch(name):
        raise EntryParseError(f"{where}: entry {entry!r}: parameter name {name!r} is not an identifier")
    what = f"entry {entry!r} parameter {name!r}"
    ctype, const, restrict = _parse_type(args[0], where, what)
    length = marker.length
    if marker.sized:
        if not _INT_RE.fullmatch(args[1]) or int(args[1]) == 0:
            raise EntryParseError(
                f"{where}: {what}: array length {args[1]!r} must be a positive integer literal"
            )
        length = int(args[1])
    # restrict applies only to a pointer the kernel receives; a pointer it cannot write through
    # (a uniform's) is const
    r = kind.strategy
    if restrict and not r.by_pointer:
        raise EntryParseError(
            f"{where}: {what}: type {args[0]!r}: {macro} is passed by value, so '__restrict__' (which qualifies "
            "the pointer the kernel receives for a storage binding or a uniform) has nothing to apply to; drop it"
        )
    return ParamDecl(name, kind.name, ctype, const or (r.by_pointer and not r.writable), marker.shape, length,
                     restrict and r.by_pointer)


def _parse_block(raw: str, where: str, name: str) -> int | tuple[int, int, int]:
    bad = EntryParseError(
        f"{where}: entry {name!r}: block_size {raw!r} must be an integer literal in 1..{_MAX_BLOCK}, or "
        f"(x, y) / (x, y, z) of integer literals with at most {_MAX_BLOCK} threads in all"
    )
    if _INT_RE.fullmatch(raw):
        if not 1 <= int(raw) <= _MAX_BLOCK:
            raise bad
        return int(raw)
    if not (raw.startswith("(") and raw.endswith(")") and _balanced(raw, 0) == len(raw)):
        raise bad
    dims = _split_top(raw[1:-1])
    if not 2 <= len(dims) <= 3 or not all(_INT_RE.fullmatch(d) for d in dims):
        raise bad
    xs = [int(d) for d in dims] + [1] * (3 - len(dims))
    if any(d < 1 for d in xs) or any(d > lim for d, lim in zip(xs, _MAX_BLOCK_DIMS)) or xs[0] * xs[1] * xs[2] > _MAX_BLOCK:
        raise bad
    return (xs[0], xs[1], xs[2])


def _parse_bounds(raw: str, where: str, name: str, threads: int) -> int | None:
    m = re.fullmatch(r"KHAL_LAUNCH_BOUNDS\s*\(\s*(\w+)\s*\)", raw)
    if not m or not (m.group(1) == "none" or _INT_RE.fullmatch(m.group(1))):
        raise EntryParseError(
            f"{where}: entry {name!r}: the 4th argument {raw!r} must be KHAL_LAUNCH_BOUNDS(n) (n in 1..{_MAX_BLOCK}) "
            "or KHAL_LAUNCH_BOUNDS(none)"
        )
    if m.group(1) == "none":
        return None
    n = int(m.group(1))
    if not 1 <= n <= _MAX_BLOCK or n < threads:
        raise EntryParseError(
            f"{where}: entry {name!r}: KHAL_LAUNCH_BOUNDS({n}) must be in 1..{_MAX_BLOCK} and hold the default "
            f"block ({threads} threads)"
        )
    return n


def _parse_options(raw: list[str], where: str, name: str, threads: int
                   ) -> tuple[bool, int | None, tuple[tuple[str, object], ...]]:
    """(fixed block, launch bounds, launch attributes) from the markers after the parameters; the
    launch attributes' markers are their rows' (:mod:`khal_runtime.launch_attributes`)."""
    fixed, bounds = True, None
    attrs: dict[str, object] = {}
    seen: set[str] = set()
    for opt in raw:
        head = re.match(r"\s*(\w+)", opt)
        word = head.group(1) if head else opt
        if word in seen:
            raise EntryParseError(f"{where}: entry {name!r}: {word} is given twice")
        seen.add(word)
        if word == "KHAL_LAUNCH_BOUNDS":
            fixed, bounds = False, _parse_bounds(opt, where, name, threads)
            continue
        try:
            found = launch_attributes.parse_marker(opt)
        except ValueError as exc:
            raise EntryParseError(f"{where}: entry {name!r}: {exc}") from None
        if found is None:
            raise EntryParseError(
                f"{where}: entry {name!r}: KHAL_ENTRY takes 3 arguments (name, block_size, (params...)), then "
                f"options, and {opt.strip()!r} is none of KHAL_LAUNCH_BOUNDS(n | none), {launch_attributes.markers()}")
        attrs[found[0].name] = found[1]
    problems = launch_attributes.problems(attrs, marker=True)
    if problems:
        raise EntryParseError(f"{where}: entry {name!r}: {problems[0]}")
    return fixed, bounds, tuple((r.name, v) for r, v in launch_attributes.values(attrs))


_AXIS_RE = re.compile(r"\bKHAL_(?:GLOBAL_ID|LOCAL_ID|GROUP_ID|NUM_GROUPS)_([XYZ])\b|\b(?:blockIdx|gridDim)\s*\.\s*([xyz])\b")


def _body(clean: str, end: int) -> tuple[int, int] | None:
    """(start, end) of the ``{...}`` body right after a marker, if there is one."""
    i = end
    while i < len(clean) and clean[i].isspace():
        i += 1
    if i >= len(clean) or clean[i] != "{":
        return None
    close = _balanced(clean, i, "{", "}")
    return (i, close) if close > 0 else None


def _template_header(clean: str, start: int) -> tuple[str, int] | None:
    """The ``template <...>`` text right before ``start`` (its inside, and where it starts)."""
    i = start - 1
    while i >= 0 and clean[i].isspace():
        i -= 1
    if i < 0 or clean[i] != ">":
        return None
    depth = 0
    j = i
    while j >= 0:
        if clean[j] == ">":
            depth += 1
        elif clean[j] == "<":
            depth -= 1
            if depth == 0:
                break
        elif clean[j] in ";{}":
            return None
        j -= 1
    if j < 0:
        return None
    k = j - 1
    while k >= 0 and clean[k].isspace():
        k -= 1
    if clean[max(0, k - 7) : k + 1] != "template" or (k >= 8 and (clean[k - 8].isalnum() or clean[k - 8] == "_")):
        return None
    return clean[j + 1 : i], k - 7


def _template_params(inner: str, where: str, name: str) -> tuple[tuple[str, ...], int]:
    names: list[str] = []
    required = 0
    for part in _split_top(inner, angles=True):
        if not part:
            raise EntryParseError(f"{where}: template entry {name!r}: empty template parameter in <{inner}>")
        if "..." in part:
            raise EntryParseError(f"{where}: template entry {name!r}: variadic template parameters ({part!r}) "
                                  "are not supported; list the instantiations' parameters")
        head, eq, _ = part.partition("=")
        ids = re.findall(_IDENT, head)
        if not ids or ids[-1] in ("typename", "class"):
            raise EntryParseError(f"{where}: template entry {name!r}: template parameter {part!r} has no name")
        names.append(ids[-1])
        if not eq:
            if len(names) > required + 1:
                raise EntryParseError(f"{where}: template entry {name!r}: parameter {ids[-1]!r} without a default "
                                      "follows one with a default")
            required += 1
    return tuple(names), required


def _check_name(name: str, where: str, what: str = "entry name") -> None:
    if not _IDENT_RE.fullmatch(name):
        raise EntryParseError(f"{where}: {what} {name!r} is not an identifier")
    if "_khal_" in name or name.endswith("_khal"):
        raise EntryParseError(f"{where}: {what} {name!r} must not contain '_khal_' (reserved for symbols)")


def scan_source(text: str, display_path: str, env: MacroEnv | None = None) -> SourceScan:
    """Every marker in ``text``: entries, templates and instantiations (EntryParseError with
    file:line for a malformed one). Markers in branches the conditionals turn off are left out;
    those under undecided conditions say so (``compiled`` None)."""
    env = (env or MacroEnv()).fork()
    stripped = strip_comments(text)
    states = line_states(stripped, display_path, env)
    clean = blank_preprocessor(stripped)
    out = SourceScan(display_path)
    bodies: list[tuple[int, int]] = []
    line, counted = 1, 0  # line numbers counted incrementally: one pass over the text in all
    for m in _MARKER_RE.finditer(clean):
        line += clean.count("\n", counted, m.start())
        counted = m.start()
        where = f"{display_path}:{line}"
        marker = m.group(1)
        state, conds = states[line - 1] if line - 1 < len(states) else (True, ())
        if state is False:  # a branch the preprocessor leaves out: not an entry
            continue
        open_at = m.end()
        while open_at < len(clean) and clean[open_at].isspace():
            open_at += 1
        if open_at >= len(clean) or clean[open_at] != "(":
            if marker == "KHAL_INSTANTIATE":
                raise EntryParseError(f"{where}: KHAL_INSTANTIATE must be followed by "
                                      "'(template_entry, entry_name, template arguments...)'")
            raise EntryParseError(f"{where}: KHAL_ENTRY must be followed by '(name, block_size, (params...))'")
        end = _balanced(clean, open_at)
        if end < 0:
            raise EntryParseError(f"{where}: {marker}( has no matching ')'")
        if marker == "KHAL_INSTANTIATE":
            args = _split_top(clean[open_at + 1 : end - 1], angles=True)
            if len(args) < 2:
                raise EntryParseError(f"{where}: KHAL_INSTANTIATE takes (template_entry, entry_name, template "
                                      f"arguments...), got {len(args)} argument(s)")
            _check_name(args[0], where, "template entry name")
            _check_name(args[1], where)
            targs = tuple(" ".join(a.split()) for a in args[2:])
            if any(not a for a in targs):
                raise EntryParseError(f"{where}: KHAL_INSTANTIATE({args[0]}, {args[1]}, ...): an empty template argument")
            out.instances.append(InstanceDecl(args[0], args[1], targs, display_path, line, state, conds))
            continue
        args = _split_top(clean[open_at + 1 : end - 1])
        if not 3 <= len(args) <= 8:
            raise EntryParseError(
                f"{where}: KHAL_ENTRY takes 3 arguments (name, block_size, (params...)) and optionally "
                f"KHAL_LAUNCH_BOUNDS(...) and launch attributes, got {len(args)}"
            )
        name, block_raw, params = args[:3]
        _check_name(name, where)
        block = _parse_block(block_raw, where, name)
        bx, by, bz = (block, 1, 1) if isinstance(block, int) else block
        threads = bx * by * bz
        fixed, bounds, attrs = _parse_options(args[3:], where, name, threads)
        if not (params.startswith("(") and params.endswith(")") and _balanced(params, 0) == len(params)):
            raise EntryParseError(f"{where}: entry {name!r}: parameters must be one parenthesised list")
        inner = params[1:-1].strip()
        if not inner:
            raise EntryParseError(f"{where}: entry {name!r} has no parameters; the ABI needs at least one")
        decls = tuple(_parse_param(p, where, name) for p in _split_top(inner))
        seen: set[str] = set()
        for d in decls:
            if d.name in seen:
                raise EntryParseError(f"{where}: entry {name!r}: duplicate parameter name {d.name!r}")
            seen.add(d.name)
        dims = 1 if isinstance(block, int) else len(_split_top(block_raw[1:-1]))
        body = _body(clean, end)
        reads = False
        if body is not None:
            bodies.append(body)
            text_body = clean[body[0] : body[1]]
            reads = _GRID_READ_RE.search(text_body) is not None
            for a in _AXIS_RE.finditer(text_body):
                axis = (a.group(1) or a.group(2)).lower()
                dims = max(dims, {"x": 1, "y": 2, "z": 3}[axis])
        decl = EntryDecl(name, block, decls, display_path, line, grid_dims=dims, fixed_block=fixed,
                         launch_bounds=bounds, reads_grid=reads, compiled=state, conds=conds,
                         launch_attributes=attrs)
        header = _template_header(clean, m.start())
        if header is not None:
            tparams, required = _template_params(header[0], where, name)
            out.templates.append(TemplateDecl(decl, tparams, required))
        else:
            out.entries.append(decl)
    # blockIdx / gridDim read outside any entry body (helpers, macros): the indirect variant
    # cannot remap those (the binary's PTX is checked; without PTX this text is)
    line, counted = 1, 0
    bi = 0
    bodies.sort()
    for m in _GRID_READ_RE.finditer(stripped):
        while bi < len(bodies) and bodies[bi][1] <= m.start():
            bi += 1
        if bi < len(bodies) and bodies[bi][0] <= m.start() < bodies[bi][1]:
            continue
        line += stripped.count("\n", counted, m.start())
        counted = m.start()
        if line - 1 < len(states) and states[line - 1][0] is False:
            continue
        out.grid_reads_outside.append(line)
    return out


# ---------------------------------------------------------------------------------------------
# a crate's entries
# ---------------------------------------------------------------------------------------------
def _instantiate(t: TemplateDecl, inst: InstanceDecl) -> EntryDecl:
    where = f"{inst.file}:{inst.line}"
    n = len(inst.args)
    if not t.required <= n <= len(t.params):
        want = f"{len(t.params)}" if t.required == len(t.params) else f"{t.required} to {len(t.params)}"
        raise EntryParseError(
            f"{where}: KHAL_INSTANTIATE({inst.template}, {inst.name}, ...) gives {n} template argument(s); "
            f"template entry {inst.template!r} ({t.entry.where}) takes {want} ({', '.join(t.params)})"
        )
    compiled: bool | None = True if (t.entry.compiled is True and inst.compiled is True) else None
    return replace(t.entry, name=inst.name, file=inst.file, line=inst.line, template=inst.template,
                   template_args=inst.args, template_params=t.params[:n],
                   compiled=compiled, conds=t.entry.conds + inst.conds)


def _resolve(scans: list[SourceScan], crate: str | None) -> list[EntryDecl]:
    """The entries of ``scans`` (instantiations expanded; alternatives under undecided
    conditions merged when they agree); SourceError / EntryParseError naming file:line."""
    label = f"crate {crate!r}: " if crate else ""
    templates: dict[str, list[TemplateDecl]] = {}
    for s in scans:
        for t in s.templates:
            templates.setdefault(t.entry.name, []).append(t)
    candidates: list[EntryDecl] = [e for s in scans for e in s.entries]
    used: set[str] = set()
    for s in scans:
        for inst in s.instances:
            ts = templates.get(inst.template)
            if not ts:
                plain = next((e for e in candidates if e.name == inst.template), None)
                hint = (f": entry {inst.template!r} ({plain.where}) is not templated; write "
                        f"'template <typename T>' before its KHAL_ENTRY") if plain else \
                    ": no templated KHAL_ENTRY of that name was found"
                raise EntryParseError(f"{inst.file}:{inst.line}: {label}KHAL_INSTANTIATE({inst.template}, "
                                      f"{inst.name}, ...){hint}")
            used.add(inst.template)
            for t in ts:  # one per alternative of the template (merged or refused below)
                candidates.append(_instantiate(t, inst))
    for name, ts in sorted(templates.items()):
        if name not in used:
            t = ts[0]
            raise EntryParseError(
                f"{t.entry.where}: {label}template entry {name!r} has no KHAL_INSTANTIATE; add one line per "
                f"type it is built for, e.g. KHAL_INSTANTIATE({name}, {name}_f32, "
                f"{', '.join('float' for _ in range(t.required)) or '...'})"
            )
        for other in candidates:
            if other.name == name and other.template is None:
                raise SourceError(
                    f"{other.where}: {label}entry {name!r} has the name of the template entry at {ts[0].entry.where} "
                    f"(both would define khal_entry_{name}); rename one"
                )
    by_name: dict[str, list[EntryDecl]] = {}
    for e in candidates:
        by_name.setdefault(e.name, []).append(e)
    out: list[EntryDecl] = []
    for name, alts in by_name.items():
        if name in templates:
            first = alts[0]
            raise SourceError(f"{first.where}: {label}instantiation {name!r} has the name of its template entry "
                              f"({templates[name][0].entry.where}); give the instantiation its own name")
        sure = [e for e in alts if e.compiled is True]
        if len(sure) > 1:
            raise SourceError(
                f"{sure[1].where}: {label}entry {name!r} is defined twice (first at {sure[0].where})"
            )
        if len(alts) == 1:
            out.append(alts[0])
            continue
        first = alts[0]
        if all(e.signature() == first.signature() for e in alts[1:]):
            # the same entry in branches of an #if the scanner cannot decide: whichever the
            # compiler keeps has this signature (and the content hash covers every branch)
            out.append(replace(first, reads_grid=any(e.reads_grid for e in alts),
                               compiled=True if sure else None, conds=tuple(c for e in alts for c in e.conds)))
            continue
        conds = sorted({str(c) for e in alts for c in e.conds})
        raise SourceError(
            f"{alts[1].where}: {label}entry {name!r} is declared differently here and at {first.where}, under "
            f"conditions hatch-khal cannot decide ({'; '.join(conds) or 'none'}): the build cannot know which one "
            "the compiler sees. Give the variants different names (or the same parameters and block), or make "
            "the #if depend only on the crate's 'defines' (a crate per variant, see 'Variants')"
        )
    # <e>_indirect_khal_<hash> (e's indirect kernel) is also the direct symbol of an entry <e>_indirect
    names = {e.name: e for e in out}
    for e in out:
        clash = names.get(f"{e.name}_indirect")
        if clash is not None:
            raise SourceError(
                f"{clash.where}: {label}entry {clash.name!r} clashes with entry {e.name!r} ({e.where}), whose "
                f"indirect-dispatch kernel is called {e.name}_indirect; rename {clash.name!r}"
            )
    return out


def find_entries(text: str, display_path: str, env: MacroEnv | None = None) -> list[EntryDecl]:
    """Every entry a file defines (templates expanded by the file's own instantiations), in
    order; raises EntryParseError with file:line. Without ``env`` only literal conditions
    (``#if 0``) are decided."""
    scan = scan_source(text, display_path, env)
    if not scan.templates and not scan.instances:
        return list(scan.entries)
    return sorted(_resolve([scan], None), key=lambda e: e.line)


#: CUDA headers whose device functions read blockIdx / gridDim (cooperative groups' group_index,
#: this_grid): a crate including them has no indirect variants when only the text can be checked
_GRID_READING_HEADERS = ("cooperative_groups",)


def scan_crate(files: Iterable[tuple[str, str]], crate: str, defines: Mapping[str, str] | None = None,
               options: Iterable[str] = (), system_includes: Iterable[str] = ()) -> list[EntryDecl]:
    """The entries of a crate's scanned files (``(display path, text)``), sorted by name."""
    files = list(files)
    env = MacroEnv.for_crate(defines or {}, options)
    defined = [{m.group(2) for m in DEFINE_NAME.finditer(strip_comments(t))} for _, t in files]
    scans = []
    for i, (rel, text) in enumerate(files):
        others = set().union(*(d for j, d in enumerate(defined) if j != i)) if len(files) > 1 else set()
        scans.append(scan_source(text, rel, env.for_file(others)))
    elsewhere = [f"{s.file}:{ln}" for s in scans for ln in s.grid_reads_outside]
    elsewhere += sorted({f"<{h}>" for h in system_includes if h.startswith(_GRID_READING_HEADERS)})
    return sorted((replace(e, grid_reads_elsewhere=tuple(elsewhere)) for e in _resolve(scans, crate)),
                  key=lambda e: e.name)
