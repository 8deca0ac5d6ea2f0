"""Stage 2: run each language's front stage (:func:`prepare_crates`: Slang), then compile every
job (:func:`compile_jobs`), each from the cache when it can.

Every output, fresh or cached, is checked by its compiler (:meth:`Compiler.check_output`:
kind and arch): a cache entry that does not fit its job (a swapped or damaged entry) is
dropped and rebuilt with a warning; a fresh output that does not fit is an error.
Jobs run in this process (one job), in threads (light crates: NVRTC releases the GIL) or
in worker processes (``python -m hatch_khal._worker``: crates that include the CUDA
headers or CCCL spend seconds per arch in NVRTC's front end, which only scales across
processes).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from hatch_khal import errors
from hatch_khal._worker import _HEADER
from hatch_khal.cache import Cache
from hatch_khal.compilers import get_compiler
from hatch_khal.config import jobs_from_env
from hatch_khal.errors import KhalBuildError
from hatch_khal.languages import get_language
from hatch_khal.model import CompileJob, CompileOutput, CratePlan, Reporter

__all__ = ["compile_jobs", "prepare_crates"]

Outcome = CompileOutput | KhalBuildError


def _attempt(job: CompileJob) -> Outcome:
    try:
        return get_compiler(job.compiler).compile(job)
    except KhalBuildError as exc:
        return exc


def _error_from(name: str, message: str) -> KhalBuildError:
    cls = getattr(errors, name, KhalBuildError)
    if isinstance(cls, type) and issubclass(cls, KhalBuildError):
        return cls(message)
    return KhalBuildError(message)


def _in_processes(todo: list[CompileJob], workers: int) -> list[Outcome]:
    """Compile ``todo`` in ``workers`` child processes; they end with this process."""
    chunks = [todo[i::workers] for i in range(workers)]
    env = dict(os.environ)
    # the child sees what this process sees (an isolated build env is only on sys.path)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    procs: list[tuple[subprocess.Popen[bytes], list[CompileJob]]] = []
    logs = []
    results: dict[int, Outcome] = {}
    try:
        for chunk in chunks:
            log = tempfile.TemporaryFile()
            logs.append(log)
            proc = subprocess.Popen([sys.executable, "-m", "hatch_khal._worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=log, env=env)
            procs.append((proc, chunk))
            assert proc.stdin is not None
            payload = pickle.dumps(chunk)
            # stdin stays open: its end of file tells the worker this process is gone
            proc.stdin.write(_HEADER.pack(len(payload)) + payload)
            proc.stdin.flush()
        for (proc, chunk), log in zip(procs, logs):
            assert proc.stdout is not None
            raw = proc.stdout.read()
            proc.wait()
            try:
                outs = pickle.loads(raw) if proc.returncode == 0 else None
            except Exception:  # noqa: BLE001 - a broken worker is reported below
                outs = None
            if outs is None or len(outs) != len(chunk):
                log.seek(0)
                tail = log.read().decode("utf-8", "replace")[-2000:]
                raise KhalBuildError(f"a compile worker process failed (exit {proc.returncode}):\n{tail}")
            for job, out in zip(chunk, outs):
                results[id(job)] = CompileOutput(out[1], out[2], out[3]) if out[0] == "ok" \
                    else _error_from(out[1], out[2])
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
            proc.wait()
        for log in logs:
            log.close()
    return [results[id(j)] for j in todo]


def _run(todo: list[CompileJob], jobs: int | None) -> list[Outcome]:
    if not todo:
        return []
    workers = jobs or jobs_from_env() or os.cpu_count() or 1
    workers = max(1, min(workers, len(todo)))
    if workers == 1:
        return [_attempt(j) for j in todo]
    if any(j.heavy for j in todo):
        return _in_processes(todo, workers)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_attempt, todo))


def _raise_failures(failures: list[KhalBuildError]) -> None:
    """One crate's error as it is; several crates' in one error (of the first one's type)."""
    if not failures:
        return
    if len(failures) == 1:
        raise failures[0]
    raise type(failures[0])("\n\n".join(str(e) for e in failures))


def prepare_crates(plans: list[CratePlan], cache: Cache, reporter: Reporter, *,
                   jobs: int | None = None) -> tuple[int, int]:
    """Each language's front stage (:meth:`~hatch_khal.languages.Language.prepare`), crates in
    parallel threads (a Slang crate compiles in a worker process of its own). Returns (compiled,
    from cache) over all crates; every crate's failure is reported, each once."""
    if not plans:
        return 0, 0
    workers = max(1, min(jobs or jobs_from_env() or os.cpu_count() or 1, len(plans)))

    def one(plan: CratePlan) -> tuple[int, int] | KhalBuildError:
        try:
            return get_language(plan.language, plan.cfg.name).prepare(plan, cache, reporter)
        except KhalBuildError as exc:
            return exc

    if workers == 1:
        results = [one(p) for p in plans]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(one, plans))
    _raise_failures([r for r in results if isinstance(r, KhalBuildError)])
    counts = [r for r in results if not isinstance(r, KhalBuildError)]
    return sum(c for c, _ in counts), sum(h for _, h in counts)


def _usable(job: CompileJob, data: bytes) -> str | None:
    return get_compiler(job.compiler).check_output(job, data)


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
        why = _usable(job, hit.data)
        if why is not None:
            cache.drop(job.key, f"not a {job.target} output of crate {job.crate!r} ({why}); rebuilding it")
            return False
        outputs[(job.crate, job.target)] = CompileOutput(hit.data, hit.log, cached=True)
        reporter.debug(f"khal: {job.crate} {job.target}: cached")
        return True

    misses = [j for j in all_jobs if not from_cache(j)]
    compiled = 0
    if misses:
        with cache.locked(j.key for j in misses):
            todo = [j for j in misses if not from_cache(j)]  # another build may have stored them meanwhile
            failures: dict[str, KhalBuildError] = {}
            for job, out in zip(todo, _run(todo, jobs)):
                if isinstance(out, KhalBuildError):
                    # all targets of a crate fail alike: report each crate's first failure once
                    failures.setdefault(job.crate, explain(job, out))
                    continue
                why = _usable(job, out.data)
                if why is not None:
                    raise KhalBuildError(f"crate {job.crate!r}: the compiler's output for {job.target} is "
                                         f"unusable: {why}")
                cache.store(job.key, out.data, out.log)
                outputs[(job.crate, job.target)] = out
                compiled += 1
                if out.log:
                    reporter.warn(f"crate {job.crate!r} ({job.target}): {job.compiler.upper()} says:\n{out.log}")
                reporter.info(f"khal: compiled crate {job.crate!r} for {job.target} in {out.seconds:.2f}s")
            _raise_failures(list(failures.values()))
    return outputs, compiled
