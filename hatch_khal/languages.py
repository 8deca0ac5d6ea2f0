"""The per-language seam: how a crate of one source language is planned and compiled.

A :class:`Language` turns a crate's configuration into a :class:`~hatch_khal.model.CratePlan`
(its sources, entries and hashes), the plan into compile jobs (each naming the compiler that
runs it, see :mod:`hatch_khal.compilers`), and a compile failure into the clearest error it
can. CUDA C++ (:data:`hatch_khal.cuda.CUDA`) is the first. A Slang language registers here
under ``"slang"`` (``khal_runtime.manifest.Crate.language``): Slang -> CUDA C++ for NVRTC jobs,
plus its own WGSL / SPIR-V jobs per entry.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol

from hatch_khal.config import ResolvedCrate
from hatch_khal.errors import ConfigError, KhalBuildError
from hatch_khal.model import CompileJob, CratePlan

__all__ = ["LANGUAGES", "Language", "get_language"]


class Language(Protocol):
    name: str
    #: the compiler (hatch_khal.compilers registry name) whose archs bound this language's targets
    compiler: str

    def plan(self, root: Path, cfg: ResolvedCrate) -> CratePlan:
        """Sources, entries and hashes of one crate; SourceError / ConfigError when unusable."""
        ...

    def jobs(self, plan: CratePlan, root: Path, targets: list[str]) -> list[CompileJob]:
        """The compile jobs for ``targets`` (arch strings: cubins and PTX)."""
        ...

    def explain(self, plan: CratePlan, error: KhalBuildError) -> KhalBuildError:
        """The error to report for a failed job of this crate (hints, source locations)."""
        ...


#: language -> "module:attribute" of its Language, imported on first use only.
LANGUAGES: dict[str, str] = {
    "cuda": "hatch_khal.cuda:CUDA",
}


def get_language(name: str, crate: str) -> Language:
    try:
        target = LANGUAGES[name]
    except KeyError:
        raise ConfigError(
            f"crate {crate!r}: language {name!r} is not supported by this version of hatch-khal "
            f"(it builds: {', '.join(sorted(LANGUAGES))})"
        ) from None
    module, _, attr = target.partition(":")
    language: Language = getattr(importlib.import_module(module), attr)
    return language
