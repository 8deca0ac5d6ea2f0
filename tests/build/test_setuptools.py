"""The setuptools front-end (``build_khal``, hatch_khal/setuptools_ext.py).

The twin of example_shader_pkg (tests/packages/setuptools_twin/pyproject.toml + the example's
kernels and package) is built by setuptools; its ``_khal/`` must equal, byte for byte,
the hatchling-built example wheel's. Then: editable installs (in place, stale edits
reported), a src layout, a setuptools project without ``[tool.khal]`` (untouched: the
plugin fires for every setuptools build), a missing NVRTC, and one isolated build.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from khal_runtime.manifest import parse_manifest

from tests.helpers.projects import COMMON_CUH, OTHER_CU, SCALE_CU
from tests.conftest import EXAMPLE, ROOT, RUNTIME, build_env, run
from tests.helpers.paths import PACKAGES

pytest.importorskip("setuptools", minversion="70")

TWIN = PACKAGES / "setuptools_twin"
PKG = "example_shader_pkg"


HATCH_TABLE = "tool.hatch.build.targets.wheel.hooks.khal"


def khal_table_from_example() -> str:
    """The example's hook table as ``[tool.khal]``: its lines as they are, headers renamed."""
    out: list[str] = []
    inside = False
    for line in (EXAMPLE / "pyproject.toml").read_text().splitlines():
        header = line.strip().lstrip("[").rstrip("]") if line.startswith("[") else None
        if header is not None:
            inside = header == HATCH_TABLE or header.startswith(HATCH_TABLE + ".")
            if inside:
                line = line.replace(HATCH_TABLE, "tool.khal")
        if inside:
            out.append(line)
    assert out and out[0] == "[tool.khal]", "example_shader_pkg/pyproject.toml has no khal hook table"
    return "\n".join(out) + "\n"


def make_twin(dest: Path) -> Path:
    """The example's kernels and package next to the twin's setuptools pyproject.toml."""
    dest.mkdir(parents=True)
    twin = (TWIN / "pyproject.toml").read_text()
    (dest / "pyproject.toml").write_text(twin + "\n" + khal_table_from_example())
    shutil.copytree(EXAMPLE / "kernels", dest / "kernels")
    shutil.copytree(EXAMPLE / PKG, dest / PKG, ignore=shutil.ignore_patterns("_khal", "__pycache__"))
    shutil.copy2(EXAMPLE / "khal-triton.lock", dest / "khal-triton.lock")  # the Triton crate's variants
    return dest


def pip_wheel(proj: Path, out: Path, env: dict[str, str], *, isolated: bool = False) -> Path:
    flags = [] if isolated else ["--no-build-isolation"]
    run([sys.executable, "-m", "pip", "wheel", *flags, "--no-deps", "-q", "-w", str(out), str(proj)], env=env)
    (whl,) = out.glob("*.whl")
    return whl


