"""The shared build cache: a remote store layered under the local cache (:class:`~hatch_khal.cache.Cache`).

Keys are the local cache's (what the compiler read, with the compiler's identity), so a build on
another machine with the same sources and toolchain finds what this one stored. Each entry is two
objects, as in Bazel's remote cache:

* ``v1/cas/<sha256>``: the artifact, named by its own digest;
* ``v1/ac/<key>``: the key's record, JSON: the key, the artifact's sha256 and size, the compiler's
  log and the absolute paths the artifact spells (``__FILE__``).

The artifact is written before its record, each with one ``PUT`` that the store applies whole, so
builders racing on one key each leave a complete entry (the last record wins; both are right).
Before use an entry is verified: the record parses, names its own key, and the artifact's size and
sha256 are the record's. Anything else (a truncated upload, a planted or swapped object) is dropped,
logged by name, and compiled again, never embedded; the compile stage then checks what it takes
from the cache against its job as it checks a local entry (kind, arch, entry symbols and hashes).

A store that fails never fails a build: the first failure (down, slow, full, denied) is said once
and the build goes on locally; a store that refuses writes (read-only credentials, a full bucket,
an error of its own) is still read. ``KHAL_CACHE_READ_ONLY`` makes a build read only (a pull request's CI job).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Callable

from khal_runtime.abi import env_flag

from hatch_khal.hashing import sha256_bytes
from hatch_khal.stores import Store, StoreError, open_store, timeout_from_env

__all__ = ["MAX_ARTIFACT_BYTES", "MAX_RECORD_BYTES", "RemoteCache", "RemoteEntry", "cache_url", "remote_cache"]

_LAYOUT = "v1"
#: a record holds a compiler log: bounded all the same
MAX_RECORD_BYTES = 4 << 20
#: the largest artifact taken from a store (a cubin of a big crate is tens of MB)
MAX_ARTIFACT_BYTES = 1 << 30


@dataclass(frozen=True)
class RemoteEntry:
    data: bytes
    log: str
    locations: tuple[str, ...]


def cache_url(option: str | None) -> tuple[str | None, str]:
    """The remote cache's URL and what gave it: ``KHAL_CACHE_URL`` when set (``none`` turns off the
    option's), else the hook option ``cache-url``."""
    raw = os.environ.get("KHAL_CACHE_URL", "").strip()
    if raw:
        return (None if raw.lower() == "none" else raw), "KHAL_CACHE_URL"
    return (option or None), "option 'cache-url'"


def remote_cache(option: str | None, warn: Callable[[str], None]) -> RemoteCache | None:
    """The remote layer a build uses (None: no URL, or ``KHAL_NO_CACHE``); ConfigError for a URL
    or a ``KHAL_CACHE_TIMEOUT`` that is not one."""
    if env_flag(os.environ.get("KHAL_NO_CACHE"), "KHAL_NO_CACHE"):
        return None
    url, where = cache_url(option)
    if url is None:
        return None
    store = open_store(url, where=where, timeout=timeout_from_env())
    return RemoteCache(store, read_only=env_flag(os.environ.get("KHAL_CACHE_READ_ONLY"), "KHAL_CACHE_READ_ONLY"), warn=warn)


