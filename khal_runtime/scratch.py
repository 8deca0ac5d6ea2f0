"""Scratch memory of Triton kernels: the buffer a launch passes as a kernel's trailing
``global_scratch`` / ``profile_scratch`` pointer (:attr:`khal_runtime.manifest.TritonFacts.global_scratch`).

Triton's own launcher asks its allocator (``triton.set_allocator``) for ``programs x num_ctas x
size`` bytes at every launch. Here the runtime keeps one buffer per (device, stream), a
:class:`~khal_runtime.buffers.DeviceBuffer` of its own, and grows it when a launch needs more (to
the need or twice the old size, whichever is larger): launches on one stream run one after the
other, so they can share it. An outgrown buffer is kept, not freed, until :func:`release`: a
launch remembered before (the typed call's memo, a bound launch) may still pass its pointer,
and a buffer only that stream's launches ever use stays valid for them. No allocation per launch.

Per-thread streams. ``CU_STREAM_PER_THREAD`` (and the NULL stream under cuda-bindings' per-thread
default stream) is one handle for a different stream in each thread (the backend's
``is_per_thread_stream``): its launches in two threads run concurrently, so each thread has its
own buffer (:func:`stream_key`), retired (kept until :func:`release`) when the thread ends, and a
launch on such a stream is never remembered (:func:`pointers` says so): a remembered launch could
be repeated by another thread.

Graph capture. A captured launch must not share its scratch with eager launches (a replay on
another stream would race them), and nothing may be allocated while a capture is open. So the
first scratch launch captured on a stream takes that stream's buffer out of the pool: the capture
keeps it (a capture of the runtime: its graph holds it for as long as the graph lives; one of
another library, ``torch.cuda.graph``: kept for the process), every later launch of the capture
on that stream uses it, and the next eager launch on the stream allocates a new one. A capture
whose launches need more than the stream's buffer holds raises :class:`~khal_runtime.errors.CaptureError`
saying to run the step once before capturing (the warm-up grows the buffer). Re-capturing a graph
(:meth:`Graph.update`, ``rebind``) reuses the scratch the graph held: replays of one graph never
overlap. The beginning and the end of a capture of the runtime empty every launch memo
(:func:`khal_runtime.memo.bump_epoch`) and change :data:`GENERATION`, which bound launches check,
so that no launch inside a capture reuses an eager launch's pointer; a launch whose pointers are a
capture's is never remembered (:func:`pointers` says so), so that no eager launch reuses those. A
remembered or bound launch made before another library's capture and repeated inside it is not seen
(the runtime sees only its own captures begin): it passes the stream's eager buffer.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from khal_runtime import capture_state
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.device import Device
from khal_runtime.errors import CaptureError
from khal_runtime.memo import bump_epoch

__all__ = ["GENERATION", "held", "pointer", "pointers", "release", "stream_key", "thread_token"]

#: sizes are rounded up to this (cuMemAlloc aligns every allocation to at least 256 bytes, more
#: than any scratch alignment a manifest may record)
GRAIN = 256
#: changes whenever a remembered scratch pointer may not be the right one any more (a capture of
#: the runtime began or ended, :func:`release`): a bound launch compares it at each launch
GENERATION = [0]

#: (device, stream handle, thread token or 0: :func:`stream_key`) -> (pointer, bytes, buffer): the
#: stream's eager buffer
_pools: dict[tuple[int, int, int], tuple[int, int, DeviceBuffer]] = {}
#: outgrown eager buffers, kept until release(): a remembered launch may still pass them
_retired: list[DeviceBuffer] = []
#: (device, stream handle, thread token or 0) -> the buffers taken for captures of another library
#: (the last one in use), kept for the process (the runtime cannot see when those graphs go)
_foreign: dict[tuple[int, int, int], list[DeviceBuffer]] = {}
_lock = threading.Lock()
_listening = [False]


def _capture_changed() -> None:
    """A capture of the runtime began or ended: no remembered launch may pass a pointer chosen
    on the other side of it."""
    GENERATION[0] += 1
    bump_epoch()


def _listen() -> None:
    if not _listening[0]:
        _listening[0] = True
        capture_state.add_listener(_capture_changed)


class _ThreadEnd:
    """Held only by one thread's local storage: it goes when the thread ends (:func:`thread_token`)."""

    __slots__ = ("token", "__weakref__")

    token: int


_local = threading.local()
#: thread tokens: one per thread that asked, never reused (thread idents are)
_tokens = itertools.count(1)


def thread_token() -> int:
    """A number for the calling thread, never given to another one; when the thread ends, the
    scratch kept for it (its per-thread streams' buffers) is retired."""
    end: _ThreadEnd | None = _local.__dict__.get("end")
    if end is None:
        end = _ThreadEnd()
        end.token = next(_tokens)
        _local.end = end
        weakref.finalize(end, _thread_ended, end.token)
    return end.token


def _thread_ended(token: int) -> None:
    """A thread's storage went: its per-thread streams' buffers are retired (its stream's work may
    still be running: kept until :func:`release`, as an outgrown buffer is)."""
    with _lock:
        for key in [k for k in _pools if k[2] == token]:
            _retired.append(_pools.pop(key)[2])


