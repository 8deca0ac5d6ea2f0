"""``kernels.entry.bind(*args)``: a launch whose arguments are checked and packed once.

For a loop that launches one entry over and over with the same buffers (a solver
iteration, a per-frame update), the typed call still looks at every argument on every
launch. A bound launch does that once: each call after it only computes the grid and
calls ``cuLaunchKernel`` with the prepacked argument block, about the cost of a raw launch.

The rule is the one of CUDA graphs: what was bound is used as it was at bind time. The
buffers (DeviceBuffer, PyTorch, CuPy, ...) must stay alive and in place (the bound launch
keeps a reference to each argument, and to each torch tensor's storage, so ``t.data = ...``
after binding cannot free the memory it launches on: it keeps using that memory, and is not
told; do not resize them: a growing ``resize_`` reallocates the storage itself), and a
uniform given as host
data is copied to device memory owned by the bound launch, so later changes to that struct
are not seen (bind again, or pass a device buffer holding the struct and update it there).
A DeviceBuffer freed after binding is caught: any free re-checks the bound arguments
before the next launch.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable

from khal_runtime import abi, interop
from khal_runtime.arguments import diagnose_args, grid_for, grid_for_threads, struct_bytes, thread_count
from khal_runtime.backends import KernelHandle
from khal_runtime.backends.cuda.attributes import make_launch_ex
from khal_runtime.backends.cuda.driver import driver
from khal_runtime.backends.cuda.launch import LaunchPlan, launch_call
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.device import Stream, _tls, ensure_current
from khal_runtime.launch_hooks import hooks
from khal_runtime.memo import EPOCH

#: a remembered grid no call's argument is
NOMEMO = object()

__all__ = ["BoundLaunch"]


def _bind_array(p: Any, a: Any, stream: Any, values: list[Any], owned: list[Any]) -> None:
    ptr, count, _ = interop.extract(a)
    values += [ptr, count]
    held = interop.held_memory(a)  # a torch tensor's storage: the memory bound here
    if held is not None:
        owned.append(held)


def _bind_struct(p: Any, a: Any, stream: Any, values: list[Any], owned: list[Any]) -> None:
    import numpy as np  # lazy: a host uniform's device copy only

    u = struct_bytes(p.name, p, a)
    if isinstance(u, bytes):  # host struct: a device copy owned by this launch
        dbuf = DeviceBuffer.from_numpy(np.frombuffer(u, dtype=np.uint8), stream)
        owned.append(dbuf)
        values.append(dbuf.ptr)
    else:
        values.append(u[0])


def _bind_value(p: Any, a: Any, stream: Any, values: list[Any], owned: list[Any]) -> None:
    v = abi.scalar_value(p.element_type, a)
    values += list(v) if isinstance(v, tuple) else [v]


#: per reader, what binding an argument appends to the packed values and to what the launch owns
_BIND: abi.ReaderTable[Callable[[Any, Any, Any, list[Any], list[Any]], None]] = abi.ReaderTable(
    "khal_runtime.backends.cuda.bound", {"array": _bind_array, "struct": _bind_struct, "value": _bind_value})


class BoundLaunch(functools.partial):  # type: ignore[type-arg]
    """Created by :meth:`khal_runtime.kernels.Kernel.bind`; call it with a thread count.

    A ``functools.partial`` of a closure over the packed block, for the reason given on
    :class:`khal_runtime.kernels.Kernel`: CPython calls it through C-level vectorcall."""

    __slots__ = ("kernel", "stream", "arguments", "_plan", "_keep", "_owned")

    kernel: KernelHandle
    stream: Stream
    #: what was bound (``partial.args`` is the partial's own machinery)
    arguments: tuple[Any, ...]
    _plan: LaunchPlan
    _keep: Any
    _owned: list[Any]

    def __new__(cls, kernel: KernelHandle, plan: LaunchPlan, args: tuple[Any, ...], stream: Stream) -> BoundLaunch:
        dev = stream.device_id
        diagnose_args(kernel.entry, args, device=dev)  # every argument checked, named errors
        ensure_current(dev)
        values: list[Any] = []
        owned: list[Any] = []
        for p, a in zip(kernel.entry.params, args):
            _BIND.of(p.kind, f"{kernel.entry.name}.bind()")(p, a, stream, values, owned)
        block = ctypes.create_string_buffer(max(plan.args_size, 8))
        plan.struct.pack_into(block, 0, *values)
        base = ctypes.addressof(block)
        ptrs = (ctypes.c_void_p * max(len(plan._offsets), 1))(*[base + off for off in plan._offsets])
        addr = ctypes.addressof(ptrs) if plan._offsets else 0
        self = super().__new__(cls, _unbound)
        self.kernel, self.stream, self.arguments = kernel, stream, args
        self._plan, self._keep, self._owned = plan, (block, ptrs), owned
        functools.partial.__setstate__(self, (_make_call(kernel, plan, stream, args, addr), (), None, None))  # type: ignore[attr-defined]
        return self

    def __init__(self, kernel: Any, plan: LaunchPlan, args: tuple[Any, ...], stream: Any) -> None:  # set in __new__
        pass

    def __reduce__(self) -> Any:
        raise TypeError("a BoundLaunch cannot be pickled: it holds device pointers; bind again")

    def over_grid(self, grid_of: Callable[[Any], tuple[tuple[int, int, int], bool]],
                  recheck: Callable[[], Any] | None = None) -> Callable[[Any], None]:
        """This launch taken with a grid of blocks instead of a thread count (a Triton family's
        ``b(grid)``, a grid of programs): ``call(x)`` launches ``grid_of(x)``'s blocks with the
        packed block, at the cost of a thread count's call. ``grid_of(x)`` returns ``((gx, gy,
        gz), keep)``, checked (named errors); ``keep``: whether the same object ``x`` again (or an
        equal int) may reuse those blocks without calling it (False: a callable grid, evaluated
        on every call). ``recheck``: what re-checks the arguments as given (before they became
        the values packed) after a free; by default the packed values are re-checked. The caller
        keeps this object alive as long as the call: the call does not hold the packed block."""
        return _make_call(self.kernel, self._plan, self.stream, self.arguments, self._addr(), grid_of, recheck)

    def _addr(self) -> int:
        """The packed parameters' ``void*[]`` address (0 for an entry without parameters)."""
        return ctypes.addressof(self._keep[1]) if self._plan._offsets else 0

    def __repr__(self) -> str:
        return f"<BoundLaunch {self.kernel.name} on stream 0x{self.stream.handle:x}>"


