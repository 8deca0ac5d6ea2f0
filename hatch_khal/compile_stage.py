"""Stage 2: run each language's front stage (:func:`prepare_crates`: Slang, Triton; a
:class:`~hatch_khal.languages.Planned` record becomes a ``Prepared`` one), then compile every
job (:func:`compile_jobs`), each from the cache when it can.

Every output, fresh or cached, is checked by its compiler (:meth:`Compiler.check_output`:
kind and arch), a cached one also for its entry symbols' hashes: a cache entry that does not fit
its job (a swapped or damaged entry, another build's binary of the crate) is dropped and rebuilt
with a warning; a fresh output that does not fit is an error.
Jobs are driven from this process (one job), from threads (light crates) or from worker
processes (``python -m hatch_khal._worker``: crates that include the CUDA headers or CCCL spend
seconds per arch in NVRTC's front end); NVRTC itself compiles each job in a process of its own
(:mod:`hatch_khal.nvrtc`: its traced compiles cannot share one). Before an output is cached,
every file its compile read is checked against what the content hash covers
(:mod:`hatch_khal.reads`). A line up front says what will compile and how (:func:`plan_line`);
each output is checked, cached and reported as it finishes; the first failure cancels the
compiles still running or waiting (workers killed, nothing of theirs cached) and is raised at
once. Every crate's first target compiles before any crate's second, so a broken crate fails the
build early.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing
from typing import Any, Callable, Generator

from khal_runtime.binaries import BinaryFormatError, khal_symbols, read_binary

from hatch_khal import errors
from hatch_khal import _worker
from hatch_khal._worker import _HEADER
from hatch_khal.cache import Cache
from hatch_khal.compilers import get_compiler
from hatch_khal.config import jobs_from_env
from hatch_khal.errors import KhalBuildError
from hatch_khal.languages import Planned, Prepared
from hatch_khal.model import CompileJob, CompileOutput, Reporter
from hatch_khal.reads import changed, check_reads, spelled_locations

__all__ = ["compile_jobs", "prepare_crates"]

Outcome = CompileOutput | KhalBuildError
#: each job with its outcome as it finishes; closing it cancels the rest
Outcomes = Generator[tuple[CompileJob, Outcome], None, None]


def _attempt(job: CompileJob) -> Outcome:
    try:
        return get_compiler(job.compiler).compile(job)
    except KhalBuildError as exc:
        return exc


def _order(todo: list[CompileJob]) -> list[CompileJob]:
    """Every crate's first target before any crate's second: all targets of a crate fail alike,
    so a broken crate is found (and the build stopped) after one compile, not after the others'."""
    rank: dict[str, int] = {}
    nth: dict[str, int] = {}
    keyed = []
    for i, j in enumerate(todo):
        rank.setdefault(j.crate, len(rank))
        n = nth[j.crate] = nth.get(j.crate, -1) + 1
        keyed.append(((n, rank[j.crate], i), j))
    return [j for key, j in sorted(keyed, key=lambda kj: kj[0])]


def _send(proc: subprocess.Popen[bytes], job: CompileJob | None) -> None:
    payload = b"" if job is None else pickle.dumps(job)
    assert proc.stdin is not None
    proc.stdin.write(_HEADER.pack(len(payload)) + payload)
    proc.stdin.flush()


def _read_frames(index: int, proc: subprocess.Popen[bytes], results: queue.SimpleQueue[tuple[int, bytes | None]]) -> None:
    """A worker's outcomes, frame by frame, onto ``results``; None at its end of output."""
    assert proc.stdout is not None
    try:
        while len(head := proc.stdout.read(_HEADER.size)) == _HEADER.size:
            (size,) = _HEADER.unpack(head)
            body = proc.stdout.read(size)
            if len(body) != size:
                break
            results.put((index, body))
    except (OSError, ValueError):  # the pipe was closed: the build is cancelling
        pass
    results.put((index, None))


