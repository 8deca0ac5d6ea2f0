"""The manifest: what a shader package ships, shared by the build hook and the runtime.

One JSON file per package (``<package>/_khal/manifest.json``), validated by the
pydantic models below. The build side (``hatch_khal``) writes it; the runtime
(``khal_runtime``) reads it and trusts nothing it says until the artifacts are
checked against it. Nothing here executes code from the file: it is plain JSON.
The ABI it describes (parameter kinds, scalar types, archs, symbols, entry hashes)
is :mod:`khal_runtime.abi`.

Schema versions: ``SCHEMA_VERSION`` is bumped for changes an older runtime cannot
read; older manifests keep loading. Version 2 added Slang crates (``language``), the
WebGPU artifacts (``wgsl`` / ``spirv``, one per entry), their bindings and the
per-target struct layouts, and entry hashes computable from the manifest alone
(:func:`khal_runtime.abi.entry_signature`). Version 3 added what CUDA C++ entries written as
their authors wrote them need: each parameter's type as spelled (``ctype``; the element type is
what the compiler made of it), template instantiations, 2-D / 3-D launch shapes
(``grid_dims``), blocks that are not fixed (``fixed_block``, ``launch_bounds``) and why an
entry has no indirect variant (``indirect_reason``). Version 4 added the launch facts of the
compiled kernel (``launch``: the grid axes it reads, whether its ids fold the compiled block, where
those facts come from), re-derived from the shipped PTX at load. Entries' launch attributes
(``attributes``), crates' module globals (``globals``) and the autotune facts of Triton entries
(``triton.config`` / ``autotune_key`` / ``choose``), their clusters and scratch memory
(``triton.num_ctas`` / ``global_scratch`` / ``profile_scratch``) are optional fields of version 4: a manifest
without them reads (and hashes) as before, and an older runtime refuses one with them (unknown field).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from khal_runtime import abi
from khal_runtime import launch_attributes as attrs
from khal_runtime.abi import ABI_VERSION, HASH_LEN, prebuilt_env_var, split_symbol, symbol_for
from khal_runtime.errors import ManifestError

__all__ = [
    "ABI_VERSION",
    "HASH_LEN",
    "MANIFEST_DIR",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "ADDED_IN",
    "FIRST_RUNTIME",
    "SCHEMA_VERSION",
    "Artifact",
    "Binding",
    "Crate",
    "Editable",
    "Entry",
    "GlobalVar",
    "LaunchAttributes",
    "LaunchFacts",
    "Manifest",
    "Param",
    "Prebuilt",
    "ScalarSlot",
    "SourceFile",
    "SpirvStatus",
    "StructField",
    "StructLayout",
    "Toolchain",
    "ConstValue",
    "ServedLibrary",
    "TritonCrate",
    "TritonDtype",
    "TritonFacts",
    "TritonParam",
    "TritonScratch",
    "WebGpuTarget",
    "load_manifest",
    "package_path",
    "parse_manifest",
    "prebuilt_env_var",
    "required_runtime",
    "runtime_requirement",
    "split_symbol",
    "symbol_for",
]

SCHEMA_VERSION = 4
#: The first khal-runtime release that reads each schema version: a package whose manifest has
#: schema ``n`` needs ``khal-runtime>=FIRST_RUNTIME[n]`` (the requirement the build hook asks a
#: shader package to list, :func:`runtime_requirement`). Add the release with each new schema.
FIRST_RUNTIME = {1: "0.1.0", 2: "0.1.0", 3: "0.1.0", 4: "0.1.0"}
#: Optional fields added to a schema after the release that first read it (``Model.field`` -> the
#: khal-runtime release that reads it): every runtime refuses a field it does not know (the models
#: forbid extra keys), so a manifest that writes one needs that release, whatever its schema
#: number (:func:`required_runtime`, the lower bound the build hook adds to a wheel's
#: requirements). A field added to the models goes here with the release that adds it
#: (tests/test_manifest_versions.py lists the fields 0.1.0 read and checks). docs/internals/manifest.md
#: has the rule.
ADDED_IN: dict[str, str] = {
    # 0.2.0: the Triton-as-written facts (#36)
    "Crate.triton": "0.2.0",
    "TritonFacts.params": "0.2.0", "TritonFacts.nones": "0.2.0", "TritonFacts.maxnreg": "0.2.0",
    "TritonFacts.heuristics": "0.2.0", "TritonFacts.module": "0.2.0", "TritonFacts.qualname": "0.2.0",
    "TritonFacts.recorded": "0.2.0",
    # 0.2.0: cubins split into companion distributions (#39)
    "Artifact.distribution": "0.2.0",
    # launch attributes added since 0.1.0, by the release in their rows
    **{f"LaunchAttributes.{r.name}": r.since for r in attrs.ATTRIBUTES if r.since is not None},
}
#: Directory inside the package that holds the manifest and the artifacts.
MANIFEST_DIR = "_khal"
MANIFEST_NAME = "manifest.json"
#: A manifest larger than this is refused unread (the example's is 60 KB).
MAX_MANIFEST_BYTES = 32 << 20
#: JSON nesting deeper than this is refused (the schema nests 8 deep).
_MAX_DEPTH = 64



def source_digest() -> str:
    """The sha256 naming the source these models are made from (``manifest_records.SOURCE_DIGEST``,
    which the digest the build writes beside a manifest names): this module and
    ``launch_attributes.py``, whose rows are :data:`LaunchAttributes`' fields."""
    h = hashlib.sha256()
    for source in (__file__, attrs.__file__):
        h.update(Path(source).read_bytes() + b"\0")
    return h.hexdigest()


_HEX = "0123456789abcdef"
_MAX_ELEMENT = 1 << 20  # bytes of one element / uniform struct
_MAX_LENGTH = 1 << 40


def _is_hex(v: str, n: int) -> bool:
    return len(v) == n and all(c in _HEX for c in v)


def _ident(v: str, what: str) -> str:
    if not (v and (v[0].isalpha() or v[0] == "_") and v.isascii()
            and all(c.isalnum() or c == "_" for c in v)):
        raise ValueError(f"{what} {v!r} is not a C identifier")
    return v