class RemoteCache:
    """Verified reads and writes of cache entries in a :class:`~hatch_khal.stores.Store`; thread-safe."""

    def __init__(self, store: Store, *, read_only: bool = False, warn: Callable[[str], None] = lambda m: None) -> None:
        self.store = store
        self.read_only = read_only
        self._warn = warn
        self._lock = threading.Lock()
        self._down = False  # a failure was said: no more requests in this build
        self._no_writes = read_only
        #: what this build got from the store and gave it
        self.hits = 0
        self.stored = 0
        self.dropped = 0

    @property
    def url(self) -> str:
        return self.store.url

    def _failed(self, exc: StoreError, writing: bool) -> None:
        """Say once what failed. A write refused by a store that answers (denied, full, an error of
        its own) stops the writes: reads go on; a store that does not answer (down, slow) is not
        asked again in this build."""
        with self._lock:
            if self._down:
                return
            if writing and exc.kind not in ("unreachable", "timeout"):
                if self._no_writes:
                    return
                self._no_writes = True
                why = {"denied": "refuses writes", "full": "is full"}.get(exc.kind, "failed a write")
                self._warn(f"khal: remote cache {self.url} {why} ({exc.kind}: {exc}); this build reads it and "
                           "stores locally only")
                return
            self._down = True
            self._warn(f"khal: remote cache {self.url} is unusable ({exc.kind}: {exc}); compiling locally, "
                       "without it for the rest of this build")

    def _drop(self, name: str, why: str) -> None:
        with self._lock:
            self.dropped += 1
        self._warn(f"khal: remote cache {self.url}: entry {name} is {why}; dropped, compiling it again")

    def fetch(self, key: str) -> RemoteEntry | None:
        """The verified entry of ``key``, or None (absent, dropped, or the store failed)."""
        if self._down:
            return None
        name = f"{_LAYOUT}/ac/{key}"
        try:
            raw = self.store.get(name, MAX_RECORD_BYTES)
        except StoreError as exc:
            self._failed(exc, writing=False)
            return None
        if raw is None:
            return None
        if len(raw) > MAX_RECORD_BYTES:
            self._drop(name, f"larger than a record may be ({MAX_RECORD_BYTES} bytes)")
            return None
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:
            self._drop(name, "not a record (unreadable JSON)")
            return None
        if not isinstance(record, dict) or record.get("key") != key:
            self._drop(name, "the record of another key (planted or swapped)")
            return None
        sha, size, log, locations = (record.get("sha256"), record.get("size"), record.get("log", ""),
                                     record.get("locations", []))
        if (not isinstance(sha, str) or len(sha) != 64 or not isinstance(size, int) or not isinstance(log, str)
                or not isinstance(locations, list) or not all(isinstance(x, str) for x in locations)
                or not 0 < size <= MAX_ARTIFACT_BYTES):
            self._drop(name, "a record with missing or malformed fields")
            return None
        blob = f"{_LAYOUT}/cas/{sha}"
        try:
            data = self.store.get(blob, size)
        except StoreError as exc:
            self._failed(exc, writing=False)
            return None
        if data is None:
            self._drop(name, f"a record whose artifact {blob} is missing")
            return None
        if len(data) != size:
            self._drop(blob, f"{'more than ' if len(data) > size else ''}{len(data)} bytes, its record says {size} "
                             f"({'planted or damaged' if len(data) > size else 'truncated'})")
            return None
        if sha256_bytes(data) != sha:
            self._drop(blob, "corrupted (its sha256 is not its record's)")
            return None
        with self._lock:
            self.hits += 1
        return RemoteEntry(data=data, log=log, locations=tuple(locations))

    def push(self, key: str, data: bytes, log: str, locations: tuple[str, ...] = ()) -> None:
        """Store ``data`` under ``key``: the artifact first, then its record (a reader never finds a
        record without its artifact). Nothing in read-only mode or after a failure."""
        if self._down or self._no_writes:
            return
        sha = sha256_bytes(data)
        record: dict[str, object] = {"key": key, "sha256": sha, "size": len(data), "log": log}
        if locations:
            record["locations"] = list(locations)
        try:
            self.store.put(f"{_LAYOUT}/cas/{sha}", data)
            self.store.put(f"{_LAYOUT}/ac/{key}", json.dumps(record, sort_keys=True).encode())
        except StoreError as exc:
            self._failed(exc, writing=True)
            return
        with self._lock:
            self.stored += 1

    def summary(self) -> str:
        mode = " (read only)" if self.read_only else ""
        state = "; unusable, skipped after its first failure" if self._down else ""
        return (f"khal: remote cache {self.url}{mode}: {self.hits} hit(s), {self.stored} stored"
                + (f", {self.dropped} bad entr{'y' if self.dropped == 1 else 'ies'} dropped" if self.dropped else "")
                + state)
