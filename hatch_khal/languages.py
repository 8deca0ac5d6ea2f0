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
from typing import TYPE_CHECKING, Any, Callable, Generic, Protocol, TypeVar

from hatch_khal.errors import ConfigError, KhalBuildError
from hatch_khal.model import CompileJob, CompileOutput, CrateParts, PlannedEntry, Reporter

if TYPE_CHECKING:
    from hatch_khal.config import CrateConfig, HookConfig, ResolvedCrate
    from khal_runtime.binaries import BinaryInfo
    from khal_runtime.manifest import Crate, Entry, SpirvStatus

    from hatch_khal.cache import Cache
    from hatch_khal.sources import SourceFile

__all__ = ["ENTRY_POINT_GROUP", "LANGUAGES", "BuildRequirement", "Compiled", "CrateRecord", "Language",
           "LanguageBase", "Planned", "Prepared", "StubMember", "all_languages", "get_language"]

#: what a language's planning found of a crate (its own type: ``CudaPlan``, ``SlangCratePlan``, ...)
P = TypeVar("P")
#: what a language's front stage made of a crate (``CudaFront``, ``SlangFront``, ``TritonFront``)
F = TypeVar("F")


@dataclass(frozen=True)
class BuildRequirement:
    """A package a language's crates need in the build environment: the hatch hook adds ``spec``
    to an isolated build; setuptools, which cannot add requirements, runs ``probe`` and says what to
    list in ``[build-system] requires`` when it fails."""

    #: a PEP 508 requirement ("triton==3.6.0")
    spec: str
    #: () -> None when the tool is usable here, else why not (the first line of the error)
    probe: Callable[[], str | None] | None = None
    #: the tool's name in "list ... in the project's pyproject.toml" ("the compiler", "Triton")
    label: str = "it"
    #: the requirements the error's ``[build-system] requires = [...]`` example lists besides
    #: setuptools and hatch-khal (default: ``spec`` alone)
    example: tuple[str, ...] = ()
    #: said when the installed version does not satisfy ``spec`` (default: the spec)
    note: str | None = None
    #: whether setuptools checks it before the build (header wheels are only named after a failure)
    checked_by_setuptools: bool = True


@dataclass(frozen=True)
class StubMember:
    """One attribute of a crate's typed ``kernels`` stub that is not one of its entries as a
    ``Kernel`` (a Triton instance family, a kernel's own call)."""

    name: str
    #: the attribute's type: a name ``Language.stub_imports`` imports
    type: str
    doc: tuple[str, ...] = ()
    #: reachable as ``kernels[name]`` too (``KernelSet.__getitem__``)
    item: bool = True


