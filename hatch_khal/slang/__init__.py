"""The Slang stage of hatch-khal: ``.slang`` crates to khal-ABI CUDA (through NVRTC) and WebGPU.

The builder calls :func:`plan_slang_crate` and :func:`compile_slang_crate`
(:mod:`hatch_khal.slang.stage`). Attributes load lazily, so that the worker process
(:mod:`hatch_khal.slang.worker`) starts without importing the manifest models.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SlangOutput", "SlangPlan", "compile_slang_crate", "plan_slang_crate"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # lazy: the stage (pydantic models) only when its names are used
        from hatch_khal.slang import stage

        return getattr(stage, name)
    raise AttributeError(f"module 'hatch_khal.slang' has no attribute {name!r}")
