"""The benchmarks build their kernels with hatch_khal's own stages (``benchmarks/_common.py``), but
run only on a GPU machine: their build half is checked here, on the CPU, so a change to the build
stages cannot break them unseen (a stage record's field renamed broke every launch, graph and torch
benchmark on the H200 once)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

pytestmark = pytest.mark.needs_nvrtc


@pytest.fixture(scope="module")
def common():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _common

        yield _common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_launch_bench_package_builds_and_its_unit_names_its_symbols(common, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pkg = common.build_bench_package(["sm_90"], where=tmp_path)
    manifest = pkg.package_dir / "_khal" / "manifest.json"
    assert manifest.is_file()
    assert pkg.symbols and all(sym in pkg.unit_text for sym in pkg.symbols.values())
    assert pkg.arch == "sm_90"


def test_the_unit_of_a_crate_is_the_builders(common) -> None:  # type: ignore[no-untyped-def]
    core = sorted((ROOT / "example_shader_pkg" / "kernels" / "core").glob("*.cu"))
    text = common.generated_unit_text(ROOT, "core", core)
    assert "extern \"C\"" in text and "_khal_" in text
