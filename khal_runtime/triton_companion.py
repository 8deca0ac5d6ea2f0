"""A companion crate (``Crate.triton.serves``: another library's Triton kernels, built from that
library's installed modules) serves only the library it was built from: the same distribution
version, the same module files (sha256). Anything else is refused by name, with what to do.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from khal_runtime.errors import TritonServeError

if TYPE_CHECKING:
    from khal_runtime.manifest import ServedLibrary
    import importlib.metadata

__all__ = ["check_companion"]


def _module_file(dist: importlib.metadata.Distribution, path: str) -> Path | None:
    """The installed file of ``path`` (``liger_kernel/ops/rms_norm.py``): where the distribution's
    record puts it, else under its top-level package as the import system finds it (editable installs)."""
    located = Path(str(dist.locate_file(path)))
    if located.is_file():
        return located
    top = path.split("/", 1)[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(loc).parent / path
        if candidate.is_file():
            return candidate
    return None


def check_companion(package: str, crate: str, serves: ServedLibrary) -> None:
    """Refuse (:class:`TritonServeError`) to serve a library other than the one ``crate`` was built
    from: another installed version, a module file whose sha256 differs, or none installed."""
    dist_name, pinned = serves.distribution, serves.version
    rebuild = (f"install the version it was built for (pip install '{dist_name}=={pinned}'), or rebuild "
               f"{package!r} with the installed {dist_name} in its build environment (python -m build / pip wheel "
               "in the companion's project)")
    who = f"package {package!r} (crate {crate!r}) serves the Triton kernels of {dist_name} {pinned}"
    import importlib.metadata  # lazy: companions only (tens of ms to import)

    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise TritonServeError(f"{who}, and {dist_name} is not installed: pip install '{dist_name}=={pinned}'") \
            from None
    installed = dist.version
    if installed != pinned:
        raise TritonServeError(f"{who}, but {dist_name} {installed} is installed: it refuses to serve another "
                               f"version's kernels; {rebuild}")
    for path, digest in sorted(serves.files.items()):
        found = _module_file(dist, path)
        if found is None:
            raise TritonServeError(f"{who}; {dist_name} {installed} is installed but has no {path}: {rebuild}")
        actual = hashlib.sha256(found.read_bytes()).hexdigest()
        if actual != digest:
            raise TritonServeError(
                f"{who}; {dist_name} {installed} is installed, but its {path} ({found}) is not the file the companion "
                f"was built from (sha256 {actual[:12]}..., built from {digest[:12]}...: an edited or patched "
                f"install?): it refuses to serve it; reinstall {dist_name}=={pinned}, or rebuild {package!r} against "
                "this file")
