"""CUDA C++ crates: ``KHAL_ENTRY`` markers in ``.cu`` sources, compiled by NVRTC.

The :class:`~hatch_khal.languages.Language` for ``language = "cuda"``: plan (sources,
entries, content hash: :class:`CudaPlan`), prepare (which indirect variants are wrong:
:class:`CudaFront`), jobs (one generated translation unit, compiled per target),
compile errors explained (missing CUDA headers, entries the scanner could not read), and
the manifest entries with the compiler's own parameter types and sizes (the binary's probes,
:mod:`hatch_khal.probes`).
CUDA C++ builds CUDA only: its SPIR-V status is ``not_applicable``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from khal_runtime.binaries import ptx_grid_reads, ptx_module_globals
from khal_runtime.manifest import GlobalVar, SpirvStatus

from hatch_khal.__about__ import __version__
from hatch_khal.codegen import explain_entry_error, generate_unit, has_indirect
from hatch_khal.compile_stage import compile_jobs
from hatch_khal.compilers import get_compiler
from hatch_khal.config import CrateConfig, HookConfig, ResolvedCrate
from hatch_khal.entries import EntryDecl, scan_crate
from hatch_khal.errors import ConfigError, KhalBuildError, SourceError
from hatch_khal.hashing import canonical, crate_content_hash, entry_hash, khal_header_sha256, sha256_bytes
from hatch_khal.headers import HeaderSet, header_hints, nvrtc_cuda_major, resolve_headers
from hatch_khal.languages import BuildRequirement, Compiled, Language, LanguageBase, Planned, Prepared
from hatch_khal.model import CompileJob, CrateParts, PlannedEntry, Reporter
from hatch_khal.nvrtc import OUTPUT_FORMAT as NVRTC_OUTPUT
from hatch_khal.nvrtc import nvrtc_requirements
from hatch_khal.probes import indirect_verdict, manifest_entries
from hatch_khal.reads import cover, real_dirs
from hatch_khal.reads import locations as path_forms
from hatch_khal.sources import CrateSources, collect_sources

if TYPE_CHECKING:
    from khal_runtime.binaries import BinaryInfo

    from hatch_khal.cache import Cache

__all__ = ["CUDA", "CudaFront", "CudaLanguage", "CudaPlan", "khal_include_dir"]

#: A CUDA C++ crate's WebGPU stage: there is none (write the crate in Slang for WebGPU).
NOT_APPLICABLE = SpirvStatus(status="not_applicable", reason="CUDA C++ source")

_BASE_OPTIONS = ("-std=c++17",)
#: what makes a compiled kernel spell the path of a file it was compiled from
_PATH_MACROS = re.compile(rb"__FILE__|__builtin_FILE|source_location|\bassert\s*\(")


def khal_include_dir() -> Path:
    """The directory holding khal.h, put on every crate's include path."""
    return Path(str(resources.files("hatch_khal") / "include"))


@dataclass(frozen=True)
class CudaPlan:
    """What planning found of a CUDA C++ crate: its sources, the scanned entries, the CUDA headers."""

    sources: CrateSources
    #: the scanned entries, each with its entry hash
    decls: tuple[tuple[EntryDecl, str], ...]
    headers: HeaderSet
    #: the project root the crate was planned under (its compile jobs' locations are relative to it)
    root: Path


@dataclass(frozen=True)
class CudaFront:
    """What prepare found: the entries whose indirect variant the build judged wrong, with why (their
    variant is generated in none of the binaries)."""

    without_indirect: Mapping[str, str] = field(default_factory=dict)


_DEBUG_OPTIONS = ("-G", "--device-debug", "-dopt=off", "--dopt=off")


def _debug_build(options: tuple[str, ...] | list[str]) -> bool:
    """A debug build keeps dead code, so its PTX reads registers the kernel never uses: its launch
    facts are the scanned ones."""
    return any(o in _DEBUG_OPTIONS for o in options)


