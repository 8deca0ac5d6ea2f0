"""Finding Slang in the slangpy wheel (without importing slangpy), the ctypes prototypes against
the wheel's own header, and a missing slangpy as one clear error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hatch_khal.slang.library import PROTOTYPES, SLANGPY_REQUIREMENT, SlangNotFound, find_slang
from tests.helpers.slang import ROOT, needs_slang, plan, write
from tests.helpers.slang import one_entry


def test_missing_slangpy_says_what_to_add() -> None:
    with pytest.raises(SlangNotFound) as exc:
        find_slang(lambda name: None)
    msg = str(exc.value)
    assert "'slangpy' package is not installed" in msg
    assert SLANGPY_REQUIREMENT == "slangpy==0.43.1" and SLANGPY_REQUIREMENT in msg
    assert "[build-system] requires" in msg and "hatchling hook adds it itself" in msg


def test_slangpy_without_the_library(tmp_path: Path) -> None:
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)], origin=None)
    with pytest.raises(SlangNotFound, match="holds no libslang-compiler"):
        find_slang(lambda name: spec)


def test_plan_without_slangpy_is_one_clear_error(tmp_path: Path) -> None:
    write(tmp_path, one_entry())
    with pytest.raises(SlangNotFound) as exc:
        plan(tmp_path, finder=lambda name: None)
    assert SLANGPY_REQUIREMENT in str(exc.value) and exc.value.__context__ is None


@needs_slang
def test_found_without_importing_slangpy() -> None:
    code = ("import sys; from hatch_khal.slang.library import find_slang; loc = find_slang(); "
            "assert 'slangpy' not in sys.modules; print(loc.version, loc.library.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    version, name = out.stdout.split()
    assert re.fullmatch(r"\d{4}\.\d+", version) and name.startswith("libslang-compiler")


@needs_slang
def test_prototypes_match_the_wheels_header() -> None:
    """Every declared function exists in slang-deprecated.h / slang.h with that many parameters."""
    include = find_slang().library.parent / "include"
    from hatch_khal.slang.sources import strip_comments_keep_strings

    header = strip_comments_keep_strings((include / "slang-deprecated.h").read_text() + (include / "slang.h").read_text())
    for name, (_restype, argtypes) in PROTOTYPES.items():
        m = re.search(rf"SLANG_API\s+[\w\s\*]+?\b{name}\s*\(([^)]*)\)", header)
        assert m, f"{name} is not declared in the wheel's headers"
        args = [a for a in m.group(1).split(",") if a.strip() and a.strip() != "void"]
        assert len(args) == len(argtypes), (name, m.group(1))


@needs_slang
def test_library_loads_and_reads_the_cuda_prelude() -> None:
    """In a child process (the build never loads Slang in its own): the session's vtable slot
    for getLanguagePrelude is checked against getBuildTagString and gives the CUDA prelude."""
    code = ("from hatch_khal.slang.library import load_slang; lib = load_slang(); "
            "s = lib.spCreateSession(None); p = lib.language_prelude(s, 6); "
            "print(lib.build_tag, len(p), 'SLANG_CUDA_ENABLE_HALF' in p)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    tag, size, has_half = out.stdout.split()
    assert tag == find_slang().version and int(size) > 100_000 and has_half == "True"
