"""The tests' ``KHAL_TEST_HIDE`` switch (tests/conftest.py, docs/internals/testing.md): makes NVRTC
or cuda-bindings unimportable in this process and in every Python process it starts (this folder
is put first on ``PYTHONPATH``, so a child imports this module at startup too). ``nvrtc`` hides
``cuda.bindings.nvrtc``; ``cuda-bindings`` hides ``cuda.bindings`` and ``cuda.core``; ``editables`` the
package hatchling's editable wheels need; ``triton`` makes Triton look not installed at all (no
finder finds it: ``importlib.util.find_spec("triton")`` is None, ``import triton`` is a
ModuleNotFoundError, ``importlib.metadata`` has no distribution of it), as a process without Triton
sees it. Comma separated: ``KHAL_TEST_HIDE=nvrtc,cuda-bindings``."""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder
from typing import Any, Iterator

HIDDEN = {"nvrtc": ("cuda.bindings.nvrtc", "cuda.bindings.cynvrtc"), "cuda-bindings": ("cuda.bindings", "cuda.core"),
          "editables": ("editables",), "triton": ("triton",)}
#: hidden as not installed (the path finder does not see them) rather than refused
NOT_INSTALLED = {"triton"}


class Hidden:
    """A meta-path finder that refuses the hidden modules."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if any(name == n or name.startswith(n + ".") for n in self.names):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by KHAL_TEST_HIDE)", name=name)
        return None


class NotInstalled:
    """Stands for ``importlib.machinery.PathFinder`` in ``sys.meta_path``: finds what it finds, except
    the hidden modules and distributions (as where they are not installed)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def _hidden(self, name: str) -> bool:
        return any(name == n or name.startswith(n + ".") for n in self.names)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return None if self._hidden(name) else PathFinder.find_spec(name, path, target)

    def invalidate_caches(self) -> None:
        PathFinder.invalidate_caches()

    def find_distributions(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for d in PathFinder.find_distributions(*args, **kwargs):
            if str(d.metadata["Name"]).lower().replace("_", "-") not in self.names:
                yield d


def install() -> tuple[str, ...]:
    """Hide what ``KHAL_TEST_HIDE`` names (once per process); the module names hidden."""
    words = [w.strip() for w in os.environ.get("KHAL_TEST_HIDE", "").split(",") if w.strip()]
    unknown = [w for w in words if w not in HIDDEN]
    if unknown:
        raise SystemExit(f"KHAL_TEST_HIDE: unknown {unknown}; known: {sorted(HIDDEN)}")
    names = tuple(n for w in words if w not in NOT_INSTALLED for n in HIDDEN[w])
    if names and not any(type(f).__name__ == "Hidden" for f in sys.meta_path):
        sys.meta_path.insert(0, Hidden(names))
    gone = tuple(n for w in words if w in NOT_INSTALLED for n in HIDDEN[w])
    if gone and PathFinder in sys.meta_path:
        sys.meta_path[sys.meta_path.index(PathFinder)] = NotInstalled(gone)  # type: ignore[call-overload]
    return names + gone


install()
