"""The setuptools front-end: a ``build_khal`` command, a thin adapter over the shared build core.

Registered through two entry points (see hatch-khal's ``pyproject.toml``):

* ``distutils.commands``: ``build_khal`` -> :class:`BuildKhal`;
* ``setuptools.finalize_distribution_options``: :func:`finalize_distribution_options`,
  which adds ``build_khal`` to ``build``'s sub-commands (after ``build_py``), so it runs in
  every ``build`` (``pip wheel``, ``python -m build``, ``bdist_wheel``) and in setuptools'
  PEP 660 editable builds (``editable_wheel`` runs the same sub-commands).

The configuration is the ``[tool.khal]`` table of ``pyproject.toml`` (same keys as the
hatchling hook table; ``parse_config`` validates both). Being installed, this plugin fires
for *every* setuptools build in the environment: a project without ``[tool.khal]`` costs one
read of its ``pyproject.toml`` and nothing else (no pydantic, no NVRTC, no cuda import).

setuptools cannot add build requirements: NVRTC (and, for Slang crates, ``slangpy``) must be in
the project's ``[build-system] requires``; the command says so when they are missing.

Wheel builds write ``<package>/_khal/`` under ``build_lib`` (source layouts mapped through
``package_dir``); editable builds write it into the source package in place, with the
manifest's ``editable`` record, exactly as the hatchling hook does.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from setuptools import Command

from khal_runtime.errors import EnvVarError  # dependency-free, cheap

from hatch_khal.errors import ConfigError, KhalBuildError  # dependency-free, cheap
from hatch_khal.frontend import (  # cheap
    CallbackReporter, check_packages, default_package, runtime_bound, runtime_dependency_problem,
    summary,
)

if TYPE_CHECKING:
    from setuptools.dist import Distribution

    from hatch_khal.config import HookConfig, ResolvedCrate
    from hatch_khal.model import BuildResult

__all__ = ["BuildKhal", "finalize_distribution_options", "read_khal_table"]

COMMAND = "build_khal"
_TABLE = "[tool.khal]"
_MANIFEST_DIR = "_khal"  # khal_runtime.manifest.MANIFEST_DIR, without importing pydantic here


def _project_root(dist: Distribution) -> Path:
    return Path(getattr(dist, "src_root", None) or os.curdir).resolve()


def read_khal_table(dist: Distribution) -> dict[str, Any] | None:
    """``[tool.khal]`` of the project's ``pyproject.toml``, or None when there is none.

    Read once per distribution: ``build`` asks its sub-command predicates several times.
    """
    cached = dist.__dict__.get("_khal_table", _UNREAD)
    if cached is _UNREAD:
        cached = _read(_project_root(dist))
        dist.__dict__["_khal_table"] = cached
    return cached  # type: ignore[no-any-return]


_UNREAD = object()


def _read(root: Path) -> dict[str, Any] | None:
    path = root / "pyproject.toml"
    try:
        raw = path.read_bytes()
    except OSError:
        return None  # setup.py-only project: nothing to do
    if b"khal" not in raw:  # the common case for every other setuptools project: no TOML parse
        return None
    # lazy: a TOML parse only for a pyproject.toml that mentions khal
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib  # lazy, as above
    data = tomllib.loads(raw.decode("utf-8"))
    tool = data.get("tool", {})
    table = tool.get("khal")
    if table is None:
        hatch = _hatch_khal_table(data)
        if hatch is not None:
            # pip shows a build backend's warnings only with -v: a wheel without its kernels would
            # pass in silence (and fail at import), so this is an error
            raise ConfigError(
                f"{path} has {hatch} but no {_TABLE}, and this is a setuptools build: the setuptools "
                f"command reads {_TABLE} only (the hatch table is for the hatchling backend), so no kernels "
                f"would be built; name the table {_TABLE} (same keys; its crates [[tool.khal.crates]]), or "
                'build with hatchling (build-backend = "hatchling.build")'
            )
        misspelt = _misspelt_khal_table(data)
        if misspelt is not None:
            raise ConfigError(
                f"{path} has {misspelt} but no {_TABLE}, and this is a setuptools build: hatch-khal reads "
                f"{_TABLE} only, so no kernels would be built; name the table {_TABLE}"
            )
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {_TABLE} must be a table")
    return table


def _hatch_khal_table(data: dict[str, Any]) -> str | None:
    """The hatchling hook table of khal in a pyproject, if any, as written (``[tool.hatch...khal]``);
    None also when the project's backend is hatchling (then this setuptools run is not its build)."""
    backend = data.get("build-system", {}).get("build-backend", "")
    if isinstance(backend, str) and backend.startswith("hatchling"):
        return None
    build = data.get("tool", {}).get("hatch", {}).get("build", {})
    if not isinstance(build, dict):
        return None
    if isinstance(build.get("hooks"), dict) and "khal" in build["hooks"]:
        return "[tool.hatch.build.hooks.khal]"
    targets = build.get("targets", {})
    for target, config in sorted(targets.items() if isinstance(targets, dict) else []):
        if isinstance(config, dict) and isinstance(config.get("hooks"), dict) and "khal" in config["hooks"]:
            return f"[tool.hatch.build.targets.{target}.hooks.khal]"
    return None


