"""The hatchling build hook ``khal``: compile kernel crates into the wheel.

Enable it with ``hatch-khal`` in ``build-system.requires`` and a
``[tool.hatch.build.targets.wheel.hooks.khal]`` table (see docs/reference/options.md for the
options). Standard wheels get the artifacts through ``force_include`` from a
staging directory (removed in ``finalize``, or at once if the build fails); editable
wheels do not carry artifacts, so those builds write them into the package in place,
where the runtime finds them at import.

The build itself is :func:`hatch_khal.builder.build_packages`; what this hook shares with
the setuptools command is in :mod:`hatch_khal.frontend`.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from contextlib import AbstractContextManager
from functools import cached_property
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

from khal_runtime.manifest import MANIFEST_DIR

from hatch_khal.builder import build_packages
from hatch_khal.config import HookConfig, ResolvedCrate, parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.frontend import (CallbackReporter, build_requirements, check_packages, default_package,
                                 runtime_bound, runtime_dependency_problem, summary)
from hatch_khal.model import BuildResult
from hatch_khal.nvrtc import requirement as nvrtc_requirement
from hatch_khal.output import remove_output, write_package_output
from hatch_khal.remote import cache_url
from hatch_khal.stores import requirements as store_requirements
from hatch_khal.report import reported

__all__ = ["KhalBuildHook"]


class KhalBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "khal"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._staging: Path | None = None
        #: ``_khal`` folders an editable build wrote in place, removed again unless the build
        #: reaches ``finalize`` (hatchling calls no hook when the build fails after ``initialize``)
        self._in_place: list[Path] = []

    # -- configuration: each accessor names the hook (and the option) in its errors --------

    @cached_property
    def where(self) -> str:
        return f"build hook `{self.PLUGIN_NAME}` (tool.hatch.build.targets.{self.target_name}.hooks.khal)"

    @cached_property
    def _parsed(self) -> tuple[HookConfig, list[ResolvedCrate]]:
        self._check_table()
        name = self.metadata.core.raw_name
        return parse_config(self.config, default_package=default_package(Path(self.root), name), where=self.where)

    @cached_property
    def hook_config(self) -> HookConfig:
        return self._parsed[0]

    @cached_property
    def crates(self) -> list[ResolvedCrate]:
        """The resolved crates; option `package` of each checked to be a directory in the project."""
        crates = self._parsed[1]
        check_packages(Path(self.root), crates, self.where)
        return crates

    @cached_property
    def reporter(self) -> CallbackReporter:
        return CallbackReporter(self.app.display_info, self.app.display_warning, self.app.display_debug)

    # -- hatchling API: each step reports a build error as one block and exits (hatch_khal.report) --

    def _reported(self) -> AbstractContextManager[None]:
        name = getattr(getattr(self.metadata, "core", None), "raw_name", None) or Path(self.root).name
        return reported(name, f"{Path(self.root) / 'pyproject.toml'}, {self.where}")

    def dependencies(self) -> list[str]:
        with self._reported():
            return self._dependencies()

    def clean(self, versions: list[str]) -> None:
        with self._reported():
            self._clean(versions)

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        with self._reported():
            self._initialize(version, build_data)

    def _dependencies(self) -> list[str]:
        crates = self._parsed[1]
        # each language says what its crates need (NVRTC only to compile: none for prebuilt crates;
        # Triton compiles with its own ptxas; Slang runs for a prebuilt Slang crate too)
        deps = [r.spec for r in build_requirements(crates, self.hook_config)]
        # the shared build cache's client (boto3 for s3://), for the URL the build will use
        deps += store_requirements(cache_url(self.hook_config.cache_url)[0])
        return deps

    def _clean(self, versions: list[str]) -> None:  # noqa: ARG002
        for c in self.crates:
            remove_output(Path(self.root) / c.package)  # ours only: anything else is refused

    def _initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._check_table()
        if self.target_name != "wheel":
            raise ConfigError(
                f"build hook `{self.PLUGIN_NAME}` runs for wheels only; configure it under "
                "[tool.hatch.build.targets.wheel.hooks.khal], not the "
                f"{self.target_name} target (kernel sources travel in the sdist as plain files)"
            )
        crates = self.crates  # the configuration's errors first
        self._check_runtime_dependency()
        editable = version == "editable"
        if editable:
            self._check_editables()
        # NVRTC chosen by (and checked against) nvrtc-requirement, also in the compile workers
        with nvrtc_requirement(self.hook_config.nvrtc_requirement):
            result = build_packages(Path(self.root), crates, self.reporter, editable=editable,
                                    cache_url=self.hook_config.cache_url)
        if editable:
            atexit.register(self._undo_in_place)
            try:
                for out in result.packages:
                    target = Path(self.root) / out.package
                    write_package_output(out, target)
                    self._in_place.append(target)
                    self.reporter.info(f"khal: editable install: kernels written to {out.package}/{MANIFEST_DIR}/")
            except BaseException:
                self._undo_in_place()
                raise
        else:
            self._stage(result, build_data)
        self._require_runtime(result, build_data)
        self.reporter.info(summary(result))

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:  # noqa: ARG002
        self._in_place = []  # the editable wheel was built: its in-place kernels stay
        atexit.unregister(self._undo_in_place)
        self._cleanup()

    # -- helpers -------------------------------------------------------------

    def _check_table(self) -> None:
        """The hook runs for wheels only, so it is configured for the wheel target: a table for
        every target ([tool.hatch.build.hooks.khal]) builds the wheel but fails the sdist (so
        `python -m build` fails where `pip wheel` passes). Refused in every build, naming the table."""
        build = getattr(self.build_config, "build_config", None)  # None: a hook made outside hatchling
        hooks = build.get("hooks") if isinstance(build, dict) else None
        if isinstance(hooks, dict) and self.PLUGIN_NAME in hooks:
            raise ConfigError(
                f"build hook `{self.PLUGIN_NAME}` is configured in [tool.hatch.build.hooks.khal], which applies "
                "to every target (the sdist too), and it runs for wheels only: name the table "
                "[tool.hatch.build.targets.wheel.hooks.khal] (same keys; its crates "
                "[[tool.hatch.build.targets.wheel.hooks.khal.crates]])"
            )

    def _check_runtime_dependency(self) -> None:
        """The package's dependencies name khal-runtime (``runtime_dependency_problem``); dynamic
        ones too, which hatchling's metadata hooks have filled in by now (None: a hook made
        outside hatchling, without project metadata)."""
        deps = getattr(self.metadata.core, "dependencies", None)
        problem = runtime_dependency_problem(None if deps is None else list(deps))
        if problem is None:
            return
        kind, message = problem
        if kind == "error":
            raise ConfigError(f"{self.where}: {message}")
        self.reporter.warn(message)

    def _require_runtime(self, result: BuildResult, build_data: dict[str, Any]) -> None:
        """Add the oldest khal-runtime that reads this build's manifests to the wheel's requirements
        (hatchling writes ``build_data["dependencies"]`` into the wheel's METADATA, editable wheels'
        too), unless the declared dependencies already require it: a package declaring
        ``khal-runtime>=0.1.0`` whose manifest needs 0.2.0 then requires both, and no older runtime
        is installed with it to refuse the manifest at import."""
        # lazy: the manifest's model (pydantic) only after a build
        from khal_runtime.manifest import required_runtime

        if not result.packages:
            return
        from packaging.version import Version  # lazy: only while building

        needed = max((required_runtime(p.manifest) for p in result.packages), key=Version)
        deps = getattr(self.metadata.core, "dependencies", None)
        bound = runtime_bound(None if deps is None else list(deps), needed)
        if bound is not None:
            build_data.setdefault("dependencies", []).append(bound)
            self.reporter.info(f"khal: the wheel requires {bound}, the oldest runtime that reads its manifest")

    def _check_editables(self) -> None:
        """hatchling's editable wheel (without ``dev-mode-dirs``) imports ``editables`` after the
        hooks ran: a missing one would fail the build with a traceback after the kernels were
        compiled and written in place. Said first, with what to install."""
        if getattr(self.build_config, "dev_mode_dirs", None):
            return
        try:
            missing = importlib.util.find_spec("editables") is None
        except ImportError:
            missing = True
        if missing:
            raise ConfigError(
                "an editable install needs the `editables` package in the build environment, and it is "
                "not installed here (a build without isolation uses this environment): pip install "
                "\"hatch-khal[build]\" (which has it) or pip install editables")

    def _undo_in_place(self) -> None:
        """Remove what this editable build wrote in place: the build failed after ``initialize``."""
        for target in self._in_place:
            try:
                remove_output(target)
            except Exception:  # noqa: BLE001 - never mask the build's own error
                pass
        self._in_place = []

    def _stage(self, result: BuildResult, build_data: dict[str, Any]) -> None:
        """Write each package's kernels to a staging directory and hand every file to hatchling
        through ``build_data["force_include"]``, file by file: a forced file takes precedence over
        a project file at its path (hatchling's documented rule for conflicts), so kernels an
        editable build left in the source tree under the same names never reach the wheel."""
        self._staging = Path(tempfile.mkdtemp(prefix="hatch-khal-"))
        try:
            for out in result.packages:
                write_package_output(out, self._staging / out.package)
                dist_dir = self.build_config.get_distribution_path(out.package)
                staged = self._staging / out.package / MANIFEST_DIR
                files = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
                self._check_in_place_output(out.package, set(files))
                for rel in files:
                    build_data["force_include"][str(staged / rel)] = f"{dist_dir}/{MANIFEST_DIR}/{rel}"
                if not (Path(self.root) / out.package / "py.typed").exists():
                    # PEP 561: type checkers read the generated _khal/__init__.pyi of an installed
                    # package only with a py.typed marker (pyright reads it regardless)
                    marker = self._staging / f"{out.package.replace('/', '_')}.py.typed"
                    marker.write_bytes(b"")
                    build_data["force_include"][str(marker)] = f"{dist_dir}/py.typed"
        except BaseException:
            self._cleanup()
            raise

    def _check_in_place_output(self, package: str, staged: set[str]) -> None:
        """A previous editable build left kernels in the source tree (``<package>/_khal/``): those
        this build writes too are replaced in the wheel (:meth:`_stage`); any other would be
        shipped beside them (a hook cannot leave a project file out of a wheel through hatchling's
        public API), so such a build is refused, naming the files and what to do. Nothing to do
        when the project's own configuration excludes the folder."""
        in_place = Path(self.root) / package / MANIFEST_DIR
        if not in_place.is_dir():
            return
        rel = f"{package}/{MANIFEST_DIR}/"
        if self.build_config.path_is_excluded(rel):
            return
        left = sorted(p.relative_to(in_place).as_posix() for p in in_place.rglob("*")
                      if p.is_file() and p.relative_to(in_place).as_posix() not in staged)
        if left:
            shown = ", ".join(f"{rel}{f}" for f in left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            raise ConfigError(
                f"{rel} holds kernels an editable install wrote in place that this wheel's build does not "
                f"write ({shown}), and they would be shipped in the wheel: rebuild the editable install "
                f"(pip install -e .), or remove {rel} (the editable install then needs that rebuild), or "
                f'leave the folder out of wheels: exclude = ["/{rel}"] under '
                "[tool.hatch.build.targets.wheel] (the hook adds its own kernels regardless)")
        self.reporter.debug(f"khal: the in-place {rel} of an editable build is replaced in the wheel by this build's")

    def _cleanup(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