def khal_files(whl: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(whl) as zf:
        return {n: zf.read(n) for n in zf.namelist() if "/_khal/" in n}


def verify_ok(whl: Path) -> None:
    assert "verify: OK" in run([sys.executable, "-m", "hatch_khal", "verify", str(whl)]).stdout


@pytest.fixture(scope="module")
def twin_wheel(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """The twin, built like the example_wheel fixture (default archs, same cache: no recompiles)."""
    tmp = tmp_path_factory.mktemp("twin")
    return pip_wheel(make_twin(tmp / "proj"), tmp / "dist", build_env(session_cache))


@pytest.mark.needs_nvrtc
def test_twin_wheel_is_sound(twin_wheel: Path) -> None:
    assert twin_wheel.name == "example_shader_pkg-0.1.0-py3-none-any.whl"  # pure, like the hatch one
    verify_ok(twin_wheel)
    files = khal_files(twin_wheel)
    manifest = parse_manifest(files[f"{PKG}/_khal/manifest.json"])
    assert manifest.editable is None and manifest.package == PKG
    assert {"core", "particles"} <= {c.name for c in manifest.crates}  # the example's crates
    with zipfile.ZipFile(twin_wheel) as zf:
        names = zf.namelist()
    assert f"{PKG}/__init__.py" in names and not any(n.startswith("kernels/") for n in names)


def test_twin_wheel_equals_the_hatch_wheel(twin_wheel: Path, example_wheel: Path) -> None:
    """Same sources, either backend: the same manifest and artifacts, byte for byte."""
    ours, theirs = khal_files(twin_wheel), khal_files(example_wheel)
    assert sorted(ours) == sorted(theirs)
    manifest = parse_manifest(theirs[f"{PKG}/_khal/manifest.json"])
    # the manifest and its digest, every artifact, and the typed kernels module (_khal/__init__.py and .pyi)
    assert len(theirs) == 4 + sum(len(c.artifacts) for c in manifest.crates)
    assert {f"{PKG}/_khal/__init__.py", f"{PKG}/_khal/__init__.pyi", f"{PKG}/_khal/manifest.digest"} <= set(theirs)
    for name in sorted(theirs):
        assert ours[name] == theirs[name], name


def mini_project(proj: Path, requires: str = '"setuptools>=70", "hatch-khal", "nvidia-cuda-nvrtc"') -> Path:
    """Package ``mini_pkg`` in a src layout, crates ``alpha`` and ``beta``, no ``package`` key."""
    files = {
        "pyproject.toml": textwrap.dedent(
            f"""\
            [build-system]
            requires = [{requires}]
            build-backend = "setuptools.build_meta"

            [project]
            name = "mini-pkg"
            version = "0.1.0"
            dependencies = ["khal-runtime>=0.1.0"]

            [tool.khal]
            archs = ["sm_90"]
            ptx-arch = "none"

            [[tool.khal.crates]]
            name = "alpha"
            sources = ["kernels/alpha/*.cu"]
            include-dirs = ["kernels/include"]

            [[tool.khal.crates]]
            name = "beta"
            sources = ["kernels/beta/*.cu"]
            """
        ),
        "src/mini_pkg/__init__.py": "",
        "kernels/alpha/scale.cu": SCALE_CU,
        "kernels/include/common.cuh": COMMON_CUH,
        "kernels/beta/fill.cu": OTHER_CU,
    }
    for rel, text in files.items():
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text(text)
    return proj


MINI_KHAL = {
    "mini_pkg/_khal/manifest.json",
    "mini_pkg/_khal/manifest.digest",
    "mini_pkg/_khal/__init__.py",
    "mini_pkg/_khal/__init__.pyi",
    "mini_pkg/_khal/alpha/alpha.sm_90.cubin",
    "mini_pkg/_khal/beta/beta.sm_90.cubin",
}


@pytest.mark.needs_nvrtc
def test_src_layout_and_default_package(tmp_path: Path, session_cache: Path) -> None:
    """No ``package`` key: the project's package, found under src/ and mapped through package_dir."""
    proj = mini_project(tmp_path / "proj")
    whl = pip_wheel(proj, tmp_path / "dist", build_env(session_cache))
    assert set(khal_files(whl)) == MINI_KHAL
    verify_ok(whl)
    assert not (proj / "src/mini_pkg/_khal").exists()  # a wheel build writes nothing in place


def _venv_seeing_this_env(venv: Path) -> Path:
    """A fresh venv that sees this environment's packages (setuptools, hatch-khal, ...)."""
    import site

    # --without-pip: the venv's bundled setuptools would shadow this environment's newer one
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    venv_site = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(venv_site, "_parent_env.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    )
    return py


def _nvrtc_pin() -> str:
    from importlib.metadata import version

    return f"nvidia-cuda-nvrtc=={version('nvidia-cuda-nvrtc')}"


@pytest.mark.needs_nvrtc
def test_editable_install_builds_in_place_and_reports_stale(tmp_path: Path, session_cache: Path) -> None:
    proj = make_twin(tmp_path / "proj")
    py = _venv_seeing_this_env(tmp_path / "venv")
    env = build_env(session_cache, KHAL_CUDA_ARCHS="sm_90")
    # NVRTC's library is looked up in the interpreter's own site-packages: install it there
    run([str(py), "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", _nvrtc_pin()], env=env)
    install = [str(py), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q", "-e", str(proj)]
    run(install, env=env)
    in_place = proj / PKG / "_khal" / "manifest.json"
    assert in_place.is_file()
    manifest = json.loads(in_place.read_text())
    assert manifest["editable"]["project_root"] == str(proj.resolve())
    cuda = [a for c in manifest["crates"] for a in c["artifacts"] if a["kind"] in ("ptx", "cubin")]
    # (the Triton crate's sm_90 cubin is arch-specific: sm_90a)
    assert {a["arch"].removesuffix("a") for a in cuda} == {"sm_90", "compute_75"}
    assert {a["kind"] for c in manifest["crates"] for a in c["artifacts"]} == {"ptx", "cubin", "wgsl", "spirv"}
    # This checkout may be on sys.path (hatch-khal installed editable), or another checkout (a git
    # worktree's tests over the editable install of the main one); its example_shader_pkg/ project
    # directory would then pass for a namespace package and shadow setuptools' editable finder,
    # which sits after the path finder. Drop every such checkout once khal_runtime is imported.
    unshadow = ("import os, sys, khal_runtime.verify; sys.path[:] = [p for p in sys.path if not "
                f"os.path.isfile(os.path.join(p or '.', {PKG!r}, 'pyproject.toml'))];")
    check = unshadow + (
        "import importlib.util, pathlib, khal_runtime.verify as v;"
        f"d = pathlib.Path(importlib.util.find_spec({PKG!r}).submodule_search_locations[0]);"
        "print(d); print([p.kind for p in v.verify_package(d)])"
    )
    out = run([str(py), "-c", check], cwd=tmp_path, env=env).stdout.split("\n")
    assert out[0] == str(proj / PKG) and out[1] == "[]"  # the runtime finds the source package, in place
    # edit a kernel without rebuilding: reported as stale, not silently run
    saxpy = next((proj / "kernels/core").glob("*.cu"))
    saxpy.write_text(saxpy.read_text() + "\n// edited\n")
    out = run([str(py), "-c", check], cwd=tmp_path, env=env).stdout.split("\n")
    assert out[1] == "['stale']"
    failed = run([str(py), "-c", f"{unshadow} import {PKG}"], cwd=tmp_path, env=env, check=False)
    assert failed.returncode != 0 and "StaleBuildError" in failed.stderr
    assert f"kernels/core/{saxpy.name}" in failed.stderr
    # re-running the editable install rebuilds and clears the staleness
    run(install, env=env)
    out = run([str(py), "-c", check], cwd=tmp_path, env=env).stdout.split("\n")
    assert out[1] == "[]"
    # strict editable mode imports from a link tree: the kernels are copied there (links out of
    # the package would fail the runtime's path confinement), the sources still checked in place
    run(install + ["--config-settings", "editable_mode=strict"], env=env)
    out = run([str(py), "-c", check], cwd=tmp_path, env=env).stdout.split("\n")
    assert out[0].startswith(str(proj / "build" / "__editable__")) and out[1] == "[]"
    saxpy.write_text(saxpy.read_text() + "\n// edited again\n")
    out = run([str(py), "-c", check], cwd=tmp_path, env=env).stdout.split("\n")
    assert out[1] == "['stale']"
    # a standard wheel built afterwards carries fresh, non-editable kernels only
    (proj / PKG / "_khal" / "core" / "leftover.cubin").write_bytes(b"stale")
    whl = pip_wheel(proj, tmp_path / "dist", env)
    files = khal_files(whl)
    assert not any("leftover" in n for n in files)
    assert "editable" not in json.loads(files[f"{PKG}/_khal/manifest.json"])
    verify_ok(whl)


PLAIN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=70"]
build-backend = "setuptools.build_meta"

[project]
name = "plain-pkg"
version = "0.1.0"
"""

# Build in-process through the PEP 517 hooks, then report what the build imported.
_BUILD_AND_REPORT = """\
import json, os, sys
from setuptools import build_meta
from setuptools.command.build import build
os.makedirs("dist", exist_ok=True)
name = build_meta.build_wheel("dist")
print(json.dumps({
    "wheel": name,
    "registered": "build_khal" in {n for n, _ in build.sub_commands},
    "plugin_loaded": "hatch_khal.setuptools_ext" in sys.modules,
    "heavy": sorted(m for m in sys.modules
                    if m.startswith(("cuda", "pydantic", "hatch_khal.builder", "hatch_khal.config", "hatch_khal.nvrtc"))),
}))
"""


def test_project_without_tool_khal_is_untouched(tmp_path: Path) -> None:
    """The plugin fires for every setuptools build: without [tool.khal] it must do nothing (a hatch
    table without [tool.khal] is refused: tests/build/test_hardening_29.py)."""
    proj = tmp_path / "proj"
    (proj / "plain_pkg").mkdir(parents=True)
    (proj / "plain_pkg" / "__init__.py").write_text("X = 1\n")
    (proj / "pyproject.toml").write_text(PLAIN_PYPROJECT)
    proc = run([sys.executable, "-c", _BUILD_AND_REPORT], cwd=proj)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["registered"] and report["plugin_loaded"]  # the plugin was active ...
    assert report["heavy"] == []  # ... and imported neither the build core nor NVRTC/cuda
    with zipfile.ZipFile(proj / "dist" / report["wheel"]) as zf:
        assert not any("_khal" in n for n in zf.namelist())
    assert not (proj / "plain_pkg" / "_khal").exists()


def test_missing_nvrtc_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from setuptools.dist import Distribution
    from hatch_khal.errors import ConfigError

    import hatch_khal.nvrtc
    from hatch_khal.config import parse_config
    from hatch_khal.errors import KhalBuildError
    from hatch_khal.setuptools_ext import BuildKhal

    def no_nvrtc() -> tuple[int, int]:
        raise KhalBuildError("NVRTC could not be loaded (libnvrtc.so not found)")

    monkeypatch.setattr(hatch_khal.nvrtc, "nvrtc_version", no_nvrtc)
    hook, crates = parse_config({"crates": [{"name": "a", "sources": ["k/*.cu"]}]}, default_package="p")
    cmd = BuildKhal(Distribution())
    with pytest.raises(ConfigError, match=r"build-system\] requires.*nvidia-cuda-nvrtc"):
        cmd._check_requirements(hook, crates)
    # every crate prebuilt: no compiler needed, no error
    monkeypatch.setenv("CUDA_OXIDE_SHADERS_PTX_A", "a.ptx")
    cmd._check_requirements(hook, crates)


def test_failed_build_names_missing_header_wheels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hatch hook adds the CUDA header wheels to the build; setuptools cannot, so say so."""
    import importlib.metadata

    from setuptools.dist import Distribution

    from hatch_khal.config import parse_config
    from hatch_khal.headers import header_requirements
    from hatch_khal.setuptools_ext import BuildKhal

    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "nvidia-cuda-cccl":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    cmd = BuildKhal(Distribution())
    _, crates = parse_config({"crates": [{"name": "a", "sources": ["k/*.cu"]}]}, default_package="p")
    hook, _ = parse_config({"crates": [{"name": "a", "sources": ["k/*.cu"]}], "nvrtc-requirement": "nvidia-cuda-nvrtc~=13.0.0"},
                           default_package="p")
    note = cmd._header_note(hook, crates)
    (cccl,) = [r for r in header_requirements(hook.nvrtc_requirement) if r.startswith("nvidia-cuda-cccl")]
    assert repr(cccl) in note and "[build-system] requires" in note
    assert "nvidia-cuda-runtime" not in note  # installed here: not asked for
    _, no_headers = parse_config({"crates": [{"name": "a", "sources": ["k/*.cu"]}], "cuda-headers": "none"},
                                 default_package="p")
    assert cmd._header_note(hook, no_headers) == ""


@pytest.mark.slow
def test_isolated_pip_wheel(tmp_path: Path, session_cache: Path) -> None:
    """A user's build: pip installs setuptools, hatch-khal (a wheel of this checkout) and NVRTC."""
    house = tmp_path / "wheelhouse"
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(house), str(ROOT),
         str(RUNTIME)])
    proj = mini_project(tmp_path / "proj", f'"setuptools>=70", "hatch-khal", "{_nvrtc_pin()}"')
    env = build_env(session_cache, PIP_FIND_LINKS=str(house))
    env.pop("PIP_NO_BUILD_ISOLATION", None)
    whl = pip_wheel(proj, tmp_path / "dist", env, isolated=True)
    assert set(khal_files(whl)) == MINI_KHAL
    verify_ok(whl)
