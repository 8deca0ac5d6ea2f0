"""The typed call on WebGPU: one entry on one device, from user arguments to a recorded dispatch.

:class:`KernelPlan` is what the generic ``Kernel`` holds per WebGPU device (as it holds a
``LaunchPlan`` per CUDA device); each user-facing operation is one method:

==========================================  ==============================================
``k(n, *args)``                             ``plan.call(n, args)``
``k.launch(grid, block, *args)``            ``plan.launch(grid, block, args, shared_mem)``
``k.bind(*args)`` then ``b(n)``             ``plan.bind(args)`` -> :class:`BoundDispatch`
``k.dispatch_indirect(count, *args, ...)``  ``plan.dispatch_indirect(count, args, threads=)``
``k.check_args(*args)``                     ``plan.check_args(args)``
==========================================  ==============================================

Arguments: a storage parameter takes a :class:`~.arrays.WgpuArray` (or any type registered
with :func:`register_storage_type`, e.g. the generic ``DeviceBuffer`` once it wraps one); a
uniform takes a dict of its fields, a ctypes Structure, a NumPy structured scalar or the bytes
of its C layout (:class:`~.packing.UniformPacker`); a scalar takes a number, under
:func:`khal_runtime.abi.scalar_value`. Every mistake raises ArgumentError /
ArgumentValueError naming the entry and the parameter before anything is recorded. How each
reader is taken is one :class:`WgpuReader` in :data:`READERS`, chosen when the plan is made.

The call is the hot path: see ``benchmarks/bench_webgpu.py`` for its cost against a raw
wgpu-py dispatch.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from khal_runtime import abi
from khal_runtime.abi import SCALARS
from khal_runtime.arguments import blocks, blocks_source, dim3, grid3, is_empty
from khal_runtime.backends.webgpu import memory
from khal_runtime.backends.webgpu.indirect import dispatch_indirect
from khal_runtime.backends.webgpu.arrays import WgpuArray
from khal_runtime.backends.webgpu.bindings import Bound, Immediates
from khal_runtime.backends.webgpu.device import WebGpuDevice
from khal_runtime.backends.webgpu.launch import Launcher, group_limit_error
from khal_runtime.backends.webgpu.memory import Allocation, Resource
from khal_runtime.packing import ScalarPacker, UniformPacker
from khal_runtime.backends.webgpu.pipeline import get_pipeline, select_target
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import ArgumentError, ArgumentValueError, KhalError
from khal_runtime.generated import define

if TYPE_CHECKING:
    from khal_runtime.manifest import Entry, Param, WebGpuTarget

__all__ = ["BoundDispatch", "KernelPlan", "StorageInfo", "register_storage_type"]

#: what a storage argument gives: (Resource, element type name, element count, the error that
#: stops it being bound or None, its Allocation)
StorageInfo = tuple[Resource, str, int, "KhalError | None", Allocation]


def _x_array(a: WgpuArray) -> StorageInfo:
    return a._res, a._et, a.size, a._bind_error, a.allocation


#: type -> function giving a storage argument's StorageInfo
STORAGE_TYPES: dict[type, Callable[[Any], StorageInfo]] = {WgpuArray: _x_array}


def register_storage_type(tp: type, fn: Callable[[Any], StorageInfo]) -> None:
    """Teach the WebGPU launch path a device-array type: ``fn(obj) -> StorageInfo``."""
    STORAGE_TYPES[tp] = fn


def _not_storage(obj: Any) -> StorageInfo:
    tp = type(obj)
    if hasattr(obj, "__array_interface__") or isinstance(obj, (bytes, bytearray, memoryview, list, tuple)):
        raise ArgumentError(f"is host memory ({tp.__module__}.{tp.__qualname__}); copy it to the device "
                            "first, e.g. khal_runtime.DeviceBuffer.from_numpy(a)")
    raise ArgumentError(f"expected a WebGPU device array, got {tp.__module__}.{tp.__qualname__}")


def _storage_info(obj: Any) -> StorageInfo:
    fn = STORAGE_TYPES.get(type(obj))
    if fn is None:
        for tp, f in list(STORAGE_TYPES.items()):
            if isinstance(obj, tp):
                return f(obj)
        return _not_storage(obj)
    return fn(obj)


def _desc(p: Param) -> str:
    return p.describe()


@dataclass(frozen=True)
class WgpuReader:
    """How the WebGPU launch path takes an argument of one reader (:data:`READERS`), chosen once
    per plan; the launch reads the flags, unpacked from ``KernelPlan._kinds``."""

    #: bound as a storage buffer (the plan's storages, in order)
    storage: bool
    #: packed into a uniform region of its own (``UniformPacker``); neither: into the entry's
    #: scalar block (``ScalarPacker``)
    uniform: bool
    #: the specialised call's condition that argument ``a{i}`` is the previous call's
    same: Callable[[int], str]


def _same_object(i: int) -> str:
    return f"last[{i}] is a{i}"


def _same_number(i: int) -> str:
    return (f"(last[{i}] is a{i} or (type(a{i}) is int is type(last[{i}]) and a{i} == last[{i}]) "
            f"or (type(a{i}) is float is type(last[{i}]) and a{i} == last[{i}] and a{i} != 0.0))")


#: the WebGPU launch path's implementation of each reader
READERS: abi.ReaderTable[WgpuReader] = abi.ReaderTable("khal_runtime.backends.webgpu.kernel", {
    "array": WgpuReader(storage=True, uniform=False, same=_same_object),
    "struct": WgpuReader(storage=False, uniform=True, same=_same_object),
    "value": WgpuReader(storage=False, uniform=False, same=_same_number),
})


class KernelPlan:
    """One entry on one WebGPU device (see the module docstring)."""

    def __init__(self, entry: Entry, device: WebGpuDevice, code: bytes | str | Callable[[], bytes | str],
                 crate: str = "", target: WebGpuTarget | None = None) -> None:
        self.entry = entry
        self.device = device
        self.target = target or select_target(entry, crate)
        self.pipeline = get_pipeline(device, entry, self.target, code, crate)
        self.launcher = Launcher(self.pipeline)
        self.stream = device.stream
        self.name = self.pipeline.name
        self.block = tuple(entry.block_size)
        self._bx = self.block[0]
        self.max_groups = device.max_groups
        self.params = entry.params
        t = self.target.target
        where = f"WebGPU launch of {entry.name}()"
        # a reader this path does not implement is refused here, never taken for a scalar
        readers = [READERS.of(p.kind, where) for p in entry.params]
        self._readers = readers
        self._upack = {p.name: UniformPacker(entry.name, p, t)
                       for p, r in zip(entry.params, readers) if r.uniform}
        scalars = [p for p, r in zip(entry.params, readers) if not (r.storage or r.uniform)]
        self._spack = ScalarPacker(entry.name, entry.params, self.target) if scalars else None
        self._scalar_mode = self.target.scalars
        self._pool = self.launcher.pool
        #: (index, param, storage, uniform (neither: a scalar), whether any element count will do)
        self._kinds = tuple((i, p, r.storage, r.uniform, p.shape in (None, "slice"))
                            for i, (p, r) in enumerate(zip(entry.params, readers)))
        # single-group fast path: where each binding of group 0 comes from
        plan = self.launcher.plan
        self._single = len(plan) == 1
        if self._single:
            g, src = plan[0]
            self._g0 = g
            storage_at = [i for i, r in enumerate(readers) if r.storage]
            index = {p.name: i for i, p in enumerate(entry.params)}
            src0: list[tuple[str, Any, bool]] = []
            for (source, k), dy in zip(src, g.dynamic):
                at = storage_at[k] if source == "s" else index[k] if source == "u" else k
                src0.append((source, at, dy))
            #: where each binding of group 0 comes from: ("s", param index) storage, ("u", param
            #: index) uniform, ("b", None) the scalar block; and whether its offset is dynamic
            self._src0 = tuple(src0)
        self._bgcache = self.launcher.groups_cache.groups
        if self._single:
            self._resolve = self._make_resolve()  # type: ignore[method-assign, assignment]
        #: the previous memoable call: its arguments, pool generation, FREES, bind groups, immediates
        #: (a 1-item list holding a tuple, replaced whole: a thread reads one consistent snapshot)
        self._memo: list[tuple[Any, ...]] = [(object(),) * (len(self.params) + 4)]
        self.call_source = ""
        self.call = self._make_call()  # type: ignore[method-assign, assignment]

    # -- arguments -------------------------------------------------------------------------------
    def _where(self, p: Param) -> str:
        return f"{self.name}(): argument {p.name!r} ({_desc(p)})"

    def _storage(self, p: Param, obj: Any) -> Resource:
        try:
            res, et, count, err, alloc = _storage_info(obj)
        except (ArgumentError, ArgumentValueError) as exc:
            raise type(exc)(f"{self._where(p)} {exc}") from None
        if et != p.element_type:
            self._bad_type(p, obj, et)
        if err is not None or alloc.freed or alloc.device is not self.device:
            self._bad_storage(p, obj, err, alloc)
        if p.shape == "array" and p.length and count < p.length:
            raise ArgumentValueError(f"{self._where(p)}: needs {p.length} elements, got {count}")
        if p.shape == "value" and count < 1:
            raise ArgumentValueError(f"{self._where(p)}: needs 1 element, got an empty array")
        return res

    def _bad_type(self, p: Param, obj: Any, et: str) -> None:
        if p.element_type in _scalar_types():
            raise ArgumentError(f"{self._where(p)}: expected element type {p.element_type} "
                                f"({p.element_size} bytes), got {et}")
        size = getattr(getattr(obj, "dtype", None), "itemsize", None)
        if size != p.element_size or et in _scalar_types():
            raise ArgumentError(f"{self._where(p)}: expected elements of struct {p.element_type} "
                                f"({p.element_size} bytes), got {et} ({size} bytes)")

    def _bad_storage(self, p: Param, obj: Any, err: KhalError | None, alloc: Allocation) -> None:
        where = self._where(p)
        if alloc.freed:
            raise ArgumentValueError(f"{where}: the buffer was freed")
        if alloc.device is not self.device:
            raise ArgumentValueError(f"{where} is on WebGPU device {alloc.device.ordinal}, the launch on "
                                     f"device {self.device.ordinal}: copy it there")
        assert err is not None
        raise type(err)(str(err).replace("argument", where, 1)) from None

    def resolve(self, args: Sequence[Any]) -> tuple[tuple[Bound, ...], Immediates | None]:
        """Check and bind ``args``: the bind groups and push constants of a dispatch."""
        bgs, imm, _memo = self._resolve(args)
        return bgs, imm

    def _resolve(self, args: Sequence[Any]) -> tuple[tuple[Bound, ...], Immediates | None, bool]:
        """:meth:`resolve`, and whether the call may be memoised (every argument of a type that
        cannot change under the same object: WgpuArray, bytes, int, float)."""
        if len(args) != len(self.params):
            sig = ", ".join(p.name for p in self.params)
            raise ArgumentError(f"{self.name}() takes {len(self.params)} argument(s) ({sig}) after the "
                                f"thread count, got {len(args)}")
        items: list[Any] = [None] * len(args)
        svals: list[Any] = []
        dev = self.device
        memo = True
        for i, p, storage, uniform, plain in self._kinds:
            a = args[i]
            if storage:
                if plain and type(a) is WgpuArray and a._et == p.element_type and a._bind_error is None \
                        and not a.allocation.freed and a.allocation.device is dev:
                    items[i] = a._res
                else:
                    items[i] = self._storage(p, a)
                    memo = memo and type(a) is WgpuArray
            elif uniform:
                items[i] = self._pool.region(self._upack[p.name].pack(a))
                memo = memo and type(a) is bytes
            else:
                svals.append(a)
                memo = memo and (type(a) is int or type(a) is float)
        block = None
        imm = None
        if self._spack is not None:
            data = self._spack.pack(svals)
            if self._scalar_mode == "uniform":
                block = self._pool.region(data)
            elif self._scalar_mode == "push_constants":
                imm = self.launcher.immediates(data)
        if self._single:
            g = self._g0
            res: list[Any] = []
            dyn: list[int] = []
            for source, k, dy in self._src0:
                if source == "s":
                    res.append(items[k])
                else:
                    reg: Any = items[k] if source == "u" else block
                    if dy:
                        res.append(reg[1])
                        dyn.append(reg[2])
                    else:
                        res.append(reg[0])
            key = (g.lid, *res)
            bg = self._bgcache.get(key)
            if bg is None:
                bg = self.launcher.create_group(g, key, res)
            if dyn:
                return (self.launcher.groups_cache.with_offsets(bg, tuple(dyn)),), imm, memo
            return (bg,), imm, memo
        storages = [items[i] for i, p, storage, _, _ in self._kinds if storage]
        uniforms = {p.name: items[i] for i, p, _, uniform, _ in self._kinds if uniform}
        return self.launcher.resolve(storages, uniforms, block), imm, memo

    def _make_resolve(self) -> Callable[[Sequence[Any]], Any]:
        """:meth:`_resolve` generated for this single-group entry: the same checks and results,
        unrolled (no loop over parameters or bindings); anything unusual takes the general
        helpers, which raise the named errors."""
        params = self.params
        n = len(params)
        ns: dict[str, Any] = {"WgpuArray": WgpuArray, "DeviceBuffer": DeviceBuffer, "device": self.device,
                              "check_storage": self._storage, "uniform_region": self._pool.region,
                              "bind_groups": self._bgcache, "create_group": self.launcher.create_group,
                              "with_offsets": self.launcher.groups_cache.with_offsets,
                              "resolve_general": type(self)._resolve.__get__(self), "group": self._g0}
        lines = ["def resolve(args):", f"    if len(args) != {n}:", "        return resolve_general(args)"]
        if n:
            lines.append(f"    {', '.join(f'a{i}' for i in range(n))}{',' if n == 1 else ''} = args")
        lines.append("    memo = True")
        scal: list[str] = []
        for i, p, storage, uniform, plain in self._kinds:
            ns[f"param{i}"] = p
            if storage:
                ns[f"element_type{i}"] = p.element_type
                # a DeviceBuffer binds the WgpuArray over its bytes (``_native``)
                lines.append(f"    w{i} = a{i}._native if type(a{i}) is DeviceBuffer else a{i}")
                if plain:
                    lines += [
                        f"    if type(w{i}) is WgpuArray and w{i}._et == element_type{i} and w{i}._bind_error is None "
                        f"and not w{i}.allocation.freed and w{i}.allocation.device is device:",
                        f"        r{i} = w{i}._res",
                        "    else:",
                        f"        r{i} = check_storage(param{i}, a{i})",
                        f"        memo = memo and type(w{i}) is WgpuArray"]
                else:
                    lines += [f"    r{i} = check_storage(param{i}, a{i})", f"    memo = memo and type(w{i}) is WgpuArray"]
            elif uniform:
                ns[f"pack_uniform{i}"] = self._upack[p.name].pack
                lines += [f"    r{i} = uniform_region(pack_uniform{i}(a{i}))", f"    memo = memo and type(a{i}) is bytes"]
            else:
                scal.append(f"a{i}")
                lines.append(f"    memo = memo and (type(a{i}) is int or type(a{i}) is float)")
        lines.append("    push_data = None")
        if self._spack is not None:
            ns["pack_scalars"] = self._spack.pack
            lines.append(f"    scalar_block = pack_scalars(({', '.join(scal)}{',' if len(scal) == 1 else ''}))")
            if self._scalar_mode == "uniform":
                lines.append("    rb = uniform_region(scalar_block)")
            elif self._scalar_mode == "push_constants":
                ns["push_constants"] = self.launcher.immediates
                lines.append("    push_data = push_constants(scalar_block)")
        res: list[str] = []
        dyn: list[str] = []
        for source, k, dy in self._src0:
            v = f"r{k}" if source != "b" else "rb"
            if source == "s":
                res.append(v)
            elif dy:
                res.append(f"{v}[1]")
                dyn.append(f"{v}[2]")
            else:
                res.append(f"{v}[0]")
        ns["layout_id"] = self._g0.lid
        lines += [f"    key = (layout_id, {', '.join(res)}{',' if len(res) == 1 else ''})" if res
                  else "    key = (layout_id,)",
                  "    bg = bind_groups.get(key)",
                  "    if bg is None:",
                  "        bg = create_group(group, key, key[1:])"]
        if dyn:
            lines.append(f"    bg = with_offsets(bg, ({', '.join(dyn)},))")
        lines.append("    return (bg,), push_data, memo")
        src = "\n".join(lines) + "\n"
        fn = define(src, f"webgpu resolve {self.name}", ns, "resolve")
        self.resolve_source = src
        return fn  # type: ignore[no-any-return]

    def check_args(self, args: Sequence[Any]) -> None:
        """Check ``args`` (and bind them: a bind group and uniform regions may be created)."""
        self.resolve(args)

    # -- launches ----------------------------------------------------------------------------------
    def _make_call(self) -> Callable[[Any, Sequence[Any]], None]:
        """The call, specialised for this entry: when every argument is the same object as in
        the previous call (or an equal int / non-zero float), the bind groups and push
        constants of that call are reused at the cost of a few identity checks; anything else
        takes :meth:`_call_slow`. Valid only while no buffer was freed (``memory.FREES``) and
        the uniform pool kept its regions (``generation``)."""
        n = len(self.params)
        names = [f"a{i}" for i in range(n)]
        conds = []
        # last_call: the previous memoable call's (*args, pool generation, FREES, bind groups, push data)
        for i, reader in enumerate(self._readers):
            conds.append(reader.same(i))
        unpack = (", ".join(names) + ("," if n == 1 else "")) if n else "_"
        src = (
            "def call(n, args):\n"
            f"    if type(n) is int and n > 0 and len(args) == {n}:\n"
            f"        {unpack} = args\n" if n else
            "def call(n, args):\n"
            "    if type(n) is int and n > 0 and len(args) == 0:\n"
        )
        same = conds + [f"last[{n}] == uniform_pool.generation", f"last[{n + 1}] == FREES[0]"]
        src += (
            "        last = last_call[0]\n"
            f"        if {' and '.join(same)}:\n"
            f"            gx = {blocks_source('n', self._bx)}\n"
            f"            if gx <= {self.max_groups}:\n"
            f"                record(pipeline, last[{n + 2}], gx, 1, 1, last[{n + 3}])\n"
            "                return\n"
            "    call_slow(n, args)\n"
        )
        ns: dict[str, Any] = {"last_call": self._memo, "uniform_pool": self._pool, "FREES": memory.FREES,
                              "record": self.stream.record, "pipeline": self.pipeline, "call_slow": self._call_slow}
        fn = define(src, f"webgpu call {self.name}", ns, "call")
        self.call_source = src
        return fn  # type: ignore[no-any-return]

    def call(self, n: Any, args: Sequence[Any]) -> None:
        """``k(n, *args)``: ``ceil(n / block.x)`` workgroups; ``n == 0`` checks only.
        (Replaced per instance by the specialised :meth:`_make_call`.)"""
        self._call_slow(n, args)

    def _call_slow(self, n: Any, args: Sequence[Any]) -> None:
        if type(n) is not int:
            n = _thread_count(self.name, n)
        if n <= 0:
            if n < 0:
                raise ValueError(f"{self.name}(): thread count must be >= 0, got {n}")
            self.resolve(args)
            return
        gx = blocks(n, self._bx)
        if gx > self.max_groups:
            raise group_limit_error(self.name, (gx, 1, 1), self.max_groups, self.device)
        gen, frees = self._pool.generation, memory.FREES[0]
        bgs, imm, memo = self._resolve(args)
        self.stream.record(self.pipeline, bgs, gx, 1, 1, imm)
        if memo:
            self._memo[0] = (*args, gen, frees, bgs, imm)

    def launch(self, grid: Any, block: Any, args: Sequence[Any], shared_mem: int = 0) -> None:
        """``k.launch(grid, block, *args)``: explicit workgroup counts. The workgroup size is
        compiled into the shader: ``block`` must be None or the entry's block size."""
        g = (grid, 1, 1) if type(grid) is int and grid > 0 else grid3(grid, "grid")
        if block is not None:
            b = (block, 1, 1) if type(block) is int else dim3(block, "block")
            if tuple(b) != self.block:
                raise ArgumentValueError(
                    f"{self.name}.launch(): block {tuple(b)} differs from the entry's {self.block}; on "
                    "WebGPU the workgroup size is compiled into the shader: pass block=None (or that size)")
        if shared_mem:
            raise ArgumentValueError(f"{self.name}.launch(): shared_mem={shared_mem}: WebGPU workgroup "
                                     "memory is declared in the shader; pass 0")
        if is_empty(g):  # no workgroups: the arguments checked, nothing recorded
            self.resolve(args)
            return
        self.launcher.check_groups(*g)
        bgs, imm = self.resolve(args)
        self.stream.record(self.pipeline, bgs, g[0], g[1], g[2], imm)

    def bind(self, args: Sequence[Any]) -> BoundDispatch:
        """``k.bind(*args)``: arguments checked and packed once; ``b(n)`` launches."""
        return BoundDispatch(self, tuple(args))

    def dispatch_indirect(self, count: Any, args: Sequence[Any], threads: bool = False) -> None:
        """``k.dispatch_indirect(count, *args, threads=)``: the workgroup count (``threads=True``:
        thread count, rounded up to whole groups) is the first uint32 of device array ``count``."""
        try:
            res, et, n, err, alloc = _storage_info(count)
        except (ArgumentError, ArgumentValueError) as exc:
            raise type(exc)(f"{self.name}.dispatch_indirect(): count {exc}") from None
        if et not in ("uint32", "int32"):
            raise ArgumentError(f"{self.name}.dispatch_indirect(): count must be a device array of "
                                f"uint32, got {et}")
        if n < 1:
            raise ArgumentValueError(f"{self.name}.dispatch_indirect(): count is empty; it must hold the count")
        if alloc.freed or alloc.device is not self.device:
            raise ArgumentValueError(f"{self.name}.dispatch_indirect(): count was freed or is on another device")
        cv = memory.View(alloc, res[2], 4)
        memory.check_storage(cv, f"{self.name}.dispatch_indirect(): count")
        bgs, imm = self.resolve(args)
        dispatch_indirect(self.launcher, cv, bool(threads), self._bx, bgs, imm)