class CudaLanguage(LanguageBase):
    name = "cuda"
    title = "CUDA C++"
    compiler = "nvrtc"

    def check_crate(self, prefix: str, crate: CrateConfig) -> None:
        if crate.spirv:
            raise ConfigError(
                f"{prefix}: option 'spirv = true' asks for WGSL / SPIR-V, which only Slang crates build "
                "(CUDA C++ compiles to CUDA only); write the crate in Slang (.slang sources) to build it for "
                "WebGPU too, or drop the option"
            )

    def requirements(self, crates: Sequence[ResolvedCrate], hook: HookConfig) -> list[BuildRequirement]:
        return nvrtc_requirements(crates, hook)

    def plan(self, root: Path, cfg: ResolvedCrate) -> Planned[CudaPlan, CudaFront]:
        sources = collect_sources(root, cfg.name, cfg.sources, cfg.include_dirs)
        slang = [s.rel for s in sources.sources if s.path.suffix.lower() == ".slang"]
        if slang:
            raise ConfigError(
                f"crate {cfg.name!r}: option 'sources' ({', '.join(cfg.sources)}) matches Slang sources "
                f"({', '.join(slang)}), but a crate whose source globs do not end in .slang is CUDA C++; "
                "keep .slang and .cu files in separate crates and list a Slang crate's sources as globs of "
                ".slang files (sources = [\"kernels/slang/*.slang\"])"
            )
        decls = scan_crate([(f.rel, f.text) for f in sources.scanned], cfg.name, cfg.defines, cfg.options,
                           sources.system_includes)
        if not decls:
            raise SourceError(
                f"crate {cfg.name!r}: no KHAL_ENTRY found in {', '.join(s.rel for s in sources.sources)}; "
                "mark kernels with KHAL_ENTRY(name, block_size, (params...)) from khal.h"
            )
        headers = HeaderSet(cfg.cuda_headers)
        # the include path's order decides which of two same-named headers the compiler reads
        extra: dict[str, object] = {"include_dirs": list(cfg.include_dirs)}
        if sources.system_includes:
            # CUDA/CCCL headers are not hashed file by file: their package versions are.
            headers = resolve_headers(cfg.cuda_headers, nvrtc_cuda_major())
            extra["cuda_headers"] = [cfg.cuda_headers, [list(f) for f in headers.fingerprint]]
        content = crate_content_hash(sources.all_files, cfg.defines, cfg.options, extra)
        entries = [(d, entry_hash(content, d)) for d in decls]
        return Planned(cfg=cfg, language=self, content_hash=content, spirv=NOT_APPLICABLE,
                       files=tuple(sources.all_files), entries=tuple(PlannedEntry(d.name, h) for d, h in entries),
                       plan=CudaPlan(sources=sources, decls=tuple(entries), headers=headers, root=root))

    def prepare(self, planned: Planned[CudaPlan, CudaFront], cache: Cache, reporter: Reporter
                ) -> Prepared[CudaPlan, CudaFront]:
        """Which entries' indirect variants are wrong, before any binary that ships is compiled: from
        the PTX of the unit with every variant (the crate's PTX target, through the cache: when no
        variant is wrong it is the very PTX the build ships), or without PTX from the sources' text.
        The jobs then generate no kernel for those variants (issue #24: a variant judged wrong is in
        no binary)."""
        p, cfg = planned.plan, planned.cfg
        candidates = [(d, h) for d, h in p.decls if has_indirect(d)]
        if planned.prebuilt_var or not candidates:
            # a prebuilt binary is the user's: the manifest leaves the wrong variants out
            return planned.prepared(CudaFront())
        without: dict[str, str] = {}
        if cfg.ptx_arch is None:
            for d, h in candidates:
                sym, why = indirect_verdict(cfg.name, d, h, None)
                if sym is None and why is not None:
                    without[d.name] = why
            return planned.prepared(CudaFront(without))
        # the unit with every variant; the project root, as the compile stage gives it: a job's locations
        # (and so whether a cached PTX that spells its checkout's paths is this checkout's) depend on it
        every = planned.prepared(CudaFront())
        (job,) = self.jobs(every, p.root, [cfg.ptx_arch])
        outputs, compiled = compile_jobs([job], cache, reporter, explain=lambda j, e: self.explain(every, e))
        reads = ptx_grid_reads(outputs[(cfg.name, job.target)].data)
        for d, h in candidates:
            sym, why = indirect_verdict(cfg.name, d, h, reads)
            if sym is None and why is not None:
                without[d.name] = why
        # counted once: when no variant is wrong, the compile stage takes this very PTX from the cache
        # (and counts it there as cached)
        reused = not without and cache.lookup(job.key) is not None
        return planned.prepared(CudaFront(without), compiled=compiled,
                                cached=-compiled if reused else 1 - compiled)

    def jobs(self, prepared: Prepared[CudaPlan, CudaFront], root: Path, targets: list[str]) -> list[CompileJob]:
        plan, cfg = prepared.plan, prepared.cfg
        compiler = get_compiler(self.compiler)
        ident = compiler.identity()
        unit = generate_unit(cfg.name, [s.path for s in plan.sources.sources], plan.decls,
                             frozenset(prepared.front.without_indirect))
        include = [f"-I{khal_include_dir()}"] + [f"-I{d}" for d in plan.sources.include_dirs]
        include += [f"-I{d}" for d in plan.headers.include_dirs]
        defines = [f"-D{k}={v}" if v != "" else f"-D{k}" for k, v in sorted(cfg.defines.items())]
        options = (*_BASE_OPTIONS, *include, *defines, *cfg.options)
        covered = cover(plan.sources.all_files)
        covered_dirs = real_dirs([khal_include_dir(), *plan.headers.include_dirs])
        locations = path_forms([root, *plan.sources.include_dirs, *(s.path.parent for s in plan.sources.sources),
                                khal_include_dir(), *plan.headers.include_dirs])
        names_paths = any(_PATH_MACROS.search(f.data) for f in plan.sources.all_files)
        entries = tuple((e.name, e.hash) for e in prepared.entries)
        jobs = []
        for target in targets:
            key = sha256_bytes(
                canonical(
                    {
                        "content": prepared.content_hash,
                        "generated": unit.generated,
                        "order": [s.rel for s in plan.sources.sources],
                        "options": [*_BASE_OPTIONS, *defines, *cfg.options],
                        "headers": [cfg.cuda_headers, [list(f) for f in plan.headers.fingerprint]],
                        "arch": target,
                        "compiler": [ident.name, ident.version],
                        "nvrtc_output": NVRTC_OUTPUT,
                        "hatch_khal": __version__,
                        "khal_h": khal_header_sha256(),
                    }
                )
            )
            jobs.append(CompileJob(crate=cfg.name, target=target, compiler=compiler.name, text=unit.text,
                                   name=f"{cfg.name}.khal.cu", options=options, key=key,
                                   header_mode=cfg.cuda_headers, heavy=bool(plan.sources.system_includes),
                                   covered=covered, covered_dirs=covered_dirs, entries=entries,
                                   locations=locations, names_paths=names_paths))
        return jobs

    def explain(self, prepared: Prepared[CudaPlan, CudaFront], error: KhalBuildError) -> KhalBuildError:
        plan = prepared.plan
        text = str(error)
        entry_error = explain_entry_error(text, [d for d, _ in plan.decls], plan.sources.display, prepared.cfg.name)
        if entry_error is not None:
            return entry_error
        hints = header_hints(text, plan.headers.mode, plan.headers.nvrtc_major)
        return type(error)(f"{error}\n{hints}") if hints else error

    def finish(self, compiled: Compiled[CudaPlan, CudaFront], binary: BinaryInfo) -> CrateParts:
        cfg = compiled.cfg
        entries, warnings = manifest_entries(cfg.name, compiled.plan.decls, binary, compiled.front.without_indirect,
                                             trust_ptx=not _debug_build(cfg.options))
        ptx = binary.text if binary.kind == "ptx" and binary.text is not None else None
        found = ptx_module_globals(ptx) if ptx is not None else []
        module_globals = tuple(GlobalVar(name=n, space=sp, type=t, element_size=es, size=sz)  # type: ignore[arg-type]
                               for n, sp, t, es, sz in found)
        return CrateParts(entries=entries, warnings=tuple(warnings), globals=module_globals)


CUDA: Language[CudaPlan, CudaFront] = CudaLanguage()
