"""Progress and fail-fast of the compile stage: a plan line up front, each artifact's line as it
finishes, the first failure stopping the rest at once (nothing of the cancelled work cached, no
worker process left).

Threads run a stub compiler (registered in ``COMPILERS`` for the test) whose jobs sleep for a
set time; worker processes cannot see a stub registered here, so they run NVRTC on a crate that
includes the CUDA headers (seconds per arch) next to a crate with a syntax error."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from hatch_khal import compilers
from hatch_khal.builder import build_packages
from hatch_khal.cache import Cache
from hatch_khal.compile_stage import compile_jobs, plan_line
from hatch_khal.errors import CompileError
from hatch_khal.model import CompileJob, CompileOutput

from tests.helpers.build import Recorder, _crates, build, worker_children
from tests.helpers.projects import HALF_CU, make_project
from tests.conftest import SESSION_ENV


class _Stub:
    """Sleeps the seconds in the job's text, then returns bytes naming the job; text "fail" fails."""

    name = "stub"

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.finished: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def compile(self, job: CompileJob) -> CompileOutput:
        with self.lock:
            self.started.append((job.crate, job.target))
        if job.text == "fail":
            raise CompileError(f"crate {job.crate!r} failed to compile for {job.target}:\nk.cu(13): error: "
                               'expected a ";"')
        time.sleep(float(job.text))
        with self.lock:
            self.finished.append((job.crate, job.target))
        # it reads no file (an output whose reads are unknown is not cached)
        return CompileOutput(f"{job.crate}/{job.target}".encode(), "", float(job.text), reads=())

    def check_output(self, job: CompileJob, data: bytes) -> str | None:
        return None if data == f"{job.crate}/{job.target}".encode() else "not this job's output"


STUB = _Stub()


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> _Stub:
    global STUB
    STUB = _Stub()
    monkeypatch.setitem(compilers.COMPILERS, "stub", f"{__name__}:STUB")
    monkeypatch.delenv("KHAL_JOBS", raising=False)
    return STUB


def _jobs(crate: str, text: str, targets: list[str]) -> list[CompileJob]:
    return [CompileJob(crate=crate, target=t, compiler="stub", text=text, name="k.cu", options=(),
                       key=hashlib.sha256(f"{crate}/{t}/{text}".encode()).hexdigest()) for t in targets]


