"""Companion distributions: a package's cubins for one arch family shipped in a wheel of their own
(``mypkg-kernels-sm90``, made by ``python -m hatch_khal split``), so that no wheel passes the index's
size limit.

The package's manifest lists every artifact; one that a companion ships names it
(``Artifact.distribution``). A companion declares itself with an entry point in the group
:data:`GROUP`, named after the package it serves, whose value is its own module: a folder holding
``_khal/<crate>/...`` (the artifacts, under the paths the manifest gives) and ``_khal/companion.json``
(the package, its distribution and exact version, and the sha256 of the manifest it was split from).
:func:`resolve` finds the companions installed for a package (no import: their folders are found
with ``importlib.util.find_spec``), checks each was split from this very manifest, and says where each
artifact is; the artifacts are then read and checked (size, sha256, symbols) as the package's own.
An artifact whose companion is not installed is left out of the crate: the loader falls back to the
PTX the package ships, else its error names the distribution to install (:func:`missing_hint`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from khal_runtime.errors import ArtifactError
from khal_runtime.manifest_records import MANIFEST_DIR

if TYPE_CHECKING:  # the runtime holds khal_runtime.manifest_records objects, typed as the models
    from khal_runtime.manifest import Crate, Manifest

__all__ = ["COMPANION_FILE", "GROUP", "Resolved", "missing_hint", "resolve"]

GROUP = "khal_runtime.companions"
COMPANION_FILE = "companion.json"


@dataclass
class Resolved:
    """Where a package's artifacts are: the crates with the artifacts at hand, the folder each
    companion artifact is read from, and the companions missing (distribution -> archs)."""

    crates: tuple[Crate, ...]
    dirs: dict[str, Path] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)


def _installed(package: str) -> dict[str, tuple[str, Path]]:
    """distribution name -> (its version, its module's folder) of the companions installed for ``package``."""
    from importlib import metadata  # lazy: its import costs milliseconds, paid by packages with companions only

    out: dict[str, tuple[str, Path]] = {}
    for ep in metadata.entry_points(group=GROUP, name=package):
        dist = getattr(ep, "dist", None)
        try:
            spec = importlib.util.find_spec(ep.value)
        except (ImportError, ValueError):
            spec = None
        if dist is None or spec is None or not spec.submodule_search_locations:
            continue
        out[dist.name.lower().replace("_", "-")] = (dist.version, Path(list(spec.submodule_search_locations)[0]))
    return out


def resolve(package: str, package_dir: Path, manifest: Manifest) -> Resolved:
    """The crates of ``manifest`` with their companions' artifacts where installed (ArtifactError
    for a companion split from another build of the package)."""
    wanted = {a.distribution for c in manifest.crates for a in c.artifacts if a.distribution}
    if not wanted:
        return Resolved(manifest.crates)
    digest = hashlib.sha256((package_dir / MANIFEST_DIR / "manifest.json").read_bytes()).hexdigest()
    found = _installed(package)
    usable: dict[str, Path] = {}
    for dist in sorted(wanted):
        if dist not in found:
            continue
        version, folder = found[dist]
        try:
            record = json.loads((folder / MANIFEST_DIR / COMPANION_FILE).read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"package {package!r}: companion distribution {dist} {version} has no readable "
                                f"{MANIFEST_DIR}/{COMPANION_FILE} ({exc}); reinstall it") from None
        if not isinstance(record, dict) or record.get("manifest_sha256") != digest:
            pin = record.get("requires", "?") if isinstance(record, dict) else "?"
            raise ArtifactError(
                f"package {package!r}: companion distribution {dist} {version} was split from another build of it "
                f"(it is for {pin}); install the companion of the installed package's version: "
                f"pip install --force-reinstall \"{dist}==<that version>\"")
        usable[dist] = folder
    crates = []
    resolved = Resolved(())
    for crate in manifest.crates:
        kept = []
        for a in crate.artifacts:
            if a.distribution is None:
                kept.append(a)
            elif a.distribution in usable:
                kept.append(a)
                resolved.dirs[a.path] = usable[a.distribution]
            else:
                resolved.missing.setdefault(a.distribution, []).append(a.arch or a.path)
        crates.append(crate if len(kept) == len(crate.artifacts) else crate.model_copy(update={"artifacts": tuple(kept)}))
    resolved.crates = tuple(crates)
    return resolved


def missing_hint(missing: dict[str, list[str]]) -> str:
    """What to install, for an error about a device no artifact at hand fits."""
    if not missing:
        return ""
    listing = "; ".join(f"{dist} ({', '.join(sorted(set(archs)))})" for dist, archs in sorted(missing.items()))
    return (f". The cubins for other archs are in companion distributions that are not installed: {listing}; "
            "install the one for this GPU's arch (pip install <distribution>, same version as the package)")
