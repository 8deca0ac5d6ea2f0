"""A kernel language that is not hatch-khal's (#40 item 1): ``tests/packages/ew_language``
registers "elementwise" (``.ew`` files) through the entry-point groups ``hatch_khal.languages``
and ``khal_runtime.languages`` alone. Installed beside the hook, it builds a real wheel of
``tests/packages/ew_kernels_pkg`` (its own crate option, its requirements, its stub and inspect
lines) whose kernels load and launch on the fake driver; neither package names it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import build_env
from tests.helpers.fakecuda import FakeDriver, fake  # noqa: F401  (fixture)

pytestmark = pytest.mark.needs_nvrtc

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "tests" / "packages"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The plugin installed into a folder of its own (``site``, on PYTHONPATH for the build), and
    the package's wheel built by pip with it, unpacked into ``inst``."""
    tmp = tmp_path_factory.mktemp("ew")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(PACKAGES / "ew_language")], check=True, capture_output=True, timeout=300)
    proj = tmp / "proj"
    shutil.copytree(PACKAGES / "ew_kernels_pkg", proj)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w",
                          str(tmp / "dist"), str(proj)], capture_output=True, text=True, timeout=600,
                         env=build_env(tmp / "cache", KHAL_CACHE_URL="none", PYTHONPATH=str(site)))
    assert out.returncode == 0, out.stderr[-3000:]
    wheel = next((tmp / "dist").glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp / "inst")
    return {"site": site, "inst": tmp / "inst", "wheel": wheel, "proj": proj}


def _use_plugin(monkeypatch: pytest.MonkeyPatch, site: Path) -> None:
    """The plugin importable in this process, the registries' caches fresh (and restored after)."""
    import hatch_khal.languages as build_languages
    import khal_runtime.languages as runtime_languages

    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(build_languages, "_loaded", {})
    runtime_languages.language_for.cache_clear()



@pytest.fixture(autouse=True)
def _clear_runtime_languages() -> Iterator[None]:
    """The run-time registry's cache holds the plugin's counterpart: cleared after each test."""
    yield
    import khal_runtime.languages as runtime_languages

    runtime_languages.language_for.cache_clear()


def test_neither_package_names_the_language() -> None:
    for pkg in ("hatch_khal", "khal_runtime"):
        hits = [p for p in (ROOT / pkg).rglob("*.py") if "elementwise" in p.read_text().lower()]
        assert hits == [], f"{pkg} names the plugin language: {hits}"


