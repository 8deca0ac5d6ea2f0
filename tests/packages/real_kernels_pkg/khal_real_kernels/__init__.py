"""Kernels of issue #19, written as their authors wrote them; loaded by tests/runtime/cuda/test_real_kernels_gpu.py."""

import khal_runtime

kernels = khal_runtime.load(__name__)
