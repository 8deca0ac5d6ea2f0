"""Readers (``abi.READERS``) are implemented once per path, in an ``abi.ReaderTable`` checked when
the path's module is imported; no path compares reader names (an AST scan, like the import
check of test_architecture.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from khal_runtime import abi

ROOT = Path(__file__).resolve().parents[2]

#: every module that registers a reader table, by its ReaderTable name
TABLES = {
    "khal_runtime.abi": ("abi.ParamKind.slots", "abi.ParamKind.describe", "abi.ParamKind.validate"),
    "khal_runtime.arguments": ("khal_runtime.arguments",),
    "khal_runtime.tracing": ("khal_runtime.tracing",),
    "khal_runtime.torch": ("khal_runtime.torch",),
    "khal_runtime.backends.cuda.launchgen": ("khal_runtime.backends.cuda.launchgen",),
    "khal_runtime.backends.cuda.bound": ("khal_runtime.backends.cuda.bound",),
    "khal_runtime.backends.webgpu.kernel": ("khal_runtime.backends.webgpu.kernel",),
    "hatch_khal.slang.cuda_abi": ("hatch_khal.slang.cuda_abi",),
}

#: where a reader name is also another word: a manifest shape, a struct field's type, a dtype name
NOT_READERS = {"shape", "p.shape", "f.type", "self.type", "slot.what"}
DTYPE_NAME = {("khal_runtime/arguments.py", "name"), ("khal_runtime/buffers.py", "name"),
              ("khal_runtime/backends/webgpu/arrays.py", "name")}


def _names(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def reader_comparisons(files: dict[str, str], readers: set[str]) -> list[str]:
    """``path:line: text`` of every comparison (``==``, ``!=``, ``in``, ``not in``) of an
    expression with a reader name, outside the words that only spell like one."""
    out = []
    for rel, text in files.items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            for a, op, b in zip(operands, node.ops, operands[1:]):
                if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    continue
                for const, other in ((b, a), (a, b)):
                    if _names(const) & readers and not _names(other):
                        o = ast.unparse(other)
                        if o not in NOT_READERS and (rel, o) not in DTYPE_NAME:
                            out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return out


def _runtime_files() -> dict[str, str]:
    paths = [*(ROOT / "khal_runtime").rglob("*.py"), ROOT / "hatch_khal/slang/cuda_abi.py"]
    return {str(p.relative_to(ROOT)): p.read_text("utf-8") for p in sorted(paths)}


def test_no_path_compares_reader_names() -> None:
    """A reader's implementations are in the tables; a branch on its name would be one more
    place to find when a reader is added."""
    assert reader_comparisons(_runtime_files(), set(abi.READERS)) == []


def test_the_scan_finds_a_comparison_of_reader_names() -> None:
    src = ('if reader == "array": pass\nif r.name in ("struct", "value"): pass\n'
           'if p.shape == "array": pass\nif f.type == "struct": pass\n')
    assert reader_comparisons({"x.py": src}, set(abi.READERS)) == [
        'x.py:1: reader == \'array\'', 'x.py:2: r.name in (\'struct\', \'value\')']


def test_every_table_implements_every_declared_reader() -> None:
    for table in (abi._SLOTS, abi._DESCRIBE, abi._VALIDATE):
        assert set(table.impls) == set(abi.READERS)


def test_a_table_missing_a_reader_is_a_named_error() -> None:
    with pytest.raises(abi.ReaderTableError, match=r"somewhere: its reader table implements no 'value'"):
        abi.ReaderTable("somewhere", {"array": 1, "struct": 2})
    with pytest.raises(abi.ReaderTableError, match=r"implements 'pixels', which abi.READERS does not declare"):
        abi.ReaderTable("somewhere", {"array": 1, "struct": 2, "value": 3, "pixels": 4})


@pytest.mark.parametrize("module", [m for m in TABLES if m != "khal_runtime.abi"])
def test_a_declared_reader_without_an_implementation_fails_at_import(module: str) -> None:
    """abi.READERS declares a reader no table implements: importing a path's module raises
    ReaderTableError naming that path and the reader (as pluggy checks a hook implementation
    against its spec at registration), before any entry is planned."""
    # the module and what it imports load first; then abi declares one reader more and the
    # module is executed again (reload): its table no longer covers abi.READERS
    code = ("import dataclasses, importlib\n"
            f"import {module} as m\n"
            "from khal_runtime import abi\n"
            "abi.READERS['pixels'] = dataclasses.replace(abi.READERS['value'], name='pixels')\n"
            "try:\n"
            "    importlib.reload(m)\n"
            "except abi.ReaderTableError as exc:\n"
            "    print('ReaderTableError:', exc)\n"
            "else:\n"
            "    print('imported')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    (name,) = TABLES[module]
    assert f"ReaderTableError: {name}: its reader table implements no 'pixels'" in out.stdout, out.stdout + out.stderr
