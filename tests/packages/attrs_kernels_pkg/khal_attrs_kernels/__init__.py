"""Kernels of issue #26 (launch attributes, module globals); loaded by tests/runtime/cuda/test_attrs_kernels_gpu.py."""

import khal_runtime

kernels = khal_runtime.load(__name__)
