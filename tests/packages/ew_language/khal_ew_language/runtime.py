"""The run-time side of the "elementwise" language: its entries launch as CUDA kernels (the
default counterpart); it only names itself in messages."""

from __future__ import annotations

from khal_runtime.languages import PlainLanguage


class ElementwiseRuntime(PlainLanguage):
    name = "elementwise"
    title = "Elementwise"


RUNTIME = ElementwiseRuntime()
