"""``python -m example_shader_pkg.demo --backend webgpu`` from the example wheel, small, on the
adapter wgpu-py finds (lavapipe on CPU machines): the Slang particle step, direct / indirect /
recorded replay, each agreeing with the NumPy reference (the CUDA twin:
tests/runtime/cuda/test_graphs_gpu.py::test_slang_demo_small_on_cuda)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.slang import needs_slang_or_wheel

pytestmark = [pytest.mark.webgpu, needs_slang_or_wheel]

ROOT = Path(__file__).resolve().parents[3]


def test_slang_demo_small_on_webgpu(example_site: Path) -> None:
    path = os.pathsep.join([str(example_site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    e = dict(os.environ, PYTHONPATH=path, KHAL_BACKEND="auto", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-m", "example_shader_pkg.demo", "--backend", "webgpu",
                        "--particles", "2000", "--steps", "5"], env=e, capture_output=True, text=True,
                       timeout=600, cwd=example_site)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "Slang particle step: 2000 particles, 5 steps", r.stdout
    rows = [ln.split() for ln in lines if ln.startswith("webgpu ")]
    assert [row[1] for row in rows] == ["direct", "indirect", "graph"], r.stdout
    for row in rows:
        assert row[4] == "same", r.stdout
        detail = " ".join(row[5:])
        assert "alive=" in detail and "energy=" in detail, r.stdout
    # the three modes run the same arithmetic: the same survivors and energy
    assert len({" ".join(row[5:]) for row in rows}) == 1, r.stdout
    assert any(ln.startswith("webgpu: ") and "(" in ln for ln in lines), r.stdout  # the adapter line