@pytest.mark.slow  # builds a wheel with pip
def test_the_plugin_builds_a_wheel_whose_kernels_launch(built: dict[str, Path], fake: FakeDriver,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from khal_runtime import DeviceBuffer

    _use_plugin(monkeypatch, built["site"])
    monkeypatch.syspath_prepend(str(built["inst"]))
    import ew_kernels_pkg

    try:
        kernels = ew_kernels_pkg.kernels
        crate = kernels.crates["ew"]
        assert crate.crate.language == "elementwise"
        assert sorted(e.name for e in crate.crate.entries) == ["fma1", "scaled"]
        # the crate's own option gave the block size: 64 threads, so 1000 elements are 16 blocks
        assert {e.block_size for e in crate.crate.entries} == {(64, 1, 1)}
        x, y, out = (DeviceBuffer(0x1000 * (i + 1), 1000, "float32", 0) for i in range(3))
        kernels.fma1(1000, x, y, out)
        (launch,) = fake.launches
        assert launch["grid"] == (16, 1, 1) and launch["block"] == (64, 1, 1)
        # the plugin's run-time counterpart names it in the crate's messages
        from khal_runtime.languages import language_for

        assert language_for("elementwise").title == "Elementwise"
    finally:
        for m in [m for m in sys.modules if m.startswith("ew_kernels_pkg")]:
            del sys.modules[m]


@pytest.mark.slow  # builds a wheel with pip
def test_the_plugin_writes_its_stub_and_inspect_lines(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    stub = (built["inst"] / "ew_kernels_pkg" / "_khal" / "__init__.pyi").read_text()
    assert "Crate ``ew`` (Elementwise)" in stub and "class Kernel_ew__fma1(Kernel):" in stub
    _use_plugin(monkeypatch, built["site"])
    from hatch_khal.__main__ import main

    monkeypatch.syspath_prepend(str(built["inst"]))
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["inspect", str(built["wheel"])]) == 0
    assert "crate ew: Elementwise, 1 source file(s), CUDA binaries from NVRTC" in buf.getvalue()


@pytest.mark.slow  # builds a wheel with pip
def test_the_plugin_validates_its_own_option_and_others_refuse_it(built: dict[str, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from hatch_khal.config import parse_config
    from hatch_khal.errors import ConfigError

    _use_plugin(monkeypatch, built["site"])
    _, (c,) = parse_config({"crates": [{"name": "e", "sources": ["k/*.ew"], "elementwise-block": 256}]},
                           default_package="p")
    assert (c.language, c.language_options) == ("elementwise", {"block": 256})
    with pytest.raises(ConfigError, match=r"crates\[0\] 'e': option 'elementwise-block' must be a power of two"):
        parse_config({"crates": [{"name": "e", "sources": ["k/*.ew"], "elementwise-block": 96}]}, default_package="p")
    with pytest.raises(ConfigError, match=r"option 'elementwise-block' is for Elementwise crates; this crate's "
                                          r"sources are CUDA C\+\+"):
        parse_config({"crates": [{"name": "e", "sources": ["k/*.cu"], "elementwise-block": 64}]}, default_package="p")
    with pytest.raises(ConfigError, match=r"mixes Elementwise sources \(k/\*.ew\) with CUDA C\+\+ sources"):
        parse_config({"crates": [{"name": "e", "sources": ["k/*.ew", "k/*.cu"]}]}, default_package="p")
    # chosen by name, whatever the suffix
    _, (named,) = parse_config({"crates": [{"name": "e", "sources": ["k/*.txt"], "language": "elementwise"}]},
                               default_package="p")
    assert named.language == "elementwise"
    # without the plugin: an unknown key, named as before
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(built["site"])])
    import hatch_khal.languages as build_languages

    monkeypatch.setattr(build_languages, "_loaded", {})
    with pytest.raises(ConfigError, match=r"unknown option 'crates\[0\].elementwise-block'"):
        parse_config({"crates": [{"name": "e", "sources": ["k/*.ew"], "elementwise-block": 64}]}, default_package="p")


def test_a_language_missing_a_member_is_refused_when_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As pluggy checks a plugin at registration: the error names the entry point and the members."""
    import hatch_khal.languages as build_languages
    from hatch_khal.errors import ConfigError

    dist = tmp_path / "broken_lang-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-lang\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[hatch_khal.languages]\nbroken = broken_lang:LANG\n")
    (tmp_path / "broken_lang.py").write_text("class L:\n    name = 'broken'\n    def plan(self, root, cfg): ...\n"
                                             "LANG = L()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(build_languages, "_loaded", {})
    with pytest.raises(ConfigError, match=r"language 'broken' \(entry point of broken-lang: broken_lang:LANG\) is not "
                                          r"a hatch-khal Language: it has no title, suffixes, .*subclass "
                                          r"hatch_khal.languages.LanguageBase"):
        build_languages.get_language("broken", "c")


def test_the_built_in_languages_are_hatch_khals_own_entry_points() -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    from hatch_khal.languages import LANGUAGES

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["hatch_khal.languages"] == LANGUAGES


def test_the_previous_releases_suffix_table_still_reads_with_a_warning() -> None:
    import hatch_khal.config as config

    with pytest.warns(DeprecationWarning, match=r"all_languages\(\)\[name\].suffixes"):
        table = config.LANGUAGE_SUFFIXES
    assert table == {".slang": "slang", ".py": "triton"}  # as the previous release spelt it
