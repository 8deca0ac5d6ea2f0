"""CPU-only verification of a built shader package against its manifest.

No GPU, no driver: used by the runtime before it loads anything, and by the
build side (``python -m hatch_khal verify``). Checks:

* the manifest agrees with itself: every entry hash is the one its signature and its
  crate's content hash give (:func:`khal_runtime.abi.entry_hash`), so an edited parameter,
  kind or block size is caught before anything is launched;
* every artifact path is relative, normalised and stays inside the package
  (also after resolving symlinks), is a regular file, and has the manifest's size and sha256;
* every entry symbol in every PTX/cubin carries the manifest's entry hash, and each binary is
  for the arch (and a PTX for the ISA version) the manifest says; every WGSL / SPIR-V entry
  point carries its entry's hash;
* what the entry hash cannot cover is re-derived from the artifacts: every parameter's element
  size and alignment from the binary's ``khal_sizeof`` / ``khal_alignof`` probes; a WebGPU
  target's bindings, loose-scalar block and slots, storage strides and uniform layouts from its
  WGSL / SPIR-V (:func:`webgpu_layout_problems`); every entry's launch facts (the grid axes its
  kernel reads, whether its ids fold the compiled block) from the shipped PTX
  (:func:`check_launch_facts`). An edit is a ManifestError naming the field;
* for editable installs, the crate sources still have the hashes they were built from (read
  only inside the recorded project root, which must hold the package).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable, Mapping

from khal_runtime import abi
from khal_runtime.errors import ArtifactError, HashMismatchError, KhalError, ManifestError, StaleBuildError
from khal_runtime.launch_attributes import CLUSTER_DIMS
from khal_runtime.manifest_records import MANIFEST_DIR, MANIFEST_NAME, package_path, read_regular_file

if TYPE_CHECKING:
    from khal_runtime.binaries import KernelReads
    from khal_runtime.manifest import Artifact, Crate, Entry, LaunchFacts, Manifest, Param, StructLayout, WebGpuTarget
    from khal_runtime.shaders import Leaf

__all__ = [
    "MAX_ARTIFACT_BYTES",
    "MAX_SOURCE_BYTES",
    "Problem",
    "artifact_path",
    "check_launch_facts",
    "check_manifest",
    "check_package",
    "check_sources",
    "check_symbols",
    "crate_env_var",
    "check_artifact_bytes",
    "facts_from_reads",
    "read_artifact",
    "read_artifact_stream",
    "rebuild_hint",
    "verify_package",
    "webgpu_layout_problems",
]


def _binaries() -> Any:
    """:mod:`khal_runtime.binaries`, imported at the first artifact checked (lazy: loading a package
    checks its manifest only, and that module's regexes cost a few ms to compile)."""
    from khal_runtime import binaries  # lazy: see above

    return binaries


#: An artifact larger than this is refused unread (a cubin of the example is 30 KB).
MAX_ARTIFACT_BYTES = 1 << 30
#: An editable install's source larger than this is not read.
MAX_SOURCE_BYTES = 64 << 20


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a package. ``error`` is the exception class it maps to."""

    kind: str  # "manifest", "path", "missing", "size", "sha256", "binary", "hash", "stale"
    crate: str
    message: str
    error: type[KhalError] = field(default=ArtifactError, compare=False)
    path: str | None = None
    entry: str | None = None
    expected: str | None = None
    found: str | None = None

    def exception(self) -> KhalError:
        if self.error is HashMismatchError:
            return HashMismatchError(self.message, entry=self.entry or "",
                                     expected=self.expected or "", found=self.found)
        return self.error(self.message)

    def __str__(self) -> str:
        return self.message


crate_env_var = abi.prebuilt_env_var


def rebuild_hint(crate: Crate) -> str:
    var = crate_env_var(crate.name)
    hint = "rebuild the package (pip wheel . / pip install -e .)"
    if crate.prebuilt is not None:
        hint += (f"; crate {crate.name!r} was built from a prebuilt file ({crate.prebuilt.variable}="
                 f"{crate.prebuilt.file_name}): unset {crate.prebuilt.variable} or point it at a "
                 "binary built from the current sources")
    else:
        hint += f"; if {var} is set, unset it"
    return hint


def artifact_path(package_dir: Path, artifact: Artifact) -> Path:
    """The artifact's file, confined to ``package_dir``; ArtifactError otherwise."""
    rel = artifact.path
    try:
        package_path(rel)
    except ValueError as exc:
        raise ArtifactError(f"artifact path {rel!r} is not confined to the package ({exc}); "
                            "rebuild the package") from None
    pure = PurePosixPath(rel)
    root = Path(package_dir).resolve()
    candidate = root.joinpath(*pure.parts)
    try:
        resolved = candidate.resolve(strict=False)
    except (OSError, RuntimeError) as exc:
        raise ArtifactError(f"artifact {rel!r}: cannot resolve ({exc})") from None
    if resolved != root and root not in resolved.parents:
        raise ArtifactError(
            f"artifact {rel!r} resolves to {resolved}, outside the package {root} "
            "(a symlink leaves the package); refusing to load it"
        )
    return candidate


def read_artifact(package_dir: Path, artifact: Artifact) -> bytes:
    """The artifact's bytes after the confinement, size and sha256 checks."""
    path = artifact_path(package_dir, artifact)
    try:
        data = read_regular_file(path, MAX_ARTIFACT_BYTES, f"artifact {artifact.path!r}", ArtifactError)
    except FileNotFoundError:
        raise ArtifactError(
            f"artifact {artifact.path!r} is missing from the package; rebuild the package"
        ) from None
    return check_artifact_bytes(artifact, data)


def _wrong_size(artifact: Artifact, size: int | str) -> ArtifactError:
    return ArtifactError(
        f"artifact {artifact.path!r} is {size} bytes, the manifest says {artifact.size}: "
        "the file was changed or truncated after the build; rebuild the package"
    )


def check_artifact_bytes(artifact: Artifact, data: bytes) -> bytes:
    """``data`` if it has the artifact's size and sha256; ArtifactError otherwise."""
    if len(data) != artifact.size:
        raise _wrong_size(artifact, len(data))
    digest = hashlib.sha256(data).hexdigest()
    if digest != artifact.sha256:
        raise ArtifactError(
            f"artifact {artifact.path!r} has sha256 {digest[:16]}…, the manifest says "
            f"{artifact.sha256[:16]}…: the file was changed after the build; rebuild the package"
        )
    return data


def read_artifact_stream(stream: IO[bytes], artifact: Artifact, declared_size: int | None = None) -> bytes:
    """The artifact's bytes read from ``stream`` (a wheel's member), with the manifest's size as
    the cap: a ``declared_size`` (the archive's own) other than the manifest's is refused
    unread, and at most ``size + 1`` bytes are ever read; then the sha256 check."""
    try:
        package_path(artifact.path)
    except ValueError as exc:
        raise ArtifactError(f"artifact path {artifact.path!r} is not confined to the package ({exc}); "
                            "rebuild the package") from None
    if declared_size is not None and declared_size != artifact.size:
        raise _wrong_size(artifact, declared_size)
    if artifact.size > MAX_ARTIFACT_BYTES:
        raise ArtifactError(f"artifact {artifact.path!r} is {artifact.size} bytes, more than the "
                            f"{MAX_ARTIFACT_BYTES} allowed")
    cap = artifact.size
    chunks, total = [], 0
    while total <= cap:
        b = stream.read(min(1 << 20, cap + 1 - total))
        if not b:
            break
        chunks.append(b)
        total += len(b)
    if total > cap:
        raise _wrong_size(artifact, f"more than {cap}")
    return check_artifact_bytes(artifact, b"".join(chunks))


def check_manifest(manifest: Manifest) -> list[Problem]:
    """Every entry hash recomputed from the manifest itself (schema 2 and later): an edited
    parameter (element type, kind, writability, shape), block size or content hash shows as a
    hash that its own signature does not give."""
    if manifest.schema_version < 2:
        return []
    return [p for crate in manifest.crates for p in check_crate_hashes(crate)]


def check_crate_hashes(crate: Crate) -> list[Problem]:
    """:func:`check_manifest` for one crate (a schema 2 or later manifest's)."""
    problems: list[Problem] = []
    for e in crate.entries:
        want = abi.entry_hash(crate.content_hash, e.signature())
        if want != e.hash and any(p.layouts for p in e.params) and \
                abi.entry_hash(crate.content_hash, e.signature(layouts=False)) == e.hash:
            # built before the uniforms' CUDA layouts were hashed: it loads as it did then (its
            # hash is not the one a build with the layouts would give, so an edit of a newer
            # manifest never passes this way); its WebGPU layouts are still checked at use
            continue
        if want != e.hash:
            problems.append(Problem(
                "manifest", crate.name,
                f"entry {e.name!r} (crate {crate.name!r}): the manifest records hash {e.hash}, but "
                f"the entry's own signature and its crate's content hash give {want}: the manifest "
                "was edited after the build (the hash covers the entry's name, block size, launch "
                "shape and launch attributes, and its parameters' names, kinds, element types, shapes, lengths, writability "
                "and uniforms' CUDA layouts); rebuild the package",
                ManifestError, None, e.name, e.hash, want))
    return problems


def check_symbols(crate: Crate, artifact: Artifact, data: bytes) -> list[Problem]:
    """The binary is what the manifest says (kind, arch), and every entry is in it with the
    manifest's hash; a WGSL / SPIR-V artifact's entry point carries its entry's hash."""
    if artifact.kind in ("wgsl", "spirv"):
        return _check_entry_point(crate, artifact, data)
    try:
        info = _binaries().read_binary(data, artifact.path)
    except _binaries().BinaryFormatError as exc:
        return [Problem("binary", crate.name, str(exc), ArtifactError, artifact.path)]
    problems: list[Problem] = []
    want_kind = artifact.kind
    if info.kind != want_kind:
        problems.append(Problem("binary", crate.name,
                                f"artifact {artifact.path!r} is a {info.kind}, the manifest says {want_kind}",
                                ArtifactError, artifact.path))
    elif artifact.arch is not None and info.arch != abi.parse_arch(artifact.arch).number:
        what = "a cubin for sm" if info.kind == "cubin" else "PTX for .target sm"
        problems.append(Problem("binary", crate.name,
                                f"artifact {artifact.path!r} is {what}_{info.arch}, the manifest says "
                                f"{artifact.arch}: a binary of another arch is in its place; "
                                f"{rebuild_hint(crate)}", ArtifactError, artifact.path))
    elif info.kind == "ptx" and artifact.ptx_isa is not None and info.ptx_isa is not None and \
            info.ptx_isa != artifact.ptx_isa:
        # the loader picks PTX by this version (can the driver JIT it?): it must be the file's own
        problems.append(Problem("layout", crate.name,
                                f"crate {crate.name!r}: the manifest says {artifact.path} is PTX ISA "
                                f"{artifact.ptx_isa} (artifacts.ptx_isa), the file says .version "
                                f"{info.ptx_isa}: the manifest was edited after the build; {rebuild_hint(crate)}",
                                ManifestError, artifact.path))
    found = _binaries().khal_symbols(info)
    functions = set(info.functions)
    probes = dict(info.globals_u64)
    for entry in crate.entries:
        problems.extend(_check_types(crate, artifact, entry, probes))
        got = found.get(entry.name)
        if got != entry.hash:
            problems.append(Problem(
                "hash", crate.name,
                f"entry {entry.name!r} (crate {crate.name!r}) in {artifact.path}: the manifest "
                f"expects hash {entry.hash}, the binary has {got if got else 'missing'}; "
                f"the binary does not match the host code: {rebuild_hint(crate)}",
                HashMismatchError, artifact.path, entry.name, entry.hash, got,
            ))
        elif entry.indirect_symbol and entry.indirect_symbol not in functions:
            problems.append(Problem(
                "hash", crate.name,
                f"entry {entry.name!r} (crate {crate.name!r}): indirect-dispatch kernel "
                f"{entry.indirect_symbol!r} is missing from {artifact.path}; {rebuild_hint(crate)}",
                HashMismatchError, artifact.path, entry.name, entry.indirect_symbol, None,
            ))
    return problems


def facts_from_reads(k: KernelReads, fixed_block: bool, tagged: bool) -> LaunchFacts:
    """A kernel's launch facts from what its PTX reads (:func:`khal_runtime.binaries.ptx_kernel_reads`):
    the grid axes it tells apart, and whether its ids fold the compiled block in (a block fixed
    by its marker, and ``khal:fold`` tags reached; untagged PTX, ``tagged`` False, counts as folding)."""
    from khal_runtime.manifest import LaunchFacts  # lazy: the build's (pydantic) model

    return LaunchFacts(**_facts_fields(k, fixed_block, tagged))


def _facts_fields(k: KernelReads, fixed_block: bool, tagged: bool) -> dict[str, Any]:
    """The fields of :func:`facts_from_reads`' facts (what the runtime compares, field by field:
    a manifest read without pydantic holds plain records, :mod:`khal_runtime.manifest_load`)."""
    return {"source": "ptx", "grid_axes": k.grid_axes, "block_fixed": fixed_block and (bool(k.folds) or not tagged),
            "reads": tuple(k.registers)}


def check_launch_facts(crate: Crate, blobs: Mapping[str, bytes]) -> list[Problem]:
    """Every entry's ``launch`` facts are what the crate's shipped PTX says (``blobs``: artifact path
    -> bytes); facts from ``ptx`` in a crate that ships none are refused. Used at verify and by the
    CUDA backend at load (whatever binary it loads), so the runtime never accepts a launch on
    facts the artifact does not back."""
    ptx = [a for a in crate.artifacts if a.kind == "ptx" and a.path in blobs]
    problems: list[Problem] = []
    kernels: dict[str, KernelReads] | None = None
    tagged = False
    if ptx:
        try:
            info = _binaries().read_binary(blobs[ptx[0].path], ptx[0].path)
        except _binaries().BinaryFormatError:
            return []  # check_symbols names it
        if info.text is not None:
            kernels = _binaries().ptx_kernel_reads(info.text)
            tagged = _binaries().FOLD_TAGGED_GLOBAL in dict(info.globals_u64)
            clusters = _binaries().ptx_cluster_dims(info.text)
            for e in crate.entries:  # the cluster dims the kernel was compiled with (__cluster_dims__)
                if e.symbol not in kernels:
                    continue  # check_symbols names the missing kernel
                said = CLUSTER_DIMS.of(e.attributes)
                if clusters.get(e.symbol) != (tuple(said) if said else None):
                    problems.append(Problem(
                        "manifest", crate.name, f"entry {e.name!r} (crate {crate.name!r}): the manifest's cluster dims "
                        f"{said} are not the shipped PTX's ({clusters.get(e.symbol)}, .reqnctapercluster); the manifest "
                        f"was edited after the build; {rebuild_hint(crate)}", ManifestError, ptx[0].path, e.name))
    for e in crate.entries:
        f = e.launch
        if f is None or f.source != "ptx":
            continue
        where = f"entry {e.name!r} (crate {crate.name!r})"
        if kernels is None:
            problems.append(Problem(
                "manifest", crate.name, f"{where}: the manifest records launch facts from PTX, but the crate ships "
                f"no PTX to back them: the manifest was edited after the build; {rebuild_hint(crate)}",
                ManifestError, None, e.name))
            continue
        k = kernels.get(e.symbol)
        if k is None:
            continue  # check_symbols names the missing kernel
        want = _facts_fields(k, e.fixed_block, tagged)
        if any(getattr(f, n) != v for n, v in want.items()):
            diff = ", ".join(f"{n} {getattr(f, n)!r} (the PTX says {v!r})"
                             for n, v in want.items() if n != "source" and getattr(f, n) != v)
            problems.append(Problem(
                "manifest", crate.name, f"{where}: the manifest's launch facts are not the shipped PTX's: {diff}; "
                f"the manifest was edited after the build; {rebuild_hint(crate)}",
                ManifestError, ptx[0].path, e.name))
    return problems


def _check_types(crate: Crate, artifact: Artifact, entry: Entry, probes: dict[str, int]) -> list[Problem]:
    """A CUDA C++ parameter's element type is what the compiler made of its spelling (the
    entry hash covers the spelling): the binary's own type and size probes must agree with the
    manifest, so an edited element type or size is caught before anything is launched."""
    out: list[Problem] = []
    for i, p in enumerate(entry.params):
        size_name, align_name, type_name = abi.probe_names(entry.name, i)
        size, align, tid = probes.get(size_name), probes.get(align_name), probes.get(type_name)
        if p.ctype is None:
            # a Slang entry (or a CUDA C++ one of an older manifest): its element size and alignment
            # are what reflection said, checked against NVRTC's probes at build and here again,
            # since the entry hash does not cover them; a binary without probes (an older build)
            # has nothing to compare
            out.extend(_check_size_probes(crate, artifact, entry, p, size, align))
            continue
        if size is None or tid is None:
            out.append(Problem(
                "hash", crate.name, f"entry {entry.name!r} (crate {crate.name!r}) in {artifact.path}: the binary "
                f"lacks the type probes of parameter {p.name!r}; {rebuild_hint(crate)}",
                HashMismatchError, artifact.path, entry.name, entry.hash, None))
            continue
        scalar = abi.type_id_scalar(tid - abi.TYPE_PROBE_BIAS)
        binary = scalar.name if scalar is not None else abi.describe_type_id(tid - abi.TYPE_PROBE_BIAS)
        manifest_scalar = p.element_type in abi.SCALARS
        if size != p.element_size or (scalar is None) == manifest_scalar or \
                (scalar is not None and scalar.name != p.element_type):
            out.append(Problem(
                "hash", crate.name, f"entry {entry.name!r} (crate {crate.name!r}) parameter {p.name!r} "
                f"({p.ctype}): the manifest says element type {p.element_type} ({p.element_size} bytes), "
                f"{artifact.path} was compiled with {binary} ({size} bytes): the manifest does not match the "
                f"binary; {rebuild_hint(crate)}", HashMismatchError, artifact.path, entry.name, entry.hash, None))
        elif align is not None and align != p.element_align:
            out.extend(_check_size_probes(crate, artifact, entry, p, size, align))
    return out


def _check_size_probes(crate: Crate, artifact: Artifact, entry: Entry, p: Param, size: int | None,
                       align: int | None) -> list[Problem]:
    """``element_size`` / ``element_align`` against the binary's ``khal_sizeof`` / ``khal_alignof``
    probes (the compiler's own sizeof and alignof of the element type)."""
    for what, want, got in (("element_size", p.element_size, size), ("element_align", p.element_align, align)):
        if got is not None and got != want:
            return [Problem(
                "layout", crate.name,
                f"entry {entry.name!r} (crate {crate.name!r}): the manifest's params.{p.name}.{what} is "
                f"{want}, but {artifact.path} was compiled with {got} ({'sizeof' if what == 'element_size' else 'alignof'} "
                f"{p.element_type}): the manifest was edited after the build or belongs to another one; "
                f"{rebuild_hint(crate)}", ManifestError, artifact.path, entry.name, str(want), str(got))]
    return []


def _check_entry_point(crate: Crate, artifact: Artifact, data: bytes) -> list[Problem]:
    try:
        names = _binaries().webgpu_entry_points(data, artifact.kind, artifact.path)
    except _binaries().BinaryFormatError as exc:
        return [Problem("binary", crate.name, str(exc), ArtifactError, artifact.path)]
    try:
        entry = crate.entry(artifact.entry or "")
    except KeyError:
        return [Problem("binary", crate.name, f"artifact {artifact.path!r} is for entry "
                        f"{artifact.entry!r}, which crate {crate.name!r} does not have; rebuild the package",
                        ArtifactError, artifact.path)]
    if entry.symbol in names:
        target = entry.target(artifact.kind)
        if target is None or target.path != artifact.path:
            return []  # not an artifact the entry runs (the manifest's own validation ties them)
        return webgpu_layout_problems(crate, entry, target, data)
    found = [split_ for n in names if (split_ := abi.split_symbol(n)) is not None and split_[0] == entry.name]
    got = found[0][1] if found else None
    return [Problem(
        "hash", crate.name,
        f"entry {entry.name!r} (crate {crate.name!r}) in {artifact.path}: the manifest expects "
        f"entry point {entry.symbol}, the {artifact.kind.upper()} has "
        f"{', '.join(names) or 'no compute entry point'}; the shader does not match the host code: "
        f"{rebuild_hint(crate)}", HashMismatchError, artifact.path, entry.name, entry.hash, got)]


_SCALAR_SIZES = {name: t.size for name, t in abi.SCALARS.items()}


def _struct_leaves(layout: StructLayout) -> list[Leaf]:
    """Every scalar of a manifest struct layout as a :class:`~khal_runtime.shaders.Leaf`."""
    from khal_runtime.shaders import Leaf  # lazy: see webgpu_layout_problems

    out: list[Leaf] = []

    def walk(fields: Iterable[Any], base: int, chain: tuple[str | int, ...]) -> None:
        for f in fields:
            for idx in itertools.product(*(range(n) for n in f.shape)):
                off = base + f.offset + sum(i * st for i, st in zip(idx, f.strides))
                if f.type == "struct":
                    walk(f.fields or (), off, chain + (f.name, *idx))
                else:
                    out.append(Leaf(chain + (f.name, *idx), off, f.type))

    walk(layout.fields, 0, ())
    return out


def _path(leaf: Leaf) -> str:
    """``arr[1]``, ``inner.q[0]``: a leaf's path as C spells it."""
    out = ""
    for x in leaf.path:
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else x)
    return out


