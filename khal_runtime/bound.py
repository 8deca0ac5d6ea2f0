"""``kernels.entry.bind(*args)``: a launch whose arguments are checked and packed once.

For a loop that launches one entry over and over with the same buffers (a solver
iteration, a per-frame update), the typed call still re-reads every argument on every
launch. A bound launch does that once: each call after it only computes the grid and
calls ``cuLaunchKernel`` with the prepacked argument block, about the cost of a raw launch.

The rule is the one of CUDA graphs: what was bound is used as it was at bind time. The
buffers (DeviceBuffer, PyTorch, CuPy, ...) must stay alive and in place (the bound launch
keeps a reference to each argument; do not resize or free them), and a uniform given as host
data is copied to device memory owned by the bound launch, so later changes to that struct
are not seen (bind again, or pass a device buffer holding the struct and update it there).
"""

from __future__ import annotations

import ctypes
from typing import Any

from khal_runtime.device import _tls, ensure_current
from khal_runtime.dtypes import bf16_bits
from khal_runtime.launching import diagnose_args, hooks, thread_count

__all__ = ["BoundLaunch"]


class BoundLaunch:
    """Created by :meth:`khal_runtime.kernels.Kernel.bind`; call it with a thread count."""

    __slots__ = ("kernel", "stream", "args", "_plan", "_keep", "_addr", "_launch", "_f", "_cu",
                 "_block", "_dev", "_owned")

    def __init__(self, kernel: Any, args: tuple[Any, ...], stream: Any) -> None:
        import numpy as np

        from khal_runtime import _cuda
        from khal_runtime.buffers import DeviceBuffer, extractor_for
        from khal_runtime.uniforms import uniform_converter

        diagnose_args(kernel.entry, args)  # every argument checked, named errors, nothing launched
        dev = stream.device_id
        plan = kernel.plan(dev)
        ensure_current(dev)
        values: list[Any] = []
        owned: list[DeviceBuffer] = []
        for p, a in zip(kernel.entry.params, args):
            if p.kind == "storage":
                ptr, count, _ = extractor_for(a)(a)
                values += [ptr, count]
            elif p.kind == "uniform":
                u = uniform_converter(a)(a)
                if isinstance(u, bytes):  # host struct: a device copy owned by this launch
                    dbuf = DeviceBuffer.from_numpy(np.frombuffer(u, dtype=np.uint8), stream)
                    owned.append(dbuf)
                    values.append(dbuf.ptr)
                else:
                    values.append(u[0])
            else:
                values.append(bf16_bits(a) if p.element_type == "bfloat16" else a)
        block = ctypes.create_string_buffer(max(plan.args_size, 8))
        plan.struct.pack_into(block, 0, *values)
        base = ctypes.addressof(block)
        ptrs = (ctypes.c_void_p * max(len(plan._offsets), 1))(*[base + off for off in plan._offsets])
        self.kernel, self.stream, self.args = kernel, stream, args
        self._plan, self._keep, self._owned = plan, (block, ptrs), owned
        self._addr = ctypes.addressof(ptrs) if plan._offsets else 0
        self._launch = _cuda.driver().cuLaunchKernel
        self._f, self._cu, self._dev = plan.function, stream._cu, dev
        self._block = plan.block

    def __call__(self, n: int) -> None:
        """Launch ``n`` threads (grid = ceil(n / block.x)) with the bound arguments."""
        bx, by, bz = self._block
        if type(n) is not int or n <= 0:
            n = thread_count(self.kernel.name, n)
            if n <= 0:
                if n < 0:
                    raise ValueError(f"{self.kernel.name}(): thread count must be >= 0, got {n}")
                return
        gx = (n + bx - 1) // bx
        try:
            cur = _tls.dev
        except AttributeError:
            cur = -1
        if cur != self._dev:
            ensure_current(self._dev)
        st = self.stream
        if hooks.active:
            plan = self._plan
            hooks.dispatch(plan, (gx, 1, 1), (bx, by, bz), 0, st, self.args,
                           lambda: plan._launch_failed(
                               self._launch(self._f, gx, 1, 1, bx, by, bz, 0, self._cu, self._addr, 0)[0],
                               gx, 1, 1, bx, by, bz))
            return
        r = self._launch(self._f, gx, 1, 1, bx, by, bz, 0, self._cu, self._addr, 0)
        if r[0]:
            self._plan._launch_failed(r[0], gx, 1, 1, bx, by, bz)

    def __repr__(self) -> str:
        return f"<BoundLaunch {self.kernel.name} on stream 0x{self.stream.handle:x}>"
