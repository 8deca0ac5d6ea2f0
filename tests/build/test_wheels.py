"""Real builds through the front-ends users run: pip, build (sdist → wheel), uv, hatch, editable.

The isolated builds fetch hatch-khal from a wheel of this checkout (PIP_FIND_LINKS /
UV_FIND_LINKS) and everything else from the package index, like a user's build.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.helpers.projects import make_project
from tests.conftest import ROOT, RUNTIME, build_env, run

pytestmark = pytest.mark.slow


def _nvrtc_pin() -> str:
    """Pin the isolated builds' NVRTC to the one installed here, so pip reuses its cache."""
    from importlib.metadata import version

    return f"nvidia-cuda-nvrtc=={version('nvidia-cuda-nvrtc')}"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(out), str(ROOT),
         str(RUNTIME)])
    assert list(out.glob("hatch_khal-*.whl")) and list(out.glob("khal_runtime-*.whl"))
    return out


def isolated_env(cache: Path, wheelhouse: Path, **extra: str) -> dict[str, str]:
    env = build_env(cache, PIP_FIND_LINKS=str(wheelhouse), UV_FIND_LINKS=str(wheelhouse), **extra)
    env.pop("PIP_NO_BUILD_ISOLATION", None)
    return env


def wheel_manifest(whl: Path, pkg: str = "mini_pkg") -> dict:  # type: ignore[type-arg]
    with zipfile.ZipFile(whl) as zf:
        return json.loads(zf.read(f"{pkg}/_khal/manifest.json"))


def check_wheel(whl: Path) -> None:
    assert whl.name.endswith("-none-any.whl"), whl.name  # device code only: a pure wheel
    proc = run([sys.executable, "-m", "hatch_khal", "verify", str(whl)])
    assert "verify: OK" in proc.stdout
    m = wheel_manifest(whl)
    assert {c["name"] for c in m["crates"]} == {"alpha", "beta"}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter with nothing installed: NVRTC and the headers exist only in pip's build env."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    return venv / "bin" / "python"


def test_pip_wheel_isolated(tmp_path: Path, wheelhouse: Path, session_cache: Path, bare_python: Path) -> None:
    # pip's isolated environment is an overlay on sys.path, not a site-packages:
    # the hook must find NVRTC and the header wheels there.
    files = {"kernels/beta/fill.cu": '#include <cuda_fp16.h>\n' + (Path(__file__).parents[1] / "helpers" / "projects.py")
             .read_text().split('OTHER_CU = """\\\n')[1].split('"""')[0]}
    proj = make_project(tmp_path / "proj", nvrtc_requirement=_nvrtc_pin(), files=files)
    run([str(bare_python), "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(proj)],
        env=isolated_env(session_cache, wheelhouse))
    (whl,) = (tmp_path / "dist").glob("*.whl")
    check_wheel(whl)


def test_build_sdist_then_wheel(tmp_path: Path, wheelhouse: Path, session_cache: Path) -> None:
    pytest.importorskip("build")
    proj = make_project(tmp_path / "proj", nvrtc_requirement=_nvrtc_pin())
    run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(proj)],
        env=isolated_env(session_cache, wheelhouse))
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
    assert any(n.endswith("kernels/alpha/scale.cu") for n in names)
    assert any(n.endswith("kernels/include/common.cuh") for n in names)
    assert not any("/_khal/" in n for n in names)  # no build output in the sdist
    (whl,) = (tmp_path / "dist").glob("*.whl")  # built from the unpacked sdist
    check_wheel(whl)


def test_uv_build(tmp_path: Path, wheelhouse: Path, session_cache: Path) -> None:
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        pytest.skip("uv is not installed (pip install uv)")
    proj = make_project(tmp_path / "proj", nvrtc_requirement=_nvrtc_pin())
    run([uv, "build", "--wheel", "--out-dir", str(tmp_path / "dist"), str(proj)],
        env=isolated_env(session_cache, wheelhouse, UV_CACHE_DIR=str(session_cache.parent / "uv-cache")))
    (whl,) = (tmp_path / "dist").glob("*.whl")
    check_wheel(whl)


