"""A Triton crate builds from what its compile read (issue #37): every module imported and every
file opened from the start of the crate's import to the end of its compile is a fact of the crate
(installed distributions by name and version, the project's files by content), anything else is
refused by name, Triton's own cache is never reused, and the variables Triton says change its
output are in the key. Each test builds small one-kernel crates, changes an input and reads the
constant back from the PTX (never from the hash), or checks that the build refused by name; each
failed on the code before #37."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from hatch_khal.errors import SourceChangedError, UncoveredReadError
from hatch_khal.model import PrintReporter

pytestmark = pytest.mark.needs_triton

#: one cubin and the PTX fallback: the constant a kernel stores is read back from the PTX
TABLE: dict[str, Any] = {"archs": ["sm_80"], "ptx-arch": "compute_80"}

#: a kernel storing the constant ``VALUE`` that the crate's module defines (however it gets it)
KERNEL = """
@triton.jit
def k(x_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(x_ptr + o, tl.full([BLOCK], VALUE, tl.int32))
"""

HEAD = "import os, sys\nimport triton\nimport triton.language as tl\nHERE = os.path.dirname(__file__)\n"
#: the project's lib/ folder on the path, as a crate importing a module of its project does
LIB = "sys.path.insert(0, os.path.join(HERE, '..', 'lib'))\n"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("KHAL_", "TRITON_")) or k in ("DISABLE_LLVM_OPT", "LLVM_PASS_PLUGIN_PATH"):
            monkeypatch.delenv(k)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    return root


def _crates(table: dict[str, Any] | None = None) -> Any:
    t = {**TABLE, **(table or {}), "crates": [{"name": "t", "sources": ["k/*.py"], "instances": [
        {"kernel": "k", "signature": {"x_ptr": "*i32", "BLOCK": 64}}]}]}
    return parse_config(t, default_package="pkg")[1]


def _build(root: Path, cache: Path | None, table: dict[str, Any] | None = None, **kw: Any) -> Any:
    from hatch_khal.builder import build_packages

    return build_packages(root, _crates(table), PrintReporter(), cache=Cache(cache, print) if cache else Cache(None),
                          jobs=1, **kw)


def _ptx(result: Any) -> str:
    (pkg,) = result.packages
    (ptx,) = [data for name, data in pkg.files.items() if name.endswith(".ptx")]
    return bytes(ptx).decode()


def _stores(result: Any, value: int) -> bool:
    """Whether the crate's PTX stores ``value`` (a ``mov.b32 %r, value;``)."""
    return f", {value};" in _ptx(result)


# -- (1) Triton's own cache: never reused across builds --------------------------------------------

@pytest.mark.parametrize("how", ["constexpr_function", "default_argument"])
def test_a_constant_that_tritons_cache_key_misses_rebuilds_with_triton_cache_dir_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "users-triton-cache"))
    # Triton's key holds the source of the kernel, of its helpers and constexpr functions, and the
    # tl.constexpr globals they name; not a plain global a constexpr function returns, nor one a
    # helper's default argument names
    if how == "constexpr_function":
        src = HEAD + "SCALE = {v}\n\n@triton.constexpr_function\ndef value():\n    return SCALE\n\nVALUE = 0\n" \
            + KERNEL.replace("VALUE, tl.int32", "value(), tl.int32")
    else:
        src = HEAD + "SCALE = tl.constexpr({v})\nVALUE = 0\n\n@triton.jit\ndef fill(x_ptr, o, v=SCALE):\n" \
            "    tl.store(x_ptr + o, tl.full(o.shape, v, tl.int32))\n" \
            + KERNEL.replace("tl.store(x_ptr + o, tl.full([BLOCK], VALUE, tl.int32))", "fill(x_ptr, o)")
    root = _write(tmp_path / "p", {"k/k.py": src.format(v=7770001)})
    cache = tmp_path / "cache"
    assert _stores(_build(root, cache), 7770001)
    (root / "k" / "k.py").write_text(src.format(v=7770002))
    assert _stores(_build(root, cache), 7770002)


