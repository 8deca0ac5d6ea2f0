"""The environment a Triton compile depends on, for a Triton crate's content hash: every ``TRITON_*``
variable (less where Triton writes: its cache, home and dump folders) and every variable the
installed Triton says invalidates its cache (``get_cache_invalidating_env_vars()``: ``DISABLE_LLVM_OPT``,
``LLVM_PASS_PLUGIN_PATH``, ``MLIR_ENABLE_DUMP``, ... with the values Triton reads). No list of our own:
Triton is asked, in a process of its own (the hook's process never imports Triton), once per
Triton and environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from functools import lru_cache

from hatch_khal.errors import KhalBuildError

__all__ = ["NOT_COMPILE_INPUTS", "compile_environment", "triton_invalidating"]

#: TRITON_* variables that say where Triton writes, not what it compiles
NOT_COMPILE_INPUTS = frozenset({"TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR"})

#: asks the installed Triton (3.x: ``triton._C.libtriton``, which ``triton.compile`` reads it from)
_ASK = """\
import json, sys
from triton._C.libtriton import get_cache_invalidating_env_vars
sys.stdout.write(json.dumps({str(k): str(v) for k, v in get_cache_invalidating_env_vars().items()}))
"""


@lru_cache(maxsize=8)
def _ask(version: str, env: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    run = subprocess.run([sys.executable, "-c", _ASK], env=dict(env), capture_output=True, text=True, check=False)
    try:
        answer = json.loads(run.stdout)
    except ValueError:
        answer = None
    if run.returncode != 0 or not isinstance(answer, dict):
        raise KhalBuildError(f"Triton {version} could not say which environment variables change what it compiles "
                             f"(get_cache_invalidating_env_vars(), exit {run.returncode}): "
                             f"{run.stderr.strip()[-2000:]}")
    return tuple(sorted((str(k), str(v)) for k, v in answer.items()))


def triton_invalidating(version: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` the installed Triton (``version``) says invalidate its cache, with
    the values it reads (its ``get_cache_invalidating_env_vars()`` under ``env``)."""
    return dict(_ask(version, tuple(sorted(env.items()))))


def compile_environment(version: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What of the environment a Triton compile depends on (module docstring), sorted."""
    env = dict(os.environ if env is None else env)
    out = {k: v for k, v in env.items() if k.startswith("TRITON_") and k not in NOT_COMPILE_INPUTS}
    out.update(triton_invalidating(version, env))
    return dict(sorted(out.items()))
