"""Slang's run-time part (:class:`~khal_runtime.languages.CrateLanguage`): a Slang crate launches as
CUDA C++ does, and ships WGSL / SPIR-V too unless its WebGPU stage was skipped at build time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from khal_runtime.languages import PlainLanguage

if TYPE_CHECKING:
    from khal_runtime.manifest import Crate

__all__ = ["SLANG", "SlangLanguage"]


class SlangLanguage(PlainLanguage):
    """Slang crates: CUDA kernels, and a WebGPU build beside them."""

    def webgpu_missing(self, crate: Crate) -> str | None:
        if crate.has_webgpu:
            return None
        return (f"it was built without its WebGPU stage ({crate.spirv.reason or crate.spirv.status}): "
                "rebuild without KHAL_SKIP_SPIRV")


SLANG = SlangLanguage("slang", "Slang")