def _unbound(n: int) -> None:  # pragma: no cover - replaced in __new__
    raise RuntimeError("BoundLaunch is not initialised")


def _make_call(kernel: Any, plan: Any, stream: Any, args: tuple[Any, ...], addr: int,
               grid_of: Callable[[Any], tuple[tuple[int, int, int], bool]] | None = None,
               recheck: Callable[[], Any] | None = None) -> Callable[[Any], None]:
    """``call(n)``: launch ``n`` threads (grid = ceil(n / block.x)) with the bound block; a
    2-D / 3-D entry takes ``(nx, ny[, nz])``. With ``grid_of`` (:meth:`BoundLaunch.over_grid`)
    ``n`` is what it turns into blocks."""
    drv = driver()
    launch, f, cu, dev = drv.cuLaunchKernel, plan.function, stream.native, stream.device_id
    fast, call_args = launch_call(drv, plan.fattrs)  # the entry's launch attributes, prebuilt
    shared, check_attrs = plan.shared, plan.check_attrs
    slow_launch = make_launch_ex(drv, plan.fattrs) if plan.fattrs.needs_ex else None  # (traced launches)
    bx, by, bz = plan.block
    dims = kernel.entry.grid_dims
    failed, name, E = plan.launch_failed, kernel.name, EPOCH
    # [epoch the arguments were last checked at, (n, launch_call's arguments for it, grid) of the
    # last call]; one tuple, so two threads never see one's n with the other's grid
    state: list[Any] = [E[0], (object(), (), (0, 1, 1))]

    def slow(n: Any) -> tuple[int, int, int] | None:
        if state[0] != E[0]:  # something was freed since the last check: re-check (named errors)
            ep = E[0]
            if recheck is not None:
                recheck()
            else:
                diagnose_args(kernel.entry, args, device=dev)
            state[0] = ep
        key = n
        if grid_of is not None:
            g, keep = grid_of(n)
            if not (g[0] and g[1] and g[2]):  # an empty grid: nothing launched
                return None
            if not keep:
                key = NOMEMO  # (no call's argument is it)
        elif dims == 1 and not isinstance(n, (tuple, list)):
            n = thread_count(name, n)
            if n == 0:
                return None
            g = (grid_for(name, n, bx), 1, 1)
        else:
            g = grid_for_threads(name, n, (bx, by, bz), dims)
            if not (g[0] and g[1] and g[2]):
                return None
        if check_attrs is not None:  # cooperative / clustered: the grid checked once per thread count
            check_attrs(*g, bx * by * bz, shared)
        prev = state[1]
        # another count with the same grid keeps the launch configuration (making one costs microseconds)
        state[1] = (key, prev[1] if prev[2] == g and prev[1] else call_args(f, g, (bx, by, bz), shared, cu, addr), g)
        return g

    def call(n: int) -> None:
        last = state[1]
        # the same count: the same object, or an equal int (a count that went through torch's
        # dispatcher, or was computed, is a new object each call)
        if (n is last[0] or type(n) is int and n == last[0]) and state[0] == E[0]:
            g = last[2]
        else:
            got = slow(n)
            if got is None:
                return
            g = got
            last = state[1]
        try:
            cur = _tls.dev
        except AttributeError:
            cur = -1
        if cur != dev:
            ensure_current(dev)
        if hooks.active and hooks.dispatch is not None:
            if slow_launch is not None:
                hooks.dispatch(plan, g, (bx, by, bz), shared, stream, args,
                               lambda: failed(slow_launch(f, *g, bx, by, bz, shared, cu, addr)[0], *g, bx, by, bz))
                return
            hooks.dispatch(plan, g, (bx, by, bz), shared, stream, args,
                           lambda: failed(launch(f, *g, bx, by, bz, shared, cu, addr, 0)[0], *g, bx, by, bz))
            return
        r = fast(*last[1])
        if r[0]:
            failed(r[0], *g, bx, by, bz)

    return call
