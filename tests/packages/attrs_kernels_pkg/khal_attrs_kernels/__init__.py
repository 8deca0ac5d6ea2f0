"""Kernels of issue #26 (launch attributes, module globals); loaded by tests/gpu/test_attrs_kernels.py."""

import khal_runtime

kernels = khal_runtime.load(__name__)
