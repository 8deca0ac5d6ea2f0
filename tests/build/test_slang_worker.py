"""The Slang worker process: a crash is one clean build error naming the crate; the worker never
outlives its parent."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hatch_khal.errors import CompileError
from hatch_khal.slang.client import SlangCrashed
from hatch_khal.slang.worker import CRASH_ENV
from tests.helpers.slang import ROOT, compile_files, needs_slang
from tests.helpers.slang import one_entry

pytestmark = needs_slang


@pytest.mark.parametrize("stage, doing", [("cuda", "compiling the crate to CUDA source"),
                                           ("webgpu", "compiling entries to WGSL / SPIR-V")])
def test_crash_is_a_build_error_naming_the_crate(tmp_path, monkeypatch, stage: str, doing: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(CRASH_ENV, stage)
    with pytest.raises(SlangCrashed) as exc:
        compile_files(tmp_path, one_entry(), crate="boom")
    msg = str(exc.value)
    assert isinstance(exc.value, CompileError)
    assert msg.startswith(f"crate 'boom': the Slang compiler crashed while {doing} (killed by signal SIGABRT)")
    assert "bug in Slang" in msg
    assert exc.value.__cause__ is None and exc.value.__context__ is None  # one clean error


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_worker_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, os, time\n"
         "env = dict(os.environ, _HATCH_KHAL_SLANG_PARENT=str(os.getpid()))\n"
         "w = subprocess.Popen([sys.executable, '-m', 'hatch_khal.slang.worker'], stdin=subprocess.PIPE,\n"
         "                     stdout=subprocess.PIPE, env=env)\n"
         "print(w.pid, flush=True)\n"
         "time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)),
    )
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    time.sleep(0.5)
    assert _alive(worker)
    parent.kill()  # SIGKILL: no cleanup in the parent at all
    parent.wait()
    deadline = time.time() + 15
    while _alive(worker) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def test_worker_exits_on_stdin_eof() -> None:
    proc = subprocess.run([sys.executable, "-m", "hatch_khal.slang.worker"], input=b"", capture_output=True,
                          cwd=ROOT, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert proc.returncode == 1 and proc.stdout == b""
