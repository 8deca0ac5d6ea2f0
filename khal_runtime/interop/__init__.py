"""Device arrays of other libraries: one record per array library, and the registry of them.

An :class:`ArrayType` (:mod:`.registry`) says, for one array library, how to read an object as
a storage argument (``extract``: device pointer, element count, dtype key), which device its
memory is on, whether a launch may reuse what it read from the same object (its memo
policy), what a launch must hold to keep the memory alive, and (for the built-in records) the
few lines the CUDA launch path inlines for it. The first time the runtime meets a type it
asks the probes in order; the answer is cached per type, so the hot path is one dict lookup.

Built in, one module each: :class:`khal_runtime.DeviceBuffer` (registered by
:mod:`khal_runtime.buffers`), PyTorch (:mod:`.torch`), CuPy (:mod:`.cupy`), anything with
``__cuda_array_interface__`` (:mod:`.cai`) and DLPack (:mod:`.dlpack`); host arrays are refused
with a hint (:mod:`.host`). Teach the runtime another library with :func:`register_array_type`
(README, "Other array libraries").
"""

from __future__ import annotations

from khal_runtime.interop import cai, cupy, dlpack, host, torch
from khal_runtime.interop.registry import (
    MEMO_ARRAY_TYPES,
    STABLE_ARRAY_TYPES,
    VERSIONED_ARRAY_TYPES,
    ArrayType,
    BadArgument,
    Extractor,
    add_probe,
    array_type,
    device_of,
    extract,
    extractor_for,
    held_memory,
    register_array_type,
    tensor_memo,
)

__all__ = [
    "MEMO_ARRAY_TYPES",
    "STABLE_ARRAY_TYPES",
    "VERSIONED_ARRAY_TYPES",
    "ArrayType",
    "BadArgument",
    "Extractor",
    "array_type",
    "device_of",
    "extract",
    "extractor_for",
    "held_memory",
    "register_array_type",
    "tensor_memo",
]

# the built-in libraries, in probe order (torch and CuPy are recognised by module name, never
# imported here)
for _probe in (torch.probe, cupy.probe, cai.probe, host.probe, dlpack.probe, host.probe_sequence):
    add_probe(_probe)
del _probe
