"""The run-time side of the "elementwise" language: its entries launch as CUDA kernels (the plain
language's behaviour); it names itself in messages (a crate's missing WebGPU build)."""

from __future__ import annotations

from khal_runtime.languages import PlainLanguage

RUNTIME = PlainLanguage("elementwise", "Elementwise")
