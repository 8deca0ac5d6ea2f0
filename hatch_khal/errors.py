"""Errors of the build side. Each names the option, file, crate or entry at fault."""

from __future__ import annotations

__all__ = ["CompileError", "ConfigError", "EntryParseError", "KhalBuildError", "OutputError", "PrebuiltError",
           "SourceError"]


class KhalBuildError(Exception):
    """Base class: the build cannot go on; the message says why and what to do."""


class ConfigError(KhalBuildError, ValueError):
    """The hook's configuration is invalid (names the option and the hook)."""


class SourceError(KhalBuildError):
    """A source file is missing, unreadable, not UTF-8, or a crate has no sources."""


class EntryParseError(SourceError):
    """A KHAL_ENTRY marker does not follow the grammar (names file:line)."""


class CompileError(KhalBuildError):
    """NVRTC rejected a crate; the message carries NVRTC's log with file:line."""


class PrebuiltError(KhalBuildError):
    """A CUDA_OXIDE_SHADERS_PTX_<CRATE> file is unusable or stale."""


class OutputError(KhalBuildError):
    """The build would write outside the project, or replace files it did not write."""
