"""A compile worker process: ``python -m hatch_khal._worker`` (used by the compile stage only).

Reads one length-prefixed pickled list of :class:`~hatch_khal.model.CompileJob` on stdin,
writes a pickled list of outcomes on stdout. A plain child process rather than a
multiprocessing pool: a pool started with ``spawn`` re-runs the parent's ``__main__`` (a
``setup.py`` or a user's script without a main guard would run again in every worker), and
``fork`` is unsafe in a threaded build backend.

The parent keeps stdin open until it has the results: when the parent dies (even by
SIGKILL) the pipe closes, and a watchdog thread here ends the worker at once instead of
letting it compile on for minutes.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading

_HEADER = struct.Struct("<Q")
#: exit status of a worker whose parent went away
ORPHANED = 75


def _read_exact(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise EOFError("the build process closed the pipe before sending its jobs")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _watch_parent(fd: int) -> None:
    """Block on stdin; its end of file means the parent is gone (or gave up): stop now."""
    try:
        while os.read(fd, 1 << 16):
            pass
    except OSError:
        pass
    os._exit(ORPHANED)


def main() -> int:
    # lazy: the worker imports the compiler stack only once it has jobs to run
    from hatch_khal.compilers import get_compiler
    from hatch_khal.errors import KhalBuildError

    fd = sys.stdin.fileno()
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    jobs = pickle.loads(_read_exact(fd, size))
    threading.Thread(target=_watch_parent, args=(fd,), daemon=True, name="khal-parent-watch").start()
    out: list[tuple[object, ...]] = []
    for job in jobs:
        try:
            r = get_compiler(job.compiler).compile(job)
        except KhalBuildError as exc:
            out.append(("error", type(exc).__name__, str(exc)))
        else:
            out.append(("ok", r.data, r.log, r.seconds))
    sys.stdout.buffer.write(pickle.dumps(out))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
