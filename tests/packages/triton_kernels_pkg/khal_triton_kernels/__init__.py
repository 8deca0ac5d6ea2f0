"""Triton tutorial kernels (issue #30), built by hatch-khal; loaded by tests/gpu/test_triton_kernels.py."""

import khal_runtime

kernels = khal_runtime.load(__name__)
