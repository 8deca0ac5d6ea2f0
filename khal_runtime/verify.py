"""CPU-only verification of a built shader package against its manifest.

No GPU, no driver: used by the runtime before it loads anything, and by the
build side (``python -m hatch_khal verify``). Checks:

* the manifest agrees with itself: every entry hash is the one its signature and its
  crate's content hash give (:func:`khal_runtime.abi.entry_hash`), so an edited parameter,
  kind or block size is caught before anything is launched;
* every artifact path is relative, normalised and stays inside the package
  (also after resolving symlinks), is a regular file, and has the manifest's size and sha256;
* every entry symbol in every PTX/cubin carries the manifest's entry hash, and each binary is
  for the arch the manifest says; every WGSL / SPIR-V entry point carries its entry's hash;
* every entry's launch facts (the grid axes its kernel reads, whether its ids fold the compiled
  block) are what the shipped PTX says (:func:`check_launch_facts`): they are not in the entry
  hash, so they are re-derived from the artifact;
* for editable installs, the crate sources still have the hashes they were built from (read
  only inside the recorded project root, which must hold the package).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Mapping

from khal_runtime import abi
from khal_runtime.binaries import (FOLD_TAGGED_GLOBAL, BinaryFormatError, KernelReads, khal_symbols, ptx_kernel_reads,
                                   read_binary, webgpu_entry_points)
from khal_runtime.errors import ArtifactError, HashMismatchError, KhalError, ManifestError, StaleBuildError
from khal_runtime.manifest import (MANIFEST_DIR, MANIFEST_NAME, Artifact, Crate, Entry, LaunchFacts, Manifest,
                                   load_manifest, package_path, prebuilt_env_var, read_regular_file)

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
    "facts_from_reads",
    "read_artifact",
    "rebuild_hint",
    "verify_package",
]


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


crate_env_var = prebuilt_env_var


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
    if len(data) != artifact.size:
        raise ArtifactError(
            f"artifact {artifact.path!r} is {len(data)} bytes, the manifest says {artifact.size}: "
            "the file was changed or truncated after the build; rebuild the package"
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != artifact.sha256:
        raise ArtifactError(
            f"artifact {artifact.path!r} has sha256 {digest[:16]}…, the manifest says "
            f"{artifact.sha256[:16]}…: the file was changed after the build; rebuild the package"
        )
    return data


def check_manifest(manifest: Manifest) -> list[Problem]:
    """Every entry hash recomputed from the manifest itself (schema 2 and later): an edited
    parameter (element type, kind, writability, shape), block size or content hash shows as a
    hash that its own signature does not give."""
    if manifest.schema_version < 2:
        return []
    problems: list[Problem] = []
    for crate in manifest.crates:
        for e in crate.entries:
            want = abi.entry_hash(crate.content_hash, e.signature())
            if want != e.hash:
                problems.append(Problem(
                    "manifest", crate.name,
                    f"entry {e.name!r} (crate {crate.name!r}): the manifest records hash {e.hash}, but "
                    f"the entry's own signature and its crate's content hash give {want}: the manifest "
                    "was edited after the build; rebuild the package",
                    ManifestError, None, e.name, e.hash, want))
    return problems


def check_symbols(crate: Crate, artifact: Artifact, data: bytes) -> list[Problem]:
    """The binary is what the manifest says (kind, arch), and every entry is in it with the
    manifest's hash; a WGSL / SPIR-V artifact's entry point carries its entry's hash."""
    if artifact.kind in ("wgsl", "spirv"):
        return _check_entry_point(crate, artifact, data)
    try:
        info = read_binary(data, artifact.path)
    except BinaryFormatError as exc:
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
    found = khal_symbols(info)
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
    return LaunchFacts(source="ptx", grid_axes=k.grid_axes,
                       block_fixed=fixed_block and (bool(k.folds) or not tagged), reads=k.registers)


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
            info = read_binary(blobs[ptx[0].path], ptx[0].path)
        except BinaryFormatError:
            return []  # check_symbols names it
        if info.text is not None:
            kernels = ptx_kernel_reads(info.text)
            tagged = FOLD_TAGGED_GLOBAL in dict(info.globals_u64)
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
        want = facts_from_reads(k, e.fixed_block, tagged)
        if want != f:
            diff = ", ".join(f"{n} {getattr(f, n)!r} (the PTX says {getattr(want, n)!r})"
                             for n in ("grid_axes", "block_fixed", "reads") if getattr(f, n) != getattr(want, n))
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
        if p.ctype is None:
            continue
        size_name, _, type_name = abi.probe_names(entry.name, i)
        size, tid = probes.get(size_name), probes.get(type_name)
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
    return out


def _check_entry_point(crate: Crate, artifact: Artifact, data: bytes) -> list[Problem]:
    try:
        names = webgpu_entry_points(data, artifact.kind, artifact.path)
    except BinaryFormatError as exc:
        return [Problem("binary", crate.name, str(exc), ArtifactError, artifact.path)]
    try:
        entry = crate.entry(artifact.entry or "")
    except KeyError:
        return [Problem("binary", crate.name, f"artifact {artifact.path!r} is for entry "
                        f"{artifact.entry!r}, which crate {crate.name!r} does not have; rebuild the package",
                        ArtifactError, artifact.path)]
    if entry.symbol in names:
        return []
    found = [split_ for n in names if (split_ := abi.split_symbol(n)) is not None and split_[0] == entry.name]
    got = found[0][1] if found else None
    return [Problem(
        "hash", crate.name,
        f"entry {entry.name!r} (crate {crate.name!r}) in {artifact.path}: the manifest expects "
        f"entry point {entry.symbol}, the {artifact.kind.upper()} has "
        f"{', '.join(names) or 'no compute entry point'}; the shader does not match the host code: "
        f"{rebuild_hint(crate)}", HashMismatchError, artifact.path, entry.name, entry.hash, got)]


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
                    f"{crate.name!r}); re-run pip install -e .",
                    StaleBuildError, src.path,
                ))
    return problems


def _crates(manifest: Manifest, crates: Iterable[str] | None) -> list[Crate]:
    if crates is None:
        return list(manifest.crates)
    return [manifest.crate(c) for c in crates]


def verify_package(package_dir: str | os.PathLike[str], manifest: Manifest | None = None, *,
                   sources: bool = True, symbols: bool = True,
                   crates: Iterable[str] | None = None) -> list[Problem]:
    """Every problem found (empty list: the package is sound). No GPU needed.

    ``manifest`` defaults to ``<package_dir>/_khal/manifest.json``."""
    pkg = Path(package_dir)
    if manifest is None:
        manifest = load_manifest(pkg / MANIFEST_DIR / MANIFEST_NAME)
    problems: list[Problem] = check_manifest(manifest)
    if sources:
        try:
            problems.extend(check_sources(manifest, pkg))
        except ManifestError as exc:
            problems.append(Problem("manifest", "", str(exc), ManifestError))
    for crate in _crates(manifest, crates):
        blobs: dict[str, bytes] = {}
        for art in crate.artifacts:
            try:
                data = blobs[art.path] = read_artifact(pkg, art)
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
