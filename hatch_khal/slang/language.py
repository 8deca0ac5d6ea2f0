"""Slang crates in the build: the :class:`~hatch_khal.languages.Language` for ``language = "slang"``.

* :meth:`SlangLanguage.plan`: the Slang stage's plan (files, content hash; no Slang run) and the
  crate's WebGPU status: built, or skipped by ``KHAL_SKIP_SPIRV`` / ``spirv = false``
  (:class:`SlangCratePlan`);
* :meth:`SlangLanguage.prepare`: the Slang stage's output (the khal-ABI CUDA unit, the manifest
  entries, the WGSL / SPIR-V files), from the content-addressed cache under
  :meth:`~hatch_khal.slang.records.SlangPlan.cache_key` or compiled once (a worker process);
  also for a prebuilt crate (``CUDA_OXIDE_SHADERS_PTX_<CRATE>`` replaces only the CUDA binaries)
  (:class:`SlangFront`);
* :meth:`SlangLanguage.jobs`: the unit compiled by NVRTC per target, as CUDA C++ crates are (with
  the CUDA header wheels on the include path when the unit includes one, e.g. ``cuda_fp16.h``);
* :meth:`SlangLanguage.finish`: reflection's parameter sizes checked against NVRTC's probes in the
  binary; the entries and the WebGPU artifacts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from khal_runtime.abi import env_flag
from khal_runtime.binaries import ptx_kernel_reads
from khal_runtime.manifest import Entry, LaunchFacts, SpirvStatus
from khal_runtime.verify import facts_from_reads

from hatch_khal.__about__ import __version__
from hatch_khal.compilers import get_compiler
from hatch_khal.config import HookConfig, ResolvedCrate
from hatch_khal.errors import KhalBuildError, SourceChangedError
from hatch_khal.hashing import canonical, sha256_bytes
from hatch_khal.headers import HeaderSet, header_hints, nvrtc_cuda_major, resolve_headers
from hatch_khal.languages import BuildRequirement, Compiled, Language, LanguageBase, Planned, Prepared
from hatch_khal.model import CompileJob, CrateParts, PlannedEntry, Reporter
from hatch_khal.nvrtc import OUTPUT_FORMAT as NVRTC_OUTPUT
from hatch_khal.nvrtc import nvrtc_requirements
from hatch_khal.reads import changed, cover, real_dirs
from hatch_khal.reads import locations as path_forms
from hatch_khal.slang.records import ALL_TARGETS, SlangOutput, SlangPlan, normalize_targets
from hatch_khal.slang.stage import compile_slang_crate, plan_slang_crate

if TYPE_CHECKING:
    from khal_runtime.binaries import BinaryInfo

    from hatch_khal.cache import Cache

__all__ = ["SLANG", "SlangCratePlan", "SlangFront", "SlangLanguage", "spirv_status"]

SKIP_ENV = "KHAL_SKIP_SPIRV"


def spirv_status(cfg: ResolvedCrate) -> SpirvStatus:
    """Whether a Slang crate builds WGSL / SPIR-V: yes, unless ``KHAL_SKIP_SPIRV`` is on (a boolean:
    :func:`khal_runtime.abi.env_flag`, so ``0`` / ``false`` / ``no`` / ``off`` skip nothing and an
    unknown value is an error) or the
    crate says ``spirv = false``."""
    if env_flag(os.environ.get(SKIP_ENV), SKIP_ENV):
        return SpirvStatus(status="skipped", reason=f"{SKIP_ENV} is set")
    if cfg.spirv is False:
        return SpirvStatus(status="skipped", reason="option 'spirv = false' of the crate")
    return SpirvStatus(status="built", reason="WGSL and SPIR-V of every entry")


@dataclass(frozen=True)
class SlangCratePlan:
    """What planning found of a Slang crate: the Slang stage's plan and what Slang compiles to."""

    slang: SlangPlan
    #: what Slang compiles to: {"cuda"} or {"cuda", "wgsl", "spirv"}
    targets: frozenset[str]


