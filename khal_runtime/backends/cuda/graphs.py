"""CUDA graphs: record a step of launches once, replay it for a fraction of a launch's cost.

The user-facing API (``stream.capture()``, ``capture_graph``, :class:`Graph`) is described in
:mod:`khal_runtime.graphs`; this is its CUDA implementation. Capture runs in thread-local mode
(``cuStreamBeginCapture``) on the given stream, by default the runtime's owned non-blocking
stream; the legacy NULL stream is refused up front. While this thread captures, whatever would
break or silently corrupt the capture raises :class:`~khal_runtime.errors.CaptureError` before
calling the driver (:mod:`khal_runtime.capture_state`). Loading a crate's binary on first use is
done in relaxed capture mode (:func:`relaxed_capture_mode`), so a kernel's first launch may be
inside a capture.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Callable, Iterator

from khal_runtime import capture_state
from khal_runtime.backends.cuda.driver import check, driver
from khal_runtime.backends.cuda.uniform_cache import cache_for
from khal_runtime.device import Stream, as_stream, ensure_current
from khal_runtime.errors import CaptureError, CudaError
from khal_runtime.graphs import Graph as GraphAPI
from khal_runtime.launch_hooks import hooks

__all__ = ["Capture", "Graph", "end_capture", "relaxed_capture_mode"]

_LEGACY_HANDLES = (0, 1, 2)  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
_MODES = ("thread_local", "global", "relaxed")

_lock = threading.Lock()
#: stream handle -> its open Capture (a Stream has __slots__, so it cannot hold it)
_open: dict[int, "Capture"] = {}
_labels = itertools.count(1)


@contextlib.contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """Allow "unsafe" driver calls (module loads, internal allocations) for a moment while
    this thread captures; a no-op otherwise."""
    if capture_state.current_capture() is None:
        yield
        return
    drv = driver()
    old = check(drv.cuThreadExchangeStreamCaptureMode(
        drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        check(drv.cuThreadExchangeStreamCaptureMode(old), "cuThreadExchangeStreamCaptureMode")


def _mode_enum(mode: str) -> Any:
    drv = driver()
    m = str(mode).lower().replace("-", "_")
    if m not in _MODES:
        raise ValueError(f"capture mode must be one of {', '.join(_MODES)}, got {mode!r}")
    return getattr(drv.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{m.upper()}")


class Capture:
    """An open capture on one stream. Use as a context manager, or :meth:`end`."""

    def __init__(self, stream: Any = None, *, mode: str = "thread_local", label: str | None = None,
                 keep: Any = None) -> None:
        self.stream: Stream = as_stream(stream)
        self.mode = mode
        self.label = label or f"graph#{next(_labels)}"
        self.graph: Graph | None = None
        #: names of the kernels launched into this capture (filled while tracing/profiling)
        self.kernels: list[str] = []
        self._keep = keep
        #: (device, stream handle, thread token or 0: ``scratch.stream_key``) -> the Triton scratch
        #: buffers this capture's launches use on that stream (:mod:`khal_runtime.scratch`), kept by its
        #: graph; ``scratch_reuse``: buffers it may take first (those of the graph it updates)
        self.scratch: dict[tuple[int, int, int], list[Any]] = {}
        self.scratch_reuse: list[Any] = []
        self._open = False

    # -- begin / end ---------------------------------------------------------------------------
    def begin(self) -> "Capture":
        st = self.stream
        if st.handle in _LEGACY_HANDLES:
            raise CaptureError(
                "cannot capture on the legacy NULL stream (the driver answers "
                "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED): capture on the runtime's owned stream "
                "(khal_runtime.default_stream()) or a stream from khal_runtime.Stream.create()")
        mode = _mode_enum(self.mode)
        ensure_current(st.device_id)
        with _lock:
            if st.handle in _open:
                raise CaptureError(f"stream 0x{st.handle:x} is already capturing "
                                   f"({_open[st.handle].label!r}); end that capture first")
            _open[st.handle] = self
        try:
            # uploads still in flight would be waited on with events inside the capture: settle them
            cache_for(st.device_id).settle()
            check(driver().cuStreamBeginCapture(st.native, mode), "cuStreamBeginCapture")
        except BaseException:
            with _lock:
                _open.pop(st.handle, None)
            raise
        self._open = True
        capture_state.push(self)
        return self

    def _close(self) -> Any:
        """End the driver capture; the CUgraph (or raise)."""
        st = self.stream
        self._open = False
        capture_state.pop(self)
        with _lock:
            _open.pop(st.handle, None)
        drv = driver()
        res = drv.cuStreamEndCapture(st.native)
        capture_state.flush_deferred()  # buffers released while capturing
        if res[0]:
            name = getattr(res[0], "name", str(res[0]))
            raise CaptureError(
                f"capture {self.label!r} failed at cuStreamEndCapture: {name}. Something inside the "
                "capture was not capturable (a host synchronisation, an allocation, work on the "
                "legacy stream, or a call from another thread in global mode); run it with "
                "KHAL_TRACE=1 to see the launches it recorded")
        return res[1]

    def end(self) -> "Graph":
        """End the capture and instantiate it: the :class:`Graph`."""
        if not self._open:
            raise CaptureError(f"capture {self.label!r} is not open")
        g = self._close()
        self.graph = Graph._from_capture(g, self)
        return self.graph

    def abort(self) -> None:
        """End the capture and discard what it recorded."""
        if not self._open:
            return
        try:
            g = self._close()
        except CaptureError:
            return
        if g is not None and int(g):
            driver().cuGraphDestroy(g)

    def __enter__(self) -> "Capture":
        return self.begin()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
            return
        self.end()


def end_capture(stream: Any = None) -> "Graph":
    """End the capture open on ``stream``: the instantiated :class:`Graph`."""
    st = as_stream(stream)
    with _lock:
        cap = _open.get(st.handle)
    if cap is None:
        raise CaptureError(f"no capture is open on stream 0x{st.handle:x}; call begin_capture() first")
    return cap.end()


class Graph(GraphAPI):
    """An instantiated CUDA graph (``CUgraphExec``) bound to a device and a default stream."""

    stream: Stream
    _graph: Any
    _exec: Any
    _keep: Any
    _uniforms: Any
    #: the Triton scratch buffers its launches use (:mod:`khal_runtime.scratch`)
    _scratch: list[Any]
    #: in-place cuGraphExecUpdate successes, and updates that had to instantiate again
    updates: int
    reinstantiations: int

    @classmethod
    def _from_capture(cls, cugraph: Any, cap: Capture) -> "Graph":
        self = object.__new__(cls)
        self.label = cap.label
        self.stream = cap.stream
        self.device_id = cap.stream.device_id
        self.kernels = list(cap.kernels)
        self._graph = cugraph
        self._exec = None
        self._fn = None
        self._keep = cap._keep
        self._scratch = [b for bs in cap.scratch.values() for b in bs]
        self._uniforms = cache_for(self.device_id)
        self.updates = 0
        self.reinstantiations = 0
        try:
            self._exec = check(driver().cuGraphInstantiate(cugraph, 0), "cuGraphInstantiate")
        except BaseException:
            driver().cuGraphDestroy(cugraph)
            self._graph = None
            raise
        self._uniforms.pins = getattr(self._uniforms, "pins", 0) + 1
        return self

    # -- queries -------------------------------------------------------------------------------
    @property
    def node_count(self) -> int:
        res = driver().cuGraphGetNodes(self._graph, 0)
        check(res[:1], "cuGraphGetNodes")
        return int(res[-1])

    @property
    def scratch_bytes(self) -> int:
        """Bytes of Triton scratch memory the graph holds for its launches."""
        return sum(int(b.nbytes) for b in self._scratch)

    @property
    def handle(self) -> Any:
        """The ``CUgraphExec``."""
        return self._exec

    def _stream(self, stream: Any) -> Any:
        if stream is None:
            return self.stream
        st = as_stream(stream)
        if st.device_id != self.device_id:
            raise CudaError(f"graph {self.label!r} belongs to device {self.device_id}, "
                            f"the stream to device {st.device_id}")
        return st

    def _live(self) -> Any:
        if self._exec is None:
            raise CaptureError(f"graph {self.label!r} was closed")
        return self._exec

    # -- run -----------------------------------------------------------------------------------
    def upload(self, stream: Any = None) -> "Graph":
        """Upload the graph's work to the device ahead of the first launch (``cuGraphUpload``)."""
        st = self._stream(stream)
        check(driver().cuGraphUpload(self._live(), st.native), "cuGraphUpload")
        return self

    def launch(self, stream: Any = None) -> None:
        """Enqueue one replay on ``stream`` (default: the stream it was captured on)."""
        st = self._stream(stream)
        ex = self._live()
        if hooks.active:
            gl = getattr(hooks.dispatch, "graph_launch", None)
            if gl is not None:
                gl(self, st, lambda: self._launch_now(ex, st))
                return
        self._launch_now(ex, st)

    def _launch_now(self, ex: Any, st: Any) -> None:
        err = driver().cuGraphLaunch(ex, st.native)[0]
        if err:
            check((err,), f"cuGraphLaunch({self.label})")

    __call__ = launch

    # -- rebinding -----------------------------------------------------------------------------
    def update(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Re-capture ``fn(*args, **kwargs)`` (same launches, e.g. other buffers of the same shape)
        and apply it to this graph with ``cuGraphExecUpdate``: no re-instantiation.

        Returns True when updated in place, False when the topology changed and the graph
        had to be instantiated again (still correct, slower)."""
        self._live()
        cap = Capture(self.stream, label=self.label, keep=(args, kwargs))
        cap.scratch_reuse = list(self._scratch)  # replays of this graph never overlap: its scratch serves again
        with _lock:
            busy = self.stream.handle in _open
        if busy:
            raise CaptureError(f"graph {self.label!r}: its stream is capturing; end that first")
        cap.begin()
        try:
            fn(*args, **kwargs)
        except BaseException:
            cap.abort()
            raise
        new = cap._close()
        drv = driver()
        res = drv.cuGraphExecUpdate(self._exec, new)
        if res[0]:
            # topology or node kinds differ: instantiate the new graph instead
            try:
                ex = check(drv.cuGraphInstantiate(new, 0), "cuGraphInstantiate")
            except BaseException:
                drv.cuGraphDestroy(new)
                raise
            drv.cuGraphExecDestroy(self._exec)
            self._exec = ex
            self.reinstantiations += 1
            in_place = False
        else:
            self.updates += 1
            in_place = True
        drv.cuGraphDestroy(self._graph)
        self._graph = new
        self._keep = (args, kwargs)
        self._scratch = [b for bs in cap.scratch.values() for b in bs] + cap.scratch_reuse
        self.kernels = list(cap.kernels) or self.kernels
        if fn is not None:
            self._fn = fn
        return in_place

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy the executable graph and its template now. Idempotent."""
        ex, g = self._exec, self._graph
        self._exec = self._graph = None
        if ex is None and g is None:
            return
        drv = driver()
        if ex is not None:
            drv.cuGraphExecDestroy(ex)
        if g is not None:
            drv.cuGraphDestroy(g)
        self._keep = None
        self._scratch = []
        self._uniforms.pins = max(0, getattr(self._uniforms, "pins", 1) - 1)

    def __del__(self) -> None:
        try:
            if getattr(self, "_exec", None) is not None or getattr(self, "_graph", None) is not None:
                self.close()
        except Exception:
            pass

    def __enter__(self) -> "Graph":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._exec is None else f"device={self.device_id}"
        return f"<Graph {self.label!r} {state}>"
