"""How a failed build reaches the user: one block (what failed, where, what to do), then exit.

A build error raised out of a build backend reaches the user as the last line of a 30-45 line
traceback under plain ``pip wheel`` (pip shows a failing backend's whole output, and the hook's
frames are most of it). So, as maturin and scikit-build-core do, the front-ends catch the build's
own errors (:class:`~hatch_khal.errors.KhalBuildError`, and a variable the build reads with a
value it does not understand, :class:`~khal_runtime.errors.EnvVarError`), print one block to
stderr and exit with status 1 (``SystemExit``: the frontend, pip, ``build``, uv or hatch, reports
the failure and shows the block). ``KHAL_BUILD_DEBUG=1`` prints the block and lets the exception
go on, traceback and all (what the tests' in-process builds see). Anything else (a bug) keeps its
traceback.
"""

from __future__ import annotations

import os
import sys
import textwrap
from contextlib import contextmanager
from typing import Iterator

from khal_runtime.abi import env_flag
from khal_runtime.errors import EnvVarError

from hatch_khal.errors import KhalBuildError

__all__ = ["DEBUG_ENV", "error_block", "reported"]

#: set (a boolean, ``1``): a failed build shows its traceback after the block
DEBUG_ENV = "KHAL_BUILD_DEBUG"

def _debug() -> bool:
    try:
        return env_flag(os.environ.get(DEBUG_ENV), DEBUG_ENV)
    except EnvVarError:
        return True  # a value it does not understand: show everything rather than less


def error_block(exc: BaseException, project: str, where: str, debug: str = f"{DEBUG_ENV}=1") -> str:
    """The block a failed build prints: what failed (the error's class and message, which names
    the option, file, crate or entry and what to do), where (the project and the table or
    command that configured the build), and how to see more (``debug``: the variable that shows the
    traceback: setuptools has its own)."""
    body = str(exc) or type(exc).__name__  # unwrapped: the terminal wraps it, and it stays greppable
    rule = "-" * 72
    return (f"{rule}\n"
            f"hatch-khal: the kernels of {project} could not be built ({type(exc).__name__})\n"
            f"  where: {where}\n\n"
            f"{textwrap.indent(body, '  ')}\n\n"
            f"  What to do: the message above names the option, file, crate or entry at fault and the fix;\n"
            f"  build again after it. {debug} shows the traceback.\n"
            f"{rule}")


@contextmanager
def reported(project: str, where: str) -> Iterator[None]:
    """Run a front-end step; a build error becomes :func:`error_block` on stderr and
    ``SystemExit(1)`` (the traceback too, and the exception itself, under ``KHAL_BUILD_DEBUG``)."""
    try:
        yield
    except (KhalBuildError, EnvVarError) as exc:
        sys.stdout.flush()
        print(error_block(exc, project, where), file=sys.stderr, flush=True)
        if _debug():
            raise
        raise SystemExit(1) from None
