"""A compile worker process: ``python -m hatch_khal._worker`` (used by the compile stage only).

The protocol, frames of a little-endian u64 length and a pickle: the parent sends one
:class:`~hatch_khal.model.CompileJob` at a time on stdin; the worker answers each with one
outcome on stdout (``("ok", data, log, seconds, reads)``, ``reads`` the files the compiler opened
or None, or ``("error", class name, message)``) as soon as it is compiled, and gets its next job then (so a slow crate does not hold back the
others, and the parent can show each artifact as it finishes). An empty frame means "no more
jobs": the worker exits. A plain child process rather than a multiprocessing pool: a pool
started with ``spawn`` re-runs the parent's ``__main__`` (a ``setup.py`` or a user's script
without a main guard would run again in every worker), and ``fork`` is unsafe in a threaded
build backend.

``--once``: compile one job with the compiler's ``compile_here`` and exit (NVRTC compiles each job
in such a process of its own: :meth:`hatch_khal.nvrtc.NvrtcCompiler.compile`).

Only a reader thread reads stdin: its end of file means the parent is gone (killed, even by
SIGKILL, or it cancelled the build after another job failed), and the worker ends at once
instead of compiling on for minutes.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import sys
import threading

HEADER = _HEADER = struct.Struct("<Q")
#: exit status of a worker whose parent went away
ORPHANED = 75


def _read_exact(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        b = os.read(fd, min(n, 1 << 20))
        if not b:
            raise EOFError("the build process closed the pipe")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _read_jobs(fd: int, jobs: queue.SimpleQueue[bytes]) -> None:
    """Hand each job frame to the main thread; an empty frame ends the work; end of file means
    the parent is gone (or gave up): stop now."""
    try:
        while True:
            (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
            if not size:
                jobs.put(b"")
                return
            jobs.put(_read_exact(fd, size))
    except (OSError, EOFError):
        pass
    os._exit(ORPHANED)


def command(*, once: bool = False) -> list[str]:
    """How to start a worker (``once``: compile one job, with the compiler's ``compile_here``)."""
    return [sys.executable, "-m", "hatch_khal._worker"] + (["--once"] if once else [])


def environment() -> dict[str, str]:
    """A worker's environment: this one, with sys.path as PYTHONPATH (an isolated build
    environment is only on sys.path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def main(argv: list[str] | None = None) -> int:
    # lazy: the worker imports the compiler stack only once it runs
    from hatch_khal.compilers import get_compiler
    from hatch_khal.errors import KhalBuildError

    once = "--once" in (sys.argv[1:] if argv is None else argv)

    jobs: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    threading.Thread(target=_read_jobs, args=(sys.stdin.fileno(), jobs), daemon=True,
                     name="khal-job-reader").start()
    out = sys.stdout.buffer
    while payload := jobs.get():
        job = pickle.loads(payload)
        result: tuple[object, ...]
        try:
            compiler = get_compiler(job.compiler)
            r = getattr(compiler, "compile_here", compiler.compile)(job) if once else compiler.compile(job)
        except KhalBuildError as exc:
            result = ("error", type(exc).__name__, str(exc))
        else:
            result = ("ok", r.data, r.log, r.seconds, r.reads)
        data = pickle.dumps(result)
        out.write(_HEADER.pack(len(data)) + data)
        out.flush()
        if once:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
