"""Builds split across machines: ``python -m hatch_khal shard`` on each, ``merge`` into the wheel.
Two shards merged give the wheel of a single build, byte for byte, compiling nothing; a merge with a
missing, duplicated or mismatched shard fails naming it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hatch_khal.errors import ConfigError, MergeError
from hatch_khal.shards import merge_plan, parse_shard, read_shard
from tests.conftest import build_env
from tests.helpers.projects import make_project

pytestmark = pytest.mark.needs_nvrtc
pytest.importorskip("pyproject_hooks")

EPOCH = {"SOURCE_DATE_EPOCH": "1700000000", "KHAL_CACHE_URL": "none"}


def _cli(*args: str, cache: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
    e = build_env(cache, **EPOCH, **env)
    e.pop("KHAL_SHARD", None)
    e.update(env)
    out = subprocess.run([sys.executable, "-m", "hatch_khal", *args], capture_output=True, text=True, env=e,
                         timeout=600)
    if check:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The small project, its two shards (each on its own 'machine': its own cache) and a single build."""
    tmp = tmp_path_factory.mktemp("shards")
    root = make_project(tmp / "proj")
    for i in (1, 2):
        out = _cli("shard", "--shard", f"{i}/2", "--out", str(tmp / f"s{i}"), str(root), cache=tmp / f"cache{i}")
        # the PTX of each crate is compiled by its front stage in every shard (indirect variants' launch facts)
        assert f"shard {i}/2: 2 of 4 compile job(s), 1 compiled, 1 from the cache" in out.stdout, out.stdout
    single = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
                             str(tmp / "single"), str(root)], capture_output=True, text=True, timeout=600,
                            env=build_env(tmp / "cache-single", **EPOCH))
    assert single.returncode == 0, single.stderr[-3000:]
    return {"root": root, "s1": tmp / "s1", "s2": tmp / "s2", "single": next((tmp / "single").glob("*.whl")),
            "tmp": tmp}


def test_two_shards_merged_are_the_single_build_byte_for_byte(built: dict[str, Path]) -> None:
    tmp = built["tmp"]
    out = _cli("merge", str(built["s2"]), str(built["s1"]), "--project", str(built["root"]), "--wheel-dir",
               str(tmp / "merged"), cache=tmp / "cache-merge-unused")
    (wheel,) = (tmp / "merged").glob("*.whl")
    assert wheel.name == built["single"].name
    assert wheel.read_bytes() == built["single"].read_bytes()
    assert "0 compiled, 4 from cache" in out.stdout + out.stderr  # the hook's summary: nothing compiled
    assert not (tmp / "cache-merge-unused").exists()  # the merge used the shards' outputs only


def test_a_missing_shard_is_named(built: dict[str, Path]) -> None:
    with pytest.raises(MergeError, match=r"shard 2/2 is missing \(given: 1/2\)"):
        merge_plan([read_shard(built["s1"])])


