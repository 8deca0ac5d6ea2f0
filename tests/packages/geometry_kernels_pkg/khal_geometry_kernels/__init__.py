"""Kernels of issue #24, written as their authors wrote them; loaded by tests/runtime/cuda/test_geometry_kernels_gpu.py."""

import khal_runtime

kernels = khal_runtime.load(__name__)
