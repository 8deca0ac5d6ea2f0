"""Building crates: the orchestration shared by the hatchling hook and the setuptools command.

``build_packages`` runs the stages in order, each handing the next a new frozen record per crate
(:mod:`hatch_khal.languages`): plan (:mod:`hatch_khal.plan`: ``Planned``), compile
(:mod:`hatch_khal.compiling`: each language's front stage, such as Slang, gives ``Prepared``; then
the compile jobs, ``Compiled``), assemble (:mod:`hatch_khal.assemble`); it returns, per target
package, a manifest and the artifact bytes. Writing them (:mod:`hatch_khal.output`)
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
from hatch_khal.model import BuildResult, CompileJob, PackageOutput, PrintReporter, Reporter
from hatch_khal.output import write_package_output
from hatch_khal.plan import plan_crates, targets
from hatch_khal.remote import remote_cache

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
    cache_url: str | None = None,
) -> BuildResult:
    """Compile (or take prebuilt) every crate; group the results by target package.

    ``cache``: the compile cache (default: the local one, ``KHAL_CACHE_DIR``, over the remote
    store that ``KHAL_CACHE_URL`` or ``cache_url``, the hook option ``cache-url``, names)."""
    start = time.perf_counter()
    root = root.resolve()
    if cache is None:
        cache = Cache(default_cache_dir(), reporter.warn, remote=remote_cache(cache_url, reporter.warn))
    planned = plan_crates(root, crates, reporter)
    prepared = prepare_crates(planned, cache, reporter, jobs=jobs)
    jobs_of = {p.cfg.name: p.jobs(root, targets(p, reporter)) for p in prepared if p.prebuilt_var is None}
    by_crate = {p.cfg.name: p for p in prepared}

    def explain(job: CompileJob, error: KhalBuildError) -> KhalBuildError:
        return by_crate[job.crate].explain(error)

    all_jobs = [j for crate_jobs in jobs_of.values() for j in crate_jobs]
    outputs, compiled = compile_jobs(all_jobs, cache, reporter, jobs=jobs, explain=explain)
    built = [p.compiled({j.target: outputs[(p.cfg.name, j.target)] for j in jobs_of.get(p.cfg.name, [])})
             for p in prepared]
    versions = {name: get_compiler(name).identity().version for name in {j.compiler for j in all_jobs}}
    for crate in built:
        versions.update(crate.tools)
    toolchain = Toolchain(hatch_khal_version=__version__, nvrtc_version=versions.get("nvrtc"),
                          slang_version=versions.get("slang"), triton_version=versions.get("triton"))
    packages, warnings = assemble_packages(built, root, toolchain, editable=editable)
    for warning in warnings:
        reporter.warn(warning)
    if cache.remote is not None:
        reporter.info(cache.remote.summary())
    return BuildResult(
        packages=packages,
        compiled=compiled + sum(p.compiled_units for p in prepared),
        cached=len(all_jobs) - compiled + sum(p.cached_units for p in prepared),
        seconds=time.perf_counter() - start,
    )
