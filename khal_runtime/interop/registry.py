"""The registry of array libraries: one :class:`ArrayType` record per library.

An :class:`ArrayType` says, for one array library, how to read an object as a storage
argument (``extract``: device pointer, element count, dtype key), which device its memory is
on, whether a launch may reuse what it read from the same object (its memo policy), what a
launch must hold to keep the memory alive, and (for the built-in records) the few lines the
CUDA launch path inlines for it; and, for a library with its own stream and dtype objects, how
to read a stream's handle (``stream``) and name a dtype (``dtype_name``). The first time the
runtime meets a type it asks the probes in order; the answer is cached per type, so the hot
path is one dict lookup.

Built in: :class:`khal_runtime.DeviceBuffer` (registered by :mod:`khal_runtime.buffers`),
PyTorch (:mod:`.torch`), CuPy (:mod:`.cupy`), anything with ``__cuda_array_interface__``
(:mod:`.cai`) and DLPack (:mod:`.dlpack`); host arrays are refused with a hint. Each is one
module of this package that registers itself (:func:`add_probe`) when the package imports it:
the package imports every public module in its folder. Teach the runtime another library from
outside with :func:`register_array_type`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Literal

from khal_runtime import dtypes
from khal_runtime.errors import ArgumentError

__all__ = [
    "ADDRESS_SPACE",
    "MEMO_ARRAY_TYPES",
    "add_probe",
    "STABLE_ARRAY_TYPES",
    "STREAM_READERS",
    "STREAM_TYPE_READERS",
    "VERSIONED_ARRAY_TYPES",
    "ArrayType",
    "BadArgument",
    "DtypeNamer",
    "Extractor",
    "Probe",
    "StreamReader",
    "array_type",
    "device_of",
    "extract",
    "extractor_for",
    "held_memory",
    "register_array_type",
    "stream_handle",
    "tensor_memo",
    "UNVERSIONED",
]

#: obj -> (device pointer, element count, dtype key); raises :class:`BadArgument`
Extractor = Callable[[Any], "tuple[int, int, Hashable]"]
#: obj -> (CUstream handle, device ordinal or None) of one library's stream object; None for
#: an object that is not one of its streams
StreamReader = Callable[[Any], "tuple[int, int | None] | None"]
#: dtype key -> (ABI element type name, itemsize) of one library's dtype object; None for a key
#: that is not one of its dtypes (:data:`khal_runtime.dtypes.DtypeNamer`)
DtypeNamer = dtypes.DtypeNamer


#: the address space a device pointer and the bytes after it must fit in (the kernel ABI's u64)
ADDRESS_SPACE = 2**64


class BadArgument(Exception):
    """An extractor rejected an object. ``cls`` is the public error to raise (the caller adds
    the entry and parameter to the message)."""

    def __init__(self, cls: type[Exception], message: str) -> None:
        super().__init__(message)
        self.cls = cls


@dataclass(frozen=True, eq=False)
class ArrayType:
    """How the runtime reads one library's device arrays."""

    name: str
    extract: Extractor
    #: the device ordinal an object's memory is on, when the library says so cheaply
    device: Callable[[Any], "int | None"] | None = None
    #: "stable": pointer, count, dtype and contiguity never change for the object's life, so a
    #: repeated launch may reuse what it read; "versioned": they may change, but a cheap check
    #: (``version``) notices; None: read on every launch
    memo: Literal["stable", "versioned"] | None = None
    #: versioned: ``(version, memory to hold)`` of an object (the version :data:`UNVERSIONED` for one
    #: without a version counter), None when it cannot be remembered
    version: Callable[[Any], "tuple[Any, Any] | None"] | None = None
    #: the memory object a launch holds so that the pointer it packed stays valid
    storage: Callable[[Any], Any] | None = None
    #: internal: lines of the CUDA launch path's inlined read (``{a}`` the argument, ``{i}``
    #: its index, ``{d}`` the plan's device; set ``p{i}``, ``c{i}``, ``k{i}``; ``raise Short()``
    #: for anything off the fast path)
    inline: tuple[str, ...] = ()
    #: the library's stream objects as ``stream=`` arguments: ``(handle, device or None)``
    stream: StreamReader | None = None
    #: the library's dtype objects (what ``extract`` returns as the dtype key) named as ABI
    #: element types: ``(name, itemsize)``
    dtype_name: DtypeNamer | None = None


