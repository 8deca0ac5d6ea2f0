"""Whether this thread is capturing launches into a graph, and what must wait until it ends.

Graph capture (CUDA graphs, WebGPU recordings) forbids some calls while it is open:
allocations, host reads, synchronisation. Every module that could make such a call asks
:func:`forbid_in_capture` first, so the user gets a :class:`~khal_runtime.errors.CaptureError`
saying what to do *before* the driver invalidates the capture. Frees asked for during a
capture (a temporary dropped inside it) wait in :func:`defer` until it ends.

A leaf module: it imports only :mod:`khal_runtime.errors`. The backends' capture objects
push themselves here (:func:`push` / :func:`pop`); a capture object has ``label`` and
``stream`` (with ``handle``), and a stream may answer ``is_capturing()`` for captures made
by others (PyTorch's ``torch.cuda.graph``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from khal_runtime.errors import CaptureError

__all__ = ["add_foreign_probe", "add_listener", "capturing", "current_capture", "defer", "flush_deferred",
           "forbid_in_capture", "pop", "push"]

#: Per thread: ``captures`` = the captures this thread began (innermost last).
_state = threading.local()
#: Releases asked for while a capture was open in the releasing thread.
_deferred: list[Callable[[], None]] = []
_deferred_lock = threading.Lock()


def _captures() -> list[Any]:
    try:
        return _state.captures  # type: ignore[no-any-return]
    except AttributeError:
        _state.captures = []
        return _state.captures  # type: ignore[no-any-return]


#: called, with no arguments, whenever a capture of the runtime begins or ends (:func:`add_listener`)
_listeners: list[Callable[[], None]] = []


def add_listener(listener: Callable[[], None]) -> None:
    """Have ``listener()`` called each time a capture of the runtime begins or ends, in the
    capturing thread (:mod:`khal_runtime.scratch`: no launch memo crosses a capture's edge)."""
    _listeners.append(listener)


def push(capture: Any) -> None:
    """A capture began in this thread."""
    _captures().append(capture)
    for listener in _listeners:
        listener()


def pop(capture: Any) -> None:
    """A capture of this thread ended."""
    caps = _captures()
    if capture in caps:
        caps.remove(capture)
        for listener in _listeners:
            listener()


def capturing(stream: Any = None) -> bool:
    """Whether this thread has a capture open, or ``stream`` is capturing (through anyone:
    PyTorch's ``torch.cuda.graph`` too)."""
    if getattr(_state, "captures", None):
        return True
    if stream is not None:
        try:
            return bool(stream.is_capturing())
        except Exception:  # noqa: BLE001  (a stream of a backend without captures)
            return False
    return False


def current_capture(stream: Any = None) -> Any:
    """The innermost capture this thread has open (on ``stream`` if given), or None."""
    caps = getattr(_state, "captures", None)
    if not caps:
        return None
    if stream is None:
        return caps[-1]
    h = getattr(stream, "handle", stream)
    for c in reversed(caps):
        if c.stream.handle == h:
            return c
    return None


def forbid_in_capture(what: str, advice: str, stream: Any = None) -> None:
    """Raise CaptureError if this thread is capturing (or ``stream`` is): ``what`` would break it."""
    if capturing(stream):
        caps = getattr(_state, "captures", None)
        where = f" (capture {caps[-1].label!r} on stream 0x{caps[-1].stream.handle:x})" if caps else ""
        raise CaptureError(f"{what} during graph capture{where}: {advice}")


#: "is a capture that is not ours open in this thread?" (PyTorch's ``torch.cuda.graph``: a
#: buffer the garbage collector frees inside it must not free memory then, which would
#: invalidate that capture); registered by :mod:`khal_runtime.interop`
_foreign_probes: list[Callable[[], bool]] = []


def add_foreign_probe(probe: Callable[[], bool]) -> None:
    """Register ``probe()``: True while this thread is inside another library's stream capture."""
    _foreign_probes.append(probe)


def _foreign_capturing() -> bool:
    for probe in _foreign_probes:
        try:
            if probe():
                return True
        except Exception:  # noqa: BLE001  (a probe must never break a release)
            continue
    return False


def defer(release: Callable[[], None]) -> bool:
    """Keep ``release`` for when this thread's capture ends (ours, or another library's: then
    until the next allocation or release outside it); False (nothing kept) when no capture is
    open and the caller should release now."""
    if not capturing() and not _foreign_capturing():
        return False
    with _deferred_lock:
        _deferred.append(release)
    return True


def flush_deferred() -> None:
    """Run the releases kept during captures (called when a capture ends, and on allocation)."""
    if not _deferred:
        return
    with _deferred_lock:
        pending = _deferred[:]
        _deferred.clear()
    for release in pending:
        release()


def pending_releases() -> int:
    """How many releases wait for a capture to end."""
    return len(_deferred)