@dataclass(frozen=True)
class SlangFront:
    """What prepare made: the Slang stage's output, and the CUDA headers NVRTC gets (resolved only
    when the unit includes one of them)."""

    output: SlangOutput
    headers: HeaderSet


SlangPlanned = Planned[SlangCratePlan, SlangFront]
SlangPrepared = Prepared[SlangCratePlan, SlangFront]


def _mismatch(planned: SlangPlanned, out: SlangOutput) -> str | None:
    """Why a cached output is not this crate's (a damaged or foreign entry), or None."""
    if out.crate != planned.cfg.name:
        return f"it is the output of crate {out.crate!r}"
    if out.content_hash != planned.content_hash:
        return "its content hash differs"
    if out.targets != planned.plan.targets:
        return f"it was built for {', '.join(sorted(out.targets))}"
    paths = {t.path for e in out.entries for t in e.webgpu or ()}
    if paths != set(out.webgpu_files):
        return "its WGSL / SPIR-V files do not match its entries"
    return None


def _unchanged(planned: SlangPlanned) -> None:
    """Every file of the crate still has the bytes and stat it was hashed with (Slang read them
    after the hash): else nothing of the Slang stage is cached."""
    for f in cover(planned.files):
        why = changed(f)
        if why is not None:
            raise SourceChangedError(f"crate {planned.cfg.name!r}: {f.key} changed while Slang compiled the crate "
                                     f"({why}); nothing of this compile was cached: build again")


