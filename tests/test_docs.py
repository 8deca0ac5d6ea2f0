"""Every fenced code block of README.md and docs/**/*.md is checked here, so the docs stay true.

What each kind of block gets:

* ```python   executed (in this process). A ```text block right after it, marked
  ``<!-- output -->``, is its expected standard output.
* ```toml     parsed (tomllib / tomli); a hook table (``[tool.hatch.build.targets.wheel.hooks.khal]``
  or ``[tool.khal]``) is validated by ``hatch_khal.config.parse_config``, and a project with a
  ``[build-system]`` has ``requires-python`` (else hatchling tags the wheel ``py2.py3``).
* ```sh       every command is checked to exist with the flags it uses: ``python -m hatch_khal``,
  pip, uv, hatch, pytest and ``python -m build`` against their ``--help``; the repository's own
  scripts (``scripts/test``, ``benchmarks/run.py``, ``python -m example_shader_pkg.demo``) must
  exist and mention each flag (``scripts/test`` passes its arguments to pytest).
* ```cpp      a ``KHAL_ENTRY`` block must parse with the hook's entry grammar.
* ```slang    compiled by the Slang stage (CUDA, WGSL, SPIR-V), where slangpy is installed.
* ```yaml     a CI workflow: the commands of its ``run:`` steps are checked as a ```sh block's.
* ```text     not run: output samples, grammars, diagrams (likewise ```json); but one marked
  ``<!-- generated: NAME -->`` is what producer NAME of ``tests/helpers/doc_outputs.py`` prints (the
  command of the block above it, run for real; ``scripts/update-docs`` rewrites the block), and one
  that looks like hatch-khal's output must be generated or say why not (``<!-- sample: WHY -->``).

Markers are HTML comments on the lines just above a block (several per comment, comma-separated,
or one comment per line):

* ``<!-- file: PATH -->`` the block is the file PATH of the quickstart project (``PATH`` may be
  ``PROJECT:PATH``; project ``setuptools`` is the quickstart with its own files on top). Every
  project is built for real by the one slow test (``test_quickstart_projects_build``); python
  files of a project are compiled, not run; the same PATH must read the same in every doc file.
* ``<!-- gpu -->`` needs a CUDA GPU: pytest marker ``gpu``, skipped cleanly without one
  (tests/conftest.py).
* ``<!-- webgpu -->`` needs a WebGPU adapter (marker ``webgpu``); it runs with ``KHAL_BACKEND=webgpu``.
* ``<!-- uses: example -->`` ``example_shader_pkg`` is importable: the session's example wheel
  (``KHAL_TEST_EXAMPLE_WHEEL`` on the GPU machine); marked ``slow`` unless also ``gpu``.
* ``<!-- uses: quickstart -->`` ``my_shaders``, the quickstart project, is importable (built once,
  without build isolation, for ``sm_90`` only).
* ``<!-- continues -->`` the block continues the previous python block of the same file: its
  test runs the chain from the chain's first block, in one namespace, so every block is still a
  test of its own (and inherits the chain's ``gpu`` / ``uses`` markers).
* ``<!-- output -->`` (on a ```text block) the previous python block's standard output.
* ``<!-- pending: BRANCH -->`` the rest of the section (from a marker right above a heading: that
  heading's section), up to the next heading of the same or a higher level or
  ``<!-- /pending -->``, describes what lands with branch BRANCH: its blocks' checks are ``xfail``
  (not strict) until it is merged, except those that cannot depend on it (Slang blocks, the syntax
  of project files). After the merge, remove the marker and the checks must pass; an XPASS before
  says that check already holds on the current code.
* ``<!-- needs: MODULE -->`` the python block imports MODULE (``torch``, ``cupy``): skipped without it.
* ``<!-- layout: PATH ... -->`` (on a ```toml block declaring crates) the files (or, ending in
  ``/``, folders) the page says the project holds: the snippet is planned by the hook, as written,
  in a project holding them and one file per ``sources`` glob (``test_crate_snippet_plans_as_written``).
* ``<!-- quote: PATH -->`` the next blockquote is a verbatim quote of the file PATH (whitespace
  aside; `` … `` separates quoted pieces, which must appear in order).

Besides the blocks: relative links and their anchors resolve, every option of the config model,
every environment variable the code reads, every error class and every CLI flag is in the
reference, and the README stays short. Run it alone with
``python -m pytest -q tests/test_docs.py -p no:cacheprovider`` (``-m slow`` for the build).
"""

from __future__ import annotations

import ast
import contextlib
import gc
import io
import os
import re
import shlex
import subprocess
import sys
import types
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.conftest import RUNTIME, build_env, run

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DOC_FILES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
README_MAX_LINES = 180  # was 150; +the "Using with PyTorch" section #18 asks for
#: languages a fence may name; anything else (or none) is an error
LANGS = {"python", "toml", "sh", "cpp", "slang", "text", "json", "yaml"}
QUICKSTART = "quickstart"


# ------------------------------------------------------------------------------------------
# reading the docs
# ------------------------------------------------------------------------------------------

@dataclass
class Block:
    file: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    markers: dict[str, str] = field(default_factory=dict)
    pending: str | None = None
    heading: str = ""

    @property
    def rel(self) -> str:
        try:
            return self.file.relative_to(ROOT).as_posix()
        except ValueError:  # a page outside the repository (the tests of this file's machinery)
            return self.file.name

    @property
    def id(self) -> str:
        return f"{self.rel}:{self.line}"


