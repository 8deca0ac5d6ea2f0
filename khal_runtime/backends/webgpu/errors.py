"""Errors of the WebGPU backend, each a subclass of the runtime's own (so that ``except
KhalError`` / ``except ArgumentValueError`` catch them), named for what failed."""

from __future__ import annotations

from khal_runtime.errors import ArgumentValueError, KhalError

__all__ = ["GroupLimitError", "PipelineCreationError", "UnalignedViewError", "WebGpuError"]


class WebGpuError(KhalError, RuntimeError):
    """A WebGPU call failed (validation, out of memory, a lost device); the message names the
    entries or the operation involved."""


class PipelineCreationError(WebGpuError):
    """The shader module or compute pipeline of an entry could not be created."""


class GroupLimitError(ArgumentValueError):
    """A launch asks for more workgroups in one dimension than the device allows."""


class UnalignedViewError(ArgumentValueError):
    """A buffer slice cannot be bound: its offset is not a multiple of the device's
    ``min_storage_buffer_offset_alignment`` (or its size is not a multiple of 4 bytes)."""
