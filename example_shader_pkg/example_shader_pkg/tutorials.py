"""Triton's tutorial kernels (crate ``tutorials``, ``kernels/triton/tutorials.py``) as torch
functions: vector add, fused softmax and an fp16 matmul, compiled by Triton when the wheel was
built and launched here without Triton (``import triton`` is never run).

Each launch goes on torch's current stream of the tensors' device, so it is ordered with the
torch work around it. ``kernels.add_fp32`` and the others are the raw entries (``k[grid](...)``
as a Triton kernel is called); these helpers add the grid and the output tensor.
"""

from __future__ import annotations

from typing import Any

from ._khal import kernels

__all__ = ["add", "matmul", "softmax"]


def _stream(t: Any) -> Any:
    import torch

    from khal_runtime.device import as_stream

    return as_stream(torch.cuda.current_stream(t.device))


def add(x: Any, y: Any) -> Any:
    """``x + y`` for CUDA tensors of float32 or float16 (any length; a tensor whose data is not
    16-byte aligned or whose length is not a multiple of 16 runs the ``__base`` twin)."""
    import torch

    k = {torch.float32: kernels.add_fp32, torch.float16: kernels.add_fp16}.get(x.dtype)
    if k is None or y.dtype != x.dtype or y.shape != x.shape:
        raise TypeError(f"add: two tensors of one shape and of float32 or float16, not {x.dtype} {tuple(x.shape)} "
                        f"and {y.dtype} {tuple(y.shape)}")
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    n = out.numel()
    k[lambda meta: ((n + meta["BLOCK_SIZE"] - 1) // meta["BLOCK_SIZE"],)](x, y, out, n, stream=_stream(x))
    return out


def softmax(x: Any) -> Any:
    """Row-wise softmax of a 2-D float32 CUDA tensor with at most 1024 columns (one program per
    row, persistent over the rows: at most 4 programs per SM)."""
    import torch

    if x.dim() != 2 or x.dtype != torch.float32 or x.shape[1] > 1024:
        raise TypeError(f"softmax: a 2-D float32 tensor of at most 1024 columns, not {x.dtype} {tuple(x.shape)}")
    rows, cols = x.shape
    y = torch.empty_like(x)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    kernels.softmax_1024[(max(1, min(rows, 4 * sms)),)](y, x, x.stride(0), y.stride(0), rows, cols,
                                                       stream=_stream(x))
    return y


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` for 2-D float16 CUDA tensors (64x64 tiles; float32 accumulation). Row-major
    operands whose sizes are multiples of 16 run the specialised instance, others its twin."""
    import torch

    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != torch.float16 or b.dtype != a.dtype:
        raise TypeError(f"matmul: two float16 matrices (M, K) and (K, N), not {a.dtype} {tuple(a.shape)} and "
                        f"{b.dtype} {tuple(b.shape)}")
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=torch.float16)
    grid = (((m + 63) // 64) * ((n + 63) // 64),)
    kernels.matmul_fp16[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                              c.stride(0), c.stride(1), stream=_stream(a))
    return c
