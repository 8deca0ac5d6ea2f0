"""Recordings, WebGPU's counterpart of CUDA graphs.

WebGPU has no graphs, and a command buffer runs once. ``capture`` therefore records the
launches issued inside it, on this thread, once: for each its pipeline, bind groups, group
counts (or indirect arguments) and push constants, plus device copies and clears, without
running anything. :meth:`Recording.launch` replays them: the stream's pending work is
submitted, then the recorded commands are encoded into one command encoder (the dispatches in
one compute pass, as on the stream) and submitted once. No argument is checked, packed or
looked up again: a replay costs the C calls of the commands and nothing else.

    with capture(device) as cap:          # or capture_recording(step, bufs)
        step(bufs)                        # recorded, not run
    rec = cap.recording
    for _ in range(1000):
        rec.launch()
    rec.rebind(other_bufs)                # re-records step(other_bufs)

Refused inside a capture (CaptureError, saying what to do): allocations, host uploads, host
reads and synchronisation. Allowed: uniform values never seen before (WebGPU writes them into
regions the recording keeps: the uniform pool never rewrites a region while a recording is
alive). A recording keeps every buffer it binds alive; one freed with ``free()`` makes
``launch`` raise, naming it.
"""

from __future__ import annotations

import itertools
from threading import get_ident
from typing import Any, Callable

from khal_runtime.backends.webgpu import memory
from khal_runtime.backends.webgpu.device import as_device
from khal_runtime.backends.webgpu._wgpu import wgpu_module
from khal_runtime.backends.webgpu.device import WebGpuDevice
from khal_runtime.errors import CaptureError, WebGpuError
from khal_runtime.backends.webgpu.stream import CommandStream
from khal_runtime.backends.webgpu.uniform_pool import uniform_pool

__all__ = ["Capture", "Recording", "capture", "capture_recording"]

_labels = itertools.count(1)


