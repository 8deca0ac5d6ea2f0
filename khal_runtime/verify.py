"""CPU-only verification of a built shader package against its manifest.

No GPU, no driver: used by the runtime before it loads anything, and by the
build side (``python -m hatch_khal verify``). Checks:

* every artifact path is relative, normalised and stays inside the package
  (also after resolving symlinks), exists, and has the manifest's size and sha256;
* every entry symbol in every PTX/cubin carries the manifest's entry hash;
* for editable installs, the crate sources still have the hashes they were built from.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable

from khal_runtime.errors import ArtifactError, HashMismatchError, KhalError, StaleBuildError
from khal_runtime.manifest import Artifact, Crate, Manifest, prebuilt_env_var

__all__ = [
    "Problem",
    "artifact_path",
    "check_package",
    "check_sources",
    "check_symbols",
    "crate_env_var",
    "read_artifact",
    "rebuild_hint",
    "verify_package",
]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a package. ``error`` is the exception class it maps to."""

    kind: str  # "path", "missing", "size", "sha256", "binary", "hash", "stale"
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
    pure = PurePosixPath(rel)
    if (not rel or rel.startswith("/") or "\\" in rel or ":" in rel or pure.is_absolute()
            or any(p in ("..", ".", "") for p in rel.split("/")) or os.path.isabs(rel)):
        raise ArtifactError(f"artifact path {rel!r} is not confined to the package; rebuild the package")
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
        data = path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(
            f"artifact {artifact.path!r} is missing from the package; rebuild the package"
        ) from None
    except OSError as exc:
        raise ArtifactError(f"artifact {artifact.path!r}: cannot read ({exc.strerror})") from None
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


def check_symbols(crate: Crate, artifact: Artifact, data: bytes) -> list[Problem]:
    """Every entry of the crate present in the binary with the manifest's hash."""
    from khal_runtime.binaries import BinaryFormatError, khal_symbols, read_binary

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
    found = khal_symbols(info)
    functions = set(info.functions)
    for entry in crate.entries:
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


def check_sources(manifest: Manifest) -> list[Problem]:
    """Editable installs: crate sources re-hashed against the manifest."""
    if manifest.editable is None:
        return []
    root = Path(manifest.editable.project_root)
    problems: list[Problem] = []
    for crate in manifest.crates:
        for src in crate.sources:
            if src.path.startswith("<external>/"):
                # a file outside the project: "<external>/../shared/x.h" (relative to the project
                # root) or "<external>//opt/inc/x.h" (absolute): both resolve from the root
                p = root / src.path[len("<external>/"):]
            else:
                p = root.joinpath(*PurePosixPath(src.path).parts)
            try:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
            except OSError:
                digest = None
            if digest != src.sha256:
                what = "is missing" if digest is None else "changed"
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
        from khal_runtime.manifest import MANIFEST_DIR, MANIFEST_NAME, load_manifest

        manifest = load_manifest(pkg / MANIFEST_DIR / MANIFEST_NAME)
    problems: list[Problem] = []
    if sources:
        problems.extend(check_sources(manifest))
    for crate in _crates(manifest, crates):
        for art in crate.artifacts:
            try:
                data = read_artifact(pkg, art)
            except ArtifactError as exc:
                msg = str(exc)
                kind = ("path" if "confined" in msg or "outside" in msg else
                        "missing" if "missing" in msg else "size" if "bytes" in msg else "sha256")
                problems.append(Problem(kind, crate.name, f"crate {crate.name!r}: {msg}",
                                        ArtifactError, art.path))
                continue
            if symbols and art.kind in ("ptx", "cubin"):
                problems.extend(check_symbols(crate, art, data))
    return problems


def check_package(package_dir: str | os.PathLike[str], manifest: Manifest | None = None, **kw: object) -> None:
    """Raise the first problem's exception (StaleBuildError, ArtifactError, HashMismatchError)."""
    problems = verify_package(package_dir, manifest, **kw)  # type: ignore[arg-type]
    if problems:
        exc = problems[0].exception()
        if len(problems) > 1:
            exc.args = (f"{problems[0].message} (and {len(problems) - 1} more problem(s))",)
        raise exc