def _scalar_types() -> dict[str, Any]:
    return SCALARS


def _thread_count(name: str, n: Any) -> int:
    try:
        return operator.index(n)
    except TypeError:
        raise ArgumentError(f"{name}(): the first argument is the thread count, an integer >= 0; "
                            f"got {n!r} ({type(n).__name__})") from None


class BoundDispatch:
    """A kernel with its arguments checked and bound once: ``b(n)`` records ``ceil(n / block.x)``
    workgroups at about the cost of a raw wgpu-py dispatch; ``b.launch(grid)`` takes explicit
    counts. Re-binds by itself when a buffer was freed or the uniform pool recycled."""

    __slots__ = ("plan", "args", "_state", "_pool", "_rec", "_pl", "_bx", "_max")

    def __init__(self, plan: KernelPlan, args: tuple[Any, ...]) -> None:
        self.plan = plan
        self.args = args
        self._pool = plan._pool
        self._rec = plan.stream.record
        self._pl = plan.pipeline
        self._bx = plan._bx
        self._max = plan.max_groups
        self._bind()

    def _bind(self) -> tuple[Any, ...]:
        gen, frees = self._pool.generation, memory.FREES[0]
        bgs, imm = self.plan.resolve(self.args)
        st = self._state = (gen, frees, bgs, imm)  # one tuple: threads see one consistent state
        return st

    @property
    def bgs(self) -> tuple[Bound, ...]:
        return self._state[2]

    @property
    def imm(self) -> Immediates | None:
        return self._state[3]

    def __call__(self, n: int) -> None:
        st = self._state
        if st[0] != self._pool.generation or st[1] != memory.FREES[0]:
            st = self._bind()
        gx = (n + self._bx - 1) // self._bx
        if gx > self._max or gx <= 0:
            if gx <= 0 and n == 0:
                return
            if gx > self._max:
                raise group_limit_error(self.plan.name, (gx, 1, 1), self._max, self.plan.device)
            raise ValueError(f"{self.plan.name}(): thread count must be >= 0, got {n}")
        self._rec(self._pl, st[2], gx, 1, 1, st[3])

    def launch(self, grid: Any) -> None:
        st = self._state
        if st[0] != self._pool.generation or st[1] != memory.FREES[0]:
            st = self._bind()
        g = grid3(grid, "grid")
        if is_empty(g):
            return
        self.plan.launcher.check_groups(*g)
        self._rec(self._pl, st[2], g[0], g[1], g[2], st[3])