@dataclass
class Doc:
    path: Path
    text: str
    blocks: list[Block]
    #: (line, path) of every <!-- quote: PATH --> with the quoted text
    quotes: list[tuple[int, str, str]]
    #: every heading's anchor (GitHub's slugs)
    anchors: set[str]
    #: (line, target) of every link outside code
    links: list[tuple[int, str]]
    #: (line, text) outside code blocks and outside pending sections
    prose: list[tuple[int, str]]


_FENCE = re.compile(r"^(\s*)```([\w+-]*)\s*$")
_COMMENT = re.compile(r"^\s*<!--(.*?)-->\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _markers(comment: str) -> dict[str, str]:
    out = {}
    for item in comment.split(","):
        key, _, value = item.strip().partition(":")
        if key.strip():
            out[key.strip()] = value.strip()
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links unwrapped, lower case, punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def read_doc(path: Path) -> Doc:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    blocks: list[Block] = []
    quotes: list[tuple[int, str, str]] = []
    anchors: set[str] = set()
    links: list[tuple[int, str]] = []
    prose: list[tuple[int, str]] = []
    pending: str | None = None
    pending_level = 0
    level = 0
    heading = ""
    counts: dict[str, int] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m:
            indent, lang = m.group(1), m.group(2)
            j = i + 1
            while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
                j += 1
            if j == len(lines):
                raise AssertionError(f"{path}:{i + 1}: unclosed code fence")
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
            markers: dict[str, str] = {}
            k = i - 1
            while k >= 0 and (not lines[k].strip() or _COMMENT.match(lines[k])):
                c = _COMMENT.match(lines[k])
                if c:
                    found = _markers(c.group(1))
                    if not ({"pending", "/pending", "quote"} & set(found)):
                        markers = {**found, **markers}
                k -= 1
            blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", markers, pending, heading))
            i = j + 1
            continue
        h = _HEADING.match(line)
        if h:
            level = len(h.group(1))
            heading = h.group(2)
            if pending is not None and pending_level < 0:  # the marker stood right above this heading
                pending_level = level
            elif pending is not None and level <= pending_level:
                pending = None
            base = slug(heading)
            n = counts.get(base, 0)
            counts[base] = n + 1
            anchors.add(base if n == 0 else f"{base}-{n}")
        c = _COMMENT.match(line)
        if c:
            found = _markers(c.group(1))
            if "pending" in found:
                nxt = next((ln for ln in lines[i + 1:] if ln.strip()), "")
                pending, pending_level = found["pending"], (-1 if _HEADING.match(nxt) else level)
            if "/pending" in found:
                pending = None
            if "quote" in found:
                k = i + 1
                while k < len(lines) and not lines[k].strip():
                    k += 1
                quoted = []
                while k < len(lines) and lines[k].startswith(">"):
                    quoted.append(lines[k][1:].strip())
                    k += 1
                quotes.append((i + 1, found["quote"], " ".join(quoted)))
        for lm in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            links.append((i + 1, lm.group(1)))
        if pending is None:
            prose.append((i + 1, line))
        i += 1
    return Doc(path, text, blocks, quotes, anchors, links, prose)


def all_blocks() -> list[Block]:
    return [b for f in DOC_FILES for b in read_doc(f).blocks]


def _params(lang: str, extra: Any = None, *, pending_matters: bool = True) -> list[Any]:
    """One pytest param per block of ``lang``; blocks of a pending section are xfail unless their
    check cannot depend on the pending branch (``pending_matters=False``: syntax, the Slang stage)."""
    out = []
    for b in all_blocks():
        if b.lang != lang or (extra is not None and not extra(b)):
            continue
        marks = []
        if b.pending and pending_matters:
            marks.append(pytest.mark.xfail(reason=f"pending: {b.pending}", strict=False))
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


# ------------------------------------------------------------------------------------------
# the doc files themselves
# ------------------------------------------------------------------------------------------

def test_docs_exist_and_fences_name_a_language() -> None:
    assert (DOCS / "index.md").is_file()
    bad = [f"{b.id} ```{b.lang}" for b in all_blocks() if b.lang not in LANGS]
    assert not bad, f"code fences without a known language ({sorted(LANGS)}): {bad}"


def test_readme_is_short() -> None:
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; keep it under {README_MAX_LINES} (details go in docs/)"


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve(doc: Path) -> None:
    d = read_doc(doc)
    bad = []
    for line, target in d.links:
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{doc.name}:{line}: {target} (no such file)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in read_doc(dest).anchors:
            bad.append(f"{doc.name}:{line}: {target} (no heading with anchor #{anchor} in {dest.name})")
    assert not bad, "\n".join(bad)


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


@pytest.mark.parametrize("quote", [q for f in DOC_FILES for q in [(f, *x) for x in read_doc(f).quotes]],
                         ids=lambda q: f"{q[0].relative_to(ROOT).as_posix()}:{q[1]}")
def test_quotes_are_verbatim(quote: tuple[Path, int, str, str]) -> None:
    doc, line, source, quoted = quote
    assert quoted, f"{doc}:{line}: <!-- quote: {source} --> is not followed by a > blockquote"
    text = _norm((doc.parent / source).read_text() if (doc.parent / source).exists() else (ROOT / source).read_text())
    pos = 0
    for piece in quoted.split("…"):
        piece = _norm(piece).strip('"“” ')
        if not piece:
            continue
        at = text.find(piece, pos)
        assert at >= 0, f"{doc.name}:{line}: not found (in order) in {source}: {piece!r}"
        pos = at + len(piece)


def test_project_files_agree_across_docs() -> None:
    seen: dict[str, Block] = {}
    for b in all_blocks():
        if "file" in b.markers:
            key = b.markers["file"] if ":" in b.markers["file"] else f"{QUICKSTART}:{b.markers['file']}"
            first = seen.setdefault(key, b)
            assert first.code == b.code, f"{key}: {b.id} differs from {first.id}; keep the copies equal"
    assert f"{QUICKSTART}:pyproject.toml" in seen, "the quickstart project has no pyproject.toml block"


# ------------------------------------------------------------------------------------------
# the reference is complete
# ------------------------------------------------------------------------------------------

def _code_literals() -> set[str]:
    out = set()
    for pkg in ("hatch_khal", "khal_runtime"):
        for p in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.add(node.value)
    return out


def _macros() -> set[str]:
    """The markers and macros of khal.h, and the launch attributes' markers (their rows')."""
    from khal_runtime.launch_attributes import ATTRIBUTES

    return set(re.findall(r"\b(KHAL_\w+)", (ROOT / "hatch_khal/include/khal.h").read_text())) | \
        {r.marker for r in ATTRIBUTES}


def _doc_text(*names: str) -> str:
    return "\n".join((DOCS / n).read_text() for n in names)


def test_every_environment_variable_is_documented() -> None:
    code_vars = {s for s in _code_literals() if re.fullmatch(r"KHAL_[A-Z0-9_]+", s)} - _macros()
    code_vars -= {"KHAL_ENTRY", "KHAL_STORAGE", "KHAL_STORAGE_ARRAY", "KHAL_STORAGE_VALUE", "KHAL_UNIFORM",
                  "KHAL_SCALAR", "KHAL_"}
    code_vars |= {"CUDA_OXIDE_SHADERS_PTX_<CRATE>", "KHAL_TEST_EXAMPLE_WHEEL"}
    ref = _doc_text("reference/environment.md")
    missing = sorted(v for v in code_vars if f"`{v}`" not in ref)
    assert not missing, f"docs/reference/environment.md lacks: {missing}"
    # and the docs name no variable the code does not read (pending sections aside)
    known = code_vars | _macros() | {"KHAL_ENTRY"}
    tests_text = "\n".join(p.read_text() for p in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
                                                 ROOT / "scripts/test"])
    unknown = []
    for f in DOC_FILES:
        for line, text in read_doc(f).prose:
            for v in re.findall(r"\bKHAL_[A-Z0-9_]*[A-Z0-9]\b", text):
                if v not in known and v not in tests_text:
                    unknown.append(f"{f.relative_to(ROOT)}:{line}: {v}")
    assert not unknown, f"variables the code does not know: {unknown}"


