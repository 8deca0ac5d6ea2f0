"""The ordered command stream of one WebGPU device: an open command encoder and compute pass.

WebGPU has one queue per device and submits command buffers. Submitting one per dispatch costs
an order of magnitude more than recording the dispatch into an open compute pass
(benchmarks/RESULTS.md, 2026-11-30, "Figures formerly in code comments"), so the stream keeps one encoder and one compute pass open and records every
dispatch into it; it submits when something needs the results or the queue's order:

* a read-back (:meth:`read_back`: downloads, :meth:`synchronize`),
* a host upload (:meth:`write`): ``queue.write_buffer`` runs before any command buffer
  submitted after it, so an upload issued while dispatches are recorded but not submitted
  would overtake them; the stream submits them first,
* an explicit :meth:`flush`, a replayed recording, a buffer being freed,
* a full batch (``KHAL_WEBGPU_BATCH`` dispatches, default 1000).

Copies and clears end the open pass and go into the same encoder, so launches, copies and
clears reach the GPU in the order they were issued. Inside one compute pass WebGPU makes each
dispatch its own usage scope: a dispatch sees what the previous one wrote.

Thread safety: every method takes the stream's lock; several threads may launch on one device
(their launches are ordered as they take the lock).

Errors: WebGPU reports the validation errors of a pass when the encoder finishes, and one
invalid dispatch makes the whole command buffer invalid. The launch path checks what it can
beforehand (group limits, binding sizes and alignment, one buffer bound read-only and
read-write), so a failure here is rare; then the stream submits each command of the batch on
its own, in order (it logs them as it records them), so only the invalid dispatches are lost,
and raises :class:`WebGpuError` naming them. A batch holding commands it cannot replay (timed
passes, a caller's own use of :meth:`encoder`) is lost whole, and says so.
"""

from __future__ import annotations

import os
import threading
from threading import get_ident
from typing import TYPE_CHECKING, Any, Callable

from khal_runtime.backends.webgpu._wgpu import native, wgpu_module
from khal_runtime.errors import CaptureError, EnvVarError, WebGpuError

if TYPE_CHECKING:
    from khal_runtime.backends.webgpu.device import WebGpuDevice

__all__ = ["BATCH_ENV", "CommandStream"]

BATCH_ENV = "KHAL_WEBGPU_BATCH"
_DEFAULT_BATCH = 1000
#: staging buffers for read-backs at most this large are kept for the next one
_KEEP_STAGING = 64 << 20


def _batch_size() -> int:
    raw = os.environ.get(BATCH_ENV, "").strip()
    if not raw:
        return _DEFAULT_BATCH
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise EnvVarError(f"{BATCH_ENV}={raw!r}: expected an integer >= 1 (dispatches per submit; default "
                          f"{_DEFAULT_BATCH})", variable=BATCH_ENV, value=raw)
    return n