#: first sight of an object's type: a record for it, or None
Probe = Callable[[Any], "ArrayType | None"]

_lock = threading.Lock()
#: type -> its record; read lock-free on the hot path
_BY_TYPE: dict[type, ArrayType] = {}
#: (order, probe), asked in order on first sight of a type; replaced, never mutated, so reads
#: need no lock
_PROBES: tuple[tuple[int, Probe], ...] = ()
#: every library's stream reader, in probe order (the built-in libraries first, then those
#: registered with :func:`register_array_type`), read by :func:`stream_handle`; it is
#: only ever replaced whole (slice assignment), under the lock
STREAM_READERS: list[StreamReader] = []
_STREAM_ORDER: list[tuple[int, StreamReader]] = []
#: per foreign stream type, how :func:`khal_runtime.device.as_stream` reads its objects (the
#: route that read the first one); emptied whenever a reader is added
STREAM_TYPE_READERS: dict[type, Callable[[Any], "tuple[int, int | None] | None"]] = {}
#: the order of a reader given to register_array_type (after every built-in probe)
_REGISTERED = 1000
_VERSION: dict[type, Callable[[Any], "tuple[int, Any] | None"]] = {}

#: Array types a launch may remember under the same identity (see ``ArrayType.memo``).
STABLE_ARRAY_TYPES: set[type] = set()
VERSIONED_ARRAY_TYPES: set[type] = set()
MEMO_ARRAY_TYPES: set[type] = set()


def _add_hooks(stream: StreamReader | None, dtype_name: DtypeNamer | None, order: int = _REGISTERED) -> None:
    """Under ``_lock``: a library's stream reader and dtype namer (once each)."""
    if stream is not None and stream not in STREAM_READERS:
        _STREAM_ORDER.append((order, stream))
        _STREAM_ORDER.sort(key=lambda op: op[0])
        STREAM_READERS[:] = [r for _, r in _STREAM_ORDER]
        STREAM_TYPE_READERS.clear()
    if dtype_name is not None:
        dtypes.add_dtype_namer(dtype_name)


def _cache(tp: type, rec: ArrayType) -> None:
    with _lock:
        _add_hooks(rec.stream, rec.dtype_name)
        _BY_TYPE[tp] = rec
        if rec.memo == "stable":
            STABLE_ARRAY_TYPES.add(tp)
        elif rec.memo == "versioned" and rec.version is not None:
            VERSIONED_ARRAY_TYPES.add(tp)
            _VERSION[tp] = rec.version
        if rec.memo is not None:
            MEMO_ARRAY_TYPES.add(tp)


def register_array_type(tp: type, extract: Extractor, *, device: Callable[[Any], "int | None"] | None = None,
                        memo: Literal["stable", "versioned"] | None = None,
                        version: Callable[[Any], "tuple[int, Any] | None"] | None = None,
                        storage: Callable[[Any], Any] | None = None, name: str | None = None,
                        inline: tuple[str, ...] = (), stream: StreamReader | None = None,
                        dtype_name: DtypeNamer | None = None) -> ArrayType:
    """Teach the runtime a device-array type.

    ``extract(obj)`` returns ``(device pointer, element count, dtype)`` where dtype is a NumPy
    dtype (or anything ``numpy.dtype`` takes), a torch dtype, or an ABI element type name
    (``"float32"``), wrapped in ``khal_runtime.interop.ReadOnly(dtype)`` for memory the kernel must
    not write (then only read-only bindings take it); it raises
    ``khal_runtime.interop.BadArgument(ArgumentError, "why")`` for an object it cannot pass. ``device(obj)`` gives the device ordinal when known (the launch then
    refuses an array of another device). ``memo="stable"`` promises that an object's pointer,
    count and dtype never change for its life, so a repeated launch reuses what it read.
    ``stream(obj)`` gives ``(CUstream handle, device or None)`` for the library's stream
    objects (None for anything else), so ``stream=`` takes them; ``dtype_name(key)`` gives
    ``(element type name, itemsize)`` for the library's dtype objects (None for anything else).
    Subclasses of ``tp`` are looked up separately (register them too if they differ)."""
    if memo not in (None, "stable", "versioned"):
        raise ValueError(f"memo must be None, 'stable' or 'versioned', got {memo!r}")
    if memo == "versioned" and version is None:
        raise ValueError("memo='versioned' needs version(obj) -> (version, memory) or None")
    rec = ArrayType(name or f"{tp.__module__}.{tp.__qualname__}", extract, device, memo, version,
                    storage, tuple(inline), stream, dtype_name)
    _cache(tp, rec)
    return rec


