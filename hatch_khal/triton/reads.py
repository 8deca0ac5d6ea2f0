"""What a Triton crate's compile read, on the build's side: the workers' records
(:mod:`hatch_khal.triton.audit`) merged, checked and made into facts of the crate.

* Read from outside the project and every installed distribution: :class:`UncoveredReadError`
  naming the files (an edit to them would rebuild nothing).
* A project file read that changed since it was read (in a compile, between two workers' imports,
  or before the output is cached), or that two workers read with different bytes:
  :class:`SourceChangedError` naming it, nothing cached.
* The facts (:meth:`TritonReads.record`: the Python version, each installed distribution read by
  name and version, each project file by its path under the project root and its sha256, an
  absent one as absent) enter the crate's content hash, and so every entry hash; the project's
  files join the crate's manifest ``sources`` (an editable install rechecks them at load).
* A cached Triton output is taken only while its facts still hold (:meth:`TritonReads.stale`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from hatch_khal.errors import SourceChangedError, UncoveredReadError
from hatch_khal.hashing import canonical, sha256_bytes
from hatch_khal.model import CoveredFile
from hatch_khal.reads import changed
from hatch_khal.sources import SourceFile
from hatch_khal.triton.audit import python_identity

__all__ = ["ProjectRead", "TritonReads", "content_with_reads"]


@dataclass(frozen=True)
class ProjectRead:
    """A project file a compile read: its path under the project root, its sha256 (None: looked
    for and absent), and its size and mtime when first read."""

    rel: str
    sha256: str | None
    size: int = -1
    mtime_ns: int = -1

    def path(self, root: Path) -> Path:
        return root.joinpath(*self.rel.split("/"))


@dataclass(frozen=True)
class TritonReads:
    python: str
    dists: tuple[tuple[str, str], ...] = ()
    project: tuple[ProjectRead, ...] = ()

    @staticmethod
    def merge(crate: str, answers: Iterable[dict[str, Any]]) -> TritonReads:
        """The workers' records as one (their ``reads``); raises UncoveredReadError for a file
        read from outside, SourceChangedError for a project file two workers read differently."""
        pythons: set[str] = set()
        dists: set[tuple[str, str]] = set()
        project: dict[str, ProjectRead] = {}
        outside: set[str] = set()
        for answer in answers:
            reads = answer.get("reads") or {}
            pythons.add(str(reads.get("python", "")))
            dists |= {(str(n), str(v)) for n, v in reads.get("dists", [])}
            outside |= {str(p) for p in reads.get("outside", [])}
            for rel, sha, size, mtime in reads.get("project", []):
                got = ProjectRead(str(rel), sha, int(size), int(mtime))
                had = project.setdefault(got.rel, got)
                if had.sha256 != got.sha256:
                    raise SourceChangedError(f"crate {crate!r}: {got.rel} changed between the Triton workers' imports "
                                             "of the crate; nothing was cached: build again")
        if outside:
            shown = ", ".join(sorted(outside)[:5]) + (f" and {len(outside) - 5} more" if len(outside) > 5 else "")
            raise UncoveredReadError(
                f"crate {crate!r}: importing and compiling its Triton sources read {shown}, which is neither in the "
                "project nor in an installed distribution, so an edit to it would not rebuild the crate; move it "
                "into the project, or install what it belongs to as a package (a pinned version counts)")
        python = sorted(pythons)[-1] if pythons else python_identity()
        return TritonReads(python=python, dists=tuple(sorted(dists)),
                           project=tuple(project[k] for k in sorted(project)))

    @staticmethod
    def from_record(data: dict[str, Any]) -> TritonReads:
        """The facts as a cached answer holds them (:meth:`as_json`)."""
        return TritonReads(python=str(data["python"]), dists=tuple((str(n), str(v)) for n, v in data["dists"]),
                           project=tuple(ProjectRead(str(r), s, int(z), int(m)) for r, s, z, m in data["project"]))

    def as_json(self) -> dict[str, Any]:
        return {"python": self.python, "dists": [list(d) for d in self.dists],
                "project": [[p.rel, p.sha256, p.size, p.mtime_ns] for p in self.project]}

    def record(self) -> dict[str, Any]:
        """What the crate's content hash takes: no stat, no absolute path (a build elsewhere hashes the same)."""
        return {"python": self.python, "dists": [list(d) for d in self.dists],
                "project": [[p.rel, p.sha256] for p in self.project]}

    def check_unchanged(self, crate: str, root: Path) -> None:
        """SourceChangedError naming the first project file that changed since it was read (or that
        appeared where it was absent)."""
        for p in self.project:
            path = p.path(root)
            if p.sha256 is None:
                if os.path.lexists(path):
                    raise SourceChangedError(f"crate {crate!r}: {p.rel}, which its Triton sources looked for and did "
                                             "not find, appeared while the crate compiled; nothing was cached: build again")
                continue
            why = changed(CoveredFile(str(path), p.rel, p.sha256, p.size, p.mtime_ns))
            if why is not None:
                raise SourceChangedError(f"crate {crate!r}: {p.rel}, which its Triton sources read, changed while the "
                                         f"crate compiled ({why}); nothing was cached: build again")

    def stale(self, root: Path) -> str | None:
        """Why a cached output with these facts no longer holds (a project file changed, appeared or
        went; a distribution is no longer installed at that version; another Python), or None."""
        if self.python != python_identity():
            return f"it was compiled under {self.python}, this is {python_identity()}"
        for name, version in self.dists:
            if not any(str(d.version) == version for d in metadata.distributions(name=name)):
                return f"it read {name} {version}, which is no longer installed"
        for p in self.project:
            path = p.path(root)
            if p.sha256 is None:
                if os.path.lexists(path):
                    return f"{p.rel}, which its sources looked for and did not find, exists now"
                continue
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                return f"{p.rel}, which its sources read, is gone"
            if digest != p.sha256:
                return f"{p.rel}, which its sources read, changed"
        return None

    def files(self, crate: str, root: Path) -> list[SourceFile]:
        """The project files read, as the crate's manifest lists them (and the compile jobs check):
        their bytes now, which must be the ones read."""
        out = []
        for p in self.project:
            if p.sha256 is None:
                continue
            path = p.path(root)
            try:
                st = path.stat()
                data = path.read_bytes()
            except OSError as exc:
                raise SourceChangedError(f"crate {crate!r}: {p.rel}, which its Triton sources read, can no longer be "
                                         f"read ({exc.strerror or exc}): build again") from None
            if hashlib.sha256(data).hexdigest() != p.sha256:
                raise SourceChangedError(f"crate {crate!r}: {p.rel}, which its Triton sources read, changed while the "
                                         "crate built; nothing was cached: build again")
            out.append(SourceFile(path=path, rel=p.rel, data=data, size=st.st_size, mtime_ns=st.st_mtime_ns))
        return out


def content_with_reads(planned: str, reads: TritonReads) -> str:
    """The crate's content hash once its compile's reads are known: the plan's, and the reads' facts."""
    return sha256_bytes(canonical({"planned": planned, "reads": reads.record()}))
