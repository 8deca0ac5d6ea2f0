"""Launch tracing, GPU-time profiling and NVTX ranges, through :mod:`khal_runtime.launch_hooks`.

Nothing here costs anything unless enabled: the generated launch code calls the
:class:`Dispatcher` installed here only while it is installed (``hooks.install`` and
``uninstall`` regenerate every plan's code; bound launches and graph replays read
``hooks.active``). GPU times come from the backend's timer (CUDA events; WebGPU timestamp
queries where the adapter has them).

Environment (read when the first package is loaded):

``KHAL_TRACE`` (alias ``KHAL_CUDA_TRACE``; every ``KHAL_CUDA_*`` name of this list is an alias
of the ``KHAL_*`` name, which wins where both are set: they apply to WebGPU as well)
    ``1`` (or ``true``/``yes``/``on``): one line per launch — kernel, grid, block,
    shared memory, stream, and each argument's kind and size. ``sync``: the same,
    and the stream is synchronised after each launch, so the first kernel that
    fails is reported by name (``CudaError``).
``KHAL_TRACE_FILE`` (alias ``KHAL_CUDA_TRACE_FILE``)
    write trace lines (and ``KHAL_TRACE_INDIRECT`` / ``KHAL_CUDA_ALLOC_TRACE``
    lines) to this file, appending, instead of stderr.
``KHAL_PROFILE`` (alias ``KHAL_CUDA_PROFILE``)
    ``1``: per-kernel GPU time from a pair of CUDA events around each launch
    (recorded on the launch's stream: nothing is serialised, the events are read
    lazily), printed as a table at exit; ``khal_runtime.profile()`` prints it on
    demand. Graph replays are timed as a whole, one row per graph, with the
    kernels captured into it listed.
``KHAL_PROFILE_FILE`` (alias ``KHAL_CUDA_PROFILE_FILE``)
    write the exit table to this file instead of stderr.
``KHAL_CUDA_NVTX``
    ``1``: NVTX ranges named after each kernel (needs the ``nvtx`` package), also
    turned on by tracing or profiling when ``nvtx`` is importable.

On WebGPU the same variables work: the trace line is the same (``(webgpu)`` after the stream;
``grid=indirect`` for a native indirect dispatch, whose count is on the device); ``sync`` submits
and waits after each launch; profiling times each dispatch with timestamp queries, in a compute
pass of its own (adapters without ``timestamp-query`` are named in the table instead), and a
replayed recording as a whole; NVTX ranges are host-side only.

Programmatic: :func:`enable` / :func:`disable`, :func:`profile` (the table),
:func:`profile_stats`, :func:`reset_profile`.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from khal_runtime import abi, backends, interop
from khal_runtime.capture_state import capturing, current_capture
from khal_runtime.errors import CudaError, KhalError
from khal_runtime.launch_hooks import ENV_NAMES, Hooks, env_asks
from khal_runtime.launch_hooks import hooks as _hooks
from khal_runtime.launch_hooks import write_line
from khal_runtime.uniforms import to_uniform

__all__ = [
    "Dispatcher",
    "TraceConfig",
    "describe_args",
    "disable",
    "enable",
    "install_from_env",
    "parse_env",
    "profile",
    "profile_stats",
    "reset_profile",
    "trace_line",
]


@dataclass(frozen=True)
class TraceConfig:
    trace: bool = False
    sync: bool = False
    profile: bool = False
    nvtx: bool = False
    trace_file: str | None = None
    profile_file: str | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def any(self) -> bool:
        return self.trace or self.profile or self.nvtx


def _get(environ: Any, what: str) -> tuple[str, str]:
    """(the variable's name as set, its value) for one setting; ``("KHAL_TRACE", "")`` when unset."""
    names = ENV_NAMES[what]
    for name in names:
        raw = environ.get(name)
        if raw:
            return name, raw
    return names[0], ""


def _flag(environ: Any, what: str, warnings: list[str], extra: tuple[str, ...] = ()) -> str:
    """"" (off), "1" or one of ``extra``; a value :func:`khal_runtime.abi.env_flag` does not
    understand raises EnvVarError naming the variable (``warnings``: none are made any more)."""
    name, raw = _get(environ, what)
    if not abi.env_flag(raw, name, extra):
        return ""
    v = raw.strip().lower()
    return v if v in extra else "1"


def parse_env(environ: Any = None) -> TraceConfig:
    """The tracing/profiling configuration the environment asks for."""
    env = os.environ if environ is None else environ
    warnings: list[str] = []
    trace = _flag(env, "trace", warnings, ("sync",))
    prof = _flag(env, "profile", warnings)
    nvtx = _flag(env, "nvtx", warnings)
    return TraceConfig(
        trace=bool(trace), sync=trace == "sync", profile=bool(prof), nvtx=bool(nvtx),
        trace_file=_get(env, "trace_file")[1] or None,
        profile_file=_get(env, "profile_file")[1] or None,
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
# write_line: the trace sink, shared with the lower layers (khal_runtime.launch_hooks)


# ---------------------------------------------------------------------------------------------
# argument descriptions
# ---------------------------------------------------------------------------------------------
def _fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _describe_array(p: Any, obj: Any) -> str:
    ptr, count, _key = interop.extract(obj)
    return (f"{p.name}={p.kind} {p.element_type}[{count}] "
            f"({_fmt_bytes(count * int(p.element_size))} @0x{ptr:x})")


def _describe_struct(p: Any, obj: Any) -> str:
    if isinstance(obj, dict):  # packed into the struct's layout by the launch
        return f"{p.name}={p.kind} {p.element_type} ({p.element_size} B, from a dict)"
    u = to_uniform(obj)
    if isinstance(u, bytes):
        return f"{p.name}={p.kind} {p.element_type} ({len(u)} B, host)"
    return f"{p.name}={p.kind} {p.element_type} ({u[1]} B, device @0x{u[0]:x})"


#: one argument's trace text, per reader
_DESCRIBE: abi.ReaderTable[Callable[[Any, Any], str]] = abi.ReaderTable("khal_runtime.tracing", {
    "array": _describe_array,
    "struct": _describe_struct,
    "value": lambda p, obj: f"{p.name}={p.kind} {p.element_type} ({p.element_size} B) = {obj!r}",
})


def describe_arg(p: Any, obj: Any) -> str:
    """``name=kind type[count] (size)`` for one argument (never raises)."""
    try:
        return _DESCRIBE.of(p.kind, "trace")(p, obj)
    except Exception as exc:  # a bad argument: the launch itself reports it
        return f"{p.name}=<{type(obj).__name__}: {exc}>"


def describe_args(entry: Any, args: tuple[Any, ...]) -> str:
    params = entry.params
    parts = [describe_arg(p, a) for p, a in zip(params, args)]
    if len(args) != len(params):
        parts.append(f"<{len(args)} args for {len(params)} params>")
    return ", ".join(parts)


def kernel_name(plan: Any) -> str:
    return f"{plan.crate}.{plan.entry.name}"


def trace_line(seq: int, plan: Any, grid: tuple[int, ...], block: tuple[int, ...], shmem: int,
               stream: Any, args: tuple[Any, ...], note: str = "") -> str:
    """The ``KHAL_TRACE`` line of one launch."""
    handle = getattr(stream, "handle", stream)
    h = f"0x{handle:x}" if isinstance(handle, int) else str(handle)
    bk = getattr(getattr(stream, "backend_impl", None), "name", "cuda")
    where = "" if bk == "cuda" else f" ({bk})"
    return (f"khal: launch #{seq} {kernel_name(plan)} grid={_dims(grid)} block={_dims(block)} "
            f"shmem={int(shmem)} stream={h}{where}{note} args: {describe_args(plan.entry, args)}")


def _dims(v: tuple[Any, ...]) -> str:
    """``4x1x1``; a word (``indirect``: the count is on the device) as it is."""
    return "x".join(str(d) if isinstance(d, str) else str(int(d)) for d in v)


# ---------------------------------------------------------------------------------------------
# profiling
# ---------------------------------------------------------------------------------------------
class _Stat:
    __slots__ = ("calls", "total", "lo", "hi", "kernels")

    def __init__(self) -> None:
        self.calls = 0
        self.total = 0.0
        self.lo = float("inf")
        self.hi = 0.0
        self.kernels: tuple[str, ...] = ()

    def add(self, ms: float) -> None:
        self.calls += 1
        self.total += ms
        self.lo = min(self.lo, ms)
        self.hi = max(self.hi, ms)


class Profiler:
    """Timed launches from the backend's timer (event pairs from a pool), resolved lazily
    (query when many are pending, wait only at report time). Never synchronises a stream per
    launch."""

    #: pending pairs kept before completed ones are collected (non-blocking)
    COLLECT_AT = 2048
    #: pending pairs beyond which the oldest are waited for (the GPU is far behind)
    HARD_LIMIT = 65536

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: list[tuple[str, Any, Any, tuple[str, ...]]] = []
        self.stats: dict[str, _Stat] = {}
        self.captured: dict[str, int] = {}  # launches recorded into graphs (not timed per kernel)
        self.errors = 0
        #: where the times come from ("CUDA events", "WebGPU timestamp queries")
        self.sources: set[str] = set()

    def record(self, key: str, stream: Any, do: Callable[[], Any], kernels: tuple[str, ...] = ()) -> Any:
        timer = stream.backend_impl.timer()
        if timer is None:  # the backend times its launches itself (WebGPU: timestamp queries)
            return do()
        with self.lock:
            self.sources.add(timer.what)
            start = timer.start(stream)
        try:
            return do()
        finally:
            token = timer.stop(start, stream)
            with self.lock:
                self.pending.append((key, timer, token, kernels))
                n = len(self.pending)
            if n >= self.COLLECT_AT:
                self.collect(wait=n >= self.HARD_LIMIT)

    def collect(self, wait: bool = False) -> None:
        """Fold finished timings into the stats; with ``wait``, wait for all of them."""
        with self.lock:
            pending, self.pending = self.pending, []
        keep = []
        for i, (key, timer, token, kernels) in enumerate(pending):
            ms = timer.elapsed_ms(token, wait)
            if ms is None:
                keep = pending[i:]  # in order per stream: stop at the first unfinished one
                break
            with self.lock:
                if ms < 0:
                    self.errors += 1
                else:
                    st = self.stats.get(key)
                    if st is None:
                        st = self.stats[key] = _Stat()
                    st.add(ms)
                    if kernels:
                        st.kernels = kernels
        if keep:
            with self.lock:
                self.pending = keep + self.pending

    def note_captured(self, name: str) -> None:
        with self.lock:
            self.captured[name] = self.captured.get(name, 0) + 1

    def reset(self) -> None:
        self.collect(wait=True)
        with self.lock:
            self.stats.clear()
            self.captured.clear()
            self.sources.clear()
            self.errors = 0

    def table(self) -> str:
        with self.lock:
            rows = sorted(self.stats.items(), key=lambda kv: -kv[1].total)
            captured = dict(self.captured)
        total = sum(s.total for _, s in rows) or 1.0
        calls = sum(s.calls for _, s in rows)
        width = max([len("kernel")] + [len(k) for k, _ in rows])
        src = ", ".join(sorted(self.sources))
        out = [f"khal profile: GPU time per kernel ({src + ', ' if src else ''}{calls} timed launches)",
               f"{'kernel':<{width}}  {'calls':>8}  {'total ms':>10}  {'mean us':>10}  "
               f"{'min us':>9}  {'max us':>9}  {'%':>5}"]
        for k, s in rows:
            out.append(f"{k:<{width}}  {s.calls:>8}  {s.total:>10.3f}  {1000 * s.total / s.calls:>10.2f}  "
                       f"{1000 * s.lo:>9.2f}  {1000 * s.hi:>9.2f}  {100 * s.total / total:>5.1f}")
            if s.kernels:
                out.append(f"{'':<{width}}    captured kernels: {', '.join(s.kernels)}")
        if not rows:
            out.append("(no timed launches)")
        if captured:
            out.append("launches captured into graphs (timed with their graph, per-node times are not "
                       "available without serialising): "
                       + ", ".join(f"{k} x{n}" for k, n in sorted(captured.items())))
        if self.errors:
            out.append(f"({self.errors} event pair(s) could not be read)")
        return "\n".join(out)


_profiler = Profiler()


def profile_stats() -> dict[str, dict[str, float]]:
    """``{kernel: {calls, total_ms, mean_us, min_us, max_us}}`` (waits for pending events)."""
    _profiler.collect(wait=True)
    with _profiler.lock:
        out = {k: {"calls": s.calls, "total_ms": s.total, "mean_us": 1000 * s.total / s.calls,
                   "min_us": 1000 * s.lo, "max_us": 1000 * s.hi}
               for k, s in _profiler.stats.items()}
    for bk in backends.loaded():  # backends that time launches themselves (WebGPU)
        out.update(bk.profile_stats())
    return out


def _backend_tables() -> list[str]:
    tables = []
    for bk in backends.loaded():
        text = bk.profile_table()
        if text:
            tables.append(text)
    return tables


def profile(file: Any = None, *, reset: bool = False, print_table: bool = True) -> str:
    """The per-kernel GPU-time table (waits for the launches still timing); printed to ``file``
    (default stderr) unless ``print_table=False``. ``reset`` clears the counters after."""
    _profiler.collect(wait=True)
    extra = _backend_tables()
    own = _profiler.table() if _profiler.stats or _profiler.captured or not extra else None
    text = "\n".join(([own] if own else []) + extra)
    if print_table:
        print(text, file=file or sys.stderr, flush=True)
    if reset:
        reset_profile()
    return text


def reset_profile() -> None:
    _profiler.reset()
    for bk in backends.loaded():
        bk.reset_profile()


# ---------------------------------------------------------------------------------------------
# NVTX
# ---------------------------------------------------------------------------------------------
class _Nvtx:
    def __init__(self) -> None:
        import nvtx  # lazy: optional, only with NVTX ranges

        self.domain = nvtx.get_domain("khal")
        self.attrs: dict[str, Any] = {}

    def push(self, name: str) -> None:
        a = self.attrs.get(name)
        if a is None:
            a = self.attrs[name] = self.domain.get_event_attributes(message=name)
        self.domain.push_range(a)

    def pop(self) -> None:
        self.domain.pop_range()


def _load_nvtx() -> _Nvtx | None:
    try:
        return _Nvtx()
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# the dispatcher
# ---------------------------------------------------------------------------------------------
def _capturing(stream: Any) -> bool:
    return capturing(stream)


class Dispatcher:
    """``hooks.dispatch``: trace line, NVTX range, event pair, launch, optional sync."""

    def __init__(self, cfg: TraceConfig, nvtx: _Nvtx | None = None) -> None:
        self.cfg = cfg
        self.nvtx = nvtx
        self.seq = 0
        self._seq_lock = threading.Lock()
        self.profiler = _profiler

    def _next(self) -> int:
        with self._seq_lock:
            self.seq += 1
            return self.seq

    def __call__(self, plan: Any, grid: tuple[int, ...], block: tuple[int, ...], shmem: int,
                 stream: Any, args: tuple[Any, ...], do_launch: Callable[[], Any]) -> Any:
        cfg = self.cfg
        name = kernel_name(plan)
        capture = None
        capturing = False
        if cfg.profile or cfg.sync or cfg.trace:
            capturing = _capturing(stream)
            if capturing:
                capture = current_capture(stream)
                if capture is not None:
                    capture.kernels.append(name)
        seq = self._next()
        if cfg.trace:
            note = " (captured)" if capturing else ""
            write_line(trace_line(seq, plan, grid, block, shmem, stream, args, note), cfg.trace_file)
        nv = self.nvtx
        if nv is not None:
            nv.push(name)
        try:
            try:
                if cfg.profile and not capturing:
                    result = self.profiler.record(name, stream, do_launch)
                else:
                    if cfg.profile:
                        self.profiler.note_captured(name)
                    result = do_launch()
            except CudaError as exc:
                if cfg.sync:
                    raise CudaError(f"KHAL_TRACE=sync: launch #{seq} of {name} failed: {exc}",
                                    code=exc.code) from exc
                raise
            if cfg.sync and not capturing:
                self._sync(seq, name, grid, block, stream)
            return result
        finally:
            if nv is not None:
                nv.pop()

    def _sync(self, seq: int, name: str, grid: Any, block: Any, stream: Any) -> None:
        try:
            stream.backend_impl.synchronize(stream)
        except KhalError as exc:
            code = getattr(exc, "code", "") or str(exc)
            msg = (f"KHAL_TRACE=sync: kernel {name} (launch #{seq}, grid={_dims(grid)} "
                   f"block={_dims(block)}) failed: "
                   f"{code}; it is the first launch whose stream synchronisation failed")
            write_line("khal: " + msg, self.cfg.trace_file)
            raise CudaError(msg, code=code) from None

    # graphs.Graph.launch calls this when hooks are active
    def graph_launch(self, graph: Any, stream: Any, do_launch: Callable[[], Any]) -> Any:
        cfg = self.cfg
        seq = self._next()
        key = f"graph {graph.label}"
        if cfg.trace:
            h = getattr(stream, "handle", 0)
            write_line(f"khal: graph #{seq} {graph.label} kernels={len(graph.kernels) or '?'} "
                       f"stream=0x{h:x}", cfg.trace_file)
        nv = self.nvtx
        if nv is not None:
            nv.push(key)
        try:
            if cfg.profile and not _capturing(stream):
                result = self.profiler.record(key, stream, do_launch, tuple(graph.kernels))
            else:
                result = do_launch()
            if cfg.sync and not _capturing(stream):
                self._sync(seq, key, (1,), (1,), stream)
            return result
        finally:
            if nv is not None:
                nv.pop()


# ---------------------------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------------------------
_atexit_registered = False
_current: Dispatcher | None = None


def _at_exit(path: str | None) -> None:
    try:
        with _profiler.lock:
            has = bool(_profiler.stats or _profiler.pending or _profiler.captured)
        # a backend that times its own launches (WebGPU) keeps its table itself
        if not has and not _backend_tables():
            return
        if path:
            with open(path, "a", encoding="utf-8") as f:
                profile(f)
        else:
            profile(sys.stderr)
    except Exception as exc:  # the context may be gone at exit
        print(f"khal profile: could not report ({type(exc).__name__}: {exc})", file=sys.stderr)


def enable(trace: bool | str = False, *, profile: bool = False, nvtx: bool | None = None,
           trace_file: str | None = None, profile_file: str | None = None,
           at_exit: bool = False, hooks: Hooks | None = None) -> Dispatcher:
    """Turn tracing (``trace=True`` or ``"sync"``), profiling and/or NVTX ranges on.

    ``nvtx=None``: NVTX ranges whenever the ``nvtx`` package is importable."""
    global _atexit_registered, _current
    if hooks is None:
        hooks = _hooks
    nv = None
    if nvtx or nvtx is None:
        nv = _load_nvtx()
        if nv is None and nvtx:
            print("khal: KHAL_CUDA_NVTX: the nvtx package is not importable; no NVTX ranges "
                  "(pip install nvtx)", file=sys.stderr)
    cfg = TraceConfig(trace=bool(trace), sync=trace == "sync", profile=profile, nvtx=nv is not None,
                      trace_file=trace_file, profile_file=profile_file)
    d = Dispatcher(cfg, nv)
    if not (cfg.trace or cfg.profile or cfg.nvtx):
        hooks.uninstall()
        _current = None
        return d
    hooks.install(d)
    _current = d
    if profile and at_exit and not _atexit_registered:
        atexit.register(_at_exit, profile_file)
        _atexit_registered = True
    return d


def disable(hooks: Hooks | None = None) -> None:
    global _current
    (hooks or _hooks).uninstall()
    _current = None


def install_from_env(hooks: Hooks | None = None, environ: Any = None) -> Dispatcher | None:
    """Install what the environment's tracing variables ask for (``khal_runtime.load`` calls
    this once per process)."""
    cfg = parse_env(environ)
    for w in cfg.warnings:
        print(f"khal: {w}", file=sys.stderr)
    if not cfg.any:
        return None
    return enable("sync" if cfg.sync else cfg.trace, profile=cfg.profile,
                  nvtx=True if cfg.nvtx else None, trace_file=cfg.trace_file,
                  profile_file=cfg.profile_file, at_exit=True, hooks=hooks)


_env_read = False


def install_from_env_once() -> None:
    """:func:`install_from_env` the first time a package is loaded (later calls: nothing)."""
    global _env_read
    if _env_read:
        return
    _env_read = True
    if env_asks():
        install_from_env()
