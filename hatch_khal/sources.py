"""A crate's source set: every file the compiler can read from the project, keyed stably.

The content hash (and so the cache key and every entry hash) must change whenever a file
the compiler reads changes. A header can be reached in ways no scanner sees (``#define H
"x.cuh"`` then ``#include H``, ``#/**/include``, line continuations), so the set is:

* the sources (the ``sources`` globs);
* **every file** under the sources' folders and the crate's ``include-dirs``, recursively,
  of any type (hidden entries, ``__pycache__``, ``_khal`` output folders, virtual
  environments and the project's ``build``/``dist`` are skipped, and so is what cannot be
  stat'ed: a path too long, a folder that cannot be traversed);
* every file a literal ``#include "..."`` / ``<...>`` reaches (followed transitively, also
  outside those folders).

Compiler options that add include paths are refused by the config (:mod:`hatch_khal.config`).
The set is a guess made before compiling: what the compiler actually read is checked against it
before anything is cached (:mod:`hatch_khal.reads`), and a file outside it fails the build.

Each file has a *key*: its POSIX path relative to the project root, as reached (a source
through a symlink keeps the link's name, so two links to two ``k.cu`` stay two files). A
file outside the project is keyed ``<external>/<path>``: relative to the project root
(``<external>/../shared_inc/common.cuh``: the same on every machine with the same layout,
and resolvable for editable installs), or absolute under an include dir configured with an
absolute path. Sources and literally included headers are read as UTF-8 (a byte-order mark
is refused: NVRTC cannot parse it); the other files are hashed as bytes.
"""

from __future__ import annotations

import glob
import os
import posixpath
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from hatch_khal.preprocessor import strip_comments
from hatch_khal.errors import ConfigError, SourceError

__all__ = ["BOM", "EXTERNAL", "MAX_FOLDER_BYTES", "MAX_FOLDER_FILES", "CrateSources", "SourceFile", "collect_sources"]

BOM = b"\xef\xbb\xbf"
EXTERNAL = "<external>/"
#: A crate's folders holding more than this are refused (the hook hashes all of it).
MAX_FOLDER_FILES = 20_000
MAX_FOLDER_BYTES = 512 << 20

_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
#: Files the compiler may parse as C/C++: a byte-order mark in one of them is refused.
_C_SUFFIXES = frozenset({".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx", ".inl", ".inc", ".ipp", ".c", ".cc",
                         ".cpp", ".cxx", ".tcc"})
_SKIP_DIRS = frozenset({"__pycache__", "_khal", "node_modules"})


@dataclass(frozen=True)
class SourceFile:
    path: Path  # the file as the compiler opens it
    rel: str  # its key: what hashes and manifests see
    data: bytes
    #: its size and mtime (ns) from a stat taken just before it was read: a compile that read it
    #: is checked against these (an edit, even one reverted, during the compile changes them)
    size: int = -1
    mtime_ns: int = -1

    @cached_property
    def text(self) -> str:
        return self.data.decode("utf-8")


@dataclass
class CrateSources:
    sources: list[SourceFile]  # the translation units, sorted by key
    #: local headers reached through a literal #include, sorted by key
    headers: list[SourceFile] = field(default_factory=list)
    #: every other file under the sources' folders and the include dirs, sorted by key
    others: list[SourceFile] = field(default_factory=list)
    #: Includes that resolve nowhere in the crate (CUDA / CCCL headers, or missing ones).
    system_includes: list[str] = field(default_factory=list)
    #: the include dirs, as the compiler gets them
    include_dirs: list[Path] = field(default_factory=list)

    @property
    def all_files(self) -> list[SourceFile]:
        """Every hashed file once, sorted by key."""
        seen: dict[str, SourceFile] = {}
        for f in self.sources + self.headers + self.others:
            seen.setdefault(f.rel, f)
        return [seen[k] for k in sorted(seen)]

    @property
    def scanned(self) -> list[SourceFile]:
        """The files whose KHAL_ENTRY markers count: sources and literally included headers."""
        return sorted(self.sources + self.headers, key=lambda f: f.rel)

    def display(self, compiler_path: str) -> str:
        """The key of a file named by its compiler path (for messages), else the path itself."""
        for f in self.sources + self.headers + self.others:
            if str(f.path) == compiler_path:
                return f.rel
        return compiler_path


