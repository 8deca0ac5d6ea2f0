"""GPU time per dispatch from timestamp queries (adapters with ``timestamp-query``).

While a :class:`Timer` is installed on a device's stream (:func:`enable_profiling`), every
dispatch is recorded in a compute pass of its own whose ``timestamp_writes`` write a begin and
an end timestamp; a replayed recording is timed as a whole, one row per recording. The query
set is resolved into a buffer when the stream submits, and read back lazily (:meth:`Timer.collect`,
called by :meth:`Timer.table` / :meth:`Timer.stats`), so profiling never waits on the GPU by
itself. Separate passes cost more than one shared pass: profiled runs are slower, and the
times are each dispatch alone.

Timestamps are converted with the queue's timestamp period (``wgpuQueueGetTimestampPeriod``
through wgpu-native's C API: wgpu-py 0.32 does not wrap it), 1.0 ns where unavailable.

Adapters without ``timestamp-query``: :func:`enable_profiling` raises
:class:`~.errors.WebGpuError` saying so; :func:`profiling_supported` tells beforehand.

:func:`trace_fields` is what a trace line needs of one dispatch (the generic layer formats it).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from khal_runtime.backends.webgpu._wgpu import native, wgpu_module
from khal_runtime.errors import WebGpuError
from khal_runtime.backends.webgpu.recording import encode

if TYPE_CHECKING:
    from khal_runtime.backends.webgpu.device import WebGpuDevice
    from khal_runtime.backends.webgpu.recording import Recording
    from khal_runtime.backends.webgpu.stream import CommandStream

__all__ = ["Timer", "disable_profiling", "enable_profiling", "profiling_supported", "trace_fields"]

#: timed dispatches per submit (the stream submits when the query set is full)
CAPACITY = 1024


def trace_fields(pipeline: Any, groups: tuple[int, int, int], indirect: bool) -> dict[str, Any]:
    """What one dispatch shows in a trace line: kernel, groups, block, target, device."""
    return {"kernel": pipeline.name, "symbol": pipeline.symbol,
            "groups": None if indirect else groups, "indirect": indirect, "block": pipeline.block,
            "target": pipeline.target.target, "device": pipeline.device.ordinal}


def profiling_supported(device: WebGpuDevice) -> bool:
    return device.has_timestamps


def _period(device: WebGpuDevice) -> float:
    nat = native()
    if nat is None:
        return 1.0
    try:
        p = float(nat[0].wgpuQueueGetTimestampPeriod(device.queue._internal))
    except Exception:  # noqa: BLE001
        return 1.0
    return p if p > 0 else 1.0


class Timer:
    """Per-stream GPU timing (see the module docstring)."""

    def __init__(self, device: WebGpuDevice, capacity: int = CAPACITY) -> None:
        if not device.has_timestamps:
            raise WebGpuError(f"{device.describe()} has no 'timestamp-query' feature: GPU times per "
                              "dispatch cannot be measured on it (time whole steps on the host instead)")
        wgpu = wgpu_module()
        self.device = device
        self.capacity = capacity
        self.period_ns = _period(device)
        self.query_set = device.device.create_query_set(type="timestamp", count=2 * capacity)
        self.resolve_buf = device.device.create_buffer(
            label="khal timestamps", size=16 * capacity,
            usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self._names: list[str] = []        # the open encoder's timed passes
        self._batches: list[tuple[Any, list[str]]] = []  # submitted, not read yet
        self._ready: list[tuple[Any, list[str]]] = []
        #: name -> [count, total ns, min ns, max ns]
        self.stats_ns: dict[str, list[float]] = {}

    def _pass_args(self, i: int) -> dict[str, Any]:
        return {"timestamp_writes": {"query_set": self.query_set, "beginning_of_pass_write_index": 2 * i,
                                     "end_of_pass_write_index": 2 * i + 1}}

    def record(self, st: CommandStream, pl: Any, bgs: tuple[Any, ...], groups: tuple[int, int, int] | None,
               imm: Any, indirect: tuple[Any, int] | None) -> None:
        """Record one dispatch in a timed pass of its own (called by the stream, lock held)."""
        if len(self._names) >= self.capacity:
            st.flush()
        enc = st.encoder()
        p = enc.begin_compute_pass(label=f"khal timed {pl.name}", **self._pass_args(len(self._names)))
        p.set_pipeline(pl.gpu)
        for i, bg in enumerate(bgs):
            p.set_bind_group(i, bg.gpu, bg.dyn)
        if imm is not None:
            p.set_immediates(0, imm.data, 0, imm.size)
        if indirect is None:
            assert groups is not None
            p.dispatch_workgroups(*groups)
        else:
            p.dispatch_workgroups_indirect(indirect[0], indirect[1])
            st.keep(indirect[0])
        p.end()
        self._names.append(pl.name)
        st._log.append(("x", pl.name))  # a timed pass: not replayed
        st._dispatches += 1
        if st.on_dispatch is not None:
            st.on_dispatch(pl, groups or (0, 0, 0), indirect is not None)
        if st._dispatches >= st.batch:
            st.flush()

    def replay(self, rec: Recording, enc: Any) -> None:
        """Encode a recording's replay, timed as a whole (first pass to last pass)."""
        i = len(self._names)
        if i >= self.capacity:
            raise WebGpuError("profiling: too many timed passes in one submit")
        qs = self.query_set
        passes = [k for k, c in enumerate(rec.commands) if c[0] in ("d", "i") and
                  (k == 0 or rec.commands[k - 1][0] not in ("d", "i"))]
        first, last = (passes[0], passes[-1]) if passes else (-1, -1)

        def pass_args(k: int, _n: int) -> dict[str, Any]:
            tw: dict[str, Any] = {"query_set": qs}
            if k == first:
                tw["beginning_of_pass_write_index"] = 2 * i
            if k == last:
                tw["end_of_pass_write_index"] = 2 * i + 1
            return {"timestamp_writes": tw} if len(tw) > 1 else {}

        encode(rec.commands, enc, rec.stream, pass_args)
        if passes:
            self._names.append(f"recording {rec.label} ({rec.dispatch_count} dispatches)")
            self.before_finish(rec.stream, enc)

    def before_finish(self, st: CommandStream, enc: Any) -> None:
        """Resolve this encoder's timestamps into a readable buffer (called before finish)."""
        n = len(self._names)
        if not n:
            return
        wgpu = wgpu_module()
        out = self.device.device.create_buffer(label="khal timestamps read", size=16 * n,
                                               usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        enc.resolve_query_set(self.query_set, 0, 2 * n, self.resolve_buf, 0)
        enc.copy_buffer_to_buffer(self.resolve_buf, 0, out, 0, 16 * n)
        self._ready.append((out, self._names))
        self._names = []

    def after_submit(self, st: CommandStream) -> None:
        self._batches.extend(self._ready)
        self._ready = []
        if len(self._batches) > 64:
            self.collect()

    def collect(self) -> None:
        """Read the submitted timestamps into :attr:`stats_ns` (waits for their work)."""
        wgpu = wgpu_module()
        batches, self._batches = self._batches, []
        for buf, names in batches:
            buf.map_sync(wgpu.MapMode.READ)
            try:
                raw = bytes(buf.read_mapped())
            finally:
                buf.unmap()
            ticks = struct.unpack(f"<{2 * len(names)}Q", raw[:16 * len(names)])
            for k, name in enumerate(names):
                ns = max(0, ticks[2 * k + 1] - ticks[2 * k]) * self.period_ns
                s = self.stats_ns.get(name)
                if s is None:
                    self.stats_ns[name] = [1, ns, ns, ns]
                else:
                    s[0] += 1
                    s[1] += ns
                    s[2] = min(s[2], ns)
                    s[3] = max(s[3], ns)
            buf.destroy()

    def stats(self) -> dict[str, dict[str, float]]:
        """Per kernel: count, total_ms, mean_us, min_us, max_us (flushes and reads first)."""
        self.device.stream.flush()
        self.collect()
        return {k: {"count": v[0], "total_ms": v[1] / 1e6, "mean_us": v[1] / v[0] / 1e3,
                    "min_us": v[2] / 1e3, "max_us": v[3] / 1e3} for k, v in self.stats_ns.items()}

    def table(self) -> str:
        """The per-kernel GPU time table, slowest total first."""
        rows = sorted(self.stats().items(), key=lambda kv: -kv[1]["total_ms"])
        head = f"khal WebGPU profile ({self.device.describe()}; timestamp queries, each dispatch in its own pass)"
        lines = [head, f"{'kernel':<40} {'count':>7} {'total ms':>10} {'mean us':>10} {'min us':>9} {'max us':>9}"]
        for name, s in rows:
            lines.append(f"{name:<40} {s['count']:>7} {s['total_ms']:>10.3f} {s['mean_us']:>10.2f} "
                         f"{s['min_us']:>9.2f} {s['max_us']:>9.2f}")
        return "\n".join(lines)

    def reset(self) -> None:
        self.collect()
        self.stats_ns.clear()


def enable_profiling(device: WebGpuDevice) -> Timer:
    """Time every dispatch of ``device`` from now on (WebGpuError without timestamp-query)."""
    st = device.stream
    with st.lock:
        if st.timer is None:
            st.flush()
            st.timer = Timer(device)
        return st.timer  # type: ignore[no-any-return]


def disable_profiling(device: WebGpuDevice) -> Timer | None:
    """Stop timing; the Timer (with what it measured) is returned."""
    st = device.stream
    with st.lock:
        t = st.timer
        if t is not None:
            st.flush()
            st.timer = None
            t.collect()
        return t  # type: ignore[no-any-return]
