"""#38 item 13, the newcomer's path: every documented command that installs hatch-khal or khal-runtime
(README.md, docs/guide) resolves as written from a clean clone, once the wheels are built as the
docs say (``pip wheel --no-deps -w ~/khal-wheels path/to/hatch-khal path/to/hatch-khal/runtime``).
``pip install "path/to/hatch-khal[build]"`` did not: pip then looked for ``khal-runtime==0.1.0`` on
the index. Each command is run by pip with ``--dry-run --ignore-installed`` (what resolves, with
nothing of this environment counted as installed: as in a fresh virtual environment), the folder
and the checkout's path put in for ``~/khal-wheels`` and ``path/to/hatch-khal``."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, RUNTIME, build_env, run

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
_SH = re.compile(r"```sh\n(.*?)```", re.S)


def documented_installs() -> list[tuple[str, str]]:
    """(where, command) of each ``pip install`` of hatch-khal or khal-runtime in an sh block."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for block in _SH.finditer(text):
            line_no = text[:block.start()].count("\n") + 2
            for i, line in enumerate(block.group(1).splitlines()):
                cmd = line.split("#", 1)[0].strip()
                words = shlex.split(cmd) if cmd else []
                if "pip" in words and "install" in words and any(
                        re.match(r"(hatch-khal|khal-runtime)(\[|$)", w) or "path/to/hatch-khal" in w for w in words):
                    out.append((f"{doc.relative_to(ROOT)}:{line_no + i}", cmd))
    return out


def test_the_docs_document_installs() -> None:
    found = {cmd for _, cmd in documented_installs()}
    assert any('"hatch-khal[build]"' in c for c in found), found  # the build-without-isolation path
    assert any(c.endswith(" hatch-khal") for c in found), found


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """The folder the docs build first: hatch-khal's and khal-runtime's wheels, as documented."""
    links = tmp_path_factory.mktemp("khal-wheels")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(links), str(ROOT), str(RUNTIME)],
        env=build_env(session_cache))
    return links


@pytest.mark.slow
@pytest.mark.parametrize("where, command", documented_installs(), ids=[w for w, _ in documented_installs()])
def test_a_documented_install_resolves_as_written(where: str, command: str, wheels: Path, session_cache: Path) -> None:
    words = shlex.split(command.replace("~/khal-wheels", str(wheels)).replace("path/to/hatch-khal", str(ROOT)))
    i = words.index("install")
    # the python that runs pip: this one (its pip); everything after "install" as written
    args = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", *words[i + 1:]]
    proc = run(args, env=build_env(session_cache), check=False, timeout=900)
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
