"""Device arrays of other libraries: one record per array library, and the registry of them.

An :class:`ArrayType` (:mod:`.registry`) says, for one array library, how to read an object as
a storage argument (``extract``: device pointer, element count, dtype key), which device its
memory is on, whether a launch may reuse what it read from the same object (its memo
policy), what a launch must hold to keep the memory alive, and (for the built-in records) the
few lines the CUDA launch path inlines for it, how to read its stream objects and name its
dtype objects. The first time the runtime meets a type it asks the probes in order; the answer
is cached per type, so the hot path is one dict lookup.

Built in, one module each: :class:`khal_runtime.DeviceBuffer` (registered by
:mod:`khal_runtime.buffers`), PyTorch (:mod:`.torch`), CuPy (:mod:`.cupy`), anything with
``__cuda_array_interface__`` (:mod:`.cai`) and DLPack (:mod:`.dlpack`); host arrays are refused
with a hint (:mod:`.host`). Importing this package imports every public module in its folder,
and each registers itself (:func:`.registry.add_probe`), so a library is one module here. Teach
the runtime another library from outside with :func:`register_array_type`
(docs/guide/interop.md, "Another array library").
"""

from __future__ import annotations

import importlib
import os
from importlib.machinery import all_suffixes

from khal_runtime.dtypes import ReadOnly
from khal_runtime.interop.registry import (
    ADDRESS_SPACE,
    MEMO_ARRAY_TYPES,
    STABLE_ARRAY_TYPES,
    STREAM_READERS,
    UNVERSIONED,
    VERSIONED_ARRAY_TYPES,
    ArrayType,
    BadArgument,
    Extractor,
    array_type,
    device_of,
    extract,
    extractor_for,
    held_memory,
    register_array_type,
    stream_handle,
    tensor_memo,
)

__all__ = [
    "ADDRESS_SPACE",
    "MEMO_ARRAY_TYPES",
    "STABLE_ARRAY_TYPES",
    "STREAM_READERS",
    "UNVERSIONED",
    "VERSIONED_ARRAY_TYPES",
    "ArrayType",
    "BadArgument",
    "Extractor",
    "ReadOnly",
    "array_type",
    "device_of",
    "extract",
    "extractor_for",
    "held_memory",
    "register_array_type",
    "stream_handle",
    "tensor_memo",
]


def library_modules() -> list[str]:
    """The names of this package's public modules (every ``*.py`` here not starting with ``_``;
    the libraries and the registry), sorted."""
    suffixes = tuple(all_suffixes())
    names: set[str] = set()
    for folder in __path__:
        try:
            files = os.listdir(folder)
        except OSError:  # not a folder (a zip archive): ask pkgutil
            import pkgutil  # lazy: only for a runtime imported from an archive

            names.update(m.name for m in pkgutil.iter_modules([folder]))
            continue
        for f in files:
            if f.endswith(suffixes):
                names.add(f.split(".", 1)[0])
    return sorted(n for n in names if not n.startswith("_") and n.isidentifier())


# the built-in libraries: each module registers itself on import (torch and CuPy are recognised
# by module name, never imported here)
for _name in library_modules():
    importlib.import_module(f"{__name__}.{_name}")
del _name