class Recording:
    """Launches recorded once, replayed with :meth:`launch` (see the module docstring)."""

    def __init__(self, stream: CommandStream, label: str) -> None:
        self.stream = stream
        self.device: WebGpuDevice = stream.device
        self.label = label
        #: ("d", pipeline, bind groups, (gx, gy, gz), immediates) | ("i", pipeline, bind groups,
        #: args buffer, offset, immediates) | ("clear", allocation, offset, size) |
        #: ("copy", src allocation, offset, dst allocation, offset, size)
        self.commands: list[tuple[Any, ...]] = []
        self.kernels: list[str] = []
        self.launches = 0
        self.updates = 0
        self._fn: Callable[..., Any] | None = None
        self._keep: Any = None
        self._frees = memory.FREES[0]
        self._pool = uniform_pool(self.device)
        self._pool.pins += 1
        self._closed = False
        #: the commands as C calls per pass (compile_commands), made on the first launch
        self._compiled: list[tuple[Any, ...]] | None = None

    # -- filled by the stream while capturing ------------------------------------------------------
    def add_dispatch(self, pl: Any, bgs: tuple[Any, ...], groups: tuple[int, int, int], imm: Any) -> None:
        self._compiled = None
        self.commands.append(("d", pl, bgs, groups, imm))
        self.kernels.append(pl.name)

    def add_indirect(self, pl: Any, bgs: tuple[Any, ...], buffer: Any, offset: int, imm: Any) -> None:
        self._compiled = None
        self.commands.append(("i", pl, bgs, buffer, offset, imm))
        self.kernels.append(pl.name)

    def add_clear(self, a: memory.Allocation, offset: int, size: int) -> None:
        self._compiled = None
        self.commands.append(("clear", a, offset, size))

    def add_copy(self, src: memory.Allocation, so: int, dst: memory.Allocation, do: int, size: int) -> None:
        self._compiled = None
        self.commands.append(("copy", src, so, dst, do, size))

    @property
    def dispatch_count(self) -> int:
        return sum(1 for c in self.commands if c[0] in ("d", "i"))

    # -- replay ------------------------------------------------------------------------------------
    def _check_live(self) -> None:
        if self._closed:
            raise CaptureError(f"recording {self.label!r} was closed")
        if self._frees == memory.FREES[0]:
            return
        freed = memory.FREED
        for c in self.commands:
            if c[0] in ("d", "i"):
                for bg in c[2]:
                    if any(s in freed for s in bg.serials):
                        raise CaptureError(
                            f"recording {self.label!r}: a buffer bound by its launch of {c[1].name} was "
                            "freed; keep every buffer a recording uses alive, or re-record it "
                            "(recording.update / rebind) with live buffers")
            elif c[0] == "clear" and c[1].freed or c[0] == "copy" and (c[1].freed or c[3].freed):
                raise CaptureError(f"recording {self.label!r}: a buffer it copies or clears was freed")
        self._frees = memory.FREES[0]

    def launch(self) -> None:
        """Replay: one command encoder, one submit, after the work already issued."""
        self._check_live()
        st = self.stream
        wgpu = wgpu_module()
        with st.lock:
            st.forbid_in_capture(f"launching recording {self.label!r}",
                                 "replay it after the capture ends")
            st.flush()
            dev = self.device.device
            enc = dev.create_command_encoder(label=f"khal recording {self.label}")
            timer = st.timer
            try:
                if timer is not None:
                    timer.replay(self, enc)
                elif st._lib is not None:
                    if self._compiled is None:
                        self._compiled = compile_commands(self.commands, st._lib)
                    replay_compiled(self._compiled, enc)
                else:
                    encode(self.commands, enc, st)
                dev.queue.submit([enc.finish()])
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, wgpu.GPUError):
                    raise WebGpuError(f"replaying recording {self.label!r} failed: "
                                      f"{' '.join(str(exc).split())[:800]}") from None
                raise
            st.submits += 1
            st.dispatched += self.dispatch_count
            if timer is not None:
                timer.after_submit(st)
        self.launches += 1

    __call__ = launch

    # -- re-recording --------------------------------------------------------------------------------
    def update(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Re-record ``fn(*args, **kwargs)`` into this recording (other buffers, other values)."""
        if self._closed:
            raise CaptureError(f"recording {self.label!r} was closed")
        cap = Capture(self.stream, label=self.label, keep=(args, kwargs))
        with cap:
            fn(*args, **kwargs)
        new = cap.recording
        assert new is not None
        self.commands, self.kernels = new.commands, new.kernels
        self._compiled = None
        new.commands = []
        new.close()
        self._keep = (args, kwargs)
        self._fn = fn
        self._frees = memory.FREES[0]
        self.updates += 1

    def rebind(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`update` with the function given to :func:`capture_recording`."""
        if self._fn is None:
            raise CaptureError(f"recording {self.label!r} was not made by capture_recording(fn, ...): "
                               "use recording.update(fn, *args)")
        self.update(self._fn, *args, **kwargs)

    def close(self) -> None:
        """Drop the recorded commands (and their hold on the uniform pool). Idempotent."""
        if not self._closed:
            self._closed = True
            self.commands = []
            self._compiled = None
            self._keep = None
            self._pool.pins = max(0, self._pool.pins - 1)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Recording {self.label!r} {self.dispatch_count} dispatch(es) on {self.device.describe()}>"


def encode(commands: list[tuple[Any, ...]], enc: Any, st: CommandStream,
           pass_args: Callable[[int, int], dict[str, Any]] | None = None) -> None:
    """Encode recorded ``commands`` into ``enc``: consecutive dispatches share one compute pass.
    ``pass_args(first, last)`` gives extra ``begin_compute_pass`` arguments (timestamps)."""
    lib = st._lib
    p = None
    praw: Any = None
    last_pl: Any = None
    last_bg: list[Any] = [None] * 4
    last_imm: Any = None
    n = len(commands)
    for k, c in enumerate(commands):
        kind = c[0]
        if kind == "d" or kind == "i":
            if p is None:
                extra = pass_args(k, n) if pass_args is not None else {}
                p = enc.begin_compute_pass(label="khal replay", **extra)
                praw = p._internal if lib is not None else p
                last_pl, last_bg, last_imm = None, [None] * 4, None
            pl, bgs, imm = c[1], c[2], c[-1]
            if lib is not None:
                if pl is not last_pl:
                    lib.wgpuComputePassEncoderSetPipeline(praw, pl.raw)
                    last_pl = pl
                for i, bg in enumerate(bgs):
                    if last_bg[i] is not bg:
                        lib.wgpuComputePassEncoderSetBindGroup(praw, i, bg.raw, bg.n_dyn, bg.offsets)
                        last_bg[i] = bg
                if imm is not None and imm is not last_imm:
                    lib.wgpuComputePassEncoderSetImmediates(praw, 0, imm.cdata, imm.size)
                    last_imm = imm
                if kind == "d":
                    lib.wgpuComputePassEncoderDispatchWorkgroups(praw, *c[3])
                else:
                    lib.wgpuComputePassEncoderDispatchWorkgroupsIndirect(praw, c[3]._internal, c[4])
            else:
                if pl is not last_pl:
                    p.set_pipeline(pl.gpu)
                    last_pl = pl
                for i, bg in enumerate(bgs):
                    if last_bg[i] is not bg:
                        p.set_bind_group(i, bg.gpu, bg.dyn)
                        last_bg[i] = bg
                if imm is not None and imm is not last_imm:
                    p.set_immediates(0, imm.data, 0, imm.size)
                    last_imm = imm
                if kind == "d":
                    p.dispatch_workgroups(*c[3])
                else:
                    p.dispatch_workgroups_indirect(c[3], c[4])
        else:
            if p is not None:
                p.end()
                p = None
            if kind == "clear":
                enc.clear_buffer(c[1].buffer, c[2], c[3])
            else:
                enc.copy_buffer_to_buffer(c[1].buffer, c[2], c[3].buffer, c[4], c[5])
    if p is not None:
        p.end()


def compile_commands(commands: list[tuple[Any, ...]], lib: Any) -> list[tuple[Any, ...]]:
    """``commands`` as what a replay runs: ``("pass", [(C function, args after the pass
    handle), ...])`` per run of dispatches (pass state already set is not set again), and the
    copies and clears between them as they are. Replaying this costs the C calls alone."""
    out: list[tuple[Any, ...]] = []
    calls: list[tuple[Any, tuple[Any, ...]]] | None = None
    last_pl: Any = None
    last_bg: list[Any] = [None] * 4
    last_imm: Any = None
    for c in commands:
        kind = c[0]
        if kind == "d" or kind == "i":
            if calls is None:
                calls = []
                out.append(("pass", calls))
                last_pl, last_bg, last_imm = None, [None] * 4, None
            pl, bgs, imm = c[1], c[2], c[-1]
            if pl is not last_pl:
                calls.append((lib.wgpuComputePassEncoderSetPipeline, (pl.raw,)))
                last_pl = pl
            for i, bg in enumerate(bgs):
                if last_bg[i] is not bg:
                    calls.append((lib.wgpuComputePassEncoderSetBindGroup, (i, bg.raw, bg.n_dyn, bg.offsets)))
                    last_bg[i] = bg
            if imm is not None and imm is not last_imm:
                calls.append((lib.wgpuComputePassEncoderSetImmediates, (0, imm.cdata, imm.size)))
                last_imm = imm
            if kind == "d":
                calls.append((lib.wgpuComputePassEncoderDispatchWorkgroups, tuple(c[3])))
            else:
                calls.append((lib.wgpuComputePassEncoderDispatchWorkgroupsIndirect, (c[3]._internal, c[4])))
        else:
            calls = None
            out.append(c)
    return out


def replay_compiled(compiled: list[tuple[Any, ...]], enc: Any) -> None:
    """Encode :func:`compile_commands`' output into ``enc``."""
    for seg in compiled:
        kind = seg[0]
        if kind == "pass":
            p = enc.begin_compute_pass(label="khal replay")
            praw = p._internal
            for f, a in seg[1]:
                f(praw, *a)
            p.end()
        elif kind == "clear":
            enc.clear_buffer(seg[1].buffer, seg[2], seg[3])
        else:
            enc.copy_buffer_to_buffer(seg[1].buffer, seg[2], seg[3].buffer, seg[4], seg[5])


class Capture:
    """An open capture on a device's stream, for this thread. A context manager, or
    :meth:`begin` / :meth:`end`."""

    def __init__(self, where: Any = None, *, label: str | None = None, keep: Any = None) -> None:
        if isinstance(where, CommandStream):
            self.stream = where
        else:

            self.stream = as_device(where).stream
        self.label = label or f"recording#{next(_labels)}"
        self.recording: Recording | None = None
        self._keep = keep
        self._open: Recording | None = None

    def begin(self) -> Capture:
        st = self.stream
        with st.lock:
            cur = st._captures.get(get_ident())
            if cur is not None:
                raise CaptureError(f"this thread is already capturing {cur.label!r} on "
                                   f"{st.device.describe()}; end that capture first")
            rec = Recording(st, self.label)
            rec._keep = self._keep
            st.set_capture(get_ident(), rec)
        self._open = rec
        return self

    def _close(self) -> Recording:
        rec = self._open
        if rec is None:
            raise CaptureError(f"capture {self.label!r} is not open")
        self._open = None
        self.stream.set_capture(get_ident(), None)
        return rec

    def end(self) -> Recording:
        self.recording = self._close()
        return self.recording

    def abort(self) -> None:
        if self._open is not None:
            self._close().close()

    def __enter__(self) -> Capture:
        return self.begin()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
            return
        self.end()


def capture(device: Any = None, *, label: str | None = None) -> Capture:
    """``with capture(device) as cap: ...`` then ``cap.recording`` (device: ordinal, device or
    stream; default device 0)."""
    return Capture(device, label=label)


def capture_recording(fn: Callable[..., Any], *args: Any, device: Any = None, label: str | None = None,
                      **kwargs: Any) -> Recording:
    """Record ``fn(*args, **kwargs)``; the recording remembers ``fn`` (see :meth:`Recording.rebind`)
    and keeps ``args`` / ``kwargs`` alive."""
    cap = Capture(device, label=label or getattr(fn, "__name__", None), keep=(args, kwargs))
    with cap:
        fn(*args, **kwargs)
    rec = cap.recording
    assert rec is not None
    rec._fn = fn
    return rec