class _Timed:
    """A reporter noting, with each line, how many compiles the stub had finished when it came
    (an order of events, not a time: a busy machine stretches times, not this order)."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.warnings: list[str] = []

    def info(self, message: str) -> None:
        with STUB.lock:
            self.lines.append((len(STUB.finished), message))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def debug(self, message: str) -> None:
        pass


TARGETS = ["sm_75", "sm_80", "sm_90"]


def test_each_artifact_is_reported_as_it_finishes(stub: _Stub, tmp_path: Path) -> None:
    jobs = _jobs("quick", "0.01", TARGETS) + _jobs("slow", "0.4", TARGETS)
    rep = _Timed()
    outputs, compiled = compile_jobs(jobs, Cache(tmp_path / "c"), rep, jobs=2)
    assert compiled == 6 and len(outputs) == 6
    assert rep.lines[0][1] == "khal: compiling 2 crate(s) \u00d7 3 target(s) with 2 threads"
    done = [(n, m) for n, m in rep.lines if "compiled crate" in m]
    assert len(done) == 6
    # lines come as compiles finish (the slow crate's three over 2 threads), not all at the end:
    # the first came before the last compile finished, and the slow crate's over more than one moment
    assert done[0][0] < 6, rep.lines
    slow = [n for n, m in done if "'slow'" in m]
    assert slow[0] < slow[-1], rep.lines
    assert done[0][1].startswith("khal: [1/6] compiled crate 'quick' for ")
    assert done[-1][1].startswith("khal: [6/6] compiled crate 'slow' for ") and done[-1][1].endswith(" in 0.40s")


def test_plan_line_counts_what_is_cached(stub: _Stub, tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    compile_jobs(_jobs("a", "0", TARGETS), cache, _Timed(), jobs=1)
    rep = _Timed()
    compile_jobs(_jobs("a", "0", TARGETS) + _jobs("b", "0", ["sm_90"]), cache, rep, jobs=4)
    assert rep.lines[0][1] == "khal: compiling 1 crate(s) \u00d7 1 target(s) in this process; 3 more from the cache"
    rep = _Timed()
    compile_jobs(_jobs("a", "0", TARGETS), cache, rep, jobs=4)
    assert not any("compiling" in m for _, m in rep.lines)  # nothing to compile, no plan
    assert plan_line({"a": 8, "b": 2}, 0, 2, "processes") == \
        "khal: compiling 10 artifact(s) of 2 crate(s) with 2 worker processes"


@pytest.mark.parametrize("workers", [1, 2])
def test_first_failure_stops_the_build(stub: _Stub, tmp_path: Path, workers: int) -> None:
    """The broken crate listed last still fails first (every crate's first target comes first);
    the slow crate's pending compiles never start and nothing of it but finished work is cached."""
    slow = _jobs("slow", "0.3", ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100"])
    bad = _jobs("bad", "fail", TARGETS)
    cache = Cache(tmp_path / "c")
    rep = _Timed()
    with pytest.raises(CompileError, match=r"crate 'bad' failed to compile for sm_75:\nk.cu\(13\)") as exc:
        compile_jobs(slow + bad, cache, rep, jobs=workers)
    assert str(exc.value).count("crate 'bad'") == 1
    # the build stopped at the failure: the slow crate's six compiles did not all run
    assert len([f for f in stub.finished if f[0] == "slow"]) < 6, stub.finished
    assert ("bad", "sm_80") not in stub.started  # a failed crate is not compiled again
    assert len(stub.started) <= 4, stub.started  # the failure, what ran beside it, one more at most
    assert any("cancelling the" in w for w in rep.warnings)
    reported = {m.split("for ")[1].split()[0] for _, m in rep.lines if "compiled crate" in m}
    for job in slow:  # cached: what was reported before the failure, whole
        hit = cache.lookup(job.key)
        assert (hit is not None) == (job.target in reported)
        assert hit is None or hit.data == f"slow/{job.target}".encode()
    assert all(cache.lookup(j.key) is None for j in bad)


BROKEN = "KHAL_ENTRY(one, 32, (KHAL_STORAGE(float, y)))\n{\n    int x = ;\n}\n"


@pytest.mark.needs_nvrtc
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_worker_processes_stop_at_the_first_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crate with the CUDA headers (worker processes, seconds per arch) and a broken crate: the
    error comes after the broken crate's compile, not the other's four, and no worker is left."""
    for k in list(os.environ):
        if k.startswith(("KHAL_", "CUDA_OXIDE_SHADERS_PTX_")) and k not in SESSION_ENV:
            monkeypatch.delenv(k)
    hook = 'archs = ["sm_75", "sm_80", "sm_90", "sm_100"]\nptx-arch = "none"\n'
    root = make_project(tmp_path / "p", hook=hook, files={"kernels/beta/fill.cu": HALF_CU,
                                                          "kernels/alpha/scale.cu": BROKEN})
    cache_dir = tmp_path / "c"
    rep = Recorder()
    with pytest.raises(CompileError, match=r"(?s)crate 'alpha'.*scale\.cu\(3\): error") as exc:
        build_packages(root, _crates(root), rep, cache=Cache(cache_dir, rep.warn), jobs=2)
    assert str(exc.value).count("crate 'alpha' failed") == 1
    assert rep.infos[0] == "khal: compiling 2 crate(s) \u00d7 4 target(s) with 2 worker processes"
    assert worker_children(os.getpid()) == []
    done = [m for m in rep.infos if "compiled crate 'beta'" in m]
    assert len(done) < 4, rep.infos
    # what finished before the failure is cached whole; the cancelled compiles left nothing
    (root / "kernels/alpha/scale.cu").write_text("KHAL_ENTRY(one, 32, (KHAL_STORAGE(float, y))) { y[0] = 1.0f; }\n")
    result, again = build(root, cache_dir, jobs=2)
    assert (result.cached, result.compiled) == (len(done), 8 - len(done))
    assert again.warnings == []