def test_the_users_triton_cache_dir_is_neither_read_nor_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    users = tmp_path / "users-triton-cache"
    users.mkdir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(users))
    root = _write(tmp_path / "p", {"k/k.py": HEAD + "VALUE = tl.constexpr(7770003)\n" + KERNEL})
    assert _stores(_build(root, None), 7770003)
    assert list(users.iterdir()) == []


# -- (2) every variable Triton says invalidates its cache is in the key ----------------------------

@pytest.mark.parametrize("var", ["DISABLE_LLVM_OPT", "LLVM_PASS_PLUGIN_PATH"])
def test_a_variable_triton_says_invalidates_its_cache_changes_the_content_hash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    from hatch_khal.triton.language import TRITON

    root = _write(tmp_path, {"k/k.py": HEAD + "VALUE = tl.constexpr(1)\n" + KERNEL})
    (crate,) = _crates()
    base = TRITON.plan(root, crate).content_hash
    monkeypatch.setenv("KHAL_SOMETHING_TRITON_IGNORES", "1")
    assert TRITON.plan(root, crate).content_hash == base
    monkeypatch.setenv(var, "1" if var == "DISABLE_LLVM_OPT" else str(tmp_path / "plugin.so"))
    assert TRITON.plan(root, crate).content_hash != base


def test_the_variables_come_from_the_installed_triton() -> None:
    from hatch_khal.triton.knobs import compile_environment
    from hatch_khal.triton.language import triton_version

    got = compile_environment(triton_version(), {**os.environ, "DISABLE_LLVM_OPT": "1", "TRITON_F32_DEFAULT": "ieee",
                                                 "TRITON_CACHE_DIR": "/x", "UNRELATED": "1"})
    assert "DISABLE_LLVM_OPT" in got and got["TRITON_F32_DEFAULT"] == "ieee"
    assert "TRITON_CACHE_DIR" not in got and "UNRELATED" not in got


# -- (3) a project whose path looks installed is still the project ---------------------------------

@pytest.mark.parametrize("folder", ["site-packages", "my-packages"])
def test_a_project_under_a_packages_folder_tracks_the_modules_it_imports(tmp_path: Path, folder: str) -> None:
    root = _write(tmp_path / folder / "proj", {
        "k/k.py": HEAD + LIB + "from consts import VALUE\n" + KERNEL,
        "lib/consts.py": "import triton.language as tl\nVALUE = tl.constexpr(7770011)\n"})
    cache = tmp_path / "cache"
    first = _build(root, cache)
    assert _stores(first, 7770011)
    (root / "lib" / "consts.py").write_text("import triton.language as tl\nVALUE = tl.constexpr(7770012)\n")
    assert _stores(_build(root, cache), 7770012)


# -- (4) a module outside the crate saved while Triton compiled ------------------------------------

def test_a_project_module_saved_during_the_compile_is_a_source_changed_error(tmp_path: Path) -> None:
    saves = ("open(os.path.join(HERE, '..', 'lib', 'consts.py'), 'a').write('# saved\\n')\n")
    root = _write(tmp_path / "p", {
        "k/k.py": HEAD + LIB + "from consts import VALUE\n" + KERNEL + saves,
        "lib/consts.py": "import triton.language as tl\nVALUE = tl.constexpr(7770021)\n"})
    cache = tmp_path / "cache"
    with pytest.raises(SourceChangedError, match=r"lib/consts\.py, which its Triton sources read, changed while "
                                                 r"the crate compiled"):
        _build(root, cache)
    assert not list((cache / "v1").rglob("artifact.bin"))  # nothing cached


# -- (5) lib.sub.helper(): an installed library's @triton.jit functions, covered by its version ----