def _where(v: Any) -> str:
    if v is None:
        return "nothing (no such variable)"
    if v.access == "push_constants":
        return "push constants"
    return f"group {v.group} binding {v.binding} ({v.access})"


def webgpu_layout_problems(crate: Crate, entry: Entry, target: WebGpuTarget, data: bytes) -> list[Problem]:
    """What the manifest says of ``entry``'s ``target`` (its bindings, loose-scalar block and slots,
    its storage elements' sizes, its uniforms' struct layouts in that target) against what the
    WGSL / SPIR-V ``data`` itself declares (:mod:`khal_runtime.shaders`): the entry hash cannot
    cover these (they are known only after the entry point is named with it), so an edit of any
    of them is caught here, before the shader is bound. Empty: they agree."""
    # lazy: the readers (their regular expressions, ~1 ms to import) are for WebGPU artifacts
    # only; a CUDA process importing this module never needs them
    from khal_runtime.shaders import Leaf, ShaderVar, read_shader, wgsl_stem

    path = target.path
    kind = {"wgsl": "WGSL", "spirv": "SPIR-V"}.get(target.target, target.target)
    wgsl = target.target == "wgsl"
    try:
        shader = read_shader(data, target.target, path)
    except _binaries().BinaryFormatError as exc:
        return [Problem("binary", crate.name, f"crate {crate.name!r}: {exc}; {rebuild_hint(crate)}",
                        ArtifactError, path, entry.name)]

    def problem(field: str, manifest: str, artifact: str) -> Problem:
        return Problem(
            "layout", crate.name,
            f"entry {entry.name!r} (crate {crate.name!r}): the manifest's {field} is {manifest}, but the "
            f"{kind} artifact {path} has {artifact}: the manifest was edited after the build or belongs to "
            f"another one; {rebuild_hint(crate)}", ManifestError, path, entry.name, manifest, artifact)

    if wgsl:
        # WGSL spells names its own way (khal_runtime.shaders, "WGSL names"): each variable is the
        # parameter whose binding (from Slang's reflection) it sits at, when their stems agree
        at: dict[tuple[int | None, int | None], str | None] = {(b.group, b.binding): b.param for b in target.bindings}
        facts: dict[str | None, ShaderVar] = {}
        for var in shader.vars:
            owner = at.get((var.group, var.binding), var.param)
            facts[owner if wgsl_stem(owner) == wgsl_stem(var.param) else var.param] = var
    else:
        facts = shader.by_param()

    def same(lf: Leaf) -> Leaf:
        """A leaf as both sides can spell it: WGSL member names by their stems."""
        return Leaf(tuple(wgsl_stem(x) if isinstance(x, str) else x for x in lf.path), lf.offset, lf.type) \
            if wgsl else lf

    out: list[Problem] = []
    field = f"webgpu.{target.target}"
    want: dict[str | None, tuple[int | None, int | None, str]] = {
        b.param: (b.group, b.binding, b.access) for b in target.bindings}
    if target.scalars == "push_constants" and None in facts:
        # (a shader that reads none of its scalars declares no push constants: the slots are unused)
        want[None] = (None, None, "push_constants")
    for name in sorted(set(want) | set(facts), key=lambda n: (n is not None, n or "")):
        v = facts.get(name)
        got = None if v is None else (v.group, v.binding, v.access)
        if got != want.get(name):
            what = f"{field}.bindings (parameter {name!r})" if name is not None else f"{field}.scalars (the loose scalars' block)"
            w = want.get(name)
            out.append(problem(what, "nothing" if w is None else
                               ("push constants" if w[2] == "push_constants" else f"group {w[0]} binding {w[1]} ({w[2]})"),
                               _where(v)))
    if out:
        return out
    params = {p.name: p for p in entry.params}
    for name, v in facts.items():
        if name is None:
            continue
        p = params[name]
        if v.stride is not None and v.stride != p.element_size:
            out.append(problem(f"params.{name}.element_size", f"{p.element_size} bytes ({p.element_type})",
                               f"elements of {v.stride} bytes"))
        if v.access == "uniform":
            layout = (p.layouts or {}).get(target.target)
            if layout is None:
                out.append(problem(f"params.{name}.layouts.{target.target}", "missing", "a uniform struct"))
                continue
            leaves = [same(lf) for lf in v.leaves]
            have = set(leaves)
            written = _struct_leaves(layout)
            mine = [same(lf) for lf in written]
            # a std140 array of scalars pads each element to a vec4 in WGSL: the element is its
            # first component (path + (0,)); anything else must sit where the artifact has it
            wrong = next((lf for lf in mine if lf not in have and not (
                isinstance(lf.path[-1], int) and Leaf((*lf.path, 0), lf.offset, lf.type) in have)), None)
            chains = {lf.chain for lf in leaves} ^ {lf.chain for lf in mine}
            cuda = (p.layouts or {}).get("cuda")
            # the same fields, shapes and types as the CUDA layout, which the entry hash covers
            # (what repacking a C struct for this target relies on): the manifest's own spellings
            other = None if cuda is None else \
                {(lf.path, lf.type) for lf in _struct_leaves(cuda)} ^ {(lf.path, lf.type) for lf in written}
            if wrong is not None:
                there = [lf for lf in leaves if lf.path in (wrong.path, (*wrong.path, 0))]
                out.append(problem(f"params.{name}.layouts.{target.target}",
                                   f"field {_path(wrong)!r} ({wrong.type}) at byte {wrong.offset}",
                                   f"it at byte {there[0].offset} ({there[0].type})" if there else "no such field"))
            elif other:
                first = min(other, key=lambda x: str(x))
                out.append(problem(f"params.{name}.layouts.{target.target}",
                                   f"a layout whose fields differ from its CUDA layout's (at "
                                   f"{_path(Leaf(first[0], 0, first[1]))!r}, {first[1]})",
                                   "the fields the entry hash covers in the CUDA layout"))
            elif chains:
                out.append(problem(f"params.{name}.layouts.{target.target}",
                                   f"fields {sorted('.'.join(c) for c in {lf.chain for lf in mine})}",
                                   f"fields {sorted('.'.join(c) for c in {lf.chain for lf in leaves})}"))
            elif layout.size < v.end or v.size is not None and layout.size != v.size:
                out.append(problem(f"params.{name}.layouts.{target.target}.size", f"{layout.size} bytes",
                                   f"a {v.size}-byte struct" if v.size is not None else f"fields up to byte {v.end}"))
    block = facts.get(None)
    if block is not None:
        # the scalars by their names (WGSL: by the stems of the parameters' names, which are what the
        # block's members keep of them)
        def key(n: str) -> str:
            return wgsl_stem(n) if wgsl else n

        named = {key(s.param): s.param for s in target.scalar_slots}
        slots = {key(s.param): (s.offset, s.size) for s in target.scalar_slots}
        block_leaves = [same(lf) for lf in block.leaves]
        have_slots = {lf.chain[0]: (lf.offset, _SCALAR_SIZES.get(lf.type, 0)) for lf in block_leaves if lf.chain}
        for k in sorted(set(slots) | set(have_slots)):
            name = named.get(k, k)
            if slots.get(k) != have_slots.get(k):
                s, h = slots.get(k), have_slots.get(k)
                out.append(problem(f"{field}.scalar_slots (parameter {name!r})",
                                   "nothing" if s is None else f"byte {s[0]} ({s[1]} bytes)",
                                   "no such scalar" if h is None else f"it at byte {h[0]} ({h[1]} bytes)"))
            elif name in params and any(lf.chain == (k,) and lf.type != params[name].element_type
                                        for lf in block_leaves):
                t = next(lf.type for lf in block_leaves if lf.chain == (k,))
                out.append(problem(f"{field}.scalar_slots (parameter {name!r})",
                                   f"a {params[name].element_type} slot", f"a {t}"))
        if not out and (target.scalar_block_size < block.end or
                        block.size is not None and target.scalar_block_size != block.size):
            out.append(problem(f"{field}.scalar_block_size", f"{target.scalar_block_size} bytes",
                               f"a {block.size}-byte block" if block.size is not None else f"scalars up to byte {block.end}"))
    elif target.scalars == "uniform":
        out.append(problem(f"{field}.scalars", "a uniform block", "no scalar block"))
    return out


