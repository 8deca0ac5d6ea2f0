"""A content-addressed compile cache, safe under concurrent builds.

Layout: ``<dir>/v1/<key[:2]>/<key>/{artifact.bin,meta.json}``; ``meta.json`` holds the sha256, size,
compiler log and, for an artifact that spells an absolute path (``__FILE__``), those locations. An entry is
written into a temporary directory and renamed into place, so a build killed
mid-write leaves no partial entry; a per-key file lock keeps two builds from
compiling the same thing twice; every hit is re-hashed, and a damaged entry is
dropped and rebuilt. A cache location that cannot be written (the root, a fan-out
folder that is a file or read-only, an entry that cannot be read) degrades to no cache
for what it affects, with one warning per kind of problem; it never fails a build.

A remote store (:class:`hatch_khal.remote.RemoteCache`: ``KHAL_CACHE_URL``) is layered under it,
under the same keys: a local miss is looked up there (verified) and kept locally; what is
stored goes to both.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from filelock import FileLock, Timeout

from khal_runtime.abi import env_flag

from hatch_khal.hashing import sha256_bytes

if TYPE_CHECKING:
    from hatch_khal.remote import RemoteCache

__all__ = ["Cache", "CachedArtifact", "default_cache_dir"]

_LAYOUT = "v1"


def default_cache_dir() -> Path | None:
    """``KHAL_CACHE_DIR``, else ``$XDG_CACHE_HOME/hatch-khal``, else ``~/.cache/hatch-khal``.

    ``KHAL_NO_CACHE`` turns the cache off: a boolean (:func:`khal_runtime.abi.env_flag`: ``1``,
    ``true``, ``yes``, ``on`` are on; unset, empty, ``0``, ``false``, ``no``, ``off`` are off; any
    other value is an error).
    """
    if env_flag(os.environ.get("KHAL_NO_CACHE"), "KHAL_NO_CACHE"):
        return None
    explicit = os.environ.get("KHAL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hatch-khal"


@dataclass(frozen=True)
class CachedArtifact:
    data: bytes
    log: str
    hit: bool
    #: the absolute paths the artifact spells (``__FILE__``): it is an output for those locations only
    locations: tuple[str, ...] = ()


class Cache:
    def __init__(self, root: Path | None, warn: Callable[[str], None] = lambda m: None,
                 remote: RemoteCache | None = None) -> None:
        self._warn = warn
        self._warned: set[str] = set()
        #: the shared store under this cache (None: local only)
        self.remote = remote
        #: keys the remote had not: not asked again in this build (a build looks a miss up twice)
        self._remote_missed: set[str] = set()
        #: keys whose entry came from the remote in this build (a drop names the remote)
        self._from_remote: set[str] = set()
        self.root: Path | None = None
        if root is not None:
            try:
                (root / _LAYOUT).mkdir(parents=True, exist_ok=True)
                probe = tempfile.NamedTemporaryFile(dir=root / _LAYOUT, prefix=".probe-", delete=True)
                probe.close()
                self.root = root / _LAYOUT
            except OSError as exc:
                warn(f"khal cache at {root} is not writable ({exc.strerror or exc}); building without a cache")

    def warn(self, message: str, kind: str | None = None) -> None:
        """Warn once per ``kind`` (every message when None)."""
        if kind is not None:
            if kind in self._warned:
                return
            self._warned.add(kind)
        self._warn(message)

    def _unusable(self, what: str, path: Path, exc: OSError) -> None:
        self.warn(f"khal cache: cannot {what} {path} ({exc.strerror or exc}); compiling without the cache "
                  "for the entries there", kind=what)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def _dir(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / key

    def _read(self, key: str) -> CachedArtifact | None:
        d = self._dir(key)
        try:
            meta = json.loads((d / "meta.json").read_text("utf-8"))
            data = (d / "artifact.bin").read_bytes()
        except FileNotFoundError:
            return None
        except ValueError:
            self.drop(key, "unreadable; rebuilding it")
            return None
        except OSError as exc:  # a fan-out folder that is a file, no permission, ...
            self._unusable("read", d, exc)
            return None
        if not isinstance(meta, dict) or meta.get("sha256") != sha256_bytes(data) or meta.get("size") != len(data):
            self.drop(key, "corrupted (sha256 mismatch); rebuilding it")
            return None
        locations = meta.get("locations", [])
        if not isinstance(locations, list) or not all(isinstance(x, str) for x in locations):
            self.drop(key, "unreadable (its locations); rebuilding it")
            return None
        return CachedArtifact(data=data, log=str(meta.get("log", "")), hit=True, locations=tuple(locations))

    def drop(self, key: str, why: str) -> None:
        """Remove a damaged entry, saying why (``why`` ends the warning)."""
        if key in self._from_remote and self.remote is not None:
            self._from_remote.discard(key)
            self._remote_missed.add(key)  # not asked again: it is compiled and stored anew
            self.warn(f"khal: remote cache {self.remote.url}: entry v1/ac/{key} is {why}")
        elif self.root is None:
            return
        else:
            self.warn(f"khal cache entry {key[:12]} is {why}")
        if self.root is not None:
            shutil.rmtree(self._dir(key), ignore_errors=True)

    def _write(self, key: str, data: bytes, log: str, locations: tuple[str, ...]) -> None:
        final = self._dir(key)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
        except OSError as exc:
            self._unusable("write to", final.parent, exc)
            return
        try:
            (tmp / "artifact.bin").write_bytes(data)
            meta: dict[str, object] = {"sha256": sha256_bytes(data), "size": len(data), "log": log}
            if locations:
                meta["locations"] = list(locations)
            (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True), "utf-8")
            if final.exists():
                shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except OSError as exc:
            self._unusable("store an entry in", final.parent, exc)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        lock_path = self._dir(key).parent / f"{key}.lock"
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(lock_path), timeout=600)
            lock.acquire()
        except (OSError, Timeout) as exc:
            self.warn(f"khal cache lock {lock_path} unavailable ({exc}); compiling without it", kind="lock")
            yield
            return
        try:
            yield
        finally:
            lock.release()

    def lookup(self, key: str) -> CachedArtifact | None:
        """The verified cached artifact for ``key``, or None (a damaged entry is dropped): the local
        cache's, else the remote's (verified, then kept locally)."""
        hit = None if self.root is None else self._read(key)
        if hit is not None or self.remote is None or key in self._remote_missed:
            return hit
        entry = self.remote.fetch(key)
        if entry is None:
            self._remote_missed.add(key)
            return None
        self._from_remote.add(key)
        if self.root is not None:
            self._write(key, entry.data, entry.log, entry.locations)
        return CachedArtifact(data=entry.data, log=entry.log, hit=True, locations=entry.locations)

    def store(self, key: str, data: bytes, log: str, locations: tuple[str, ...] = ()) -> None:
        """Keep ``data`` under ``key``; ``locations``: the absolute paths it spells (a hit elsewhere
        is no hit: :attr:`CachedArtifact.locations`). The remote gets it too (unless read only)."""
        if self.root is not None:
            self._write(key, data, log, tuple(locations))
        if self.remote is not None:
            self._from_remote.discard(key)
            self.remote.push(key, data, log, tuple(locations))

    @contextmanager
    def locked(self, keys: Iterable[str]) -> Iterator[None]:
        """Hold the per-key locks of ``keys`` (taken in sorted order, so builds cannot deadlock).

        A second build that wants the same keys waits here, then finds them cached.
        """
        if self.root is None:
            yield
            return
        with ExitStack() as stack:
            for key in sorted(set(keys)):
                stack.enter_context(self._lock(key))
            yield
