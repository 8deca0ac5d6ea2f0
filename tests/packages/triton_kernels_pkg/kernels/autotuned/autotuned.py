# Kernels written the way real-world Triton code is (issue #30): @triton.autotune over configs, and
# @triton.heuristics computing a constexpr from the arguments. Built by tests/build/test_triton_autotune.py
# and tests/runtime/cuda/test_triton_kernels_gpu.py (a crate of their own: not part of the package's crate).
import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": 128}, num_warps=4),
        triton.Config({"BLOCK_SIZE": 1024}, num_warps=8, num_stages=2),
    ],
    key=["n_elements"],
)
@triton.jit
def scaled_add(x_ptr, y_ptr, out_ptr, n_elements, alpha, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * alpha + y, mask=mask)


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": 256}), triton.Config({"BLOCK_SIZE": 512})],
    key=["n_elements"],
)
@triton.heuristics({"EVEN": lambda args: args["n_elements"] % args["BLOCK_SIZE"] == 0})
@triton.jit
def copy_even(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr, EVEN: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if EVEN:
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))
    else:
        mask = offsets < n_elements
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": 128}), triton.Config({"BLOCK_SIZE": 256})],
    key=["n_elements"],
    reset_to_zero=["out_ptr"],
)
@triton.jit
def accumulate(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.atomic_add(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


def _zero(nargs):
    pass


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": 128}, pre_hook=_zero)],
    key=["n_elements"],
)
@triton.jit
def hooked(x_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(x_ptr + offsets, 0.0, mask=offsets < n_elements)
