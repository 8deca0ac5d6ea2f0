"""The layering rules of ARCHITECTURE.md, checked by parsing the imports of both packages.

Imports inside functions count (an import in a function is still a dependency); imports under
``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("khal_runtime", "hatch_khal")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            name = ".".join(rel.parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING":
            skip.update(id(x) for b in n.body for x in ast.walk(b))
    return skip


def imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every run-time import of ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text("utf-8"))
    skip = _type_checking_nodes(tree)
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    in_function: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(x) for x in ast.walk(n) if x is not n)
    out = []
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            out += [(a.name, n.lineno, id(n) in in_function) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            m = ".".join(base[: len(base) - (n.level - 1)] + ([n.module] if n.module else [])) if n.level \
                else (n.module or "")
            subs = [f"{m}.{a.name}" for a in n.names if f"{m}.{a.name}" in MODULES]
            out += [(s, n.lineno, id(n) in in_function) for s in subs]
            if len(subs) < len(n.names):
                out.append((m, n.lineno, id(n) in in_function))
    return out


def _graph() -> dict[str, set[str]]:
    return {m: {i for i, _, _ in imports(m) if i in MODULES and i != m} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_generic_runtime_modules_never_import_a_backend() -> None:
    """The generic layer reaches backends through khal_runtime.backends' registry only."""
    bad = [f"{_where(m, line)} imports {i}" for m in MODULES if m.startswith("khal_runtime")
           and not m.startswith("khal_runtime.backends.") for i, line, _ in imports(m)
           if i.startswith(("khal_runtime.backends.", "cuda", "wgpu"))]
    assert bad == []


def test_only_the_backends_import_their_libraries() -> None:
    owner = {"cuda.bindings": "khal_runtime.backends.cuda", "wgpu": "khal_runtime.backends.webgpu"}
    bad = []
    for m in MODULES:
        if not m.startswith("khal_runtime"):
            continue
        for i, line, _ in imports(m):
            for lib, pkg in owner.items():
                if (i == lib or i.startswith(lib + ".")) and not m.startswith(pkg):
                    bad.append(f"{_where(m, line)} imports {i}")
    assert bad == []


def test_backends_do_not_import_each_other() -> None:
    bad = [f"{_where(m, line)} imports {i}" for m in MODULES for i, line, _ in imports(m)
           for a, b in (("cuda", "webgpu"), ("webgpu", "cuda"))
           if m.startswith(f"khal_runtime.backends.{a}") and i.startswith(f"khal_runtime.backends.{b}")]
    assert bad == []


