"""Building crates: the orchestration shared by the hatchling hook and the setuptools command.

``build_packages`` runs the stages in order: plan (:mod:`hatch_khal.plan`), compile
(:mod:`hatch_khal.compiling`: each language's front stage, such as Slang, then the compile
jobs), assemble (:mod:`hatch_khal.assemble`); it returns, per target package, a manifest and
the artifact bytes. Writing them (:mod:`hatch_khal.output`)
is the front-end's call: the hatch plugin stages them for the wheel, editable builds write
them in place.
"""

from __future__ import annotations

import time
from pathlib import Path

from khal_runtime.manifest import Toolchain

from hatch_khal.__about__ import __version__
from hatch_khal.assemble import assemble_packages
from hatch_khal.cache import Cache, default_cache_dir
from hatch_khal.compilers import get_compiler
from hatch_khal.compiling import compile_jobs, prepare_crates
from hatch_khal.config import ResolvedCrate
from hatch_khal.cuda import khal_include_dir
from hatch_khal.errors import KhalBuildError
from hatch_khal.languages import get_language
from hatch_khal.model import BuildResult, CompileJob, PackageOutput, PrintReporter, Reporter
from hatch_khal.output import write_package_output
from hatch_khal.plan import plan_crates, targets

__all__ = [
    "BuildResult",
    "PackageOutput",
    "PrintReporter",
    "Reporter",
    "build_packages",
    "khal_include_dir",
    "write_package_output",
]

def build_packages(
    root: Path,
    crates: list[ResolvedCrate],
    reporter: Reporter,
    *,
    editable: bool = False,
    cache: Cache | None = None,
    jobs: int | None = None,
) -> BuildResult:
    """Compile (or take prebuilt) every crate; group the results by target package."""
    start = time.perf_counter()
    root = root.resolve()
    plans = plan_crates(root, crates, reporter)
    cache = cache if cache is not None else Cache(default_cache_dir(), reporter.warn)
    front_compiled, front_cached = prepare_crates(plans, cache, reporter, jobs=jobs)
    to_compile = [p for p in plans if p.prebuilt_var is None]
    for plan in to_compile:
        plan.jobs = get_language(plan.language, plan.cfg.name).jobs(plan, root, targets(plan, reporter))
    by_crate = {p.cfg.name: p for p in plans}

    def explain(job: CompileJob, error: KhalBuildError) -> KhalBuildError:
        plan = by_crate[job.crate]
        return get_language(plan.language, job.crate).explain(plan, error)

    all_jobs = [j for p in to_compile for j in p.jobs]
    outputs, compiled = compile_jobs(all_jobs, cache, reporter, jobs=jobs, explain=explain)
    versions = {name: get_compiler(name).identity().version for name in {j.compiler for j in all_jobs}}
    for plan in plans:
        versions.update(plan.tools)
    toolchain = Toolchain(hatch_khal_version=__version__, nvrtc_version=versions.get("nvrtc"),
                          slang_version=versions.get("slang"), triton_version=versions.get("triton"))
    packages = assemble_packages(plans, outputs, root, toolchain, editable=editable)
    for plan in plans:
        for warning in plan.warnings:
            reporter.warn(warning)
    return BuildResult(
        packages=packages,
        compiled=compiled + front_compiled,
        cached=len(all_jobs) - compiled + front_cached,
        seconds=time.perf_counter() - start,
    )
