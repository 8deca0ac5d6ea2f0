# Kernels that use what sm_90 adds: a device-side tensor descriptor (TMA; Triton gives the kernel
# global scratch memory to build the descriptors in) and a program that is a cluster of two CTAs
# (num_ctas = 2: the crate's instance of the tutorials' vector add, kernels/triton/tutorials.py).
import triton
import triton.language as tl


@triton.jit
def desc_add_kernel(x_ptr, y_ptr, out_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # out = x + y for row-major M x N matrices, block by block through TMA descriptors built on the device
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    x = x_desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N])
    y = y_desc.load([pid_m * BLOCK_M, pid_n * BLOCK_N])
    out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], x + y)
