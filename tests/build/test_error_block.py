"""#38 item 16: a build error reaches the user as one block (what failed, where, what to do) before
the backend exits, as maturin and scikit-build-core do, not as the last line of a 30-45 line
traceback; ``KHAL_BUILD_DEBUG=1`` adds the traceback. Checked under plain ``pip wheel`` (no -v),
which shows a failing backend's whole output and nothing of a passing one."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from hatch_khal.errors import CompileError, ConfigError
from hatch_khal.report import DEBUG_ENV, error_block, reported
from khal_runtime.errors import EnvVarError
from tests.conftest import build_env, run
from tests.helpers.projects import make_project

HEADER = "hatch-khal: the kernels of mini-pkg could not be built"


def test_the_block_says_what_where_and_what_to_do() -> None:
    block = error_block(ConfigError("crate 'alpha': option 'archs': 'sm_9' is not a cubin arch like 'sm_90'"),
                        "mini-pkg", "/p/pyproject.toml, build hook `khal`")
    lines = block.splitlines()
    assert lines[1] == f"{HEADER} (ConfigError)"
    assert lines[2] == "  where: /p/pyproject.toml, build hook `khal`"
    assert "  crate 'alpha': option 'archs': 'sm_9' is not a cubin arch like 'sm_90'" in lines
    assert any(line.strip().startswith("What to do:") for line in lines) and f"{DEBUG_ENV}=1" in block


@pytest.mark.parametrize("exc", [ConfigError("bad option"), CompileError("k.cu(3): error: x"),
                                 EnvVarError("KHAL_NO_CACHE='flase' is not understood")])
def test_a_build_error_exits_with_the_block(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                            exc: Exception) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    with pytest.raises(SystemExit) as info:
        with reported("mini-pkg", "here"):
            raise exc
    assert info.value.code == 1 and info.value.__cause__ is None and info.value.__suppress_context__
    err = capsys.readouterr().err
    assert f"{HEADER} ({type(exc).__name__})" in err and str(exc) in err


def test_the_debug_variable_lets_the_error_go_on(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(ConfigError, match="bad option"):
        with reported("mini-pkg", "here"):
            raise ConfigError("bad option")
    assert HEADER in capsys.readouterr().err


def test_a_bug_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    with pytest.raises(KeyError):
        with reported("mini-pkg", "here"):
            raise KeyError("not a build error")


def _pip_wheel(proj: Path, out: Path, cache: Path, **env: str) -> tuple[int, str]:
    e = build_env(cache, **env)
    if DEBUG_ENV not in env:
        e.pop(DEBUG_ENV, None)
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(out), str(proj)],
               env=e, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_plain_pip_wheel_shows_the_block_and_no_traceback(tmp_path: Path, session_cache: Path) -> None:
    """A configuration error (no NVRTC needed: refused before anything compiles) and a variable's
    bad value: pip prints the block, and no frame of the backend."""
    proj = make_project(tmp_path / "p", hook='archs = ["sm_9"]\n')
    rc, out = _pip_wheel(proj, tmp_path / "d", session_cache)
    assert rc != 0 and f"{HEADER} (ConfigError)" in out and "'sm_9' is not a cubin arch" in out, out
    assert "Traceback" not in out and 'File "' not in out, out
    assert f"where: {proj / 'pyproject.toml'}, build hook `khal` (tool.hatch.build.targets.wheel.hooks.khal)" in out

    ok = make_project(tmp_path / "q", hook='archs = ["sm_90"]\nptx-arch = "none"\n')
    rc, out = _pip_wheel(ok, tmp_path / "d", session_cache, KHAL_NO_CACHE="flase")
    assert rc != 0 and f"{HEADER} (EnvVarError)" in out and "KHAL_NO_CACHE='flase' is not understood" in out, out
    assert "Traceback" not in out, out

    rc, out = _pip_wheel(proj, tmp_path / "d", session_cache, **{DEBUG_ENV: "1"})
    assert rc != 0 and f"{HEADER} (ConfigError)" in out and "Traceback" in out, out


@pytest.mark.needs_nvrtc
def test_a_compile_error_is_one_block_with_the_compilers_message(tmp_path: Path, session_cache: Path) -> None:
    bad = "KHAL_ENTRY(fill, 64, (KHAL_STORAGE(uint32_t, out)))\n{\n    out[0] = undeclared_name;\n}\n"
    proj = make_project(tmp_path / "p", hook='archs = ["sm_90"]\nptx-arch = "none"\n',
                        files={"kernels/beta/fill.cu": bad})
    rc, out = _pip_wheel(proj, tmp_path / "d", session_cache)
    assert rc != 0 and f"{HEADER} (CompileError)" in out, out
    assert "undeclared_name" in out and "fill.cu" in out, out
    assert "Traceback" not in out, out


SETUPTOOLS_PYPROJECT = textwrap.dedent("""\
    [build-system]
    requires = ["setuptools>=70", "hatch-khal"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "mini-pkg"
    version = "0.1.0"
    dependencies = ["khal-runtime>=0.1.0"]

    [tool.setuptools]
    packages = ["mini_pkg"]

    [tool.khal]
    archs = ["sm_9"]

    [[tool.khal.crates]]
    name = "alpha"
    sources = ["kernels/*.cu"]
    """)


def test_setuptools_builds_show_the_same_block(tmp_path: Path, session_cache: Path) -> None:
    proj = tmp_path / "s"
    (proj / "mini_pkg").mkdir(parents=True)
    (proj / "mini_pkg" / "__init__.py").write_text("")
    (proj / "pyproject.toml").write_text(SETUPTOOLS_PYPROJECT)
    rc, out = _pip_wheel(proj, tmp_path / "d", session_cache)
    assert rc != 0 and f"{HEADER} (ConfigError)" in out and "'sm_9' is not a cubin arch" in out, out
    assert "[tool.khal] (setuptools command build_khal)" in out and "Traceback" not in out, out
    assert "DISTUTILS_DEBUG=1 (setuptools' variable) shows the traceback" in out, out
