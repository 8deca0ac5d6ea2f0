"""Finding and parsing ``KHAL_ENTRY`` markers in kernel sources.

The grammar is deliberately small so it can be read without a C++ parser::

    entry   := KHAL_ENTRY ( IDENT , INT , ( param { , param } ) )
    param   := KHAL_STORAGE ( type , IDENT )
             | KHAL_STORAGE_ARRAY ( type , INT , IDENT )
             | KHAL_STORAGE_VALUE ( type , IDENT )
             | KHAL_UNIFORM ( type , IDENT )
             | KHAL_SCALAR ( scalar_type , IDENT )
    type    := [ const ] IDENT { :: IDENT }

Comments and string literals are blanked first (line numbers kept), and
preprocessor lines are skipped, so a ``#define`` that mentions the marker is
not an entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from khal_runtime import abi

from hatch_khal.errors import EntryParseError

__all__ = ["SCALAR_TYPES", "EntryDecl", "ParamDecl", "find_entries", "strip_comments"]

#: C type name -> (manifest element_type, size in bytes). Exact widths only.
SCALAR_TYPES: dict[str, tuple[str, int]] = {
    c: (name, abi.SCALARS[name].size) for c, name in abi.C_SCALARS.items()
}

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IDENT_RE = re.compile(rf"^{_IDENT}$")
_TYPE_RE = re.compile(rf"^(?P<const>const\s+)?(?P<name>(?:::)?{_IDENT}(?:\s*::\s*{_IDENT})*)$")
_INT_RE = re.compile(r"^(0|[1-9][0-9]*)$")
_MARKER_RE = re.compile(r"\bKHAL_ENTRY\b")

_PARAM_ARITY = {
    "KHAL_STORAGE": 2,
    "KHAL_STORAGE_ARRAY": 3,
    "KHAL_STORAGE_VALUE": 2,
    "KHAL_UNIFORM": 2,
    "KHAL_SCALAR": 2,
}
_MAX_BLOCK = 1024


@dataclass(frozen=True)
class ParamDecl:
    name: str
    kind: str  # storage | uniform | scalar
    ctype: str  # C type name as written, without const
    const: bool
    shape: str | None = None  # storage: slice | array | value
    length: int | None = None

    @property
    def element_type(self) -> str:
        """The manifest's element type: the ABI's scalar name, or the struct's C name."""
        t = abi.c_scalar(self.ctype)
        return t.name if t is not None else self.ctype

    @property
    def writable(self) -> bool:
        return self.kind == "storage" and not self.const

    def signature(self) -> dict[str, object]:
        """What of this parameter feeds the entry hash, as the manifest records it."""
        return {"name": self.name, "kind": self.kind, "element_type": self.element_type,
                "shape": self.shape, "length": self.length, "writable": self.writable}


@dataclass(frozen=True)
class EntryDecl:
    name: str
    block_size: int
    params: tuple[ParamDecl, ...]
    file: str  # display path
    line: int

    def signature(self) -> dict[str, object]:
        """:func:`khal_runtime.abi.entry_signature` of this entry."""
        return abi.entry_signature(self.name, (self.block_size, 1, 1), [p.signature() for p in self.params])


_LEXEME = re.compile(r"""//[^\n]*|/\*[\s\S]*?(?:\*/|\Z)|"(?:\\[\s\S]|[^"\\\n])*"?|'(?:\\[\s\S]|[^'\\\n])*'?""")
_NOT_NEWLINE = re.compile(r"[^\n]")


def _blank(segment: str) -> str:
    return _NOT_NEWLINE.sub(" ", segment)


def strip_comments(text: str, *, keep_strings: bool = False) -> str:
    """Blank comments (and, unless ``keep_strings``, the insides of string and char literals);
    keep every newline, so line numbers hold. One regular-expression pass: linear time."""

    def repl(m: re.Match[str]) -> str:
        s = m.group(0)
        if s[0] == "/":
            return _blank(s)
        if keep_strings:
            return s
        if len(s) >= 2 and s[-1] == s[0]:
            return s[0] + _blank(s[1:-1]) + s[0]
        return s[0] + _blank(s[1:])

    return _LEXEME.sub(repl, text)


def _blank_preprocessor(text: str) -> str:
    lines = text.split("\n")
    out = []
    cont = False
    for line in lines:
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            out.append(" " * len(line))
        else:
            out.append(line)
    return "\n".join(out)


