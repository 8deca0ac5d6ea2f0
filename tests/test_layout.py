"""The build side's module rules: strict typing, no import cycle, imports in functions for laziness only."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

PKG = ROOT / "hatch_khal"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        out[".".join(rel.parts).removesuffix(".__init__")] = path
    return out


def _imports(path: Path, name: str, known: set[str]) -> list[tuple[str, ast.AST, bool]]:
    """(imported module of the package, node, inside a function) for every import."""
    tree = ast.parse(path.read_text("utf-8"))
    skip = {id(x) for n in ast.walk(tree) if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
            and n.test.id == "TYPE_CHECKING" for b in n.body for x in ast.walk(b)}
    in_func = {id(x) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               for x in ast.walk(n)}
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        targets: list[str] = []
        if isinstance(n, ast.Import):
            targets = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            mod = ".".join(base[: len(base) - n.level + 1] + ([n.module] if n.module else [])) if n.level \
                else n.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in n.names]
        for t in targets:
            out.append((t, n, id(n) in in_func))
    return out


def test_no_import_cycle_counting_imports_in_functions() -> None:
    mods = _modules()
    graph = {m: {t for t, _, _ in _imports(p, m, set(mods)) if t in mods and t != m} for m, p in mods.items()}
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [m, t]))
            if t not in state:
                visit(t, stack + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_imports_inside_functions_say_they_are_lazy() -> None:
    bad = []
    mods = _modules()
    for m, path in mods.items():
        lines = path.read_text("utf-8").splitlines()
        for _, node, in_func in _imports(path, m, set(mods)):
            if not in_func:
                continue
            first = node.lineno - 1  # type: ignore[attr-defined]
            window = " ".join(lines[max(0, first - 3): node.end_lineno])  # type: ignore[attr-defined]
            if "lazy" not in window:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")  # type: ignore[attr-defined]
    assert not bad, "imports inside functions without a 'lazy: ...' comment: " + ", ".join(bad)


def test_py_typed_is_shipped() -> None:
    assert (PKG / "py.typed").is_file()


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (test extra)")
def test_mypy_strict_passes() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
