"""Stage 4: write a package's kernels to disk (``<package>/_khal/``), and nothing else.

The build replaces a ``_khal`` folder only when it is its own: one holding a manifest
written by hatch-khal. Anything else there (a user's folder of that name, a symlink, a
file) is refused with an :class:`~hatch_khal.errors.OutputError`, never deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from khal_runtime.manifest import MANIFEST_DIR, MANIFEST_NAME, MAX_MANIFEST_BYTES, read_regular_file

from hatch_khal.errors import OutputError
from hatch_khal.model import PackageOutput

__all__ = ["is_khal_output", "remove_output", "write_package_output"]


class _NotOurs(Exception):
    pass


def is_khal_output(folder: Path) -> bool:
    """Whether ``folder`` is a ``_khal`` folder written by hatch-khal (any schema version)."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        data = json.loads(read_regular_file(folder / MANIFEST_NAME, MAX_MANIFEST_BYTES, "manifest", _NotOurs))
    except (OSError, ValueError, _NotOurs):
        return False
    toolchain = data.get("toolchain") if isinstance(data, dict) else None
    return (isinstance(data, dict) and isinstance(data.get("schema_version"), int)
            and isinstance(toolchain, dict) and isinstance(toolchain.get("hatch_khal_version"), str))


def _check_ours(target: Path) -> None:
    if (target.exists() or target.is_symlink()) and not is_khal_output(target):
        what = "a symlink" if target.is_symlink() else "a folder" if target.is_dir() else "a file"
        raise OutputError(
            f"{target} is {what} that was not written by hatch-khal (it holds no manifest of ours); "
            f"hatch-khal writes the package's kernels to {MANIFEST_DIR}/ and would replace it: "
            "move or rename it"
        )


def remove_output(package_dir: Path) -> bool:
    """Remove ``<package_dir>/_khal`` if hatch-khal wrote it; OutputError if something else is there."""
    target = package_dir / MANIFEST_DIR
    if not (target.exists() or target.is_symlink()):
        return False
    _check_ours(target)
    shutil.rmtree(target)
    return True


def write_package_output(out: PackageOutput, package_dir: Path) -> list[Path]:
    """Write manifest + artifacts under ``package_dir``, replacing its ``_khal`` if it is ours."""
    target = package_dir / MANIFEST_DIR
    _check_ours(target)
    package_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".khal-", dir=package_dir))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the package's files are not
    written = []
    try:
        for rel, data in sorted(out.files.items()):
            assert rel.startswith(MANIFEST_DIR + "/")
            dest = tmp / rel[len(MANIFEST_DIR) + 1 :]
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            written.append(target / rel[len(MANIFEST_DIR) + 1 :])
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=".khal-old-", dir=package_dir))
            os.replace(target, old / MANIFEST_DIR)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written