def runtime_requirement(schema: int = SCHEMA_VERSION) -> str:
    """The requirement a shader package whose manifest has ``schema`` lists in its dependencies."""
    return f"khal-runtime>={FIRST_RUNTIME[schema]}"


def _release(v: str) -> tuple[int, ...]:
    """``"0.2.0"`` -> ``(0, 2, 0)``: the release numbers this module's tables hold (and a builder's
    release, read by :data:`_RELEASE`), compared without the ``packaging`` library, which the
    runtime does not depend on."""
    nums = re.match(r"[0-9]+(\.[0-9]+)*", v)
    parts = tuple(int(x) for x in nums.group(0).split(".")) if nums else ()
    while parts and parts[-1] == 0:
        parts = parts[:-1]  # 0.2 == 0.2.0
    return parts


def required_runtime(manifest: Manifest) -> str:
    """The oldest khal-runtime release that reads ``manifest``: its schema's first runtime
    (:data:`FIRST_RUNTIME`), or the release of the newest optional field it writes
    (:data:`ADDED_IN`; a field is written unless None, as :meth:`Manifest.to_json` writes it)."""
    best = FIRST_RUNTIME[manifest.schema_version]

    def walk(value: Any) -> None:
        nonlocal best
        if isinstance(value, BaseModel):
            cls = type(value).__name__
            for name in type(value).model_fields:
                v = getattr(value, name)
                if v is None:
                    continue
                since = ADDED_IN.get(f"{cls}.{name}")
                if since is not None and _release(since) > _release(best):
                    best = since
                walk(v)
        elif isinstance(value, (tuple, list)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(manifest)
    return best


#: a release version as a requirement may name it (PEP 440, no local part); compiled on the error
#: path only (re caches it), not when the manifest module is imported
_RELEASE = r"[0-9]{1,9}(\.[0-9]{1,9}){0,5}((a|b|rc)[0-9]{1,9})?(\.post[0-9]{1,9})?(\.dev[0-9]{1,9})?"


def _builder_release(data: dict[str, Any]) -> str:
    """The release of hatch-khal that wrote ``data`` (its toolchain's ``hatch_khal_version``, read
    without trusting anything else in it), or "" when it does not say one."""
    toolchain = data.get("toolchain")
    built = toolchain.get("hatch_khal_version") if isinstance(toolchain, dict) else None
    release = built.split("+", 1)[0] if isinstance(built, str) else ""
    return release if re.fullmatch(_RELEASE, release) else ""


def _newer_builder(source: str, data: dict[str, Any], why: str) -> str | None:
    """A manifest this runtime cannot validate, written by a newer hatch-khal: what it has that
    this runtime does not know (``why``), and which runtime to install (hatch-khal X depends on
    khal-runtime X, which reads what X writes); None when the builder is not newer than this
    runtime (then the manifest is broken, and rebuilding is the fix)."""
    from khal_runtime.__about__ import __version__  # lazy: only on the error path

    release = _builder_release(data)
    if not release or _release(release) <= _release(__version__):
        return None
    return (f"{source}: the package was built by hatch-khal {release}, newer than this runtime (khal-runtime "
            f"{__version__}), and its manifest has what this runtime does not read ({why}): install "
            f"khal-runtime>={release} (pip install 'khal-runtime>={release}'); rebuilding the package does not "
            "help")


def _too_new(source: str, version: int, data: dict[str, Any]) -> str:
    """Why a manifest of a newer schema is refused, and which khal-runtime reads it: hatch-khal X
    depends on khal-runtime X, so the version that built the package (its toolchain's
    ``hatch_khal_version``, read without trusting anything else) reads what it wrote."""
    release = _builder_release(data)
    head = f"{source}: schema version {version} is newer than this runtime understands ({SCHEMA_VERSION})"
    if release:
        return (f"{head}: the package was built by hatch-khal {release}; install khal-runtime>={release} "
                f"(pip install 'khal-runtime>={release}')")
    return f"{head}; install a newer khal-runtime (pip install -U khal-runtime)"


def package_path(v: str) -> str:
    """A POSIX path relative to the package, normalised, confined to it (ValueError otherwise).

    The one lexical confinement check: the manifest's validators use it, and
    :func:`khal_runtime.verify.artifact_path` before it resolves the path (symlinks)."""
    # (a POSIX path is absolute exactly when it starts with "/")
    if not v or v.startswith("/") or "\\" in v or ":" in v:
        raise ValueError(f"path {v!r} must be relative to the package")
    if any(part in ("..", ".", "") for part in v.split("/")):
        raise ValueError(f"path {v!r} leaves the package or is not normalised")
    if any(ord(c) < 32 for c in v):
        raise ValueError(f"path {v!r} holds control characters")
    return v


class _Model(BaseModel):
    # Unknown fields are an error: a manifest we do not fully understand is not trusted.
    # defer_build: a model's validator is built on its first use, not when this module is
    # imported. Loading a package validates one Manifest, whose schema holds every nested model,
    # so one schema is built instead of one per class (16), and importing this module (the build
    # hook, the CLI, ``import khal_runtime.kernels``) builds none.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


# ---------------------------------------------------------------------------------------------
# struct layouts (uniforms of Slang crates, per target)
# ---------------------------------------------------------------------------------------------
class StructField(_Model):
    """One field of a struct in one target's layout."""

    name: str
    #: a scalar type of the ABI (``float32``), or ``struct`` (then ``fields`` holds it)
    type: str
    offset: int = Field(ge=0, lt=_MAX_ELEMENT)
    #: bytes the whole field takes (a vector or array: all its elements)
    size: int = Field(gt=0, le=_MAX_ELEMENT)
    #: vector / array extents, outermost first (``float4`` -> (4,), ``float3 v[2]`` -> (2, 3))
    shape: tuple[int, ...] = ()
    #: byte stride of each extent (std140 arrays step 16 bytes)
    strides: tuple[int, ...] = ()
    fields: Optional[tuple[StructField, ...]] = None

    @model_validator(mode="after")
    def _consistent(self) -> StructField:
        _ident(self.name, "field name")
        if len(self.shape) != len(self.strides) or any(n < 1 for n in self.shape) or \
                any(s < 0 for s in self.strides):
            raise ValueError(f"field {self.name!r}: shape {self.shape} and strides {self.strides} disagree")
        if (self.type == "struct") != (self.fields is not None):
            raise ValueError(f"field {self.name!r}: a struct field lists its fields, nothing else does")
        if self.type != "struct" and self.type not in abi.SCALARS:
            raise ValueError(f"field {self.name!r}: type {self.type!r} is not a scalar type of the ABI")
        return self


class StructLayout(_Model):
    """A struct as one target lays it out (``size`` includes its tail padding)."""

    size: int = Field(gt=0, le=_MAX_ELEMENT)
    fields: tuple[StructField, ...]


# ---------------------------------------------------------------------------------------------
# entries
# ---------------------------------------------------------------------------------------------
class Param(_Model):
    """One entry parameter, in declaration order."""

    name: str
    #: one of :data:`khal_runtime.abi.KINDS`
    kind: str
    #: Element type: a scalar type name (:data:`khal_runtime.abi.SCALARS`), else the name of a struct.
    element_type: str
    #: sizeof(element) in bytes, as the compiler computed it.
    element_size: int = Field(gt=0, le=_MAX_ELEMENT)
    #: alignof(element), as the compiler computed it.
    element_align: int = Field(default=1, gt=0, le=4096)
    #: storage only: "slice" (any count), "array" (fixed ``length``) or "value" (one element).
    shape: Optional[Literal["slice", "array", "value"]] = None
    length: Optional[int] = Field(default=None, gt=0, le=_MAX_LENGTH)
    #: storage only: whether the kernel may write it (declared without ``const``).
    writable: bool = False
    #: uniforms of Slang crates: the struct's layout per target ("cuda", "wgsl", "spirv")
    layouts: Optional[dict[Literal["cuda", "wgsl", "spirv"], StructLayout]] = None
    #: CUDA C++ entries: the element type as the marker spells it (``real_t``, ``T``,
    #: ``unsigned int``, ``cuda::std::complex<float>``); ``element_type`` is what the compiler
    #: made of it (``khal::type_id`` probes), and the entry hash covers this spelling instead
    ctype: Optional[str] = Field(default=None, min_length=1, max_length=512)

    @model_validator(mode="after")
    def _consistent(self) -> Param:
        _ident(self.name, "parameter name")
        k = abi.kind(self.kind)
        k.validate(self.element_type, self.element_size, self.shape, self.length, self.writable)
        if self.element_align & (self.element_align - 1):
            raise ValueError(f"parameter {self.name!r}: alignment {self.element_align} is not a power of two")
        if self.layouts is not None:
            if not k.strategy.struct_layouts:
                raise ValueError(f"parameter {self.name!r}: only uniforms carry struct layouts")
            cuda = self.layouts.get("cuda")
            if cuda is not None and cuda.size != self.element_size:
                raise ValueError(f"parameter {self.name!r}: its CUDA layout is {cuda.size} bytes, "
                                 f"the parameter {self.element_size}")
        return self

    @property
    def abi_kind(self) -> abi.ParamKind:
        return abi.KINDS[self.kind]

    @property
    def abi_slots(self) -> int:
        """How many kernel parameters this binding takes (storage: pointer + count)."""
        return len(self.slots)

    @property
    def slots(self) -> tuple[abi.Slot, ...]:
        return abi.KINDS[self.kind].slots(self.element_type, self.element_size, self.element_align)

    def describe(self, writable: bool = False) -> str:
        """``storage float32``, ``uniform Params (16 bytes)``, ... (with ``writable``: `` rw``
        after a writable storage)."""
        return abi.KINDS[self.kind].describe(self.element_type, self.element_size, self.shape,
                                            self.length, writable and self.writable)


class Binding(_Model):
    """Where one parameter (or, with ``param`` None, the block of loose scalars) is bound in a
    WebGPU target."""

    param: Optional[str] = None
    group: int = Field(ge=0, le=3)
    binding: int = Field(ge=0, le=1000)
    access: Literal["read", "read_write", "uniform"]


class ScalarSlot(_Model):
    """A loose scalar parameter's place in the scalar block of a WebGPU target."""

    param: str
    offset: int = Field(ge=0, lt=4096)
    size: int = Field(gt=0, le=16)


class WebGpuTarget(_Model):
    """One entry compiled for WebGPU in one shading language (its artifact: ``path``)."""

    target: Literal["wgsl", "spirv"]
    path: str
    #: the entry point's name in the shader: the entry's symbol (it carries the hash)
    entry_point: str
    bindings: tuple[Binding, ...]
    #: where loose scalar parameters go: a uniform block (WGSL: the ``Binding`` whose ``param``
    #: is None) or push constants (SPIR-V); None when the entry has none
    scalars: Optional[Literal["uniform", "push_constants"]] = None
    scalar_block_size: int = Field(default=0, ge=0, le=4096)
    scalar_slots: tuple[ScalarSlot, ...] = ()

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return package_path(v)

    @model_validator(mode="after")
    def _consistent(self) -> WebGpuTarget:
        where = {(b.group, b.binding) for b in self.bindings}
        if len(where) != len(self.bindings):
            raise ValueError(f"{self.target} target of {self.entry_point!r}: two bindings share a slot")
        block = [b for b in self.bindings if b.param is None]
        if (self.scalars == "uniform") != bool(block) or len(block) > 1:
            raise ValueError(f"{self.target} target of {self.entry_point!r}: the scalar block is "
                             f"{self.scalars!r} but {len(block)} binding(s) hold it")
        if bool(self.scalar_slots) != (self.scalars is not None):
            raise ValueError(f"{self.target} target of {self.entry_point!r}: scalar slots without a block")
        for s in self.scalar_slots:
            if s.offset + s.size > self.scalar_block_size:
                raise ValueError(f"{self.target} target of {self.entry_point!r}: scalar {s.param!r} "
                                 "lies outside its block")
        return self


class LaunchFacts(_Model):
    """What the compiled kernel does with the launch geometry (docs/reference/manifest.md).

    Not in the entry hash (known only after the compile that the hash names): re-derived from the
    shipped PTX at load and at verify (:func:`khal_runtime.verify.check_launch_facts`); without PTX
    they are the hashed facts of the marker (``scan``) or of Slang's ``numthreads`` (``reflection``)."""

    #: "ptx": the special registers the shipped PTX reads, through every function the kernel calls,
    #: inline asm included; "scan": the CUDA C++ source text (no PTX shipped); "reflection": Slang's
    #: reflection (no PTX shipped)
    source: Literal["ptx", "scan", "reflection"]
    #: grid axes the kernel tells apart (the highest axis whose block id it reads): an explicit
    #: launch may use that many (or the marker's ``grid_dims``, if more)
    grid_axes: int = Field(ge=1, le=3)
    #: the kernel's ids fold the compiled block size in (``KHAL_GLOBAL_ID`` and kin where it runs;
    #: a Slang entry's ``numthreads``): an explicit launch must use the compiled block. False: any
    #: block within its launch bounds
    block_fixed: bool
    #: the geometry special registers the kernel reads ("ctaid.y", "ntid.x", ...; PTX only)
    reads: tuple[str, ...] = ()

    @field_validator("reads")
    @classmethod
    def _reads(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for r in v:
            if not re.fullmatch(r"n?(?:ctaid|tid)\.[xyz]", r):
                raise ValueError(f"launch facts: {r!r} is not a geometry special register")
        return v


class _LaunchAttributes(_Model):
    """Launch attributes an entry needs, set once per function at load and prebuilt into its launch
    configuration: one field per row of :data:`khal_runtime.launch_attributes.ATTRIBUTES` (its type,
    default and description), hashed when not the default. :data:`LaunchAttributes` is this class
    with those fields; read a value through its row (``CLUSTER_DIMS.of(attributes)``)."""

    if TYPE_CHECKING:  # the fields are the rows', made at run time
        def __init__(self, **fields: Any) -> None: ...

    @model_validator(mode="after")
    def _rows(self) -> _LaunchAttributes:
        found = attrs.problems(self)
        if found:
            raise ValueError("; ".join(found))
        return self

    @property
    def cluster_size(self) -> int:
        c = attrs.CLUSTER_DIMS.of(self) or (1, 1, 1)
        return c[0] * c[1] * c[2]

    def describe(self) -> str:
        """``dynamic shared 65536 B, cooperative, cluster 2x1x1, PDL`` (empty: none)."""
        return attrs.describe(self)


if TYPE_CHECKING:
    LaunchAttributes = _LaunchAttributes
else:
    LaunchAttributes = create_model(
        "LaunchAttributes", __base__=_LaunchAttributes, __module__=__name__, __doc__=_LaunchAttributes.__doc__,
        **{r.name: (r.annotation, Field(default=r.default, description=r.doc)) for r in attrs.ATTRIBUTES})


#: TritonFacts' optional fields (autotuned entries; clusters and scratch memory), hashed only when set
_TRITON_OPTIONAL_FIELDS = ("config", "autotune_key", "choose", "num_ctas", "global_scratch", "profile_scratch",
                           "params", "nones", "maxnreg", "heuristics", "module", "qualname")


class TritonDtype(_Model):
    """A ``tl.dtype`` given as a constexpr (``X_dtype=tl.float32``), by Triton's name (``tl.float32.name``:
    ``"fp32"``; ``"bf16"``, ``"fp8e4nv"``, ``"int8"``, ...)."""

    dtype: str = Field(min_length=1, max_length=32)


#: a constexpr's value as a Triton kernel takes it (notes/triton-jit.md, "Spellings"): an int, float,
#: bool, string, a ``tl.dtype``, or None
ConstValue = Union[bool, int, float, str, TritonDtype, None]


class TritonParam(_Model):
    """One parameter of a ``@triton.jit`` kernel as Triton's JIT sees it (``JITFunction.params``)."""

    name: str
    #: the kernel's annotation says constexpr (``KernelParam.is_constexpr``)
    constexpr: bool = False
    #: its default (a ConstValue), when ``has_default``
    default: ConstValue = None
    has_default: bool = False
    #: ``@triton.jit(do_not_specialize=...)``: no divisibility / ``== 1`` specialisation
    do_not_specialize: bool = False
    #: ``do_not_specialize_on_alignment``: no divisibility / alignment specialisation (``== 1`` kept)
    do_not_specialize_on_alignment: bool = False
    #: the type its annotation forces (``KernelParam.annotation_type``: ``"i64"``, ``"*fp16"``), or ""
    annotation: str = ""


class TritonScratch(_Model):
    """Scratch memory a Triton kernel needs per program (``metadata.global_scratch_size`` /
    ``_align``, or ``profile_scratch_*``; the largest over the crate's targets): the launch passes a
    pointer to ``programs x num_ctas x size`` bytes aligned to ``align``."""

    size: int = Field(ge=1, le=1 << 30)
    align: int = Field(default=1, ge=1, le=256)

    @field_validator("align")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"scratch alignment {v} is not a power of two")
        return v


class TritonFacts(_Model):
    """A Triton entry: one compiled instance of a ``@triton.jit`` kernel (docs/guide/triton.md).

    Every field is inside the entry hash (:func:`abi.entry_signature`), ``shared`` included: the
    build names the kernel after its compiles, so the hash covers what they found."""

    #: the ``@triton.jit`` function, as the crate's sources name it
    kernel: str
    #: the entry the launcher is called by: the as-written instance's name (its ``__base`` twin
    #: carries the same family)
    family: str
    #: the conservative twin of ``family`` (no alignment / divisibility assumptions)
    base: bool = False
    num_warps: int = Field(ge=1, le=32)
    num_stages: int = Field(ge=1, le=32)
    #: dynamic shared memory per block in bytes (``metadata.shared``, the largest over the crate's
    #: targets): passed at every launch; above 48 KB the entry's ``attributes.max_dynamic_shared``
    #: is this too (the loader opts the function in once)
    shared: int = Field(ge=0, le=1 << 24)
    #: the runtime arguments (what a call passes), in order, and their Triton types (``*fp32``, ``i32``)
    names: tuple[str, ...]
    types: tuple[str, ...]
    #: arguments the binary assumes 16-byte aligned (pointers) or divisible by 16 (integers)
    divisible: tuple[str, ...] = ()
    #: arguments the binary assumes equal to 1: compiled in, so not among its ``params``
    ones: tuple[str, ...] = ()
    #: the constexprs the variant was compiled with (ints, floats, bools, strings, dtypes, None)
    constexprs: dict[str, ConstValue] = Field(default_factory=dict)
    #: Triton's ``JITFunction.cache_key`` (the kernel and every @triton.jit function it calls)
    cache_key: str
    triton_version: str
    #: an instance built with ``autotune = true``: the index of the ``triton.Config`` of the kernel's
    #: ``@triton.autotune`` this entry was compiled with (its kwargs are among ``constexprs``); the
    #: family's entries of every config are timed on first use per key, or chosen by ``choose``
    config: Optional[int] = Field(default=None, ge=0)
    #: the autotuner's ``key``: the arguments whose values select a config (one choice per their values)
    autotune_key: tuple[str, ...] = ()
    #: the author's rule (the instance's option ``choose``): the config to launch, no timing
    choose: Optional[int] = Field(default=None, ge=0)
    #: CTAs per program (the instance's ``num_ctas``), above 1: each program is a thread-block
    #: cluster of ``num_ctas`` blocks along x (``attributes.cluster_dims``, compiled in as
    #: ``.reqnctapercluster``); a launch of ``gx`` programs launches ``gx * num_ctas`` blocks.
    #: None: 1
    num_ctas: Optional[int] = Field(default=None, ge=2, le=16)
    #: the global scratch memory the kernel needs (None: none; its parameter is passed null)
    global_scratch: Optional[TritonScratch] = None
    #: the profile scratch memory the kernel needs (Triton's instrumentation; None: none)
    profile_scratch: Optional[TritonScratch] = None
    #: the pointer arguments the kernel may write, as the build proved from Triton's IR
    #: (``hatch_khal.triton.effects``); the others it only reads. None (a manifest built before
    #: the field, or an IR the analysis could not read): every pointer may be written
    written: Optional[tuple[str, ...]] = None
    #: the kernel's whole signature (every variant of one kernel the same; () in manifests before it)
    params: tuple[TritonParam, ...] = ()
    #: arguments passed None: compiled as constexpr None (Triton's JIT), not parameters of the binary
    nones: tuple[str, ...] = ()
    #: Triton's ``maxnreg`` option (None: not set)
    maxnreg: Optional[int] = Field(default=None, ge=1, le=255)
    #: the constexprs the kernel's ``@triton.heuristics`` compute from the arguments, outermost first
    heuristics: tuple[str, ...] = ()
    #: where the kernel is importable at run time (a module of the wheel's package, or of the library a
    #: companion crate serves) and its ``__qualname__`` there; None: not importable at run time
    module: Optional[str] = None
    qualname: Optional[str] = None
    #: the variant came from the lock file (``python -m hatch_khal triton record``)
    recorded: bool = False

    @property
    def ctas(self) -> int:
        """CTAs (blocks) per program."""
        return self.num_ctas or 1

    def record(self) -> dict[str, Any]:
        """What the entry hash covers: every field; the optional ones only when set, so that an
        entry built before they existed hashes as it did."""
        out = self.model_dump(mode="json")
        for name in _TRITON_OPTIONAL_FIELDS:
            if out[name] in (None, []):
                del out[name]
        if out["written"] is None:  # () (writes none) is hashed
            del out["written"]
        if not out["recorded"]:
            del out["recorded"]
        return out

    def may_write(self, name: str) -> bool:
        """Whether the kernel may write through pointer argument ``name`` (True unless proven not)."""
        return self.written is None or name in self.written

    @model_validator(mode="after")
    def _consistent(self) -> TritonFacts:
        if len(self.names) != len(self.types) or not set(self.divisible) | set(self.ones) <= set(self.names):
            raise ValueError(f"Triton kernel {self.kernel!r}: its argument names, types and assumptions disagree")
        if self.written is not None and not set(self.written) <= {
                n for n, t in zip(self.names, self.types) if t.startswith("*")}:
            raise ValueError(f"Triton kernel {self.kernel!r}: 'written' names {list(self.written)}, not all of "
                             "them pointer arguments")
        if self.config is None and (self.autotune_key or self.choose is not None):
            raise ValueError(f"Triton kernel {self.kernel!r}: an autotune key or rule without a config")
        return self


class Entry(_Model):
    name: str
    symbol: str
    hash: str
    block_size: tuple[int, int, int]
    params: tuple[Param, ...] = Field(min_length=1)
    #: Symbol of the persistent-grid (device-side count) variant, if generated.
    indirect_symbol: Optional[str] = None
    #: how many grid dimensions the entry's thread ids honour: 1 (x only: an explicit launch
    #: with a y or z grid is refused) up to 3; also the dimensionality of the typed call's
    #: thread count (``k(n)``, ``k((nx, ny))``, ``k((nx, ny, nz))``)
    grid_dims: int = Field(default=1, ge=1, le=3)
    #: True: the entry's ids assume ``block_size`` (an explicit launch must use it); False: any
    #: block of at most ``launch_bounds`` threads (1024 when None), ``block_size`` being the
    #: typed call's default
    fixed_block: bool = True
    #: ``__launch_bounds__`` of a block that is not fixed (None: none compiled in)
    launch_bounds: Optional[int] = Field(default=None, ge=1, le=1024)
    #: why the entry has no indirect variant (``indirect_symbol`` is None), in words
    indirect_reason: Optional[str] = Field(default=None, max_length=2000)
    #: an instantiation of a templated entry: the template's name and its arguments as spelled
    template: Optional[str] = None
    template_args: Optional[tuple[str, ...]] = None
    #: Slang entries: the WGSL / SPIR-V targets (absent with KHAL_SKIP_SPIRV, and for CUDA C++)
    webgpu: Optional[tuple[WebGpuTarget, ...]] = None
    #: what the compiled kernel does with the launch geometry (None: a manifest older than
    #: schema 4, whose launches follow ``grid_dims`` / ``fixed_block``)
    launch: Optional[LaunchFacts] = None
    #: launch attributes the entry needs (None: none; hashed, :func:`abi.entry_signature`; the fields
    #: are the rows of :mod:`khal_runtime.launch_attributes`)
    attributes: Optional[LaunchAttributes] = None
    #: Triton entries: the instance (None for CUDA C++ and Slang)
    triton: Optional[TritonFacts] = None

    @field_validator("hash")
    @classmethod
    def _hash(cls, v: str) -> str:
        if not _is_hex(v, HASH_LEN):
            raise ValueError(f"entry hash {v!r} is not {HASH_LEN} lowercase hex digits")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ident(v, "entry name")

    @field_validator("block_size")
    @classmethod
    def _block(cls, v: tuple[int, int, int]) -> tuple[int, int, int]:
        if any(d < 1 for d in v) or v[0] * v[1] * v[2] > abi.MAX_BLOCK_THREADS:
            raise ValueError(f"block size {v} must be positive with at most "
                             f"{abi.MAX_BLOCK_THREADS} threads in all")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Entry:
        if self.symbol != symbol_for(self.name, self.hash):
            raise ValueError(
                f"entry {self.name!r}: symbol {self.symbol!r} does not end in its hash {self.hash!r}"
            )
        if self.indirect_symbol is not None and self.indirect_symbol != abi.indirect_symbol_for(self.name, self.hash):
            raise ValueError(f"entry {self.name!r}: indirect symbol {self.indirect_symbol!r} is not "
                             f"{abi.indirect_symbol_for(self.name, self.hash)!r}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"entry {self.name!r}: two parameters share a name")
        for t in self.webgpu or ():
            if t.entry_point != self.symbol:
                raise ValueError(f"entry {self.name!r}: its {t.target} entry point {t.entry_point!r} "
                                 f"is not its symbol {self.symbol!r}")
            unknown = {b.param for b in t.bindings if b.param is not None} - set(names)
            unknown |= {s.param for s in t.scalar_slots} - set(names)
            if unknown:
                raise ValueError(f"entry {self.name!r}: its {t.target} target binds unknown "
                                 f"parameter(s) {sorted(unknown)}")
        if self.webgpu and len({t.target for t in self.webgpu}) != len(self.webgpu):
            raise ValueError(f"entry {self.name!r}: a WebGPU target is listed twice")
        a = self.attributes
        tf = self.triton
        if tf is not None and tf.shared > abi.DEFAULT_DYNAMIC_SHARED and attrs.MAX_DYNAMIC_SHARED.of(a) != tf.shared:
            raise ValueError(f"entry {self.name!r}: a Triton instance with {tf.shared} bytes of dynamic shared memory "
                             "records them as its attributes' max_dynamic_shared (opted in at load)")
        if tf is not None and attrs.CLUSTER_DIMS.of(a) != ((tf.num_ctas, 1, 1) if tf.num_ctas else None):
            raise ValueError(f"entry {self.name!r}: a Triton instance of {tf.ctas} CTA(s) per program records "
                             f"{'cluster dims (' + str(tf.num_ctas) + ', 1, 1)' if tf.num_ctas else 'no cluster dims'} "
                             "as its attributes' cluster_dims")
        blocker = attrs.indirect_blocker(a)
        if blocker is not None and self.indirect_symbol is not None:
            raise ValueError(f"entry {self.name!r}: it is {blocker}, and such an entry has no indirect variant")
        if self.fixed_block and self.launch_bounds is not None:
            raise ValueError(f"entry {self.name!r}: launch bounds are for blocks that are not fixed")
        threads = self.block_size[0] * self.block_size[1] * self.block_size[2]
        if not self.fixed_block and threads > (self.launch_bounds or abi.MAX_BLOCK_THREADS):
            raise ValueError(f"entry {self.name!r}: its block {self.block_size} has more threads than its "
                             f"launch bounds {self.launch_bounds}")
        if self.indirect_reason is not None and self.indirect_symbol is not None:
            raise ValueError(f"entry {self.name!r}: has an indirect variant and a reason it has none")
        if (self.template is None) != (self.template_args is None):
            raise ValueError(f"entry {self.name!r}: a template instantiation names its template and arguments")
        if self.template is not None:
            _ident(self.template, "template name")
        f = self.launch
        if f is not None:
            if f.block_fixed and not self.fixed_block:
                raise ValueError(f"entry {self.name!r}: its launch facts fix a block its marker does not")
            if f.source != "ptx" and (f.grid_axes != self.grid_dims or f.block_fixed != self.fixed_block or f.reads):
                raise ValueError(f"entry {self.name!r}: launch facts from {f.source} must be the hashed ones "
                                 f"(grid_dims {self.grid_dims}, fixed_block {self.fixed_block}, no reads)")
        return self

    @property
    def launch_dims(self) -> int:
        """Grid dimensions an explicit launch may use: the marker's, or more where the compiled
        kernel reads a y / z block id."""
        f = self.launch
        return self.grid_dims if f is None else max(self.grid_dims, f.grid_axes)

    @property
    def launch_block_fixed(self) -> bool:
        """Whether an explicit launch must use the compiled block (its ids fold it in)."""
        f = self.launch
        return self.fixed_block and (f is None or f.block_fixed)

    @property
    def dynamic_shared(self) -> int:
        """The dynamic shared memory every launch of the entry passes unless told otherwise: what
        ``KHAL_SHARED_MEM`` declares, or what Triton's compile needed (below 48 KB no attribute
        records it), else 0."""
        declared = int(attrs.MAX_DYNAMIC_SHARED.of(self.attributes) or 0)
        return max(declared, int(self.triton.shared)) if self.triton is not None else declared

    def signature(self, layouts: bool = True) -> dict[str, Any]:
        """What the entry hash covers besides the crate content (:func:`abi.entry_signature`;
        ``layouts=False``: without the uniforms' CUDA layouts, as builds before they were hashed)."""
        return abi.entry_signature(self.name, self.block_size, self.params, grid_dims=self.grid_dims,
                                   fixed_block=self.fixed_block, launch_bounds=self.launch_bounds,
                                   template=self.template, template_args=self.template_args or (),
                                   layouts=layouts, attributes=self.attributes,
                                   triton=None if self.triton is None else self.triton.record())

    @property
    def max_block_threads(self) -> int:
        """Threads a block of this entry may have: its block size's when fixed, else its bounds."""
        if self.fixed_block:
            return self.block_size[0] * self.block_size[1] * self.block_size[2]
        return self.launch_bounds or abi.MAX_BLOCK_THREADS

    def target(self, name: str) -> WebGpuTarget | None:
        for t in self.webgpu or ():
            if t.target == name:
                return t
        return None


class Artifact(_Model):
    kind: Literal["ptx", "cubin", "wgsl", "spirv"]
    #: "sm_90" for a cubin, "compute_75" for PTX, None for WGSL / SPIR-V.
    arch: Optional[str] = None
    #: WGSL / SPIR-V: the entry this artifact holds (one entry point each).
    entry: Optional[str] = None
    #: POSIX path relative to the package directory; confined to it.
    path: str
    sha256: str
    size: int = Field(ge=0, le=1 << 34)
    #: PTX ISA version (".version" of the PTX, or the one the cubin was made from).
    ptx_isa: Optional[str] = None
    #: the distribution that ships this artifact when the package's own wheel does not: a per-arch
    #: companion (``mypkg-kernels-sm90``, ``python -m hatch_khal split``), found at run time through
    #: its entry point; absent (None) for the package's own files
    distribution: Optional[str] = None

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str) -> str:
        if not _is_hex(v, 64):
            raise ValueError("sha256 must be 64 lowercase hex digits")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return package_path(v)

    @field_validator("distribution")
    @classmethod
    def _distribution(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", v):
            raise ValueError(f"distribution {v!r} is not a normalized distribution name (mypkg-kernels-sm90)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Artifact:
        if self.kind in ("ptx", "cubin"):
            if self.arch is None:
                raise ValueError(f"a {self.kind} artifact names its arch")
            abi.parse_arch(self.arch, ("compute",) if self.kind == "ptx" else ("sm",))
            if self.entry is not None:
                raise ValueError(f"a {self.kind} artifact holds a whole crate, not one entry")
        else:
            if self.arch is not None or self.entry is None:
                raise ValueError(f"a {self.kind} artifact names its entry and no arch")
            _ident(self.entry, "entry name")
        return self

    @property
    def sm(self) -> int | None:
        """Numeric arch (90 for sm_90 / compute_90)."""
        return None if self.arch is None else abi.parse_arch(self.arch).number


class SourceFile(_Model):
    path: str  # relative to the project root, POSIX
    sha256: str

    @field_validator("path")
    @classmethod
    def _rel(cls, v: str) -> str:
        if v.startswith("<external>/"):
            return v
        return package_path(v)


class Prebuilt(_Model):
    """The crate's binary came from ``CUDA_OXIDE_SHADERS_PTX_<CRATE>``, not from NVRTC."""

    variable: str
    kind: Literal["ptx", "cubin"]
    file_name: str  # base name only: no build-machine paths in the manifest


class SpirvStatus(_Model):
    """The WebGPU (WGSL / SPIR-V) stage of a crate."""

    #: "built"; "skipped" (KHAL_SKIP_SPIRV or ``spirv = false``); "not_applicable" (CUDA C++
    #: sources); "not_configured" (manifests of schema 1)
    status: Literal["skipped", "not_configured", "built", "not_applicable"]
    #: Why: e.g. "KHAL_SKIP_SPIRV is set".
    reason: str = ""


class GlobalVar(_Model):
    """A module global of a crate (a ``__constant__`` or ``__device__`` variable the kernels do not
    take as a parameter), found in the crate's PTX; its address and size come from the driver at
    load (``cuLibraryGetGlobal``), which must agree with ``size``."""

    name: str
    #: "constant" (``__constant__``, PTX ``.const``) or "device" (``__device__``, PTX ``.global``)
    space: Literal["constant", "device"]
    #: the PTX element type (``f32``, ``u32``, ``b8``, ...)
    type: str = Field(min_length=1, max_length=8)
    #: bytes of one element, and in all
    element_size: int = Field(gt=0, le=16)
    size: int = Field(gt=0, le=1 << 34)

    @model_validator(mode="after")
    def _consistent(self) -> GlobalVar:
        _ident(self.name, "global name")
        if self.size % self.element_size:
            raise ValueError(f"global {self.name!r}: {self.size} bytes is not a whole number of "
                             f"{self.element_size}-byte elements")
        return self


class ServedLibrary(_Model):
    """The installed library a companion crate's kernels come from (its sources are that library's
    modules): the distribution, its version, and the digest of each module file the build read."""

    distribution: str
    version: str
    #: module file path inside the distribution (``liger_kernel/ops/rms_norm.py``) -> sha256
    files: dict[str, str] = Field(default_factory=dict)


class TritonCrate(_Model):
    """What a Triton crate says beyond its entries."""

    #: option ``jit-fallback``: a call no built variant covers goes to Triton's JIT where Triton is
    #: installed (``KHAL_TRITON_JIT_FALLBACK`` overrides)
    jit_fallback: bool = False
    #: a companion crate: the library whose kernels it serves
    serves: Optional[ServedLibrary] = None


class Crate(_Model):
    name: str
    #: the source language's name: "cuda" (CUDA C++, CUDA only), "slang" (CUDA and WebGPU), "triton",
    #: or a plugin language's (its run-time counterpart: :mod:`khal_runtime.languages`)
    language: str = Field(default="cuda", pattern=r"^[a-z][a-z0-9_-]{0,63}$")
    #: Package-relative directory holding this crate's artifacts.
    package_dir: str
    sources: tuple[SourceFile, ...]
    #: Hash over every source and local header of the crate (and defines, the ABI).
    content_hash: str
    artifacts: tuple[Artifact, ...]
    entries: tuple[Entry, ...] = Field(min_length=1)
    prebuilt: Optional[Prebuilt] = None
    #: (the default is made without validation: validating it here would build SpirvStatus's
    #: validator when this module is imported, see ``_Model``)
    spirv: SpirvStatus = SpirvStatus.model_construct(status="not_configured", reason="")
    #: module globals the host may read and write (``kernels.crates[name].globals``)
    globals: Optional[tuple[GlobalVar, ...]] = None
    #: Triton crates: the crate's own facts (None: none, or not a Triton crate)
    triton: Optional[TritonCrate] = None

    @model_validator(mode="after")
    def _consistent(self) -> Crate:
        gnames = [g.name for g in self.globals or ()]
        if len(set(gnames)) != len(gnames):
            raise ValueError(f"crate {self.name!r}: a global is listed twice")
        names = [e.name for e in self.entries]
        if len(set(names)) != len(names):
            raise ValueError(f"crate {self.name!r}: an entry is listed twice")
        paths = [a.path for a in self.artifacts]
        if len(set(paths)) != len(paths):
            raise ValueError(f"crate {self.name!r}: two artifacts share a path")
        if not _is_hex(self.content_hash, 64):
            raise ValueError(f"crate {self.name!r}: content hash is not 64 lowercase hex digits")
        shipped = {a.path: a for a in self.artifacts}
        for e in self.entries:
            for t in e.webgpu or ():
                a = shipped.get(t.path)
                if a is None or a.kind != t.target or a.entry != e.name:
                    raise ValueError(f"crate {self.name!r}: entry {e.name!r}'s {t.target} target "
                                     f"names {t.path!r}, which is not its {t.target} artifact")
        return self

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

    @property
    def has_webgpu(self) -> bool:
        return all(e.webgpu for e in self.entries)


class Toolchain(_Model):
    nvrtc_version: Optional[str] = None
    slang_version: Optional[str] = None
    triton_version: Optional[str] = None
    hatch_khal_version: str
    abi_version: int = ABI_VERSION


class Editable(_Model):
    """Present only in editable installs: where to look for stale sources."""

    project_root: str  # absolute path of the project on the build machine


class Manifest(_Model):
    schema_version: int
    package: str
    toolchain: Toolchain
    crates: tuple[Crate, ...] = Field(min_length=1)
    editable: Optional[Editable] = None

    @model_validator(mode="after")
    def _unique(self) -> Manifest:
        names = [c.name for c in self.crates]
        if len(set(names)) != len(names):
            raise ValueError("a crate is listed twice")
        return self

    def crate(self, name: str) -> Crate:
        for c in self.crates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, fixed indent): byte-identical for equal manifests."""
        data = self.model_dump(mode="json", exclude_none=True)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # (built in C: this runs for every object of the manifest)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"key {k!r} appears twice in one object")
            seen.add(k)
    return out


#: a JSON string, to its closing quote (or to the end of an unterminated one)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


def _depth(text: str) -> int:
    """Deepest nesting of ``[`` / ``{`` outside strings (cheap: checked before json.loads).

    Strings are cut out by one regular expression first (escapes honoured, an unterminated
    string runs to the end), so the Python loop only visits the brackets, not every character."""
    depth = best = 0
    for ch in _BRACKETS.findall(_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            if depth > best:
                best = depth
                if best > _MAX_DEPTH:
                    return best
        else:
            depth -= 1
    return best


def parse_manifest(text: str | bytes, source: str = "manifest") -> Manifest:
    """Parse and validate manifest JSON. Raises ManifestError with a reason."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{source}: {len(text)} bytes, more than a manifest may be "
                            f"({MAX_MANIFEST_BYTES}); rebuild the package")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(f"{source}: not valid JSON (not UTF-8: {exc.reason}); rebuild the package") from None
    if _depth(text) > _MAX_DEPTH:
        raise ManifestError(f"{source}: not a manifest (JSON nested deeper than {_MAX_DEPTH}); rebuild the package")
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"{source}: not valid JSON ({exc}); rebuild the package") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestError(f"{source}: missing or non-integer 'schema_version'")
    if version > SCHEMA_VERSION:
        raise ManifestError(_too_new(source, version, data))
    if version < 1:
        raise ManifestError(f"{source}: schema version {version} is not valid")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        # a field of a newer release is what such a manifest has: named first
        unknown = [".".join(str(p) for p in e["loc"]) for e in exc.errors() if e["type"] == "extra_forbidden"]
        skew = _newer_builder(source, data, f"the field {unknown[0]}" if unknown else f"{where or '<root>'}: {msg}")
        if skew is not None:
            raise ManifestError(skew) from None
        raise ManifestError(
            f"{source}: invalid manifest at {where or '<root>'}: {msg} "
            f"({exc.error_count()} error(s)); rebuild the package"
        ) from None
    except RecursionError:
        raise ManifestError(f"{source}: not a manifest (nested too deep); rebuild the package") from None


def read_regular_file(path: Path, limit: int, what: str, error: type[Exception]) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes; ``error``
    saying why not otherwise. Never blocks on a FIFO or reads a device."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: {what} is not a regular file")
        if st.st_size > limit:
            raise error(f"{path}: {what} is {st.st_size} bytes, more than the {limit} allowed")
        chunks, total = [], 0
        while True:
            b = os.read(fd, min(1 << 20, limit + 1 - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
            if total > limit:
                raise error(f"{path}: {what} is more than the {limit} bytes allowed")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_manifest(path: Path) -> Manifest:
    try:
        text = read_regular_file(Path(path), MAX_MANIFEST_BYTES, "the manifest", ManifestError)
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: no khal manifest; was the package built with the hatch-khal hook? Its kernels are "
            "built only from the table that the project's build backend reads: hatchling's "
            "[tool.hatch.build.targets.wheel.hooks.khal] (not [tool.khal], not the table of another "
            "target), setuptools' [tool.khal] with hatch-khal in [build-system] requires; fix the table "
            "and reinstall the package"
        ) from None
    return parse_manifest(text, str(path))
