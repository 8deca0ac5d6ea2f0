"""Kernels of issue #19, written as their authors wrote them; loaded by tests/gpu/test_real_kernels.py."""

import khal_runtime

kernels = khal_runtime.load(__name__)