def stream_key(st: Any) -> tuple[int, int, int]:
    """What scratch is kept per: (device, stream handle, 0), or, for a handle that is another
    stream in each thread (``CU_STREAM_PER_THREAD``), the calling thread's :func:`thread_token`
    in place of the 0."""
    h = st.handle
    if h > 2 or not st.backend_impl.is_per_thread_stream(h):  # (the per-thread handles are 0 and 2)
        return (st.device_id, h, 0)
    return (st.device_id, h, thread_token())


def _round(nbytes: int) -> int:
    return (nbytes + GRAIN - 1) // GRAIN * GRAIN


def pointers(st: Any, global_bytes: int, profile_bytes: int, what: str) -> tuple[int, int, bool]:
    """The two scratch pointers of a launch on stream ``st`` (:func:`pointer` each), and whether
    the launch must not be remembered: the stream is capturing (a launch whose pointers are a
    capture's must not be repeated eagerly: the runtime does not see another library's capture
    end), or it is a per-thread stream (the pointers are this thread's: another thread repeating
    the launch must take its own)."""
    if not global_bytes and not profile_bytes:
        return 0, 0, False
    key = stream_key(st)
    if st.is_capturing():
        return (_captured(st, key, global_bytes, what) if global_bytes else 0,
                _captured(st, key, profile_bytes, what) if profile_bytes else 0, True)
    return pointer(st, global_bytes, what, False), pointer(st, profile_bytes, what, False), key[2] != 0


def pointer(st: Any, nbytes: int, what: str, check_capture: bool = True) -> int:
    """A device pointer to at least ``nbytes`` of scratch memory for a launch on stream ``st``
    (a :class:`~khal_runtime.device.Stream`), 256-byte aligned; 0 when ``nbytes`` is 0. ``what``
    names the launch in errors; ``check_capture``: False when the caller knows ``st`` is not capturing."""
    if not nbytes:
        return 0
    key = stream_key(st)
    if check_capture and st.is_capturing():
        return _captured(st, key, nbytes, what)
    got = _pools.get(key)
    if got is not None and got[1] >= nbytes:
        return got[0]
    with _lock:
        _listen()
        got = _pools.get(key)
        if got is not None and got[1] >= nbytes:
            return got[0]
        size = _round(max(nbytes, 2 * got[1] if got is not None else 0))
        buf = DeviceBuffer.alloc(size, "uint8", device=st.device_id)
        if got is not None:
            _retired.append(got[2])
        _pools[key] = (buf.ptr, size, buf)
        return buf.ptr


def _captured(st: Any, key: tuple[int, int, int], nbytes: int, what: str) -> int:
    """The scratch of a launch captured on ``st``: the capture's own buffer for the stream."""
    cap = capture_state.current_capture(st) or capture_state.current_capture()
    mine: dict[tuple[int, int, int], list[DeviceBuffer]] | None = getattr(cap, "scratch", None)
    if mine is None:
        mine = _foreign
    with _lock:
        _listen()
        have = mine.get(key)
        if have and have[-1].nbytes >= nbytes:
            return have[-1].ptr
        take = None
        reuse: list[DeviceBuffer] = getattr(cap, "scratch_reuse", None) or []
        for i, b in enumerate(reuse):
            if b.device_id == key[0] and b.nbytes >= nbytes:
                take = reuse.pop(i)
                break
        if take is None:
            got = _pools.get(key)
            if got is not None and got[1] >= nbytes:
                take = got[2]
                del _pools[key]
        if take is None:
            held_now = _pools.get(key)
            raise CaptureError(
                f"{what}: needs {nbytes} bytes of scratch memory on stream 0x{st.handle:x} during graph capture, "
                f"and the runtime holds {held_now[1] if held_now else 0} bytes for that stream (allocating more would "
                "break the capture): run the step once on the stream before capturing it (a warm-up; the capture "
                "then takes the scratch the warm-up allocated)")
        mine.setdefault(key, []).append(take)
        return take.ptr


def held() -> dict[str, int]:
    """Bytes of scratch memory the runtime holds: ``pools`` (the streams' eager buffers),
    ``retired`` (outgrown ones, kept until :func:`release`) and ``foreign`` (taken by captures of
    another library). A graph's own scratch is the graph's (``Graph.scratch_bytes``)."""
    with _lock:
        return {"pools": sum(p[1] for p in _pools.values()), "retired": sum(b.nbytes for b in _retired),
                "foreign": sum(b.nbytes for bs in _foreign.values() for b in bs)}


def release() -> None:
    """Free the streams' scratch buffers and the outgrown ones, after every device that has one
    finished its work (the next scratch launch allocates again). Buffers of graphs stay theirs;
    those of another library's captures stay too. Not during a capture."""
    capture_state.forbid_in_capture("releasing Triton scratch memory", "release it after the capture ends")
    with _lock:
        bufs = [p[2] for p in _pools.values()] + _retired
        _pools.clear()
        _retired.clear()
        GENERATION[0] += 1
    for dev in sorted({b.device_id for b in bufs}):
        Device(dev).synchronize()
    for b in bufs:
        b.free()
