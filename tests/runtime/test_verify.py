"""CPU-only verification: artifacts vs manifest, tampering, confinement, binary selection."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import khal_runtime
from khal_runtime.errors import (
    ArtifactError,
    HashMismatchError,
    ManifestError,
    NoCompatibleBinaryError,
    PtxTooNewError,
    StaleBuildError,
)
from khal_runtime.abi import parse_arch
from khal_runtime.backends.cuda.loader import (
    expected_param_layout,
    max_ptx_isa,
    ptx_isa_supported,
    select_candidates,
)
from khal_runtime.manifest import Artifact, load_manifest, package_path, parse_manifest
from khal_runtime.verify import artifact_path, check_package, read_artifact, verify_package
from tests.helpers.synthetic import CRATE, build_package


@pytest.fixture
def pkg(tmp_path: Path):
    return build_package(tmp_path, "synth_verify_pkg")


def _replace_artifact(pkg, kind: str, data: bytes) -> None:
    """Overwrite an artifact and fix its sha256/size in the manifest (a consistent forgery)."""
    import hashlib

    crate = pkg.manifest.crate(CRATE)
    arts = []
    for a in crate.artifacts:
        if a.kind == kind:
            (pkg.package_dir / a.path).write_bytes(data)
            a = a.model_copy(update={"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
        arts.append(a)
    crate = crate.model_copy(update={"artifacts": tuple(arts)})
    pkg.write_manifest(pkg.manifest.model_copy(update={"crates": (crate,)}))


@pytest.mark.needs_nvrtc
def test_clean_package_verifies(pkg) -> None:
    assert verify_package(pkg.package_dir) == []
    check_package(pkg.package_dir)


@pytest.mark.needs_nvrtc
def test_changed_byte_is_rejected(pkg) -> None:
    f = pkg.artifact_file("cubin")
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    problems = verify_package(pkg.package_dir)
    assert [p.kind for p in problems] == ["sha256"]
    assert "changed after the build" in problems[0].message
    with pytest.raises(ArtifactError, match="sha256"):
        check_package(pkg.package_dir)


@pytest.mark.needs_nvrtc
def test_truncated_and_missing(pkg) -> None:
    f = pkg.artifact_file("ptx")
    f.write_bytes(f.read_bytes()[:-10])
    assert [p.kind for p in verify_package(pkg.package_dir)] == ["size"]
    f.unlink()
    assert [p.kind for p in verify_package(pkg.package_dir)] == ["missing"]


@pytest.mark.needs_nvrtc
def test_swapped_cubin_of_another_build(pkg, tmp_path: Path) -> None:
    other = build_package(tmp_path / "other", "synth_other_pkg", build_id="v2")
    _replace_artifact(pkg, "cubin", other.artifact_file("cubin").read_bytes())
    problems = verify_package(pkg.package_dir)
    assert {p.kind for p in problems} == {"hash"}
    assert {p.entry for p in problems} == {"fill", "axpby", "scalars"}
    with pytest.raises(HashMismatchError) as ei:
        check_package(pkg.package_dir)
    e = ei.value
    entry = pkg.manifest.crate(CRATE).entry(e.entry)
    assert e.expected == entry.hash
    assert e.found == other.manifest.crate(CRATE).entry(e.entry).hash
    msg = str(e)
    assert entry.hash in msg and e.found in msg
    assert "pip wheel ." in msg and "pip install -e ." in msg and "CUDA_OXIDE_SHADERS_PTX_CORE" in msg


@pytest.mark.needs_nvrtc
def test_manifest_hash_edited(pkg) -> None:
    crate = pkg.manifest.crate(CRATE)
    fill = crate.entry("fill")
    forged = fill.model_copy(update={"hash": "0" * 16, "symbol": "fill_khal_" + "0" * 16})
    entries = tuple(forged if e.name == "fill" else e for e in crate.entries)
    pkg.write_manifest(pkg.manifest.model_copy(
        update={"crates": (crate.model_copy(update={"entries": entries}),)}))
    problems = verify_package(pkg.package_dir)
    assert problems and all(p.entry == "fill" for p in problems)
    # the manifest disagrees with itself, and with both binaries (cubin and PTX)
    assert [p.kind for p in problems] == ["manifest", "hash", "hash"]
    assert f"give {fill.hash}" in problems[0].message and "edited after the build" in problems[0].message
    assert f"has {fill.hash}" in problems[1].message


@pytest.mark.needs_nvrtc
def test_missing_symbol_reported_as_missing(pkg, tmp_path: Path) -> None:
    only_fill = build_package(tmp_path / "o", "synth_fill_only", entries=("fill",))
    _replace_artifact(pkg, "ptx", only_fill.artifact_file("ptx").read_bytes())
    problems = [p for p in verify_package(pkg.package_dir) if p.entry == "axpby"]
    assert problems and "missing" in problems[0].message
    assert problems[0].exception().found is None


def _raw_manifest(pkg) -> dict:
    return json.loads(pkg.manifest_path.read_text())


@pytest.mark.needs_nvrtc
@pytest.mark.parametrize("bad", ["../outside.cubin", "/etc/passwd", "_khal/../../x.cubin", "a\\b.cubin", "C:/x"])
def test_escaping_artifact_paths_are_rejected(pkg, bad: str) -> None:
    raw = _raw_manifest(pkg)
    raw["crates"][0]["artifacts"][0]["path"] = bad
    with pytest.raises(ManifestError, match="artifact path|leaves the package|relative"):
        parse_manifest(json.dumps(raw))
    # and the runtime's own check, should a manifest model get built around the validator
    art = Artifact.model_construct(kind="cubin", arch="sm_90", path=bad, sha256="0" * 64, size=1)
    with pytest.raises(ArtifactError, match="confined"):
        artifact_path(pkg.package_dir, art)


@pytest.mark.needs_nvrtc
def test_the_runtime_check_is_the_manifests_confinement_check(pkg) -> None:
    """verify.artifact_path runs the manifest's one lexical check (manifest.package_path), then
    resolves: a path the manifest refuses (here a control character) is refused by both."""
    bad = "_khal/a\x01b.cubin"
    with pytest.raises(ValueError, match="control characters"):
        package_path(bad)
    art = Artifact.model_construct(kind="cubin", arch="sm_90", path=bad, sha256="0" * 64, size=1)
    with pytest.raises(ArtifactError, match="not confined.*control characters"):
        artifact_path(pkg.package_dir, art)


@pytest.mark.needs_nvrtc
def test_symlink_out_of_the_package_is_rejected(pkg, tmp_path: Path) -> None:
    f = pkg.artifact_file("cubin")
    outside = tmp_path / "outside.cubin"
    shutil.copy(f, outside)
    f.unlink()
    os.symlink(outside, f)
    problems = verify_package(pkg.package_dir)
    assert [p.kind for p in problems] == ["path"]
    assert "outside the package" in problems[0].message
    with pytest.raises(ArtifactError, match="symlink"):
        read_artifact(pkg.package_dir, pkg.manifest.crate(CRATE).artifact("cubin"))


@pytest.mark.needs_nvrtc
def test_symlink_inside_the_package_is_fine(pkg) -> None:
    f = pkg.artifact_file("cubin")
    real = f.with_name("real.cubin")
    f.rename(real)
    os.symlink(real.name, f)
    assert verify_package(pkg.package_dir) == []


@pytest.mark.needs_nvrtc
def test_newer_schema_version_message(pkg) -> None:
    raw = _raw_manifest(pkg)
    raw["schema_version"] = 99
    pkg.manifest_path.write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match=r"newer than this runtime.*built by hatch-khal (\S+); install khal-runtime>=\1 "):
        khal_runtime.load(pkg.package_dir)


def test_missing_manifest(tmp_path: Path) -> None:
    (tmp_path / "nopkg").mkdir()
    with pytest.raises(ManifestError, match="hatch-khal hook"):
        khal_runtime.load(tmp_path / "nopkg")


@pytest.mark.needs_nvrtc
def test_editable_stale_sources(tmp_path: Path) -> None:
    pkg = build_package(tmp_path, "synth_editable_pkg", editable=True)
    assert khal_runtime.load(pkg.package_dir).entries == ["axpby", "fill", "scalars"]
    src = pkg.project_root / "kernels" / "core.cu"
    src.write_text(src.read_text() + "\n// edited\n")
    with pytest.raises(StaleBuildError, match=r"sources changed since the last build") as exc:
        khal_runtime.load(pkg.package_dir)
    # the commands that work while hatch-khal is not on an index (a plain pip install -e . does not)
    root = str(pkg.project_root.resolve())
    assert f"pip install --no-build-isolation -e {root}" in str(exc.value)
    assert f"pip install --find-links DIR -e {root}" in str(exc.value)
    assert "re-run pip install -e ." not in str(exc.value)
    assert [p.kind for p in verify_package(pkg.package_dir)] == ["stale"]
    src.unlink()
    with pytest.raises(StaleBuildError, match="missing"):
        khal_runtime.load(pkg.package_dir)


@pytest.mark.needs_nvrtc
def test_load_by_import_name(pkg, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(pkg.root))
    ks = khal_runtime.load(pkg.name)
    assert ks.fill.entry.hash == pkg.manifest.crate(CRATE).entry("fill").hash
    assert ks.crates[CRATE].axpby is ks.axpby
    with pytest.raises(AttributeError, match="no entry 'nope'"):
        ks.nope


# --- binary selection (pure) ---------------------------------------------------------------------

def _crate_with(arts: list[tuple[str, str, str | None]]):
    from khal_runtime.manifest import Crate, Entry, Param, symbol_for

    e = Entry(name="k", symbol=symbol_for("k", "0" * 16), hash="0" * 16, block_size=(64, 1, 1),
              params=(Param(name="x", kind="scalar", element_type="int32", element_size=4),))
    return Crate(name="c", package_dir="_khal/c", sources=(), content_hash="0" * 64, entries=(e,),
                 artifacts=tuple(Artifact(kind=k, arch=a, path=f"_khal/c/c.{a}.{k}", sha256="0" * 64,
                                          size=1, ptx_isa=isa) for k, a, isa in arts))


def test_ptx_isa_table() -> None:
    assert max_ptx_isa((13, 0)) == (9, 0)
    assert max_ptx_isa((12, 6)) == (8, 5)
    assert max_ptx_isa((12, 7)) == (8, 5)
    assert max_ptx_isa((12, 8)) == (8, 7)
    assert max_ptx_isa((13, 2)) == (9, 2)
    assert max_ptx_isa((14, 0)) is None  # unknown newer driver: try
    assert ptx_isa_supported("9.0", (13, 0)) and not ptx_isa_supported("9.5", (13, 0))
    assert ptx_isa_supported("9.9", (15, 1))
    assert parse_arch("sm_90a")[1:] == (9, 0, "a") and parse_arch("sm_120")[1:] == (12, 0, "")


def test_select_exact_cubin_first() -> None:
    c = _crate_with([("ptx", "compute_75", "9.0"), ("cubin", "sm_80", None), ("cubin", "sm_90", None)])
    assert select_candidates(c, (9, 0), (13, 0))[0].arch == "sm_90"
    assert [a.arch for a in select_candidates(c, (9, 0), (13, 0))] == ["sm_90", "compute_75"]


def test_select_lower_minor_cubin() -> None:
    c = _crate_with([("cubin", "sm_80", None), ("cubin", "sm_86", None), ("cubin", "sm_90", None)])
    assert select_candidates(c, (8, 9), (13, 0))[0].arch == "sm_86"
    assert select_candidates(c, (8, 0), (13, 0))[0].arch == "sm_80"


def test_arch_specific_cubin_only_exact() -> None:
    c = _crate_with([("cubin", "sm_90a", None)])
    assert select_candidates(c, (9, 0), (13, 0))[0].arch == "sm_90a"
    with pytest.raises(NoCompatibleBinaryError):
        select_candidates(c, (10, 0), (13, 0))[0]


def test_arch_specific_code_is_read_from_the_cubin_flags_and_the_ptx_target() -> None:
    from khal_runtime.binaries import cubin_arch_specific, read_binary

    # e_flags ptxas writes: ELF ABI 7 (sm_90 / sm_90a), ABI 8 (sm_100 / sm_100a)
    assert not cubin_arch_specific(0x5A055A, 7) and cubin_arch_specific(0x5A0D5A, 7)
    assert not cubin_arch_specific(0x6006402, 8) and cubin_arch_specific(0x600640A, 8)
    ptx = b".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k() { ret; }\n"
    info = read_binary(ptx)
    assert info.arch == 90 and info.arch_specific and info.arch_name == "compute_90a"
    plain = read_binary(ptx.replace(b"sm_90a", b"sm_90"))
    assert not plain.arch_specific and plain.arch_name == "compute_90"


def test_no_compatible_binary_message() -> None:
    c = _crate_with([("cubin", "sm_80", None)])
    with pytest.raises(NoCompatibleBinaryError) as ei:
        select_candidates(c, (9, 0), (13, 0), package="p", device="NVIDIA H200")[0]
    msg = str(ei.value)
    assert not isinstance(ei.value, PtxTooNewError)
    assert "sm_90" in msg and "CUDA 13.0" in msg and "cubin sm_80" in msg and "NVIDIA H200" in msg


def test_ptx_too_new() -> None:
    c = _crate_with([("ptx", "compute_75", "9.5"), ("cubin", "sm_80", None)])
    with pytest.raises(PtxTooNewError) as ei:
        select_candidates(c, (9, 0), (13, 0))[0]
    msg = str(ei.value)
    assert "9.5" in msg and "CUDA 13.0" in msg and "sm_90" in msg and "9.0" in msg
    assert select_candidates(c, (9, 0), (13, 5))[0].kind == "ptx"  # a newer driver JITs it
    assert select_candidates(c, (9, 0), (14, 0))[0].kind == "ptx"  # unknown newer driver: try


def test_ptx_for_a_newer_arch_does_not_fit() -> None:
    c = _crate_with([("ptx", "compute_100", "9.0")])
    with pytest.raises(NoCompatibleBinaryError):
        select_candidates(c, (9, 0), (13, 0))[0]


@pytest.mark.needs_nvrtc
def test_param_layout_of_mixed_scalars(pkg) -> None:
    entry = pkg.manifest.crate(CRATE).entry("scalars")
    layout = [(off, size) for _, off, size in expected_param_layout(entry)]
    assert layout == [(0, 8), (8, 8), (16, 1), (18, 2), (24, 8), (32, 4), (36, 2), (38, 1), (40, 8), (48, 2)]
    axpby = pkg.manifest.crate(CRATE).entry("axpby")
    assert [(o, s) for _, o, s in expected_param_layout(axpby)] == [
        (0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 4)]


@pytest.mark.needs_nvrtc
def test_loaded_manifest_roundtrip(pkg) -> None:
    assert load_manifest(pkg.manifest_path) == pkg.manifest
