"""The two distributions of this repository (issue #27): hatch-khal, the build plugin, and
khal-runtime (runtime/pyproject.toml), the runtime alone; their versions, what each wheel holds and
requires, installs of the runtime wheel and of the runtime editable, and the version checks
between a shader package and the runtime that loads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from hatch_khal.__about__ import __version__
from hatch_khal.frontend import runtime_dependency_problem
from khal_runtime.errors import ManifestError
from khal_runtime.manifest import FIRST_RUNTIME, SCHEMA_VERSION, parse_manifest, runtime_requirement

from tests.helpers.projects import make_project
from tests.conftest import EXAMPLE, ROOT, RUNTIME, build_env, run


def _toml(path: Path) -> dict:  # type: ignore[type-arg]
    return tomllib.loads(path.read_text())


def _requires(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(meta).decode()).get_all("Requires-Dist") or []


# ---------------------------------------------------------------------------------------------
# versions
# ---------------------------------------------------------------------------------------------
def test_the_two_distributions_share_one_version_and_hatch_khal_pins_the_runtime() -> None:
    runtime = _toml(RUNTIME / "pyproject.toml")["project"]
    plugin = _toml(ROOT / "pyproject.toml")["project"]
    assert runtime["name"] == "khal-runtime" and runtime["version"] == __version__
    assert f"khal-runtime=={__version__}" in plugin["dependencies"]
    assert all(f"=={__version__}" in r for extra in ("webgpu", "torch") for r in plugin["optional-dependencies"][extra])


def test_one_nvrtc_default_everywhere() -> None:
    """The ``build`` extra (builds without isolation), the documented setuptools snippet and the
    isolated default name one NVRTC (#38 item 14: the extra and the snippet said >=12.8, which
    resolves the newest NVRTC, whose PTX needs the newest driver), and the header wheels the hook adds."""
    from hatch_khal.config import DEFAULT_NVRTC_REQUIREMENT
    from hatch_khal.headers import header_requirements

    extra = _toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"]["build"]
    assert DEFAULT_NVRTC_REQUIREMENT in extra
    assert set(header_requirements(DEFAULT_NVRTC_REQUIREMENT)) <= set(extra), extra
    assert not [r for r in extra if r.startswith("nvidia-") and r not in
                {DEFAULT_NVRTC_REQUIREMENT, *header_requirements(DEFAULT_NVRTC_REQUIREMENT)}], extra
    doc = (ROOT / "docs" / "guide" / "configuration.md").read_text()
    snippet = doc.split("<!-- file: setuptools:pyproject.toml -->", 1)[1].split("```", 2)[1]
    assert f'"{DEFAULT_NVRTC_REQUIREMENT}"' in snippet and "nvidia-cuda-nvrtc>=" not in snippet, snippet


def test_every_schema_names_the_first_runtime_that_reads_it() -> None:
    from packaging.version import Version

    assert sorted(FIRST_RUNTIME) == list(range(1, SCHEMA_VERSION + 1))
    assert all(Version(v) <= Version(__version__) for v in FIRST_RUNTIME.values())
    assert runtime_requirement() == f"khal-runtime>={FIRST_RUNTIME[SCHEMA_VERSION]}"


def test_the_runtime_needs_only_what_it_imports() -> None:
    """khal-runtime's dependencies: no build side (packaging, filelock, hatchling, NVRTC)."""
    deps = " ".join(_toml(RUNTIME / "pyproject.toml")["project"]["dependencies"])
    for name in ("numpy", "pydantic", "pyelftools", "cuda-bindings"):
        assert name in deps
    for name in ("packaging", "filelock", "hatchling", "nvrtc", "hatch-khal", "tomli"):
        assert name not in deps


#: what khal_runtime may import besides the standard library: its dependencies (numpy, pydantic,
#: pyelftools, cuda-bindings), its extras (wgpu, torch) and what it only probes or uses when asked
#: (nvtx for KHAL_CUDA_NVTX, cupy); never hatch_khal nor the build's dependencies
RUNTIME_IMPORTS = {"numpy", "pydantic", "elftools", "cuda", "wgpu", "torch", "nvtx", "cupy", "khal_runtime"}