def editable_rebuild_hint(root: str | os.PathLike[str]) -> str:
    """The commands that rebuild an editable install of the project at ``root``. A plain ``pip
    install -e .`` builds in an isolated environment, which must find hatch-khal: on an index, or
    with ``--find-links`` to its wheel; without isolation this environment's build tools are used."""
    where = shlex.quote(str(root))
    return (f"rebuild it: pip install --no-build-isolation -e {where} (with hatch-khal[build] installed "
            f"in this environment), or pip install --find-links DIR -e {where} where DIR holds "
            "hatch-khal's wheel (until hatch-khal is on PyPI, a plain pip install -e . fails with "
            "'No matching distribution found for hatch-khal')")


def check_sources(manifest: Manifest, package_dir: str | os.PathLike[str] | None = None) -> list[Problem]:
    """Editable installs: crate sources re-hashed against the manifest. Only regular files
    inside the recorded project root are read (at most :data:`MAX_SOURCE_BYTES` each), and only
    when the package itself lives in that root (``package_dir``; a wheel's manifest never has
    an editable record, so one found elsewhere was tampered with or copied)."""
    if manifest.editable is None:
        return []
    root = Path(manifest.editable.project_root)
    if not root.is_absolute():
        raise ManifestError(f"editable install: project root {str(root)!r} is not an absolute path; "
                            "re-run pip install -e .")
    root = root.resolve()
    if package_dir is not None:
        pkg = Path(package_dir).resolve()
        if pkg != root and root not in pkg.parents:
            raise ManifestError(
                f"the manifest says this is an editable install of {root}, but the package is at "
                f"{pkg}, outside that project: rebuild the package (pip install -e . in the project, "
                "or build a wheel)")
    problems: list[Problem] = []
    for crate in manifest.crates:
        for src in crate.sources:
            if src.path.startswith("<external>/"):
                # outside the project (an include dir like ../shared): never read at run time,
                # so that a manifest cannot make the runtime read files outside the project
                continue
            p = root.joinpath(*PurePosixPath(src.path).parts)
            what = "changed"
            try:
                # the path is confined lexically (SourceFile refuses "..", absolute paths); a
                # symlink in the project is the author's own and is followed; only regular files
                # are read, capped
                digest = hashlib.sha256(read_regular_file(p, MAX_SOURCE_BYTES, "source",
                                                          ArtifactError)).hexdigest()
            except FileNotFoundError:
                digest, what = None, "is missing"
            except (OSError, ArtifactError) as exc:
                digest, what = None, f"cannot be read ({exc})"
            if digest != src.sha256:
                problems.append(Problem(
                    "stale", crate.name,
                    f"sources changed since the last build ({src.path} {what}, crate "
                    f"{crate.name!r}); {editable_rebuild_hint(root)}",
                    StaleBuildError, src.path,
                ))
    return problems


