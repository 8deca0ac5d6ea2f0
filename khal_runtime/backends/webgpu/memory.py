"""Device memory on WebGPU: storage buffers, views of them, and the copies between host and
device, all in the order of the device's :class:`~.stream.CommandStream`.

* :class:`Allocation`: one wgpu buffer (usage STORAGE | COPY_SRC | COPY_DST, plus INDIRECT
  where asked), at least 4 bytes and a multiple of 4 (WebGPU copies whole words), with a
  serial number that is never reused (the bind-group cache keys on it, not on ``id()``).
* :class:`View`: ``(allocation, byte offset, byte size)``: what a storage binding binds,
  exactly, so that ``arrayLength`` / ``GetDimensions`` in the shader sees the element count.
* :func:`upload`, :func:`download`, :func:`fill_zero`, :func:`copy`: ordered with launches
  (an upload submits the launches recorded before it; a download waits for all of them).
* :func:`check_storage`: the named error for a view that cannot be bound (offset not a
  multiple of ``min_storage_buffer_offset_alignment``, size not a multiple of 4, empty, or
  larger than ``max_storage_buffer_binding_size``).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, NamedTuple

from khal_runtime.backends.webgpu._wgpu import wgpu_module
from khal_runtime.errors import ArgumentValueError, UnalignedViewError, WebGpuError

if TYPE_CHECKING:
    from khal_runtime.backends.webgpu.device import WebGpuDevice

__all__ = ["Allocation", "Resource", "View", "alloc", "check_storage", "copy", "download",
           "fill_zero", "free", "new_serial", "upload"]

_serials = itertools.count(1)
#: ``FREES[0]`` counts calls of :func:`free` that destroyed a buffer; ``FREED`` holds their
#: serials. A bound launch or a recording that saw another count re-checks its buffers.
FREES = [0]
FREED: set[int] = set()

#: What a binding binds: ``(wgpu buffer, serial of its allocation, byte offset, byte size)``;
#: the bind-group cache keys on ``(serial, offset, size)`` (serials are never reused).
Resource = tuple[Any, int, int, int]


def new_serial() -> int:
    """A serial number no other buffer of this process has or will have."""
    return next(_serials)


def _round4(n: int) -> int:
    return (n + 3) & ~3


class Allocation:
    """One wgpu storage buffer of ``nbytes`` usable bytes (``size`` physical)."""

    __slots__ = ("buffer", "nbytes", "size", "device", "serial", "freed", "indirect", "__weakref__")

    def __init__(self, buffer: Any, nbytes: int, device: WebGpuDevice, indirect: bool) -> None:
        self.buffer = buffer
        self.nbytes = nbytes
        self.size = int(buffer.size)
        self.device = device
        self.serial = new_serial()
        self.freed = False
        self.indirect = indirect

    @property
    def view(self) -> View:
        return View(self, 0, self.nbytes)

    def resource(self, offset: int, size: int) -> Resource:
        """What a binding of bytes ``[offset, offset + size)`` binds."""
        return (self.buffer, self.serial, offset, size)

    def __del__(self) -> None:
        # dropped without free(): let wgpu release it once no recorded command uses it, and drop
        # the cached bind groups that would otherwise keep its memory alive
        try:
            if not self.freed:
                _forget(self)
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"{self.nbytes} bytes"
        return f"<Allocation #{self.serial} {state} on WebGPU device {self.device.ordinal}>"


class View(NamedTuple):
    """Bytes ``[offset, offset + size)`` of an allocation: what one storage binding binds."""

    alloc: Allocation
    offset: int
    size: int


def _forget(a: Allocation) -> None:
    cache = a.device.caches.get("bindings")
    if cache is not None:
        cache.forget(a.serial)


def alloc(device: WebGpuDevice, nbytes: int, *, indirect: bool = False, label: str = "khal",
          device_lifetime: bool = False) -> Allocation:
    """A new storage buffer of ``nbytes`` usable bytes (uninitialised: WebGPU zeroes it).
    ``device_lifetime``: a buffer the device keeps as long as it lives (a helper's scratch, made on
    first use): made during a capture too, since it outlives every recording that references it."""
    wgpu = wgpu_module()
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"WebGPU allocation of {nbytes} bytes: the size must be >= 0")
    if not device_lifetime:
        device.stream.forbid_in_capture(
            "a device allocation", "allocate every buffer before the capture and reuse it in the captured work")
    size = max(4, _round4(nbytes))
    if size > device.max_buffer_size:
        raise ArgumentValueError(
            f"cannot allocate {nbytes} bytes on {device.describe()}: its largest buffer is "
            f"{device.max_buffer_size} bytes (max_buffer_size); split the data into several buffers")
    U = wgpu.BufferUsage
    usage = U.STORAGE | U.COPY_SRC | U.COPY_DST | (U.INDIRECT if indirect else 0)
    try:
        buf = device.device.create_buffer(label=label, size=size, usage=usage)
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, wgpu.GPUError):
            raise WebGpuError(f"allocating {nbytes} bytes on {device.describe()} failed: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}; "
                              "free unused buffers or allocate less") from None
        raise
    return Allocation(buf, nbytes, device, indirect)


def free(a: Allocation) -> None:
    """Destroy the buffer now (idempotent). Work already recorded that uses it is submitted
    first; a recording that uses it refuses to launch afterwards."""
    if a.freed:
        return
    st = a.device.stream
    with st.lock:
        if st.pending:
            st.flush()
        a.freed = True
        FREED.add(a.serial)
        FREES[0] += 1
        _forget(a)
        try:
            a.buffer.destroy()
        except Exception:  # noqa: BLE001  (already released)
            pass


def _live(v: View, what: str) -> None:
    if v.alloc.freed:
        raise ArgumentValueError(f"{what}: the buffer was freed")


def check_storage(v: View, where: str, itemsize: int = 4) -> None:
    """Raise the named error if ``v`` cannot be bound as a storage buffer; ``where`` says
    which argument it is (``"saxpy(): argument 'x' (storage float32)"``)."""
    a = v.alloc
    if a.freed:
        raise ArgumentValueError(f"{where}: the buffer was freed")
    dev = a.device
    align = dev.storage_align
    if v.offset % align:
        step = max(1, align // max(1, itemsize))
        raise UnalignedViewError(
            f"{where}: a slice starting at byte {v.offset} cannot be bound on {dev.describe()}: "
            f"WebGPU storage bindings start at multiples of {align} bytes "
            f"(min_storage_buffer_offset_alignment). Start the slice at a multiple of {step} "
            f"element(s) of {itemsize} bytes, or copy it into a buffer of its own")
    if v.size == 0:
        raise ArgumentValueError(f"{where}: the buffer is empty; WebGPU cannot bind 0 bytes "
                                 "(launch with a buffer of at least one element)")
    if v.size % 4:
        raise UnalignedViewError(
            f"{where}: {v.size} bytes cannot be bound on WebGPU: storage bindings are whole "
            "4-byte words; use an element count whose byte size is a multiple of 4")
    if v.size > dev.max_storage_binding:
        raise ArgumentValueError(
            f"{where}: {v.size} bytes is more than {dev.describe()} binds at once "
            f"({dev.max_storage_binding} bytes, max_storage_buffer_binding_size); split the work")


def upload(v: View, data: Any) -> None:
    """Copy host bytes (any buffer-protocol object of exactly ``v.size`` bytes) into ``v``,
    after every launch issued before it."""
    _live(v, "upload")
    m = memoryview(data).cast("B")
    if m.nbytes != v.size:
        raise ArgumentValueError(f"upload: the view holds {v.size} bytes, the data {m.nbytes}")
    if not v.size:
        return
    a = v.alloc
    st = a.device.stream
    end = v.offset + v.size
    if not v.offset % 4 and (not v.size % 4 or end == a.nbytes):
        if v.size % 4:  # the tail word reaches past the usable end: pad it with zeros
            m = memoryview(bytes(m) + b"\0" * (_round4(v.size) - v.size))
        st.write(a.buffer, v.offset, m)
        return
    lo, hi = v.offset & ~3, _round4(end)
    with st.lock:  # a partial word: read the covering words, patch, write them back
        cur = bytearray(st.read_back(a.buffer, lo, hi - lo))
        cur[v.offset - lo:end - lo] = m
        st.write(a.buffer, lo, cur)


def download(v: View) -> bytes:
    """The bytes of ``v`` once every launch issued before this call has run."""
    _live(v, "download")
    if not v.size:
        return b""
    a = v.alloc
    lo, hi = v.offset & ~3, _round4(v.offset + v.size)
    data = a.device.stream.read_back(a.buffer, lo, hi - lo)
    return bytes(data[v.offset - lo:v.offset - lo + v.size])


def fill_zero(v: View) -> None:
    """Zero ``v`` in the command stream (``clear_buffer``), in order with launches."""
    _live(v, "fill_zero")
    if not v.size:
        return
    a = v.alloc
    st = a.device.stream
    if v.offset % 4 or v.size % 4 and v.offset + v.size != a.nbytes:
        upload(v, bytes(v.size))
        return
    size = _round4(v.size)
    with st.lock:
        rec = st.capturing()
        if rec is not None:
            rec.add_clear(a, v.offset, size)
            return
        st.clear_buffer(a.buffer, v.offset, size)


def copy(src: View, dst: View) -> None:
    """Device-to-device copy of ``src`` into ``dst`` (same byte size), in order with launches."""
    _live(src, "copy (source)")
    _live(dst, "copy (destination)")
    if src.size != dst.size:
        raise ArgumentValueError(f"copy: the source holds {src.size} bytes, the destination {dst.size}")
    if src.alloc.device is not dst.alloc.device:
        raise ArgumentValueError(f"copy: the source is on WebGPU device {src.alloc.device.ordinal}, "
                                 f"the destination on device {dst.alloc.device.ordinal}")
    if not src.size:
        return
    if src.offset % 4 or dst.offset % 4 or (src.size % 4 and not (
            src.offset + src.size == src.alloc.nbytes and dst.offset + dst.size == dst.alloc.nbytes)):
        raise UnalignedViewError(
            f"copy: WebGPU copies whole 4-byte words; source offset {src.offset}, destination "
            f"offset {dst.offset} and size {src.size} must be multiples of 4")
    st = src.alloc.device.stream
    size = _round4(src.size)
    with st.lock:
        rec = st.capturing()
        if src.alloc is dst.alloc:  # WebGPU forbids a copy within one buffer: go through a temporary
            if rec is not None:
                raise ArgumentValueError("copy: source and destination share a buffer; inside a capture "
                                         "copy through a second buffer allocated before it")
            tmp = alloc(src.alloc.device, size, label="khal copy")
            st.copy_buffer(src.alloc.buffer, src.offset, tmp.buffer, 0, size)
            st.copy_buffer(tmp.buffer, 0, dst.alloc.buffer, dst.offset, size)
            st.keep(tmp)
            return
        if rec is not None:
            rec.add_copy(src.alloc, src.offset, dst.alloc, dst.offset, size)
            return
        st.copy_buffer(src.alloc.buffer, src.offset, dst.alloc.buffer, dst.offset, size)
