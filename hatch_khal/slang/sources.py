"""A Slang crate's files: its sources (globs) and every module they pull in.

Slang loads modules itself; this module finds the same files so that they enter the crate's
content hash (path relative to the project + bytes, as CUDA headers do) *before* Slang runs, which
is what lets an unchanged rebuild skip Slang altogether. It follows, transitively:

* ``import a.b_c;`` -> ``a/b_c.slang`` or ``a/b-c.slang`` (Slang turns ``_`` into ``-``);
* ``import "path/x.slang";``, ``__include x;`` / ``__include "x.slang";``;
* ``#include "x.slang"`` (preprocessor),

looking next to the including file first, then in the crate's include dirs (Slang's ``-I``).
An import found nowhere is left to Slang, which reports it with file:line; the worker also
lists every file Slang read and the stage refuses a build whose files this walk missed.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path

from hatch_khal.errors import SourceError
from hatch_khal.sources import EXTERNAL, SourceFile, read_stat

__all__ = ["SlangSources", "collect_slang_sources", "strip_comments_keep_strings"]

_IMPORT_RE = re.compile(
    r'(?:^|(?<=[;{}\s]))(?P<kw>import|__include)\s+(?:"(?P<path>[^"\n]+)"|(?P<mod>[A-Za-z_][\w.]*))\s*;',
    re.M,
)
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"(?P<path>[^"\n]+)"', re.M)


@dataclass(frozen=True)
class SlangSources:
    sources: list[SourceFile]  # the crate's own files (its translation unit), sorted
    modules: list[SourceFile]  # files reached through import / __include / #include, sorted
    #: imports that resolve to no file: (file, line, name); Slang reports them when it compiles
    unresolved: list[tuple[str, int, str]]

    @property
    def all_files(self) -> list[SourceFile]:
        return sorted(self.sources + self.modules, key=lambda f: f.rel)


def _rel(path: Path, root: Path) -> str:
    """POSIX path relative to the project; outside it ``<external>/`` and the path relative to the
    project (``<external>/../shared/util.slang``), the rule of CUDA C++ sources: two external
    modules of one name never share a key."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        try:
            rel = Path(os.path.relpath(os.path.normpath(path), root)).as_posix()
        except ValueError:  # another drive
            rel = Path(os.path.normpath(path)).as_posix()
        return EXTERNAL + rel


def _read(path: Path, root: Path, crate: str, what: str) -> SourceFile:
    rel = _rel(path, root)
    try:
        data, size, mtime_ns = read_stat(path)
    except OSError as exc:
        raise SourceError(f"crate {crate!r}: cannot read {what} {rel}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SourceError(f"{rel}:{line}: crate {crate!r}: {what} is not valid UTF-8; save it as UTF-8") from None
    return SourceFile(path, rel, data, size, mtime_ns)


def _resolve_globs(root: Path, patterns: list[str], crate: str) -> list[Path]:
    found: dict[str, Path] = {}
    for pattern in patterns:
        if Path(pattern).is_absolute():
            raise SourceError(f"crate {crate!r}: source pattern {pattern!r} must be relative to the project root")
        files = [Path(p).resolve() for p in glob.glob(str(root / pattern), recursive=True) if Path(p).is_file()]
        if not files:
            raise SourceError(
                f"crate {crate!r}: source pattern {pattern!r} matches no file under {root}; "
                "check the 'sources' option of the khal hook"
            )
        for p in files:
            found[_rel(p, root)] = p
    return [found[k] for k in sorted(found)]


def strip_comments_keep_strings(text: str) -> str:
    """Blank ``//`` and ``/* */`` comments (newlines kept, so line numbers hold); keep strings."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _candidates(name: str, kind: str) -> list[str]:
    """File names a module reference may live in, relative to a search directory."""
    if kind == "path":
        return [name]
    parts = name.split(".")
    stems = ["/".join(parts)]
    hyphen = "/".join(p.replace("_", "-") for p in parts)
    if hyphen != stems[0]:
        stems.append(hyphen)
    return [s + ".slang" for s in stems]


def _references(f: SourceFile) -> list[tuple[int, str, str]]:
    """(line, name, kind) of every module reference in ``f``; kind is "path" or "module"."""
    clean = strip_comments_keep_strings(f.text)
    refs: list[tuple[int, str, str]] = []
    for m in _IMPORT_RE.finditer(clean):
        line = clean.count("\n", 0, m.start("kw")) + 1
        if m.group("path") is not None:
            refs.append((line, m.group("path"), "path"))
        else:
            refs.append((line, m.group("mod"), "module"))
    for m in _INCLUDE_RE.finditer(clean):
        refs.append((clean.count("\n", 0, m.start()) + 1, m.group("path"), "path"))
    return refs


def collect_slang_sources(root: Path, crate: str, patterns: list[str], include_dirs: list[Path]) -> SlangSources:
    """Resolve ``patterns`` under ``root`` and follow module references transitively."""
    root = root.resolve()
    if not patterns:
        raise SourceError(f"crate {crate!r} lists no sources; set 'sources' to one or more globs of .slang files")
    paths = _resolve_globs(root, patterns, crate)
    not_slang = [_rel(p, root) for p in paths if p.suffix != ".slang"]
    if not_slang:
        raise SourceError(
            f"crate {crate!r}: {', '.join(not_slang)} is not a .slang file; a Slang crate's 'sources' "
            "match .slang files only (put CUDA C++ in a crate of its own)"
        )
    sources = [_read(p, root, crate, "source") for p in paths]
    seen = {s.path for s in sources}
    modules: dict[Path, SourceFile] = {}
    unresolved: list[tuple[str, int, str]] = []
    todo = list(sources)
    while todo:
        f = todo.pop()
        for line, name, kind in _references(f):
            dirs = [f.path.parent] + [Path(d) for d in include_dirs]
            hit = next((d / c for d in dirs for c in _candidates(name, kind) if (d / c).is_file()), None)
            if hit is None:
                unresolved.append((f.rel, line, name))
                continue
            resolved = hit.resolve()
            if resolved not in seen:
                seen.add(resolved)
                mod = _read(resolved, root, crate, "imported module")
                modules[resolved] = mod
                todo.append(mod)
    return SlangSources(
        sources=sources,
        modules=sorted(modules.values(), key=lambda m: m.rel),
        unresolved=sorted(set(unresolved)),
    )
