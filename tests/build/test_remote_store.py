"""The shared build cache's stores, against real servers on the loopback address (rclone serving S3
and WebDAV; no mock): what is stored is found, what is damaged, truncated or planted is dropped by
name, and a store that fails (down, slow, denied) costs one warning, never an exception."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Iterator

import pytest

from hatch_khal.config import parse_config
from hatch_khal.errors import ConfigError
from hatch_khal.remote import RemoteCache, remote_cache
from hatch_khal.stores import open_store, requirements
from tests.helpers.stores import Server, Silent

pytest.importorskip("boto3")

KEY = "ab" * 32
OTHER = "cd" * 32
DATA = b"\x7fELF" + bytes(range(256)) * 40


@pytest.fixture(params=["s3", "webdav"])
def server(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    srv = Server(request.param, tmp_path / "store").start()
    for k, v in srv.env().items():
        monkeypatch.setenv(k, v)
    yield srv
    srv.stop()


def _plant(server: Server, name: str, data: bytes) -> None:
    """Write an object through the server, as anyone with write access to the store could."""
    open_store(server.url, where="test").put(name, data)


def _remote(url: str, warnings: list[str], *, read_only: bool = False, timeout: float = 10.0) -> RemoteCache:
    return RemoteCache(open_store(url, where="test", timeout=timeout), read_only=read_only, warn=warnings.append)


def test_an_entry_stored_is_found_verified(server: Server) -> None:
    warnings: list[str] = []
    remote = _remote(server.url, warnings)
    assert remote.fetch(KEY) is None  # absent: no warning
    remote.push(KEY, DATA, "a log line", ("/src/proj/k.cu",))
    entry = remote.fetch(KEY)
    assert entry is not None and entry.data == DATA and entry.log == "a log line"
    assert entry.locations == ("/src/proj/k.cu",)
    assert warnings == [] and (remote.hits, remote.stored) == (1, 1)
    # two objects: the artifact under its digest, the key's record naming it
    (cas,) = server.objects("cas")
    assert cas.name == hashlib.sha256(DATA).hexdigest() and cas.read_bytes() == DATA
    (ac,) = server.objects("ac")
    assert ac.name == KEY and json.loads(ac.read_text())["sha256"] == cas.name


def test_a_truncated_artifact_is_dropped_by_name(server: Server) -> None:
    warnings: list[str] = []
    remote = _remote(server.url, warnings)
    remote.push(KEY, DATA, "")
    (cas,) = server.objects("cas")
    _plant(server, f"v1/cas/{cas.name}", DATA[:100])  # an upload cut short
    assert remote.fetch(KEY) is None
    (w,) = warnings
    assert f"v1/cas/{cas.name}" in w and "truncated" in w and "compiling it again" in w


def test_a_corrupted_artifact_is_dropped_by_name(server: Server) -> None:
    warnings: list[str] = []
    remote = _remote(server.url, warnings)
    remote.push(KEY, DATA, "")
    (cas,) = server.objects("cas")
    _plant(server, f"v1/cas/{cas.name}", DATA[:-1] + b"!")  # same size, other bytes
    assert remote.fetch(KEY) is None
    (w,) = warnings
    assert f"v1/cas/{cas.name}" in w and "sha256" in w


def test_a_planted_record_is_dropped_by_name(server: Server) -> None:
    """A record written for another key (copied over, or planted by hand with a right digest for its
    own artifact) names the key it was made for: refused. One that points at an artifact bigger than
    it says is refused too (nothing is read past the recorded size)."""
    warnings: list[str] = []
    remote = _remote(server.url, warnings)
    remote.push(OTHER, DATA, "")
    (ac,) = server.objects("ac")
    _plant(server, f"v1/ac/{KEY}", ac.read_bytes())  # OTHER's record under KEY
    assert remote.fetch(KEY) is None
    assert f"v1/ac/{KEY}" in warnings[-1] and "another key" in warnings[-1]
    # a record of KEY, well formed, whose artifact was replaced by a larger one
    record = json.loads(ac.read_text())
    record["key"] = KEY
    _plant(server, f"v1/ac/{KEY}", json.dumps(record).encode())
    (cas,) = server.objects("cas")
    _plant(server, f"v1/cas/{cas.name}", DATA + b"payload")
    assert remote.fetch(KEY) is None
    assert f"v1/cas/{cas.name}" in warnings[-1] and "more than" in warnings[-1]
    # not JSON at all
    _plant(server, f"v1/ac/{KEY}", b"\x00garbage")
    assert remote.fetch(KEY) is None
    assert f"v1/ac/{KEY}" in warnings[-1] and "unreadable" in warnings[-1]
    assert len(warnings) == 3 and remote.hits == 0


def test_a_server_that_refuses_writes_is_still_read_and_said_once(server: Server, tmp_path: Path) -> None:
    warnings: list[str] = []
    _remote(server.url, warnings).push(KEY, DATA, "")
    server.stop()
    ro = Server(server.kind, server.root, read_only=True, prefix=server.prefix)
    ro.port = server.port  # the same URL
    ro.start()
    try:
        remote = _remote(server.url, warnings)
        remote.push(OTHER, DATA + b"x", "")
        remote.push("ef" * 32, DATA + b"y", "")
        (w,) = warnings
        assert server.url in w and "this build reads it and stores locally only" in w
        entry = remote.fetch(KEY)  # reads go on
        assert entry is not None and entry.data == DATA
        assert not (server.data / "v1" / "ac" / OTHER).exists() and len(warnings) == 1
    finally:
        ro.stop()


def test_read_only_mode_writes_nothing(server: Server) -> None:
    warnings: list[str] = []
    remote = _remote(server.url, warnings, read_only=True)
    remote.push(KEY, DATA, "")
    assert server.objects("ac") == [] and server.objects("cas") == [] and warnings == []


def test_a_stopped_server_costs_one_warning(server: Server) -> None:
    warnings: list[str] = []
    remote = _remote(server.url, warnings, timeout=2)
    remote.push(KEY, DATA, "")
    server.stop()
    assert remote.fetch(OTHER) is None
    remote.push(OTHER, DATA, "")
    assert remote.fetch(KEY) is None  # no more requests once it failed
    (w,) = warnings
    assert server.url in w and "unusable" in w and "compiling locally" in w


def test_a_slow_server_times_out_once() -> None:
    silent = Silent()
    try:
        warnings: list[str] = []
        remote = _remote(silent.url, warnings, timeout=0.5)
        start = time.monotonic()
        for key in (KEY, OTHER, "ef" * 32):
            assert remote.fetch(key) is None
        remote.push(KEY, DATA, "")
        assert time.monotonic() - start < 5  # one timeout, then no more requests
        (w,) = warnings
        assert "timeout" in w and silent.url in w
    finally:
        silent.close()


def test_wrong_credentials_are_a_denied_store_not_a_failed_build(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    if server.kind != "s3":
        pytest.skip("the WebDAV server here takes no credentials")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    warnings: list[str] = []
    remote = _remote(server.url, warnings)
    assert remote.fetch(KEY) is None
    (w,) = warnings
    assert "denied" in w and "SignatureDoesNotMatch" in w and "wrong" not in w  # the secret is never printed


@pytest.mark.parametrize("url, says", [
    ("s3://AKIA:secret@bucket/prefix", "carries credentials"),
    ("https://user:pw@cache.example/k", "~/.netrc"),
    ("ftp://host/x", "not a store URL"),
    ("s3:///prefix", "names no bucket"),
    ("s3://bucket/p?endpoint=x", "no query"),
])
def test_a_bad_url_is_a_config_error_naming_where(url: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KHAL_CACHE_URL", url)
    with pytest.raises(ConfigError, match="KHAL_CACHE_URL") as info:
        remote_cache(None, print)
    assert says in str(info.value) and "secret" not in str(info.value) and ":pw" not in str(info.value)


def test_the_option_is_checked_and_the_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"crates": [{"name": "k", "sources": ["k/*.cu"]}]}
    with pytest.raises(ConfigError, match="cache-url.*carries credentials"):
        parse_config({**table, "cache-url": "s3://a:b@bucket/x"}, default_package="p")
    cfg, _ = parse_config({**table, "cache-url": "s3://bucket/x"}, default_package="p")
    assert cfg.cache_url == "s3://bucket/x" and requirements(cfg.cache_url) == ["boto3>=1.28"]
    monkeypatch.delenv("KHAL_CACHE_URL", raising=False)
    remote = remote_cache(cfg.cache_url, print)
    assert remote is not None and remote.url == "s3://bucket/x"
    monkeypatch.setenv("KHAL_CACHE_URL", "http://127.0.0.1:9/c")
    remote = remote_cache(cfg.cache_url, print)
    assert remote is not None and remote.url == "http://127.0.0.1:9/c" and requirements(remote.url) == []
    monkeypatch.setenv("KHAL_CACHE_URL", "none")
    assert remote_cache(cfg.cache_url, print) is None
    monkeypatch.setenv("KHAL_CACHE_URL", "s3://bucket/x")
    monkeypatch.setenv("KHAL_NO_CACHE", "1")
    assert remote_cache(None, print) is None
    monkeypatch.delenv("KHAL_NO_CACHE")
    monkeypatch.setenv("KHAL_CACHE_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="KHAL_CACHE_TIMEOUT='soon'"):
        remote_cache(None, print)


def test_the_hook_adds_boto3_to_the_build_for_an_s3_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from hatch_khal.plugin import KhalBuildHook

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").touch()
    meta = SimpleNamespace(core=SimpleNamespace(raw_name="pkg"))

    def deps(**table: str) -> list[str]:
        config = {"crates": [{"name": "a", "sources": ["k/*.cu"]}], **table}
        return KhalBuildHook(str(tmp_path), config, None, meta, str(tmp_path), "wheel").dependencies()

    monkeypatch.delenv("KHAL_CACHE_URL", raising=False)
    assert "boto3>=1.28" not in deps() and "boto3>=1.28" in deps(**{"cache-url": "s3://b/p"})
    assert "boto3>=1.28" not in deps(**{"cache-url": "https://cache.example/k"})
    monkeypatch.setenv("KHAL_CACHE_URL", "s3://b/p")
    assert "boto3>=1.28" in deps()
    monkeypatch.setenv("KHAL_CACHE_URL", "none")
    assert "boto3>=1.28" not in deps(**{"cache-url": "s3://b/p"})


def test_an_http_cache_login_comes_from_netrc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = Server("webdav", tmp_path / "store", login=("khal", "s3cret")).start()
    try:
        warnings: list[str] = []
        monkeypatch.setenv("NETRC", str(tmp_path / "none"))
        _remote(srv.url, warnings).push(KEY, DATA, "")
        assert "denied" in warnings[0] and "401" in warnings[0] and "s3cret" not in warnings[0]
        netrc = tmp_path / "netrc"
        netrc.write_text("machine 127.0.0.1 login khal password s3cret\n")
        netrc.chmod(0o600)
        monkeypatch.setenv("NETRC", str(netrc))
        warnings.clear()
        remote = _remote(srv.url, warnings)
        remote.push(KEY, DATA, "")
        entry = remote.fetch(KEY)
        assert entry is not None and entry.data == DATA and warnings == []
    finally:
        srv.stop()