def test_the_runtime_imports_only_its_dependencies() -> None:
    import ast

    seen: dict[str, str] = {}
    for path in (ROOT / "khal_runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                seen.setdefault(n.split(".")[0], path.relative_to(ROOT).as_posix())
    foreign = {m: where for m, where in seen.items()
               if m not in RUNTIME_IMPORTS and m not in sys.stdlib_module_names and m != "__future__"}
    assert not foreign, f"khal_runtime imports what khal-runtime does not depend on: {foreign}"


@pytest.mark.parametrize("toolchain, says", [
    ({"hatch_khal_version": "0.3.0"}, "the package was built by hatch-khal 0.3.0; install khal-runtime>=0.3.0 "
                                      "(pip install 'khal-runtime>=0.3.0')"),
    ({"hatch_khal_version": "0.3.0+local.1"}, "install khal-runtime>=0.3.0 "),
    ({"hatch_khal_version": "0.3; rm -rf /"}, "; install a newer khal-runtime (pip install -U khal-runtime)"),
    (None, "; install a newer khal-runtime (pip install -U khal-runtime)"),
])
def test_a_too_new_schema_names_the_runtime_to_install(toolchain: dict | None, says: str) -> None:  # type: ignore[type-arg]
    """An older runtime seeing a newer manifest schema says which khal-runtime reads it (hatch-khal
    X pins khal-runtime X), from the toolchain record alone, trusting nothing else in it."""
    doc: dict = {"schema_version": SCHEMA_VERSION + 1, "package": "p", "crates": []}  # type: ignore[type-arg]
    if toolchain is not None:
        doc["toolchain"] = toolchain
    with pytest.raises(ManifestError) as exc:
        parse_manifest(json.dumps(doc), "p/_khal/manifest.json")
    msg = str(exc.value)
    assert msg.startswith(f"p/_khal/manifest.json: schema version {SCHEMA_VERSION + 1} is newer than this "
                          f"runtime understands ({SCHEMA_VERSION})"), msg
    assert says in msg, msg
    assert "rm -rf" not in msg


# ---------------------------------------------------------------------------------------------
# the hook's check of a shader package's dependencies
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("deps", [["khal-runtime>=0.1.0"], ["khal-runtime"], ["numpy", "khal-runtime[webgpu]>=0.1"],
                                  [f"khal-runtime=={__version__}"]])
def test_a_package_that_depends_on_the_runtime_passes(deps: list[str]) -> None:
    assert runtime_dependency_problem(deps) is None


def test_a_runtime_requirement_excluding_this_runtime_is_an_error() -> None:
    kind, msg = runtime_dependency_problem(["khal-runtime<0.1"]) or ("", "")
    assert kind == "error"
    assert f"excludes khal-runtime {__version__}" in msg and f'write "{runtime_requirement()}" instead' in msg


@pytest.mark.parametrize("deps, kind, says", [
    ([], "error", f'add "{runtime_requirement()}" to [project] dependencies'),
    (["numpy>=1.24"], "error", f'add "{runtime_requirement()}" to [project] dependencies'),
    (["hatch-khal"], "warn", f'replace "hatch-khal" with "{runtime_requirement()}"'),
])
def test_no_runtime_requirement_is_an_error_with_the_line_to_write(deps: list[str], kind: str, says: str) -> None:
    """No khal-runtime at all is an error (#38 item 12: a warning only pip -v showed, for a wheel that
    cannot import); hatch-khal instead works (it depends on the runtime) and stays a warning."""
    got, msg = runtime_dependency_problem(deps) or ("", "")
    assert got == kind and says in msg, msg


def test_the_example_and_the_test_packages_depend_on_the_runtime_not_the_plugin() -> None:
    for proj in (EXAMPLE, ROOT / "tests" / "packages" / "real_kernels_pkg", ROOT / "tests" / "packages" / "setuptools_twin"):
        meta = _toml(proj / "pyproject.toml")
        assert runtime_dependency_problem(meta["project"]["dependencies"]) is None, proj
        assert "hatch-khal" in meta["build-system"]["requires"], proj


def _build(proj: Path, out: Path, cache: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "-w", str(out),
                str(proj)], env=build_env(cache), check=check)


def test_a_build_without_the_runtime_dependency_fails_where_plain_pip_shows_it(tmp_path: Path,
                                                                                   session_cache: Path) -> None:
    """Refused, not added: a requirement only the hook added would be missing from the metadata uv and
    build read (hatchling's prepare_metadata_for_build_wheel runs no hook). Plain ``pip wheel`` (no
    -v) shows the block with the line to add; no traceback."""
    proj = make_project(tmp_path / "proj", dependencies='"numpy"')
    env = build_env(session_cache)
    env.pop("KHAL_BUILD_DEBUG", None)
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp_path / "dist"),
                str(proj)], env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f'add "{runtime_requirement()}" to [project] dependencies' in out, out
    assert "hatch-khal: the kernels of mini-pkg could not be built (ConfigError)" in out, out
    assert "Traceback" not in out, out
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_a_build_whose_runtime_requirement_excludes_this_runtime_fails(tmp_path: Path, session_cache: Path) -> None:
    proj = make_project(tmp_path / "proj", dependencies='"khal-runtime<0.1"')
    proc = _build(proj, tmp_path / "dist", session_cache, check=False)
    assert proc.returncode != 0
    assert f"which excludes khal-runtime {__version__}" in proc.stdout + proc.stderr
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_the_example_wheel_requires_the_runtime(example_wheel: Path) -> None:
    reqs = _requires(example_wheel)
    assert any(r.startswith("khal-runtime") for r in reqs), reqs
    assert not any(r.startswith("hatch-khal") for r in reqs), reqs


