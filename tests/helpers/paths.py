"""Where things are, for tests at any depth of ``tests/``: the repository root and the test shader
packages (``tests/packages/``)."""

from __future__ import annotations

from pathlib import Path

#: the repository root (hatch_khal/, khal_runtime/, example_shader_pkg/, tests/)
ROOT = Path(__file__).resolve().parents[2]
#: the test shader packages (real_kernels_pkg, geometry_kernels_pkg, ...), built by the tests that use them
PACKAGES = ROOT / "tests" / "packages"
