"""The build side of the "elementwise" language: each line of a ``.ew`` file is a kernel,
``name(x, y) -> out: <float expression of x, y>``, over float32 arrays of one length. The language
translates a crate's files to CUDA C++ with ``KHAL_ENTRY`` markers and hands that to hatch-khal's
own CUDA C++ language (NVRTC), as a transpiling plugin would. Its own crate option,
``elementwise-block``, is the kernels' block size."""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hatch_khal.config import HookConfig, ResolvedCrate
from hatch_khal.cuda import CUDA
from hatch_khal.errors import ConfigError, SourceError
from hatch_khal.languages import BuildRequirement, LanguageBase
from hatch_khal.nvrtc import nvrtc_requirements
from hatch_khal.sources import collect_sources

_LINE = re.compile(r"\s*(?P<name>[A-Za-z_]\w*)\s*\((?P<ins>[^)]*)\)\s*->\s*(?P<out>[A-Za-z_]\w*)\s*:\s*(?P<expr>.+)")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_OPTION = "elementwise-block"


def translate(text: str, where: str, block: int) -> str:
    """CUDA C++ with one KHAL_ENTRY per kernel line of ``text``; SourceError naming the line."""
    out = ['#include "khal.h"']
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise SourceError(f"{where}:{n}: not a kernel line 'name(x, y) -> out: expression': {line.strip()!r}")
        ins = [i.strip() for i in m["ins"].split(",") if i.strip()]
        names = set(ins)
        expr = _IDENT.sub(lambda t: f"{t[0]}[i]" if t[0] in names else t[0], m["expr"])
        params = ", ".join([*(f"KHAL_STORAGE(const float, {i})" for i in ins), f"KHAL_STORAGE(float, {m['out']})"])
        out.append(f"KHAL_ENTRY({m['name']}, {block}, ({params}))\n"
                   f"{{\n    uint64_t i = KHAL_GLOBAL_ID;\n    if (i < {m['out']}.len) {m['out']}[i] = {expr};\n}}")
    return "\n".join(out) + "\n"


class ElementwiseLanguage(LanguageBase):
    name = "elementwise"
    title = "Elementwise"
    suffixes: tuple[str, ...] = (".ew",)
    crate_options = frozenset({_OPTION})
    compiler = "nvrtc"

    def validate_options(self, prefix: str, options: Mapping[str, Any]) -> dict[str, Any]:
        block = options.get(_OPTION, 128)
        if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= 1024 or block & (block - 1):
            raise ConfigError(f"{prefix}: option {_OPTION!r} must be a power of two from 1 to 1024 (got {block!r})")
        return {"block": block}

    def requirements(self, crates: Sequence[ResolvedCrate], hook: HookConfig) -> list[BuildRequirement]:
        return nvrtc_requirements(crates, hook)

    def plan(self, root: Path, cfg: ResolvedCrate) -> Any:
        sources = collect_sources(root, cfg.name, cfg.sources, [])
        block = cfg.language_options.get("block", 128)
        out = Path(tempfile.mkdtemp(prefix=f"khal-ew-{cfg.name}-"))
        atexit.register(shutil.rmtree, out, True)
        (out / f"{cfg.name}.cu").write_text("".join(translate(f.text, f.rel, block) for f in sources.sources))
        # the CUDA C++ language plans the translation (content hash, entries and their hashes: of the
        # generated code, a function of the .ew files and the block size); the stages then ask this language
        planned = CUDA.plan(out, cfg.model_copy(update={"sources": [f"{cfg.name}.cu"], "include_dirs": []}))
        # the manifest lists the .ew files (what the user edits), not the generated translation
        return replace(planned, language=self, files=tuple(sources.all_files))

    def prepare(self, planned: Any, cache: Any, reporter: Any) -> Any:
        return CUDA.prepare(planned, cache, reporter)

    def jobs(self, prepared: Any, root: Path, targets: list[str]) -> Any:
        return CUDA.jobs(prepared, prepared.plan.root, targets)

    def explain(self, prepared: Any, error: Any) -> Any:
        return CUDA.explain(prepared, error)

    def finish(self, compiled: Any, binary: Any) -> Any:
        return CUDA.finish(compiled, binary)


LANGUAGE = ElementwiseLanguage()
