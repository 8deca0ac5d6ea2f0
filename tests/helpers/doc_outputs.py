"""The output blocks of the docs that a command of hatch-khal prints, produced by running it.

A ```text block marked ``<!-- generated: NAME -->`` is what producer ``NAME`` below prints: the
command of the ```sh block above it, run on the project the page builds (the quickstart's, from
its ``<!-- file: ... -->`` blocks). ``tests/test_docs.py::test_generated_block`` runs the producer
and compares, after :func:`normalise` (times, artifact sizes and sha256 prefixes, the order in
which parallel compiles finish, column widths: what differs between two runs or machines); what is
the same on any machine, the entry hashes first, is compared exactly. When the code changes what
the tool prints, rewrite the blocks:

    scripts/update-docs            # = python -m tests.helpers.doc_outputs --update
    python -m tests.helpers.doc_outputs    # only say which blocks are stale, with the diff

A ```text block that looks like hatch-khal's output (``khal:`` / ``package ...`` / ``verify:``
lines) must be generated, or say why it cannot be (``<!-- sample: needs a GPU -->``).

One build per page, shared by its blocks (:class:`Context`); it runs without build isolation in
this environment (the hook's lines are the same as in the isolated build the docs show), with a
fresh compile cache so the summary says what a first build says.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
MARKER = "generated"


class Context:
    """What the producers share: the quickstart project built once, under ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        #: each producer's output, produced once for every block that shows it
        self.produced: dict[str, str] = {}

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        for v in ("KHAL_CUDA_ARCHS", "KHAL_PTX_ARCH", "KHAL_SKIP_SPIRV", "KHAL_JOBS"):
            env.pop(v, None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        # the docs' builds use this environment's NVRTC (the pages say which), newer than the default
        # nvrtc-requirement admits: built anyway (hatch_khal.nvrtc.ptx_problem)
        env.setdefault("KHAL_NVRTC_ANY_MINOR", "1")
        env.update(extra)
        return env

    def run(self, cmd: list[str], cwd: Path, **env: str) -> str:
        proc = subprocess.run(cmd, cwd=cwd, env=self.env(**env), capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                                 f"{proc.stderr[-4000:]}")
        return proc.stdout + proc.stderr

    @cached_property
    def quickstart(self) -> tuple[Path, str]:
        """(the project, ``pip wheel -v``'s output): the quickstart built for the default targets."""
        from tests.test_docs import write_project

        project = write_project(self.base / "my-shaders")
        log = self.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                        "-w", "dist", "."], project,
                       KHAL_CACHE_DIR=str(self.base / "cache"), KHAL_JOBS="2")
        return project, log


    def build_log(self, project: Path, *, check: bool = True) -> str:
        """``pip wheel -v`` of ``project`` without isolation, with a cache of its own."""
        cmd = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", "dist", "."]
        if check:
            return self.run(cmd, project, KHAL_CACHE_DIR=str(self.base / "cache"), KHAL_JOBS="2")
        proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True, timeout=900,
                              env=self.env(KHAL_CACHE_DIR=str(self.base / "cache"), KHAL_JOBS="2"))
        assert proc.returncode != 0, f"{project}: the build was meant to fail"
        return proc.stdout + proc.stderr


#: the error troubleshooting.md shows: the quickstart's kernel with a name it never declared
BROKEN_LINE = ("    if (i < y.len) y[i] = params.a * x[i] + y[i];",
               "    if (i < y.len) y[i] = params.a * x[i] + undefined_name;")
#: the project's folder as the docs write it
SHOWN_ROOT = "/path/to/my-shaders"


def _elide(lines: list[str], keep: Callable[[int, str], bool]) -> list[str]:
    """``lines`` with each run of lines ``keep`` drops replaced by one ``...``."""
    out: list[str] = []
    for i, ln in enumerate(lines):
        if keep(i, ln):
            out.append(ln)
        elif not out or out[-1].strip() != "...":
            out.append(re.match(r"\s*", ln).group(0) + "...")  # type: ignore[union-attr]
    return out


def quickstart_build(ctx: Context) -> str:
    """quickstart.md: ``pip wheel -v``: the hook's lines (plan, first and last artifact, summary)."""
    _, log = ctx.quickstart
    lines = [ln.strip() for ln in log.splitlines() if ln.strip().startswith("khal:")]
    steps = [i for i, ln in enumerate(lines) if re.match(r"khal: \[\d+/\d+\]", ln)]
    keep = {steps[0], steps[-1]} if steps else set()
    return "\n".join(_elide(lines, lambda i, ln: i not in steps or i in keep)) + "\n"


QUICKSTART_WHEEL = "dist/my_shaders-0.1.0-py3-none-any.whl"


def quickstart_inspect(ctx: Context) -> str:
    """``python -m hatch_khal inspect`` of the quickstart's wheel (its first and last cubin shown)."""
    project, _ = ctx.quickstart
    inspect = ctx.run([sys.executable, "-m", "hatch_khal", "inspect", QUICKSTART_WHEEL], project).splitlines()
    cubins = [i for i, ln in enumerate(inspect) if ln.strip().startswith("cubin ")]
    keep = {cubins[0], cubins[-1]} if cubins else set()
    return "\n".join(_elide(inspect, lambda i, ln: i not in cubins or i in keep)) + "\n"


