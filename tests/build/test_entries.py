"""The KHAL_ENTRY grammar: accepted forms, errors with file:line, and fuzzing."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hatch_khal import entries
from hatch_khal.entries import find_entries
from hatch_khal.preprocessor import strip_comments
from hatch_khal.errors import EntryParseError


def test_all_parameter_kinds() -> None:
    src = """
    struct P { float a; };
    KHAL_ENTRY(k, 256, (KHAL_STORAGE(const float, x), KHAL_STORAGE(::ns::Item, items),
                        KHAL_STORAGE_ARRAY(float, 16, lut), KHAL_STORAGE_VALUE(uint32_t, count),
                        KHAL_UNIFORM(P, params), KHAL_SCALAR(double, scale)))
    { }
    """
    (e,) = find_entries(src, "k.cu")
    assert (e.name, e.block_size, e.line) == ("k", 256, 3)
    got = [(p.name, p.kind, p.ctype, p.const, p.shape, p.length) for p in e.params]
    assert got == [
        ("x", "storage", "float", True, "slice", None),
        ("items", "storage", "::ns::Item", False, "slice", None),
        ("lut", "storage", "float", False, "array", 16),
        ("count", "storage", "uint32_t", False, "value", 1),
        ("params", "uniform", "P", True, None, None),
        ("scale", "scalar", "double", False, None, None),
    ]


def test_comments_strings_and_defines_are_not_entries() -> None:
    src = """
    // KHAL_ENTRY(a, 1, (KHAL_SCALAR(int, x)))
    /* KHAL_ENTRY(b, 1, (KHAL_SCALAR(int, x))) */
    const char* s = "KHAL_ENTRY(c, 1, (KHAL_SCALAR(int, x)))";
    #define KHAL_ENTRY_ALIAS KHAL_ENTRY(d, 1, (KHAL_SCALAR(int, x))) \\
        continued KHAL_ENTRY(e, 1, (x))
    KHAL_ENTRY(real, 32, (KHAL_SCALAR(int, x))) {}
    """
    assert [e.name for e in find_entries(src, "f.cu")] == ["real"]


def test_line_numbers_survive_block_comments() -> None:
    src = "/*\n\n\n*/\nKHAL_ENTRY(k, 1, (KHAL_SCALAR(int, x))) {}\n"
    assert find_entries(src, "f.cu")[0].line == 5


@pytest.mark.parametrize(
    "marker, match",
    [
        ("KHAL_ENTRY(k, 256, ())", "has no parameters"),
        ("KHAL_ENTRY(k, 0, (KHAL_SCALAR(int, x)))", "block_size"),
        ("KHAL_ENTRY(k, 2048, (KHAL_SCALAR(int, x)))", "block_size"),
        ("KHAL_ENTRY(k, N, (KHAL_SCALAR(int, x)))", "block_size"),
        # what a type *is* (size_t, long double, a struct as KHAL_SCALAR) is the compiler's to say:
        # tests/build/test_real_kernels.py has those errors, from the build
        ("KHAL_ENTRY(k, 32, (KHAL_SCALAR(unsigned MyType, x)))", "type 'unsigned MyType' is not supported"),
        ("KHAL_ENTRY(k, 32, (KHAL_STORAGE(float*, x)))", "no pointers, references or arrays"),
        ("KHAL_ENTRY(k, 32, (KHAL_STORAGE(float&, x)))", "no pointers, references or arrays"),
        ("KHAL_ENTRY(k, 32, (KHAL_STORAGE(float[4], x)))", "no pointers, references or arrays"),
        ("KHAL_ENTRY(k, 32, (KHAL_STORAGE(Vec<float, 3>, x)))", "takes 2 arguments.*needs a typedef"),
        ("KHAL_ENTRY(k, (16, 16, 16), (KHAL_SCALAR(int, x)))", "at most 1024 threads"),
        ("KHAL_ENTRY(k, (16, x), (KHAL_SCALAR(int, x)))", "block_size"),
        ("KHAL_ENTRY(k, (1, 1, 128), (KHAL_SCALAR(int, x)))", "block_size"),
        ("KHAL_ENTRY(k, 32, (KHAL_SCALAR(int, x)), 64)", "KHAL_LAUNCH_BOUNDS"),
        ("KHAL_ENTRY(k, 256, (KHAL_SCALAR(int, x)), KHAL_LAUNCH_BOUNDS(128))", "hold the default block"),
        ("KHAL_ENTRY(k, 32, (float* x))", "is not one of KHAL_STORAGE"),
        ("KHAL_ENTRY(k, 32, (KHAL_STORAGE_ARRAY(float, n, x)))", "positive integer literal"),
        ("KHAL_ENTRY(k, 32, (KHAL_SCALAR(int, x), KHAL_SCALAR(int, x)))", "duplicate parameter"),
        ("KHAL_ENTRY(k_khal_x, 32, (KHAL_SCALAR(int, x)))", "reserved"),
        ("KHAL_ENTRY(k, 32)", "takes 3 arguments"),
        ("KHAL_ENTRY(k, 32, (KHAL_SCALAR(int, x)), KHAL_LAUNCH_BOUNDS(none), 5)", "takes 3 arguments"),
        ("KHAL_ENTRY(k, 32, (KHAL_SCALAR(int, x))", "no matching"),
        ("KHAL_ENTRY k", "must be followed by"),
    ],
)
def test_grammar_errors_name_file_line_and_entry(marker: str, match: str) -> None:
    with pytest.raises(EntryParseError, match=match) as err:
        find_entries("\n\n" + marker + "\n{}\n", "dir/bad.cu")
    assert str(err.value).startswith("dir/bad.cu:3:")


def test_strip_comments_keeps_length_of_lines() -> None:
    src = 'a // x\n/* y\n z */ "s//" b\n'
    out = strip_comments(src)
    assert out.count("\n") == src.count("\n") and "b" in out and "x" not in out and "y" not in out


_MARKERS = re.compile(r"KHAL_ENTRY|KHAL_INSTANTIATE")


def _check_located(text: str, found: Callable[[], list[Any]]) -> list[Any]:
    """Run the parser: an error must name fuzz.cu and a line holding a marker; every entry
    found must sit on a line holding its marker."""
    lines = text.split("\n")
    try:
        result = found()
    except EntryParseError as exc:
        m = re.match(r"^fuzz\.cu:(\d+): ", str(exc))
        assert m, f"error without file:line: {exc}"
        assert 1 <= int(m.group(1)) <= len(lines) and _MARKERS.search(lines[int(m.group(1)) - 1]), str(exc)
        return []
    for e in result:
        assert _MARKERS.search(lines[e.line - 1]) and e.file == "fuzz.cu"
    return result


_KNOWN = "KHAL_ENTRY(known, 32, (KHAL_STORAGE(float, x)))\n{ }\n"


@settings(max_examples=150, deadline=None, database=None)
@given(st.text(alphabet=st.sampled_from(list("KHAL_ENTRY(),:<>STORAGEUNIFMCflo0123456789 \n")), max_size=200),
       st.text(alphabet=st.sampled_from(list("abc xyz;{}\n")), max_size=40))
def test_parser_fuzz_noise_around_a_known_entry(noise: str, tail: str) -> None:
    """Marker-like noise (no comments or quotes, which could hide the marker), then a
    known entry on its own line: the entry is found on its line, or the noise holds a
    broken marker and the error points at it."""
    text = noise + "\n" + _KNOWN + tail
    line = noise.count("\n") + 2
    found = _check_located(text, lambda: entries.find_entries(text, "fuzz.cu"))
    if found:
        assert ("known", 32, line) in [(e.name, e.block_size, e.line) for e in found]
    else:  # the parser stopped at a broken marker in the noise, before the known one
        with pytest.raises(EntryParseError, match=r"^fuzz\.cu:(\d+): ") as err:
            entries.find_entries(text, "fuzz.cu")
        assert int(re.match(r"^fuzz\.cu:(\d+)", str(err.value)).group(1)) < line  # type: ignore[union-attr]


@settings(max_examples=150, deadline=None, database=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=300))
def test_parser_fuzz_arbitrary_text(text: str) -> None:
    """Anything after an opening marker: an error at a marker's line, or entries on marker lines."""
    for t in ("KHAL_ENTRY(" + text, text):
        _check_located(t, lambda: entries.find_entries(t, "fuzz.cu"))
