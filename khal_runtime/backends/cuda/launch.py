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

Launch hooks (tracing, profiling) are compiled into the generated code only while installed
(:mod:`khal_runtime.launch_hooks`).
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
from typing import Any, Callable, NamedTuple

from khal_runtime import abi, interop
from khal_runtime.arguments import Short, diagnose_args, dtype_ok, struct_bytes
from khal_runtime.backends.cuda.attributes import FunctionAttributes, make_launch_ex
from khal_runtime.backends.cuda.driver import driver
from khal_runtime.backends.cuda.launchgen import READERS, SLOTS, CudaReader, MemoLayout, ThreadSlots, call_source, run_source
from khal_runtime.backends.cuda.loader import expected_param_layout
from khal_runtime.backends.cuda.uniform_cache import UniformCache
from khal_runtime.buffers import FREED, DeviceBuffer
from khal_runtime.device import Device, Stream, _tls, as_stream, ensure_current, ready_stream
from khal_runtime.errors import CudaError
from khal_runtime.generated import define
from khal_runtime.launch_hooks import hooks
from khal_runtime.manifest import Entry
from khal_runtime.memo import EPOCH, register_memo
from khal_runtime.uniforms import cached_converter, is_converter, uniform_converter

__all__ = ["MISSING", "NOMEMO", "DirectLaunch", "LaunchPlan", "launch_call"]

#: array types whose read a parameter's code inlines at most
MAX_INLINE = 3
MISSING = object()  # default of the generated __call__'s parameters: "not passed"
NOMEMO = object()  # a memo slot item no argument is identical to
_PACK_U64 = struct.Struct("<Q").pack_into

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


