"""Slang crates in the build: the :class:`~hatch_khal.languages.Language` for ``language = "slang"``.

* :meth:`SlangLanguage.plan`: the Slang stage's plan (files, content hash; no Slang run) and the
  crate's WebGPU status: built, or skipped by ``KHAL_SKIP_SPIRV`` / ``spirv = false``;
* :meth:`SlangLanguage.prepare`: the Slang stage's output (the khal-ABI CUDA unit, the manifest
  entries, the WGSL / SPIR-V files), from the content-addressed cache under
  :meth:`~hatch_khal.slang.output.SlangPlan.cache_key` or compiled once (a worker process);
  also for a prebuilt crate (``CUDA_OXIDE_SHADERS_PTX_<CRATE>`` replaces only the CUDA binaries);
* :meth:`SlangLanguage.jobs`: the unit compiled by NVRTC per target, as CUDA C++ crates are (with
  the CUDA header wheels on the include path when the unit includes one, e.g. ``cuda_fp16.h``);
* :meth:`SlangLanguage.finish`: reflection's parameter sizes checked against NVRTC's probes in the
  binary; the entries and the WebGPU artifacts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from khal_runtime.abi import env_flag
from khal_runtime.binaries import ptx_kernel_reads
from khal_runtime.manifest import Entry, LaunchFacts, SpirvStatus
from khal_runtime.verify import facts_from_reads

from hatch_khal.__about__ import __version__
from hatch_khal.compilers import get_compiler
from hatch_khal.config import ResolvedCrate
from hatch_khal.errors import KhalBuildError, SourceChangedError
from hatch_khal.hashing import canonical, sha256_bytes
from hatch_khal.headers import HeaderSet, header_hints, nvrtc_cuda_major, resolve_headers
from hatch_khal.model import CompileJob, CrateParts, CratePlan, PlannedEntry, Reporter
from hatch_khal.reads import changed, cover, real_dirs
from hatch_khal.reads import locations as path_forms
from hatch_khal.slang.output import ALL_TARGETS, SlangOutput, SlangPlan, normalize_targets
from hatch_khal.slang.stage import compile_slang_crate, plan_slang_crate

if TYPE_CHECKING:
    from khal_runtime.binaries import BinaryInfo

    from hatch_khal.cache import Cache

__all__ = ["SLANG", "SlangCratePlan", "SlangLanguage", "spirv_status"]

SKIP_ENV = "KHAL_SKIP_SPIRV"


def spirv_status(cfg: ResolvedCrate) -> SpirvStatus:
    """Whether a Slang crate builds WGSL / SPIR-V: yes, unless ``KHAL_SKIP_SPIRV`` is on (a boolean:
    :func:`khal_runtime.abi.env_flag`, so ``0`` / ``false`` / ``no`` / ``off`` skip nothing) or the
    crate says ``spirv = false``."""
    if env_flag(os.environ.get(SKIP_ENV)):
        return SpirvStatus(status="skipped", reason=f"{SKIP_ENV} is set")
    if cfg.spirv is False:
        return SpirvStatus(status="skipped", reason="option 'spirv = false' of the crate")
    return SpirvStatus(status="built", reason="WGSL and SPIR-V of every entry")


@dataclass(kw_only=True)
class SlangCratePlan(CratePlan):
    """A Slang crate's plan: the stage's plan, the Slang targets, and (after prepare) its output."""

    slang: SlangPlan
    #: what Slang compiles to: {"cuda"} or {"cuda", "wgsl", "spirv"}
    targets: frozenset[str]
    output: SlangOutput | None = None
    #: the CUDA headers NVRTC gets (only when the unit includes one of them)
    headers: HeaderSet


def _slang_plan(plan: CratePlan) -> SlangCratePlan:
    assert isinstance(plan, SlangCratePlan), f"crate {plan.cfg.name!r} was not planned as Slang"
    return plan


def _output(plan: CratePlan) -> tuple[SlangCratePlan, SlangOutput]:
    p = _slang_plan(plan)
    assert p.output is not None, f"crate {p.cfg.name!r}: the Slang stage has not run (Language.prepare)"
    return p, p.output


def _mismatch(plan: SlangCratePlan, out: SlangOutput) -> str | None:
    """Why a cached output is not this plan's (a damaged or foreign entry), or None."""
    if out.crate != plan.cfg.name:
        return f"it is the output of crate {out.crate!r}"
    if out.content_hash != plan.content_hash:
        return "its content hash differs"
    if out.targets != plan.targets:
        return f"it was built for {', '.join(sorted(out.targets))}"
    paths = {t.path for e in out.entries for t in e.webgpu or ()}
    if paths != set(out.webgpu_files):
        return "its WGSL / SPIR-V files do not match its entries"
    return None


