"""What the two front-ends share: the hatchling hook (:mod:`hatch_khal.plugin`) and the
setuptools command (:mod:`hatch_khal.setuptools_ext`).

Reporting through the front-end's own display, the default package, the checks on each
crate's ``package`` (a directory inside the project), whether a build needs a compiler at
all, and the one-line summary. Cheap to import: no pydantic, no NVRTC.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from hatch_khal.__about__ import __version__
from hatch_khal.errors import ConfigError

if TYPE_CHECKING:
    from hatch_khal.config import HookConfig, ResolvedCrate
    from hatch_khal.languages import BuildRequirement
    from hatch_khal.model import BuildResult

__all__ = ["CallbackReporter", "all_prebuilt", "build_requirements", "check_packages", "default_package", "runtime_bound",
           "runtime_dependency_problem", "summary"]

class CallbackReporter:
    """A :class:`~hatch_khal.model.Reporter` over three callables (hatchling's
    ``app.display_*``, a setuptools command's ``announce``/``warn``)."""

    def __init__(self, info: Callable[[str], object], warn: Callable[[str], object],
                 debug: Callable[[str], object]) -> None:
        self._info, self._warn, self._debug = info, warn, debug

    def info(self, message: str) -> None:
        self._info(message)

    def warn(self, message: str) -> None:
        self._warn(message)

    def debug(self, message: str) -> None:
        self._debug(message)


def default_package(root: Path, project_name: str) -> str | None:
    """The package directory named after the project (``my-pkg`` -> ``my_pkg`` or ``src/my_pkg``)."""
    name = project_name.replace("-", "_").replace(".", "_").lower()
    if not name:
        return None
    for candidate in (name, f"src/{name}"):
        if (root / candidate / "__init__.py").is_file():
            return candidate
    return None


def check_packages(root: Path, crates: list[ResolvedCrate], where: str) -> None:
    """Each crate's ``package`` is a directory inside the project (also after symlinks): the
    build writes ``<package>/_khal`` and the wheel ships it, so it may point nowhere else. And it
    is named one way (:func:`hatch_khal.config.canonical_package` makes ``./pkg`` ``pkg``): a
    symlink to it, or another spelling of one folder (a case-insensitive file system), is refused,
    or the crates of one package would land in two manifests that overwrite each other."""
    top = root.resolve()
    seen: dict[tuple[int, int], tuple[str, str]] = {}  # (device, inode) -> (package, crate)
    for c in crates:
        path = Path(c.package)
        inside = not path.is_absolute() and ".." not in path.parts and path.parts != ()
        resolved = (top / path).resolve()
        if not inside or resolved == top or top not in resolved.parents:
            raise ConfigError(
                f"{where}: crate {c.name!r}: option 'package' = {c.package!r} must name a package directory "
                f"inside the project ({top}), relative to it (the kernels are written to <package>/_khal "
                "and shipped there)"
            )
        if not resolved.is_dir():
            raise ConfigError(
                f"{where}: crate {c.name!r}: option 'package' = {c.package!r} is not a directory under {root}"
            )
        real = resolved.relative_to(top).as_posix()
        if real != path.as_posix():
            raise ConfigError(
                f"{where}: crate {c.name!r}: option 'package' = {c.package!r} reaches the package directory "
                f"{real!r} through a symlink; name it {real!r}: a package has one name (the build groups the "
                "crates of a package by it, and the wheel ships <package>/_khal under it)"
            )
        st = resolved.stat()
        other = seen.setdefault((st.st_dev, st.st_ino), (c.package, c.name))
        if other[0] != c.package:
            raise ConfigError(
                f"{where}: crate {c.name!r}: option 'package' = {c.package!r} is the directory {other[0]!r} "
                f"(option 'package' of crate {other[1]!r}) spelt another way; spell it {other[0]!r} in both "
                "(the crates of one package share one manifest)"
            )


def all_prebuilt(crates: list[ResolvedCrate]) -> bool:
    """Every crate comes from a ``CUDA_OXIDE_SHADERS_PTX_<CRATE>`` file: no compiler needed."""
    # lazy: importing this module stays cheap (the crates' config module has imported abi already)
    from khal_runtime.abi import prebuilt_env_var

    return bool(crates) and all(os.environ.get(prebuilt_env_var(c.name), "").strip() for c in crates)


def build_requirements(crates: list[ResolvedCrate], hook: HookConfig) -> list[BuildRequirement]:
    """What building ``crates`` needs in the build environment, as their languages say, once each
    (in the crates' order: NVRTC before slangpy for a Slang crate)."""
    from hatch_khal.languages import get_language  # lazy: the languages' modules only when building

    by_language: dict[str, list[ResolvedCrate]] = {}
    for c in crates:
        by_language.setdefault(c.language, []).append(c)
    out: dict[str, BuildRequirement] = {}
    for name, group in by_language.items():
        for r in get_language(name, group[0].name).requirements(group, hook):
            out.setdefault(r.spec, r)
    return list(out.values())


def summary(result: BuildResult) -> str:
    """The build's last line: what it made, and which driver its PTX needs (the newest PTX ISA
    of the build: a driver JITs PTX only up to its own CUDA version)."""
    # lazy: the binary readers' driver table only after a build
    from khal_runtime.binaries import min_driver_for_ptx_isa, ptx_driver_note

    n_crates = sum(len(p.manifest.crates) for p in result.packages)
    n_art = sum(len(c.artifacts) for p in result.packages for c in p.manifest.crates)
    isas = {a.ptx_isa for p in result.packages for c in p.manifest.crates for a in c.artifacts
            if a.kind == "ptx" and a.ptx_isa}
    placed = [(d, isa) for isa in isas if (d := min_driver_for_ptx_isa(isa)) is not None]
    ptx = ""
    if placed:
        _, isa = max(placed)
        ptx = f"; its PTX (ISA {isa}) {ptx_driver_note(isa)} to load where no cubin fits"
    return (f"khal: {n_crates} crate(s), {n_art} artifact(s): {result.compiled} compiled, "
            f"{result.cached} from cache, in {result.seconds:.2f}s{ptx}")


def runtime_dependency_problem(dependencies: list[str] | None) -> tuple[str, str] | None:
    """What is wrong with the runtime requirement among a shader package's ``[project]
    dependencies`` (None: dynamic, not known at build time): ``("error", message)`` for none at
    all (an install of the wheel could not import khal_runtime: the build fails, since pip shows a
    warning only under ``-v``) and for a khal-runtime requirement that excludes the runtime this
    build's manifests are for; ``("warn", message)`` for hatch-khal listed instead (the build
    plugin: it works, through its own dependency on khal-runtime, but installs the build side with
    the package); None when fine.

    A missing requirement is refused rather than added: hatchling's ``prepare_metadata_for_build_wheel``
    (which uv and ``build`` may call) writes the metadata without running build hooks, so a
    requirement only a hook added would be in the wheel and missing from what those resolvers read.
    The lower bound the manifest needs is added to a declared one (:func:`runtime_bound`): the
    declared requirement brings a runtime either way."""
    from packaging.requirements import InvalidRequirement, Requirement  # lazy: only while building
    from packaging.utils import canonicalize_name  # lazy: as above

    from khal_runtime.manifest import runtime_requirement  # lazy: pydantic, only while building

    wanted = runtime_requirement()
    if dependencies is None:
        return None
    reqs = []
    for raw in dependencies:
        try:
            reqs.append(Requirement(raw))
        except InvalidRequirement:
            continue  # hatchling reports it
    runtime = [r for r in reqs if canonicalize_name(r.name) == "khal-runtime"]
    for r in runtime:
        if r.specifier and not r.specifier.contains(__version__, prereleases=True):
            return ("error", f"[project] dependencies require {str(r)!r}, which excludes khal-runtime "
                             f"{__version__}, the runtime of this build (hatch-khal {__version__}): the "
                             f"package's manifests need {wanted}; write \"{wanted}\" instead")
    if runtime:
        return None
    if any(canonicalize_name(r.name) == "hatch-khal" for r in reqs):
        return ("warn", f"khal: [project] dependencies list hatch-khal, the build plugin: an install of this "
                        f"package then installs the build side too. The runtime is khal-runtime: replace "
                        f"\"hatch-khal\" with \"{wanted}\" (hatch-khal stays in [build-system] requires)")
    return ("error", f"[project] dependencies do not list khal-runtime, which loads the kernels at import (an "
                     f"install of this wheel could not import khal_runtime): add \"{wanted}\" to [project] "
                     f"dependencies (hatch-khal stays in [build-system] requires only)")


def runtime_bound(dependencies: list[str] | None, needed: str) -> str | None:
    """``khal-runtime>={needed}`` (the oldest runtime that reads the build's manifests,
    :func:`khal_runtime.manifest.required_runtime`) when the package's declared dependencies do
    not already guarantee it, else None: what the build hook adds to the wheel's requirements, so
    that an older runtime, which a looser declared requirement admits, is never installed with it.

    Guaranteed: a khal-runtime requirement without a marker whose specifier has a lower bound
    (``>=``, ``>``, ``==``, ``~=``, ``===``) at or above ``needed``, since every specifier must
    hold."""
    from packaging.requirements import InvalidRequirement, Requirement  # lazy: only while building
    from packaging.utils import canonicalize_name  # lazy: as above
    from packaging.version import InvalidVersion, Version  # lazy: as above

    floor = Version(needed)
    for raw in dependencies or ():
        try:
            r = Requirement(raw)
        except InvalidRequirement:
            continue
        if canonicalize_name(r.name) != "khal-runtime" or r.marker is not None:
            continue
        for s in r.specifier:
            if s.operator not in (">=", ">", "==", "~=", "==="):
                continue
            try:
                v = Version(s.version.removesuffix(".*"))
            except InvalidVersion:
                continue
            if v >= floor:
                return None
    return f"khal-runtime>={needed}"
