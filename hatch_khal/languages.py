"""The per-language seam: how a crate of one source language is planned, compiled and finished.

A :class:`Language` turns a crate's configuration into a :class:`~hatch_khal.model.CratePlan`
(its files, content hash and, where it can tell without compiling, its entries); runs whatever
must run before the compile jobs exist (:meth:`Language.prepare`: Slang's own compile, through
the content-addressed cache); turns the plan into compile jobs (each naming the compiler that
runs it, see :mod:`hatch_khal.compilers`) and a compile failure into the clearest error it can;
and, once a CUDA binary of the crate is known, makes the manifest entries and any artifacts
besides the PTX / cubins (:meth:`Language.finish`).

The languages: CUDA C++ (:data:`hatch_khal.cuda.CUDA`, ``.cu`` sources) and Slang
(:data:`hatch_khal.slang.language.SLANG`, ``.slang`` sources: CUDA through NVRTC, plus WGSL /
SPIR-V per entry). The name is ``khal_runtime.manifest.Crate.language``;
:func:`hatch_khal.config.parse_config` picks it from the sources' suffix.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hatch_khal.config import ResolvedCrate
from hatch_khal.errors import ConfigError, KhalBuildError
from hatch_khal.model import CompileJob, CrateParts, CratePlan, Reporter

if TYPE_CHECKING:
    from khal_runtime.binaries import BinaryInfo

    from hatch_khal.cache import Cache

__all__ = ["LANGUAGES", "Language", "get_language"]


class Language(Protocol):
    name: str
    #: the compiler (hatch_khal.compilers registry name) whose archs bound this language's targets
    compiler: str

    def plan(self, root: Path, cfg: ResolvedCrate) -> CratePlan:
        """Files, content hash (and entries, if known without compiling) of one crate; SourceError /
        ConfigError when unusable. Runs no compiler."""
        ...

    def prepare(self, plan: CratePlan, cache: Cache, reporter: Reporter) -> tuple[int, int]:
        """What must run before :meth:`jobs` (a front-end compiler), through ``cache``; fills
        ``plan.entries`` when :meth:`plan` could not. Also for prebuilt crates (their binary is
        checked against these entries). Returns how many units it compiled and how many it took
        from the cache; (0, 0) for CUDA C++, which has no such stage."""
        ...

    def jobs(self, plan: CratePlan, root: Path, targets: list[str]) -> list[CompileJob]:
        """The compile jobs for ``targets`` (arch strings: cubins and PTX)."""
        ...

    def explain(self, plan: CratePlan, error: KhalBuildError) -> KhalBuildError:
        """The error to report for a failed job of this crate (hints, source locations)."""
        ...

    def finish(self, plan: CratePlan, binary: BinaryInfo) -> CrateParts:
        """The manifest entries, with parameter sizes checked against ``binary``'s size probes (a
        PTX or cubin of this crate, compiled or prebuilt), and the artifacts besides the CUDA
        binaries."""
        ...


#: language -> "module:attribute" of its Language, imported on first use only.
LANGUAGES: dict[str, str] = {
    "cuda": "hatch_khal.cuda:CUDA",
    "slang": "hatch_khal.slang.language:SLANG",
    "triton": "hatch_khal.triton.language:TRITON",
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