def test_every_option_is_documented() -> None:
    from hatch_khal.config import CrateConfig, HookConfig

    ref = _doc_text("reference/options.md")
    keys = {f.alias or n for m in (HookConfig, CrateConfig) for n, f in m.model_fields.items()}
    missing = sorted(k for k in keys if f"`{k}`" not in ref and f"`crates[].{k}`" not in ref)
    assert not missing, f"docs/reference/options.md lacks options: {missing}"


def test_every_error_class_is_documented() -> None:
    import hatch_khal.errors
    import khal_runtime.binaries
    import khal_runtime.errors

    names = set(hatch_khal.errors.__all__) | set(khal_runtime.errors.__all__)
    names |= {khal_runtime.binaries.BinaryFormatError.__name__}
    ref = _doc_text("reference/errors.md")
    missing = sorted(n for n in names if f"`{n}`" not in ref)
    assert not missing, f"docs/reference/errors.md lacks: {missing}"


def test_the_tests_named_in_errors_md_exist() -> None:
    """The table "What is checked" says every case has a test: the rows naming theirs name real ones."""
    named = re.findall(r"(tests/[\w/]+\.py)::(\w+)", _doc_text("reference/errors.md"))
    assert len(named) >= 20
    missing = []
    for path, name in sorted(set(named)):
        file = ROOT / path
        defined = {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)} \
            if file.is_file() else set()
        if name not in defined:
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/reference/errors.md names tests that do not exist: {missing}"


