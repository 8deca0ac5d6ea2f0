"""Building crates: the orchestration shared by the hatchling hook and the setuptools command.

``build_packages`` runs the stages in order, each handing the next a new frozen record per crate
(:mod:`hatch_khal.languages`): plan (:mod:`hatch_khal.plan`: ``Planned``), compile
(:mod:`hatch_khal.compile_stage`: each language's front stage, such as Slang, gives ``Prepared``; then
the compile jobs, ``Compiled``), assemble (:mod:`hatch_khal.assemble`); it returns, per target
package, a manifest and the artifact bytes. Writing them (:mod:`hatch_khal.output`)
is the front-end's call: the hatch plugin stages them for the wheel, editable builds write
them in place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from khal_runtime.manifest import Toolchain

from hatch_khal.__about__ import __version__
from hatch_khal.assemble import assemble_packages
from hatch_khal.cache import Cache, default_cache_dir
from hatch_khal.compilers import get_compiler
from hatch_khal.compile_stage import compile_jobs, prepare_crates
from hatch_khal.config import ResolvedCrate
from hatch_khal.cuda import khal_include_dir
from hatch_khal.errors import KhalBuildError
from hatch_khal.languages import Prepared
from hatch_khal.model import BuildResult, CompileJob, PackageOutput, PrintReporter, Reporter
from hatch_khal.output import write_package_output
from hatch_khal.plan import plan_crates, targets
from hatch_khal.remote import remote_cache
from hatch_khal.shards import check_merge, merge_record, refuse_shard_variable

__all__ = [
    "BuildResult",
    "JobPlan",
    "PackageOutput",
    "PrintReporter",
    "Reporter",
    "build_packages",
    "khal_include_dir",
    "plan_jobs",
    "write_package_output",
]

@dataclass(frozen=True)
class JobPlan:
    """Every crate prepared (front stages run) and the compile jobs of each: what a whole build and a
    shard of one (:mod:`hatch_khal.shards`) both start from."""

    prepared: list[Prepared[Any, Any]]
    jobs_of: dict[str, list[CompileJob]]

    @property
    def all_jobs(self) -> list[CompileJob]:
        return [j for crate_jobs in self.jobs_of.values() for j in crate_jobs]

    def explain(self, job: CompileJob, error: KhalBuildError) -> KhalBuildError:
        return next(p for p in self.prepared if p.cfg.name == job.crate).explain(error)

    def versions(self) -> dict[str, str]:
        """The compilers' and tools' versions (what the manifest's toolchain records)."""
        versions = {name: get_compiler(name).identity().version for name in {j.compiler for j in self.all_jobs}}
        for crate in self.prepared:
            versions.update(crate.tools)
        return versions


def plan_jobs(root: Path, crates: list[ResolvedCrate], reporter: Reporter, cache: Cache, *,
              jobs: int | None = None) -> JobPlan:
    """Plan every crate, run the languages' front stages (through ``cache``), make the compile jobs."""
    planned = plan_crates(root, crates, reporter)
    prepared = prepare_crates(planned, cache, reporter, jobs=jobs)
    jobs_of = {p.cfg.name: p.jobs(root, targets(p, reporter)) for p in prepared if p.prebuilt_var is None}
    return JobPlan(prepared, jobs_of)


def build_packages(
    root: Path,
    crates: list[ResolvedCrate],
    reporter: Reporter,
    *,
    editable: bool = False,
    cache: Cache | None = None,
    jobs: int | None = None,
    cache_url: str | None = None,
) -> BuildResult:
    """Compile (or take prebuilt) every crate; group the results by target package.

    ``cache``: the compile cache (default: the local one, ``KHAL_CACHE_DIR``, over the remote
    store that ``KHAL_CACHE_URL`` or ``cache_url``, the hook option ``cache-url``, names). While
    ``python -m hatch_khal merge`` builds (``KHAL_MERGE``), every output must come from the
    shards it merges (:func:`hatch_khal.shards.check_merge`): nothing is compiled."""
    start = time.perf_counter()
    root = root.resolve()
    refuse_shard_variable()
    merging = merge_record()
    if cache is None:
        remote = None if merging else remote_cache(cache_url, reporter.warn)
        cache = Cache(default_cache_dir(), reporter.warn, remote=remote)
    plan = plan_jobs(root, crates, reporter, cache, jobs=jobs)
    all_jobs = plan.all_jobs
    if merging is not None:
        check_merge(merging, plan, cache)
    outputs, compiled = compile_jobs(all_jobs, cache, reporter, jobs=jobs, explain=plan.explain)
    if merging is not None and compiled:
        reporter.warn(f"khal: merge: {compiled} output(s) of the shards could not be used here and were compiled "
                      "again (outputs that spell their build's location, __FILE__: build the shards and the merge "
                      "in the same folder)")
    built = [p.compiled({j.target: outputs[(p.cfg.name, j.target)] for j in plan.jobs_of.get(p.cfg.name, [])})
             for p in plan.prepared]
    versions = plan.versions()
    toolchain = Toolchain(hatch_khal_version=__version__, nvrtc_version=versions.get("nvrtc"),
                          slang_version=versions.get("slang"), triton_version=versions.get("triton"))
    packages, warnings = assemble_packages(built, root, toolchain, editable=editable)
    for warning in warnings:
        reporter.warn(warning)
    if cache.remote is not None:
        reporter.info(cache.remote.summary())
    return BuildResult(
        packages=packages,
        compiled=compiled + sum(p.compiled_units for p in plan.prepared),
        cached=len(all_jobs) - compiled + sum(p.cached_units for p in plan.prepared),
        seconds=time.perf_counter() - start,
    )