def _unchanged(plan: SlangCratePlan) -> None:
    """Every file of the crate still has the bytes and stat it was hashed with (Slang read them
    after the hash): else nothing of the Slang stage is cached."""
    for f in cover(plan.files):
        why = changed(f)
        if why is not None:
            raise SourceChangedError(f"crate {plan.cfg.name!r}: {f.key} changed while Slang compiled the crate "
                                     f"({why}); nothing of this compile was cached: build again")


class SlangLanguage:
    name = "slang"
    compiler = "nvrtc"

    def plan(self, root: Path, cfg: ResolvedCrate) -> SlangCratePlan:
        sp = plan_slang_crate(root, cfg.name, list(cfg.sources), list(cfg.include_dirs), dict(cfg.defines),
                              list(cfg.options), list(cfg.slang_options))
        spirv = spirv_status(cfg)
        targets = ALL_TARGETS if spirv.status == "built" else normalize_targets(["cuda"])
        return SlangCratePlan(cfg=cfg, language=self.name, content_hash=sp.content_hash, spirv=spirv,
                              files=sp.files.all_files, tools={"slang": sp.slang.version}, slang=sp,
                              targets=targets, headers=HeaderSet(cfg.cuda_headers))

    def _cached(self, plan: SlangCratePlan, key: str, cache: Cache) -> SlangOutput | None:
        hit = cache.lookup(key)
        if hit is None:
            return None
        try:
            out = SlangOutput.from_bytes(hit.data)
        except KhalBuildError:
            why: str | None = "unreadable"
        else:
            why = _mismatch(plan, out)
        if why is not None:
            cache.drop(key, f"not the Slang output of crate {plan.cfg.name!r} ({why}); rebuilding it")
            return None
        return out

    def prepare(self, plan: CratePlan, cache: Cache, reporter: Reporter) -> tuple[int, int]:
        p = _slang_plan(plan)
        name = p.cfg.name
        key = p.slang.cache_key(p.targets)
        out = self._cached(p, key, cache)
        compiled = 0
        if out is None:
            with cache.locked([key]):
                out = self._cached(p, key, cache)  # another build may have stored it meanwhile
                if out is None:
                    reporter.info(f"khal: compiling Slang crate {name!r} to {', '.join(sorted(p.targets))}")
                    out = compile_slang_crate(p.slang, p.targets)
                    _unchanged(p)
                    cache.store(key, out.to_bytes(), "")
                    compiled = 1
                    for warning in out.warnings:
                        reporter.warn(warning)
                    reporter.info(f"khal: compiled Slang crate {name!r} to {', '.join(sorted(p.targets))} "
                                  f"in {out.timings.get('worker', 0.0):.2f}s")
        if not compiled:
            reporter.debug(f"khal: {name} Slang stage: cached")
        p.output = out
        p.entries = [PlannedEntry(e.name, e.hash) for e in out.entries]
        p.tools["slang"] = out.slang_version
        if out.system_includes:
            p.headers = resolve_headers(p.cfg.cuda_headers, nvrtc_cuda_major())
        return compiled, 1 - compiled

    def jobs(self, plan: CratePlan, root: Path, targets: list[str]) -> list[CompileJob]:
        p, out = _output(plan)
        compiler = get_compiler(self.compiler)
        ident = compiler.identity()
        include = tuple(f"-I{d}" for d in p.headers.include_dirs)
        # the unit is self-contained text (Slang's prelude inlined): NVRTC reads only the CUDA headers;
        # its #line names are the crate's .slang files (NVRTC lists them too), which the key covers
        # through the Slang stage's output
        covered = cover(p.files)
        covered_dirs = real_dirs(p.headers.include_dirs)
        locations = path_forms([root, *p.headers.include_dirs])
        entries = tuple((e.name, e.hash) for e in p.entries)
        jobs = []
        for target in targets:
            key = sha256_bytes(canonical({
                "what": "slang-unit",
                "unit": sha256_bytes(out.cuda_unit.encode()),
                "name": out.unit_name,
                "options": list(out.nvrtc_options),
                "headers": [p.headers.mode, [list(f) for f in p.headers.fingerprint]],
                "arch": target,
                "compiler": [ident.name, ident.version],
                "hatch_khal": __version__,
            }))
            jobs.append(CompileJob(crate=p.cfg.name, target=target, compiler=compiler.name, text=out.cuda_unit,
                                   name=out.unit_name, options=(*out.nvrtc_options, *include), key=key,
                                   header_mode=p.cfg.cuda_headers, covered=covered, covered_dirs=covered_dirs,
                                   entries=entries,
                                   locations=locations))
        return jobs

    def explain(self, plan: CratePlan, error: KhalBuildError) -> KhalBuildError:
        p = _slang_plan(plan)
        hints = header_hints(str(error), p.headers.mode, p.headers.nvrtc_major)
        return type(error)(f"{error}\n{hints}") if hints else error

    def finish(self, plan: CratePlan, binary: BinaryInfo) -> CrateParts:
        p, out = _output(plan)
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


SLANG = SlangLanguage()