@lru_cache(maxsize=None)
def _help(*cmd: str) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def _flags(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", help_text))


def test_cli_reference_is_complete() -> None:
    top = _help(sys.executable, "-m", "hatch_khal", "--help")
    subs = re.search(r"\{([\w,]+)\}", top)
    assert subs
    ref = _doc_text("reference/cli.md")
    missing = [f for f in _flags(top) if f not in ("-h", "--help") and f"`{f}`" not in ref and f not in ref]
    for sub in subs.group(1).split(","):
        assert f"python -m hatch_khal {sub}" in ref, f"docs/reference/cli.md does not show `{sub}`"
        missing += [f for f in _flags(_help(sys.executable, "-m", "hatch_khal", sub, "--help"))
                    if f not in ("-h", "--help") and f not in ref]
    assert not missing, f"docs/reference/cli.md lacks: {missing}"


# ------------------------------------------------------------------------------------------
# ```toml
# ------------------------------------------------------------------------------------------

def _clean_build_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for v in ("KHAL_CUDA_ARCHS", "KHAL_PTX_ARCH", "KHAL_JOBS", "KHAL_SKIP_SPIRV"):
        monkeypatch.delenv(v, raising=False)


@pytest.mark.parametrize("block", _params("toml"))
def test_toml_block(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    from hatch_khal.config import parse_config

    _clean_build_env(monkeypatch)
    data = tomllib.loads(block.code)
    tables = []
    hatch = data.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {})
    if "khal" in hatch.get("hooks", {}):
        tables.append(hatch["hooks"]["khal"])
    if "khal" in data.get("tool", {}):
        tables.append(data["tool"]["khal"])
    for table in tables:
        table = dict(table)
        table.setdefault("crates", [{"name": "docs", "sources": ["kernels/*.cu"]}])
        parse_config(table, default_package="my_shaders", where=f"{block.id}")
    if "build-system" in data and "project" in data:
        assert "requires-python" in data["project"], (
            f"{block.id}: a project without requires-python gets a py2.py3 wheel tag, not py3-none-any")


# ------------------------------------------------------------------------------------------
# ```sh
# ------------------------------------------------------------------------------------------

#: commands a block may use without a flag check
_PLAIN = {"cd", "ls", "export", "source", ".", "mkdir", "cp", "rm", "git", "apt-get", "sudo", "echo", "cat",
          "tar", "unzip", "nvidia-smi", "time", "env", "which", "head", "tail", "grep", "tee"}
_PYTHON = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
_SCRIPTS_TO_PYTEST = {"scripts/test", ".ci/run"}


def _commands(code: str) -> Iterator[list[str]]:
    code = code.replace("\\\n", " ")
    code = re.sub(r"\$\([^()]*\)", "SUBST", code)
    for raw in code.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw)
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part)
            except ValueError as exc:
                raise AssertionError(f"cannot split {part!r}: {exc}") from None
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words.pop(0)
            if words:
                yield words


def _flag_words(args: list[str]) -> list[str]:
    out = []
    for a in args:
        if a == "--":
            break
        if re.match(r"^--?[A-Za-z]", a):
            out.append(a.split("=", 1)[0])
    return out


def _check_flags(what: str, args: list[str], help_text: str) -> list[str]:
    known = _flags(help_text)
    return [f"{what}: flag {f} is not in its --help" for f in _flag_words(args) if f not in known]


def _module_source(module: str) -> Path | None:
    parts = module.split(".")
    for base in (ROOT, ROOT / "example_shader_pkg"):
        for cand in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__main__.py")):
            if cand.is_file():
                return cand
    return None


def _check_repo_script(what: str, path: Path, args: list[str]) -> list[str]:
    text = path.read_text()
    return [f"{what}: {path.relative_to(ROOT)} does not know {f}" for f in _flag_words(args)
            if not re.search(rf"['\"]{re.escape(f)}['\"]", text)]


