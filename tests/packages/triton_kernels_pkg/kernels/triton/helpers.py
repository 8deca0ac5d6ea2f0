# A @triton.jit helper in a module of its own: the entry hash of the kernels calling it covers it.
import triton
import triton.language as tl


@triton.jit
def masked_sum(x):
    return tl.sum(x, axis=0)