class _Keys:
    def __init__(self, root: Path, absolute_dirs: list[Path]) -> None:
        self.root = root
        self.absolute_dirs = absolute_dirs

    def __call__(self, path: Path) -> str:
        p = Path(os.path.normpath(path))
        if not any(d == p or d in p.parents for d in self.absolute_dirs):
            try:
                rel = Path(os.path.relpath(p, self.root)).as_posix()
            except ValueError:  # another drive
                rel = None
            if rel is not None:
                return rel if rel != ".." and not rel.startswith("../") else EXTERNAL + rel
        return EXTERNAL + p.as_posix()


def read_stat(path: Path) -> tuple[bytes, int, int]:
    """(bytes, size, mtime_ns) of ``path``, the stat taken before the read (so that an edit
    during the read shows as a changed stat later)."""
    st = os.stat(path)
    return path.read_bytes(), st.st_size, st.st_mtime_ns


def _read(path: Path, key: str, crate: str, what: str, *, text: bool) -> SourceFile:
    try:
        data, size, mtime_ns = read_stat(path)
    except FileNotFoundError:
        raise SourceError(f"crate {crate!r}: {what} {key} does not exist") from None
    except IsADirectoryError:
        raise SourceError(f"crate {crate!r}: {what} {key} is a directory, not a file") from None
    except OSError as exc:
        raise SourceError(f"crate {crate!r}: cannot read {what} {key}: {exc.strerror}") from None
    if data.startswith(BOM) and (text or path.suffix.lower() in _C_SUFFIXES):
        raise SourceError(
            f"{key}:1: crate {crate!r}: {what} starts with a UTF-8 byte-order mark, which NVRTC cannot "
            "parse; save it as UTF-8 without BOM"
        )
    f = SourceFile(path, key, data, size, mtime_ns)
    if text:
        try:
            f.text  # noqa: B018 - decoded once here, for the error
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise SourceError(
                f"{key}:{line}: crate {crate!r}: {what} is not valid UTF-8 (byte 0x{data[exc.start]:02x}); "
                "save it as UTF-8"
            ) from None
    return f


def _resolve_globs(root: Path, patterns: list[str], crate: str, key: _Keys) -> list[tuple[str, Path]]:
    """(key, path as matched) of every file the patterns match, sorted by key."""
    found: dict[str, Path] = {}
    for pattern in patterns:
        if Path(pattern).is_absolute():
            raise SourceError(
                f"crate {crate!r}: source pattern {pattern!r} must be relative to the project root"
            )
        matches = [Path(os.path.normpath(p)) for p in glob.glob(str(root / pattern), recursive=True)]
        files = [p for p in matches if p.is_file()]
        if not files:
            raise SourceError(
                f"crate {crate!r}: source pattern {pattern!r} matches no file under {root}; "
                "check the 'sources' option of the khal hook"
            )
        for p in files:
            found[key(p)] = p
    return [(k, found[k]) for k in sorted(found)]


def _include_dirs(root: Path, crate: str, configured: list[str]) -> tuple[list[Path], list[Path]]:
    """(every include dir, those configured with an absolute path), lexically normalised."""
    dirs: list[Path] = []
    absolute: list[Path] = []
    for d in configured:
        p = Path(os.path.normpath(root / d))
        if not p.is_dir():
            raise ConfigError(f"crate {crate!r}: include dir {d!r} (option 'include-dirs') is not a directory")
        if p not in dirs:
            dirs.append(p)
        if Path(d).is_absolute():
            absolute.append(p)
    return dirs, absolute


def _exists(p: Path) -> bool:
    try:
        return os.path.exists(p)
    except (OSError, ValueError):
        return False


def _is_file(p: Path) -> bool:
    """A regular file (through links); False for what cannot be stat'ed (a name too long, a
    folder that cannot be traversed): the compiler cannot open it either."""
    try:
        return os.path.isfile(p)
    except (OSError, ValueError):
        return False


