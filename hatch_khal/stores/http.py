"""An HTTP cache as a cache store: ``GET`` and ``PUT`` of ``<url>/<name>``, with the standard
library's client (urllib: nothing to install, and all an HTTP cache asks for).

The shape ccache's and sccache's HTTP storage use, served by WebDAV servers (Apache ``mod_dav``,
nginx ``dav_methods PUT``, ``rclone serve webdav``) and HTTP caches. ``404`` is "not there". A
WebDAV server answers a ``PUT`` into a collection that does not exist yet with ``409 Conflict``:
the collections are then made (``MKCOL``, from the top) and the ``PUT`` sent again. Credentials
for Basic authentication come from ``~/.netrc`` (or the file ``$NETRC`` names), as curl and pip
read them; never from the URL.
"""

from __future__ import annotations

import base64
import netrc
import os
import socket
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from hatch_khal.stores.base import StoreError, StoreKind

__all__ = ["HttpStore"]


def _authorization(url: str) -> str | None:
    """``Basic ...`` for the URL's host from the netrc file, or None."""
    host = urlsplit(url).hostname or ""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not os.path.isfile(path):
        return None
    try:
        found = netrc.netrc(path).authenticators(host)
    except (netrc.NetrcParseError, OSError):
        return None
    if not found:
        return None
    login, _, password = found
    return "Basic " + base64.b64encode(f"{login}:{password or ''}".encode()).decode()


def _kind(status: int) -> StoreKind:
    if status in (401, 403, 405):
        return "denied"
    if status in (413, 507):
        return "full"
    return "error"


class HttpStore:
    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self._timeout = timeout
        self._auth = _authorization(url)
        self._opener = urllib.request.build_opener(urllib.request.HTTPHandler, urllib.request.HTTPSHandler)

    def _request(self, method: str, name: str, data: bytes | None = None) -> urllib.request.Request:
        """A request for ``name`` under the store's URL (or for an absolute URL)."""
        url = name if "://" in name else f"{self.url}/{name}"
        req = urllib.request.Request(url, data=data, method=method)
        if self._auth:
            req.add_header("Authorization", self._auth)
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream")
        return req

    def _fail(self, exc: BaseException, what: str) -> StoreError:
        if isinstance(exc, urllib.error.HTTPError):
            return StoreError(_kind(exc.code), f"HTTP {exc.code} {exc.reason} ({what})")
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return StoreError("timeout", f"no answer within {self._timeout:g}s ({what})")
        if isinstance(reason, OSError):
            return StoreError("unreachable", f"{reason.strerror or reason} ({what})")
        return StoreError("error", f"{type(exc).__name__}: {exc} ({what})")

    def get(self, name: str, limit: int) -> bytes | None:
        try:
            with self._opener.open(self._request("GET", name), timeout=self._timeout) as resp:
                data: bytes = resp.read(limit + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise self._fail(exc, f"GET {name}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise self._fail(exc, f"GET {name}") from None
        return data

    def _send(self, method: str, name: str, data: bytes | None) -> int:
        """The status of one request; HTTPError (a 4xx / 5xx) passes through."""
        with self._opener.open(self._request(method, name, data), timeout=self._timeout) as resp:
            resp.read()
            return int(resp.status)

    def put(self, name: str, data: bytes) -> None:
        try:
            try:
                self._send("PUT", name, data)
                return
            except urllib.error.HTTPError as exc:
                if exc.code != 409:
                    raise
            # WebDAV: the collections above the name (the URL's own path too) do not exist yet
            split = urlsplit(self.url)
            top = f"{split.scheme}://{split.netloc}"
            parts = [p for p in split.path.split("/") if p] + name.split("/")[:-1]
            for i in range(len(parts)):
                try:
                    self._send("MKCOL", top + "/" + "/".join(parts[: i + 1]) + "/", None)
                except urllib.error.HTTPError as exc:
                    if exc.code not in (405, 409):  # 405: it exists already
                        raise
            self._send("PUT", name, data)
        except (urllib.error.URLError, OSError) as exc:
            raise self._fail(exc, f"PUT {name}") from None