def runtime_layers(text: str | None = None) -> dict[str, int]:
    """``khal_runtime`` module -> layer, read from ARCHITECTURE.md's layer table: ``x`` is one
    module, ``x/`` a package and its modules, ``x/*`` the modules of package ``x``."""
    if text is None:
        text = (ROOT / "ARCHITECTURE.md").read_text("utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    runtime = sorted(m for m in MODULES if m.split(".")[0] == "khal_runtime")
    out: dict[str, int] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for name in re.findall(r"`([^`]+)`", cells[1]):
            if name == "__init__":
                found = ["khal_runtime"]
            elif name.endswith("/__init__"):
                found = ["khal_runtime." + name[: -len("/__init__")].replace("/", ".")]
            elif name.endswith(("/*", "/")):
                pkg = "khal_runtime." + name.rstrip("*").rstrip("/").replace("/", ".")
                found = [m for m in runtime if m == pkg or m.startswith(pkg + ".")]
            else:
                found = ["khal_runtime." + name]
            assert found and all(m in MODULES for m in found), f"ARCHITECTURE.md names `{name}`: no such module"
            for m in found:
                assert m not in out or out[m] == int(cells[0]), f"{m} is in two layers of ARCHITECTURE.md"
                out[m] = int(cells[0])
    return out


def layer_violations(layers: dict[str, int]) -> list[str]:
    """Every import of a ``khal_runtime`` module (in functions too) of a module of a higher
    layer, and every runtime module the table leaves out."""
    bad = [f"{MODULES[m].relative_to(ROOT)} is in no layer of ARCHITECTURE.md"
           for m in MODULES if m.split(".")[0] == "khal_runtime" and m not in layers]
    for m, mine in layers.items():
        for i, line, _ in imports(m):
            theirs = layers.get(i)
            if theirs is not None and theirs > mine:
                bad.append(f"{_where(m, line)}: {m} (layer {mine}) imports {i} (layer {theirs})")
    return bad


def test_each_runtime_module_imports_only_its_layer_or_below() -> None:
    """ARCHITECTURE.md's layer table, module by module (in-function imports count)."""
    assert layer_violations(runtime_layers()) == []


def test_the_layer_check_catches_an_upward_import() -> None:
    layers = runtime_layers()
    assert layers["khal_runtime.errors"] == 0 and layers["khal_runtime.backends.cuda.launch"] == 8
    assert layers["khal_runtime.interop.torch"] == layers["khal_runtime.interop"] == 2
    # buffers -> hooks, as if hooks sat above buffers
    moved = dict(layers, **{"khal_runtime.launch_hooks": layers["khal_runtime.buffers"] + 1})
    assert any("buffers.py" in b and "imports khal_runtime.launch_hooks" in b for b in layer_violations(moved))
    # a module the table leaves out
    assert any("packing.py is in no layer" in b for b in
               layer_violations({m: n for m, n in layers.items() if m != "khal_runtime.packing"}))


#: what the build side may import of the runtime: the shared contract, nothing that runs kernels
SHARED = {"khal_runtime", "khal_runtime.abi", "khal_runtime.launch_attributes", "khal_runtime.manifest",
          "khal_runtime.manifest_load", "khal_runtime.binaries", "khal_runtime.verify", "khal_runtime.errors"}


def test_the_build_side_imports_only_the_shared_runtime_modules() -> None:
    bad = [f"{_where(m, line)} imports {i}" for m in MODULES if m.startswith("hatch_khal")
           for i, line, _ in imports(m) if i.startswith("khal_runtime") and i not in SHARED]
    assert bad == []


@pytest.mark.parametrize("package", PACKAGES)
def test_an_import_inside_a_function_says_why(package: str) -> None:
    """Imports inside functions are for laziness (import cost, optional dependencies), and say so
    in a comment on the import or just above it; never to dodge a cycle (the cycle test above
    would see it)."""
    bad = []
    for m in MODULES:
        if not m.startswith(package):
            continue
        lines = MODULES[m].read_text("utf-8").splitlines()
        for i, line, inside in imports(m):
            if inside and "lazy" not in " ".join(lines[max(0, line - 4):line + 1]):
                bad.append(f"{_where(m, line)} imports {i} inside a function without saying why")
    assert bad == []


@pytest.mark.parametrize("package", PACKAGES)
def test_py_typed_is_shipped(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (test extra)")
def test_mypy_strict_passes() -> None:
    """Both packages, strict (pyproject.toml [tool.mypy])."""
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def _python_files() -> list[Path]:
    roots = [ROOT / "hatch_khal", ROOT / "khal_runtime", ROOT / "tests", ROOT / "benchmarks",
             ROOT / "scripts", ROOT / "example_shader_pkg"]
    return sorted(p for r in roots if r.exists() for p in r.rglob("*.py") if ".venv" not in p.parts)


def test_every_source_is_python_3_10_syntax() -> None:
    """requires-python is >= 3.10: no syntax of later versions (PEP 695 generics, ``except*``
    is 3.11, ...), checked by the parser's own 3.10 grammar even where no 3.10 interpreter is
    installed (scripts/test runs the suite on a second Python when it finds one)."""
    import ast

    bad = []
    files = _python_files()
    assert len(files) > 50
    for p in files:
        try:
            ast.parse(p.read_text(encoding="utf-8"), str(p), feature_version=(3, 10))
        except SyntaxError as exc:
            bad.append(f"{p.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
    assert not bad, "\n".join(bad)


def test_the_3_10_check_catches_later_syntax() -> None:
    import ast

    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))


# -- what crosses a layer at run time --------------------------------------------------------------
def _members_defined(tree: ast.AST) -> set[str]:
    """The names a module defines or assigns: functions, classes, attributes it stores (``x._a =``),
    names it binds, and string constants that name a member (``__slots__``, ``setattr``)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"_[A-Za-z]\w*", n.value):
            out.add(n.value)
    return out


def _layer_of(module: str, layers: dict[str, int]) -> object:
    """A runtime module's layer; the build side is one layer of its own."""
    return layers.get(module) if module.startswith("khal_runtime") else "hatch_khal"


def private_reads(layers: dict[str, int], modules: dict[str, Path] | None = None) -> list[tuple[str, int, str, str]]:
    """(module, line, the expression, the member) of every ``obj._member`` read where ``obj`` is not
    ``self`` / ``cls`` and no module of the reader's layer defines ``_member`` (the reader's own
    module included): a private member of another layer's object. Members only a library
    defines (``torch._C``) are none of ours and are not listed."""
    modules = MODULES if modules is None else modules
    trees = {m: ast.parse(p.read_text("utf-8")) for m, p in modules.items()}
    defined = {m: _members_defined(t) for m, t in trees.items()}
    out = []
    for m, tree in sorted(trees.items()):
        mine = _layer_of(m, layers)
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")):
                continue
            if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                continue
            definers = {d for d, names in defined.items() if n.attr in names}
            if definers and not any(_layer_of(d, layers) == mine for d in definers):
                out.append((m, n.lineno, ast.unparse(n), n.attr))
    return out


#: (reader, member) -> why it is read there: each a library's own member that one of ours shares a
#: name with, or a place left for the modules whose owners change them now
PRIVATE_READS_ALLOWED = {
    ("khal_runtime.torch", "_version"): "torch.Tensor._version, PyTorch's version counter: PyTorch's API "
                                        "for in-place writes, not a member of ours",
    ("khal_runtime.triton", "_base"): "the Triton pointer reader checks a DeviceBuffer (and its base) is not "
                                      "freed; DeviceBuffer is to say so publicly (Triton's modules are other "
                                      "helpers' now)",
    ("khal_runtime.triton", "_et"): "as _base",
}


def test_no_layer_reads_another_layers_private_members() -> None:
    """ARCHITECTURE.md: calls go down only, at run time too. A layer reads another layer's objects
    through their public members and Protocols (``backends.KernelHandle``, ``LaunchPlan``,
    ``Backend``), never through private ones: a private member is free to change with its module."""
    bad = [f"{_where(m, line)}: {expr} (a private member of another layer)" for m, line, expr, member
           in private_reads(runtime_layers()) if (m, member) not in PRIVATE_READS_ALLOWED]
    assert bad == []


def test_the_private_read_check_catches_one(tmp_path: Path) -> None:
    """``calls.py`` (layer 7) reading ``kernel._bx`` of ``kernels.Kernel`` (layer 9), as it did."""
    (tmp_path / "calls.py").write_text("def slow(kernel):\n    return kernel._bx + kernel.block_size[0]\n")
    (tmp_path / "kernels.py").write_text("class Kernel:\n    __slots__ = ('_bx',)\n")
    (tmp_path / "calls2.py").write_text("class C:\n    def __init__(self):\n        self._bx = 1\n\n"
                                        "    def f(self, other):\n        return self._bx, other._bx\n")  # its own
    layers = {"khal_runtime.calls": 7, "khal_runtime.kernels": 9, "khal_runtime.calls2": 8}
    found = private_reads(layers, {"khal_runtime.calls": tmp_path / "calls.py",
                                   "khal_runtime.kernels": tmp_path / "kernels.py",
                                   "khal_runtime.calls2": tmp_path / "calls2.py"})
    assert [(m, line, expr) for m, line, expr, _ in found] == [("khal_runtime.calls", 2, "kernel._bx")]


#: a kernel language's own modules: the only ones that may compare a language's name
LANGUAGE_MODULES = ("hatch_khal.cuda", "hatch_khal.slang", "hatch_khal.triton", "khal_runtime.triton",
                    "khal_runtime.torch_triton", "khal_runtime.languages", "khal_runtime.slang")
LANGUAGE_NAMES = {"cuda", "slang", "triton"}

#: module -> (comparisons of a language name, why they are there): none since languages are plugins
#: (#40 item 1: a language owns its config keys, requirements, stubs, inspect lines, run-time crate
#: and WebGPU stage). A new one fails.
LANGUAGE_TESTS_ALLOWED: dict[str, tuple[int, str]] = {}


def language_tests(modules: dict[str, Path] | None = None) -> dict[str, list[int]]:
    """module -> lines where a ``language`` (an attribute, or a variable ``language`` / ``lang``) is
    compared with a language's name (``==``, ``!=``, ``in (...)``), outside the languages' own modules."""
    modules = MODULES if modules is None else modules

    def names(n: ast.expr) -> set[object]:
        try:
            v = ast.literal_eval(n)
            return set(v) if isinstance(v, (tuple, list, set, frozenset)) else {v}
        except (ValueError, TypeError):  # not a literal, or one of unhashable items
            return set()

    def is_language(n: ast.expr) -> bool:
        return (isinstance(n, ast.Attribute) and n.attr == "language") or \
            (isinstance(n, ast.Name) and n.id in ("language", "lang"))

    out: dict[str, list[int]] = {}
    for m, path in sorted(modules.items()):
        if any(m == own or m.startswith(own + ".") or m.startswith(own + "_") for own in LANGUAGE_MODULES):
            continue
        for n in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(n, ast.Compare):
                parts = [n.left, *n.comparators]
                if any(is_language(x) for x in parts) and any(names(x) & LANGUAGE_NAMES for x in parts):
                    out.setdefault(m, []).append(n.lineno)
    return out


def test_no_language_name_is_compared_outside_its_language() -> None:
    """``if crate.language == "triton":`` outside a language's own modules is a place a new language
    would have to edit: the ones left are listed above with the item that removes them, and none may
    be added (a language's behaviour goes into its Language / runtime modules instead)."""
    found = language_tests()
    bad = [f"{MODULES[m].relative_to(ROOT)}: {len(lines)} comparison(s) of a language name (lines "
           f"{', '.join(map(str, sorted(lines)))}), {LANGUAGE_TESTS_ALLOWED[m][0] if m in LANGUAGE_TESTS_ALLOWED else 0} "
           "allowed" for m, lines in found.items() if len(lines) > LANGUAGE_TESTS_ALLOWED.get(m, (0, ""))[0]]
    assert bad == []
    stale = [m for m, (n, _) in LANGUAGE_TESTS_ALLOWED.items() if len(found.get(m, ())) < n]
    assert stale == [], f"fewer comparisons than allowed (lower the allowance): {stale}"


def test_the_language_check_catches_one(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f(c, language):\n    if c.language == 'slang' or language in ('triton', 'x'):\n"
                                   "        return c.backend == 'cuda'\n")
    (tmp_path / "b.py").write_text("def g(c):\n    return c.language == 'triton'\n")
    assert language_tests({"hatch_khal.plan": tmp_path / "a.py", "hatch_khal.triton.x": tmp_path / "b.py"}) == \
        {"hatch_khal.plan": [2, 2]}