class DirectLaunch(NamedTuple):
    """What a front that reads, checks and packs its own values launches an entry with
    (:meth:`LaunchPlan.direct`; the Triton call, :mod:`khal_runtime.triton`): ``pack(block, 0,
    *values)`` (the plan's ``struct.Struct.pack_into``: plain ints and floats, ``struct.error``
    out of range), ``new_block()`` (an argument block, its ``void*[]`` and that array's address),
    ``launch(function, gx, gy, gz, bx, by, bz, shmem, cu_stream, addr, 0)`` (``cuLaunchKernel``),
    ``failed(result, gx, gy, gz, bx, by, bz)`` (the named error of a failed launch), and for a
    launch repeated with the same block, grid and stream: ``prepared(*prepare(function, grid,
    block, shmem, cu_stream, addr))`` (:func:`launch_call`)."""

    function: Any
    pack: Callable[..., None]
    new_block: Callable[[], tuple[Any, Any, int]]
    launch: Callable[..., Any]
    failed: Callable[..., None]
    prepared: Callable[..., Any]
    prepare: Callable[..., tuple[Any, ...]]


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
                 indirect_attributes: FunctionAttributes | None = None) -> None:
        self.entry = entry
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
        self._keep_lock = threading.Lock()  # guards regeneration
        #: (cluster dims, hooks active) -> the explicit launch with that cluster (:meth:`clustered_run`)
        self._clustered: dict[tuple[tuple[int, int, int], bool], Callable[..., None]] = {}
        self.accepted: list[set[Any]] = [set() for _ in entry.params]
        #: per storage parameter: array types whose read is inlined (type -> its record)
        self._inline: list[dict[type, interop.ArrayType]] = [{} for _ in entry.params]
        #: storage parameters that have seen a versioned array (torch): their memos check it
        self._versioned: set[int] = set()
        #: per uniform parameter: host struct types converted inline (type -> "ctypes"/"bytes")
        self._uinline: list[dict[type, str]] = [{} for _ in entry.params]
        #: called with the plan after the launch code was regenerated (a new type inlined)
        self.on_regenerate: list[Callable[[LaunchPlan], None]] = []
        #: the fields of memo slots and snapshots, and their classes (.launchgen)
        self.memo = MemoLayout(self)
        #: the shared snapshots, newest first; each bump_epoch() empties them
        self._shared: list[Any] = [self._shared_empty()] * SLOTS
        for j in range(SLOTS):
            register_memo(self._shared, j, self._shared[0])
        self._source = ""
        self.call_source = ""
        #: the explicit launch ``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: generated when
        #: first used, and again after the plan's state changed (:meth:`_regenerate`)
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
        self._tls.owner = owner
        self._tls.s = ms
        return ms

    # dtype learning ---------------------------------------------------------------------------
    def _learn(self, i: int, key: Any) -> None:
        ok, _ = dtype_ok(self.entry.params[i], key)
        if not ok:
            raise Short()
        self.accepted[i].add(key)

    def _storage_seen(self, i: int, obj: Any) -> tuple[int, int, Any]:
        """Read a storage argument of a type not inlined yet; inline the built-in kinds (torch,
        CuPy) the first time one is seen for this parameter."""
        tp = type(obj)
        rec = interop.array_type(obj)
        out = rec.extract(obj)
        if out[1] * self.entry.params[i].element_size > interop.ADDRESS_SPACE - out[0]:
            raise Short()  # the elements run past the address space (an extractor that lies)
        if rec.device is not None and interop.device_of(obj) not in (None, self.device_id):
            raise Short()  # on another device (the inlined code checks it too)
        seen = self._inline[i]
        inline = bool(rec.inline) and tp not in seen and len(seen) < MAX_INLINE
        versioned = tp in interop.VERSIONED_ARRAY_TYPES and i not in self._versioned
        if inline or versioned:  # new code for this parameter (two threads may both regenerate)
            with self._keep_lock:
                if inline:
                    seen.setdefault(tp, rec)
                if versioned:
                    self._versioned.add(i)
                self._regenerate()
        return out

    def _uniform_seen(self, i: int, obj: Any) -> Any:
        """Convert a uniform argument of a type not inlined yet; inline ctypes / bytes types."""
        tp = type(obj)
        if tp is dict:  # fields by name, packed by the struct's C layout (Slang crates)
            p = self.entry.params[i]
            return struct_bytes(f"{self.entry.name}(): argument {p.name!r}", p, obj)
        conv = cached_converter(tp) or uniform_converter(obj)
        u = conv(obj)
        kind = "ctypes" if is_converter(conv, "ctypes") else "bytes" if tp is bytes else None
        seen = self._uinline[i]
        if kind is not None and tp not in seen and len(seen) < MAX_INLINE:
            with self._keep_lock:
                if tp not in seen:
                    seen[tp] = kind
                    self._regenerate()
        return u

    def _scalar(self, i: int, obj: Any) -> Any:
        """A scalar the fast path does not pack as it is (bool, bfloat16, complex): converted by
        the ABI's one rule set (TypeError / ValueError: the launch diagnoses the argument)."""
        return abi.scalar_value(self.entry.params[i].element_type, obj)

    # code generation --------------------------------------------------------------------------
    def _namespace(self) -> dict[str, Any]:
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
            "as_stream": as_stream, "uniform_seen": self._uniform_seen, "NOMEMO": NOMEMO,
            "EPOCH": EPOCH, "STABLE_TYPES": interop.STABLE_ARRAY_TYPES,
            "MEMO_TYPES": interop.MEMO_ARRAY_TYPES, "STABLE_MEMO": (None, None),
            "tensor_memo": interop.tensor_memo, "FREED": FREED,
            "IMMUTABLE_SCALAR": IMMUTABLE_SCALAR, "uniform_reader": uniform_reader,
            "ready_stream": ready_stream, "pack_u64": _PACK_U64, "storage_seen": self._storage_seen,
            "check_attrs": self.check_attrs,
        }
        if self.fattrs.needs_ex:  # attributes on every launch: cuLaunchKernelEx, its list prebuilt
            ns["launch_ex"] = make_launch_ex(drv, self.fattrs)
        for i, reader in enumerate(self.readers):
            if reader.array:
                ns[f"accepted_{i}"] = self.accepted[i]
                for j, tp in enumerate(self._inline[i]):
                    ns[f"ArrayT{i}_{j}"] = tp
            elif reader.uniform:
                for j, tp in enumerate(self._uinline[i]):
                    ns[f"StructT{i}_{j}"] = tp
        return ns

    def regenerate_code(self) -> None:
        """Generate the launch code again (hooks installed or removed)."""
        with self._keep_lock:
            self._regenerate()

    def _regenerate(self) -> None:
        """The state changed (a type inlined, hooks): the kernel's call is generated again now
        (``on_regenerate``), ``run`` when next used. (A first call learns its argument types
        inside ``run``; generating ``run`` eagerly here made a source that was never run.)"""
        self.run = self._run_new
        for cb in list(self.on_regenerate):
            cb(self)

    def _run_new(self, *args: Any) -> None:
        """``run`` until it is generated for the plan's current state: generate it, then run."""
        self._current_run()(*args)

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

    def _compile(self, src: str, what: str, function: str, extra: dict[str, Any] | None = None) -> Any:
        """``function`` from ``src``, a name tracebacks and pdb show the lines of (:mod:`khal_runtime.generated`)."""
        ns = self._namespace()
        ns.update(extra or {})
        return define(src, f"{what} {self.entry.name}", ns, function)

    def _generate(self) -> Callable[..., None]:
        """``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: the explicit launch."""
        self._source = run_source(self, hooks.active)
        return self._compile(self._source, "launch", "run")  # type: ignore[no-any-return]

    def clustered_run(self, cluster: tuple[int, int, int]) -> Callable[..., None]:
        """``run`` launching clusters of ``cluster`` blocks (``launch(..., cluster=...)``), generated
        once per cluster dims and hook state; the cluster is checked against the device the first time."""
        key = (cluster, hooks.active)
        fn = self._clustered.get(key)
        if fn is None:
            fa = self.fattrs.with_cluster(driver(), cluster, Device(self.device_id))
            src = run_source(self, hooks.active, clustered=True)
            fn = self._compile(src, f"clustered launch {cluster}", "run",
                               {"launch_ex": make_launch_ex(driver(), fa), "check_attrs": fa.check_launch})
            with self._keep_lock:
                self._clustered[key] = fn
        return fn

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

    def make_call(self, slow: Callable[..., None], kernel: Any) -> Callable[..., None]:
        """The kernel's call, specialised for this entry on this device: ``(n, *args,
        stream=None)``, off its fast paths ``slow(kernel, n, args, st)``. The paths, and what
        lets a launch reuse an earlier one's packed arguments: :mod:`.launchgen`."""
        self.call_source = call_source(self, hooks.active)
        extra = {"slow_call": slow, "kernel": kernel, "MISSING": MISSING, "snapshots": self._shared,
                 "promote": self._promote, "unshare": self._unshare}
        return self._compile(self.call_source, "call", "__call__", extra)  # type: ignore[no-any-return]

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
                                                                               self.shared, st._cu, addr),
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
