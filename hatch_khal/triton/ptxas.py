"""The release of a ptxas (``ptxas --version``), spelled one way for the build and its Triton
worker: the worker reports the release of the ptxas Triton used, the build checks it against the
one it assembles cubins with (:func:`hatch_khal.triton.language.ptxas_tool`). No imports beyond
the standard library: the worker loads it beside Triton."""

from __future__ import annotations

import functools
import re
import subprocess

__all__ = ["tool_release"]

_RELEASE = re.compile(r"release (\d+\.\d+), V([\d.]+)")


@functools.lru_cache(maxsize=None)
def tool_release(path: str) -> str | None:
    """``"12.8 (V12.8.93)"`` for the ptxas at ``path``, or None when it does not run or say."""
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _RELEASE.search(run.stdout) if run.returncode == 0 else None
    return f"{m.group(1)} (V{m.group(2)})" if m else None
