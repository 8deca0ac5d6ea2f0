"""The build process's side of the Slang worker (:mod:`hatch_khal.slang.worker`).

One :class:`WorkerClient` per crate: it starts ``python -m hatch_khal.slang.worker``, exchanges the
two JSON messages of the protocol and turns a dead worker (a crash in ``spCompile``, a kill) into
one :class:`~hatch_khal.errors.CompileError` that names the crate and says the Slang compiler
crashed, with the worker's last words.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

from hatch_khal.errors import CompileError, KhalBuildError
from hatch_khal.slang.worker import PARENT_ENV

__all__ = ["SlangCrashed", "WorkerClient"]


class SlangCrashed(CompileError):
    """The Slang compiler process died (``spCompile`` crashed, or it was killed)."""


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class WorkerClient:
    """A running worker for one crate; use as a context manager (the process is always reaped)."""

    def __init__(self, crate: str, slang_version: str) -> None:
        self.crate = crate
        self.slang_version = slang_version
        self.stage = "starting"
        env = dict(os.environ)
        # the child sees what this process sees (an isolated build env is only on sys.path)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env[PARENT_ENV] = str(os.getpid())
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hatch_khal.slang.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
        )

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - the worker exits on stdin EOF
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()

    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode("utf-8", "replace")[-3000:].strip()
        except (OSError, ValueError):
            return ""

    def _crashed(self) -> SlangCrashed:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        tail = self._stderr_tail()
        return SlangCrashed(
            f"crate {self.crate!r}: the Slang compiler crashed while {self.stage} ({_exit_reason(code)}). "
            f"This is a bug in Slang {self.slang_version}, triggered by this crate's sources; the build "
            "cannot go on. Simplify the construct the message points at (or the last edit), or report it "
            "to the Slang project with the sources."
            + (f"\nworker output:\n{tail}" if tail else "")
        )

    def ask(self, message: dict[str, Any], stage: str) -> dict[str, Any]:
        """Send one message, read one answer; SlangCrashed if the worker dies meanwhile."""
        self.stage = stage
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._crashed() from None
        line = self.proc.stdout.readline()
        if not line:
            raise self._crashed()
        try:
            answer = json.loads(line)
        except ValueError:
            raise KhalBuildError(f"crate {self.crate!r}: the Slang worker answered garbage: {line[:200]!r}") from None
        if not isinstance(answer, dict):
            raise KhalBuildError(f"crate {self.crate!r}: the Slang worker answered {type(answer).__name__}")
        return answer
