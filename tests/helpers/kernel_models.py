"""A manifest built from the pydantic models alone (no compiler, no artifacts): every parameter
kind, an entry name two crates share, a Slang crate with a recorded struct layout, and parameter
names that are keywords elsewhere. For tests of what is derived from a manifest (torch operator
schemas, typed stubs); a KernelSet made from it loads nothing until a kernel is launched."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from khal_runtime import abi
from khal_runtime.kernels import KernelSet
from khal_runtime.manifest import (
    SCHEMA_VERSION,
    Crate,
    Entry,
    Manifest,
    Param,
    StructField,
    StructLayout,
    Toolchain,
    symbol_for,
)


def storage(name: str, et: str = "float32", size: int = 4, *, writable: bool = False,
            shape: str = "slice", length: int | None = None) -> Param:
    return Param(name=name, kind="storage", element_type=et, element_size=size,
                 element_align=min(size, 16), shape=shape, length=length, writable=writable)


def scalar(name: str, et: str) -> Param:
    size = abi.SCALARS[et].size
    return Param(name=name, kind="scalar", element_type=et, element_size=size, element_align=abi.SCALARS[et].align)


def uniform(name: str, et: str, size: int, layouts: Any = None) -> Param:
    return Param(name=name, kind="uniform", element_type=et, element_size=size, element_align=4, layouts=layouts)


#: the Slang example's ``Affine`` in its CUDA layout (48 bytes)
AFFINE_CUDA = StructLayout(size=48, fields=(
    StructField(name="scale", type="float32", offset=0, size=16, shape=(4,), strides=(4,)),
    StructField(name="shift", type="float32", offset=16, size=12, shape=(3,), strides=(4,)),
    StructField(name="bias", type="float32", offset=28, size=4),
    StructField(name="step", type="int32", offset=32, size=4),
    StructField(name="mask", type="uint32", offset=36, size=4),
    StructField(name="taps", type="float32", offset=40, size=8, shape=(2,), strides=(4,)),
))

ENTRIES: dict[str, list[tuple[str, tuple[int, int, int], tuple[Param, ...]]]] = {
    "core": [
        ("saxpy", (256, 1, 1), (storage("x"), storage("y", writable=True), uniform("params", "SaxpyParams", 4))),
        ("scale", (128, 1, 1), (storage("y", writable=True), scalar("s", "float32"))),
        ("scalars", (32, 1, 1), (storage("out", "uint64", 8, writable=True, shape="array", length=8),
                                 scalar("a", "int8"), scalar("b", "float16"), scalar("c", "int64"),
                                 scalar("d", "float32"), scalar("e", "uint16"), scalar("f", "bool"),
                                 scalar("g", "float64"), scalar("h", "bfloat16"), scalar("z", "complex64"))),
        ("integrate", (128, 1, 1), (storage("particles", "Particle", 32, writable=True),
                                    uniform("params", "SimParams", 16))),
        ("total", (256, 1, 1), (storage("x"), storage("out", writable=True, shape="value"))),
        ("odd", (64, 1, 1), (storage("in", writable=True), scalar("threads", "uint32"), scalar("def", "int32"))),
    ],
    "extra": [
        ("scale", (64, 1, 1), (storage("y", writable=True), scalar("s", "float32"))),
        ("fill", (64, 1, 1), (storage("out", "int32", 4, writable=True), scalar("value", "int32"))),
    ],
    "shaders": [
        ("affine", (64, 1, 1), (storage("x"), storage("y", writable=True), storage("k", "int32", 4, writable=True),
                                uniform("p", "Affine", 48, {"cuda": AFFINE_CUDA}), scalar("gain", "float32"),
                                scalar("base", "int32"), scalar("count", "uint32"))),
    ],
}


def _crate(name: str, build: str, entries: list[tuple[str, tuple[int, int, int], tuple[Param, ...]]]) -> Crate:
    content = hashlib.sha256(f"{name}:{build}".encode()).hexdigest()
    models = []
    for ename, block, params in entries:
        h = abi.entry_hash(content, abi.entry_signature(ename, block, params))
        models.append(Entry(name=ename, symbol=symbol_for(ename, h), hash=h, block_size=block, params=params,
                            indirect_symbol=abi.indirect_symbol_for(ename, h)))
    return Crate(name=name, language="slang" if name == "shaders" else "cuda", package_dir=f"_khal/{name}",
                 sources=(), content_hash=content, artifacts=(), entries=tuple(models))


def models_manifest(package: str = "khal_models_pkg", build: str = "v1",
                    entries: dict[str, list[tuple[str, tuple[int, int, int], tuple[Param, ...]]]] | None = None
                    ) -> Manifest:
    return Manifest(
        schema_version=SCHEMA_VERSION,
        package=package,
        toolchain=Toolchain(nvrtc_version="13.0", hatch_khal_version="0.0.0+models"),
        crates=tuple(_crate(c, build, es) for c, es in (entries or ENTRIES).items()),
    )


def models_kernels(package: str = "khal_models_pkg", build: str = "v1", directory: Path | None = None,
                   entries: dict[str, list[tuple[str, tuple[int, int, int], tuple[Param, ...]]]] | None = None
                   ) -> KernelSet:
    """A KernelSet of :func:`models_manifest` (nothing is loaded: launching would fail)."""
    return KernelSet(package, directory or Path("/nonexistent") / package, models_manifest(package, build, entries))
