"""Liger-Kernel's Triton kernels, precompiled: ``import liger_kernel_khal`` before (or after) importing
``liger_kernel`` and its ops launch these binaries instead of Triton's JIT."""

import khal_runtime

kernels = khal_runtime.load(__name__)
