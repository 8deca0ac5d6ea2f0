"""Reading a package's manifest at run time, without building pydantic's validators for one the
build already validated (#38 item 18).

The build writes ``_khal/manifest.json`` through the pydantic models of
:mod:`khal_runtime.manifest` (validated as it is made), and beside it ``_khal/manifest.digest``:
the sha256 of the manifest's bytes and of the models' source (:data:`~khal_runtime.manifest_records.SOURCE_DIGEST`,
:func:`manifest_digest`). :func:`load_manifest` reads the manifest:

* **fast path**, when the digest file says exactly these bytes were written through these models:
  the JSON is read into the plain classes of :mod:`khal_runtime.manifest_records` (the models'
  fields and methods, no validation); pydantic is not imported. Kept: the schema version this
  runtime reads, every artifact's and WebGPU target's path confined to the package
  (:func:`~khal_runtime.manifest_records.package_path`), and what :func:`khal_runtime.kernels.load`
  does with any manifest: every entry hash recomputed from its signature
  (:func:`khal_runtime.verify.check_manifest`), editable sources hashed; at first use every
  artifact's size, sha256, symbols and confinement (symlinks) are checked as before.
* **full validation** otherwise (no digest file, other bytes: the manifest was edited, or another
  hatch-khal built it; models of another source: another khal-runtime reads it): the pydantic
  models validate it (:func:`khal_runtime.manifest.parse_manifest`, named
  :class:`~khal_runtime.errors.ManifestError`), then it is read into the same plain classes.

Either way the runtime holds one kind of object. The ``verify`` command validates in full always.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from khal_runtime.errors import ManifestError
from khal_runtime.manifest_records import (MAX_MANIFEST_BYTES, SCHEMA_VERSION, SOURCE_DIGEST, package_path,
                                           read_regular_file)
from khal_runtime.manifest_records import Manifest as _Records

if TYPE_CHECKING:
    from khal_runtime.manifest import Manifest

__all__ = ["DIGEST_NAME", "build_digest", "load_manifest", "manifest_digest", "read_manifest", "records"]

#: the digest file beside the manifest (in ``_khal/``)
DIGEST_NAME = "manifest.digest"
#: the digest file's size (64 hex digits and a newline)
_DIGEST_BYTES = 65


def manifest_digest(data: bytes) -> str:
    """What the build writes to ``_khal/manifest.digest`` for manifest bytes ``data``: the sha256
    of them and of the models' source they were written through (:data:`SOURCE_DIGEST`)."""
    return hashlib.sha256(data + b"\0" + SOURCE_DIGEST.encode()).hexdigest()


def build_digest(data: bytes) -> str | None:
    """What the build writes to ``_khal/manifest.digest`` for manifest bytes ``data`` it made
    through the models, or None when this runtime's plain classes were not made from the models'
    source as it is now (a development tree whose manifest.py or launch attribute rows changed since
    ``scripts/gen_manifest_records.py`` ran): then no digest is written and the runtime validates
    the manifest in full."""
    from khal_runtime import manifest as models  # lazy: the build has pydantic

    if models.source_digest() != SOURCE_DIGEST:
        return None
    return manifest_digest(data)


def records(data: dict[str, Any]) -> Manifest:
    """A manifest's JSON object as the runtime's objects (:mod:`khal_runtime.manifest_records`),
    typed as the model they mirror."""
    return cast("Manifest", _Records(data))


def _confined(m: Any, source: str) -> None:
    """Every path the runtime will read is inside the package (the lexical check the models'
    validators make; :func:`khal_runtime.verify.artifact_path` resolves symlinks at use)."""
    for crate in m.crates:
        for path in [a.path for a in crate.artifacts] + [t.path for e in crate.entries for t in e.webgpu or ()]:
            try:
                package_path(path)
            except ValueError as exc:
                raise ManifestError(f"{source}: crate {crate.name!r}: {exc}; rebuild the package") from None


def _digest_matches(path: Path, data: bytes) -> bool:
    try:
        want = read_regular_file(path.with_name(DIGEST_NAME), _DIGEST_BYTES, "the manifest digest", ManifestError)
    except (OSError, ManifestError):  # (no digest: a manifest not written by a build of ours)
        return False
    return want.strip() == manifest_digest(data).encode()


def load_manifest(path: Path) -> Manifest:
    """The manifest at ``path`` (``<package>/_khal/manifest.json``): read without validation when
    its digest says the build wrote it through this runtime's models, else validated in full
    (the module docstring says what is checked on each path). Raises ManifestError."""
    return read_manifest(path)[0]


def read_manifest(path: Path) -> tuple[Manifest, bool]:
    """:func:`load_manifest`, and whether the build's digest vouched for the bytes (then
    :func:`khal_runtime.kernels.load` recomputes a crate's entry hashes at its first use, not at
    import: an import costs nothing per entry)."""
    path = Path(path)
    try:
        data = read_regular_file(path, MAX_MANIFEST_BYTES, "the manifest", ManifestError)
    except FileNotFoundError:
        data = None
    if data is not None and _digest_matches(path, data):
        try:
            obj = json.loads(data)
            version = obj["schema_version"]
            if version == SCHEMA_VERSION:
                m = _Records(obj)
                _confined(m, str(path))
                return cast("Manifest", m), True
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # (a digest that matches bytes no build of ours wrote: the models say what is wrong)
    from khal_runtime import manifest as models  # lazy: pydantic, for a manifest the build did not vouch for

    if data is None:
        return models.load_manifest(path), False  # (its error: no manifest, and why)
    models.parse_manifest(data, str(path))  # the named ManifestError of a manifest that is not valid
    return records(json.loads(data)), False