def _misspelt_khal_table(data: dict[str, Any]) -> str | None:
    """A ``[tool.<name>]`` table whose name says khal but is not ``khal`` (``hatch-khal``, ``khal-hook``,
    ``Khal``), if any; None also when the project's backend is hatchling."""
    backend = data.get("build-system", {}).get("build-backend", "")
    if isinstance(backend, str) and backend.startswith("hatchling"):
        return None
    tool = data.get("tool", {})
    names = sorted(k for k in (tool if isinstance(tool, dict) else {}) if "khal" in k.lower() and k != "khal")
    return f"[tool.{names[0]}]" if names else None


def _has_khal(cmd: Command) -> bool:
    """The ``build`` sub-command predicate: only projects with ``[tool.khal]``."""
    return read_khal_table(cmd.distribution) is not None


def finalize_distribution_options(dist: Distribution) -> None:
    """Make ``build`` (and so ``editable_wheel``) run ``build_khal`` when configured.

    Also where a configuration that setuptools would ignore (a hatch hook table without
    ``[tool.khal]``) is refused: this runs in every setuptools build (sdist, wheel, editable)."""
    try:
        read_khal_table(dist)
    except KhalBuildError as exc:
        raise _setup_error(_block(dist, exc)) from exc
    build = dist.get_command_class("build")
    if COMMAND not in {name for name, _ in build.sub_commands}:
        build.sub_commands.append((COMMAND, _has_khal))


