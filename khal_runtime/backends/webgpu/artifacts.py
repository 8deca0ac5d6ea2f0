"""An entry's WGSL / SPIR-V artifact, read from its package and checked before any GPU use.

:func:`entry_code` is what the generic layer hands to :class:`~.kernel.KernelPlan` (as its
``code``, or through :func:`code_loader` so that the file is read only on the pipeline's first
creation): the artifact the target names, confined to the package, with the manifest's size
and sha256 (:func:`khal_runtime.verify.read_artifact`), whose entry point carries the entry's
hash: a WGSL ``fn <entry>_khal_<hash>(``, a SPIR-V ``OpEntryPoint`` name; and whose own
bindings, scalar block and struct layouts are the manifest's
(:func:`khal_runtime.verify.webgpu_layout_problems`: a ManifestError naming the field). Anything
else is an ArtifactError or HashMismatchError saying to rebuild.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from khal_runtime.abi import split_symbol
from khal_runtime.binaries import BinaryFormatError, webgpu_entry_points
from khal_runtime.errors import ArtifactError, HashMismatchError
from khal_runtime.verify import read_artifact, webgpu_layout_problems

if TYPE_CHECKING:
    from khal_runtime.manifest import Crate, Entry, WebGpuTarget

__all__ = ["code_loader", "entry_code"]

def entry_code(package_dir: str | Path, crate: Crate, entry: Entry, target: WebGpuTarget) -> bytes:
    """The checked bytes of ``entry``'s ``target`` artifact in the package at ``package_dir``."""
    art = next((a for a in crate.artifacts if a.path == target.path), None)
    name = f"{crate.name}.{entry.name}"
    if art is None or art.kind != target.target:
        raise ArtifactError(f"entry {name}: its {target.target} artifact {target.path!r} is not in the "
                            "manifest's artifacts; rebuild the package")
    data = read_artifact(Path(package_dir), art)
    try:
        names = webgpu_entry_points(data, target.target, target.path)
    except BinaryFormatError as exc:
        raise ArtifactError(f"entry {name}: {exc}; rebuild the package") from None
    if target.entry_point not in names:
        found = None
        for n in names:
            parts = split_symbol(n)
            if parts is not None and parts[0] == entry.name:
                found = parts[1]
                break
        what = f"its entry point carries hash {found}" if found else \
            f"it has no entry point {target.entry_point!r}"
        raise HashMismatchError(
            f"entry {name}: the {target.target} artifact {target.path!r} does not match the manifest "
            f"({what}, the manifest expects {entry.hash}); rebuild the package",
            entry=entry.name, expected=entry.hash, found=found)
    problems = webgpu_layout_problems(crate, entry, target, data)
    if problems:
        raise problems[0].exception()
    return data


def code_loader(package_dir: str | Path, crate: Crate, entry: Entry, target: WebGpuTarget) -> Callable[[], bytes]:
    """:func:`entry_code`, deferred: what :class:`~.kernel.KernelPlan` calls on a pipeline miss."""
    return lambda: entry_code(package_dir, crate, entry, target)
