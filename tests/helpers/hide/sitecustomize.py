"""The tests' ``KHAL_TEST_HIDE`` switch (tests/conftest.py, docs/internals/testing.md): makes NVRTC
or cuda-bindings unimportable in this process and in every Python process it starts (this folder
is put first on ``PYTHONPATH``, so a child imports this module at startup too). ``nvrtc`` hides
``cuda.bindings.nvrtc``; ``cuda-bindings`` hides ``cuda.bindings`` and ``cuda.core``; ``editables`` the
package hatchling's editable wheels need. Comma
separated: ``KHAL_TEST_HIDE=nvrtc,cuda-bindings``."""

from __future__ import annotations

import os
import sys
from typing import Any

HIDDEN = {"nvrtc": ("cuda.bindings.nvrtc", "cuda.bindings.cynvrtc"), "cuda-bindings": ("cuda.bindings", "cuda.core"),
          "editables": ("editables",)}


class Hidden:
    """A meta-path finder that refuses the hidden modules."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if any(name == n or name.startswith(n + ".") for n in self.names):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by KHAL_TEST_HIDE)", name=name)
        return None


def install() -> tuple[str, ...]:
    """Hide what ``KHAL_TEST_HIDE`` names (once per process); the module names hidden."""
    words = [w.strip() for w in os.environ.get("KHAL_TEST_HIDE", "").split(",") if w.strip()]
    unknown = [w for w in words if w not in HIDDEN]
    if unknown:
        raise SystemExit(f"KHAL_TEST_HIDE: unknown {unknown}; known: {sorted(HIDDEN)}")
    names = tuple(n for w in words for n in HIDDEN[w])
    if names and not any(type(f).__name__ == "Hidden" for f in sys.meta_path):
        sys.meta_path.insert(0, Hidden(names))
    return names


install()
