"""Launching (module ``launching``, so it does not shadow ``khal_runtime.launch``): per-(entry, device) launch plans with a precompiled argument path.

A :class:`LaunchPlan` is built once per entry and device. It holds the
``CUfunction``, a ``struct.Struct`` for the whole kernel-argument block (laid out
at the C ABI offsets the binary was checked against), per-thread packing
buffers with a ``void*[]`` already pointing into them, and a generated Python
function that, per call, reads each argument through the per-type extractor
cache, checks its dtype against a learned set, packs everything with one
``pack_into`` and calls ``cuLaunchKernel`` with the ``void**`` as an int.
Anything unexpected falls to :func:`_diagnose`, which re-checks the arguments
one by one and raises a named ArgumentError / ArgumentValueError; nothing is
launched then. A repeated launch (same argument objects) skips the reading and
packing: see :meth:`LaunchPlan.make_call` for the per-thread memo and the shared
snapshot, and ``buffers.bump_epoch`` for what clears them.

Seams: ``hooks`` (tracing / profiling, installed from ``KHAL_CUDA_TRACE`` /
``KHAL_CUDA_PROFILE`` by ``khal_runtime.tracing`` if present) is compiled into the
generated code only while installed; graph capture works on any :class:`Stream`
(``khal_runtime.graphs``); ``LaunchPlan.indirect_function`` holds the
persistent-grid variant of entries that declare ``indirect_symbol``.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from khal_runtime import _cuda
from khal_runtime._launchgen import SLOTS, MemoLayout, call_source, run_source
from khal_runtime.arguments import _dtype_ok, _Short, diagnose_args, dim3, thread_count
from khal_runtime.buffers import (EPOCH, EXTRACTORS, FREED, MEMO_ARRAY_TYPES, STABLE_ARRAY_TYPES,
                                  VERSIONED_ARRAY_TYPES, DeviceBuffer, _x_cupy, _x_cupy_fast, _x_torch,
                                  device_of, extractor_for, register_memo, tensor_memo)
from khal_runtime.dtypes import STRUCT_CODES, bf16_bits
from khal_runtime.errors import CudaError
from khal_runtime.manifest import Entry
from khal_runtime.uniforms import _CONVERTERS, UniformCache, _c_buffer, _c_ctypes, uniform_converter

__all__ = ["LaunchConfig", "LaunchPlan", "diagnose_args", "dim3", "hooks", "launch", "thread_count"]


@dataclass(frozen=True)
class LaunchConfig:
    """Grid (blocks), block (threads per block; None = the entry's block size), dynamic shared memory."""

    grid: int | tuple[int, ...]
    block: int | tuple[int, ...] | None = None
    shmem: int = 0


class _Hooks:
    """Launch hooks. When ``active``, ``dispatch`` runs every launch:
    ``dispatch(plan, grid, block, shmem, stream, args, do_launch)`` must call ``do_launch()``.

    The generated launch code of every plan holds the dispatch call only while hooks are
    installed (install/uninstall regenerate it), so launches without tracing pay nothing."""

    active: bool = False
    dispatch: Callable[..., Any] | None = None

    def install(self, dispatch: Callable[..., Any]) -> None:
        self.dispatch = dispatch
        was, self.active = self.active, True
        if not was:
            _regenerate_all()

    def uninstall(self) -> None:
        was, self.active = self.active, False
        self.dispatch = None
        if was:
            _regenerate_all()


#: every live LaunchPlan, to regenerate their launch code when hooks come and go
_PLANS: weakref.WeakSet[LaunchPlan] = weakref.WeakSet()


def _regenerate_all() -> None:
    for plan in list(_PLANS):
        with plan._keep_lock:
            plan._regenerate()


hooks = _Hooks()


# Array kinds whose extraction the generated code inlines (their code: _launchgen.INLINE_CODE)
_INLINE_KIND: dict[Any, str] = {_x_torch: "torch", _x_cupy_fast: "cupy_fast", _x_cupy: "cupy"}
_MAX_INLINE = 3
_MISSING = object()  # default of the generated __call__'s parameters: "not passed"
_NOMEMO = object()  # a prepacked-path memo slot that no argument is identical to
_PACK_U64 = struct.Struct("<Q").pack_into


def _uniform_reader(obj: Any, converted: Any) -> Any:
    """How the prepacked path re-reads a uniform argument it saw before: None when its identity
    is enough (``bytes`` never change; a device buffer's pointer is fixed until it is freed,
    which moves the EPOCH), else a function giving its current bytes (a ctypes struct or a
    NumPy value can be changed in place); ``_NOMEMO`` for a type it cannot re-read."""
    if converted.__class__ is not bytes or type(obj) is bytes:
        return None
    conv = _CONVERTERS.get(type(obj))
    if conv is _c_ctypes or conv is _c_buffer:
        return bytes
    return _NOMEMO if conv is None else conv


class _ImmutableScalars(dict):  # type: ignore[type-arg]
    """type -> whether a scalar argument of that type can never change in place (so the
    prepacked path may reuse what it packed from the same object): Python and NumPy scalars
    can't, a 0-d NumPy array or a ctypes number can."""

    def __missing__(self, tp: type) -> bool:
        import sys

        np = sys.modules.get("numpy")
        ok = issubclass(tp, (int, float)) or (np is not None and issubclass(tp, np.generic))
        self[tp] = ok
        return ok


_IMMUTABLE = _ImmutableScalars()


class _ThreadOwner:
    """Owns one thread's memo slots of one plan in ``buffers.THREAD_MEMOS``."""

    __slots__ = ("__weakref__",)


class LaunchPlan:
    """Everything needed to launch one entry on one device, precomputed."""

    def __init__(self, entry: Entry, crate: str, device_id: int, function: Any,
                 uniforms: UniformCache, indirect_function: Any = None) -> None:
        from khal_runtime.loader import expected_param_layout

        self.entry = entry
        self.crate = crate
        self.device_id = device_id
        self.function = function
        self.indirect_function = indirect_function
        self.uniforms = uniforms
        self.block = tuple(entry.block_size)
        layout = expected_param_layout(entry)
        self.layout = layout
        self.args_size = (layout[-1][1] + layout[-1][2]) if layout else 0
        fmt = ["<"]
        pos = 0
        codes: list[str] = []
        for p in entry.params:
            if p.kind == "storage":
                codes += ["Q", "Q"]
            elif p.kind == "uniform":
                codes.append("Q")
            else:
                codes.append(STRUCT_CODES.get(p.element_type, "B" * p.element_size))
        for (_, off, size), code in zip(layout, codes):
            if off > pos:
                fmt.append(f"{off - pos}x")
            fmt.append(code)
            pos = off + size
        self.struct = struct.Struct("".join(fmt))
        assert self.struct.size == self.args_size, (self.struct.format, layout)
        self._offsets = [off for _, off, _ in layout]
        self._tls = threading.local()
        self._keep_lock = threading.Lock()  # guards regeneration
        self.accepted: list[set[Any]] = [set() for _ in entry.params]
        #: per storage parameter: array types whose extraction is inlined (type -> kind)
        self._inline: list[dict[type, str]] = [{} for _ in entry.params]
        #: storage parameters that have seen a torch tensor: their memos check its version
        self._versioned: set[int] = set()
        #: per uniform parameter: host struct types converted inline (type -> "ctypes"/"bytes")
        self._uinline: list[dict[type, str]] = [{} for _ in entry.params]
        #: called with the plan after the launch code was regenerated (a new type inlined)
        self.on_regenerate: list[Callable[[LaunchPlan], None]] = []
        #: indices into memo slots and snapshots (khal_runtime._launchgen)
        self.memo = MemoLayout(self)
        #: the shared snapshots, newest first; each bump_epoch() empties them
        self._shared: list[tuple[Any, ...]] = [self._shared_empty()] * SLOTS
        for j in range(SLOTS):
            register_memo(self._shared, j, self._shared[0])
        self.source = ""
        self.call_source = ""
        self.run = self._generate()
        _PLANS.add(self)

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

    def _new_slots(self) -> list[Any]:
        """This thread's memo slots, each with its own argument block, then the index of the
        slot the next full read fills, then a scratch slot for the explicit launch (see
        :class:`khal_runtime._launchgen.MemoLayout`). A slot's stream item is its valid flag,
        cleared by ``buffers.bump_epoch`` for as long as the thread lives (they are registered
        under an owner only this thread's thread-local storage holds)."""
        lo = self.memo
        owner = _ThreadOwner()
        slots: list[Any] = []
        for j in range(SLOTS + 1):
            m: list[Any] = [_NOMEMO] * lo.length
            m[lo.buf], m[lo.ptrs], m[lo.addr] = self._new_block()
            m[lo.hits] = 0
            if j < SLOTS:
                register_memo(m, lo.stream, owner=owner)
            slots.append(m)
        ms = slots[:SLOTS] + [0, slots[SLOTS], False]
        self._tls.owner = owner
        self._tls.s = ms
        return ms

    # dtype learning ---------------------------------------------------------------------------
    def _learn(self, i: int, key: Any) -> None:
        ok, _ = _dtype_ok(self.entry.params[i], key)
        if not ok:
            raise _Short()
        self.accepted[i].add(key)

    def _storage_seen(self, i: int, obj: Any) -> tuple[int, int, Any]:
        """Extract a storage argument off the inlined types; inline known kinds (torch, CuPy)
        the first time one is seen for this parameter."""
        tp = type(obj)
        fn = EXTRACTORS.get(tp) or extractor_for(obj)
        out = fn(obj)
        kind = _INLINE_KIND.get(fn)
        if kind is not None and device_of(obj) not in (None, self.device_id):
            raise _Short()  # torch / CuPy on another device (the inlined code checks it too)
        seen = self._inline[i]
        inline = kind is not None and tp not in seen and len(seen) < _MAX_INLINE
        versioned = tp in VERSIONED_ARRAY_TYPES and i not in self._versioned
        if inline or versioned:  # new code for this parameter (two threads may both regenerate)
            with self._keep_lock:
                if inline:
                    seen.setdefault(tp, kind)  # type: ignore[arg-type]
                if versioned:
                    self._versioned.add(i)
                self._regenerate()
        return out

    # code generation --------------------------------------------------------------------------
    def _namespace(self) -> dict[str, Any]:
        from khal_runtime.device import _tls as dev_tls
        from khal_runtime.device import ensure_current, ready_stream
        from khal_runtime.stream import Stream, as_stream

        ns: dict[str, Any] = {
            "_ucache": self.uniforms.entries, "_ufetch": self.uniforms.fetch, "_Short": _Short,
            "_learn": self._learn, "_tls": self._tls, "_newslots": self._new_slots,
            "_pack": self.struct.pack_into, "_bf16": bf16_bits, "_H": hooks,
            "_launch": _cuda.driver().cuLaunchKernel, "_lx": launch_call(_cuda.driver())[0],
            "_f": self.function, "_plan": self,
            "_diagnose": self._diagnose, "_failed": self._launch_failed, "bytes": bytes,
            "_DB": DeviceBuffer, "_ktls": dev_tls, "_ensure": ensure_current, "_Stream": Stream,
            "_as_stream": as_stream,
        }
        for i, p in enumerate(self.entry.params):
            if p.kind == "storage":
                ns[f"_ok{i}"] = self.accepted[i]
                for j, tp in enumerate(self._inline[i]):
                    ns[f"_T{i}_{j}"] = tp
            elif p.kind == "uniform":
                for j, tp in enumerate(self._uinline[i]):
                    ns[f"_UT{i}_{j}"] = tp
        ns["_useen"] = self._uniform_seen
        ns["_NOMEMO"] = _NOMEMO
        ns["_E"] = EPOCH
        ns["_MA"] = STABLE_ARRAY_TYPES
        ns["_MM"] = MEMO_ARRAY_TYPES
        ns["_STQ"] = (None, None)
        ns["_tmemo"] = tensor_memo
        ns["_FREED"] = FREED
        ns["_IMM"] = _IMMUTABLE
        ns["_urd"] = _uniform_reader
        ns["_ready"] = ready_stream
        ns["_pq"] = _PACK_U64
        ns["_sseen"] = self._storage_seen
        return ns

    def _uniform_seen(self, i: int, obj: Any) -> Any:
        """Convert a uniform argument off the inlined types; inline ctypes / bytes types."""
        tp = type(obj)
        conv = _CONVERTERS.get(tp) or uniform_converter(obj)
        u = conv(obj)
        kind = "ctypes" if conv is _c_ctypes else "bytes" if tp is bytes else None
        seen = self._uinline[i]
        if kind is not None and tp not in seen and len(seen) < _MAX_INLINE:
            with self._keep_lock:
                if tp not in seen:
                    seen[tp] = kind
                    self._regenerate()
        return u

    def _regenerate(self) -> None:
        self.run = self._generate()
        for cb in list(self.on_regenerate):
            cb(self)

    def _compile(self, src: str, what: str, extra: dict[str, Any] | None = None) -> Any:
        ns = self._namespace()
        ns.update(extra or {})
        exec(compile(src, f"<khal {what} {self.entry.name}>", "exec"), ns)
        return ns

    def _generate(self) -> Callable[..., None]:
        """``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: the explicit launch."""
        self.source = run_source(self, hooks.active)
        return self._compile(self.source, "launch")["run"]  # type: ignore[no-any-return]

    def make_call(self, slow: Callable[..., None], kernel: Any) -> Callable[..., None]:
        """The kernel's call, specialised for this entry on this device: ``(n, *args,
        stream=None)``, off its fast paths ``slow(kernel, n, args, st)``. The paths, and what
        lets a launch reuse an earlier one's packed arguments: :mod:`khal_runtime._launchgen`."""
        self.call_source = call_source(self, hooks.active)
        extra = {"_slow": slow, "_K": kernel, "_M": _MISSING, "_S": self._shared, "_promote": self._promote,
                 "_unshare": self._unshare}
        return self._compile(self.call_source, "call", extra)["__call__"]  # type: ignore[no-any-return]

    def _shared_empty(self) -> tuple[Any, ...]:
        """A snapshot no call can match."""
        return (_NOMEMO,) * (self.memo.s_length - 1) + (None,)

    def _promote(self, m: list[Any], st: Any) -> None:
        """Make this thread's memo slot ``m``, just hit again, the newest shared snapshot: a
        copy of its argument block that is never written again, and the launch call's whole
        argument tuple (:func:`launch_call`). The oldest snapshot goes."""
        lo = self.memo
        ep = EPOCH[0]
        src = m[lo.buf]
        blk = ctypes.create_string_buffer(src.raw, len(src))
        base = ctypes.addressof(blk)
        ptrs = (ctypes.c_void_p * len(self._offsets))(*[base + off for off in self._offsets])
        addr = ctypes.addressof(ptrs)
        uni: list[Any] = []
        for rs, bs in lo.uniform.values():
            uni += [m[rs], m[bs]]
        for vs, ps, ks in lo.tensor.values():
            uni += [m[vs], m[ps], m[ks]]
        gx = m[lo.gx]
        args = launch_call(_cuda.driver())[1](self.function, (gx, 1, 1), self.block, 0, st._cu, addr)
        snap = (*m[:lo.P], st, m[lo.n], args, gx, addr, *uni, (blk, ptrs))
        if m[lo.stream] is st and EPOCH[0] == ep:  # nothing freed or flushed meanwhile
            shared = self._shared
            shared[:] = [snap] + shared[:SLOTS - 1]

    def _unshare(self, snap: tuple[Any, ...]) -> None:
        """Drop shared snapshot ``snap`` (its check raised: it can never match again)."""
        shared = self._shared
        keep = [s for s in shared if s is not snap]
        shared[:] = keep + [self._shared_empty()] * (SLOTS - len(keep))

    # failures ---------------------------------------------------------------------------------
    def _launch_failed(self, err: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int) -> None:
        if not err:
            return
        name = getattr(err, "name", str(err))
        raise CudaError(
            f"cuLaunchKernel({self.entry.symbol}) failed: {name} "
            f"(grid {(gx, gy, gz)}, block {(bx, by, bz)}, device {self.device_id})",
            code=name,
        )

    def _diagnose(self, args: tuple[Any, ...], exc: BaseException) -> None:
        """Re-check every argument slowly; raise a named error for the first bad one."""
        diagnose_args(self.entry, args, exc, device=self.device_id)


def launch(stream: Any, config: LaunchConfig, kernel: Any, *args: Any) -> None:
    """``cuda.core``-style launch: ``launch(stream, LaunchConfig(grid, block, shmem), kernels.k, *args)``."""
    kernel.launch(config.grid, config.block, *args, stream=stream, shared_mem=config.shmem)


def launch_call(drv: Any) -> tuple[Callable[..., Any], Callable[..., tuple[Any, ...]]]:
    """(launch function, ``args(f, grid, block, shmem, cu_stream, params_addr)``) for launches
    whose grid and stream are known ahead (the shared snapshot, a bound launch): the argument
    tuple is built once and each launch is ``fn(*args)``.

    ``cuLaunchKernelEx`` with a ``CUlaunchConfig`` built once, where the bindings have it: on
    the H200 it measured 3-4% faster per launch than ``cuLaunchKernel`` through cuda-bindings
    (``benchmarks/probe_driver_call.py``; fewer arguments to convert), and it is what
    ``cuda.core`` launches with. Otherwise ``cuLaunchKernel``."""
    ex = getattr(drv, "cuLaunchKernelEx", None)
    config = getattr(drv, "CUlaunchConfig", None)
    if ex is None or config is None:
        launch = drv.cuLaunchKernel
        return launch, lambda f, g, b, shmem, cu, addr: (f, *g, *b, shmem, cu, addr, 0)

    def args(f: Any, g: tuple[int, int, int], b: tuple[int, int, int], shmem: int, cu: Any,
             addr: int) -> tuple[Any, ...]:
        cfg = config()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
        cfg.sharedMemBytes, cfg.hStream, cfg.numAttrs = shmem, cu, 0
        return (cfg, f, addr, 0)

    return ex, args


def _install_env_hooks() -> None:
    if os.environ.get("KHAL_CUDA_TRACE") or os.environ.get("KHAL_CUDA_PROFILE") or os.environ.get("KHAL_CUDA_NVTX"):
        try:
            from khal_runtime import tracing  # type: ignore[attr-defined]
        except ImportError:
            return
        install = getattr(tracing, "install_from_env", None)
        if install is not None:
            install(hooks)


_install_env_hooks()