# ---------------------------------------------------------------------------------------------
# the wheels, built for real
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dists")
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(out),
         str(ROOT), str(RUNTIME)])
    (plugin,) = out.glob("hatch_khal-*.whl")
    (runtime,) = out.glob("khal_runtime-*.whl")
    return {"hatch-khal": plugin, "khal-runtime": runtime}


def _tops(whl: Path) -> set[str]:
    with zipfile.ZipFile(whl) as zf:
        return {n.split("/")[0] for n in zf.namelist()}


@pytest.mark.slow
def test_each_wheel_holds_its_own_package(wheels: dict[str, Path]) -> None:
    assert _tops(wheels["khal-runtime"]) == {"khal_runtime", f"khal_runtime-{__version__}.dist-info"}
    assert _tops(wheels["hatch-khal"]) == {"hatch_khal", f"hatch_khal-{__version__}.dist-info"}
    with zipfile.ZipFile(wheels["khal-runtime"]) as zf:
        names = zf.namelist()
    shipped = {n for n in names if n.startswith("khal_runtime/")}
    tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / "khal_runtime").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    assert shipped == tree
    assert not any(".pyc" in n for n in names)


@pytest.mark.slow
def test_each_wheel_requires_what_it_should(wheels: dict[str, Path]) -> None:
    runtime = _requires(wheels["khal-runtime"])
    plugin = _requires(wheels["hatch-khal"])
    assert f"khal-runtime=={__version__}" in plugin
    assert any(r.startswith("cuda-bindings") and "sys_platform == 'linux'" in r for r in runtime), runtime
    assert any(r.startswith("wgpu") and "extra == 'webgpu'" in r for r in runtime), runtime
    assert any(r.startswith("torch") and "extra == 'torch'" in r for r in runtime), runtime
    assert not any(r.split(">")[0].split("=")[0].split(";")[0].strip() in ("packaging", "filelock", "hatchling")
                   for r in runtime), runtime


@pytest.mark.slow
def test_the_runtime_wheel_installs_and_loads_alone(wheels: dict[str, Path], tmp_path: Path) -> None:
    """khal-runtime installed into a target directory, without hatch-khal: import khal_runtime and its
    modules from there (its dependencies from this environment)."""
    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target),
         str(wheels["khal-runtime"])])
    assert not (target / "hatch_khal").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    code = ("import khal_runtime, khal_runtime.kernels, khal_runtime.verify, khal_runtime.backends.cuda, sys\n"
            "print(khal_runtime.__file__)\n"
            "print('HATCH', any(m.startswith('hatch_khal') for m in sys.modules))\n")
    proc = run([sys.executable, "-c", code], cwd=tmp_path, env=env)
    assert proc.stdout.splitlines()[0].startswith(str(target)), proc.stdout
    assert "HATCH False" in proc.stdout


@pytest.mark.slow
def test_the_runtime_editable_points_at_this_checkout(tmp_path: Path) -> None:
    out = tmp_path / "editable"
    out.mkdir()
    proc = run([sys.executable, "-c", f"from hatchling.build import build_editable; print(build_editable({str(out)!r}))"],
               cwd=RUNTIME)
    whl = out / proc.stdout.split()[-1]
    with zipfile.ZipFile(whl) as zf:
        pth = [n for n in zf.namelist() if n.endswith(".pth")]
        assert len(pth) == 1 and not any(n.startswith("khal_runtime/") for n in zf.namelist())
        assert Path(zf.read(pth[0]).decode().strip()) == ROOT


@pytest.mark.slow
def test_the_runtime_sdist_builds_the_same_wheel(tmp_path: Path, wheels: dict[str, Path]) -> None:
    """python -m build: sdist first, then the wheel from the unpacked sdist (no ../khal_runtime there)."""
    pytest.importorskip("build")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(RUNTIME)])
    (whl,) = tmp_path.glob("khal_runtime-*.whl")
    with zipfile.ZipFile(whl) as a, zipfile.ZipFile(wheels["khal-runtime"]) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
        assert all(a.read(n) == b.read(n) for n in a.namelist() if n.startswith("khal_runtime/"))


@pytest.mark.slow
def test_installing_a_shader_wheel_brings_the_runtime_and_not_the_build_side(
        wheels: dict[str, Path], example_wheel: Path, tmp_path: Path) -> None:
    """A user's install: pip install of the example wheel into a fresh environment, khal-runtime
    from a folder of this checkout's wheels, the rest from the index. No hatch-khal, no build
    dependency; the package imports and loads its manifest (no GPU needed)."""
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    links = wheels["khal-runtime"].parent
    run([str(py), "-m", "pip", "install", "-q", "--find-links", str(links), str(example_wheel)])
    listed = run([str(py), "-m", "pip", "list", "--format=json"]).stdout
    names = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    assert "khal-runtime" in names and {"numpy", "pydantic", "pyelftools"} <= names, names
    assert not names & {"hatch-khal", "hatchling", "filelock", "nvidia-cuda-nvrtc"}, names
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = run([str(py), "-c", "import example_shader_pkg as e; print(sorted(e.kernels.crates))"], cwd=tmp_path, env=env)
    assert "'core'" in proc.stdout