def _install(site: Path, version: str, value: int) -> None:
    """A distribution ``khal-test-lib`` with ``khal_test_lib.sub.helper``, a @triton.jit function."""
    import shutil

    for old in site.glob("khal_test_lib*"):
        shutil.rmtree(old)
    pkg = site / "khal_test_lib"
    (pkg / "sub").mkdir(parents=True)
    files = {"khal_test_lib/__init__.py": "from . import sub\n",
             "khal_test_lib/sub/__init__.py": "import triton\nimport triton.language as tl\n\n@triton.jit\n"
                                              f"def helper(x_ptr, o):\n    tl.store(x_ptr + o, tl.full(o.shape, {value}, "
                                              "tl.int32))\n"}
    for rel, text in files.items():
        (site / rel).write_text(text)
    info = site / f"khal_test_lib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: khal-test-lib\nVersion: {version}\n")
    record = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in record))


def test_an_installed_librarys_jit_function_two_attributes_deep_is_covered_by_its_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "env" / "site-packages"
    site.mkdir(parents=True)
    _install(site, "1.0", 7770031)
    monkeypatch.syspath_prepend(str(site))
    root = _write(tmp_path / "p", {"k/k.py": HEAD + "import khal_test_lib as lib\n\n@triton.jit\n"
                                              "def k(x_ptr, BLOCK: tl.constexpr):\n"
                                              "    lib.sub.helper(x_ptr, tl.arange(0, BLOCK))\n"})
    cache = tmp_path / "cache"
    first = _build(root, cache)
    assert _stores(first, 7770031)
    (crate,) = first.packages[0].manifest.crates
    assert not [s for s in crate.sources if "khal_test_lib" in s.path]  # counted by version, not listed
    _install(site, "1.1", 7770032)  # an upgrade
    second = _build(root, cache)
    assert _stores(second, 7770032)
    assert second.packages[0].manifest.crates[0].entries[0].hash != crate.entries[0].hash


def test_a_jit_function_of_a_project_module_outside_the_crate_is_hashed_by_content(tmp_path: Path) -> None:
    """Refused before #37 (the entry hash could not cover it); the compile's reads cover it now."""
    helper = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef twice(x):\n    return x * {v}\n"
    root = _write(tmp_path / "p", {
        "k/k.py": HEAD + LIB + "from outside import twice\n\n@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n"
                  "    o = tl.arange(0, BLOCK)\n    tl.store(x_ptr + o, twice(tl.full([BLOCK], 1, tl.int32)))\n",
        "lib/outside.py": helper.format(v=7770041)})
    cache = tmp_path / "cache"
    first = _build(root, cache)
    assert _stores(first, 7770041)
    assert "lib/outside.py" in [s.path for s in first.packages[0].manifest.crates[0].sources]
    (root / "lib" / "outside.py").write_text(helper.format(v=7770042))
    assert _stores(_build(root, cache), 7770042)


# -- (6) data files read at import -----------------------------------------------------------------

DATA_KERNEL = (HEAD + "import json\nwith open({where}) as f:\n    VALUE = tl.constexpr(json.load(f)['value'])\n"
               + KERNEL)


def test_a_data_file_of_the_project_read_at_import_rebuilds_when_it_changes(tmp_path: Path) -> None:
    root = _write(tmp_path / "p", {"k/k.py": DATA_KERNEL.format(where="os.path.join(HERE, '..', 'tuning.json')"),
                                   "tuning.json": json.dumps({"value": 7770051})})
    cache = tmp_path / "cache"
    assert _stores(_build(root, cache), 7770051)
    (root / "tuning.json").write_text(json.dumps({"value": 7770052}))
    assert _stores(_build(root, cache), 7770052)