class Language(Protocol[P, F]):
    """A kernel language's build side. Found by name (:func:`get_language`) among the built-ins
    and the entry points of the group ``hatch_khal.languages``; :class:`LanguageBase` gives the
    defaults of everything but the stages."""

    name: str
    #: its name in messages ("CUDA C++", "Slang", "Triton")
    title: str
    #: the source suffixes that make a crate of this language (".slang"); a crate may also say
    #: ``language = "<name>"``
    suffixes: tuple[str, ...]
    #: the language-specific crate options it takes (``spirv``, ``instances``, ... and its own, which
    #: :meth:`validate_options` checks); another language's option on its crate is refused
    crate_options: frozenset[str]
    #: what makes its CUDA binaries, for ``inspect`` ("NVRTC", "Triton (its ptxas)")
    compiled_by: str
    #: the compiler (hatch_khal.compilers registry name) whose archs bound this language's targets
    compiler: str

    def check_crate(self, prefix: str, crate: CrateConfig) -> None:
        """Refuse, with a ConfigError starting with ``prefix``, a crate option this language cannot
        honour that the generic checks let through (CUDA C++: ``spirv = true``)."""
        ...

    def validate_options(self, prefix: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """The language's own crate options (keys of :attr:`crate_options` that hatch-khal does not
        know), validated: ``ResolvedCrate.language_options``. ConfigError naming the option."""
        ...

    def requirements(self, crates: Sequence[ResolvedCrate], hook: HookConfig) -> list[BuildRequirement]:
        """What building ``crates`` (all of this language) needs in the build environment."""
        ...

    def stub_members(self, crate: Crate) -> list[StubMember] | None:
        """The crate's attributes in the typed stub when they are not its entries as ``Kernel`` s
        (None: one typed ``Kernel`` class per entry)."""
        ...

    #: (module, name) of each type :meth:`stub_members` names
    stub_imports: tuple[tuple[str, str], ...]

    def inspect_entry(self, entry: Entry) -> tuple[str | None, list[str]]:
        """For ``python -m hatch_khal inspect``: what the entry is (shown as ``entry <name> = <it>``;
        None: the generic line) and lines to print below it."""
        ...

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


class LanguageBase:
    """The defaults of a :class:`Language`'s non-stage members: a language that takes no options of
    its own, needs nothing in the build environment and whose entries are typed ``Kernel`` s."""

    name: str
    title: str = ""
    suffixes: tuple[str, ...] = ()
    crate_options: frozenset[str] = frozenset()
    compiled_by: str = "NVRTC"
    stub_imports: tuple[tuple[str, str], ...] = ()

    def check_crate(self, prefix: str, crate: CrateConfig) -> None:
        return None

    def validate_options(self, prefix: str, options: Mapping[str, Any]) -> dict[str, Any]:
        if options:
            raise ConfigError(f"{prefix}: unknown option(s) {', '.join(map(repr, sorted(options)))} for a "
                              f"{self.title or self.name} crate")
        return {}

    def requirements(self, crates: Sequence[ResolvedCrate], hook: HookConfig) -> list[BuildRequirement]:
        return []

    def stub_members(self, crate: Crate) -> list[StubMember] | None:
        return None

    def inspect_entry(self, entry: Entry) -> tuple[str | None, list[str]]:
        return None, []


#: the entry-point group a third-party language registers in (``name = "module:attribute"`` of
#: its Language object; hatchling's own plugin model)
ENTRY_POINT_GROUP = "hatch_khal.languages"

#: the built-in languages: name -> "module:attribute" of its Language, imported on first use only.
#: Also hatch-khal's own entry points (pyproject.toml); this table serves a source checkout.
LANGUAGES: dict[str, str] = {
    "cuda": "hatch_khal.cuda:CUDA",
    "slang": "hatch_khal.slang.language:SLANG",
    "triton": "hatch_khal.triton.language:TRITON",
}

#: the members every Language has (checked when one is loaded, as pluggy checks a plugin when it
#: is registered, not at its first call)
_MEMBERS = ("name", "title", "suffixes", "crate_options", "compiled_by", "compiler", "plan", "prepare", "jobs",
            "explain", "finish", "check_crate", "validate_options", "requirements", "stub_members", "stub_imports",
            "inspect_entry")
_loaded: dict[str, Language[Any, Any]] = {}


def _entry_points() -> dict[str, Any]:
    """The installed distributions' languages by name (not the built-ins)."""
    from importlib.metadata import entry_points  # lazy: only builds ask for languages

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in LANGUAGES}


def _load(name: str, target: str, where: str) -> Language[Any, Any]:
    module, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise ConfigError(f"language {name!r} ({where}: {target}) could not be loaded: "
                          f"{type(exc).__name__}: {exc}") from exc
    missing = [m for m in _MEMBERS if not hasattr(obj, m)]
    if missing:
        raise ConfigError(f"language {name!r} ({where}: {target}) is not a hatch-khal Language: it has no "
                          f"{', '.join(missing)} (subclass hatch_khal.languages.LanguageBase for the defaults)")
    if obj.name != name:
        raise ConfigError(f"language {name!r} ({where}: {target}) calls itself {obj.name!r}: register it under "
                          "its own name")
    return obj  # type: ignore[no-any-return]


def all_languages() -> dict[str, Language[Any, Any]]:
    """Every language this build can use: the built-ins, then the installed plugins by name."""
    for name in LANGUAGES:
        get_language(name, "")
    for name, ep in _entry_points().items():
        if name not in _loaded:
            _loaded[name] = _load(name, ep.value, f"entry point of {ep.dist.name if ep.dist else '?'}")
    return dict(_loaded)


def get_language(name: str, crate: str) -> Language[Any, Any]:
    """The ``Language`` a crate's configuration names (the planning stage's one lookup by name)."""
    language = _loaded.get(name)
    if language is not None:
        return language
    target = LANGUAGES.get(name)
    if target is not None:
        language = _load(name, target, "built in")
    else:
        ep = _entry_points().get(name)
        if ep is None:
            raise ConfigError(
                f"crate {crate!r}: language {name!r} is not supported by this version of hatch-khal "
                f"(it builds: {', '.join(sorted(set(LANGUAGES) | set(_entry_points())))}; a plugin adds one "
                f"through the entry-point group {ENTRY_POINT_GROUP!r})"
            )
        language = _load(name, ep.value, f"entry point of {ep.dist.name if ep.dist else '?'}")
    _loaded[name] = language
    return language