class BuildKhal(Command):  # type: ignore[misc]  # setuptools ships no type information
    """Compile the ``[tool.khal]`` kernel crates (build_lib, or in place for editable builds)."""

    command_name = COMMAND  # what setuptools' warnings call it
    description = "compile kernel crates from [tool.khal] to PTX/cubins with NVRTC (hatch-khal)"
    user_options: ClassVar[list[tuple[str, str | None, str]]] = [
        ("build-lib=", "b", "directory to write the kernels into (default: build's build-lib)"),
    ]

    build_lib: str | None
    editable_mode: bool

    def initialize_options(self) -> None:
        self.build_lib = None
        self.editable_mode = False  # set by setuptools' editable_wheel (PEP 660)
        self._outputs: list[str] = []

    def finalize_options(self) -> None:
        self.set_undefined_options("build", ("build_lib", "build_lib"))

    # -- configuration -------------------------------------------------------

    def _config(self, root: Path) -> tuple[HookConfig, list[ResolvedCrate]] | None:
        table = read_khal_table(self.distribution)
        if table is None:
            return None
        from hatch_khal.config import parse_config  # lazy: pydantic, only for projects with [tool.khal]

        where = f"{_TABLE} (setuptools command {COMMAND})"
        name = self.distribution.get_name() or ""
        hook, crates = parse_config(table, default_package=default_package(root, name), where=where)
        check_packages(root, crates, where)
        return hook, crates

    def _dist_package(self, root: Path, package: str) -> str:
        """The import path (``a/b``) of the distribution package whose source directory is ``package``."""
        build_py = self.get_finalized_command("build_py")
        want = (root / package).resolve()
        names: list[str] = list(self.distribution.packages or [])
        for name in names:
            if (root / build_py.get_package_dir(name)).resolve() == want:
                return name.replace(".", "/")
        raise ConfigError(
            f"{_TABLE}: package directory {package!r} is not one of the distribution's packages "
            f"({', '.join(sorted(names)) or 'none'}); list it in [tool.setuptools] packages "
            "(or set `package` in [tool.khal] to a directory that is one)"
        )

    # -- setuptools API --------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except (KhalBuildError, EnvVarError) as exc:
            # setuptools reports its own errors as "error: ..." without a traceback: the block
            # (hatch_khal.report) is that message
            raise _setup_error(_block(self.distribution, exc)) from exc

    def _run(self) -> None:
        root = _project_root(self.distribution)
        parsed = self._config(root)
        if parsed is None:
            return
        hook, crates = parsed
        # lazy: the build core (pydantic, NVRTC) only for projects with [tool.khal]
        from hatch_khal.builder import build_packages, write_package_output

        # where each package's kernels go in build_lib: checked before anything is compiled
        assert self.build_lib is not None
        dests = {c.package: Path(self.build_lib) / self._dist_package(root, c.package) for c in crates}
        reporter = CallbackReporter(lambda m: self.announce(m, level=logging.INFO), self.warn,
                                    lambda m: self.announce(m, level=logging.DEBUG))
        declared = [str(r) for r in self.distribution.install_requires or ()]
        problem = runtime_dependency_problem(declared)
        if problem is not None and problem[0] == "error":
            raise ConfigError(f"[tool.khal]: {problem[1]}")
        if problem is not None:
            reporter.warn(problem[1])
        from hatch_khal.nvrtc import requirement as nvrtc_requirement  # lazy: only for [tool.khal] projects

        # NVRTC chosen by (and checked against) nvrtc-requirement, also in the compile workers
        with nvrtc_requirement(hook.nvrtc_requirement):
            self._check_requirements(hook, crates)
            try:
                result = build_packages(root, crates, reporter, editable=self.editable_mode,
                                        cache_url=hook.cache_url)
            except KhalBuildError as exc:
                raise type(exc)(f"{exc}{self._header_note(hook, crates)}") from exc
        _check_runtime_bound(declared, result)
        for out in result.packages:
            if self.editable_mode:
                # In place: lenient editable installs (the default) import the source package.
                write_package_output(out, root / out.package)
                reporter.info(f"khal: editable install: kernels written to {out.package}/{_MANIFEST_DIR}/")
            # build_lib: the wheel; for editable builds, what strict mode copies into its link tree
            # (copies, not links: the runtime refuses artifacts that resolve outside the package)
            self._outputs.extend(str(p) for p in write_package_output(out, dests[out.package]))
        reporter.info(summary(result))

    def get_outputs(self) -> list[str]:
        return list(self._outputs)

    def get_output_mapping(self) -> dict[str, str]:
        return {}  # nothing in build_lib stands for a source file

    def get_source_files(self) -> list[str]:
        return []

    # -- helpers -------------------------------------------------------------

    def _check_requirements(self, hook: HookConfig, crates: list[ResolvedCrate]) -> None:
        """setuptools has no way to add build requirements: what the crates' languages need (NVRTC,
        the Slang compiler, Triton) must be in ``build-system.requires``; each is probed here."""
        from hatch_khal.frontend import build_requirements  # lazy: the languages, only for [tool.khal] projects

        for req in build_requirements(crates, hook):
            if not req.checked_by_setuptools:
                continue
            problem = req.probe() if req.probe is not None else None
            if problem is not None:
                requires = ", ".join(f'"{r}"' for r in ("setuptools>=70", "hatch-khal", *(req.example or (req.spec,))))
                raise ConfigError(
                    f"{problem}\nsetuptools cannot add build requirements: list {req.label} in the project's "
                    f"pyproject.toml, e.g. [build-system] requires = [{requires}]")
            self._warn_unmet_requirement(req.spec, req.note)

    def _header_note(self, hook: HookConfig, crates: list[ResolvedCrate]) -> str:
        """After a failed build: the CUDA header wheels the hatch hook would have added, if absent."""
        # lazy: only after a failed build
        from importlib.metadata import PackageNotFoundError, version

        from packaging.requirements import Requirement  # lazy: only after a failed build

        from hatch_khal.headers import header_requirements  # lazy: only after a failed build

        if not any(c.cuda_headers == "wheels" for c in crates):
            return ""
        missing, wanted = [], []
        for req in header_requirements(hook.nvrtc_requirement):  # the wheels of NVRTC's CUDA major
            pkg = Requirement(req).name
            try:
                version(pkg)
            except PackageNotFoundError:
                missing.append(pkg)
                wanted.append(req)
        if not missing:
            return ""
        return (
            f"\nnote: setuptools builds get no CUDA header wheels of their own ({', '.join(missing)} "
            f"missing here); if the kernels include CUDA/CCCL headers, add {', '.join(map(repr, wanted))} "
            "to [build-system] requires"
        )

    def _warn_unmet_requirement(self, requirement: str, what: str | None = None) -> None:
        # lazy: only when this project builds kernels
        from importlib.metadata import PackageNotFoundError, version

        from packaging.requirements import Requirement

        req = Requirement(requirement)
        try:
            have = version(req.name)
        except PackageNotFoundError:
            return  # NVRTC found some other way (a toolkit on the library path)
        if not req.specifier.contains(have, prereleases=True):
            self.warn(
                f"{what or f'{_TABLE} nvrtc-requirement is {requirement!r}'} but {req.name} {have} is installed; "
                "setuptools does not install it for you: pin it in [build-system] requires"
            )