def test_a_file_read_from_outside_the_project_is_refused_by_name(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "tuning.json"
    outside.parent.mkdir()
    outside.write_text(json.dumps({"value": 7770061}))
    root = _write(tmp_path / "p", {"k/k.py": DATA_KERNEL.format(where=repr(str(outside)))})
    with pytest.raises(UncoveredReadError, match=rf"read {outside}, which is neither in the project nor in an "
                                                 r"installed distribution"):
        _build(root, tmp_path / "cache")


def test_reads_of_the_machines_pseudo_files_at_import_are_neither_hashed_nor_refused(tmp_path: Path) -> None:
    """torch reads /proc/self/maps when it is imported (Liger-Kernel's modules import it): /proc, /sys
    and /dev describe the running machine, not a source; a build of such a crate is not refused."""
    root = _write(tmp_path / "p", {"k/k.py": HEAD + "with open('/proc/self/maps') as f:\n    f.read()\n"
                                   "os.listdir('/sys')\n" + KERNEL.replace("VALUE", "7770071")})
    assert _stores(_build(root, tmp_path / "cache"), 7770071)


def test_a_module_imported_from_outside_the_project_is_refused_by_name(tmp_path: Path) -> None:
    lib = tmp_path / "elsewhere"
    lib.mkdir()
    (lib / "far_consts.py").write_text("import triton.language as tl\nVALUE = tl.constexpr(7)\n")
    root = _write(tmp_path / "p", {"k/k.py": HEAD + f"sys.path.insert(0, {str(lib)!r})\nfrom far_consts import VALUE\n"
                                   + KERNEL})
    with pytest.raises(UncoveredReadError, match=r"far_consts\.py"):
        _build(root, tmp_path / "cache")


def test_a_project_file_looked_for_and_absent_rebuilds_when_it_appears(tmp_path: Path) -> None:
    src = DATA_KERNEL.format(where="os.path.join(HERE, '..', 'conf', 'tuning.json')").replace(
        "with open(", "try:\n    f = open(").replace(
        "as f:\n    VALUE = tl.constexpr(json.load(f)['value'])",
        "\n    VALUE = tl.constexpr(json.load(f)['value'])\nexcept FileNotFoundError:\n    VALUE = tl.constexpr(7770071)")
    root = _write(tmp_path / "p", {"k/k.py": src})
    cache = tmp_path / "cache"
    assert _stores(_build(root, cache), 7770071)
    (root / "conf").mkdir()
    (root / "conf" / "tuning.json").write_text(json.dumps({"value": 7770072}))
    assert _stores(_build(root, cache), 7770072)


# -- (7) editable installs recheck every project file the build read -------------------------------

def test_an_editable_install_is_stale_when_a_project_module_its_kernels_import_changes(tmp_path: Path) -> None:
    from hatch_khal.builder import write_package_output
    from khal_runtime.errors import StaleBuildError
    from khal_runtime.verify import check_package

    root = _write(tmp_path / "p", {"k/k.py": HEAD + LIB + "from consts import VALUE\n" + KERNEL,
                                   "lib/consts.py": "import triton.language as tl\nVALUE = tl.constexpr(7770081)\n"})
    result = _build(root, tmp_path / "cache", editable=True)
    for out in result.packages:
        write_package_output(out, root / out.package)
    check_package(root / "pkg", symbols=False)
    (root / "lib" / "consts.py").write_text("import triton.language as tl\nVALUE = tl.constexpr(7770082)\n")
    with pytest.raises(StaleBuildError, match=r"lib/consts\.py changed"):
        check_package(root / "pkg", symbols=False)


# -- a crate file saved between the two workers' imports: SourceChangedError, in every Python mode ---

#: the first worker to import the crate rewrites it once its kernel is made (a save in an editor);
#: the second waits for that save before it reads the kernel's file (the wait is in ``k/a.py``, a
#: source the worker imports before ``k/k.py``: a module's own source is read before any of it runs),
#: so the two compile different sources. With ``restore``, the first then saves it back as it was,
#: its stat too, once the second made its kernel
GATE = """import os, time
HERE = os.path.dirname(__file__)
FIRST, DONE = (os.path.join(HERE, '..', n) for n in ('first', 'done'))
try:
    fd = os.open(FIRST, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
except FileExistsError:
    for _ in range(1200):
        if os.path.exists(DONE):
            break
        time.sleep(0.05)
"""
RACE = HEAD + """import time
FIRST, DONE, SEEN = (os.path.join(HERE, '..', n) for n in ('first', 'done', 'seen'))


def wait(path):
    for _ in range(1200):
        if os.path.exists(path):
            return
        time.sleep(0.05)


with open(FIRST) as f:
    first = f.read() == str(os.getpid())
VALUE = tl.constexpr({v})
""" + KERNEL + """
if first:
    me = os.path.join(HERE, 'k.py')
    st = os.stat(me)
    with open(me) as f:
        text = f.read()
    with open(me, 'w') as f:
        f.write(text.replace('tl.constexpr({v})', 'tl.constexpr({w})'))
    open(DONE, 'w').close()
    if {restore}:
        wait(SEEN)
        with open(me, 'w') as f:
            f.write(text)
        os.utime(me, ns=(st.st_atime_ns, st.st_mtime_ns))
else:
    open(SEEN, 'w').close()
"""


@pytest.mark.parametrize("restore", [False, True])
def test_a_crate_file_saved_between_the_workers_imports_is_a_source_changed_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore: bool) -> None:
    monkeypatch.setenv("KHAL_JOBS", "2")  # two targets: two workers
    root = _write(tmp_path / "p", {"k/a.py": GATE, "k/k.py": RACE.format(v=7770091, w=7770092, restore=restore)})
    what = r"the Triton workers compiled different sources of k" if restore else r"k/k\.py changed while Triton"
    with pytest.raises(SourceChangedError, match=what):
        _build(root, tmp_path / "cache")


