"""Launch hooks: how tracing and profiling see launches without costing anything when off.

When ``hooks.active``, every launch runs through ``hooks.dispatch(plan, grid, block, shmem,
stream, args, do_launch)``, which must call ``do_launch()``. The generated launch code of every
plan holds that call only while hooks are installed: plans register with :meth:`Hooks.watch`
and are regenerated when hooks come and go, so launches without tracing pay nothing.

A leaf module: it imports nothing of the project (``khal_runtime.tracing`` installs into it).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Protocol

__all__ = ["Hooks", "Regenerable", "hooks"]


class Regenerable(Protocol):
    def regenerate_code(self) -> None: ...


class Hooks:
    """The launch hooks of the process (one instance: :data:`hooks`)."""

    active: bool = False
    dispatch: Callable[..., Any] | None = None

    def __init__(self) -> None:
        self._watched: weakref.WeakSet[Any] = weakref.WeakSet()

    def watch(self, plan: Regenerable) -> None:
        """Regenerate ``plan``'s launch code whenever hooks are installed or removed."""
        self._watched.add(plan)

    def install(self, dispatch: Callable[..., Any]) -> None:
        """Install ``dispatch``; every watched plan regenerates (also when replacing one: what
        the new one asks for, e.g. profiling, may need the backends to set things up)."""
        self.dispatch = dispatch
        self.active = True
        self._regenerate_all()

    def uninstall(self) -> None:
        was, self.active = self.active, False
        self.dispatch = None
        if was:
            self._regenerate_all()

    def _regenerate_all(self) -> None:
        for plan in list(self._watched):
            plan.regenerate_code()


hooks = Hooks()