def _walk(folder: Path, root: Path, visited: set[Path]) -> list[Path]:
    """Every file under ``folder`` the compiler could reach, skipping tool and output folders.

    What cannot be listed or stat'ed (ENAMETOOLONG, EACCES: a folder that cannot be traversed,
    such as parts of /proc reached through a link) is skipped: the compiler cannot open it
    either, and a file it does read that the hash does not cover fails the build
    (:mod:`hatch_khal.reads`)."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        here = Path(dirpath)
        try:
            real = here.resolve()
        except (OSError, RuntimeError):  # a name too long, a link loop
            dirnames[:] = []
            continue
        if real in visited:
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames[:] = sorted(
            d for d in dirnames
            if not d.startswith(".") and d not in _SKIP_DIRS and not d.endswith(".egg-info")
            and not (here == root and d in ("build", "dist"))
            and not _exists(here / d / "pyvenv.cfg")
        )
        # regular files only: a FIFO or a dangling link is nothing the compiler can include
        out.extend(here / f for f in sorted(filenames)
                   if not f.startswith(".") and not f.endswith(".pyc") and _is_file(here / f))
    return out


def collect_sources(root: Path, crate: str, patterns: list[str], include_dirs: list[str]) -> CrateSources:
    """Resolve ``patterns`` under ``root``; hash the crate's folders; follow literal includes."""
    root = root.resolve()
    if not patterns:
        raise SourceError(f"crate {crate!r} lists no sources; set 'sources' to one or more globs")
    dirs, absolute = _include_dirs(root, crate, include_dirs)
    key = _Keys(root, absolute)
    matched = _resolve_globs(root, patterns, crate, key)
    # the compiler opens a source by its resolved path (its own #includes are relative to it)
    sources = [_read(p.resolve(), k, crate, "source", text=True) for k, p in matched]
    by_real: dict[Path, SourceFile] = {s.path: s for s in sources}
    headers: dict[str, SourceFile] = {}
    unresolved: set[str] = set()
    todo = list(sources)
    while todo:
        f = todo.pop()
        clean = strip_comments(f.text, keep_strings=True).replace("\\\n", "")
        for m in _INCLUDE_RE.finditer(clean):
            quote, name = m.group(1), m.group(2).strip()
            candidates = ([f.path.parent / name] if quote == '"' else []) + [d / name for d in dirs]
            for cand in candidates:
                if cand.is_file():
                    lexical = Path(os.path.normpath(cand))
                    real = lexical.resolve()
                    if real not in by_real:
                        hdr = _read(lexical, key(lexical), crate, "header", text=True)
                        by_real[real] = hdr
                        headers.setdefault(hdr.rel, hdr)
                        todo.append(hdr)
                    break
            else:
                if name != "khal.h":
                    unresolved.add(name)
    folders: list[Path] = []
    for _, p in matched:
        for d in (p.parent, p.resolve().parent):
            if d not in folders:
                folders.append(d)
    folders += [d for d in dirs if d not in folders]
    known = {f.rel for f in sources} | set(headers)
    others: dict[str, SourceFile] = {}
    visited: set[Path] = set()
    total = 0
    for folder in folders:
        for p in _walk(folder, root, visited):
            k = key(p)
            if k in known or k in others or p.resolve() in by_real:
                continue
            if len(others) >= MAX_FOLDER_FILES or total > MAX_FOLDER_BYTES:
                raise SourceError(
                    f"crate {crate!r}: its source folders and include-dirs ({', '.join(key(d) for d in folders)}) "
                    f"hold more than {MAX_FOLDER_FILES} files or {MAX_FOLDER_BYTES >> 20} MiB; hatch-khal hashes "
                    "every file there (any of them can be #included): keep kernel sources in a folder of their own"
                )
            f = _read(p, k, crate, "file", text=False)
            total += len(f.data)
            others[k] = f
    return CrateSources(
        sources=sources,
        headers=[headers[k] for k in sorted(headers)],
        others=[others[k] for k in sorted(others)],
        system_includes=sorted(unresolved),
        include_dirs=dirs,
    )