def _check_python(words: list[str]) -> list[str]:
    args = words[1:]
    if not args:
        return []
    if args[0] == "-c":
        compile(args[1], "<sh -c>", "exec")
        return []
    if args[0] != "-m":
        script = ROOT / args[0]
        if not script.is_file():
            return [f"{' '.join(words)}: no script {args[0]} in the repository"]
        return _check_repo_script(" ".join(words), script, args[1:])
    module, rest = args[1], args[2:]
    what = f"python -m {module}"
    if module == "pip":
        return _check_pip(what, rest)
    if module == "hatch_khal":
        inner = rest[rest.index("--") + 1:] if "--" in rest else []  # `triton record -- CMD`: CMD is checked too
        words_ = [a for a in (rest[:rest.index("--")] if "--" in rest else rest) if not a.startswith("-")]
        sub = words_[:1]
        if sub and sub[0] not in ("inspect", "verify", "triton", "shard", "merge", "split"):
            return [f"{what}: no subcommand {sub[0]}"]
        if sub == ["triton"]:
            sub = words_[:2]
            if sub[1:] != ["record"]:
                return [f"{what}: no subcommand {' '.join(sub)}"]
        help_text = _help(sys.executable, "-m", "hatch_khal", *sub, "--help")
        if not sub:
            help_text += _help(sys.executable, "-m", "hatch_khal", "--help")
        return _check_flags(what, rest, help_text) + (_check_command(inner) if inner else [])
    if module == "pytest":
        return _check_flags(what, rest, _help(sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"))
    if module == "build":
        return _check_flags(what, rest, _help(sys.executable, "-m", "build", "--help"))
    if module == "venv":
        return []
    src = _module_source(module)
    if src is None:
        return [f"{what}: no module {module} in the repository"]
    return _check_repo_script(what, src, rest)


def _check_pip(what: str, args: list[str]) -> list[str]:
    sub = next((a for a in args if not a.startswith("-")), None)
    if sub is None:
        return []
    return _check_flags(f"{what} {sub}", args, _help(sys.executable, "-m", "pip", sub, "--help"))


def _check_command(words: list[str]) -> list[str]:
    cmd = words[0]
    if _PYTHON.match(cmd):
        return _check_python(words)
    if cmd in ("pip", "pip3"):
        return _check_pip(cmd, words[1:])
    if cmd == "hatch-khal":
        return _check_python(["python", "-m", "hatch_khal", *words[1:]])
    if cmd == "pytest":
        return _check_python(["python", "-m", "pytest", *words[1:]])
    if cmd in ("uv", "hatch"):
        sub = [a for a in words[1:] if not a.startswith("-")][:1]
        exe = Path(sys.executable).parent / cmd
        tool = str(exe) if exe.exists() else cmd
        return _check_flags(" ".join([cmd, *sub]), words[1:], _help(tool, *sub, "--help"))
    if cmd in _PLAIN or cmd.startswith("../"):  # outside the repository (the GPU machine's tools)
        return []
    path = ROOT / cmd
    if path.is_file() and os.access(path, os.X_OK):
        if cmd in _SCRIPTS_TO_PYTEST:
            return _check_python(["python", "-m", "pytest", *words[1:]])
        return _check_repo_script(cmd, path, words[1:])
    return [f"unknown command {cmd!r} (not a script of the repository nor a known tool)"]


@pytest.mark.parametrize("block", _params("sh"))
def test_sh_block(block: Block) -> None:
    problems = []
    for words in _commands(block.code):
        problems += _check_command(words)
    assert not problems, f"{block.id}:\n" + "\n".join(problems)


@pytest.mark.parametrize("block", _params("yaml"))
def test_yaml_block(block: Block) -> None:
    """A CI workflow: each ``run:`` step's commands are checked as a ```sh block's (``${{ ... }}``
    expressions stand for a word)."""
    steps = [re.sub(r"\$\{\{[^}]*\}\}", "X", m.group(1))
             for m in re.finditer(r"^\s*(?:-\s+)?run:\s*(.+)$", block.code, re.M)]
    assert steps, f"{block.id}: no run: step"
    problems = []
    for step in steps:
        for words in _commands(step):
            problems += _check_command(words)
    assert not problems, f"{block.id}:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------------
# ```cpp and ```slang
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block", _params("cpp"))
def test_cpp_block(block: Block) -> None:
    from hatch_khal.entries import find_entries

    if "KHAL_ENTRY" not in block.code:
        pytest.skip("no KHAL_ENTRY in this fragment: nothing for the grammar to check")
    entries = find_entries(block.code, block.id)
    assert entries, f"{block.id}: no entry found"


@pytest.mark.parametrize("block", _params("slang", pending_matters=False))
def test_slang_block(block: Block, tmp_path: Path) -> None:
    pytest.importorskip("slangpy", reason="slangpy (the Slang compiler) is not installed")
    from hatch_khal.slang.stage import compile_slang_crate, plan_slang_crate

    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "docs.slang").write_text(block.code)
    out = compile_slang_crate(plan_slang_crate(tmp_path, "docs", ["k/*.slang"], [], {}, []))
    assert out.entries, f"{block.id}: no compute entry"


# ------------------------------------------------------------------------------------------
# the quickstart projects (built for real) and ```python
# ------------------------------------------------------------------------------------------

def project_files(project: str = QUICKSTART) -> dict[str, str]:
    files: dict[str, str] = {}
    for b in all_blocks():
        spec = b.markers.get("file")
        if spec is None:
            continue
        name, _, rel = spec.rpartition(":")
        name = name or QUICKSTART
        if name in (QUICKSTART, project):
            files.setdefault(f"{name}:{rel}", b.code)
    out = {k.split(":", 1)[1]: v for k, v in files.items() if k.startswith(f"{QUICKSTART}:")}
    out.update({k.split(":", 1)[1]: v for k, v in files.items() if k.startswith(f"{project}:")})
    return out


def project_names() -> list[str]:
    names = {b.markers["file"].rpartition(":")[0] or QUICKSTART for b in all_blocks() if "file" in b.markers}
    return sorted(names)


def write_project(root: Path, project: str = QUICKSTART) -> Path:
    for rel, code in project_files(project).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(code)
    return root


@pytest.fixture(scope="session")
def quickstart_site(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """The quickstart project built without isolation (the test environment has the build
    backend, hatch-khal and NVRTC), for sm_90 only, unpacked as an install target."""
    src = write_project(tmp_path_factory.mktemp("quickstart"))
    out = tmp_path_factory.mktemp("quickstart-wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(out), str(src)],
        env=build_env(session_cache, KHAL_CUDA_ARCHS="sm_90"))
    (wheel,) = out.glob("*.whl")
    site = tmp_path_factory.mktemp("quickstart-site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


@contextlib.contextmanager
def _importable(site: Path, package: str) -> Iterator[None]:
    def purge() -> None:
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]

    purge()
    sys.path.insert(0, str(site))
    try:
        yield
    finally:
        sys.path.remove(str(site))
        purge()


@contextlib.contextmanager
def _registered(module: types.ModuleType) -> Iterator[None]:
    sys.modules[module.__name__] = module
    try:
        yield
    finally:
        sys.modules.pop(module.__name__, None)


def _chain(block: Block) -> list[Block]:
    """The python blocks ``block`` runs after (its chain of ``continues``), then itself."""
    runnable = [b for b in read_doc(block.file).blocks if b.lang == "python" and "file" not in b.markers]
    i = next(n for n, b in enumerate(runnable) if b.line == block.line)
    start = i
    while start > 0 and "continues" in runnable[start].markers:
        start -= 1
    return runnable[start:i + 1]


def _expected_output(block: Block) -> str | None:
    blocks = read_doc(block.file).blocks
    i = next(n for n, b in enumerate(blocks) if b.line == block.line)
    nxt = blocks[i + 1] if i + 1 < len(blocks) else None
    if nxt is not None and nxt.lang == "text" and "output" in nxt.markers:
        return nxt.code
    return None


def _python_params() -> list[Any]:
    out = []
    for b in all_blocks():
        if b.lang != "python" or "file" in b.markers:
            continue
        chain = _chain(b)
        marks = []
        keys = {k for c in chain for k in c.markers}
        uses = {c.markers["uses"] for c in chain if "uses" in c.markers}
        if "gpu" in keys:
            marks.append(pytest.mark.gpu)
        if "webgpu" in keys:
            marks.append(pytest.mark.webgpu)
        if "gpu" not in keys and uses:
            marks.append(pytest.mark.slow)
        if any(c.pending for c in chain):
            pend = next(c.pending for c in chain if c.pending)
            marks.append(pytest.mark.xfail(reason=f"pending: {pend}", strict=False))
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def _webgpu_reason() -> str | None:
    from khal_runtime import backends

    try:
        st = backends.get("webgpu").status()
    except ImportError as exc:
        return f"wgpu-py is not importable ({exc})"
    return None if st.usable else st.reason


@pytest.mark.parametrize("block", _python_params())
def test_python_block(block: Block, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    chain = _chain(block)
    markers = {k: v for c in chain for k, v in c.markers.items()}
    uses = {c.markers["uses"] for c in chain if "uses" in c.markers}
    for c in chain:
        if "needs" in c.markers:
            pytest.importorskip(c.markers["needs"])
    from khal_runtime import backends

    # free what earlier blocks left (DeviceBuffers, graphs) now: a cuMemFree by the garbage
    # collector inside a PyTorch capture (global mode) would invalidate that capture
    gc.collect()
    with contextlib.ExitStack() as stack:
        stack.callback(backends.reset)  # a block's backend choice stays with the block
        if "webgpu" in markers:
            reason = _webgpu_reason()
            if reason:
                pytest.skip(f"WebGPU: {reason}")
            monkeypatch.setenv("KHAL_BACKEND", "webgpu")
            backends.reset()
        if "example" in uses:
            request.getfixturevalue("example_pkg")
        if QUICKSTART in uses:
            stack.enter_context(_importable(request.getfixturevalue("quickstart_site"), "my_shaders"))
        # a real module: torch.compile (dynamo) looks the functions' module up in sys.modules
        # a name of its own per block: dynamo resolves a compiled function's globals through
        # the module's name, so two blocks compiling under one name saw each other's module
        module = types.ModuleType("_khal_docs_block_" + re.sub(r"\W", "_", block.id))
        stack.enter_context(_registered(module))
        ns: dict[str, Any] = module.__dict__
        out = io.StringIO()
        for b in chain:
            code = compile(b.code, f"{b.id}", "exec")
            if b is chain[-1]:
                with contextlib.redirect_stdout(out):
                    exec(code, ns)
            else:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(code, ns)
    expected = _expected_output(block)
    if expected is not None:
        assert out.getvalue().strip() == expected.strip(), f"{block.id}: output differs from the doc's"


@pytest.mark.parametrize("block", _params("python", lambda b: "file" in b.markers, pending_matters=False))
def test_project_python_file_compiles(block: Block) -> None:
    compile(block.code, block.id, "exec")


@pytest.fixture(scope="module")
def find_links(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """hatch-khal's and khal-runtime's wheels, built as the docs tell a user to build them (neither is on PyPI)."""
    links = tmp_path_factory.mktemp("links")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(links), str(ROOT), str(RUNTIME)],
        env=build_env(session_cache))
    return links


def _project_params() -> list[Any]:
    out = []
    for name in project_names():
        pend = next((b.pending for b in all_blocks() if b.pending and "file" in b.markers
                     and (b.markers["file"].rpartition(":")[0] or QUICKSTART) == name), None)
        marks = [pytest.mark.xfail(reason=f"pending: {pend}", strict=False)] if pend else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out


_HOOK_TABLE = "[tool.hatch.build.targets.wheel.hooks.khal]"


def _pin_nvrtc_to_the_installed_one(pyproject: Path) -> None:
    """The hatch projects' isolated builds get the NVRTC installed here (as tests/build/test_wheels.py's
    do), not the default ``nvrtc-requirement`` (CUDA 13.0's, which a local mirror may not hold):
    what is tested is the project, not the index."""
    from importlib.metadata import version

    text = pyproject.read_text()
    if "nvrtc-requirement" in text or "hooks.khal" not in text:
        return
    pin = f'nvrtc-requirement = "nvidia-cuda-nvrtc=={version("nvidia-cuda-nvrtc")}"\n'
    if f"{_HOOK_TABLE}\n" in text:
        text = text.replace(f"{_HOOK_TABLE}\n", f"{_HOOK_TABLE}\n{pin}", 1)
    else:
        first = text.index("[[tool.hatch.build.targets.wheel.hooks.khal.crates]]")
        text = f"{text[:first]}{_HOOK_TABLE}\n{pin}\n{text[first:]}"
    tomllib.loads(text)
    pyproject.write_text(text)


@pytest.mark.slow
@pytest.mark.parametrize("project", _project_params())
def test_quickstart_projects_build(project: str, tmp_path: Path, session_cache: Path, find_links: Path) -> None:
    """Build each project of the docs as a user would: with build isolation and ``--find-links``
    to hatch-khal's wheel (the documented command), for sm_90 only; check the wheel tag the docs
    promise, its contents, and ``python -m hatch_khal verify``."""
    files = project_files(project)
    src = write_project(tmp_path / project, project)
    _pin_nvrtc_to_the_installed_one(src / "pyproject.toml")
    out = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--find-links", str(find_links), "-w", str(out), str(src)],
        env=build_env(session_cache, KHAL_CUDA_ARCHS="sm_90"))
    (wheel,) = out.glob("*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), f"{project}: {wheel.name} is not the promised py3-none-any"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "my_shaders/_khal/manifest.json" in names, sorted(names)
    assert "my_shaders/_khal/core/core.sm_90.cubin" in names, sorted(names)
    assert not any(n.startswith("kernels/") for n in names), f"{project}: kernel sources leaked into the wheel"
    if project != "setuptools":  # the hatch hook adds the PEP 561 marker the stub needs
        assert "my_shaders/py.typed" in names and "my_shaders/_khal/__init__.pyi" in names, sorted(names)
    if "from ._khal import" in files.get("my_shaders/__init__.py", ""):
        assert "my_shaders/_khal/__init__.py" in names, f"{project}: the build wrote no my_shaders/_khal/__init__.py"
    run([sys.executable, "-m", "hatch_khal", "verify", str(wheel)])


# ------------------------------------------------------------------------------------------
# output blocks produced by their command (tests/helpers/doc_outputs.py)
# ------------------------------------------------------------------------------------------

#: the first line of a ```text block that shows what hatch-khal prints
_TOOL_OUTPUT = re.compile(r"^(khal[: ]|package \S+ \(schema|verify: )")


def test_tool_output_blocks_are_generated_or_say_why_not() -> None:
    """A block of hatch-khal's output is produced by its command (``<!-- generated: NAME -->``),
    or says why it cannot be here (``<!-- sample: needs a GPU -->``): typed output drifts."""
    from tests.helpers.doc_outputs import MARKER, PRODUCERS

    bad = []
    for b in all_blocks():
        if b.lang != "text" or b.pending:
            continue
        if MARKER in b.markers:
            unknown = [p for p in b.markers[MARKER].split("+") if p not in PRODUCERS]
            if unknown:
                bad.append(f"{b.id}: no producer {unknown} in tests/helpers/doc_outputs.py")
            continue
        first = b.code.strip().splitlines()[0] if b.code.strip() else ""
        if _TOOL_OUTPUT.match(first) and "sample" not in b.markers:
            bad.append(f"{b.id}: hatch-khal's output typed by hand ({first[:60]!r}); mark it "
                       "<!-- generated: NAME --> with a producer in tests/helpers/doc_outputs.py, or <!-- sample: WHY -->")
    assert not bad, "\n".join(bad)


@pytest.fixture(scope="session")
def doc_outputs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One build per doc page, shared by all of its generated blocks."""
    from tests.helpers.doc_outputs import Context

    return Context(tmp_path_factory.mktemp("doc-outputs"))


def _generated_params() -> list[Any]:
    from tests.helpers.doc_outputs import generated_blocks

    return [pytest.param(b, id=b.id, marks=[pytest.mark.needs_nvrtc]) for b in generated_blocks()]


@pytest.mark.parametrize("block", _generated_params())
def test_generated_block(block: Block, doc_outputs: Any) -> None:
    """The block holds what its command prints now (normalised for times, sizes, sha256 prefixes and
    the order parallel compiles finish in; entry hashes compared exactly). Stale: run
    ``scripts/update-docs``."""
    from tests.helpers.doc_outputs import MARKER, diff, produce

    d = diff(block, produce(block.markers[MARKER], doc_outputs))
    assert not d, (f"{block.id} is stale: it is not what `{block.markers[MARKER]}` prints now; rewrite it "
                   f"with scripts/update-docs (python -m tests.helpers.doc_outputs --update)\n{d}")


def test_generated_blocks_compare_hashes_exactly_and_rewrite_in_place(tmp_path: Path) -> None:
    """What varies between runs (times, sizes, sha256 prefixes, finishing order) is normalised; an
    entry hash is not (the docs say it is the same on any machine). ``--update`` rewrites only the
    block, fences and markers kept."""
    from tests.helpers.doc_outputs import diff, rewrite

    doc = tmp_path / "page.md"
    shown = ("khal: [1/8] compiled crate 'core' for sm_75 in 0.04s\n"
             "    entry saxpy hash 9f5b516bcc1bcae5 block 256\n"
             "    cubin sm_75            6832 B  sha256 0511d1206f1e1ad2…  _khal/core/core.sm_75.cubin\n")
    doc.write_text(f"# T\n\n<!-- generated: x -->\n```text\n{shown}```\n\nafter\n")
    (block,) = [b for b in read_doc(doc).blocks]
    same = shown.replace("sm_75 in 0.04s", "compute_75 in 1.2s").replace("6832 B", "16832 B") \
        .replace("0511d1206f1e1ad2", "aaaaaaaaaaaaaaaa")
    assert diff(block, same) == ""
    rehashed = shown.replace("9f5b516bcc1bcae5", "3889dabf996513cd")
    d = diff(block, rehashed)
    assert "-    entry saxpy hash 9f5b516bcc1bcae5" in d and "+    entry saxpy hash 3889dabf996513cd" in d
    assert d.startswith(f"--- {block.id} (the doc)")
    rewrite(block, rehashed + "one more line\n")
    assert doc.read_text() == (f"# T\n\n<!-- generated: x -->\n```text\n{rehashed}one more line\n```\n\nafter\n")


# ------------------------------------------------------------------------------------------
# every crate snippet plans, as written, in a project holding what it names
# ------------------------------------------------------------------------------------------

_SNIPPET_CU = ('#include "khal.h"\nKHAL_ENTRY(docs_k, 64, (KHAL_STORAGE(float, y)))\n'
               "{ uint64_t i = KHAL_GLOBAL_ID; if (i < y.len) y[i] = 1.0f; }\n")
_SNIPPET_SLANG = ('[shader("compute")]\n[numthreads(64, 1, 1)]\n'
                  "void docs_k(uint3 tid : SV_DispatchThreadID, RWStructuredBuffer<float> y) { y[tid.x] = 1.0; }\n")


def _hook_table(code: str) -> dict[str, Any] | None:
    data = tomllib.loads(code)
    tool = data.get("tool", {})
    hook = tool.get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {}).get("hooks", {}).get("khal")
    if hook is None:
        hook = tool.get("khal")
    return hook if isinstance(hook, dict) and hook.get("crates") else None


def _crate_snippets() -> list[Any]:
    out = []
    for b in all_blocks():
        if b.lang == "toml" and _hook_table(b.code) is not None:
            marks = [pytest.mark.xfail(reason=f"pending: {b.pending}", strict=False)] if b.pending else []
            out.append(pytest.param(b, id=b.id, marks=marks))
    return out


@pytest.mark.parametrize("block", _crate_snippets())
def test_crate_snippet_plans_as_written(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snippet declaring crates is planned by the hook (config, sources, include dirs) in a project
    holding one source file per ``sources`` glob and what the page says the project holds
    (``<!-- layout: PATH ... -->``, a trailing ``/`` for a folder): an ``include-dirs`` naming a
    folder the page never shows fails here as it would for the reader."""
    from hatch_khal.config import parse_config
    from hatch_khal.frontend import CallbackReporter
    from hatch_khal.plan import plan_crates

    _clean_build_env(monkeypatch)
    hook = _hook_table(block.code)
    assert hook is not None
    root = tmp_path / "project"
    (root / "my_shaders").mkdir(parents=True)
    (root / "my_shaders/__init__.py").write_text("")
    for crate in hook["crates"]:
        for glob in crate.get("sources", []):
            rel = glob.replace("**/", "").replace("*", f"docs_{crate.get('name', 'c')}")
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(_SNIPPET_SLANG if rel.endswith(".slang") else _SNIPPET_CU)
    for rel in block.markers.get("layout", "").split():
        p = root / rel
        if rel.endswith("/"):
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
    _, crates = parse_config(dict(hook), default_package="my_shaders", where=block.id)
    quiet = CallbackReporter(lambda m: None, lambda m: None, lambda m: None)
    assert plan_crates(root, crates, quiet)


def _line_shape(line: str) -> str:
    """A tool line with what varies from one build to another (numbers, names, targets) blanked."""
    line = re.sub(r"'[^']*'", "'X'", line.strip())
    line = re.sub(r"\b(sm|compute)_\d+[af]?\b", "ARCH", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return re.sub(r"\s+", " ", line)


#: prose quoting lines no producer prints here (they need a GPU)
_INLINE_SAMPLES = ("khal: launch #", "khal: graph #")


@pytest.mark.needs_nvrtc
def test_inline_build_lines_have_the_shape_the_build_prints(doc_outputs: Any) -> None:
    """A `khal: ...` line quoted in prose (troubleshooting's "compiling 3 crate(s) × 8 target(s)
    with 2 threads") has the shape of a line the build prints now (numbers and names aside)."""
    from tests.helpers.doc_outputs import produce

    produced = produce("quickstart-build", doc_outputs) + produce("compile-error", doc_outputs)
    shapes = {_line_shape(ln) for ln in produced.splitlines() if ln.startswith("khal: ")}
    shapes.add(_line_shape("khal: editable install: kernels written to my_shaders/_khal/"))
    bad = []
    for f in DOC_FILES:
        for line, text in read_doc(f).prose:
            for span in re.findall(r"`(khal: [^`]*)`", text):
                if span.startswith(_INLINE_SAMPLES) or "…" in span or "..." in span:
                    continue
                if _line_shape(span) not in shapes:
                    bad.append(f"{f.relative_to(ROOT)}:{line}: `{span}` is not a line the build prints "
                               f"(shapes printed now: {sorted(shapes)})")
    assert not bad, "\n".join(bad)