def test_under_python_O_a_crate_file_saved_between_the_workers_imports_is_refused_too(tmp_path: Path) -> None:
    import subprocess

    root = _write(tmp_path / "p", {"k/a.py": GATE, "k/k.py": RACE.format(v=7770093, w=7770094, restore=True)})
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {[str(Path(__file__).resolve().parents[2])]!r}
        from tests.build.test_triton_reads import _build
        from hatch_khal.errors import SourceChangedError
        from pathlib import Path
        try:
            _build(Path({str(root)!r}), None)
        except SourceChangedError as exc:
            print("refused:", exc)
        else:
            print("built")
        """)
    env = {**os.environ, "KHAL_JOBS": "2"}
    run = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert "refused:" in run.stdout and "compiled different sources" in run.stdout, run.stdout + run.stderr


# -- reproducible: an sm_100 Triton crate from two directories and two caches -----------------------

def test_an_sm_100_triton_crate_reading_a_project_module_builds_byte_identical_from_two_directories(
        tmp_path: Path) -> None:
    files = {"k/k.py": HEAD + LIB + "from consts import VALUE\n" + KERNEL,
             "lib/consts.py": "import triton.language as tl\nVALUE = tl.constexpr(7770101)\n"}
    table = {"archs": ["sm_100"], "ptx-arch": "none"}
    a = _build(_write(tmp_path / "a" / "p", files), tmp_path / "a" / "cache", table)
    b = _build(_write(tmp_path / "b" / "deeper" / "p", files), tmp_path / "b" / "cache", table)
    (pa,), (pb,) = a.packages, b.packages
    assert any(name.endswith("sm_100a.cubin") for name in pa.files)
    assert pa.files == pb.files


# -- the worker's audit, unit by unit --------------------------------------------------------------

def test_the_project_wins_over_the_interpreters_folders_and_writes_and_caches_are_read_as_their_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A project inside what looks like the interpreter's standard library is still the project; a
    file opened only for writing is no read; a module's cached .pyc counts as its source."""
    from hatch_khal.triton import audit

    root = tmp_path / "prefix" / "lib" / "python3" / "proj"
    (root / "m" / "__pycache__").mkdir(parents=True)
    (root / "m" / "mod.py").write_text("X = 1\n")
    pyc = root / "m" / "__pycache__" / f"mod.{sys.implementation.cache_tag}.pyc"
    pyc.write_bytes(b"\0")
    (root / "out.txt").write_text("")
    monkeypatch.setattr(audit, "_interpreter", lambda: audit._Interpreter([str(tmp_path / "prefix")], [], set()))
    a = audit.Audit()
    a.armed = True
    a._opened(str(pyc), "r", 0)
    a._opened(str(root / "out.txt"), "w", 0)
    a._opened(str(root / "gone.json"), "r", 0)
    got = a.facts(str(root), [], [], set(sys.modules))
    assert [p[0] for p in got["project"]] == ["gone.json", "m/mod.py"]
    assert got["project"][0][1] is None and got["outside"] == []
