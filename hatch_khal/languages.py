"""The per-language seam (:class:`Language`) and the records the build stages hand each other.

Each stage returns a new frozen record per crate: :class:`Planned` (files, content hash) ->
:class:`Prepared` (after the language's front stage: Slang's and Triton's own compiles; entries
known) -> :class:`Compiled` (the compile jobs' outputs). A record carries its ``Language`` and the
language's own data, typed by the parameters they share (``P``: what planning found, ``record.plan``;
``F``: what the front stage made, ``record.front``): a stage asks the record's language, never looks
one up by name, and a language reads its data without a cast. The one lookup by name is
:func:`get_language`, where planning turns a crate's configured ``language`` into its ``Language``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from hatch_khal.config import ResolvedCrate
from hatch_khal.errors import ConfigError, KhalBuildError
from hatch_khal.model import CompileJob, CompileOutput, CrateParts, PlannedEntry, Reporter

if TYPE_CHECKING:
    from khal_runtime.binaries import BinaryInfo
    from khal_runtime.manifest import SpirvStatus

    from hatch_khal.cache import Cache
    from hatch_khal.sources import SourceFile

__all__ = ["LANGUAGES", "Compiled", "CrateRecord", "Language", "Planned", "Prepared", "get_language"]

#: what a language's planning found of a crate (its own type: ``CudaPlan``, ``SlangCratePlan``, ...)
P = TypeVar("P")
#: what a language's front stage made of a crate (``CudaFront``, ``SlangFront``, ``TritonFront``)
F = TypeVar("F")


class Language(Protocol[P, F]):
    name: str
    #: the compiler (hatch_khal.compilers registry name) whose archs bound this language's targets
    compiler: str

    def plan(self, root: Path, cfg: ResolvedCrate) -> Planned[P, F]:
        """Files, content hash (and entries, if known without compiling) of one crate; SourceError /
        ConfigError when unusable. Runs no compiler."""
        ...

    def prepare(self, planned: Planned[P, F], cache: Cache, reporter: Reporter) -> Prepared[P, F]:
        """What must run before :meth:`jobs` (a front-end compiler), through ``cache``; gives the
        entries when :meth:`plan` could not. Also for prebuilt crates (their binary is checked
        against these entries). The record counts the units it compiled and took from the cache
        (none for a CUDA C++ crate without indirect variants)."""
        ...

    def jobs(self, prepared: Prepared[P, F], root: Path, targets: list[str]) -> list[CompileJob]:
        """The compile jobs for ``targets`` (arch strings: cubins and PTX)."""
        ...

    def explain(self, prepared: Prepared[P, F], error: KhalBuildError) -> KhalBuildError:
        """The error to report for a failed job of this crate (hints, source locations)."""
        ...

    def finish(self, compiled: Compiled[P, F], binary: BinaryInfo) -> CrateParts:
        """The manifest entries, with parameter sizes checked against ``binary``'s size probes (a
        PTX or cubin of this crate, compiled or prebuilt), and the artifacts besides the CUDA
        binaries."""
        ...


@dataclass(frozen=True, kw_only=True)
class CrateRecord(Generic[P, F]):
    """What every stage knows of a crate; each stage's record adds its own."""

    cfg: ResolvedCrate
    language: Language[P, F]
    content_hash: str
    spirv: SpirvStatus
    #: every file the content hash covers, sorted by key (the manifest's ``sources``)
    files: tuple[SourceFile, ...]
    #: the entries with their hashes (the language's order): known after planning (CUDA C++) or after
    #: the language's front stage (Slang, Triton)
    entries: tuple[PlannedEntry, ...] = ()
    #: tools this crate was built with besides the compilers of its jobs ({"slang": "2026.12"})
    tools: Mapping[str, str] = field(default_factory=dict)
    #: the ``CUDA_OXIDE_SHADERS_PTX_<CRATE>`` variable that gives the crate's binary, when set
    prebuilt_var: str | None = None
    #: what the language's planning found
    plan: P

    def _fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True)
class Planned(CrateRecord[P, F]):
    """A crate as its language planned it (:meth:`Language.plan`): no compiler has run."""

    def prebuilt(self, var: str) -> Planned[P, F]:
        """This crate with its binary given by the variable ``var``."""
        return replace(self, prebuilt_var=var)

    def prepare(self, cache: Cache, reporter: Reporter) -> Prepared[P, F]:
        return self.language.prepare(self, cache, reporter)

    def prepared(self, front: F, *, entries: Sequence[PlannedEntry] | None = None,
                 tools: Mapping[str, str] | None = None, compiled: int = 0, cached: int = 0) -> Prepared[P, F]:
        """The record a language's :meth:`~Language.prepare` returns: its ``front``, the entries
        when planning did not know them, the tools it ran; ``compiled`` / ``cached`` units."""
        record = self._fields()
        if entries is not None:
            record["entries"] = tuple(entries)
        record["tools"] = {**self.tools, **(tools or {})}
        return Prepared(**record, front=front, compiled_units=compiled, cached_units=cached)


@dataclass(frozen=True, kw_only=True)
class Prepared(CrateRecord[P, F]):
    """A crate after its language's front stage (:meth:`Language.prepare`): its entries are known."""

    #: what the language's front stage made
    front: F
    #: front-stage units compiled, and taken from the cache (counted in the build's totals)
    compiled_units: int = 0
    cached_units: int = 0

    def jobs(self, root: Path, targets: list[str]) -> list[CompileJob]:
        return self.language.jobs(self, root, targets)

    def explain(self, error: KhalBuildError) -> KhalBuildError:
        return self.language.explain(self, error)

    def compiled(self, outputs: Mapping[str, CompileOutput]) -> Compiled[P, F]:
        """This crate with the outputs of its compile jobs (target -> output, in job order)."""
        record = self._fields()
        record["outputs"] = dict(outputs)
        return Compiled(**record)


@dataclass(frozen=True, kw_only=True)
class Compiled(Prepared[P, F]):
    """A crate after the compile stage: the outputs of its jobs by target, in job order (none for a
    prebuilt crate: the assemble stage reads its file)."""

    outputs: Mapping[str, CompileOutput] = field(default_factory=dict)

    def finish(self, binary: BinaryInfo) -> CrateParts:
        return self.language.finish(self, binary)


#: language -> "module:attribute" of its Language, imported on first use only.
LANGUAGES: dict[str, str] = {
    "cuda": "hatch_khal.cuda:CUDA",
    "slang": "hatch_khal.slang.language:SLANG",
    "triton": "hatch_khal.triton.language:TRITON",
}


def get_language(name: str, crate: str) -> Language[Any, Any]:
    """The ``Language`` a crate's configuration names (the planning stage's one lookup by name)."""
    try:
        target = LANGUAGES[name]
    except KeyError:
        raise ConfigError(
            f"crate {crate!r}: language {name!r} is not supported by this version of hatch-khal "
            f"(it builds: {', '.join(sorted(LANGUAGES))})"
        ) from None
    module, _, attr = target.partition(":")
    language: Language[Any, Any] = getattr(importlib.import_module(module), attr)
    return language
