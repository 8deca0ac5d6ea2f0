"""Triton's tutorials 01-03 as torch functions: vector add, fused softmax and an fp16 matmul.

The host code is Triton's: each function launches its kernel as Triton code does,
``add_kernel[grid](x, y, output, n_elements, BLOCK_SIZE=1024)``, on the kernel objects of
:mod:`example_shader_pkg.triton_kernels.tutorials`. Importing ``example_shader_pkg`` makes those
objects the wheel's kernels (``khal_runtime.load``: the build recorded where each kernel is
importable), so a call launches the variant built for it, chosen as Triton's JIT specialises the
call, on torch's current stream: Triton's compiler is never called, and a process without Triton
runs it too (the kernels' module then imports khal's stand-in ``triton``). A call that no variant
of ``khal-triton.lock`` covers raises ``TritonMissingVariantError`` naming the lock line to add.

This module imports no ``triton`` itself: it is not the kernels' module, and without Triton installed
only that module (and its package) sees the stand-in. The grid's ceiling division is written out.
"""

from __future__ import annotations

from typing import Any

import torch

from .triton_kernels.tutorials import add_kernel, matmul_kernel, softmax_kernel

__all__ = ["add", "matmul", "softmax"]


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b  # triton.cdiv


def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` for tensors of float32 or float16 (any length; a tensor whose data is not 16-byte
    aligned or whose length is not a multiple of 16 runs the crate's conservative variant)."""
    if x.shape != y.shape:
        raise TypeError(f"add: two tensors of one shape, not {tuple(x.shape)} and {tuple(y.shape)}")
    x, y = x.contiguous(), y.contiguous()  # (the kernel reads them as flat arrays)
    output = torch.empty_like(x)
    n_elements = output.numel()

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (_cdiv(n_elements, meta["BLOCK_SIZE"]),)

    add_kernel[grid](x, y, output, n_elements, BLOCK_SIZE=1024)
    return output


def _programs(x: torch.Tensor, n_rows: int) -> int:
    """The persistent softmax's program count: up to 4 per SM, at most one per row (on a CPU
    tensor, which only Triton's interpreter runs, 4)."""
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    return max(1, min(n_rows, 4 * sms))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row-wise softmax of a 2-D float32 tensor of at most 1024 columns (one block of 1024 columns:
    every width takes the same variants; programs loop over the rows)."""
    n_rows, n_cols = x.shape
    if n_cols > 1024:
        raise TypeError(f"softmax: at most 1024 columns, not {n_cols}")
    if x.stride(1) != 1:
        x = x.contiguous()  # (the kernel reads each row as a contiguous run)
    y = torch.empty_like(x)
    softmax_kernel[(_programs(x, n_rows),)](y, x, x.stride(0), y.stride(0), n_rows, n_cols, BLOCK_SIZE=1024,
                                            num_warps=8)
    return y


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for 2-D float16 tensors (64x64 tiles, float32 accumulation, any strides)."""
    if a.shape[1] != b.shape[0]:
        raise TypeError(f"matmul: incompatible dimensions {tuple(a.shape)} and {tuple(b.shape)}")
    M, K = a.shape  # noqa: N806 - the tutorial's names
    N = b.shape[1]  # noqa: N806
    c = torch.empty((M, N), device=a.device, dtype=torch.float16)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (_cdiv(M, meta["BLOCK_SIZE_M"]) * _cdiv(N, meta["BLOCK_SIZE_N"]),)

    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                        c.stride(1), BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8,
                        num_warps=4, num_stages=3)
    return c
