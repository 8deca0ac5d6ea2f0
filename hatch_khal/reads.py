"""What the compiler read, checked against what the content hash covers, before anything is cached.

The content hash of a crate covers the files the hook finds before compiling (:mod:`hatch_khal.sources`);
the compiler says afterwards which files it opened (NVRTC: the ``Processing Header File`` events of
``--fdevice-time-trace``). Every file it read must be

* one the hash covers, still with the bytes and the stat it was hashed with (an edit during the
  compile, even one reverted, changes the stat): else :class:`~hatch_khal.errors.SourceChangedError`,
  nothing cached;
* under a folder whose identity the key holds (hatch-khal's include folder, the CUDA header
  folders: :attr:`~hatch_khal.model.CompileJob.covered_dirs`);
* or one of the compiler's built-in headers (a bare name that is no file, such as NVRTC's
  ``__nv_nvrtc_builtin_header.h``);

else :class:`~hatch_khal.errors.UncoveredReadError` names it: the build is refused, since an edit to
it would not rebuild the crate.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterable

from hatch_khal.errors import SourceChangedError, UncoveredReadError
from hatch_khal.model import CompileJob, CoveredFile
from hatch_khal.sources import SourceFile

__all__ = ["changed", "check_reads", "cover", "locations", "real_dirs", "spelled_locations"]


def cover(files: Iterable[SourceFile]) -> tuple[CoveredFile, ...]:
    """The hashed files as a job carries them (real paths; bytes' sha256 and the stat of the hash)."""
    return tuple(CoveredFile(os.path.realpath(f.path), f.rel, hashlib.sha256(f.data).hexdigest(), f.size,
                             f.mtime_ns) for f in files)


def real_dirs(dirs: Iterable[Path | str]) -> tuple[str, ...]:
    out: list[str] = []
    for d in dirs:
        r = os.path.realpath(d)
        if r not in out:
            out.append(r)
    return tuple(out)


def changed(f: CoveredFile) -> str | None:
    """How ``f`` differs now from when it was hashed ("its content changed", ...), or None."""
    try:
        st = os.stat(f.path)
        if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
            return "it was modified" if os.path.isfile(f.path) else "it is no longer a file"
        data = Path(f.path).read_bytes()
    except OSError as exc:
        return f"it can no longer be read ({exc.strerror or exc})"
    return None if hashlib.sha256(data).hexdigest() == f.sha256 else "its content changed"


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_reads(job: CompileJob, reads: Iterable[str]) -> None:
    """Raise unless every file ``job``'s compile read is covered and unchanged (module docstring)."""
    by_path = {c.path: c for c in job.covered}
    by_key = {c.key: c for c in job.covered}
    uncovered: list[str] = []
    for name in dict.fromkeys(reads):
        # a hashed file's key: the name a generated ``#line`` gives (NVRTC lists those too)
        hashed = by_key.get(name)
        if hashed is None:
            if not os.path.isabs(name) and not os.path.lexists(name):
                continue  # a built-in header of the compiler (no such file), or a #line name
            hashed = by_path.get(os.path.realpath(name))
        real = os.path.realpath(name)
        if hashed is not None:
            why = changed(hashed)
            if why is not None:
                raise SourceChangedError(
                    f"crate {job.crate!r}: {hashed.key} changed while the crate compiled for {job.target} "
                    f"({why}); nothing of this compile was cached: build again"
                )
            continue
        if any(_under(real, d) for d in job.covered_dirs):
            continue
        uncovered.append(name)
    if uncovered:
        shown = ", ".join(uncovered[:5]) + (f" and {len(uncovered) - 5} more" if len(uncovered) > 5 else "")
        raise UncoveredReadError(
            f"crate {job.crate!r}: the compiler read {shown}, which the crate's content hash does not "
            "cover (it is outside the crate's source folders and 'include-dirs', or hidden, or in a "
            "folder the hook skips: __pycache__, node_modules, *.egg-info, a virtual environment, _khal, "
            "or a *.pyc file), so an edit to it would not rebuild the crate; move it into the crate's "
            "folders, add its folder to the crate's 'include-dirs', or rename it (a hidden file: no "
            "leading '.')"
        )


def locations(dirs: Iterable[Path | str]) -> tuple[str, ...]:
    """The absolute folders given to the compiler, each as given (normalised) and as its real path."""
    out: list[str] = []
    for d in dirs:
        for form in (os.path.normpath(os.path.abspath(d)), os.path.realpath(d)):
            if form not in out:
                out.append(form)
    return tuple(out)


def _ptx_string(text: str) -> bytes:
    """How PTX spells a string constant: ``.b8 name[N] = {47, 116, ...}`` (its bytes in decimal)."""
    return ", ".join(str(b) for b in text.encode()).encode()


def spelled_locations(job: CompileJob, data: bytes) -> tuple[str, ...]:
    """The locations of ``job`` (:attr:`~hatch_khal.model.CompileJob.locations`) that its output
    spells (``__FILE__``, line info: raw in a cubin, raw or as decimal bytes in PTX), plus, when the
    crate's files use ``__FILE__`` and kin (:attr:`~hatch_khal.model.CompileJob.names_paths`), all
    of its project side (the optimiser may fold a path into code no scan finds). A cached output is
    a hit only where the compile is given those same locations: a checkout elsewhere recompiles."""
    out = [loc for loc in job.locations if loc.encode() in data or _ptx_string(loc) in data]
    if job.names_paths:
        tools = set(job.covered_dirs)
        out += [loc for loc in job.locations if loc not in out and loc not in tools]
    return tuple(out)
