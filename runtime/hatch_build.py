"""khal-runtime's build hook: in a checkout the ``khal_runtime`` package lives next to this
folder (``../khal_runtime``), not in it; the wheel and the sdist take it from there. An unpacked
sdist holds it as ``khal_runtime/`` (found by ``packages``); an editable install needs neither
(``dev-mode-dirs`` puts the repository root on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        if (root / "khal_runtime").is_dir() or version == "editable":
            return
        tree = root.parent / "khal_runtime"
        if not (tree / "__init__.py").is_file():
            raise FileNotFoundError(f"{tree}: the khal_runtime package is missing (this folder builds it "
                                    "from a checkout of hatch-khal, or from its sdist)")
        build_data["force_include"][str(tree)] = "khal_runtime"
