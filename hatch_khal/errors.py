"""Errors of the build side. Each names the option, file, crate or entry at fault."""

from __future__ import annotations

__all__ = ["CompileError", "ConfigError", "EntryParseError", "KhalBuildError", "MergeError", "OutputError", "PrebuiltError",
           "SourceChangedError", "SourceError", "UncoveredReadError"]


class KhalBuildError(Exception):
    """Base class: the build cannot go on; the message says why and what to do."""


class ConfigError(KhalBuildError, ValueError):
    """The hook's configuration is invalid (names the option and the hook)."""


class SourceError(KhalBuildError):
    """A source file is missing, unreadable, not UTF-8, or a crate has no sources."""


class EntryParseError(SourceError):
    """A KHAL_ENTRY marker does not follow the grammar (names file:line)."""


class UncoveredReadError(SourceError):
    """The compiler read a file that the crate's content hash does not cover (a header reached
    through a macro ``#include`` from outside the crate's folders, a hidden file, ...): an edit
    to it would not rebuild the crate. Names the crate and the file."""


class SourceChangedError(SourceError):
    """A file the compiler read changed while the crate compiled: nothing was cached; build again."""


class CompileError(KhalBuildError):
    """NVRTC rejected a crate; the message carries NVRTC's log with file:line."""


class PrebuiltError(KhalBuildError):
    """A CUDA_OXIDE_SHADERS_PTX_<CRATE> file is unusable or stale."""


class OutputError(KhalBuildError):
    """The build would write outside the project, or replace files it did not write."""


def from_name(name: str, message: str) -> KhalBuildError:
    """The error of class ``name`` (one of this module's) with ``message``: how an error crosses
    from a worker process; an unknown name is a plain KhalBuildError."""
    cls = globals().get(name, KhalBuildError)
    if isinstance(cls, type) and issubclass(cls, KhalBuildError):
        return cls(message)
    return KhalBuildError(message)


class MergeError(KhalBuildError):
    """``python -m hatch_khal merge``: a shard is missing, given twice, or was built from other
    sources, another toolchain or other options than the others (or than this checkout)."""