def _crates(manifest: Manifest, crates: Iterable[str] | None) -> list[Crate]:
    if crates is None:
        return list(manifest.crates)
    return [manifest.crate(c) for c in crates]


def verify_package(package_dir: str | os.PathLike[str], manifest: Manifest | None = None, *,
                   sources: bool = True, symbols: bool = True,
                   crates: Iterable[str] | None = None,
                   read: Callable[[Artifact], bytes] | None = None) -> list[Problem]:
    """Every problem found (empty list: the package is sound). No GPU needed.

    ``manifest`` defaults to ``<package_dir>/_khal/manifest.json``. ``read`` gives an artifact's
    checked bytes (default :func:`read_artifact` from ``package_dir``; a wheel's reader streams
    its members, :func:`read_artifact_stream`), raising ArtifactError."""
    pkg = Path(package_dir)
    if manifest is None:  # validated in full, whatever its digest says (the runtime's load trusts one)
        from khal_runtime.manifest import load_manifest  # lazy: pydantic, for the verify command

        manifest = load_manifest(pkg / MANIFEST_DIR / MANIFEST_NAME)
    problems: list[Problem] = check_manifest(manifest)
    if sources:
        try:
            problems.extend(check_sources(manifest, pkg))
        except ManifestError as exc:
            problems.append(Problem("manifest", "", str(exc), ManifestError))
    reader = read or (lambda art: read_artifact(pkg, art))
    for crate in _crates(manifest, crates):
        blobs: dict[str, bytes] = {}
        for art in crate.artifacts:
            if art.distribution is not None:
                continue  # a companion distribution's: checked at load, where it is installed
            try:
                data = blobs[art.path] = reader(art)
            except ArtifactError as exc:
                msg = str(exc)
                kind = ("path" if "confined" in msg or "outside" in msg else
                        "missing" if "missing" in msg else "size" if "bytes" in msg else "sha256")
                problems.append(Problem(kind, crate.name, f"crate {crate.name!r}: {msg}",
                                        ArtifactError, art.path))
                continue
            if symbols:
                problems.extend(check_symbols(crate, art, data))
        if symbols:
            problems.extend(check_launch_facts(crate, blobs))
    return problems


def check_package(package_dir: str | os.PathLike[str], manifest: Manifest | None = None, **kw: object) -> None:
    """Raise the first problem's exception (StaleBuildError, ArtifactError, HashMismatchError)."""
    problems = verify_package(package_dir, manifest, **kw)  # type: ignore[arg-type]
    if problems:
        exc = problems[0].exception()
        if len(problems) > 1:
            exc.args = (f"{problems[0].message} (and {len(problems) - 1} more problem(s))",)
        raise exc
