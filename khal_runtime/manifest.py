"""The manifest: what a shader package ships, shared by the build hook and the runtime.

One JSON file per package (``<package>/_khal/manifest.json``), validated by the
pydantic models below. The build side (``hatch_khal``) writes it; the runtime
(``khal_runtime``) reads it and trusts nothing it says until the artifacts are
checked against it. Nothing here executes code from the file: it is plain JSON.

Schema versions: ``SCHEMA_VERSION`` is bumped only for changes an older
runtime cannot read. New optional fields (e.g. the SPIR-V stage) are additive.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from khal_runtime.errors import ManifestError

__all__ = [
    "ABI_VERSION",
    "MANIFEST_DIR",
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "Artifact",
    "Crate",
    "Entry",
    "Manifest",
    "Param",
    "Prebuilt",
    "SourceFile",
    "SpirvStatus",
    "Toolchain",
    "load_manifest",
    "parse_manifest",
    "prebuilt_env_var",
    "symbol_for",
    "split_symbol",
]

SCHEMA_VERSION = 1
#: Version of the kernel ABI (how parameters are pushed); see DESIGN.md.
ABI_VERSION = 1
#: Directory inside the package that holds the manifest and the artifacts.
MANIFEST_DIR = "_khal"
MANIFEST_NAME = "manifest.json"

HASH_LEN = 16
_HASH_RE = re.compile(r"^[0-9a-f]{16}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SYMBOL_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*?)_khal_(?P<hash>[0-9a-f]{16})$")
_ARCH_RE = re.compile(r"^(sm|compute)_\d+[a-z]?$")


def prebuilt_env_var(crate: str) -> str:
    """``CUDA_OXIDE_SHADERS_PTX_<CRATE>``: khal-builder's name for a crate's prebuilt binary
    (upper-cased, ``-`` to ``_``). Shared by the build (which reads it) and the runtime
    (which names it in its hints)."""
    return "CUDA_OXIDE_SHADERS_PTX_" + crate.upper().replace("-", "_")


def symbol_for(entry: str, entry_hash: str) -> str:
    """The binary symbol of an entry: ``<entry>_khal_<hash>``."""
    return f"{entry}_khal_{entry_hash}"


def split_symbol(symbol: str) -> tuple[str, str] | None:
    """``saxpy_khal_0123...`` -> ``("saxpy", "0123...")``; None if not a khal symbol."""
    m = _SYMBOL_RE.match(symbol)
    return (m.group("name"), m.group("hash")) if m else None


class _Model(BaseModel):
    # Unknown fields are an error: a manifest we do not fully understand is not trusted.
    model_config = ConfigDict(extra="forbid", frozen=True)


ScalarType = Literal[
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "bool",
]


class Param(_Model):
    """One entry parameter, in declaration order."""

    name: str
    kind: Literal["storage", "uniform", "scalar"]
    #: Element type: a ScalarType name for numbers, else the C type name of a struct.
    element_type: str
    #: sizeof(element) in bytes, as the compiler computed it.
    element_size: int = Field(gt=0)
    #: alignof(element), as the compiler computed it.
    element_align: int = Field(default=1, gt=0)
    #: storage only: "slice" (any count), "array" (fixed ``length``) or "value" (one element).
    shape: Optional[Literal["slice", "array", "value"]] = None
    length: Optional[int] = Field(default=None, gt=0)
    #: storage only: whether the kernel may write it (declared without ``const``).
    writable: bool = False

    @field_validator("name")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not _IDENT_RE.match(v):
            raise ValueError(f"parameter name {v!r} is not a C identifier")
        return v

    @property
    def abi_slots(self) -> int:
        """How many kernel parameters this binding takes (storage: pointer + count)."""
        return 2 if self.kind == "storage" else 1


class Entry(_Model):
    name: str
    symbol: str
    hash: str
    block_size: tuple[int, int, int]
    params: tuple[Param, ...]
    #: Symbol of the persistent-grid (device-side count) variant, if generated.
    indirect_symbol: Optional[str] = None

    @field_validator("hash")
    @classmethod
    def _hash(cls, v: str) -> str:
        if not _HASH_RE.match(v):
            raise ValueError(f"entry hash {v!r} is not {HASH_LEN} lowercase hex digits")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _IDENT_RE.match(v):
            raise ValueError(f"entry name {v!r} is not a C identifier")
        return v

    @model_validator(mode="after")
    def _symbol_carries_hash(self) -> Entry:
        if self.symbol != symbol_for(self.name, self.hash):
            raise ValueError(
                f"entry {self.name!r}: symbol {self.symbol!r} does not end in its hash {self.hash!r}"
            )
        return self


class Artifact(_Model):
    kind: Literal["ptx", "cubin", "spirv"]
    #: "sm_90" for a cubin, "compute_75" for PTX, None for SPIR-V.
    arch: Optional[str] = None
    #: POSIX path relative to the package directory; confined to it.
    path: str
    sha256: str
    size: int = Field(ge=0)
    #: PTX ISA version (".version" of the PTX, or the one the cubin was made from).
    ptx_isa: Optional[str] = None

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not _SHA256_RE.match(v):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return v

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str | None) -> str | None:
        if v is not None and not _ARCH_RE.match(v):
            raise ValueError(f"arch {v!r} is not like 'sm_90' or 'compute_75'")
        return v

    @field_validator("path")
    @classmethod
    def _confined(cls, v: str) -> str:
        p = PurePosixPath(v)
        if not v or v.startswith("/") or "\\" in v or ":" in v or p.is_absolute():
            raise ValueError(f"artifact path {v!r} must be relative to the package")
        if any(part in ("..", ".", "") for part in v.split("/")):
            raise ValueError(f"artifact path {v!r} leaves the package or is not normalised")
        return v

    @property
    def sm(self) -> int | None:
        """Numeric arch (90 for sm_90 / compute_90)."""
        if self.arch is None:
            return None
        return int(re.sub(r"[^0-9]", "", self.arch.split("_", 1)[1]))


class SourceFile(_Model):
    path: str  # relative to the project root, POSIX
    sha256: str


class Prebuilt(_Model):
    """The crate's binary came from ``CUDA_OXIDE_SHADERS_PTX_<CRATE>``, not from NVRTC."""

    variable: str
    kind: Literal["ptx", "cubin"]
    file_name: str  # base name only: no build-machine paths in the manifest


