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
from khal_runtime.arguments import _dtype_ok, _Short, diagnose_args, dim3, thread_count
from khal_runtime.buffers import (EPOCH, EXTRACTORS, FREED, STABLE_ARRAY_TYPES, DeviceBuffer, _x_cupy, _x_cupy_fast,
                                  _x_torch, extractor_for, register_memo)
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


# Array kinds whose extraction the generated launch code inlines once a type of that kind is
# seen for a parameter (same checks as the extractor; anything off them raises _Short and
# _diagnose names the problem). ``{a}`` is the argument, ``{i}`` its index.
_INLINE_KIND: dict[Any, str] = {_x_torch: "torch", _x_cupy_fast: "cupy_fast", _x_cupy: "cupy"}
_INLINE_CODE: dict[str, list[str]] = {
    "torch": ["if not ({a}.is_cuda and {a}.is_contiguous()): raise _Short()",
              "p{i} = {a}.data_ptr(); c{i} = {a}.numel(); k{i} = {a}.dtype"],
    "cupy_fast": ["if not {a}._c_contiguous: raise _Short()",
                  "p{i} = {a}.data.ptr; c{i} = {a}.size; k{i} = {a}.dtype"],
    "cupy": ["if not {a}.flags.c_contiguous: raise _Short()",
             "p{i} = {a}.data.ptr; c{i} = {a}.size; k{i} = {a}.dtype"],
}
_MAX_INLINE = 3
_MISSING = object()  # default of the generated __call__'s parameters: "not passed"
_NOMEMO = object()  # a prepacked-path memo slot that no argument is identical to
_PACK_U64 = struct.Struct("<Q").pack_into
_MAX_PROMOTIONS = 16  # snapshots a plan's shared memo takes before it stops (see _promote)


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
        self._keep: list[Any] = []
        self._keep_lock = threading.Lock()
        self.accepted: list[set[Any]] = [set() for _ in entry.params]
        #: per storage parameter: array types whose extraction is inlined (type -> kind)
        self._inline: list[dict[type, str]] = [{} for _ in entry.params]
        #: per uniform parameter: host struct types converted inline (type -> "ctypes"/"bytes")
        self._uinline: list[dict[type, str]] = [{} for _ in entry.params]
        #: called with the plan after the launch code was regenerated (a new type inlined)
        self.on_regenerate: list[Callable[[LaunchPlan], None]] = []
        # this thread's block and memo (_new_slot): args, stream, n, gx, uniforms, buf, addr
        n_params = len(entry.params)
        self._m_stream, self._m_n, self._m_gx = n_params, n_params + 1, n_params + 2
        self._m_uniform: dict[int, tuple[int, int]] = {}  # param -> (reader slot, bytes slot)
        k = n_params + 3
        for i, p in enumerate(entry.params):
            if p.kind == "uniform":
                self._m_uniform[i] = (k, k + 1)
                k += 2
        self._m_buf, self._m_addr, self._m_len = k, k + 1, k + 2
        # the shared memo (make_call): one immutable snapshot, cleared like the memos
        self._shared: list[tuple[Any, ...]] = [self._shared_empty()]
        self._promotions_left = [_MAX_PROMOTIONS]
        register_memo(self._shared, 0, self._shared[0])
        self.source = ""
        self.call_source = ""
        self.run = self._generate()
        _PLANS.add(self)

    # per-thread argument block ----------------------------------------------------------------
    def _new_slot(self) -> list[Any]:
        """This thread's argument block and prepacked-path memo (see :meth:`make_call`): one
        list, ``[arg 0 .. arg P-1, stream, n, gx, (reader, bytes) per uniform, buf, addr]``;
        the stream slot is the memo's valid flag (cleared by ``buffers.bump_epoch``)."""
        buf = ctypes.create_string_buffer(max(self.args_size, 8))
        base = ctypes.addressof(buf)
        n = len(self._offsets)
        if n:
            ptrs = (ctypes.c_void_p * n)(*[base + off for off in self._offsets])
            addr = ctypes.addressof(ptrs)
        else:
            ptrs, addr = None, 0
        m: list[Any] = [_NOMEMO] * self._m_len
        m[self._m_buf], m[self._m_addr] = buf, addr
        with self._keep_lock:
            self._keep.append((buf, ptrs))
        register_memo(m, self._m_stream)
        self._tls.s = m
        return m

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
        seen = self._inline[i]
        if kind is not None and tp not in seen and len(seen) < _MAX_INLINE:
            with self._keep_lock:
                if tp not in seen:
                    seen[tp] = kind
                    self._regenerate()
        return out

    # code generation --------------------------------------------------------------------------
    def _namespace(self) -> dict[str, Any]:
        from khal_runtime.device import _tls as dev_tls
        from khal_runtime.device import ensure_current, ready_stream
        from khal_runtime.stream import Stream, as_stream, default_stream

        ns: dict[str, Any] = {
            "_X": EXTRACTORS, "_xf": extractor_for, "_U": _CONVERTERS, "_uf": uniform_converter,
            "_ucache": self.uniforms.entries, "_ufetch": self.uniforms.fetch, "_Short": _Short,
            "_learn": self._learn, "_tls": self._tls, "_newslot": self._new_slot,
            "_pack": self.struct.pack_into, "_bf16": bf16_bits, "_H": hooks,
            "_launch": _cuda.driver().cuLaunchKernel, "_lx": launch_call(_cuda.driver())[0],
            "_f": self.function, "_plan": self,
            "_diagnose": self._diagnose, "_failed": self._launch_failed, "bytes": bytes,
            "_DB": DeviceBuffer, "_ktls": dev_tls, "_ensure": ensure_current, "_Stream": Stream,
            "_as_stream": as_stream, "_first_stream": default_stream,
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

    # code generation: argument reading ---------------------------------------------------------
    def _uniform_slots(self) -> list[tuple[int, int]]:
        """(parameter index, byte offset in the argument block) of each uniform."""
        out, slot = [], 0
        for i, p in enumerate(self.entry.params):
            if p.kind == "uniform":
                out.append((i, self._offsets[slot]))
            slot += p.abi_slots
        return out

    def _uniform_param_lines(self, i: int, I: str) -> list[str]:  # noqa: E741
        """Lines reading uniform ``a{i}`` into ``u{i}``, a device pointer to its bytes, and
        ``h{i}``, what its converter gave (bytes, or (pointer, size) of a device buffer)."""
        a, size = f"a{i}", int(self.entry.params[i].element_size)
        lines = [f"{I}t = type({a})"]
        for j, kind in enumerate(self._uinline[i].values()):
            lines.append(f"{I}{'if' if j == 0 else 'elif'} t is _UT{i}_{j}:")
            lines.append(f"{I}    u = {'bytes(' + a + ')' if kind == 'ctypes' else a}")
        return lines + [
            f"{I}{'else:' if self._uinline[i] else 'if True:'}",
            f"{I}    u = _useen({i}, {a})",
            f"{I}h{i} = u",
            f"{I}if u.__class__ is bytes:",
            f"{I}    if len(u) != {size}: raise _Short()",
            f"{I}    e = _ucache.get(u)",
            f"{I}    u{i} = e[0] if e is not None and e[1] is None else _ufetch(u, st)",
            f"{I}else:",
            f"{I}    if u[1] < {size}: raise _Short()",
            f"{I}    u{i} = u[0]",
        ]

    def _read_lines(self, I: str) -> list[str]:  # noqa: E741
        """Lines that read ``a0..`` and pack them into this thread's block ``m``; generated only
        from parameter kinds and validated ints. Sets ``t{i}`` (storage types) on the way."""
        lines: list[str] = []
        pack_args: list[str] = []
        for i, p in enumerate(self.entry.params):
            a = f"a{i}"
            if p.kind == "storage":
                lines += [
                    f"{I}t{i} = type({a})",
                    f"{I}if t{i} is _DB:",
                    f"{I}    p{i} = {a}.ptr; c{i} = {a}.size",
                    f"{I}    k{i} = {a}._et if {a}._base is None or {a}._base._et is not _FREED else _FREED",
                ]
                for j, kind in enumerate(self._inline[i].values()):
                    lines.append(f"{I}elif t{i} is _T{i}_{j}:")
                    lines += [f"{I}    " + ln.format(a=a, i=i) for ln in _INLINE_CODE[kind]]
                lines += [
                    f"{I}else:",
                    f"{I}    p{i}, c{i}, k{i} = _sseen({i}, {a})",
                    f"{I}if k{i} not in _ok{i}: _learn({i}, k{i})",
                ]
                if p.shape == "array" and p.length:
                    lines.append(f"{I}if c{i} < {int(p.length)}: raise _Short()")
                elif p.shape == "value":
                    lines.append(f"{I}if c{i} < 1: raise _Short()")
                pack_args += [f"p{i}", f"c{i}"]
            elif p.kind == "uniform":
                lines += self._uniform_param_lines(i, I)
                pack_args.append(f"u{i}")
            else:
                pack_args.append(f"_bf16({a})" if p.element_type == "bfloat16" else a)
        if pack_args:
            lines.append(f"{I}_pack(m[{self._m_buf}], 0, {', '.join(pack_args)})")
        return lines

    def _slot_lines(self, I: str) -> list[str]:  # noqa: E741
        return [f"{I}try:", f"{I}    m = _tls.s", f"{I}except AttributeError:", f"{I}    m = _newslot()"]

    def _memo_store_lines(self, I: str) -> list[str]:  # noqa: E741
        """After a full read and pack: remember the arguments for the prepacked path, only when
        every buffer is of a type that cannot change under the same identity (DeviceBuffer,
        cupy.ndarray: ``buffers.STABLE_ARRAY_TYPES``; not torch), every scalar is immutable (a 0-d NumPy array is not) and every uniform
        can be re-read (:func:`_uniform_reader`). The stream is
        stored last: it is the memo's valid flag, cleared before packing."""
        P = len(self.entry.params)
        dbs = [f"t{i} in _MA" if p.kind == "storage" else f"_IMM[type(a{i})]"
               for i, p in enumerate(self.entry.params) if p.kind != "uniform"]
        body: list[str] = []
        conds: list[str] = []
        for i, (rs, bs) in self._m_uniform.items():
            body.append(f"r{i} = _urd(a{i}, h{i})")
            conds.append(f"r{i} is not _NOMEMO")
        inner = [f"m[{rs}] = r{i}; m[{bs}] = h{i}" for i, (rs, bs) in self._m_uniform.items()]
        inner += [f"m[0:{P}] = ({''.join(f'a{i}, ' for i in range(P))})",
                  f"m[{self._m_n}] = n; m[{self._m_gx}] = gx",
                  f"if ep == _E[0]: m[{self._m_stream}] = st"]
        out: list[str] = []
        J = I
        if dbs:
            out.append(f"{I}if {' and '.join(dbs)}:")
            J = I + "    "
        out += [J + ln for ln in body]
        if conds:
            out.append(f"{J}if {' and '.join(conds)}:")
            J = J + "    "
        out += [J + ln for ln in inner]
        return out

    def _memo_hit(self) -> str:
        """The prepacked path's condition: this thread's last launch of the entry packed these
        same argument objects for this same stream, and no DeviceBuffer was freed nor the
        uniform cache flushed since (either clears the stream slot: ``buffers.bump_epoch``)."""
        conds = [f"a{i} is m[{i}]" for i in range(len(self.entry.params))]
        conds += [f"st is m[{self._m_stream}]"]
        return " and ".join(conds)

    def _uniform_recheck_lines(self, I: str) -> list[str]:  # noqa: E741
        """Prepacked path: a host uniform (ctypes struct, NumPy, ...) may have new contents under
        the same identity; re-read it, and re-pack its device pointer only if they changed."""
        lines: list[str] = []
        offs = dict(self._uniform_slots())
        for i, (rs, bs) in self._m_uniform.items():
            size = int(self.entry.params[i].element_size)
            lines += [
                f"{I}r = m[{rs}]",
                f"{I}if r is not None:",
                f"{I}    u = r(a{i})",
                f"{I}    if u != m[{bs}]:",
                f"{I}        if len(u) != {size}: raise _Short()",
                f"{I}        e = _ucache.get(u)",
                f"{I}        _pq(m[{self._m_buf}], {offs[i]}, e[0] if e is not None and e[1] is None else _ufetch(u, st))",
                f"{I}        m[{bs}] = u",
            ]
        return lines

    @staticmethod
    def _launch_lines(g: str, b: str, shmem: str, args: str) -> list[str]:
        if hooks.active:  # regenerated when hooks are installed or removed
            return [
                f"    return _H.dispatch(_plan, ({g}), ({b}), {shmem}, st, {args},",
                f"                       lambda: _failed(_launch(_f, {g}, {b}, {shmem}, st._cu, addr, 0)[0], {g}, {b}))",
            ]
        return [
            f"    r = _launch(_f, {g}, {b}, {shmem}, st._cu, addr, 0)",
            "    if r[0]:",
            f"        _failed(r[0], {g}, {b})",
        ]

    def _compile(self, src: str, what: str, extra: dict[str, Any] | None = None) -> Any:
        ns = self._namespace()
        ns.update(extra or {})
        exec(compile(src, f"<khal {what} {self.entry.name}>", "exec"), ns)
        return ns

    def _generate(self) -> Callable[..., None]:
        """``run(gx, gy, gz, bx, by, bz, shmem, st, args)``: the explicit launch. It packs into
        the same per-thread block as the typed call, so it clears that block's memo first."""
        n = len(self.entry.params)
        I = "        "  # noqa: E741
        names = [f"a{i}" for i in range(n)]
        lines = ["def run(gx, gy, gz, bx, by, bz, shmem, st, args):", "    try:"]
        if n:
            lines.append(f"{I}{', '.join(names)}{',' if n == 1 else ''} = args")
            lines += self._slot_lines(I)
            lines.append(f"{I}m[{self._m_stream}] = _NOMEMO")
            lines += self._read_lines(I)
            lines.append(f"{I}addr = m[{self._m_addr}]")
        else:
            lines += [f"{I}if args: raise _Short()", f"{I}addr = 0"]
        lines += ["    except Exception as exc:", "        _diagnose(args, exc)", "        raise"]
        lines += self._launch_lines("gx, gy, gz", "bx, by, bz", "shmem", "args")
        src = "\n".join(lines) + "\n"
        self.source = src
        return self._compile(src, "launch")["run"]  # type: ignore[no-any-return]

    def make_call(self, slow: Callable[..., None], kernel: Any) -> Callable[..., None]:
        """A kernel's call specialised for this entry on this device: ``(n, *args,
        stream=None)``; anything off the fast path (another device, a non-positive or non-int
        thread count, missing or extra arguments) goes to ``slow(kernel, n, args, st)``.

        Three paths, fastest first:

        - shared memo (``_shared[0]``, an immutable snapshot): the same argument objects, thread
          count and stream as a launch that was repeated before, in any thread. The snapshot's
          argument block is never written again, so threads share it without a lock; the
          stream came from this thread's ``ready`` (its device is current here).
        - this thread's memo (:meth:`_memo_hit`): the same argument objects as this thread's
          last launch; host uniforms are re-read (their bytes can change in place) and
          re-packed if they changed; the result is promoted to the shared memo.
        - the full read, check and pack (:meth:`_read_lines`), which stores this thread's memo.
        """
        D = int(self.device_id)
        bx, by, bz = (int(v) for v in self.block)
        n_params = len(self.entry.params)
        names = [f"a{i}" for i in range(n_params)]
        sig = "".join(f"{a}=_M, " for a in names)
        tup = "(" + "".join(f"{a}, " for a in names) + ")"
        lines = [
            f"def __call__(n, {sig}*_more, stream=None):",
            "    if stream is None:",
            "        try:",
            "            st = _ktls.ready",
            "        except AttributeError:",
            "            st = _ready()",
            "    else:",
            "        st = stream if type(stream) is _Stream else _as_stream(stream)",
            "        try:",
            "            cur = _ktls.dev",
            "        except AttributeError:",
            "            cur = -1",
            "        if cur != st.device_id:",
            "            _ensure(st.device_id)",
        ]
        guard = (f"st.device_id != {D} or type(n) is not int or n <= 0 or _more"
                 + (f" or {names[-1]} is _M" if names else ""))
        to_slow = f"return _slow(_K, n, tuple(a for a in {tup} if a is not _M) + _more, st)"
        if n_params:
            P = n_params
            conds = [f"a{i} is k[{i}]" for i in range(P)] + [f"st is k[{P}]", f"n is k[{P + 1}]", "not _more"]
            for j, i in enumerate(self._m_uniform):
                r, b = P + 5 + 2 * j, P + 6 + 2 * j
                conds.append(f"(k[{r}] is None or k[{r}](a{i}) == k[{b}])")
            lines += ["    k = _S[0]", f"    if {' and '.join(conds)}:"]
            if hooks.active:
                lines.append(f"        gx = k[{P + 3}]; addr = k[{P + 4}]")
            else:  # the snapshot holds cuLaunchKernel's whole argument tuple
                lines += [f"        r = _lx(*k[{P + 2}])", "        if r[0]:",
                          f"            _failed(r[0], k[{P + 3}], 1, 1, {bx}, {by}, {bz})", "        return"]
            lines.append("    else:")
            J = "        "
            I = J + "        "  # noqa: E741
            lines += [J + ln for ln in self._slot_lines("")]
            lines += [
                f"{J}if {self._memo_hit()} and not _more:",
                f"{J}    if n is m[{self._m_n}]:",  # the same thread count object: same grid
                f"{J}        gx = m[{self._m_gx}]",
                f"{J}    elif type(n) is int and n > 0:",
                f"{J}        gx = (n + {bx - 1}) // {bx}",
                f"{J}        m[{self._m_n}] = n; m[{self._m_gx}] = gx",
                f"{J}    else:",
                f"{J}        {to_slow}",
            ]
            recheck = self._uniform_recheck_lines(I)
            if recheck:
                lines += [f"{J}    try:"] + recheck
                lines += [f"{J}    except Exception as exc:", f"{J}        _diagnose({tup}, exc)", f"{J}        raise"]
            lines += [
                f"{J}    if _PC[0]: _promote(m, st)",
                f"{J}else:",
                f"{J}    if {guard}:",
                f"{J}        {to_slow}",
                f"{J}    gx = (n + {bx - 1}) // {bx}",
                f"{J}    try:",
                f"{J}        ep = _E[0]",
                f"{J}        m[{self._m_stream}] = _NOMEMO",
            ]
            lines += self._read_lines(I)
            lines += self._memo_store_lines(I)
            lines += [f"{J}    except Exception as exc:", f"{J}        _diagnose({tup}, exc)", f"{J}        raise"]
            lines.append(f"{J}addr = m[{self._m_addr}]")
        else:
            lines += [f"    if {guard}:", f"        {to_slow}", "    addr = 0", f"    gx = (n + {bx - 1}) // {bx}"]
        lines += self._launch_lines("gx, 1, 1", f"{bx}, {by}, {bz}", "0", tup)
        src = "\n".join(lines) + "\n"
        self.call_source = src
        extra = {"_slow": slow, "_K": kernel, "_M": _MISSING, "_S": self._shared, "_PC": self._promotions_left,
                 "_promote": self._promote}
        return self._compile(src, "call", extra)["__call__"]  # type: ignore[no-any-return]

    def _shared_empty(self) -> tuple[Any, ...]:
        """``[arg 0 .. arg P-1, stream, n, launch call's arguments, gx, argument block address,
        (reader, bytes) per uniform, what keeps the block alive]``, here with nothing any call
        can match."""
        return (_NOMEMO,) * (len(self.entry.params) + 5 + 2 * len(self._m_uniform)) + (None,)

    def _promote(self, m: list[Any], st: Any) -> None:
        """Copy this thread's memo, just confirmed by a repeated launch, into the shared memo:
        a snapshot with its own argument block, never written again, and the launch call's
        whole argument tuple (:func:`launch_call`). At most ``_MAX_PROMOTIONS`` times per plan,
        so threads that each repeat different arguments do not keep replacing each other's
        snapshot."""
        left = self._promotions_left
        if left[0] <= 0:
            return
        left[0] -= 1
        ep = EPOCH[0]
        src = m[self._m_buf]
        blk = ctypes.create_string_buffer(src.raw, len(src))
        base = ctypes.addressof(blk)
        ptrs = (ctypes.c_void_p * len(self._offsets))(*[base + off for off in self._offsets])
        addr = ctypes.addressof(ptrs)
        P = len(self.entry.params)
        uni: list[Any] = []
        for rs, bs in self._m_uniform.values():
            uni += [m[rs], m[bs]]
        gx = m[self._m_gx]
        args = launch_call(_cuda.driver())[1](self.function, (gx, 1, 1), self.block, 0, st._cu, addr)
        snap = (*m[:P], st, m[self._m_n], args, gx, addr, *uni, (blk, ptrs))
        if m[self._m_stream] is st and EPOCH[0] == ep:  # nothing freed or flushed meanwhile
            self._shared[0] = snap

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
        diagnose_args(self.entry, args, exc)


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