def _check_runtime_bound(declared: list[str], result: BuildResult) -> None:
    """The package's declared requirement admits only runtimes that read its manifests: the hatchling
    hook adds the lower bound to the wheel itself, setuptools cannot (pip asks it for the wheel's
    metadata before the build runs), so a requirement that admits an older runtime is refused with
    the line to write."""
    from packaging.version import Version  # lazy: only after a build

    from khal_runtime.manifest import required_runtime  # lazy: pydantic, only after a build

    if not result.packages:
        return
    needed = max((required_runtime(p.manifest) for p in result.packages), key=Version)
    bound = runtime_bound(declared, needed)
    if bound is not None:
        raise ConfigError(
            f"{_TABLE}: the manifest of this build needs {bound} (an older runtime refuses it at import), and "
            f"[project] dependencies ({', '.join(repr(d) for d in declared) or 'none'}) admit an older one; "
            f"setuptools writes the wheel's requirements before the kernels are built, so hatch-khal cannot add "
            f"the bound as it does under hatchling: write \"{bound}\" in [project] dependencies")


def _block(dist: Distribution, exc: BaseException) -> str:
    """The failed build's block (:func:`hatch_khal.report.error_block`), for setuptools' ``error:`` line."""
    from hatch_khal.report import error_block  # lazy: only on failure

    root = _project_root(dist)
    # setuptools prints "error: <this>" and no traceback, unless its own DISTUTILS_DEBUG is set
    return "\n" + error_block(exc, dist.get_name() or root.name,
                              f"{root / 'pyproject.toml'}, {_TABLE} (setuptools command {COMMAND})",
                              debug="DISTUTILS_DEBUG=1 (setuptools' variable)")


def _setup_error(message: str) -> Exception:
    from setuptools.errors import SetupError  # lazy: only on failure

    error: Exception = SetupError(message)
    return error