def quickstart_verify(ctx: Context) -> str:
    """``python -m hatch_khal verify`` of the quickstart's wheel."""
    project, _ = ctx.quickstart
    return ctx.run([sys.executable, "-m", "hatch_khal", "verify", QUICKSTART_WHEEL], project)


#: a block's marker may join producers with ``+``: their outputs one after the other
def compile_error(ctx: Context) -> str:
    """troubleshooting.md: the quickstart with an undeclared name in its kernel: the hook's line
    cancelling the other compiles, then the CompileError with NVRTC's log (the absolute path of the
    file NVRTC read, written here as /path/to/my-shaders)."""
    from tests.test_docs import write_project

    project = write_project(ctx.base / "broken" / "my-shaders")
    src = project / "kernels" / "saxpy.cu"
    text = src.read_text()
    assert BROKEN_LINE[0] in text, "the quickstart's kernel changed: update BROKEN_LINE"
    src.write_text(text.replace(*BROKEN_LINE))
    log = ctx.build_log(project, check=False).replace(str(project.resolve()), SHOWN_ROOT) \
        .replace(str(project), SHOWN_ROOT)
    lines = [ln[2:] if ln.startswith("  ") else ln for ln in log.splitlines()]
    out = [ln for ln in lines if re.match(r"khal: crate .* failed to compile", ln)]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("hatch_khal.errors.CompileError"))
    end = next(i for i in range(start, len(lines)) if "error detected in the compilation" in lines[i]
               or "errors detected in the compilation" in lines[i])
    return "\n".join(out + lines[start:end + 1]) + "\n"


PRODUCERS: dict[str, Callable[[Context], str]] = {
    "compile-error": compile_error,
    "quickstart-build": quickstart_build,
    "quickstart-inspect": quickstart_inspect,
    "quickstart-verify": quickstart_verify,
}


def produce(name: str, ctx: Context) -> str:
    parts = name.split("+")
    missing = [p for p in parts if p not in PRODUCERS]
    if missing:
        raise KeyError(f"no producer {missing} (tests/helpers/doc_outputs.py PRODUCERS: {sorted(PRODUCERS)})")
    for p in parts:
        if p not in ctx.produced:
            ctx.produced[p] = PRODUCERS[p](ctx)
    return "".join(ctx.produced[p] for p in parts)


def normalise(text: str) -> str:
    """What may differ between two runs of the same command: times, artifact sizes, sha256
    prefixes, which target a parallel compile finished first, column widths."""
    out = []
    for ln in text.strip().splitlines():
        ln = re.sub(r"\b\d+(\.\d+)?s\b", "<t>s", ln)
        ln = re.sub(r"(khal: \[\d+/\d+\] compiled crate '[^']*' for )\S+", r"\1<target>", ln)
        ln = re.sub(r"with \d+ threads", "with <n> threads", ln)
        ln = re.sub(r"(failed to compile for )[\w.]+", r"\1<target>", ln)
        ln = re.sub(r"\b\d+ B\b", "<n> B", ln)
        ln = re.sub(r"sha256 [0-9a-f]{16}…", "sha256 <sha256>…", ln)
        out.append(re.sub(r"\s+", " ", ln).strip())
    return "\n".join(out)


def generated_blocks() -> list:  # list[tests.test_docs.Block]
    from tests.test_docs import all_blocks

    return [b for b in all_blocks() if b.lang == "text" and MARKER in b.markers]


def diff(block, produced: str) -> str:  # noqa: ANN001 - a tests.test_docs.Block
    """'' when the block holds what the producer printed (normalised), else a unified diff."""
    if normalise(block.code) == normalise(produced):
        return ""
    return "".join(difflib.unified_diff(block.code.splitlines(True), produced.splitlines(True),
                                        f"{block.id} (the doc)", f"{block.markers[MARKER]} (produced now)"))


def rewrite(block, produced: str) -> None:  # noqa: ANN001
    """Replace the block's lines in its file with ``produced`` (the fences stay)."""
    lines = block.file.read_text(encoding="utf-8").splitlines(keepends=True)
    start = block.line  # 0-based index of the first line after the opening fence
    end = start
    while end < len(lines) and lines[end].strip() != "```":  # the closing fence
        end += 1
    assert end < len(lines), f"{block.id}: the block is not where it was read"
    lines[start:end] = [ln + "\n" for ln in produced.rstrip("\n").splitlines()]
    block.file.write_text("".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.helpers.doc_outputs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite the stale blocks with what is produced now")
    args = ap.parse_args(argv)
    stale = 0
    with tempfile.TemporaryDirectory(prefix="khal-docs-") as tmp:
        ctx = Context(Path(tmp))
        # bottom-up per file: a rewrite moves the lines of the blocks below it
        for block in sorted(generated_blocks(), key=lambda b: (str(b.file), -b.line)):
            name = block.markers[MARKER]
            try:
                produced = produce(name, ctx)
            except KeyError as exc:
                print(f"{block.id}: {exc}", file=sys.stderr)
                stale += 1
                continue
            d = diff(block, produced)
            if not d:
                print(f"{block.id}: {name}: up to date")
                continue
            stale += 1
            if args.update:
                rewrite(block, produced)
                print(f"{block.id}: {name}: rewritten")
            else:
                print(d)
    return 0 if args.update or not stale else 1


if __name__ == "__main__":
    sys.exit(main())
