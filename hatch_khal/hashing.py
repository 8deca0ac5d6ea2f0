"""Content hashes: of a crate, of each entry, and cache keys.

Everything hashed is canonical JSON (sorted keys) of content and of paths
relative to the project root, so a hash does not depend on where the project
lives, on dict order or on the time.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from khal_runtime import abi
from khal_runtime.abi import ABI_VERSION

from hatch_khal.entries import EntryDecl
from hatch_khal.sources import SourceFile

__all__ = ["canonical", "crate_content_hash", "entry_hash", "khal_header_sha256", "sha256_bytes"]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(obj: Any) -> bytes:
    """:func:`khal_runtime.abi.canonical`: what every hash of the project is over."""
    return abi.canonical(obj)


@lru_cache(maxsize=1)
def khal_header_sha256() -> str:
    """The hook's own headers are part of every hash: khal.h defines how entries are called,
    and the folder also holds what makes CCCL headers usable under NVRTC
    (``thrust/detail/complex/stream.h``). Over every file in it, by relative path and bytes."""
    root = Path(str(resources.files("hatch_khal") / "include"))
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return sha256_bytes(canonical([[p.relative_to(root).as_posix(), sha256_bytes(p.read_bytes())] for p in files]))


def crate_content_hash(
    files: Iterable[SourceFile], defines: dict[str, str], options: list[str], extra: dict[str, Any] | None = None
) -> str:
    """Hash over every file of the crate (key + bytes: sources, headers, everything under its
    folders, see :mod:`hatch_khal.sources`), the defines and options."""
    return sha256_bytes(
        canonical(
            {
                "abi": ABI_VERSION,
                "khal_h": khal_header_sha256(),
                "files": sorted((f.rel, sha256_bytes(f.data)) for f in files),
                "defines": dict(sorted(defines.items())),
                "options": list(options),
                "extra": extra or {},
            }
        )
    )


def entry_hash(content_hash: str, entry: EntryDecl) -> str:
    """16 hex digits: changes with the entry's signature or any input of its crate
    (:func:`khal_runtime.abi.entry_hash`, which the runtime recomputes from the manifest)."""
    return abi.entry_hash(content_hash, entry.signature())
