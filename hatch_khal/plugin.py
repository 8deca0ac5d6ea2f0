"""The hatchling build hook ``khal``: compile kernel crates into the wheel.

Enable it with ``hatch-khal`` in ``build-system.requires`` and a
``[tool.hatch.build.targets.wheel.hooks.khal]`` table (see the README for the
options). Standard wheels get the artifacts through ``force_include`` from a
staging directory (removed in ``finalize``); editable wheels do not carry
artifacts, so those builds write them into the package in place, where the
runtime finds them at import.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

from khal_runtime.manifest import MANIFEST_DIR

from hatch_khal.builder import BuildResult, build_packages, write_package_output
from hatch_khal.config import HookConfig, ResolvedCrate, env_var_for_crate, parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.headers import header_requirements

__all__ = ["KhalBuildHook"]


class _AppReporter:
    """Build messages through hatchling's display functions."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def info(self, message: str) -> None:
        self.app.display_info(message)

    def warn(self, message: str) -> None:
        self.app.display_warning(message)

    def debug(self, message: str) -> None:
        self.app.display_debug(message)


class KhalBuildHook(BuildHookInterface):
    PLUGIN_NAME = "khal"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._staging: Path | None = None

    # -- configuration -------------------------------------------------------

    @cached_property
    def _parsed(self) -> tuple[HookConfig, list[ResolvedCrate]]:
        return parse_config(
            self.config,
            default_package=self._default_package(),
            where=f"build hook `{self.PLUGIN_NAME}` (tool.hatch.build.targets.{self.target_name}.hooks.khal)",
        )

    @cached_property
    def hook_config(self) -> HookConfig:
        return self._parsed[0]

    @cached_property
    def crates(self) -> list[ResolvedCrate]:
        crates = self._parsed[1]
        for c in crates:
            if not (Path(self.root) / c.package).is_dir():
                raise ConfigError(
                    f"build hook `{self.PLUGIN_NAME}`: crate {c.name!r}: option `package` = {c.package!r} "
                    f"is not a directory under {self.root}"
                )
        return crates

    def _default_package(self) -> str | None:
        name = self.metadata.core.raw_name.replace("-", "_").replace(".", "_").lower()
        for candidate in (name, f"src/{name}"):
            if (Path(self.root) / candidate / "__init__.py").is_file():
                return candidate
        return None

    # -- hatchling API ---------------------------------------------------------

    def dependencies(self) -> list[str]:
        # NVRTC is needed only to compile: a build whose crates are all prebuilt needs none.
        _, crates = self._parsed
        if crates and all(os.environ.get(env_var_for_crate(c.name)) for c in crates):
            return []
        deps = [self.hook_config.nvrtc_requirement]
        if any(c.cuda_headers == "wheels" for c in crates):
            deps += header_requirements(self.hook_config.nvrtc_requirement)
        return deps

    def clean(self, versions: list[str]) -> None:  # noqa: ARG002
        for c in self.crates:
            shutil.rmtree(Path(self.root) / c.package / MANIFEST_DIR, ignore_errors=True)

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            raise ConfigError(
                f"build hook `{self.PLUGIN_NAME}` runs for wheels only; configure it under "
                "[tool.hatch.build.targets.wheel.hooks.khal], not the "
                f"{self.target_name} target (kernel sources travel in the sdist as plain files)"
            )
        editable = version == "editable"
        reporter = _AppReporter(self.app)
        result = build_packages(Path(self.root), self.crates, reporter, editable=editable)
        if editable:
            for out in result.packages:
                write_package_output(out, Path(self.root) / out.package)
                self.app.display_info(
                    f"khal: editable install: kernels written to {out.package}/{MANIFEST_DIR}/"
                )
        else:
            self._stage(result, build_data)
        self._summary(result)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:  # noqa: ARG002
        self._cleanup()

    # -- helpers -------------------------------------------------------------

    def _stage(self, result: BuildResult, build_data: dict[str, Any]) -> None:
        self._staging = Path(tempfile.mkdtemp(prefix="hatch-khal-"))
        try:
            for out in result.packages:
                write_package_output(out, self._staging / out.package)
                dist_dir = self.build_config.get_distribution_path(out.package)
                build_data["force_include"][str(self._staging / out.package / MANIFEST_DIR)] = (
                    f"{dist_dir}/{MANIFEST_DIR}"
                )
                self._exclude_in_place_output(out.package)
        except BaseException:
            self._cleanup()
            raise

    def _exclude_in_place_output(self, package: str) -> None:
        """A previous editable build left kernels in the source tree: keep them out of this wheel."""
        in_place = Path(self.root) / package / MANIFEST_DIR
        if not in_place.exists():
            return
        rel = f"{package}/{MANIFEST_DIR}/"
        if self.build_config.path_is_excluded(rel):
            return
        import pathspec

        extra = pathspec.GitIgnoreSpec.from_lines([f"/{rel}"])
        current = self.build_config.exclude_spec
        self.build_config.__dict__["exclude_spec"] = extra if current is None else current + extra
        self.app.display_debug(f"khal: leaving the in-place {rel} of an editable build out of the wheel")

    def _cleanup(self) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    def _summary(self, result: BuildResult) -> None:
        n_crates = sum(len(p.manifest.crates) for p in result.packages)
        n_art = sum(len(c.artifacts) for p in result.packages for c in p.manifest.crates)
        self.app.display_info(
            f"khal: {n_crates} crate(s), {n_art} artifact(s): {result.compiled} compiled, "
            f"{result.cached} from cache, in {result.seconds:.2f}s"
        )
