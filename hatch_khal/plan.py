"""Stage 1: plan every crate (sources, entries, hashes) before anything is compiled.

Each crate is planned by its language (:mod:`hatch_khal.languages`: the one place a configured
language name becomes its ``Language``), giving one frozen :class:`~hatch_khal.languages.Planned`
record per crate; then the prebuilt-binary variables (``CUDA_OXIDE_SHADERS_PTX_<CRATE>``; one that names no crate is
ignored, a near miss of one is an error) and
the targets each crate compiles for. Entry names are unique per crate (each language checks its
own); two crates of a package may share one (the runtime's ``kernels.<name>`` is then
ambiguous, ``kernels.<crate>.<name>`` is not), so one source can be built as several crates
under different ``defines``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from khal_runtime.abi import PREBUILT_ENV_PREFIX, parse_arch

from hatch_khal.compilers import get_compiler
from hatch_khal.config import ResolvedCrate, env_var_for_crate
from hatch_khal.errors import ConfigError
from hatch_khal.languages import CrateRecord, Planned, get_language
from hatch_khal.model import Reporter

__all__ = ["PREBUILT_PREFIX", "check_prebuilt_variables", "near_miss", "plan_crates", "targets"]

PREBUILT_PREFIX = PREBUILT_ENV_PREFIX  # (the one definition is khal_runtime.abi's)


def _distance(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap of two neighbours) from ``a`` to ``b``: the optimal
    string alignment distance. Hand-written: difflib has no edit distance, and a dependency for these
    lines is not worth it."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def near_miss(var: str, known: dict[str, str]) -> str | None:
    """The variable of this build's crates that ``var`` (another ``CUDA_OXIDE_SHADERS_PTX_*``) is
    probably a misspelling of, or None: the same name in another case or with ``-`` for ``_``, or
    one or two letters off (one for a crate name of 4 to 7 characters, two from 8: a short name one
    letter off is as likely another package's crate, whose variable a CI sets for every build)."""
    def norm(v: str) -> str:
        return v[len(PREBUILT_PREFIX):].upper().replace("-", "_") if v.upper().startswith(PREBUILT_PREFIX) else v

    mine = norm(var)
    best: tuple[int, str] | None = None
    for k in sorted(known):
        theirs = norm(k)
        if mine == theirs:
            return k
        allowed = 2 if len(theirs) >= 8 else 1 if len(theirs) >= 4 else 0
        d = _distance(mine, theirs)
        if d <= allowed and (best is None or d < best[0]):
            best = (d, k)
    return best[1] if best else None


def check_prebuilt_variables(crates: list[ResolvedCrate], reporter: Reporter) -> None:
    """``CUDA_OXIDE_SHADERS_PTX_*`` variables that name no crate of this build are ignored, as
    khal-builder's build scripts ignore the other crates' variables: a CI that builds several shader
    packages sets every package's variables for all of them. One that is a near miss of a crate of
    this build (:func:`near_miss`: case, ``-`` for ``_``, a letter or two off) is a ConfigError naming
    the crate it probably meant (a typo would otherwise build the crate from its sources with a
    message nobody sees under pip); one of this build set but empty is a warning."""
    known = {env_var_for_crate(c.name): c.name for c in crates}
    listing = ", ".join(f"{name!r} ({var})" for var, name in sorted(known.items(), key=lambda kv: kv[1]))
    for var in sorted(os.environ):
        if not var.upper().startswith(PREBUILT_PREFIX):
            continue
        if var in known:
            if not os.environ[var].strip():
                reporter.warn(f"{var} is set but empty: crate {known[var]!r} is compiled from its sources")
            continue
        meant = near_miss(var, known)
        if meant is None or not os.environ[var].strip():
            reporter.debug(f"khal: {var} names no crate of this build: ignored (another package's, as khal-builder "
                           "reads only its own crates' variables)")
            continue
        raise ConfigError(f"{var} is set, and no crate of this build is called that, but it is a near miss of "
                          f"{meant}, the variable of crate {known[meant]!r}: rename it {meant} to give that crate's "
                          f"prebuilt binary (or unset it); the crates of this build and their variables: {listing}")


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
    # a compiler whose PTX may need a newer driver than the project asked for says so (NVRTC:
    # hatch_khal.nvrtc.ptx_problem); a compiler without the question has no such problem
    problem = getattr(compiler, "ptx_problem", None)
    why = problem() if ptx is not None and problem is not None else None
    if why is not None:
        raise ConfigError(f"crate {cfg.name!r} builds PTX ({ptx}): {why}")
    return ([ptx] if ptx else []) + archs
