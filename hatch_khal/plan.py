"""Stage 1: plan every crate (sources, entries, hashes) before anything is compiled.

Each crate is planned by its language (:mod:`hatch_khal.languages`: the one place a configured
language name becomes its ``Language``), giving one frozen :class:`~hatch_khal.languages.Planned`
record per crate; then the prebuilt-binary variables (``CUDA_OXIDE_SHADERS_PTX_<CRATE>``; one that names no crate is an error) and
the targets each crate compiles for. Entry names are unique per crate (each language checks its
own); two crates of a package may share one (the runtime's ``kernels.<name>`` is then
ambiguous, ``kernels.<crate>.<name>`` is not), so one source can be built as several crates
under different ``defines``.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from khal_runtime.abi import PREBUILT_ENV_PREFIX, parse_arch

from hatch_khal.compilers import get_compiler
from hatch_khal.config import ResolvedCrate, env_var_for_crate
from hatch_khal.errors import ConfigError
from hatch_khal.languages import CrateRecord, Planned, get_language
from hatch_khal.model import Reporter

__all__ = ["PREBUILT_PREFIX", "check_prebuilt_variables", "plan_crates", "targets"]

PREBUILT_PREFIX = PREBUILT_ENV_PREFIX  # (the one definition is khal_runtime.abi's)


def check_prebuilt_variables(crates: list[ResolvedCrate], reporter: Reporter) -> None:
    """A ``CUDA_OXIDE_SHADERS_PTX_*`` variable that names no crate is a ConfigError (a typo would
    otherwise build the crate from its sources, or leave it out, with a warning nobody sees under
    pip); one that is set but empty is a warning (it gives nothing to drop)."""
    known = {env_var_for_crate(c.name): c.name for c in crates}
    listing = ", ".join(f"{name!r} ({var})" for var, name in sorted(known.items(), key=lambda kv: kv[1]))
    for var in sorted(os.environ):
        if not var.startswith(PREBUILT_PREFIX):
            continue
        if var in known:
            if not os.environ[var].strip():
                reporter.warn(f"{var} is set but empty: crate {known[var]!r} is compiled from its sources")
            continue
        if not os.environ[var].strip():
            reporter.warn(f"{var} is set but empty, and no crate of this build is called that: it is ignored")
            continue
        close = difflib.get_close_matches(var, list(known), n=1, cutoff=0.8)
        guess = f"did you mean {close[0]} (crate {known[close[0]]!r})? " if close else ""
        raise ConfigError(f"{var} is set, but no crate of this build is called that: {guess}The crates and "
                          f"their variables: {listing}; rename the variable after its crate, or unset it")


def plan_crates(root: Path, crates: list[ResolvedCrate], reporter: Reporter) -> list[Planned[Any, Any]]:
    check_prebuilt_variables(crates, reporter)  # first: a misnamed variable is refused before any work
    planned = []
    for crate in crates:
        record = get_language(crate.language, crate.name).plan(root, crate)
        var = env_var_for_crate(crate.name)
        planned.append(record.prebuilt(var) if os.environ.get(var, "").strip() else record)
    return planned


def targets(crate: CrateRecord[Any, Any], reporter: Reporter) -> list[str]:
    """The PTX arch (if any) then the cubin archs this crate compiles for, those the
    compiler cannot target dropped (defaults, with a warning) or refused (explicit ones)."""
    cfg = crate.cfg
    compiler = get_compiler(crate.language.compiler)
    supported = compiler.supported_archs()
    version = compiler.identity().version
    archs: list[str] = []
    for a in cfg.archs:
        if parse_arch(a).number in supported:
            archs.append(a)
        elif cfg.archs_explicit:
            raise ConfigError(
                f"crate {cfg.name!r}: arch {a!r} (option 'archs' / KHAL_CUDA_ARCHS) is not supported by "
                f"{compiler.name.upper()} {version}; it supports " + ", ".join(f"sm_{s}" for s in supported)
            )
        else:
            reporter.warn(f"crate {cfg.name!r}: default arch {a} is not supported by this "
                          f"{compiler.name.upper()}; skipping it")
    ptx = cfg.ptx_arch
    if ptx is not None and parse_arch(ptx).number not in supported:
        raise ConfigError(
            f"crate {cfg.name!r}: PTX arch {ptx!r} (option 'ptx-arch' / KHAL_PTX_ARCH) is not supported "
            f"by this {compiler.name.upper()}; it supports " + ", ".join(f"compute_{s}" for s in supported)
        )
    if not archs and ptx is None:
        raise ConfigError(f"crate {cfg.name!r}: no cubin arch and no PTX arch left to build")
    return ([ptx] if ptx else []) + archs
