"""Triton tutorial kernels (issue #30), built by hatch-khal; loaded by tests/runtime/cuda/test_triton_kernels_gpu.py."""

import khal_runtime

kernels = khal_runtime.load(__name__)
