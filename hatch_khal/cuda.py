"""CUDA C++ crates: ``KHAL_ENTRY`` markers in ``.cu`` sources, compiled by NVRTC.

The :class:`~hatch_khal.languages.Language` for ``language = "cuda"``: plan (sources,
entries, content hash), jobs (one generated translation unit, compiled per target),
compile errors explained (missing CUDA headers, entries the scanner could not read), and
the manifest entries with the compiler's own parameter sizes (the binary's size probes).
CUDA C++ builds CUDA only: its SPIR-V status is ``not_applicable``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from khal_runtime import abi
from khal_runtime.abi import indirect_symbol_for, symbol_for
from khal_runtime.manifest import Entry, Param, SpirvStatus

from hatch_khal.__about__ import __version__
from hatch_khal.codegen import NOT_COMPILED_RE, UNSCANNED_RE, generate_unit, probe_names
from hatch_khal.compilers import get_compiler
from hatch_khal.config import ResolvedCrate
from hatch_khal.entries import EntryDecl, find_entries
from hatch_khal.errors import ConfigError, EntryParseError, KhalBuildError, SourceError
from hatch_khal.hashing import canonical, crate_content_hash, entry_hash, khal_header_sha256, sha256_bytes
from hatch_khal.headers import HeaderSet, header_hints, nvrtc_cuda_major, resolve_headers
from hatch_khal.model import CompileJob, CrateParts, CratePlan, PlannedEntry, Reporter
from hatch_khal.sources import CrateSources, collect_sources

if TYPE_CHECKING:
    from khal_runtime.binaries import BinaryInfo

    from hatch_khal.cache import Cache

__all__ = ["CUDA", "CudaLanguage", "CudaPlan", "khal_include_dir"]

#: A CUDA C++ crate's WebGPU stage: there is none (write the crate in Slang for WebGPU).
NOT_APPLICABLE = SpirvStatus(status="not_applicable", reason="CUDA C++ source")

_BASE_OPTIONS = ("-std=c++17",)


def khal_include_dir() -> Path:
    """The directory holding khal.h, put on every crate's include path."""
    return Path(str(resources.files("hatch_khal") / "include"))


@dataclass(kw_only=True)
class CudaPlan(CratePlan):
    """A CUDA C++ crate's plan: its sources, the scanned entries and the CUDA headers."""

    sources: CrateSources
    #: the scanned entries, sorted by name, each with its entry hash
    decls: list[tuple[EntryDecl, str]]
    headers: HeaderSet


def _cuda_plan(plan: CratePlan) -> CudaPlan:
    assert isinstance(plan, CudaPlan), f"crate {plan.cfg.name!r} was not planned as CUDA C++"
    return plan


def _check_names(crate: str, decls: list[EntryDecl]) -> None:
    """Entry names are unique, and no generated symbol of one is another's."""
    by_name: dict[str, EntryDecl] = {}
    for d in decls:
        if d.name in by_name:
            first = by_name[d.name]
            raise SourceError(
                f"{d.file}:{d.line}: crate {crate!r}: entry {d.name!r} is defined twice "
                f"(first at {first.file}:{first.line})"
            )
        by_name[d.name] = d
    for d in decls:
        # <e>_indirect_khal_<hash> (e's indirect kernel) is also the direct symbol of an entry <e>_indirect
        other = by_name.get(f"{d.name}_indirect")
        if other is not None:
            raise SourceError(
                f"{other.file}:{other.line}: crate {crate!r}: entry {other.name!r} clashes with entry "
                f"{d.name!r} ({d.file}:{d.line}), whose indirect-dispatch kernel is called {d.name}_indirect; "
                f"rename {other.name!r}"
            )


def _params(crate: str, decl: EntryDecl, probes: dict[str, int]) -> tuple[Param, ...]:
    out = []
    for i, p in enumerate(decl.params):
        size_name, align_name = probe_names(decl.name, i)
        if size_name not in probes:
            raise KhalBuildError(
                f"crate {crate!r}: entry {decl.name!r}: the binary lacks the size probe {size_name}; "
                "was it built by hatch-khal from these sources?"
            )
        size, align = probes[size_name], probes.get(align_name, 1)
        scalar = abi.c_scalar(p.ctype)
        if scalar is not None and scalar.size != size:
            raise KhalBuildError(
                f"crate {crate!r}: entry {decl.name!r} parameter {p.name!r}: {p.ctype} is {size} bytes "
                f"on the device, expected {scalar.size}"
            )
        out.append(
            Param(
                name=p.name,
                kind=p.kind,
                element_type=p.element_type,
                element_size=size,
                element_align=align,
                shape=p.shape,  # type: ignore[arg-type]  # the scanner's shapes are the manifest's
                length=p.length,
                writable=p.writable,
            )
        )
    return tuple(out)


