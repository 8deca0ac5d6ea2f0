"""Launch hooks: how tracing and profiling see launches without costing anything when off.

When ``hooks.active``, every launch runs through ``hooks.dispatch(plan, grid, block, shmem,
stream, args, do_launch)``, which must call ``do_launch()``. The generated launch code of every
plan holds that call only while hooks are installed: plans register with :meth:`Hooks.watch`
and are regenerated when hooks come and go, so launches without tracing pay nothing.

Also the trace output every layer writes to (:func:`write_line`: ``KHAL_TRACE_FILE`` (alias
``KHAL_CUDA_TRACE_FILE``) or stderr), and the allocation lines ``KHAL_CUDA_ALLOC_TRACE`` asks for (:func:`trace_alloc`,
written by :class:`khal_runtime.DeviceBuffer`): the lower layers report here, tracing reads and
writes through it, so no module imports one above it.

Nearly a leaf module: it imports only ``khal_runtime.abi`` (its reader of boolean variables);
``khal_runtime.tracing`` installs into it. The names of tracing's variables are here too
(:func:`env_asks`), so that ``load`` imports tracing only where one is set.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import IO, Any, Callable, Protocol

from khal_runtime.abi import FALSE_VALUES, env_flag

__all__ = ["ENV_NAMES", "FALSE_VALUES", "Hooks", "Regenerable", "alloc_trace_on", "env_asks", "hooks", "trace_alloc",
           "write_line"]


#: (name, alias) of each tracing variable (read by :mod:`khal_runtime.tracing`): the ``KHAL_CUDA_*``
#: spellings came first and stay as aliases (they apply to WebGPU as well); where both are set the
#: name wins
ENV_NAMES = {
    "trace": ("KHAL_TRACE", "KHAL_CUDA_TRACE"),
    "trace_file": ("KHAL_TRACE_FILE", "KHAL_CUDA_TRACE_FILE"),
    "profile": ("KHAL_PROFILE", "KHAL_CUDA_PROFILE"),
    "profile_file": ("KHAL_PROFILE_FILE", "KHAL_CUDA_PROFILE_FILE"),
    "nvtx": ("KHAL_CUDA_NVTX",),
}


def env_asks() -> bool:
    """Whether any tracing / profiling / NVTX variable is set (cheap: no parsing). Here, not in
    :mod:`khal_runtime.tracing`, so that ``load`` can ask without importing tracing."""
    return any(os.environ.get(n) for names in ENV_NAMES.values() for n in names)


class Regenerable(Protocol):
    def regenerate_code(self) -> None: ...


class Hooks:
    """The launch hooks of the process (one instance: :data:`hooks`)."""

    active: bool = False
    dispatch: Callable[..., Any] | None = None

    def __init__(self) -> None:
        self._watched: weakref.WeakSet[Any] = weakref.WeakSet()
        # instance attributes from the start: every launch reads ``hooks.active``, and CPython
        # specialises an instance attribute's read (a class attribute's read through the instance
        # is the generic look-up, about twice as slow)
        self.active = False
        self.dispatch = None

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


# ---------------------------------------------------------------------------------------------
# trace output
# ---------------------------------------------------------------------------------------------
_out_lock = threading.Lock()
_files: dict[str, IO[str]] = {}


def _sink(path: str | None) -> IO[str]:
    if not path:
        return sys.stderr
    f = _files.get(path)
    if f is None:
        f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - kept open, line-buffered
        _files[path] = f
    return f


def write_line(line: str, path: str | None = None) -> None:
    """One line to the trace sink (``KHAL_TRACE_FILE``, alias ``KHAL_CUDA_TRACE_FILE``, or stderr)."""
    if path is None:
        path = os.environ.get("KHAL_TRACE_FILE") or os.environ.get("KHAL_CUDA_TRACE_FILE") or None
    with _out_lock:
        f = _sink(path)
        f.write(line + "\n")
        f.flush()


def alloc_trace_on() -> bool:
    """Whether ``KHAL_CUDA_ALLOC_TRACE`` asks for a line per allocation (read at each one)."""
    return env_flag(os.environ.get("KHAL_CUDA_ALLOC_TRACE"), "KHAL_CUDA_ALLOC_TRACE")


def trace_alloc(nbytes: int, device_id: int, inside_capture: bool = False) -> None:
    """``KHAL_CUDA_ALLOC_TRACE``: one line per DeviceBuffer allocation, with its caller."""
    import traceback  # lazy: only while tracing allocations

    where = "?"
    for fr in reversed(traceback.extract_stack()[:-1]):
        if "khal_runtime" not in fr.filename.replace("\\", "/").split("/")[-2:][0]:
            where = f"{fr.filename}:{fr.lineno} in {fr.name}"
            break
    cap = " INSIDE GRAPH CAPTURE" if inside_capture else ""
    write_line(f"khal: alloc {nbytes} B on device {device_id} at {where}{cap}")