def add_probe(probe: Probe, *, order: int, stream: StreamReader | None = None,
              dtype_name: DtypeNamer | None = None) -> None:
    """Internal: how a library module of this package registers itself when imported.

    ``probe`` is asked about types not registered yet, lowest ``order`` first (torch 10, CuPy
    20, ``__cuda_array_interface__`` 30, host arrays 40, DLPack 50, host sequences 60).
    ``stream`` and ``dtype_name`` are the library's hooks (see :class:`ArrayType`), registered
    now: a stream or a dtype can come before the first array of the library does."""
    global _PROBES
    with _lock:
        _PROBES = tuple(sorted((*_PROBES, (order, probe)), key=lambda op: op[0]))
        _add_hooks(stream, dtype_name, order)


def _not_an_array(obj: Any) -> tuple[int, int, Hashable]:
    raise BadArgument(
        ArgumentError,
        f"expected a device array (DeviceBuffer, torch/CuPy array, __cuda_array_interface__ or "
        f"DLPack), got {type(obj).__module__}.{type(obj).__qualname__}",
    )


_NOT_AN_ARRAY = ArrayType("not an array", _not_an_array)


def array_type(obj: Any) -> ArrayType:
    """The record for ``type(obj)`` (found by the probes on first sight, then cached)."""
    rec = _BY_TYPE.get(type(obj))
    if rec is not None:
        return rec
    for _order, probe in _PROBES:
        rec = probe(obj)
        if rec is not None:
            if rec.name != "host":  # refusals are not cached: the type may be registered later
                _cache(type(obj), rec)
            return rec
    return _NOT_AN_ARRAY


def extractor_for(obj: Any) -> Extractor:
    """The extractor for ``type(obj)``."""
    return array_type(obj).extract


def extract(obj: Any) -> tuple[int, int, Hashable]:
    """(device pointer, element count, dtype key) of any supported device array."""
    return array_type(obj).extract(obj)


def device_of(obj: Any) -> int | None:
    """The device an array's memory is on, for the types that say so cheaply; None when
    unknown (``__cuda_array_interface__``, DLPack)."""
    rec = array_type(obj)
    if rec.device is None:
        return None
    try:
        return rec.device(obj)
    except Exception:  # noqa: BLE001  (a look-alike without these attributes)
        return None


def stream_handle(obj: Any) -> tuple[int, int | None] | None:
    """(CUstream handle, device or None) of a stream object of a registered library, else None."""
    for reader in STREAM_READERS:
        got = reader(obj)
        if got is not None:
            return got
    return None


class _Unversioned:
    """The version of an array of a versioned type that has no version counter (a torch inference
    tensor): a memo remembering it compares its pointer, count, dtype and contiguity instead."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNVERSIONED"


UNVERSIONED: Any = _Unversioned()


def tensor_memo(t: Any) -> tuple[Any, Any] | None:
    """What a memo keeps of an array of a versioned type: ``(version, memory)``, the version
    :data:`UNVERSIONED` for one without a version counter (a torch inference tensor); None when it
    cannot be remembered."""
    f = _VERSION.get(type(t))
    return None if f is None else f(t)


def held_memory(obj: Any) -> Any:
    """The memory object a launch holds for ``obj`` (a torch tensor's storage), else None."""
    rec = _BY_TYPE.get(type(obj))
    if rec is None or rec.storage is None:
        return None
    try:
        return rec.storage(obj)
    except Exception:  # noqa: BLE001  (a tensor-like without storage)
        return None
