"""A crate's source set: globs resolved, files read as UTF-8, local headers found.

Local headers are the files reached through ``#include "..."`` (relative to the
including file, then the crate's include dirs) and ``#include <...>`` that
resolve inside the crate's include dirs. They are hashed like sources; headers
that resolve nowhere local (toolkit, CCCL, khal.h) are left to NVRTC.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass, field
from pathlib import Path

from hatch_khal.errors import SourceError

__all__ = ["CrateSources", "SourceFile", "collect_sources"]

_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.M)


@dataclass(frozen=True)
class SourceFile:
    path: Path  # absolute
    rel: str  # POSIX path relative to the project root (what hashes and manifests see)
    text: str
    data: bytes


@dataclass
class CrateSources:
    sources: list[SourceFile]  # the translation units, in sorted order
    headers: list[SourceFile] = field(default_factory=list)  # local headers, sorted
    #: Includes that resolve nowhere in the crate (CUDA / CCCL headers, or missing ones).
    system_includes: list[str] = field(default_factory=list)

    @property
    def all_files(self) -> list[SourceFile]:
        return sorted(self.sources + self.headers, key=lambda f: f.rel)


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        # Outside the project (an absolute include dir): keep the name only, so that
        # no build-machine path reaches a hash or a manifest.
        return "<external>/" + path.name


def _read(path: Path, root: Path, crate: str, what: str) -> SourceFile:
    rel = _rel(path, root)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SourceError(f"crate {crate!r}: {what} {rel} does not exist") from None
    except IsADirectoryError:
        raise SourceError(f"crate {crate!r}: {what} {rel} is a directory, not a file") from None
    except OSError as exc:
        raise SourceError(f"crate {crate!r}: cannot read {what} {rel}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SourceError(
            f"{rel}:{line}: crate {crate!r}: {what} is not valid UTF-8 (byte 0x{data[exc.start]:02x}); "
            "save it as UTF-8"
        ) from None
    return SourceFile(path, rel, text, data)


def _resolve_globs(root: Path, patterns: list[str], crate: str) -> list[Path]:
    found: dict[str, Path] = {}
    for pattern in patterns:
        if Path(pattern).is_absolute():
            raise SourceError(
                f"crate {crate!r}: source pattern {pattern!r} must be relative to the project root"
            )
        matches = [Path(p) for p in glob.glob(str(root / pattern), recursive=True)]
        files = [p for p in matches if p.is_file()]
        if not files:
            raise SourceError(
                f"crate {crate!r}: source pattern {pattern!r} matches no file under {root}; "
                "check the 'sources' option of the khal hook"
            )
        for p in files:
            found[_rel(p.resolve(), root.resolve())] = p.resolve()
    return [found[k] for k in sorted(found)]


def collect_sources(root: Path, crate: str, patterns: list[str], include_dirs: list[Path]) -> CrateSources:
    """Resolve ``patterns`` under ``root`` and walk local includes transitively."""
    root = root.resolve()
    if not patterns:
        raise SourceError(f"crate {crate!r} lists no sources; set 'sources' to one or more globs")
    paths = _resolve_globs(root, patterns, crate)
    sources = [_read(p, root, crate, "source") for p in paths]
    source_paths = {s.path for s in sources}
    headers: dict[Path, SourceFile] = {}
    unresolved: set[str] = set()
    todo = list(sources)
    while todo:
        f = todo.pop()
        for m in _INCLUDE_RE.finditer(f.text):
            quote, name = m.group(1), m.group(2).strip()
            candidates = ([f.path.parent / name] if quote == '"' else []) + [d / name for d in include_dirs]
            for cand in candidates:
                if cand.is_file():
                    resolved = cand.resolve()
                    if resolved not in headers and resolved not in source_paths:
                        hdr = _read(resolved, root, crate, "header")
                        headers[resolved] = hdr
                        todo.append(hdr)
                    break
            else:
                if name != "khal.h":
                    unresolved.add(name)
    return CrateSources(
        sources=sources,
        headers=sorted(headers.values(), key=lambda h: h.rel),
        system_includes=sorted(unresolved),
    )
