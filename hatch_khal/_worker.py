"""A compile worker process: ``python -m hatch_khal._worker`` (used by the builder only).

Reads a pickled list of compile jobs on stdin, writes a pickled list of outcomes on
stdout. A plain child process rather than a multiprocessing pool: a pool started
with ``spawn`` re-runs the parent's ``__main__`` (a ``setup.py`` or a user's script
without a main guard would run again in every worker), and ``fork`` is unsafe in a
threaded build backend. Only the builder talks to this worker, over a pipe.
"""

from __future__ import annotations

import pickle
import sys
import time


def main() -> int:
    from hatch_khal.errors import KhalBuildError
    from hatch_khal.nvrtc import compile_unit

    jobs = pickle.load(sys.stdin.buffer)
    out: list[tuple] = []  # type: ignore[type-arg]
    for text, name, arch, options, crate in jobs:
        t0 = time.perf_counter()
        try:
            r = compile_unit(text, name, arch, options, crate)
        except KhalBuildError as exc:
            out.append(("error", type(exc).__name__, str(exc)))
        else:
            out.append(("ok", r.data, r.log, time.perf_counter() - t0))
    pickle.dump(out, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
