"""The plain data of the build: reporters, compile jobs and outputs, what a language finishes.

Stages (one module each, in this order): :mod:`hatch_khal.plan` (sources, entries,
hashes), :mod:`hatch_khal.compile_stage` (jobs, cache, workers), :mod:`hatch_khal.assemble`
(the manifest), :mod:`hatch_khal.output` (files on disk); :mod:`hatch_khal.builder`
runs them. The per-crate records they hand each other (``Planned``, ``Prepared``,
``Compiled``) are in :mod:`hatch_khal.languages`, beside the ``Language`` they carry.
Nothing here imports a stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from khal_runtime.manifest import Artifact, Entry, GlobalVar, Manifest, TritonCrate

__all__ = [
    "BuildResult",
    "CompileJob",
    "CompileOutput",
    "CompilerIdentity",
    "CoveredFile",
    "CrateParts",
    "PackageOutput",
    "PlannedEntry",
    "PrintReporter",
    "Reporter",
]


class Reporter(Protocol):
    """Where build messages go (hatchling's display, setuptools' log, stdout)."""

    def info(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def debug(self, message: str) -> None: ...


class PrintReporter:
    """Messages on stdout (scripts, benchmarks)."""

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose

    def info(self, message: str) -> None:
        print(message)

    def warn(self, message: str) -> None:
        print(f"warning: {message}")

    def debug(self, message: str) -> None:
        if self.verbose:
            print(message)


@dataclass(frozen=True)
class CompilerIdentity:
    """What names a compiler in cache keys and in the manifest's toolchain."""

    name: str  # "nvrtc"
    #: exact: the release ("13.5.37", the NVRTC wheel's version), not only the minor
    version: str


@dataclass(frozen=True)
class CoveredFile:
    """A file the content hash covers, as it was when hashed: what a compile that read it is
    checked against before its output is cached (:mod:`hatch_khal.reads`)."""

    path: str  # its real path (symlinks resolved)
    key: str  # its key in the content hash (for messages)
    sha256: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class CompileJob:
    """One compile: a translation unit for one target. Picklable (worker processes get it)."""

    crate: str
    #: what comes out: an arch string ("sm_90" -> cubin, "compute_75" -> PTX)
    target: str
    #: name of the compiler in :func:`hatch_khal.compilers.get_compiler`'s registry
    compiler: str
    text: str
    name: str  # the unit's file name in diagnostics
    options: tuple[str, ...]
    #: content-addressed cache key of the output
    key: str
    #: how the CUDA headers were provided (for hints on a missing header)
    header_mode: str = "wheels"
    #: includes CUDA / CCCL headers: seconds per arch, compiled in worker processes
    heavy: bool = False
    #: the files the content hash covers, each with the bytes and stat it was hashed with
    covered: tuple[CoveredFile, ...] = ()
    #: folders whose identity (not their files) is in the key: hatch-khal's include folder, the
    #: CUDA header folders (package versions); real paths
    covered_dirs: tuple[str, ...] = ()
    #: (name, entry hash) of every entry the output must carry (a cache entry that does not is dropped)
    entries: tuple[tuple[str, str], ...] = ()
    #: absolute paths given to the compiler (project root first): an output that spells one of them
    #: (``__FILE__``, line info) is cached for that location only
    locations: tuple[str, ...] = ()
    #: the crate's files use ``__FILE__`` / ``__builtin_FILE`` / ``source_location`` / ``assert(``: an
    #: output may spell the paths of its project side even where the optimiser folded the string
    #: into code (then no scan of the binary finds it): cached for this location only
    names_paths: bool = False


@dataclass(frozen=True)
class CompileOutput:
    data: bytes
    log: str  # warnings (empty when clean)
    seconds: float = 0.0
    cached: bool = False
    #: every file the compiler opened, as it named them; None when it cannot say (then the output
    #: is not cached)
    reads: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PlannedEntry:
    """An entry as the generic stages see it: its name and its entry hash."""

    name: str
    hash: str


@dataclass(frozen=True)
class CrateParts:
    """What a language makes of a crate once one of its CUDA binaries is known
    (:meth:`hatch_khal.languages.Language.finish`): the manifest entries (parameter sizes
    checked against the binary's probes), and any artifacts besides the PTX / cubins."""

    entries: tuple[Entry, ...]
    #: artifacts besides the CUDA binaries (WGSL / SPIR-V of Slang crates)
    artifacts: tuple[Artifact, ...] = ()
    #: package-relative path -> bytes of those artifacts
    files: dict[str, bytes] = field(default_factory=dict)
    #: what is worth saying about them (shown by the builder)
    warnings: tuple[str, ...] = ()
    #: the crate's module globals (``__constant__`` / ``__device__`` variables, from its PTX)
    globals: tuple[GlobalVar, ...] = ()
    #: a Triton crate's own facts (``Crate.triton``: ``jit-fallback``, the library a companion serves)
    triton: TritonCrate | None = None


@dataclass
class PackageOutput:
    package: str  # package directory relative to the project root
    manifest: Manifest
    #: package-relative POSIX path -> bytes (the manifest included)
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class BuildResult:
    packages: list[PackageOutput]
    compiled: int = 0
    cached: int = 0
    seconds: float = 0.0
