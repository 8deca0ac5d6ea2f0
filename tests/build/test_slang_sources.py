"""A Slang crate's files: imports followed as Slang follows them, and the content hash (and so every
entry hash) changing with a source or an imported module, and with nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from hatch_khal.errors import ConfigError, SourceError
from hatch_khal.slang.sources import collect_slang_sources
from tests.helpers.slang import needs_slang, plan, write
from tests.helpers.slang import one_entry

FILES = {
    "k/a.slang": """\
        import util;              // include dir
        import sub.deep_mod;      // dotted, '_' -> '-'
        import "rel/x.slang";     // next to the file
        #include "inc.slang"
        // import ghost;          (a comment: not followed)
        /* import ghost2; */
        """,
    "mods/util.slang": "module util;\nimport helper;\n",
    "mods/helper.slang": "module helper;\n",
    "mods/sub/deep-mod.slang": "module deep_mod;\n",
    "k/rel/x.slang": "import missing_one;\n",
    "k/inc.slang": "// included\n",
    "k/unrelated.txt": "not a module\n",
}


def test_imports_are_followed(tmp_path: Path) -> None:
    write(tmp_path, FILES)
    got = collect_slang_sources(tmp_path, "demo", ["k/*.slang"], [tmp_path / "mods"])
    assert [f.rel for f in got.sources] == ["k/a.slang", "k/inc.slang"]
    assert [f.rel for f in got.modules] == ["k/rel/x.slang", "mods/helper.slang", "mods/sub/deep-mod.slang",
                                            "mods/util.slang"]
    assert got.unresolved == [("k/rel/x.slang", 1, "missing_one")]


def test_sources_must_be_slang(tmp_path: Path) -> None:
    write(tmp_path, {"k/a.cu": "//\n"})
    with pytest.raises(SourceError, match=r"k/a.cu is not a .slang file"):
        collect_slang_sources(tmp_path, "demo", ["k/*"], [])


def test_no_match_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="matches no file"):
        collect_slang_sources(tmp_path, "demo", ["k/*.slang"], [])


@needs_slang
def test_content_hash_follows_sources_and_modules_only(tmp_path: Path) -> None:
    write(tmp_path, {**FILES, "k/a.slang": FILES["k/a.slang"] + one_entry()["k/e.slang"]})

    def h(**kw) -> str:  # type: ignore[no-untyped-def]
        return plan(tmp_path, include_dirs=["mods"], **kw).content_hash

    base = h()
    assert h() == base
    (tmp_path / "mods/util.slang").write_text("module util;\nimport helper;\n")  # same bytes
    (tmp_path / "k/unrelated.txt").write_text("changed\n")  # not part of the crate
    (tmp_path / "mods/other.slang").write_text("module other;\n")  # not imported
    assert h() == base
    (tmp_path / "mods/helper.slang").write_text("module helper;\n// edited\n")  # imported, transitively
    changed = h()
    assert changed != base
    (tmp_path / "k/inc.slang").write_text("// included, edited\n")
    assert h() not in (base, changed)
    now = h()
    assert h(defines={"N": "4"}) != now
    assert h(options=["--fmad=true"]) != now
    assert h(slang_options=["-O3"]) != now


@needs_slang
def test_cache_key_covers_targets(tmp_path: Path) -> None:
    write(tmp_path, one_entry())
    p = plan(tmp_path)
    assert p.cache_key() == plan(tmp_path).cache_key()
    assert p.cache_key(["cuda"]) != p.cache_key()
    assert p.cache_key(["wgsl", "spirv", "cuda"]) == p.cache_key()


@needs_slang
def test_forbidden_slang_options(tmp_path: Path) -> None:
    write(tmp_path, one_entry())
    for bad in (["-target", "spirv"], ["-entry", "f"], ["k/e.slang"]):
        with pytest.raises(ConfigError, match="crate 'demo': Slang option"):
            plan(tmp_path, slang_options=bad)


def test_modules_outside_the_project_keep_their_relative_path(tmp_path: Path) -> None:
    """Two external modules of one file name must not share a manifest key (the CUDA C++ rule:
    ``<external>/`` and the path relative to the project)."""
    proj = tmp_path / "proj"
    write(tmp_path, {"shared1/util.slang": "module util;\n", "shared2/util.slang": "module util;\n"})
    write(proj, {"k/a.slang": "import util;\n"})
    one = collect_slang_sources(proj, "demo", ["k/*.slang"], [tmp_path / "shared1"])
    two = collect_slang_sources(proj, "demo", ["k/*.slang"], [tmp_path / "shared2"])
    assert [f.rel for f in one.modules] == ["<external>/../shared1/util.slang"]
    assert [f.rel for f in two.modules] == ["<external>/../shared2/util.slang"]
