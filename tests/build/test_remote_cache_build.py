"""Builds over the shared build cache, on real servers (rclone serving S3 and WebDAV on the loopback
address): a build whose remote cache is warm compiles nothing; a server stopped mid-build, a planted
entry, a store that refuses writes and two builders racing on one key all end in the right wheel."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from hatch_khal.builder import build_packages
from hatch_khal.cache import Cache
from hatch_khal.remote import remote_cache
from tests.helpers.build import Recorder, _crates
from tests.helpers.projects import make_project
from tests.helpers.stores import Server
from tests.conftest import build_env

pytest.importorskip("boto3")
pytestmark = pytest.mark.needs_nvrtc


@pytest.fixture(params=["s3", "webdav"])
def server(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    srv = Server(request.param, tmp_path / "store").start()
    for k, v in srv.env().items():
        monkeypatch.setenv(k, v)
    yield srv
    srv.stop()


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    srv = Server("s3", tmp_path / "store").start()
    for k, v in srv.env().items():
        monkeypatch.setenv(k, v)
    yield srv
    srv.stop()


def _build(root: Path, local: Path, rep: Recorder | None = None):  # type: ignore[no-untyped-def]
    """``build_packages`` with the local cache ``local`` over the store KHAL_CACHE_URL names."""
    rep = rep or Recorder()
    cache = Cache(local, rep.warn, remote=remote_cache(None, rep.warn))
    result = build_packages(root, _crates(root), rep, cache=cache, jobs=1)
    ((pkg,),) = [result.packages]
    return result, rep, pkg.files


def test_a_build_whose_remote_cache_is_warm_compiles_nothing(server: Server, tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    first, rep1, files1 = _build(root, tmp_path / "local-a")
    assert first.compiled == 4 and rep1.warnings == []  # 2 crates x (PTX + sm_90)
    assert len(server.objects("ac")) == 4 and len(server.objects("cas")) == 4
    # another machine: an empty local cache, the same store
    second, rep2, files2 = _build(root, tmp_path / "local-b")
    assert second.compiled == 0 and second.cached == 4 and rep2.warnings == []
    assert files2 == files1
    assert any("4 hit(s), 0 stored" in line for line in rep2.infos)
    # it kept them locally: a third build on that machine asks the store nothing
    server.stop()
    third, rep3, _ = _build(root, tmp_path / "local-b")
    assert third.compiled == 0 and rep3.warnings == []


def test_a_server_stopped_mid_build_costs_one_warning(s3: Server, tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")

    class StopsTheServer(Recorder):
        def info(self, message: str) -> None:
            super().info(message)
            if "compiled crate 'alpha' for sm_90" in message:
                s3.stop()  # the store goes away between two compiles

    result, rep, files = _build(root, tmp_path / "local", StopsTheServer())
    assert result.compiled == 4
    (w,) = rep.warnings
    assert s3.url in w and "unusable" in w and "compiling locally" in w
    _, _, reference = _build(root, tmp_path / "fresh")  # the same kernels as a build without the store
    assert files == reference


def test_a_planted_entry_is_dropped_by_name_and_compiled_again(s3: Server, tmp_path: Path) -> None:
    """An entry whose digest is right but whose artifact is another job's binary (planted by someone
    with write access, or a swap): its record verifies, the compile stage's check of the binary
    against its job does not; dropped, named, compiled again, never embedded."""
    root = make_project(tmp_path / "p")
    _, _, files = _build(root, tmp_path / "local-a")
    from hatch_khal.stores import open_store

    store = open_store(s3.url, where="test")
    records = {p.name: p.read_bytes() for p in s3.objects("ac")}
    import json

    by_size = sorted(records, key=lambda k: json.loads(records[k])["size"])
    victim, donor = by_size[0], by_size[-1]
    planted = json.loads(records[donor])
    planted["key"] = victim  # a well-formed record of the victim's key, for the donor's artifact
    store.put(f"v1/ac/{victim}", json.dumps(planted).encode())
    result, rep, files2 = _build(root, tmp_path / "local-b")
    assert result.compiled == 1 and result.cached == 3
    (w,) = rep.warnings
    assert f"v1/ac/{victim}" in w and s3.url in w
    assert files2 == files
    # the builder stored the right entry again: the next clean machine compiles nothing
    again, rep3, _ = _build(root, tmp_path / "local-c")
    assert again.compiled == 0 and rep3.warnings == []


def test_read_only_mode_reads_and_never_writes(s3: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_project(tmp_path / "p")
    monkeypatch.setenv("KHAL_CACHE_READ_ONLY", "1")
    result, rep, _ = _build(root, tmp_path / "local-a")
    assert result.compiled == 4 and s3.objects("ac") == [] and rep.warnings == []
    assert any("(read only): 0 hit(s), 0 stored" in line for line in rep.infos)
    monkeypatch.delenv("KHAL_CACHE_READ_ONLY")
    _build(root, tmp_path / "local-b")  # a trusted job fills it
    monkeypatch.setenv("KHAL_CACHE_READ_ONLY", "1")
    result, _, _ = _build(root, tmp_path / "local-c")
    assert result.compiled == 0


RACE = """
import sys, tomllib
from pathlib import Path
from hatch_khal.builder import PrintReporter, build_packages
from hatch_khal.cache import Cache
from hatch_khal.config import parse_config
from hatch_khal.remote import remote_cache
root, local = Path(sys.argv[1]), Path(sys.argv[2])
raw = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["khal"]
rep = PrintReporter()
result = build_packages(root, parse_config(raw, default_package="mini_pkg")[1], rep,
                        cache=Cache(local, rep.warn, remote=remote_cache(None, rep.warn)), jobs=1)
print("done", result.compiled, flush=True)
"""


def test_two_builders_racing_on_one_key(s3: Server, tmp_path: Path) -> None:
    """Two machines (own local caches) build the same sources at once: each key is compiled by one or
    both (the later may find the first's entry already stored: a remote hit), each write is whole,
    both builds succeed, and what the store holds then serves a third."""
    if sys.version_info < (3, 11):
        pytest.skip("the script uses tomllib")
    root = make_project(tmp_path / "p")
    env = build_env(tmp_path / "unused", **s3.env())
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(root), str(tmp_path / f"local-{i}")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert "warning" not in out, out
        done = int(re.search(r"^done (\d+)$", out, re.M).group(1))  # type: ignore[union-attr]
        hits = re.search(r"remote cache .*?: (\d+) hit\(s\)", out)
        # every key compiled here or taken from the other builder's store (whose race is the point)
        assert done + (int(hits.group(1)) if hits else 0) == 4, out
    assert len(s3.objects("ac")) == 4
    result, rep, _ = _build(root, tmp_path / "local-third")
    assert result.compiled == 0 and rep.warnings == []
