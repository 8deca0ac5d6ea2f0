"""The library's kernels, written as for Triton's JIT: one under @triton.heuristics, one taking a
tl.dtype and a string constexpr (with defaults), a pointer that may be None and a runtime bool."""

import triton
import triton.language as tl

from fakelib_triton.helpers import twice


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, twice(tl.load(x_ptr + offs)) * alpha)
    else:
        mask = offs < n
        tl.store(out_ptr + offs, twice(tl.load(x_ptr + offs, mask=mask)) * alpha, mask=mask)


@triton.jit
def cast_kernel(x_ptr, out_ptr, bias_ptr, n, clamp, OUT_DTYPE: tl.constexpr, MODE: tl.constexpr = "copy",
                BLOCK: tl.constexpr = 128):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if bias_ptr is not None:
        x += tl.load(bias_ptr + offs, mask=mask)
    if MODE == "neg":
        x = -x
    if clamp:
        x = tl.maximum(x, 0.0)
    tl.store(out_ptr + offs, x.to(OUT_DTYPE), mask=mask)


def scale(x, alpha):
    """The library's host code, as it calls its kernel (torch tensors)."""
    import torch

    out = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, 128),)](x, out, n, alpha, BLOCK=128)
    return out
