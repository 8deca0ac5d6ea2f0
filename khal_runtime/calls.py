"""The generic half of a kernel's call: what a backend's call falls back to, and how the kernel
takes up the call its plan made.

A kernel's call is the function its plan offers for its first device (``LaunchPlan.call``,
generated per plan state on CUDA). That function handles the common launch itself and sends
everything else here, by name (the backends import this module; nothing is handed down to them):
a first call, another device, a count that is not a positive 1-D int, missing or extra
arguments, an argument type the call's code was not generated for (:class:`Restate`).
:func:`slow_call` computes the grid (:func:`khal_runtime.arguments.grid_for`), makes the plan,
lets it learn the arguments' types and reads its call into the kernel (:func:`adopt`), then
launches through that new call, or through ``plan.run`` (every argument checked) when there is
no new call; a count of 0 diagnoses the arguments only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from khal_runtime.arguments import diagnose_args, grid_for, grid_for_threads, thread_count
from khal_runtime.launch_hooks import hooks

if TYPE_CHECKING:
    from khal_runtime.device import Stream

__all__ = ["Restate", "adopt", "generic_call", "slow_call"]


class Restate(Exception):  # noqa: N818 - a signal, not an error
    """Raised by a plan's call that met an argument type its code was not generated for (one to
    inline, or the plan learnt types since the call was generated): the call takes
    :func:`slow_call`, which reads the plan's call again. Never reaches the user."""


def generic_call(kernel: Any, n: Any, *args: Any, stream: Any = None) -> None:
    """A kernel's call before it has taken up a plan's (its first use)."""
    slow_call(kernel, n, args, kernel._stream(stream))


def adopt(kernel: Any, plan: Any, args: tuple[Any, ...]) -> Callable[..., None] | None:
    """Make ``kernel``'s call the one ``plan`` offers now, after the plan learnt the types of
    ``args`` (so it is generated once for them): only for the plan of the first device the kernel
    ran on (other devices take :func:`slow_call`); the kernel is then watched by the launch hooks,
    which make it read its plan's call again when they come or go (``Kernel.regenerate_code``).
    Returns the call when it is new, None when there is none or the kernel has it already (a call
    that sent its launch here is never given it back)."""
    fast = kernel._fast
    if fast is None:
        with kernel._lock:
            if kernel._fast is None:
                kernel._fast = plan
                hooks.watch(kernel)
            fast = kernel._fast
    if fast is not plan:
        return None
    if args:
        plan.learn(args)
    fn: Callable[..., None] = plan.call
    if fn is kernel.func:
        return None
    kernel._set_call(fn)
    return fn


def slow_call(kernel: Any, n: Any, args: tuple[Any, ...], st: Stream) -> None:
    """``kernel(n, *args, stream=st)`` off its call's fast paths, with the stream resolved: any
    device, any thread count (and every call of a 2-D / 3-D entry)."""
    if kernel._dims == 1:
        if isinstance(n, (tuple, list)):  # a 2-D / 3-D count for a 1-D entry: say so
            grid_for_threads(kernel.name, n, (kernel._bx, kernel._by, kernel._bz), 1)
        n = thread_count(kernel.name, n)
        plan = kernel._ready(st.device_id)
        if n > 0:
            fn = adopt(kernel, plan, args)
            if fn is not None:
                fn(n, *args, stream=st)
                return
            bx = kernel._bx
            plan.run(grid_for(kernel.name, n, bx), 1, 1, bx, kernel._by, kernel._bz, kernel._shared, st, args)
            return
        diagnose_args(plan.entry, args)
        return
    gx, gy, gz = grid_for_threads(kernel.name, n, (kernel._bx, kernel._by, kernel._bz), kernel._dims)
    plan = kernel._ready(st.device_id)
    if gx and gy and gz:
        plan.run(gx, gy, gz, kernel._bx, kernel._by, kernel._bz, kernel._shared, st, args)
        return
    diagnose_args(plan.entry, args)
