"""The generic half of a kernel's call: what a backend's call falls back to.

A kernel's call is the function its plan offers for its first device (``LaunchPlan.call``,
generated per plan state on CUDA), which the kernel takes up (``Kernel.adopt``). That function
handles the common launch itself and sends everything else here, by name (the backends import
this module; nothing is handed down to them): a first call, another device, a count that is not
a positive 1-D int, missing or extra arguments, an argument type the call's code was not
generated for (:class:`Restate`). :func:`slow_call` computes the grid
(:func:`khal_runtime.arguments.grid_for`), makes the plan, lets the kernel take up its call for
the arguments' types, then launches through that new call, or through ``plan.run`` (every
argument checked) when there is no new call; a count of 0 diagnoses the arguments only.

What it reads of a kernel is :class:`khal_runtime.backends.KernelHandle`, the kernel's public
contract with the layers below it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from khal_runtime.arguments import diagnose_args, grid_for, grid_for_threads, thread_count

if TYPE_CHECKING:
    from khal_runtime.backends import KernelHandle
    from khal_runtime.device import Stream

__all__ = ["Restate", "generic_call", "slow_call"]


class Restate(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a plan's call that met an argument type its code was not generated for (one to
    inline, or the plan learnt types since the call was generated): the call takes
    :func:`slow_call`, which reads the plan's call again. Never reaches the user."""


def generic_call(kernel: KernelHandle, n: Any, *args: Any, stream: Any = None) -> None:
    """A kernel's call before it has taken up a plan's (its first use)."""
    slow_call(kernel, n, args, kernel.resolve_stream(stream))


def slow_call(kernel: KernelHandle, n: Any, args: tuple[Any, ...], st: Stream) -> None:
    """``kernel(n, *args, stream=st)`` off its call's fast paths, with the stream resolved: any
    device, any thread count (and every call of a 2-D / 3-D entry)."""
    block = kernel.block_size
    if kernel.grid_dims == 1:
        if isinstance(n, (tuple, list)):  # a 2-D / 3-D count for a 1-D entry: say so
            grid_for_threads(kernel.name, n, block, 1)
        n = thread_count(kernel.name, n)
        plan = kernel.ready_plan(st.device_id)
        if n > 0:
            fn = kernel.adopt(plan, args)
            if fn is not None:
                fn(n, *args, stream=st)
                return
            bx, by, bz = block
            plan.run(grid_for(kernel.name, n, bx), 1, 1, bx, by, bz, kernel.dynamic_shared, st, args)
            return
        diagnose_args(plan.entry, args)
        return
    gx, gy, gz = grid_for_threads(kernel.name, n, block, kernel.grid_dims)
    plan = kernel.ready_plan(st.device_id)
    if gx and gy and gz:
        bx, by, bz = block
        plan.run(gx, gy, gz, bx, by, bz, kernel.dynamic_shared, st, args)
        return
    diagnose_args(plan.entry, args)
