"""Remote stores for the shared build cache (``KHAL_CACHE_URL`` / option ``cache-url``).

A store is a flat map of names (``v1/ac/<key>``, ``v1/cas/<sha256>``) to bytes, with two
operations, :meth:`Store.get` and :meth:`Store.put`; what is kept there and how it is checked is
:mod:`hatch_khal.remote`'s. Two kinds, chosen by the URL's scheme:

* ``s3://bucket/prefix``: an S3-compatible object store through boto3 (:mod:`hatch_khal.stores.s3`),
  credentials, region and endpoint the way every AWS tool finds them (environment, ``~/.aws``,
  instance roles; ``AWS_ENDPOINT_URL_S3`` for MinIO, Ceph, R2, ...);
* ``http://host/path`` / ``https://...``: an HTTP cache that takes ``PUT`` and ``GET`` (WebDAV,
  nginx with ``dav_methods PUT``, the HTTP storage of ccache and sccache); credentials from
  ``~/.netrc`` (or ``$NETRC``) (:mod:`hatch_khal.stores.http`).

Credentials never appear in the URL (a URL with ``user:password@`` is refused), so neither a
manifest nor a log line can carry them. Every failure of a store is a :class:`StoreError` with a
kind (``unreachable``, ``timeout``, ``denied``, ``full``, ``error``); the caller decides what a
failure means (never a failed build).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from hatch_khal.errors import ConfigError
from hatch_khal.stores.base import Store, StoreError, StoreKind

__all__ = ["DEFAULT_TIMEOUT", "Store", "StoreError", "StoreKind", "check_url", "open_store", "requirements", "timeout_from_env"]

#: seconds a store may take to connect or to answer one request (``KHAL_CACHE_TIMEOUT``)
DEFAULT_TIMEOUT = 10.0

#: the client library a scheme needs in the build environment (the hook adds it to isolated builds)
_REQUIREMENTS = {"s3": "boto3>=1.28"}


def timeout_from_env() -> float:
    """``KHAL_CACHE_TIMEOUT``: seconds per request (default :data:`DEFAULT_TIMEOUT`)."""
    raw = os.environ.get("KHAL_CACHE_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"KHAL_CACHE_TIMEOUT={raw!r} is not a positive number of seconds (how long the remote "
                          "cache may take to answer one request); set it to e.g. 10, or unset it")
    return value


def check_url(url: str, where: str) -> tuple[str, str, str]:
    """(scheme, location, path) of a store URL; ConfigError naming ``where`` otherwise."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("s3", "http", "https"):
        raise ConfigError(f"{where} = {url!r}: not a store URL; use s3://bucket/prefix (an S3-compatible object "
                          "store) or http(s)://host/path (an HTTP / WebDAV cache)")
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{where}: the URL carries credentials (user:password@); they would end up in logs. "
                          + ("Give them the way AWS tools read them: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                             "~/.aws/credentials or a role" if scheme == "s3" else
                             "Put them in ~/.netrc (or the file $NETRC names): machine HOST login USER password PASS")
                          + ", and write the URL without them")
    if parts.query or parts.fragment:
        raise ConfigError(f"{where} = {url!r}: a store URL takes no query or fragment (the S3 endpoint comes from "
                          "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL or ~/.aws/config)")
    if not parts.hostname:
        raise ConfigError(f"{where} = {url!r}: names no " + ("bucket (s3://bucket/prefix)" if scheme == "s3"
                                                             else "host (http://host/path)"))
    return scheme, parts.netloc, parts.path.strip("/")


def requirements(url: str | None) -> list[str]:
    """What the build environment needs to reach the store ``url`` (none for HTTP: the standard
    library's)."""
    if not url:
        return []
    scheme = urlsplit(url).scheme.lower()
    req = _REQUIREMENTS.get(scheme)
    return [req] if req else []


def open_store(url: str, *, where: str, timeout: float = DEFAULT_TIMEOUT) -> Store:
    """The store ``url`` names (nothing is sent yet); ConfigError for a URL that names none.
    ``where``: what to name in errors (the option or variable that gave the URL)."""
    scheme, location, path = check_url(url, where)
    if scheme == "s3":
        from hatch_khal.stores.s3 import S3Store  # lazy: boto3, only for an s3:// cache

        return S3Store(bucket=location, prefix=path, timeout=timeout)
    from hatch_khal.stores.http import HttpStore  # lazy: only for an http(s):// cache

    return HttpStore(f"{scheme}://{location}/{path}".rstrip("/"), timeout=timeout)
