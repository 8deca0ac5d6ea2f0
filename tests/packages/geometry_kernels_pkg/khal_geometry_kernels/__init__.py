"""Kernels of issue #24, written as their authors wrote them; loaded by tests/gpu/test_geometry_kernels.py."""

import khal_runtime

kernels = khal_runtime.load(__name__)
