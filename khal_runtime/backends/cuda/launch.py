"""CUDA launch plans: per (entry, device), a precompiled argument path.

A :class:`LaunchPlan` is built once per entry and device. It holds the ``CUfunction``, a
``struct.Struct`` for the whole kernel-argument block (laid out at the C ABI offsets the
binary was checked against, from the ABI table's slots), per-thread packing buffers with a
``void*[]`` already pointing into them, and generated Python (:mod:`.launchgen`) that, per
call, reads each argument (inlined for the array types seen), checks its dtype against a
learned set, packs everything with one ``pack_into`` and calls ``cuLaunchKernel`` with the
``void**`` as an int. Anything unexpected falls to :meth:`LaunchPlan.diagnose`, which
re-checks the arguments one by one (:func:`khal_runtime.arguments.diagnose_args`) and raises a
named ArgumentError / ArgumentValueError; nothing is launched then. A repeated launch (same
argument objects) skips the reading and packing: see :mod:`.launchgen` for the per-thread
memo and the shared snapshots, and :mod:`khal_runtime.memo` for what clears them.

The generated code is made from :meth:`LaunchPlan.spec` (a frozen :class:`.launchgen.CodeSpec`)
at most once per plan state: ``run`` when first used after a change, the kernel's ``call`` when
the kernel reads it (``KernelHandle.adopt``). A first launch lets the plan learn its
arguments' types first (:meth:`LaunchPlan.learn`), so it makes each at most once. Launch hooks
(tracing, profiling) are compiled into the generated code only while installed
(:mod:`khal_runtime.launch_hooks`).
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

from khal_runtime import abi, interop
from khal_runtime.backends import DirectLaunch, KernelHandle
from khal_runtime.arguments import Short, diagnose_args, dtype_ok, struct_bytes
from khal_runtime.backends.cuda.attributes import FunctionAttributes, make_launch_ex
from khal_runtime.backends.cuda.driver import driver
from khal_runtime.backends.cuda.launchgen import (READERS, SLOTS, CodeSpec, CudaReader, MemoLayout, ThreadSlots,
                                                  call_source, run_source, spec_names)
from khal_runtime.backends.cuda.loader import expected_param_layout
from khal_runtime.backends.cuda.uniform_cache import UniformCache
from khal_runtime.buffers import FREED, DeviceBuffer
from khal_runtime.calls import Restate, slow_call
from khal_runtime.device import Device, Stream, _tls, as_stream, ensure_current, ready_stream
from khal_runtime.dtypes import dtype_info
from khal_runtime.errors import CudaError
from khal_runtime.generated import define
from khal_runtime.launch_hooks import hooks
from khal_runtime.memo import EPOCH, register_memo
from khal_runtime.uniforms import cached_converter, is_converter, uniform_converter

if TYPE_CHECKING:
    from khal_runtime.manifest import Entry

__all__ = ["MISSING", "NOMEMO", "DirectLaunch", "LaunchPlan", "launch_call"]

#: array types whose read a parameter's code inlines at most
MAX_INLINE = 3
MISSING = object()  # default of the generated __call__'s parameters: "not passed"
NOMEMO = object()  # a memo slot item no argument is identical to
_PACK_U64 = struct.Struct("<Q").pack_into

#: dtype key -> itemsize, of the device arrays passed as uniforms (read inline: ``_uniform_kind``)
_ITEMSIZE: dict[Any, int] = {}


def _itemsize_of(key: Any) -> int:
    """The itemsize of a dtype key (what ``uniforms``' device converter multiplies the count by), cached."""
    size = dtype_info(key)[1]
    try:
        _ITEMSIZE[key] = size
    except TypeError:  # an unhashable key
        pass
    return size


def uniform_reader(obj: Any, converted: Any) -> Any:
    """How the prepacked path re-reads a uniform argument it saw before: None when its identity
    is enough (``bytes`` never change; a device buffer's pointer is fixed until it is freed,
    which moves the EPOCH), else a function giving its current bytes (a ctypes struct or a
    NumPy value can be changed in place); ``NOMEMO`` for a type it cannot re-read."""
    if converted.__class__ is not bytes or type(obj) is bytes:
        return None
    conv = cached_converter(type(obj))
    if conv is None:
        return NOMEMO
    if is_converter(conv, "ctypes") or is_converter(conv, "buffer"):
        return bytes
    return conv


class _ImmutableScalars(dict):  # type: ignore[type-arg]
    """type -> whether a scalar argument of that type can never change in place (so the
    prepacked path may reuse what it packed from the same object): Python and NumPy scalars
    can't, a 0-d NumPy array or a ctypes number can."""

    def __missing__(self, tp: type) -> bool:
        np = sys.modules.get("numpy")
        ok = issubclass(tp, (int, float)) or (np is not None and issubclass(tp, np.generic))
        self[tp] = ok
        return ok


IMMUTABLE_SCALAR = _ImmutableScalars()


class _ThreadOwner:
    """Owns one thread's memo slots of one plan in ``memo.THREAD_MEMOS``."""

    __slots__ = ("__weakref__",)


class LaunchPlan:
    """Everything needed to launch one entry on one device, precomputed."""

    def __init__(self, entry: Entry, crate: str, device_id: int, function: Any,
                 uniforms: UniformCache, indirect_function: Any = None,
                 attributes: FunctionAttributes | None = None,
                 indirect_attributes: FunctionAttributes | None = None, kernel: KernelHandle | None = None) -> None:
        self.entry = entry
        #: the generic ``Kernel`` whose call this plan makes (its code sends the slow path this)
        self.kernel = kernel
        self.indirect_attributes = indirect_attributes
        #: the entry's launch attributes on this function (.attributes: checked and set at load): the
        #: typed call's dynamic shared memory, the attribute list every launch configuration carries,
        #: the cooperative / cluster grid check (None when nothing can fail)
        self.fattrs = attributes if attributes is not None else FunctionAttributes(entry, function)
        self.shared = self.fattrs.shared
        self.check_attrs = self.fattrs.checker()
        self.crate = crate
        self.device_id = device_id
        self.function = function
        self.indirect_function = indirect_function
        self.uniforms = uniforms
        self.block = tuple(entry.block_size)
        #: per parameter, how the host reads it (launchgen.READERS, one per abi.READERS); a
        #: reader this path does not implement is refused here, never launched as a scalar
        self.readers: list[CudaReader] = [READERS.of(p.kind, f"CUDA launch of {entry.name}()")
                                          for p in entry.params]
        layout = expected_param_layout(entry)
        self.layout = layout
        self.args_size = (layout[-1][1] + layout[-1][2]) if layout else 0
        fmt = ["<"]
        pos = 0
        codes = [slot.code for p in entry.params for slot in p.slots]
        for (_, off, size), code in zip(layout, codes):
            if off > pos:
                fmt.append(f"{off - pos}x")
            fmt.append(code)
            pos = off + size
        self.struct = struct.Struct("".join(fmt))
        if self.struct.size != self.args_size:
            raise CudaError(f"entry {entry.name!r}: argument block {self.struct.format} is "
                            f"{self.struct.size} bytes, the layout {self.args_size}")
        self._offsets = [off for _, off, _ in layout]
        self._tls = threading.local()
        self._keep_lock = threading.Lock()  # guards the state below and the code made from it
        #: (cluster dims, hooks active) -> the explicit launch with that cluster (:meth:`clustered_run`)
        self._clustered: dict[tuple[tuple[int, int, int], bool], Callable[..., None]] = {}
        self.accepted: list[set[Any]] = [set() for _ in entry.params]
        #: per storage parameter: array types whose read is inlined (type -> its record)
        self._inline: list[dict[type, interop.ArrayType]] = [{} for _ in entry.params]
        #: storage parameters that have seen a versioned array (torch): their memos check it
        self._versioned: set[int] = set()
        #: those that have seen one without a version counter (a torch inference tensor)
        self._unversioned: set[int] = set()
        #: per uniform parameter: host struct types converted inline (type -> "ctypes"/"bytes")
        #: per uniform parameter, the types converted inline: "ctypes", "bytes", or a device
        #: array's record (its inline read: a torch tensor holding the struct, khal_runtime.torch)
        self._uinline: list[dict[type, Any]] = [{} for _ in entry.params]
        #: the state counter: moved by every change of the state above (a type learnt), so code
        #: made from an earlier state is made again when next read
        self._gen = 0
        #: the kernel's call, its source and the (state, hooks installed) it was made for
        self._call: Callable[..., None] | None = None
        self._call_source = ""
        self._call_key: tuple[int, bool] | None = None
        #: the fields of memo slots and snapshots, and their classes (.launchgen)
        self.memo = MemoLayout(entry, self.readers)
        #: the shared snapshots, newest first; each bump_epoch() empties them
        self._shared: list[Any] = [self._shared_empty()] * SLOTS
        for j in range(SLOTS):
            register_memo(self._shared, j, self._shared[0])
        self._source = ""
        #: the explicit launch ``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: generated when
        #: first used, and again after the plan's state changed (:meth:`_changed`)
        self.run: Callable[..., None] = self._run_new
        hooks.watch(self)

    # per-thread argument blocks --------------------------------------------------------------
    def _new_block(self) -> tuple[Any, Any, int]:
        """(argument block, the ``void*[]`` pointing into it, that array's address)."""
        buf = ctypes.create_string_buffer(max(self.args_size, 8))
        base = ctypes.addressof(buf)
        n = len(self._offsets)
        if n:
            ptrs = (ctypes.c_void_p * n)(*[base + off for off in self._offsets])
            addr = ctypes.addressof(ptrs)
        else:
            ptrs, addr = None, 0
        return buf, ptrs, addr

    def _new_slots(self) -> ThreadSlots:
        """This thread's memo slots, each with its own argument block, and a scratch slot for
        the explicit launch (see :class:`.launchgen.ThreadSlots`). A slot's ``stream`` is its
        valid flag, cleared by ``memo.bump_epoch`` for as long as the thread lives (they are
        registered under an owner only this thread's thread-local storage holds)."""
        lo = self.memo
        owner = _ThreadOwner()
        slots: list[Any] = []
        for j in range(SLOTS + 1):
            m = lo.Slot()
            for name in lo.slot_fields:
                setattr(m, name, NOMEMO)
            m.buf, m.ptrs, m.addr = self._new_block()
            m.hits = 0
            if j < SLOTS:
                register_memo(m, "stream", NOMEMO, owner=owner)
            slots.append(m)
        ms = ThreadSlots()
        ms.all = tuple(slots[:SLOTS])
        for j in range(SLOTS):
            setattr(ms, f"s{j}", slots[j])
        ms.victim, ms.scratch, ms.filled, ms.owner = 0, slots[SLOTS], False, owner
        ms.recent, ms.rnext = [(NOMEMO,) * lo.P] * SLOTS, 0
        self._tls.owner = owner
        self._tls.s = ms
        return ms

    # dtype learning ---------------------------------------------------------------------------
    def _learn(self, i: int, key: Any) -> None:
        ok, _ = dtype_ok(self.entry.params[i], key)
        if not ok:
            raise Short()
        self.accepted[i].add(key)

    # what the arguments' types ask of the code (the plan's state) ------------------------------
    def _wants(self, i: int, tp: type, rec: Any) -> tuple[bool, bool]:
        """(inline the read of ``tp``, check parameter ``i``'s versions in its memos): what an
        array of type ``tp`` would add to parameter ``i``'s state."""
        seen = self._inline[i]
        return (bool(rec.inline) and tp not in seen and len(seen) < MAX_INLINE,
                tp in interop.VERSIONED_ARRAY_TYPES and i not in self._versioned)

    def _take_storage(self, i: int, tp: type, rec: Any) -> bool:
        """Add what ``tp`` asks for to parameter ``i``'s state (under ``_keep_lock``)."""
        inline, versioned = self._wants(i, tp, rec)
        if inline:
            self._inline[i][tp] = rec
        if versioned:
            self._versioned.add(i)
        return inline or versioned

    def _unversioned_seen(self, i: int) -> bool:
        """The kernel's call met, at parameter ``i``, a tensor without a version counter (an inference
        tensor) its memo code cannot check: learn it, and have the kernel take the call made for it
        (its memos then compare such a tensor's pointer, dtype, count and contiguity). False: this
        launch (already made) is not remembered."""
        with self._keep_lock:
            if i not in self._unversioned:
                self._unversioned.add(i)
                self._changed()
        if self.kernel is not None:  # only the kernel's call (made for a kernel) sends this
            self.kernel.adopt(self, ())
        return False

    def _uniform_kind(self, obj: Any) -> tuple[Callable[[Any], Any], Any]:
        """(converter, how the code converts it inline: "ctypes" / "bytes" / the record of a device
        array type with an inline read / None) of a uniform argument."""
        tp = type(obj)
        conv = cached_converter(tp) or uniform_converter(obj)
        if is_converter(conv, "ctypes"):
            return conv, "ctypes"
        if tp is bytes:
            return conv, "bytes"
        if is_converter(conv, "device") and tp is not DeviceBuffer:
            rec = interop.array_type(obj)
            if rec.inline:
                return conv, rec
        return conv, None

    def _changed(self) -> None:
        """The state changed (under ``_keep_lock``): ``run`` and the call are made again when next read."""
        self._gen += 1
        self.run = self._run_new

    def learn(self, args: tuple[Any, ...]) -> bool:
        """Take into the state what the types of ``args`` ask of the code (array types to inline,
        versioned parameters, struct types to convert inline), before the code is made; True when
        it changed. An argument that cannot be read is left for the launch to diagnose."""
        changed = False
        versioned_types = interop.VERSIONED_ARRAY_TYPES
        with self._keep_lock:
            for i, obj in enumerate(args[:len(self.readers)]):
                reader, tp = self.readers[i], type(obj)
                try:
                    if reader.array:
                        if tp is DeviceBuffer:
                            continue
                        if not (tp in self._inline[i] and (i in self._versioned or tp not in versioned_types)):
                            changed = self._take_storage(i, tp, interop.array_type(obj)) or changed
                        if tp in versioned_types and i not in self._unversioned and \
                                (interop.tensor_memo(obj) or (None,))[0] is interop.UNVERSIONED:
                            self._unversioned.add(i)  # an inference tensor: its memo code compares its facts
                            changed = True
                    elif reader.uniform:
                        seen = self._uinline[i]
                        if tp is dict or tp in seen or len(seen) >= MAX_INLINE:
                            continue
                        kind = self._uniform_kind(obj)[1]
                        if kind is not None:
                            seen[tp] = kind
                            changed = True
                except Exception:  # noqa: BLE001, S112 - a bad argument: the launch names it
                    continue
            if changed:
                self._changed()
        return changed

    def _storage_read(self, i: int, obj: Any, rec: Any) -> tuple[int, int, Any]:
        """(pointer, count, dtype key) of a storage argument of a type the code does not inline."""
        out = rec.extract(obj)
        if out[1] * self.entry.params[i].element_size > interop.ADDRESS_SPACE - out[0]:
            raise Short()  # the elements run past the address space (an extractor that lies)
        if rec.device is not None and interop.device_of(obj) not in (None, self.device_id):
            raise Short()  # on another device (the inlined code checks it too)
        return out  # type: ignore[no-any-return]

    def _storage_seen(self, i: int, obj: Any) -> tuple[int, int, Any]:
        """``run``: read a storage argument of a type the code does not inline; the plan learns
        the type (the built-in kinds, torch and CuPy, are inlined the first time one is seen)."""
        tp = type(obj)
        rec = interop.array_type(obj)
        out = self._storage_read(i, obj, rec)
        inline, versioned = self._wants(i, tp, rec)
        if inline or versioned:  # (two threads may both see it: the lock takes it once)
            with self._keep_lock:
                if self._take_storage(i, tp, rec):
                    self._changed()
        return out

    def _storage_unseen(self, i: int, obj: Any, gen: int) -> tuple[int, int, Any]:
        """The kernel's call (made at state ``gen``): as :meth:`_storage_seen`, but a type the
        plan would learn, or a plan that learnt since, raises ``Restate``: the slow path makes
        the call again for it."""
        rec = interop.array_type(obj)
        if gen != self._gen or any(self._wants(i, type(obj), rec)):
            raise Restate()
        return self._storage_read(i, obj, rec)

    def _uniform_seen(self, i: int, obj: Any) -> Any:
        """``run``: convert a uniform argument of a type not inlined yet; the plan learns ctypes /
        bytes types."""
        tp = type(obj)
        if tp is dict:  # fields by name, packed by the struct's C layout (Slang crates)
            p = self.entry.params[i]
            return struct_bytes(f"{self.entry.name}(): argument {p.name!r}", p, obj)
        conv, kind = self._uniform_kind(obj)
        u = conv(obj)
        seen = self._uinline[i]
        if kind is not None and tp not in seen and len(seen) < MAX_INLINE:
            with self._keep_lock:
                if tp not in seen and len(seen) < MAX_INLINE:
                    seen[tp] = kind
                    self._changed()
        return u

    def _uniform_unseen(self, i: int, obj: Any, gen: int) -> Any:
        """The kernel's call (made at state ``gen``): as :meth:`_uniform_seen`, with ``Restate``
        for a type the plan would learn, or a plan that learnt since."""
        if gen != self._gen:
            raise Restate()
        tp = type(obj)
        if tp is dict:
            p = self.entry.params[i]
            return struct_bytes(f"{self.entry.name}(): argument {p.name!r}", p, obj)
        conv, kind = self._uniform_kind(obj)
        seen = self._uinline[i]
        if kind is not None and tp not in seen and len(seen) < MAX_INLINE:
            raise Restate()
        return conv(obj)

    def _scalar(self, i: int, obj: Any) -> Any:
        """A scalar the fast path does not pack as it is (bool, bfloat16, complex): converted by
        the ABI's one rule set (TypeError / ValueError: the launch diagnoses the argument)."""
        return abi.scalar_value(self.entry.params[i].element_type, obj)

    # code generation --------------------------------------------------------------------------
    def spec(self, hooked: bool, clustered: bool = False) -> CodeSpec:
        """The state the code is made from, frozen (``hooked``: launch hooks installed;
        ``clustered``: a ``run`` for a cluster given at launch)."""
        inline: list[tuple[tuple[type, Any], ...]] = []
        uinline: list[tuple[tuple[type, Any], ...]] = []
        for i in range(len(self.readers)):  # (loops, not comprehensions: the first call's frame budget)
            inline.append(tuple(self._inline[i].items()))
            uinline.append(tuple(self._uinline[i].items()))
        bx, by, bz = self.block
        return CodeSpec(entry=self.entry, device_id=self.device_id, block=(bx, by, bz), shared=self.shared,
                        readers=tuple(self.readers), offsets=tuple(self._offsets), inline=tuple(inline),
                        uinline=tuple(uinline), versioned=frozenset(self._versioned),
                        unversioned=frozenset(self._unversioned), memo=self.memo,
                        hooked=hooked, needs_ex=self.fattrs.needs_ex, attrs_check=self.check_attrs is not None,
                        gen=self._gen, clustered=clustered)

    def _namespace(self, spec: CodeSpec) -> dict[str, Any]:
        """Every name the code made from ``spec`` reads: the plan's functions and buffers, the
        driver's, the generic slow path (``slow_call``, ``Restate``) and the spec's types."""
        drv = driver()
        ns: dict[str, Any] = {
            "uniform_entries": self.uniforms.entries, "fetch_uniform": self.uniforms.fetch,
            "Short": Short, "learn_dtype": self._learn, "plan_tls": self._tls,
            "new_slots": self._new_slots, "pack_args": self.struct.pack_into,
            "scalar_value": self._scalar, "hooks": hooks,
            "cuLaunchKernel": drv.cuLaunchKernel, "launch_prepared": launch_call(drv)[0],
            "function": self.function, "plan": self, "diagnose": self.diagnose,
            "launch_failed": self.launch_failed, "bytes": bytes, "DeviceBuffer": DeviceBuffer,
            "thread": _tls, "ensure_current": ensure_current, "Stream": Stream,
            "as_stream": as_stream, "NOMEMO": NOMEMO,
            "EPOCH": EPOCH, "STABLE_TYPES": interop.STABLE_ARRAY_TYPES,
            "MEMO_TYPES": interop.MEMO_ARRAY_TYPES, "STABLE_MEMO": (None, None),
            "tensor_memo": interop.tensor_memo, "UNVERSIONED": interop.UNVERSIONED, "FREED": FREED,
            "IMMUTABLE_SCALAR": IMMUTABLE_SCALAR, "uniform_reader": uniform_reader,
            "ready_stream": ready_stream, "pack_u64": _PACK_U64,
            "storage_seen": self._storage_seen, "uniform_seen": self._uniform_seen,
            "storage_unseen": self._storage_unseen, "uniform_unseen": self._uniform_unseen,
            "check_attrs": self.check_attrs, "ITEMSIZE": _ITEMSIZE, "itemsize_of": _itemsize_of,
            # the kernel's call only
            "kernel": self.kernel, "slow_call": slow_call, "Restate": Restate, "MISSING": MISSING,
            "snapshots": self._shared, "promote": self._promote, "unshare": self._unshare,
            "unversioned_seen": self._unversioned_seen,
        }
        if spec.needs_ex:  # attributes on every launch: cuLaunchKernelEx, its list prebuilt
            ns["launch_ex"] = make_launch_ex(drv, self.fattrs)
        for i, reader in enumerate(spec.readers):
            if reader.array:
                ns[f"accepted_{i}"] = self.accepted[i]
        ns.update(spec_names(spec))
        return ns

    def regenerate_code(self) -> None:
        """Launch hooks were installed or removed: ``run`` is made again when next used (the call
        and the clustered runs are made per hook state)."""
        with self._keep_lock:
            self.run = self._run_new

    def _run_new(self, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int, st: Any,
                 args: tuple[Any, ...]) -> None:
        """``run`` until it is made for the plan's current state: learn the arguments' types, make
        it, then run. (Learning first: the types a first launch brings are in the code it makes.)"""
        self.learn(args)
        self._current_run()(gx, gy, gz, bx, by, bz, shmem, st, args)

    def _current_run(self) -> Callable[..., None]:
        with self._keep_lock:
            if self.run == self._run_new:
                self.run = self._generate()
            return self.run

    @property
    def source(self) -> str:
        """The source of ``run`` for the plan's current state."""
        self._current_run()
        return self._source

    def _compile(self, spec: CodeSpec, src: str, what: str, function: str,
                 extra: dict[str, Any] | None = None) -> Any:
        """``function`` from ``src``, a name tracebacks and pdb show the lines of (:mod:`khal_runtime.generated`)."""
        ns = self._namespace(spec)
        ns.update(extra or {})
        return define(src, f"{what} {self.entry.name}", ns, function)

    def _generate(self) -> Callable[..., None]:
        """``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: the explicit launch."""
        spec = self.spec(hooks.active)
        self._source = run_source(spec)
        return self._compile(spec, self._source, "launch", "run")  # type: ignore[no-any-return]

    def clustered_run(self, cluster: tuple[int, int, int]) -> Callable[..., None]:
        """``run`` launching clusters of ``cluster`` blocks (``launch(..., cluster=...)``), generated
        once per cluster dims and hook state; the cluster is checked against the device the first time."""
        key = (cluster, hooks.active)
        fn = self._clustered.get(key)
        if fn is None:
            fa = self.fattrs.with_cluster(driver(), cluster, Device(self.device_id))
            spec = self.spec(hooks.active, clustered=True)
            fn = self._compile(spec, run_source(spec), f"clustered launch {cluster}", "run",
                               {"launch_ex": make_launch_ex(driver(), fa), "check_attrs": fa.check_launch})
            with self._keep_lock:
                self._clustered[key] = fn
        return fn

    def cooperative_limit(self, threads: int, shared: int) -> int:
        """The most blocks of ``threads`` threads and ``shared`` bytes that can be co-resident on
        the device (occupancy per SM x SMs, computed once per combination)."""
        return self.fattrs.coresident(threads, shared)

    def direct(self) -> DirectLaunch | None:
        """The parts of a launch for a front that packs its own values (:class:`DirectLaunch`),
        or None when this entry's launches need more than a pack and ``cuLaunchKernel`` (launch
        attributes, a cooperative / cluster grid check: such a front calls :attr:`run`)."""
        if self.fattrs.needs_ex or self.check_attrs is not None:
            return None
        drv = driver()
        prepared, prepare = launch_call(drv, self.fattrs)
        return DirectLaunch(self.function, self.struct.pack_into, self._new_block, drv.cuLaunchKernel,
                            self.launch_failed, prepared, prepare)

    @property
    def call(self) -> Callable[..., None]:
        """The kernel's call, specialised for this entry on this device and the plan's current
        state: ``(n, *args, stream=None)``, made when first read after a change (a type learnt,
        hooks installed or removed); off its fast paths ``khal_runtime.calls.slow_call(kernel,
        n, args, st)``. The paths, and what lets a launch reuse an earlier one's packed
        arguments: :mod:`.launchgen`."""
        if self._call_key != (self._gen, hooks.active):
            with self._keep_lock:
                key = (self._gen, hooks.active)
                if self._call_key != key:
                    spec = self.spec(key[1])
                    src = call_source(spec)
                    self._call = self._compile(spec, src, "call", "__call__")
                    self._call_source, self._call_key = src, key
        return self._call  # type: ignore[return-value]

    @property
    def call_source(self) -> str:
        """The source of :attr:`call` for the plan's current state."""
        self.call  # noqa: B018
        return self._call_source

    def _shared_empty(self) -> Any:
        """A snapshot no call can match."""
        lo = self.memo
        return lo.snapshot(**{name: NOMEMO for name in lo.snapshot_fields if name != "keep"}, keep=None)

    def _promote(self, m: Any, st: Any) -> None:
        """Make this thread's memo slot ``m``, just hit again, the newest shared snapshot: a
        copy of its argument block that is never written again, and the launch call's whole
        argument tuple (:func:`launch_call`). The oldest snapshot goes."""
        lo = self.memo
        ep = EPOCH[0]
        src = m.buf
        blk = ctypes.create_string_buffer(src.raw, len(src))
        base = ctypes.addressof(blk)
        ptrs = (ctypes.c_void_p * len(self._offsets))(*[base + off for off in self._offsets])
        addr = ctypes.addressof(ptrs)
        fields = {name: getattr(m, name) for name in lo.snapshot_fields if name in lo.slot_fields}
        fields.update(stream=st, call=launch_call(driver(), self.fattrs)[1](self.function, (m.gx, 1, 1), self.block,
                                                                               self.shared, st.native, addr),
                      addr=addr, keep=(blk, ptrs))
        snap = lo.snapshot(**fields)
        if m.stream is st and EPOCH[0] == ep:  # nothing freed or flushed meanwhile
            shared = self._shared
            shared[:] = [snap] + shared[:SLOTS - 1]

    def _unshare(self, snap: Any) -> None:
        """Drop shared snapshot ``snap`` (its check raised: it can never match again)."""
        shared = self._shared
        keep = [s for s in shared if s is not snap]
        shared[:] = keep + [self._shared_empty()] * (SLOTS - len(keep))

    # failures ---------------------------------------------------------------------------------
    def launch_failed(self, err: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int) -> None:
        if not err:
            return
        name = getattr(err, "name", str(err))
        raise CudaError(
            f"cuLaunchKernel({self.entry.symbol}) failed: {name} "
            f"(grid {(gx, gy, gz)}, block {(bx, by, bz)}, device {self.device_id})",
            code=name,
        )

    def diagnose(self, args: tuple[Any, ...], exc: BaseException) -> None:
        """Re-check every argument slowly; raise a named error for the first bad one."""
        diagnose_args(self.entry, args, exc, device=self.device_id)


def launch_call(drv: Any, attributes: FunctionAttributes | None = None
                ) -> tuple[Callable[..., Any], Callable[..., tuple[Any, ...]]]:
    """(launch function, ``args(f, grid, block, shmem, cu_stream, params_addr)``) for launches
    whose grid and stream are known ahead (the shared snapshot, a bound launch): the argument
    tuple is built once and each launch is ``fn(*args)``. ``attributes``: the entry's launch
    attributes, whose prebuilt list the configuration carries.

    ``cuLaunchKernelEx`` with a ``CUlaunchConfig`` built once, where the bindings have it: it
    measured faster per launch than ``cuLaunchKernel`` through cuda-bindings (fewer arguments
    to convert; ``benchmarks/RESULTS.md``), and it is what ``cuda.core`` launches with.
    Otherwise ``cuLaunchKernel``."""
    ex = getattr(drv, "cuLaunchKernelEx", None)
    config = getattr(drv, "CUlaunchConfig", None)
    if ex is None or config is None:
        if attributes is not None and attributes.needs_ex:
            make_launch_ex(drv, attributes)  # raises: the attributes need cuLaunchKernelEx
        launch = drv.cuLaunchKernel
        return launch, lambda f, g, b, shmem, cu, addr: (f, *g, *b, shmem, cu, addr, 0)

    def args(f: Any, g: tuple[int, int, int], b: tuple[int, int, int], shmem: int, cu: Any,
             addr: int) -> tuple[Any, ...]:
        cfg = config()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
        cfg.sharedMemBytes, cfg.hStream = shmem, cu
        if attributes is not None and attributes.needs_ex:
            attributes.configure(cfg)
        else:
            cfg.numAttrs = 0
        return (cfg, f, addr, 0)

    return ex, args
