"""A kernel language's run-time part is a plug-in (#40 item 1, the run-time half): the generic layers
ask a crate's :class:`~khal_runtime.languages.CrateLanguage`, found by :func:`language_for` among the
built-ins, else the entry points of group ``khal_runtime.languages``, else the plain default.

A crate of a new language is shown loading and launching on the fake driver (a package written
with that language's name in its manifest, as a build of it writes; tests/build/test_language_plugin.py
builds one for real)."""

from __future__ import annotations

import importlib.metadata
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

import khal_runtime
from khal_runtime import backends, languages
from khal_runtime import kernels as kernels_mod
from khal_runtime.backends.cuda import driver as cuda_driver
from khal_runtime.buffers import DeviceBuffer
from khal_runtime.errors import BackendUnavailableError
from khal_runtime.languages import CUDA, GROUP, LANGUAGES, CrateLanguage, PlainLanguage, language_for
from khal_runtime.manifest_load import load_manifest
from khal_runtime.triton import TritonKernel

from tests.conftest import RUNTIME
from tests.helpers.fakecuda import FakeDriver, _reset_runtime, fake, fake_kernels, make_entry, storage  # noqa: F401
from tests.helpers.fakecuda import stream, write_package
from tests.helpers.triton_fake import Tensor, load_crate, param, variant

ENTRY = make_entry("scale", (storage("x", writable=True),))


@pytest.fixture(autouse=True)
def _fresh_lookups() -> Iterator[None]:
    """Each test looks languages up afresh (a cached plug-in of one test is none of the next's)."""
    language_for.cache_clear()
    yield
    language_for.cache_clear()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """``site(dist, {name: "module:attr"}, module, source)``: an installed distribution as
    importlib.metadata finds it on ``sys.path`` (``<dist>-1.0.dist-info`` with METADATA and an
    entry_points.txt of group khal_runtime.languages) and its module ``<module>.py``; the modules are
    forgotten afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    modules: list[str] = []

    def install(dist: str, entry_points: dict[str, str], module: str, source: str) -> None:
        info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
        (root / f"{module}.py").write_text(textwrap.dedent(source))
        modules.append(module)

    yield install
    for m in modules:
        sys.modules.pop(m, None)


#: a language whose setup gives each entry a second name (``<entry>_twice``: a launcher of its own that
#: launches the entry twice) and whose crates have an own call ``describe``
MYLANG = '''
    from khal_runtime.languages import PlainLanguage


    class Twice:
        def __init__(self, kernel):
            self.kernel = kernel
            self.name, self.crate = kernel.name + "_twice", kernel.crate

        def __call__(self, n, *args, **kw):
            self.kernel(n, *args, **kw)
            self.kernel(n, *args, **kw)


    class MyLanguage(PlainLanguage):
        set_up = []

        def setup(self, kernels):
            self.set_up.append(kernels.name)
            entries = {k.name: k for k in kernels}
            kernels.instances = entries
            kernels.replace_kernels({**entries, **{t.name: t for t in map(Twice, entries.values())}})

        def function(self, kernels, name):
            return (lambda: f"{kernels.name} of {self.title}") if name == "describe" else None

        def function_names(self, kernels):
            return ["describe"]


    MYLANG = MyLanguage("mylang", "My Language")
'''


@pytest.fixture
def mylang(site: Callable[..., None]) -> None:
    site("mylang-khal", {"mylang": "mylang_rt:MYLANG"}, "mylang_rt", MYLANG)


# -- the registry --------------------------------------------------------------------------------
def test_the_built_in_table_and_the_runtime_distributions_entry_points_agree() -> None:
    """runtime/pyproject.toml registers the built-ins in the group as LANGUAGES names them."""
    project = tomllib.loads((RUNTIME / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["entry-points"][GROUP] == LANGUAGES
    for name in LANGUAGES:
        language = language_for(name)
        assert language.name == name
        assert languages.check_language(language, name, "built in") is language


def test_the_checked_members_are_the_protocols() -> None:
    declared = [n for n in [*CrateLanguage.__annotations__, *vars(CrateLanguage)] if not n.startswith("_")]
    assert sorted(languages.MEMBERS) == sorted(dict.fromkeys(declared))
    methods = [n for n, v in vars(CrateLanguage).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert sorted(languages.CALLABLE) == sorted(methods)


def test_built_in_names_are_never_scanned_for(fake: FakeDriver, tmp_path: Path,  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan costs milliseconds on the load path: CUDA C++, Slang and Triton crates load and
    launch with ``entry_points`` unusable."""

    def no_scan(**kw: Any) -> Any:
        raise AssertionError(f"entry points scanned for a built-in language ({kw})")

    monkeypatch.setattr(importlib.metadata, "entry_points", no_scan)
    x = DeviceBuffer(0x1000, 256, "float32", 0)
    cuda = fake_kernels(fake, tmp_path / "cuda", [ENTRY])
    cuda.scale(256, x, stream=stream())
    assert cuda.crates["c"].language is CUDA
    slang = khal_runtime.load(write_package(tmp_path / "slang", [ENTRY], package="slangpkg", language="slang"))
    assert slang.crates["c"].language.name == "slang"
    tri = load_crate(fake, tmp_path / "triton", [variant("k", [param("x"), param("n")],
                                                         {"x": "*fp32:16", "n": "i32"}, {}, name="fam", family="fam")])
    assert tri.crates["c"].language.name == "triton" and isinstance(tri.fam, TritonKernel)
    tri.fam[(1,)](Tensor(0x1000), 64)
    assert len(fake.launches) == 2
    assert [language_for(n).name for n in LANGUAGES] == list(LANGUAGES)