def _split_top(args: str) -> list[str]:
    """Split on commas not inside parentheses."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in args:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur).strip())
    return parts


def _balanced(text: str, start: int) -> int:
    """Index just past the ')' matching the '(' at ``start``; -1 if unbalanced."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _parse_type(raw: str, where: str, what: str) -> tuple[str, bool]:
    m = _TYPE_RE.match(" ".join(raw.split()))
    if not m:
        raise EntryParseError(
            f"{where}: {what}: type {raw!r} is not supported; use a type name, optionally "
            "'const' and '::'-qualified (no templates, pointers or references)"
        )
    return re.sub(r"\s+", "", m.group("name")), bool(m.group("const"))


def _parse_param(raw: str, where: str, entry: str) -> ParamDecl:
    m = re.match(rf"^({_IDENT})\s*\(", raw)
    if not m or m.group(1) not in _PARAM_ARITY:
        raise EntryParseError(
            f"{where}: entry {entry!r}: parameter {raw!r} is not one of "
            + ", ".join(f"{k}(...)" for k in _PARAM_ARITY)
        )
    macro = m.group(1)
    end = _balanced(raw, m.end() - 1)
    if end != len(raw):
        raise EntryParseError(f"{where}: entry {entry!r}: malformed parameter {raw!r}")
    args = _split_top(raw[m.end() : end - 1])
    if len(args) != _PARAM_ARITY[macro]:
        raise EntryParseError(
            f"{where}: entry {entry!r}: {macro} takes {_PARAM_ARITY[macro]} arguments, got {len(args)} in {raw!r}"
        )
    name = args[-1]
    if not _IDENT_RE.match(name):
        raise EntryParseError(f"{where}: entry {entry!r}: parameter name {name!r} is not an identifier")
    what = f"entry {entry!r} parameter {name!r}"
    ctype, const = _parse_type(args[0], where, what)
    if macro == "KHAL_SCALAR":
        if ctype not in SCALAR_TYPES:
            raise EntryParseError(
                f"{where}: {what}: KHAL_SCALAR type {ctype!r} has no exact-width ABI; use one of "
                + ", ".join(sorted(SCALAR_TYPES))
                + " (pass structs as KHAL_UNIFORM)"
            )
        return ParamDecl(name, "scalar", ctype, const)
    if macro == "KHAL_UNIFORM":
        return ParamDecl(name, "uniform", ctype, True)
    if macro == "KHAL_STORAGE_ARRAY":
        if not _INT_RE.match(args[1]) or int(args[1]) == 0:
            raise EntryParseError(
                f"{where}: {what}: array length {args[1]!r} must be a positive integer literal"
            )
        return ParamDecl(name, "storage", ctype, const, "array", int(args[1]))
    shape = "value" if macro == "KHAL_STORAGE_VALUE" else "slice"
    return ParamDecl(name, "storage", ctype, const, shape, 1 if shape == "value" else None)


def find_entries(text: str, display_path: str) -> list[EntryDecl]:
    """Every KHAL_ENTRY marker in ``text``; raises EntryParseError with file:line."""
    clean = _blank_preprocessor(strip_comments(text))
    entries: list[EntryDecl] = []
    line, counted = 1, 0  # line numbers counted incrementally: one pass over the text in all
    for m in _MARKER_RE.finditer(clean):
        line += clean.count("\n", counted, m.start())
        counted = m.start()
        where = f"{display_path}:{line}"
        open_at = m.end()
        while open_at < len(clean) and clean[open_at].isspace():
            open_at += 1
        if open_at >= len(clean) or clean[open_at] != "(":
            raise EntryParseError(f"{where}: KHAL_ENTRY must be followed by '(name, block_size, (params...))'")
        end = _balanced(clean, open_at)
        if end < 0:
            raise EntryParseError(f"{where}: KHAL_ENTRY( has no matching ')'")
        args = _split_top(clean[open_at + 1 : end - 1])
        if len(args) != 3:
            raise EntryParseError(
                f"{where}: KHAL_ENTRY takes 3 arguments (name, block_size, (params...)), got {len(args)}"
            )
        name, block, params = args
        if not _IDENT_RE.match(name):
            raise EntryParseError(f"{where}: entry name {name!r} is not an identifier")
        if "_khal_" in name or name.endswith("_khal"):
            raise EntryParseError(f"{where}: entry name {name!r} must not contain '_khal_' (reserved for symbols)")
        if not _INT_RE.match(block) or not 1 <= int(block) <= _MAX_BLOCK:
            raise EntryParseError(
                f"{where}: entry {name!r}: block_size {block!r} must be an integer literal in 1..{_MAX_BLOCK}"
            )
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
        entries.append(EntryDecl(name, int(block), decls, display_path, line))
    return entries