class CudaLanguage:
    name = "cuda"
    compiler = "nvrtc"

    def plan(self, root: Path, cfg: ResolvedCrate) -> CudaPlan:
        sources = collect_sources(root, cfg.name, cfg.sources, cfg.include_dirs)
        slang = [s.rel for s in sources.sources if s.path.suffix.lower() == ".slang"]
        if slang:
            raise ConfigError(
                f"crate {cfg.name!r}: option 'sources' ({', '.join(cfg.sources)}) matches Slang sources "
                f"({', '.join(slang)}), but a crate whose source globs do not end in .slang is CUDA C++; "
                "keep .slang and .cu files in separate crates and list a Slang crate's sources as globs of "
                ".slang files (sources = [\"kernels/slang/*.slang\"])"
            )
        decls: list[EntryDecl] = []
        for f in sources.scanned:
            decls.extend(find_entries(f.text, f.rel))
        if not decls:
            raise SourceError(
                f"crate {cfg.name!r}: no KHAL_ENTRY found in {', '.join(s.rel for s in sources.sources)}; "
                "mark kernels with KHAL_ENTRY(name, block_size, (params...)) from khal.h"
            )
        _check_names(cfg.name, decls)
        headers = HeaderSet(cfg.cuda_headers)
        extra: dict[str, object] = {}
        if sources.system_includes:
            # CUDA/CCCL headers are not hashed file by file: their package versions are.
            headers = resolve_headers(cfg.cuda_headers, nvrtc_cuda_major())
            extra = {"cuda_headers": [cfg.cuda_headers, [list(f) for f in headers.fingerprint]]}
        content = crate_content_hash(sources.all_files, cfg.defines, cfg.options, extra)
        entries = [(d, entry_hash(content, d)) for d in sorted(decls, key=lambda e: e.name)]
        return CudaPlan(cfg=cfg, language=self.name, content_hash=content, spirv=NOT_APPLICABLE,
                        files=sources.all_files, entries=[PlannedEntry(d.name, h) for d, h in entries],
                        sources=sources, decls=entries, headers=headers)

    def prepare(self, plan: CratePlan, cache: Cache, reporter: Reporter) -> tuple[int, int]:
        return 0, 0  # everything is known from the sources

    def jobs(self, plan: CratePlan, root: Path, targets: list[str]) -> list[CompileJob]:
        plan = _cuda_plan(plan)
        cfg = plan.cfg
        compiler = get_compiler(self.compiler)
        ident = compiler.identity()
        unit = generate_unit(cfg.name, [s.path for s in plan.sources.sources], plan.decls)
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
        plan = _cuda_plan(plan)
        text = str(error)
        m = UNSCANNED_RE.search(text)
        if m is not None:
            where = f"{plan.sources.display(m.group('file'))}:{m.group('line')}"
            return EntryParseError(
                f"{where}: crate {plan.cfg.name!r}: entry {m.group('name')!r}: this KHAL_ENTRY was not read by "
                "hatch-khal: the marker is made by a macro (or sits in a file that is not a source and is not "
                "#included literally); write 'KHAL_ENTRY(' literally in the source, not through a macro"
            )
        m = NOT_COMPILED_RE.search(text)
        if m is not None:
            decl = next((d for d, _ in plan.decls if d.name == m.group("name")), None)
            if decl is not None:
                return EntryParseError(
                    f"{decl.file}:{decl.line}: crate {plan.cfg.name!r}: entry {decl.name!r} was found by "
                    "hatch-khal but not compiled (is it inside an #if / #ifdef that is off?); hatch-khal reads "
                    "markers without the preprocessor: remove the marker, or keep it outside the #if"
                )
        hints = header_hints(text, plan.headers.mode)
        return type(error)(f"{error}\n{hints}") if hints else error

    def finish(self, plan: CratePlan, binary: BinaryInfo) -> CrateParts:
        plan = _cuda_plan(plan)
        probes = dict(binary.globals_u64)
        return CrateParts(entries=tuple(
            Entry(
                name=decl.name,
                symbol=symbol_for(decl.name, h),
                hash=h,
                block_size=(decl.block_size, 1, 1),
                params=_params(plan.cfg.name, decl, probes),
                indirect_symbol=indirect_symbol_for(decl.name, h),
            )
            for decl, h in plan.decls
        ))


CUDA = CudaLanguage()
