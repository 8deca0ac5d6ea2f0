"""Host memory passed where device memory is needed: refused with a hint."""

from __future__ import annotations

from typing import Any, Hashable

from khal_runtime.errors import ArgumentError
from khal_runtime.interop.registry import ArrayType, BadArgument, Extractor, add_probe

__all__ = ["probe", "probe_sequence"]


def _rejector(what: str) -> Extractor:
    def reject(obj: Any) -> tuple[int, int, Hashable]:
        raise BadArgument(
            ArgumentError,
            f"is host memory ({what}); copy it to the device first, e.g. "
            "khal_runtime.DeviceBuffer.from_numpy(a)",
        )

    return reject


def probe(obj: Any) -> ArrayType | None:
    tp = type(obj)
    if hasattr(obj, "__array_interface__") or isinstance(obj, (bytes, bytearray, memoryview)):
        return ArrayType("host", _rejector(f"{tp.__module__}.{tp.__qualname__}"))
    return None


def probe_sequence(obj: Any) -> ArrayType | None:
    if isinstance(obj, (list, tuple)):
        return ArrayType("host", _rejector(type(obj).__name__))
    return None


# a NumPy array before DLPack (NumPy arrays have __dlpack__ too, on the host); lists and tuples
# last
add_probe(probe, order=40)
add_probe(probe_sequence, order=60)