def test_an_unknown_language_gets_the_plain_default(fake: FakeDriver, tmp_path: Path,  # noqa: F811
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No run-time part installed: the entries launch as CUDA kernels, with no WebGPU build."""
    scans: list[str] = []
    real = importlib.metadata.entry_points

    def counted(**kw: Any) -> Any:
        scans.append(kw["group"])
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    lang = language_for("fortran")
    assert type(lang) is PlainLanguage and lang.name == lang.title == "fortran"
    assert language_for("fortran") is lang and scans == [GROUP]  # cached: scanned once
    ks = fake_kernels(fake, tmp_path, [ENTRY], language="fortran")
    ck = ks.crates["c"]
    assert ck.language is lang and ck.function_names() == [] and ck.function("scale") is None
    ks.scale(256, DeviceBuffer(0x1000, 256, "float32", 0), stream=stream())
    assert len(fake.launches) == 1
    assert lang.webgpu_missing(ck.crate) == ("its sources are fortran, which only the CUDA backend runs (write the "
                                             "crate in Slang to run it on WebGPU)")
    assert scans == [GROUP]


# -- a language from an entry point --------------------------------------------------------------
def test_a_language_from_an_entry_point_is_found_and_its_setup_applied(
        fake: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mylang: None) -> None:  # noqa: F811
    lang = language_for("mylang")
    assert type(lang).__name__ == "MyLanguage" and lang.title == "My Language"
    ks = fake_kernels(fake, tmp_path, [ENTRY], language="mylang")
    ck = ks.crates["c"]
    assert ck.language is lang and lang.set_up == ["c"]  # type: ignore[attr-defined]
    assert set(ck.instances) == {"scale"}
    # its own launchers are the crate's attributes (and the package's), its own call too
    x = DeviceBuffer(0x1000, 256, "float32", 0)
    ks.scale_twice(256, x, stream=stream())
    assert [launch["f"] for launch in fake.launches] == [f"FUNC:{ENTRY.symbol}"] * 2
    ks.crates["c"].scale(256, x, stream=stream())
    assert len(fake.launches) == 3
    assert ck.describe() == "c of My Language" and ks.describe() == "c of My Language"
    assert "describe" in dir(ck) and ck.function("nothing") is None
    # no WebGPU build: the plain default's reason, with the language's title
    assert lang.webgpu_missing(ck.crate) == ("its sources are My Language, which only the CUDA backend runs "
                                             "(write the crate in Slang to run it on WebGPU)")


def test_a_crate_of_a_plug_in_language_has_no_webgpu_build_to_fall_back_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mylang: None) -> None:
    """``auto`` without CUDA: the crate has no WebGPU build (its language says so), so no fallback."""
    drv = FakeDriver()
    drv.devices = 0
    monkeypatch.setenv("KHAL_BACKEND", "auto")
    monkeypatch.setattr(cuda_driver, "_driver", drv)
    _reset_runtime()
    try:
        ks = fake_kernels(drv, tmp_path, [ENTRY], language="mylang")
        with pytest.raises(BackendUnavailableError, match=r"no CUDA device/driver was found.*; and crate 'c' of "
                                                          r"package 'fakepkg' has no WebGPU build to fall back to"):
            ks.crates["c"].load()
        assert backends.get("webgpu").missing_binary(ks.crates["c"].crate, "fakepkg") == (
            "package 'fakepkg' crate 'c' has no WebGPU build: its sources are My Language, which only the CUDA "
            "backend runs (write the crate in Slang to run it on WebGPU)")
    finally:
        _reset_runtime()


def test_a_malformed_language_fails_when_it_is_loaded_naming_the_entry_point_and_member(
        fake: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        site: Callable[..., None]) -> None:
    site("badlang-khal", {"badlang": "badlang_rt:BAD", "misnamed": "badlang_rt:MISNAMED"}, "badlang_rt", '''
        from khal_runtime.languages import PlainLanguage


        class Bad:  # no serves
            name = "badlang"
            title = "Bad"
            function = function_names = setup = webgpu_missing = lambda *a: None


        BAD = Bad()
        MISNAMED = PlainLanguage("other")
        ''')
    msg = (r"kernel language 'badlang' \(entry point badlang = 'badlang_rt:BAD' in group khal_runtime.languages of "
           r"distribution badlang-khal 1.0\) does not implement khal_runtime.languages.CrateLanguage: missing serves")
    with pytest.raises(TypeError, match=msg):
        language_for("badlang")
    # at the package's load, before anything launches
    with pytest.raises(TypeError, match=msg):
        fake_kernels(fake, tmp_path, [ENTRY], language="badlang")
    assert fake.launches == []
    with pytest.raises(TypeError, match=r"kernel language 'misnamed' \(entry point misnamed = .*\) is called 'other'"):
        language_for("misnamed")


def test_an_entry_point_that_does_not_import_is_named(site: Callable[..., None]) -> None:
    site("broken-khal", {"broken": "broken_rt:LANG"}, "broken_rt", "import no_such_module_khal\n")
    with pytest.raises(ImportError, match=r"kernel language 'broken' \(entry point broken = 'broken_rt:LANG' .*"
                                          r"distribution broken-khal 1.0\) cannot be loaded: ModuleNotFoundError"):
        language_for("broken")


def test_a_class_registered_as_a_language_is_instantiated(site: Callable[..., None]) -> None:
    site("classy-khal", {"classy": "classy_rt:Classy"}, "classy_rt", '''
        from khal_runtime.languages import PlainLanguage


        class Classy(PlainLanguage):
            def __init__(self):
                super().__init__("classy", "Classy")
        ''')
    lang = language_for("classy")
    assert type(lang).__name__ == "Classy" and lang.title == "Classy"


def test_the_built_in_languages_say_why_a_crate_has_no_webgpu_build(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, [ENTRY])
    crate = load_manifest(pkg / "_khal" / "manifest.json").crates[0]
    assert language_for("cuda").webgpu_missing(crate) == (
        "its sources are CUDA C++, which only the CUDA backend runs (write the crate in Slang to run it on WebGPU)")
    assert str(language_for("triton").webgpu_missing(crate)).startswith("its sources are Triton, which only")
    skipped = crate.model_copy(update={"language": "slang", "spirv": crate.spirv.model_copy(
        update={"status": "skipped", "reason": "KHAL_SKIP_SPIRV is set"})})
    assert language_for("slang").webgpu_missing(skipped) == (
        "it was built without its WebGPU stage (KHAL_SKIP_SPIRV is set): rebuild without KHAL_SKIP_SPIRV")
    assert not language_for("cuda").serves(crate) and not language_for("slang").serves(crate)
