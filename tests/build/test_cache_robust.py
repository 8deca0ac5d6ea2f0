"""The compile cache under concurrency and interruption."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.projects import HALF_CU, make_project
from tests.conftest import build_env

pytestmark = pytest.mark.needs_nvrtc  # every test here builds

BUILD_SCRIPT = """
import sys, tomllib
from pathlib import Path
from hatch_khal.builder import PrintReporter, build_packages
from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
root, cache = Path(sys.argv[1]), Path(sys.argv[2])
raw = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["khal"]
crates = parse_config(raw, default_package="mini_pkg")[1]
print("start", flush=True)
result = build_packages(root, crates, PrintReporter(), cache=Cache(cache))
print("done", result.compiled, result.cached, flush=True)
"""


def _entries_are_whole(cache: Path) -> int:
    """Every cache entry the cache would serve is complete and matches its sha256."""
    n = 0
    for meta in (cache / "v1").glob("*/*/meta.json"):
        d = meta.parent
        if d.name.startswith("."):
            continue  # a temporary directory, never looked up
        info = json.loads(meta.read_text())
        data = (d / "artifact.bin").read_bytes()
        assert hashlib.sha256(data).hexdigest() == info["sha256"], d
        n += 1
    for d in (cache / "v1").glob("*/*"):
        if d.is_dir() and not d.name.startswith("."):
            assert (d / "meta.json").is_file() and (d / "artifact.bin").is_file(), f"partial entry {d}"
    return n


def test_build_killed_mid_compile_leaves_no_partial_entry(tmp_path: Path) -> None:
    if sys.version_info < (3, 11):  # the script uses tomllib
        import pytest

        pytest.skip("needs Python 3.11")
    root = make_project(tmp_path / "p", hook='archs = ["sm_80", "sm_90"]\n', files={"kernels/beta/fill.cu": HALF_CU})
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, str(root), str(cache)],
                            stdout=subprocess.PIPE, text=True, env=build_env(cache), start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "start"
    time.sleep(1.5)  # header-heavy crate: still compiling
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _entries_are_whole(cache)
    # the next build completes and its cache is whole
    out = subprocess.run([sys.executable, "-c", BUILD_SCRIPT, str(root), str(cache)], capture_output=True,
                         text=True, env=build_env(cache), check=True).stdout
    assert "done" in out
    assert _entries_are_whole(cache) == 6  # two crates x (ptx + 2 cubins)


def test_two_builds_at_once_share_one_cache_and_give_identical_wheels(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = build_env(cache, SOURCE_DATE_EPOCH="1700000000")
    procs = []
    for name in ("a", "b"):
        proj = make_project(tmp_path / name / "proj", files={"kernels/beta/fill.cu": HALF_CU})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
             "-w", str(tmp_path / name / "dist"), str(proj)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    (wa,) = (tmp_path / "a" / "dist").glob("*.whl")
    (wb,) = (tmp_path / "b" / "dist").glob("*.whl")
    assert wa.read_bytes() == wb.read_bytes()
    assert _entries_are_whole(cache) == 4  # each key compiled and stored once: 2 crates x (ptx + sm_90)


def test_parallel_build_from_a_script_without_main_guard(tmp_path: Path) -> None:
    """Worker processes must not re-run the caller's __main__ (a setup.py, a user's script):
    a multiprocessing 'spawn' pool would, and every worker would start the build again."""
    if sys.version_info < (3, 11):  # the script uses tomllib
        import pytest

        pytest.skip("needs Python 3.11")
    root = make_project(tmp_path / "p", hook='archs = ["sm_80", "sm_90"]\n', files={"kernels/beta/fill.cu": HALF_CU})
    script = tmp_path / "build_script.py"
    script.write_text(BUILD_SCRIPT)  # module-level code, no `if __name__ == "__main__":`
    out = subprocess.run([sys.executable, str(script), str(root), str(tmp_path / "cache")], capture_output=True,
                         text=True, env=build_env(tmp_path / "cache", KHAL_JOBS="2"), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("start") == 1 and out.stdout.count("done") == 1