class SpirvStatus(_Model):
    status: Literal["skipped", "not_configured", "built"]
    #: Why: e.g. "KHAL_SKIP_SPIRV is set".
    reason: str = ""


class Crate(_Model):
    name: str
    #: Package-relative directory holding this crate's artifacts.
    package_dir: str
    sources: tuple[SourceFile, ...]
    #: Hash over every source and local header of the crate (and defines, the ABI).
    content_hash: str
    artifacts: tuple[Artifact, ...]
    entries: tuple[Entry, ...]
    prebuilt: Optional[Prebuilt] = None
    spirv: SpirvStatus = SpirvStatus(status="not_configured")

    def artifact(self, kind: str, arch: str | None = None) -> Artifact | None:
        for a in self.artifacts:
            if a.kind == kind and (arch is None or a.arch == arch):
                return a
        return None

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise KeyError(name)


class Toolchain(_Model):
    nvrtc_version: Optional[str] = None
    hatch_khal_version: str
    abi_version: int = ABI_VERSION


class Editable(_Model):
    """Present only in editable installs: where to look for stale sources."""

    project_root: str  # absolute path of the project on the build machine


class Manifest(_Model):
    schema_version: int
    package: str
    toolchain: Toolchain
    crates: tuple[Crate, ...]
    editable: Optional[Editable] = None

    def crate(self, name: str) -> Crate:
        for c in self.crates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, fixed indent): byte-identical for equal manifests."""
        data = self.model_dump(mode="json", exclude_none=True)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def parse_manifest(text: str | bytes, source: str = "manifest") -> Manifest:
    """Parse and validate manifest JSON. Raises ManifestError with a reason."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{source}: not valid JSON ({exc}); rebuild the package") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestError(f"{source}: missing or non-integer 'schema_version'")
    if version > SCHEMA_VERSION:
        raise ManifestError(
            f"{source}: schema version {version} is newer than this runtime understands "
            f"({SCHEMA_VERSION}); upgrade hatch-khal (pip install -U hatch-khal)"
        )
    if version < 1:
        raise ManifestError(f"{source}: schema version {version} is not valid")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ManifestError(
            f"{source}: invalid manifest at {where or '<root>'}: {first['msg']} "
            f"({exc.error_count()} error(s)); rebuild the package"
        ) from None


def load_manifest(path: Path) -> Manifest:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: no khal manifest; was the package built with the hatch-khal hook?"
        ) from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest ({exc.strerror})") from None
    return parse_manifest(text, str(path))