class SlangLanguage(LanguageBase):
    name = "slang"
    title = "Slang"
    suffixes: tuple[str, ...] = (".slang",)
    crate_options = frozenset({"spirv", "slang-options"})
    compiler = "nvrtc"

    def requirements(self, crates: Sequence[ResolvedCrate], hook: HookConfig) -> list[BuildRequirement]:
        # Slang runs for a prebuilt Slang crate too (its entries, its WGSL / SPIR-V)
        from hatch_khal.slang.library import SLANGPY_REQUIREMENT, SlangNotFound, find_slang  # lazy: the locator

        def probe() -> str | None:
            try:
                find_slang()
            except SlangNotFound as exc:
                return str(exc)
            return None

        return [*nvrtc_requirements(crates, hook),
                BuildRequirement(SLANGPY_REQUIREMENT, probe, label="the Slang compiler",
                                 example=(hook.nvrtc_requirement, SLANGPY_REQUIREMENT),
                                 note=f"Slang crates are tested with {SLANGPY_REQUIREMENT!r}")]

    def plan(self, root: Path, cfg: ResolvedCrate) -> SlangPlanned:
        sp = plan_slang_crate(root, cfg.name, list(cfg.sources), list(cfg.include_dirs), dict(cfg.defines),
                              list(cfg.options), list(cfg.slang_options))
        spirv = spirv_status(cfg)
        targets = ALL_TARGETS if spirv.status == "built" else normalize_targets(["cuda"])
        return Planned(cfg=cfg, language=self, content_hash=sp.content_hash, spirv=spirv,
                       files=tuple(sp.files.all_files), tools={"slang": sp.slang.version},
                       plan=SlangCratePlan(slang=sp, targets=targets))

    def _cached(self, planned: SlangPlanned, key: str, cache: Cache) -> SlangOutput | None:
        hit = cache.lookup(key)
        if hit is None:
            return None
        try:
            out = SlangOutput.from_bytes(hit.data)
        except KhalBuildError:
            why: str | None = "unreadable"
        else:
            why = _mismatch(planned, out)
        if why is not None:
            cache.drop(key, f"not the Slang output of crate {planned.cfg.name!r} ({why}); rebuilding it")
            return None
        return out

    def prepare(self, planned: SlangPlanned, cache: Cache, reporter: Reporter) -> SlangPrepared:
        p = planned.plan
        name = planned.cfg.name
        key = p.slang.cache_key(p.targets)
        out = self._cached(planned, key, cache)
        compiled = 0
        if out is None:
            with cache.locked([key]):
                out = self._cached(planned, key, cache)  # another build may have stored it meanwhile
                if out is None:
                    reporter.info(f"khal: compiling Slang crate {name!r} to {', '.join(sorted(p.targets))}")
                    out = compile_slang_crate(p.slang, p.targets)
                    _unchanged(planned)
                    cache.store(key, out.to_bytes(), "")
                    compiled = 1
                    for warning in out.warnings:
                        reporter.warn(warning)
                    reporter.info(f"khal: compiled Slang crate {name!r} to {', '.join(sorted(p.targets))} "
                                  f"in {out.timings.get('worker', 0.0):.2f}s")
        if not compiled:
            reporter.debug(f"khal: {name} Slang stage: cached")
        headers = (resolve_headers(planned.cfg.cuda_headers, nvrtc_cuda_major()) if out.system_includes
                   else HeaderSet(planned.cfg.cuda_headers))
        return planned.prepared(SlangFront(output=out, headers=headers),
                                entries=[PlannedEntry(e.name, e.hash) for e in out.entries],
                                tools={"slang": out.slang_version}, compiled=compiled, cached=1 - compiled)

    def jobs(self, prepared: SlangPrepared, root: Path, targets: list[str]) -> list[CompileJob]:
        out, headers = prepared.front.output, prepared.front.headers
        compiler = get_compiler(self.compiler)
        ident = compiler.identity()
        include = tuple(f"-I{d}" for d in headers.include_dirs)
        # the unit is self-contained text (Slang's prelude inlined): NVRTC reads only the CUDA headers;
        # its #line names are the crate's .slang files (NVRTC lists them too), which the key covers
        # through the Slang stage's output
        covered = cover(prepared.files)
        covered_dirs = real_dirs(headers.include_dirs)
        locations = path_forms([root, *headers.include_dirs])
        entries = tuple((e.name, e.hash) for e in prepared.entries)
        jobs = []
        for target in targets:
            key = sha256_bytes(canonical({
                "what": "slang-unit",
                "unit": sha256_bytes(out.cuda_unit.encode()),
                "name": out.unit_name,
                "options": list(out.nvrtc_options),
                "headers": [headers.mode, [list(f) for f in headers.fingerprint]],
                "arch": target,
                "compiler": [ident.name, ident.version],
                "nvrtc_output": NVRTC_OUTPUT,
                "hatch_khal": __version__,
            }))
            jobs.append(CompileJob(crate=prepared.cfg.name, target=target, compiler=compiler.name,
                                   text=out.cuda_unit, name=out.unit_name, options=(*out.nvrtc_options, *include),
                                   key=key, header_mode=prepared.cfg.cuda_headers, covered=covered,
                                   covered_dirs=covered_dirs, entries=entries, locations=locations))
        return jobs

    def explain(self, prepared: SlangPrepared, error: KhalBuildError) -> KhalBuildError:
        headers = prepared.front.headers
        hints = header_hints(str(error), headers.mode, headers.nvrtc_major)
        return type(error)(f"{error}\n{hints}") if hints else error

    def finish(self, compiled: Compiled[SlangCratePlan, SlangFront], binary: BinaryInfo) -> CrateParts:
        out = compiled.front.output
        out.check_probes(binary.globals_u64)
        return CrateParts(entries=with_launch_facts(out.entries, binary), artifacts=out.webgpu_artifacts(),
                          files=dict(out.webgpu_files))


def with_launch_facts(entries: tuple[Entry, ...], binary: BinaryInfo) -> tuple[Entry, ...]:
    """Slang entries with their launch facts: numthreads (reflection: the block stays fixed, and the
    typed call's shape) and the grid axes its CUDA kernel reads, from ``binary`` when it is PTX."""
    kernels = ptx_kernel_reads(binary.text) if binary.kind == "ptx" and binary.text is not None else None
    out = []
    for e in entries:
        if kernels is not None and e.symbol in kernels:
            facts = facts_from_reads(kernels[e.symbol], e.fixed_block, tagged=False)
        else:
            facts = LaunchFacts(source="reflection", grid_axes=e.grid_dims, block_fixed=e.fixed_block)
        out.append(e.model_copy(update={"launch": facts}))
    return tuple(out)


SLANG: Language[SlangCratePlan, SlangFront] = SlangLanguage()