def _in_processes(todo: list[CompileJob], workers: int) -> Outcomes:
    """Compile ``todo`` in ``workers`` child processes, each given its next job when it answers
    the last; yields each outcome as it arrives. Closing the generator (the caller stopped at
    a failure, or was interrupted) kills the workers: none outlives it."""
    # the child sees what this process sees (an isolated build env is only on sys.path)
    env = _worker.environment()
    results: queue.SimpleQueue[tuple[int, bytes | None]] = queue.SimpleQueue()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    readers: list[threading.Thread] = []
    busy: dict[int, CompileJob] = {}
    waiting = iter(todo)
    try:
        for index in range(workers):
            log = tempfile.TemporaryFile()
            logs.append(log)
            # stdin stays open: its end of file tells the worker this process is gone
            proc = subprocess.Popen(_worker.command(), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, env=env)
            procs.append(proc)
            reader = threading.Thread(target=_read_frames, args=(index, proc, results), daemon=True,
                                      name=f"khal-worker-{index}")
            reader.start()
            readers.append(reader)
            busy[index] = next(waiting)
            _send(proc, busy[index])
        while busy:
            index, body = results.get()
            job = busy.pop(index, None)
            if job is None:
                continue  # a worker told to stop has ended
            try:
                out = pickle.loads(body) if body is not None else None
            except Exception:  # noqa: BLE001 - a broken worker is reported below
                out = None
            if out is None:
                proc = procs[index]
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                logs[index].seek(0)
                tail = logs[index].read().decode("utf-8", "replace")[-2000:]
                raise KhalBuildError(f"a compile worker process failed (exit {proc.returncode}) compiling crate "
                                     f"{job.crate!r} for {job.target}:\n{tail}")
            following = next(waiting, None)
            if following is not None:
                busy[index] = following
            _send(procs[index], following)
            yield job, (CompileOutput(out[1], out[2], out[3], reads=out[4]) if out[0] == "ok"
                        else errors.from_name(out[1], out[2]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait()
        for reader in readers:
            reader.join(timeout=10)
        for proc in procs:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:  # a pipe to a killed worker with unsent bytes
                        pass
        for log in logs:
            log.close()


def _in_threads(todo: list[CompileJob], workers: int) -> Outcomes:
    """Compile ``todo`` in threads; yields each outcome as it finishes. Closing the generator
    cancels the jobs not started and waits for the running ones (under a second each: light crates)."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="khal-compile")
    try:
        futures = {pool.submit(_attempt, j): j for j in todo}
        for done in as_completed(futures):
            yield futures[done], done.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _workers(todo: list[CompileJob], jobs: int | None) -> tuple[int, str]:
    """How many compiles run at once, and how: "process" (this one), "threads" or "processes"."""
    workers = jobs or jobs_from_env() or os.cpu_count() or 1
    workers = max(1, min(workers, len(todo)))
    if workers == 1:
        return 1, "process"
    return workers, ("processes" if any(j.heavy for j in todo) else "threads")


def _run(todo: list[CompileJob], workers: int, how: str) -> Outcomes:
    """Each job with its outcome, in the order they finish (a generator: close it to cancel the rest)."""
    if how == "process":
        return ((j, _attempt(j)) for j in todo)
    if how == "processes":
        return _in_processes(todo, workers)
    return _in_threads(todo, workers)


def plan_line(crates: dict[str, int], cached: int, workers: int, how: str) -> str:
    """``khal: compiling 3 crate(s) x 8 target(s) with 2 worker processes`` (targets per crate)."""
    counts = set(crates.values())
    total = sum(crates.values())
    shape = (f"{len(crates)} crate(s) \u00d7 {counts.pop()} target(s)" if len(counts) == 1
             else f"{total} artifact(s) of {len(crates)} crate(s)")
    with_ = {"process": "in this process", "threads": f"with {workers} threads",
             "processes": f"with {workers} worker processes"}[how]
    return f"khal: compiling {shape} {with_}" + (f"; {cached} more from the cache" if cached else "")


def _raise_failures(failures: list[KhalBuildError]) -> None:
    """One crate's error as it is; several crates' in one error (of the first one's type)."""
    if not failures:
        return
    if len(failures) == 1:
        raise failures[0]
    raise type(failures[0])("\n\n".join(str(e) for e in failures))


def prepare_crates(planned: list[Planned[Any, Any]], cache: Cache, reporter: Reporter, *,
                   jobs: int | None = None) -> list[Prepared[Any, Any]]:
    """Each language's front stage (:meth:`~hatch_khal.languages.Language.prepare`), crates in
    parallel threads (a Slang crate compiles in a worker process of its own): the crates' records,
    in their order, each counting its units compiled and from the cache. The first failure cancels
    the crates not started yet; the failures of those already running are reported with it, each
    crate's once."""
    if not planned:
        return []
    workers = max(1, min(jobs or jobs_from_env() or os.cpu_count() or 1, len(planned)))

    def one(crate: Planned[Any, Any]) -> Prepared[Any, Any] | KhalBuildError:
        try:
            return crate.prepare(cache, reporter)
        except KhalBuildError as exc:
            return exc

    if workers == 1:
        results: list[Prepared[Any, Any] | KhalBuildError] = []
        for crate in planned:
            results.append(one(crate))
            if isinstance(results[-1], KhalBuildError):
                break  # the first failure stops the build
    else:
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="khal-prepare")
        try:
            futures = [pool.submit(one, crate) for crate in planned]
            for done in as_completed(futures):
                if isinstance(done.result(), KhalBuildError):
                    break  # the first failure stops the build: the crates not started are cancelled
        finally:
            # a crate's front stage already running finishes (its own worker process); its
            # failure is reported too
            pool.shutdown(wait=True, cancel_futures=True)
        results = [f.result() for f in futures if f.done() and not f.cancelled()]
    _raise_failures([r for r in results if isinstance(r, KhalBuildError)])
    return [r for r in results if not isinstance(r, KhalBuildError)]


def _usable(job: CompileJob, data: bytes) -> str | None:
    return get_compiler(job.compiler).check_output(job, data)


def _carries_entries(job: CompileJob, data: bytes) -> str | None:
    """Why a cached ``data`` is not the output of ``job``'s sources (an entry symbol with another
    hash or missing: another build's binary of the same crate and arch), or None."""
    if not job.entries:
        return None
    try:
        found = khal_symbols(read_binary(data, f"crate {job.crate} {job.target}"))
    except BinaryFormatError as exc:
        return str(exc)
    for name, want in job.entries:
        got = found.get(name)
        if got != want:
            return (f"entry {name!r} carries hash {got}, the current sources give {want}" if got
                    else f"it has no kernel for entry {name!r}")
    return None


def _checked_reads(job: CompileJob, out: CompileOutput, reporter: Reporter, unlisted: set[str]) -> bool:
    """Whether a fresh output may be cached: every file its compile read is covered and unchanged
    (:func:`hatch_khal.reads.check_reads`, which raises otherwise). A compiler that cannot list
    what it read gets its outputs used, not cached (one warning per compiler), once the files the
    hash covers are checked unchanged."""
    if out.reads is not None:
        check_reads(job, out.reads)
        return True
    for f in job.covered:
        why = changed(f)
        if why is not None:
            raise errors.SourceChangedError(
                f"crate {job.crate!r}: {f.key} changed while the crate compiled for {job.target} ({why}); "
                "build again")
    if job.compiler not in unlisted:
        unlisted.add(job.compiler)
        reporter.warn(f"khal: this {job.compiler.upper()} cannot list the files a compile reads (NVRTC "
                      "--fdevice-time-trace), so what it compiles is not cached: an edit to a header the "
                      "hook did not hash could not be told from a cache hit")
    return False


def compile_jobs(
    all_jobs: list[CompileJob],
    cache: Cache,
    reporter: Reporter,
    *,
    jobs: int | None = None,
    explain: Callable[[CompileJob, KhalBuildError], KhalBuildError] = lambda j, e: e,
) -> tuple[dict[tuple[str, str], CompileOutput], int]:
    """Outputs by (crate, target), and how many were compiled (the rest came from the cache).

    ``explain`` turns a job's failure into the error to report (one per crate)."""
    if jobs is None:
        jobs_from_env()  # a bad KHAL_JOBS is an error even when everything is cached
    elif jobs < 1:
        raise errors.ConfigError(f"jobs={jobs!r}: the number of parallel compiles must be 1 or more")
    outputs: dict[tuple[str, str], CompileOutput] = {}

    def from_cache(job: CompileJob) -> bool:
        hit = cache.lookup(job.key)
        if hit is None:
            return False
        why = _usable(job, hit.data) or _carries_entries(job, hit.data)
        if why is not None:
            cache.drop(job.key, f"not a {job.target} output of crate {job.crate!r} ({why}); rebuilding it")
            return False
        elsewhere = [loc for loc in hit.locations if loc not in job.locations]
        if elsewhere:
            reporter.debug(f"khal: {job.crate} {job.target}: the cached binary names {elsewhere[0]} (__FILE__), "
                           "not this build's location; compiling")
            return False
        outputs[(job.crate, job.target)] = CompileOutput(hit.data, hit.log, cached=True)
        reporter.debug(f"khal: {job.crate} {job.target}: cached")
        return True

    misses = [j for j in all_jobs if not from_cache(j)]
    compiled = 0
    if not misses:
        return outputs, compiled
    with cache.locked(j.key for j in misses):
        todo = _order([j for j in misses if not from_cache(j)])  # another build may have stored them meanwhile
        if not todo:
            return outputs, compiled
        workers, how = _workers(todo, jobs)
        per_crate: dict[str, int] = {}
        for job in todo:
            per_crate[job.crate] = per_crate.get(job.crate, 0) + 1
        reporter.info(plan_line(per_crate, len(all_jobs) - len(todo), workers, how))
        width = len(str(len(todo)))
        unlisted: set[str] = set()
        # each outcome is checked, stored and shown as it comes; the first failure stops the rest
        with closing(_run(todo, workers, how)) as outcomes:
            for job, out in outcomes:
                if isinstance(out, KhalBuildError):
                    left = len(todo) - compiled - 1
                    if left:
                        reporter.warn(f"khal: crate {job.crate!r} failed to compile for {job.target}; "
                                      f"cancelling the {left} other compile(s)")
                    outcomes.close()  # workers killed, pending jobs cancelled before the error shows
                    raise explain(job, out)
                why = _usable(job, out.data)
                if why is not None:
                    outcomes.close()
                    raise KhalBuildError(f"crate {job.crate!r}: the compiler's output for {job.target} is "
                                         f"unusable: {why}")
                try:
                    store = _checked_reads(job, out, reporter, unlisted)
                except KhalBuildError:
                    outcomes.close()
                    raise
                if store:
                    cache.store(job.key, out.data, out.log, spelled_locations(job, out.data))
                outputs[(job.crate, job.target)] = out
                compiled += 1
                if out.log:
                    reporter.warn(f"crate {job.crate!r} ({job.target}): {job.compiler.upper()} says:\n{out.log}")
                reporter.info(f"khal: [{compiled:{width}}/{len(todo)}] compiled crate {job.crate!r} for "
                              f"{job.target} in {out.seconds:.2f}s")
    return outputs, compiled
