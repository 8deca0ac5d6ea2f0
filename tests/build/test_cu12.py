"""A CUDA 12 build: ``nvrtc-requirement = "nvidia-cuda-nvrtc-cu12~=12.9"`` in an isolated pip
build gets NVRTC 12.9 and the ``-cu12`` header wheels from the index, and makes PTX of ISA 8.x
(which drivers of CUDA 12.9 JIT), recorded as such in the manifest."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.projects import OTHER_CU, make_project
from tests.conftest import run
from .test_wheels import check_wheel, isolated_env, wheel_manifest, wheelhouse  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

CU12 = "nvidia-cuda-nvrtc-cu12~=12.9"


def test_cu12_wheel_has_ptx_isa_8(tmp_path: Path, wheelhouse: Path, session_cache: Path) -> None:  # noqa: F811
    # a CUDA header from nvidia-cuda-runtime-cu12 (the hook adds it, matched to NVRTC)
    files = {"kernels/beta/fill.cu": "#include <cuda_fp16.h>\n" + OTHER_CU}
    proj = make_project(tmp_path / "proj", nvrtc_requirement=CU12, files=files,
                        hook='archs = ["sm_90"]\nptx-arch = "compute_75"\n')
    out = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(proj)],
        env=isolated_env(session_cache, wheelhouse))
    (whl,) = out.glob("*.whl")
    check_wheel(whl)
    with zipfile.ZipFile(whl) as zf:
        ptx = {n: zf.read(n).decode() for n in zf.namelist() if n.endswith(".ptx")}
    assert len(ptx) == 2  # alpha and beta, compute_75 each
    for name, text in ptx.items():
        version = next(line for line in text.splitlines() if line.startswith(".version"))
        assert version.startswith(".version 8."), (name, version)
    m = wheel_manifest(whl)
    assert m["toolchain"]["nvrtc_version"].startswith("12."), m["toolchain"]
    cuda = [a for c in m["crates"] for a in c["artifacts"] if a["kind"] in ("ptx", "cubin")]
    assert {a["arch"] for a in cuda} == {"sm_90", "compute_75"}
    assert all(a["ptx_isa"].startswith("8.") for a in cuda if a["kind"] == "ptx")