def test_hatch_build(tmp_path: Path, wheelhouse: Path, session_cache: Path) -> None:
    hatch = shutil.which("hatch") or shutil.which("hatch", path=str(Path(sys.executable).parent))
    if hatch is None:
        pytest.skip("hatch is not installed (pip install hatch)")
    proj = make_project(tmp_path / "proj", nvrtc_requirement=_nvrtc_pin())
    env = isolated_env(session_cache, wheelhouse, HATCH_DATA_DIR=str(tmp_path / "hatch-data"),
                       HATCH_CACHE_DIR=str(tmp_path / "hatch-cache"))
    run([hatch, "build", "-t", "wheel", str(tmp_path / "dist")], cwd=proj, env=env)
    (whl,) = (tmp_path / "dist").glob("*.whl")
    check_wheel(whl)


def _wheel_bytes(proj: Path, out: Path, cache: Path) -> bytes:
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(out), str(proj)],
        env=build_env(cache, SOURCE_DATE_EPOCH="1700000000"))
    (whl,) = out.glob("*.whl")
    return whl.read_bytes()


def test_reproducible_wheels(tmp_path: Path) -> None:
    """Same inputs, different directories and cold caches: byte-identical wheels, Blackwell cubins
    included (#37: NVRTC's trace changed their code from build to build)."""
    hook = 'archs = ["sm_90", "sm_100", "sm_120"]\n'
    a = _wheel_bytes(make_project(tmp_path / "a" / "proj", hook=hook), tmp_path / "a" / "dist", tmp_path / "a" / "cache")
    b = _wheel_bytes(make_project(tmp_path / "b" / "x" / "proj", hook=hook), tmp_path / "b" / "dist",
                     tmp_path / "b" / "cache")
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(b).hexdigest()


def test_editable_install_builds_in_place_and_reports_stale(tmp_path: Path, session_cache: Path) -> None:
    proj = make_project(tmp_path / "proj")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    # see this environment's packages (hatchling, hatch-khal, NVRTC) from the new venv
    import site
    venv_site = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(venv_site, "_parent_env.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    )
    env = build_env(session_cache)
    # NVRTC's library is looked up in the interpreter's own site-packages: install it there
    run([str(py), "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", _nvrtc_pin()], env=env)
    run([str(py), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q", "-e", str(proj)], env=env)
    in_place = proj / "mini_pkg" / "_khal" / "manifest.json"
    assert in_place.is_file()
    manifest = json.loads(in_place.read_text())
    assert manifest["editable"]["project_root"] == str(proj.resolve())
    check = (
        "import importlib.util, pathlib, khal_runtime.verify as v;"
        "d = pathlib.Path(importlib.util.find_spec('mini_pkg').submodule_search_locations[0]);"
        "print(d); print([p.kind for p in v.verify_package(d)])"
    )
    out = run([str(py), "-c", check], cwd=tmp_path, env=env).stdout.split("\n")
    assert out[0] == str(proj / "mini_pkg") and out[1] == "[]"
    # edit a kernel without rebuilding: reported as stale, not silently run
    (proj / "kernels/alpha/scale.cu").write_text((proj / "kernels/alpha/scale.cu").read_text() + "\n// edited\n")
    out = run([str(py), "-c", check], cwd=tmp_path, env=env).stdout.split("\n")
    assert out[1] == "['stale']"
    failed = run([str(py), "-c", "import mini_pkg"], cwd=tmp_path, env=env, check=False)
    assert failed.returncode != 0
    assert "StaleBuildError" in failed.stderr and "kernels/alpha/scale.cu" in failed.stderr
    assert "pip install -e" in failed.stderr
    # re-running the editable install rebuilds and clears the staleness
    run([str(py), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q", "-e", str(proj)], env=env)
    out = run([str(py), "-c", check], cwd=tmp_path, env=env).stdout.split("\n")
    assert out[1] == "[]"
    # a standard wheel built afterwards carries fresh, non-editable kernels only; a file in place
    # that this build does not write would be shipped beside them: refused, naming it
    (proj / "mini_pkg" / "_khal" / "alpha" / "leftover.cubin").write_bytes(b"stale")
    wheel = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
             str(tmp_path / "dist"), str(proj)]
    refused = run(wheel, env=env, check=False)
    assert refused.returncode != 0 and "mini_pkg/_khal/alpha/leftover.cubin" in refused.stderr + refused.stdout
    (proj / "mini_pkg" / "_khal" / "alpha" / "leftover.cubin").unlink()
    run(wheel, env=env)
    (whl,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
    assert len(names) == len(set(names))  # each kernel once: the in-place copies left out
    assert "editable" not in wheel_manifest(whl)
    check_wheel(whl)