def test_a_shard_given_twice_is_named(built: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "s1-again"
    shutil.copytree(built["s1"], copy)
    with pytest.raises(MergeError, match=f"shard 1/2 is given twice: {built['s1']} and {copy}"):
        merge_plan([read_shard(built["s1"]), read_shard(copy), read_shard(built["s2"])])


def test_a_shard_of_another_toolchain_is_named(built: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "s2-other"
    shutil.copytree(built["s2"], other)
    record = json.loads((other / "khal-shard.json").read_text())
    real = record["toolchain"]["nvrtc"]
    record["toolchain"]["nvrtc"] = "12.9.86"
    (other / "khal-shard.json").write_text(json.dumps(record))
    with pytest.raises(MergeError, match=f"shard 2/2 \\({other}\\) was built with nvrtc 12.9.86, shard 1/2 .* with {real}"):
        merge_plan([read_shard(built["s1"]), read_shard(other)])


def test_a_shard_of_other_sources_or_options_is_named(built: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "edited"
    shutil.copytree(built["root"], root)
    (root / "kernels/alpha/scale.cu").write_text((root / "kernels/alpha/scale.cu").read_text() + "\n// edited\n")
    _cli("shard", "--shard", "2/2", "--out", str(tmp_path / "s2-edited"), str(root), cache=tmp_path / "c1")
    with pytest.raises(MergeError, match=r"crate 'alpha': shard 2/2 \(.*s2-edited\) was built from other sources or "
                                         r"options than shard 1/2"):
        merge_plan([read_shard(built["s1"]), read_shard(tmp_path / "s2-edited")])
    # other archs: the same sources, other compile jobs
    _cli("shard", "--shard", "2/2", "--out", str(tmp_path / "s2-archs"), str(built["root"]), cache=tmp_path / "c2",
         KHAL_CUDA_ARCHS="sm_80")
    with pytest.raises(MergeError, match=r"plan other compile jobs \(crate 'alpha' for sm_80 is in one only\)"):
        merge_plan([read_shard(built["s1"]), read_shard(tmp_path / "s2-archs")])


def test_merging_in_a_changed_checkout_fails_naming_the_crate(built: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "moved-on"
    shutil.copytree(built["root"], root)
    (root / "kernels/beta/fill.cu").write_text((root / "kernels/beta/fill.cu").read_text() + "\n// a later commit\n")
    out = _cli("merge", str(built["s1"]), str(built["s2"]), "--project", str(root), "--wheel-dir",
               str(tmp_path / "w"), cache=tmp_path / "c", check=False)
    assert out.returncode != 0 and not list((tmp_path / "w").glob("*.whl"))
    assert "crate 'beta': the shards were built from other sources or options" in out.stdout + out.stderr


def test_shard_specs() -> None:
    assert parse_shard("2/8").label == "2/8"
    assert parse_shard("arch=sm_90,sm_80").values == ("sm_80", "sm_90")
    assert parse_shard("crate=core").kind == "crate"
    for bad, says in (("0/8", "numbered 1 to 8"), ("9/8", "does not exist"), ("half", "not a shard"),
                      ("arch=", "not a shard")):
        with pytest.raises(ConfigError, match=says):
            parse_shard(bad)


def test_a_wheel_build_with_khal_shard_set_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.build import build

    monkeypatch.setenv("KHAL_SHARD", "1/2")
    with pytest.raises(ConfigError, match="KHAL_SHARD='1/2' is set, and this is a wheel build.*python -m hatch_khal merge"):
        build(make_project(tmp_path / "p"), None)


def test_shards_by_crate_cover_the_build(built: dict[str, Path], tmp_path: Path) -> None:
    for crate in ("alpha", "beta"):
        _cli("shard", "--shard", f"crate={crate}", "--out", str(tmp_path / crate), str(built["root"]),
             cache=tmp_path / f"c-{crate}")
    merged = merge_plan([read_shard(tmp_path / "alpha"), read_shard(tmp_path / "beta")])
    assert sorted(set(merged["shards"].values())) == ["crate=alpha", "crate=beta"]
    with pytest.raises(MergeError, match=r"no shard built crate 'beta' for compute_75 \(and 1 more job\(s\)\)"):
        merge_plan([read_shard(tmp_path / "alpha")])
    out = _cli("shard", "--shard", "crate=gamma", "--out", str(tmp_path / "g"), str(built["root"]),
               cache=tmp_path / "c-g", check=False)
    assert out.returncode == 2 and "no compile job of this build is for gamma; its crates are alpha, beta" in out.stderr


@pytest.mark.slow
def test_the_example_in_two_shards_merged_is_its_single_build(tmp_path: Path) -> None:
    """The example (CUDA C++, CCCL, Slang and Triton crates), one arch: two shard jobs and the merge
    job make the wheel a single build makes, byte for byte."""
    pytest.importorskip("slangpy")
    pytest.importorskip("triton")
    root = tmp_path / "example"
    shutil.copytree(Path(__file__).resolve().parents[2] / "example_shader_pkg", root,
                    ignore=shutil.ignore_patterns("_khal", "__pycache__", "dist", "build"))
    env = {"KHAL_CUDA_ARCHS": "sm_90"}
    for i in (1, 2):
        _cli("shard", "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}"), str(root), cache=tmp_path / f"c{i}", **env)
    out = _cli("merge", str(tmp_path / "s1"), str(tmp_path / "s2"), "--project", str(root), "--wheel-dir",
               str(tmp_path / "merged"), cache=tmp_path / "unused", **env)
    assert "0 compiled" in out.stdout + out.stderr
    single = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
                             str(tmp_path / "single"), str(root)], capture_output=True, text=True, timeout=900,
                            env=build_env(tmp_path / "c-single", **EPOCH, **env))
    assert single.returncode == 0, single.stderr[-3000:]
    (merged,) = (tmp_path / "merged").glob("*.whl")
    (one,) = (tmp_path / "single").glob("*.whl")
    assert merged.read_bytes() == one.read_bytes()


def test_merge_splits_a_wheel_above_max_size(built: dict[str, Path]) -> None:
    tmp = built["tmp"]
    out = _cli("merge", str(built["s1"]), str(built["s2"]), "--project", str(built["root"]), "--wheel-dir",
               str(tmp / "merged-split"), "--max-size", "1kB", cache=tmp / "unused-2")
    wheels = [Path(line).name for line in out.stdout.splitlines() if line.endswith(".whl") and " " not in line]
    assert wheels == ["mini_pkg-0.1.0-py3-none-any.whl", "mini_pkg_kernels_sm90-0.1.0-py3-none-any.whl"]
