"""The example's lock file is what its warm-up records (example_shader_pkg/record_warmup.py, the
command its docstring and docs/guide/triton.md give): recorded again with Triton's interpreter on
the CPU, it holds exactly the committed variants. A change to the host code or the kernels that
changes a launch's specialisation fails here until the lock is recorded again.

Needs Triton, a CPU torch and NumPy < 2.4 (Triton 3.6's interpreter turns a program id into a Python
int with ``int()`` of a one-element array, which NumPy 2.4 refuses: the softmax's loop over rows);
skipped, saying which, without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hatch_khal.triton import lock
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.needs_triton

EXAMPLE = ROOT / "example_shader_pkg"


def test_recording_the_warmup_again_gives_the_committed_lock(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="records CPU torch tensors: needs torch")
    import numpy as np

    if tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 4):
        pytest.skip(f"Triton 3.6's interpreter needs NumPy < 2.4 for the softmax (NumPy {np.__version__})")
    out = tmp_path / "khal-triton.lock"
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, "-m", "hatch_khal", "triton", "record", "--lock", str(out), "--",
                           sys.executable, "record_warmup.py"], cwd=EXAMPLE, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "record_warmup: ok" in proc.stdout
    got = sorted(v.canonical() for v in lock.read(out))
    assert got == sorted(v.canonical() for v in lock.read(EXAMPLE / "khal-triton.lock"))
    assert out.read_text() == (EXAMPLE / "khal-triton.lock").read_text()  # the file itself, byte for byte
