"""CUDA C++ crates: ``KHAL_ENTRY`` markers in ``.cu`` sources, compiled by NVRTC.

The :class:`~hatch_khal.languages.Language` for ``language = "cuda"``: plan (sources,
entries, content hash), jobs (one generated translation unit, compiled per target),
and compile errors explained (missing CUDA headers, entries the scanner could not read).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

from khal_runtime.manifest import SpirvStatus

from hatch_khal.__about__ import __version__
from hatch_khal.codegen import explain_entry_error, generate_unit
from hatch_khal.compilers import get_compiler
from hatch_khal.config import ResolvedCrate
from hatch_khal.entries import scan_crate
from hatch_khal.errors import ConfigError, KhalBuildError, SourceError
from hatch_khal.hashing import canonical, crate_content_hash, entry_hash, khal_header_sha256, sha256_bytes
from hatch_khal.headers import HeaderSet, header_hint, resolve_headers
from hatch_khal.model import CompileJob, CratePlan
from hatch_khal.sources import collect_sources

__all__ = ["CUDA", "CudaLanguage", "khal_include_dir"]

_BASE_OPTIONS = ("-std=c++17",)
_MISSING_HEADER = re.compile(r'(?:could not|cannot) open source file "([^"]+)"')


def khal_include_dir() -> Path:
    """The directory holding khal.h, put on every crate's include path."""
    return Path(str(resources.files("hatch_khal") / "include"))


def _spirv_status(cfg: ResolvedCrate) -> SpirvStatus:
    if os.environ.get("KHAL_SKIP_SPIRV") is not None:
        return SpirvStatus(status="skipped", reason="KHAL_SKIP_SPIRV is set")
    if cfg.spirv:
        raise ConfigError(
            f"crate {cfg.name!r}: option 'spirv = true' asks for the SPIR-V stage, which this version "
            "of hatch-khal does not provide yet; set KHAL_SKIP_SPIRV=1 for a CUDA-only build or drop the option"
        )
    return SpirvStatus(status="not_configured", reason="'spirv' is not enabled for this crate")


def _nvrtc_major_or_none() -> int | None:
    try:
        return int(get_compiler("nvrtc").identity().version.split(".")[0])
    except KhalBuildError:
        return None  # prebuilt-only builds may have no NVRTC


class CudaLanguage:
    name = "cuda"
    compiler = "nvrtc"

    def plan(self, root: Path, cfg: ResolvedCrate) -> CratePlan:
        sources = collect_sources(root, cfg.name, cfg.sources, cfg.include_dirs)
        decls = scan_crate([(f.rel, f.text) for f in sources.scanned], cfg.name, cfg.defines, cfg.options,
                           sources.system_includes)
        if not decls:
            raise SourceError(
                f"crate {cfg.name!r}: no KHAL_ENTRY found in {', '.join(s.rel for s in sources.sources)}; "
                "mark kernels with KHAL_ENTRY(name, block_size, (params...)) from khal.h"
            )
        headers = HeaderSet(cfg.cuda_headers)
        extra: dict[str, object] = {}
        if sources.system_includes:
            # CUDA/CCCL headers are not hashed file by file: their package versions are.
            headers = resolve_headers(cfg.cuda_headers, _nvrtc_major_or_none())
            extra = {"cuda_headers": [cfg.cuda_headers, [list(f) for f in headers.fingerprint]]}
        content = crate_content_hash(sources.all_files, cfg.defines, cfg.options, extra)
        entries = [(d, entry_hash(content, d)) for d in decls]
        return CratePlan(cfg=cfg, language=self.name, sources=sources, content_hash=content, entries=entries,
                         spirv=_spirv_status(cfg), headers=headers)

    def jobs(self, plan: CratePlan, root: Path, targets: list[str]) -> list[CompileJob]:
        cfg = plan.cfg
        compiler = get_compiler(self.compiler)
        ident = compiler.identity()
        unit = generate_unit(cfg.name, [s.path for s in plan.sources.sources], plan.entries)
        include = [f"-I{khal_include_dir()}"] + [f"-I{d}" for d in plan.sources.include_dirs]
        include += [f"-I{d}" for d in plan.headers.include_dirs]
        defines = [f"-D{k}={v}" if v != "" else f"-D{k}" for k, v in sorted(cfg.defines.items())]
        options = (*_BASE_OPTIONS, *include, *defines, *cfg.options)
        jobs = []
        for target in targets:
            key = sha256_bytes(
                canonical(
                    {
                        "content": plan.content_hash,
                        "generated": unit.generated,
                        "order": [s.rel for s in plan.sources.sources],
                        "options": [*_BASE_OPTIONS, *defines, *cfg.options],
                        "headers": [cfg.cuda_headers, [list(f) for f in plan.headers.fingerprint]],
                        "arch": target,
                        "compiler": [ident.name, ident.version],
                        "hatch_khal": __version__,
                        "khal_h": khal_header_sha256(),
                    }
                )
            )
            jobs.append(CompileJob(crate=cfg.name, target=target, compiler=compiler.name, text=unit.text,
                                   name=f"{cfg.name}.khal.cu", options=options, key=key,
                                   header_mode=cfg.cuda_headers, heavy=bool(plan.sources.system_includes)))
        return jobs

    def explain(self, plan: CratePlan, error: KhalBuildError) -> KhalBuildError:
        text = str(error)
        entry_error = explain_entry_error(text, [d for d, _ in plan.entries], plan.sources.display, plan.cfg.name)
        if entry_error is not None:
            return entry_error
        names = sorted(set(_MISSING_HEADER.findall(text)))
        if not names:
            return error
        hints = "\n".join(f"hint: {header_hint(n, plan.headers.mode)}" for n in names)
        return type(error)(f"{error}\n{hints}")


CUDA = CudaLanguage()