class CommandStream:
    """The device's one ordered stream of work (see the module docstring).

    Internal API, for this package: :meth:`record` (a dispatch), :meth:`record_indirect`,
    :meth:`encoder` (an open encoder with no open pass, for copies and clears), :meth:`write`
    (a host upload in order), :meth:`read_back`, :meth:`flush`, :meth:`synchronize`,
    :meth:`forbid_in_capture`. ``capture_for(thread)`` / the ``_captures`` table belong to
    :mod:`.recording`; ``timer`` to :mod:`.profiling`; ``on_dispatch`` is the tracing hook."""

    def __init__(self, device: WebGpuDevice) -> None:
        self.device = device
        self.lock = threading.RLock()
        self.batch = _batch_size()
        self._enc: Any = None        # open GPUCommandEncoder
        self._pass: Any = None       # open GPUComputePassEncoder
        self._praw: Any = None       # its native handle (fast path)
        self._dispatches = 0         # dispatches in the open encoder
        self._commands = 0           # copies, clears and timed passes in the open encoder
        #: the open encoder's commands, in order, as recording.py writes them ("d", "i", "clear",
        #: "copy"; "x": a timed pass, not replayable): what a rejected batch replays one by one
        self._log: list[tuple[Any, ...]] = []
        self._replayable = True      # every command of the open encoder is in _log
        self._keep: list[Any] = []   # objects the open encoder's commands use
        self._last_pl: Any = None    # pass state already set: skip setting it again
        self._last_bg: list[Any] = [None, None, None, None]
        self._last_imm: Any = None
        self._last_bgs: Any = None   # the bind-group tuple last set (a memoised call reuses it)
        #: thread id -> the Recording that thread is capturing into (recording.py, set_capture)
        self._captures: dict[int, Any] = {}
        self._timer: Any = None
        self._on_dispatch: Callable[[Any, tuple[int, int, int], bool], None] | None = None
        self._plain = False
        #: called (lock held) before every submit of this device's queue: the uniform pool's commit
        self.pre_submit: list[Callable[[], None]] = []
        self.submits = 0
        self.dispatched = 0
        self._staging: Any = None
        self._sync_src: Any = None
        nat = native()
        self._lib: Any = nat[0] if nat is not None else None
        self._ffi: Any = nat[1] if nat is not None else None
        self._update_mode()

    # -- state ---------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Commands (dispatches, copies, clears) recorded and not yet submitted."""
        return self._commands + self._dispatches

    def capturing(self) -> Any:
        """The Recording this thread is capturing into on this stream, else None."""
        return self._captures.get(get_ident()) if self._captures else None

    def forbid_in_capture(self, what: str, advice: str) -> None:
        """CaptureError if this thread is capturing on this stream: ``what`` cannot be recorded."""
        rec = self.capturing()
        if rec is not None:
            raise CaptureError(f"{what} during WebGPU capture ({rec.label!r} on "
                               f"{self.device.describe()}): {advice}")

    # -- recording -----------------------------------------------------------------------------
    def _begin(self) -> Any:
        if self._enc is None:
            self._enc = self.device.device.create_command_encoder(label="khal")
        self._pass = self._enc.begin_compute_pass(label="khal")
        self._praw = self._pass._internal if self._lib is not None else self._pass
        self._last_pl = self._last_bgs = self._last_imm = None
        self._last_bg = [None, None, None, None]
        return self._praw

    def _end_pass(self) -> None:
        p = self._pass
        if p is not None:
            self._pass = self._praw = None
            try:
                p.end()
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, "ending a compute pass")

    def record(self, pl: Any, bgs: tuple[Any, ...], gx: int, gy: int, gz: int, imm: Any) -> None:
        """Record one dispatch of pipeline ``pl`` (a :class:`.pipeline.Pipeline`) with bind
        groups ``bgs`` (a :class:`.bindings.BoundGroup` / ``DynBound`` per group index, in
        order), ``gx*gy*gz`` workgroups (already checked against the limit) and immediates
        ``imm`` (:class:`.bindings.Immediates` or None). The hot path: pass state already set
        (the same pipeline, the same bind-group tuple, the same immediates) is not set again."""
        with self.lock:
            if not self._plain:
                self._record_other(pl, bgs, gx, gy, gz, imm)
                return
            p = self._praw
            if p is None:
                p = self._begin()
            lib = self._lib
            if pl is not self._last_pl:
                lib.wgpuComputePassEncoderSetPipeline(p, pl.raw)
                self._last_pl = pl
            if bgs is not self._last_bgs:
                self._set_groups(p, bgs)
            if imm is not None and imm is not self._last_imm:
                lib.wgpuComputePassEncoderSetImmediates(p, 0, imm.cdata, imm.size)
                self._last_imm = imm
            lib.wgpuComputePassEncoderDispatchWorkgroups(p, gx, gy, gz)
            self._log.append(("d", pl, bgs, (gx, gy, gz), imm))
            self._dispatches += 1
            if self._dispatches >= self.batch:
                self.flush()

    def _set_groups(self, p: Any, bgs: tuple[Any, ...]) -> None:
        last = self._last_bg
        for i, bg in enumerate(bgs):
            if last[i] is not bg:
                self._lib.wgpuComputePassEncoderSetBindGroup(p, i, bg.raw, bg.n_dyn, bg.offsets)
                last[i] = bg
        self._last_bgs = bgs

    def _update_mode(self) -> None:
        """Whether :meth:`record` may take its hot path: the C calls are there, and no capture,
        timer or tracing hook wants to see the dispatch."""
        self._plain = (self._lib is not None and not self._captures and self._timer is None
                       and self._on_dispatch is None)

    @property
    def timer(self) -> Any:
        """The :class:`.profiling.Timer` while GPU timing is on (each dispatch in its own pass)."""
        return self._timer

    @timer.setter
    def timer(self, t: Any) -> None:
        with self.lock:
            self._timer = t
            self._update_mode()

    @property
    def on_dispatch(self) -> Callable[[Any, tuple[int, int, int], bool], None] | None:
        """Tracing hook: ``on_dispatch(pipeline, groups, indirect)`` per recorded dispatch
        (``trace_fields`` in :mod:`.profiling` says what to print of it)."""
        return self._on_dispatch

    @on_dispatch.setter
    def on_dispatch(self, fn: Callable[[Any, tuple[int, int, int], bool], None] | None) -> None:
        with self.lock:
            self._on_dispatch = fn
            self._update_mode()

    def set_capture(self, thread: int, rec: Any) -> None:
        """Make ``thread``'s dispatches go to Recording ``rec`` (None: back to the stream)."""
        with self.lock:
            if rec is None:
                self._captures.pop(thread, None)
            else:
                self._captures[thread] = rec
            self._update_mode()

    def _record_other(self, pl: Any, bgs: tuple[Any, ...], gx: int, gy: int, gz: int, imm: Any) -> None:
        """:meth:`record` off the hot path: into a capture, a timed pass, through wgpu-py's
        public methods, or with the tracing hook."""
        if self._captures:
            rec = self._captures.get(get_ident())
            if rec is not None:
                rec.add_dispatch(pl, bgs, (gx, gy, gz), imm)
                return
        if self._timer is not None:
            self._timer.record(self, pl, bgs, (gx, gy, gz), imm, None)
            return
        p = self._praw
        if p is None:
            p = self._begin()
        if self._lib is not None:
            if pl is not self._last_pl:
                self._lib.wgpuComputePassEncoderSetPipeline(p, pl.raw)
                self._last_pl = pl
            if bgs is not self._last_bgs:
                self._set_groups(p, bgs)
            if imm is not None and imm is not self._last_imm:
                self._lib.wgpuComputePassEncoderSetImmediates(p, 0, imm.cdata, imm.size)
                self._last_imm = imm
            self._lib.wgpuComputePassEncoderDispatchWorkgroups(p, gx, gy, gz)
        else:
            self._record_public(p, pl, bgs, imm)
            p.dispatch_workgroups(gx, gy, gz)
        self._log.append(("d", pl, bgs, (gx, gy, gz), imm))
        self._dispatches += 1
        if self._on_dispatch is not None:
            self._on_dispatch(pl, (gx, gy, gz), False)
        if self._dispatches >= self.batch:
            self.flush()

    def _record_public(self, p: Any, pl: Any, bgs: tuple[Any, ...], imm: Any) -> None:
        if pl is not self._last_pl:
            p.set_pipeline(pl.gpu)
            self._last_pl = pl
        for i, bg in enumerate(bgs):
            if self._last_bg[i] is not bg:
                p.set_bind_group(i, bg.gpu, bg.dyn)
                self._last_bg[i] = bg
        if imm is not None and imm is not self._last_imm:
            p.set_immediates(0, imm.data, 0, imm.size)
            self._last_imm = imm

    def record_indirect(self, pl: Any, bgs: tuple[Any, ...], args_buffer: Any, args_offset: int,
                        imm: Any) -> None:
        """Record one dispatch whose group counts are read from ``args_buffer`` (a wgpu buffer
        with INDIRECT usage) at ``args_offset`` when it runs."""
        with self.lock:
            rec = self.capturing()
            if rec is not None:
                rec.add_indirect(pl, bgs, args_buffer, args_offset, imm)
                return
            if self._timer is not None:
                self._timer.record(self, pl, bgs, None, imm, (args_buffer, args_offset))
                return
            p = self._praw
            if p is None:
                p = self._begin()
            if self._lib is not None:
                if pl is not self._last_pl:
                    self._lib.wgpuComputePassEncoderSetPipeline(p, pl.raw)
                    self._last_pl = pl
                if bgs is not self._last_bgs:
                    self._set_groups(p, bgs)
                if imm is not None and imm is not self._last_imm:
                    self._lib.wgpuComputePassEncoderSetImmediates(p, 0, imm.cdata, imm.size)
                    self._last_imm = imm
                self._lib.wgpuComputePassEncoderDispatchWorkgroupsIndirect(
                    p, args_buffer._internal, args_offset)
            else:
                self._record_public(p, pl, bgs, imm)
                p.dispatch_workgroups_indirect(args_buffer, args_offset)
            self._keep.append(args_buffer)
            self._log.append(("i", pl, bgs, args_buffer, args_offset, imm))
            self._dispatches += 1
            if self._on_dispatch is not None:
                self._on_dispatch(pl, (0, 0, 0), True)
            if self._dispatches >= self.batch:
                self.flush()

    def encoder(self) -> Any:
        """The open command encoder with no compute pass open, for commands of the caller's own
        (counted as one command; a rejected batch that holds one is not replayed: prefer
        :meth:`clear_buffer` / :meth:`copy_buffer`). Call with :attr:`lock` held."""
        self._replayable = False
        return self._encoder()

    def clear_buffer(self, buffer: Any, offset: int, size: int) -> None:
        """Record ``clear_buffer`` in order (lock held)."""
        self._encoder().clear_buffer(buffer, offset, size)
        self._log.append(("clear", buffer, offset, size))

    def copy_buffer(self, src: Any, src_offset: int, dst: Any, dst_offset: int, size: int) -> None:
        """Record ``copy_buffer_to_buffer`` in order (lock held)."""
        self._encoder().copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size)
        self._log.append(("copy", src, src_offset, dst, dst_offset, size))

    def _encoder(self) -> Any:
        self._end_pass()
        if self._enc is None:
            self._enc = self.device.device.create_command_encoder(label="khal")
        self._commands += 1
        return self._enc

    def keep(self, obj: Any) -> None:
        """Keep ``obj`` alive until the open encoder is submitted."""
        self._keep.append(obj)

    # -- submission ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Submit everything recorded so far (nothing waits for it to run); the ``pre_submit``
        hooks run first, even when nothing is recorded (a replay submits after a flush)."""
        with self.lock:
            for hook in self.pre_submit:
                hook()
            enc = self._enc
            if enc is None:
                return
            self._end_pass()
            if self._enc is None:  # ending the pass failed: its batch was replayed command by command
                return
            timer = self._timer
            try:
                if timer is not None:
                    timer.before_finish(self, enc)
                cbuf = enc.finish()
                self.device.queue.submit([cbuf])
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, "submitting")
            finally:
                self._reset()
            self.submits += 1
            if timer is not None:
                timer.after_submit(self)

    def _reset(self) -> None:
        self._enc = self._pass = self._praw = None
        self.dispatched += self._dispatches
        self._dispatches = self._commands = 0
        self._log = []
        self._replayable = True
        self._keep = []
        self._last_pl = self._last_imm = self._last_bgs = None

    def _fail(self, exc: BaseException, doing: str) -> None:
        wgpu = wgpu_module()
        log, replayable = self._log, self._replayable and self._timer is None
        names = [c[1].name for c in log if c[0] in ("d", "i")]
        self._enc = self._pass = self._praw = None
        self._reset()
        if not isinstance(exc, wgpu.GPUError):
            raise exc
        first = str(exc).strip().splitlines()
        why = " ".join(s.strip() for s in first[:12])
        if replayable and names and doing in ("submitting", "ending a compute pass"):
            # one invalid command makes the whole command buffer invalid: run each command of
            # the batch on its own, in order, so that only the invalid ones are lost
            failed, ran = self._replay(log)
            if not failed:
                return  # all of it ran on its own (the batch-level failure did not recur)
            uniq = sorted({n for n, _ in failed})
            raise WebGpuError(
                f"WebGPU rejected {len(failed)} dispatch(es) of {', '.join(uniq[:8])}"
                f"{' and more' if len(uniq) > 8 else ''} on {self.device.describe()}: {failed[0][1]}. "
                f"Those did not run; the other {ran} command(s) of their batch ran, in order") from None
        uniq = sorted(set(names))
        what = (f"a batch of {len(names)} dispatch(es) of {', '.join(uniq[:8])}"
                f"{' and more' if len(uniq) > 8 else ''}") if names else "copies / clears"
        raise WebGpuError(
            f"WebGPU rejected {what} on {self.device.describe()} while {doing}: "
            f"{why}. The work of that batch did not run. "
            f"Set {BATCH_ENV}=1 to submit each dispatch alone and find the one at fault") from None

    def _replay(self, log: list[tuple[Any, ...]]) -> tuple[list[tuple[str, str]], int]:
        """Submit each command of ``log`` alone, in order: ([(entry, why)] of the dispatches
        WebGPU rejects, how many commands ran). The failure path of a batch only."""
        wgpu = wgpu_module()
        dev, queue = self.device.device, self.device.queue
        failed: list[tuple[str, str]] = []
        ran = 0
        for c in log:
            kind = c[0]
            try:
                enc = dev.create_command_encoder(label="khal replay")
                if kind == "d" or kind == "i":
                    pl, bgs, imm = c[1], c[2], c[-1]
                    p = enc.begin_compute_pass(label=f"khal replay {pl.name}")
                    p.set_pipeline(pl.gpu)
                    for i, bg in enumerate(bgs):
                        p.set_bind_group(i, bg.gpu, bg.dyn)
                    if imm is not None:
                        p.set_immediates(0, imm.data, 0, imm.size)
                    if kind == "d":
                        p.dispatch_workgroups(*c[3])
                    else:
                        p.dispatch_workgroups_indirect(c[3], c[4])
                    p.end()
                elif kind == "clear":
                    enc.clear_buffer(c[1], c[2], c[3])
                else:
                    enc.copy_buffer_to_buffer(*c[1:])
                queue.submit([enc.finish()])
                self.submits += 1
                ran += 1
            except Exception as exc:  # noqa: BLE001
                if not isinstance(exc, wgpu.GPUError):
                    raise
                name = c[1].name if kind == "d" or kind == "i" else kind
                failed.append((name, " ".join(s.strip() for s in str(exc).strip().splitlines()[:12])))
        return failed, ran

    def write(self, buffer: Any, offset: int, data: Any) -> None:
        """``queue.write_buffer`` in the stream's order: work recorded before it is submitted
        first (so the upload cannot overtake it)."""
        with self.lock:
            self.forbid_in_capture("a host upload", "captured work runs later, when the recording is "
                                   "launched; upload before the capture, or copy from a device buffer")
            if self._enc is not None:
                self.flush()
            try:
                self.device.queue.write_buffer(buffer, offset, data)
            except Exception as exc:  # noqa: BLE001
                self._fail(exc, f"uploading {len(memoryview(data).cast('B'))} bytes")

    def read_back(self, buffer: Any, offset: int, size: int) -> memoryview:
        """Bytes ``[offset, offset+size)`` of ``buffer`` (offset and size multiples of 4) after
        every recorded command has run: one copy into a mappable staging buffer, recorded
        after them, one submit, one map."""
        wgpu = wgpu_module()
        with self.lock:
            self.forbid_in_capture("a host read (read-back / synchronize)",
                                   "captured work does not run until the recording is launched; read "
                                   "results after recording.launch()")
            st = self._staging
            if st is None or st.size < size:
                cap = 1 << max(8, (size - 1).bit_length())
                st = self.device.device.create_buffer(
                    label="khal staging", size=cap,
                    usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            self.copy_buffer(buffer, offset, st, 0, size)
            self.flush()
            try:
                st.map_sync(wgpu.MapMode.READ, 0, size)
                try:
                    data = st.read_mapped(0, size)
                finally:
                    st.unmap()
            except Exception as exc:  # noqa: BLE001
                self._staging = None
                if isinstance(exc, wgpu.GPUError) or isinstance(exc, RuntimeError):
                    raise WebGpuError(f"reading {size} bytes back from {self.device.describe()} "
                                      f"failed: {exc}") from None
                raise
            self._staging = st if st.size <= _KEEP_STAGING else None
            return memoryview(data)

    def synchronize(self) -> None:
        """Submit everything and wait until it has run. (``queue.on_submitted_work_done_sync``
        raises a cffi TypeError in wgpu-py 0.32: this reads 4 bytes back instead, which waits
        for every earlier submission, as submissions complete in order.)"""
        wgpu = wgpu_module()
        with self.lock:
            self.forbid_in_capture("a synchronisation", "a host wait cannot be recorded; synchronise "
                                   "after the capture (or after recording.launch())")
            if self._sync_src is None:
                self._sync_src = self.device.device.create_buffer(
                    label="khal sync", size=4, usage=wgpu.BufferUsage.COPY_SRC)
            self.read_back(self._sync_src, 0, 4)

    def __repr__(self) -> str:
        return f"<CommandStream {self.device.describe()} pending={self._commands}>"
