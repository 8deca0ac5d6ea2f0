"""Graph capture: record a step of launches once, replay it at a fraction of a launch's cost.

    st = khal_runtime.default_stream()
    step(bufs)                                   # warm-up: loads kernels, caches uniforms
    with st.capture() as cap:                    # or st.begin_capture() ... st.end_capture()
        step(bufs)                               # recorded, not run
    graph = cap.graph
    graph.upload()
    for _ in range(1000):
        graph.launch()

    g = khal_runtime.capture_graph(step, bufs)   # the same, remembering ``step``
    g.rebind(other_bufs)                         # re-capture and update in place

On CUDA a capture is a CUDA graph (``cuStreamBeginCapture``, ``cuGraphExecUpdate`` for
rebinding); WebGPU has no graphs, so there a capture records the launches once and a replay
submits them as one command encoder. While this thread captures, whatever would break the
capture (allocating, reading to the host, synchronising, a uniform never uploaded, an indirect
dispatch that reads its count on the host) raises :class:`~khal_runtime.errors.CaptureError`
saying what to do, before the driver would invalidate the capture.

Lifetime rule: a graph stores raw device pointers. Every buffer a captured launch touches
(DeviceBuffer, PyTorch tensor, CuPy array) must stay allocated, and must not be resized or
freed, for as long as the graph may be launched. The graph keeps the arguments given to
:func:`capture_graph` / :meth:`Graph.rebind` alive; anything else you capture, keep a
reference to yourself (PyTorch's caching allocator hands freed memory to the next tensor, so
a dropped tensor's pointer may then hold someone else's data). Uniform structs uploaded
through the runtime's cache stay put while any graph of the device is alive.
"""

from __future__ import annotations

from typing import Any, Callable

from khal_runtime.capture_state import capturing, current_capture, forbid_in_capture
from khal_runtime.device import as_stream
from khal_runtime.errors import CaptureError

__all__ = [
    "Graph",
    "begin_capture",
    "capture",
    "capture_graph",
    "capturing",
    "current_capture",
    "end_capture",
    "forbid_in_capture",
]


class Graph:
    """A captured step of launches, replayed with :meth:`launch`. Made by a capture
    (``stream.capture()``, :func:`capture_graph`); each backend has its own subclass."""

    label: str
    device_id: int
    kernels: list[str]
    #: the function :func:`capture_graph` captured, which :meth:`rebind` re-captures (None:
    #: the graph came from a plain capture)
    _fn: Callable[..., Any] | None = None

    def __init__(self) -> None:  # use a capture
        raise TypeError("Graph objects come from stream.capture() / khal_runtime.capture_graph()")

    def upload(self, stream: Any = None) -> Graph:
        """Prepare the graph's work on the device ahead of the first launch."""
        raise NotImplementedError

    def launch(self, stream: Any = None) -> None:
        """Enqueue one replay on ``stream`` (default: the stream it was captured on)."""
        raise NotImplementedError

    def update(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Re-capture ``fn(*args, **kwargs)`` (the same launches with other buffers) into this
        graph; True when updated in place, False when it had to be built again."""
        raise NotImplementedError

    def rebind(self, *args: Any, **kwargs: Any) -> bool:
        """:meth:`update` with the function given to :func:`capture_graph` and new arguments."""
        if self._fn is None:
            raise CaptureError(f"graph {self.label!r} was not made by capture_graph(fn, ...): "
                               "use graph.update(fn, *args)")
        return self.update(self._fn, *args, **kwargs)

    def close(self) -> None:
        """Free the graph now. Idempotent."""
        raise NotImplementedError

    def __call__(self, stream: Any = None) -> None:
        self.launch(stream)

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def capture(stream: Any = None, *, mode: str = "thread_local", label: str | None = None) -> Any:
    """``with capture() as cap: ...`` then ``cap.graph`` (default: this thread's stream)."""
    st = as_stream(stream)
    return st.backend_impl.capture(st, mode=mode, label=label, keep=None)


def begin_capture(stream: Any = None, *, mode: str = "thread_local", label: str | None = None) -> Any:
    """Start capturing ``stream`` (default: the owned stream); finish with :func:`end_capture`."""
    return capture(stream, mode=mode, label=label).begin()


def end_capture(stream: Any = None) -> Graph:
    """End the capture open on ``stream``: the instantiated :class:`Graph`."""
    st = as_stream(stream)
    return st.backend_impl.end_capture(st)  # type: ignore[no-any-return]


def capture_graph(fn: Callable[..., Any], *args: Any, stream: Any = None, label: str | None = None,
                  **kwargs: Any) -> Graph:
    """Capture ``fn(*args, **kwargs)`` into a graph that remembers ``fn`` (see :meth:`Graph.rebind`).

    ``fn`` must launch on ``stream`` (pass it through, or use the default stream). The graph
    keeps ``args`` / ``kwargs`` alive: the memory the captured launches use then outlives it."""
    st = as_stream(stream)
    cap = st.backend_impl.capture(st, mode="thread_local", label=label or getattr(fn, "__name__", None),
                         keep=(args, kwargs))
    with cap:
        fn(*args, **kwargs)
    g = cap.graph
    g._fn = fn
    return g  # type: ignore[no-any-return]
