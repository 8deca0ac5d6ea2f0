"""An S3-compatible object store as a cache store, through boto3.

boto3 because it is what AWS, MinIO, Ceph, Cloudflare R2 and every CI's documentation configure:
credentials, region, endpoint (``AWS_ENDPOINT_URL_S3``), addressing style and retries come from
the places AWS tools read them (environment, ``~/.aws/config`` and ``credentials``, instance and
web-identity roles), so a CI set up for ``aws s3`` works as it is and nothing secret passes
through hatch-khal. One client per store, made on first use (it is thread-safe; making one is not).
An object is written with one ``PutObject``, which S3 applies whole: a reader sees the old
object or the new one, never a mix.
"""

from __future__ import annotations

import threading
from typing import Any

from hatch_khal.stores.base import StoreError, StoreKind

__all__ = ["S3Store"]

_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidToken",
           "ExpiredToken", "AccountProblem", "403", "401"}
_FULL = {"QuotaExceeded", "EntityTooLarge", "InsufficientStorage", "XMinioStorageFull", "507", "413"}
_ABSENT = {"NoSuchKey", "404", "NotFound"}


class S3Store:
    def __init__(self, bucket: str, prefix: str, timeout: float) -> None:
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self._timeout = timeout
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    try:
                        import boto3  # lazy: an optional dependency (hatch-khal[cache]), for s3:// only
                        from botocore.config import Config  # lazy: as above
                    except ImportError:
                        raise StoreError("error", "boto3 is not installed in the build environment (an s3:// cache "
                                         "needs it): install hatch-khal[cache], or add boto3 to the build "
                                         "requirements") from None
                    config = Config(connect_timeout=self._timeout, read_timeout=self._timeout,
                                    retries={"max_attempts": 2, "mode": "standard"})
                    try:
                        self._client = boto3.session.Session().client("s3", config=config)
                    except Exception as exc:  # noqa: BLE001 - a bad profile, region, endpoint: the store fails
                        raise StoreError("error", f"cannot make an S3 client ({type(exc).__name__}: {exc})") from None
        return self._client

    def _error(self, exc: Exception, name: str) -> StoreError | None:
        """The StoreError for a boto3 exception (None: the object does not exist)."""
        # lazy: botocore is imported with boto3 when the client is made
        from botocore.exceptions import (BotoCoreError, ClientError, ConnectTimeoutError, EndpointConnectionError,
                                         NoCredentialsError, ReadTimeoutError)

        kind: StoreKind
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code in _ABSENT or (status == "404" and code not in ("NoSuchBucket",)):
                return None
            kind = "denied" if code in _DENIED or status in _DENIED else "full" if code in _FULL or status in _FULL \
                else "error"
            return StoreError(kind, f"{code or status}: {err.get('Message', '')}".rstrip(": ") + f" ({name})")
        if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError)):
            return StoreError("timeout", f"no answer within {self._timeout:g}s ({type(exc).__name__})")
        if isinstance(exc, EndpointConnectionError):
            return StoreError("unreachable", str(exc))
        if isinstance(exc, NoCredentialsError):
            return StoreError("denied", "no AWS credentials found (environment, ~/.aws, role)")
        if isinstance(exc, BotoCoreError):
            return StoreError("error", f"{type(exc).__name__}: {exc}")
        return StoreError("error", f"{type(exc).__name__}: {exc}")

    def get(self, name: str, limit: int) -> bytes | None:
        s3 = self._s3()
        try:
            obj = s3.get_object(Bucket=self.bucket, Key=self.prefix + name)
            with obj["Body"] as body:
                data: bytes = body.read(limit + 1)
        except Exception as exc:  # noqa: BLE001 - every failure of the store is mapped to its kind
            err = self._error(exc, name)
            if err is None:
                return None
            raise err from None
        return data

    def put(self, name: str, data: bytes) -> None:
        s3 = self._s3()
        try:
            s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)
        except Exception as exc:  # noqa: BLE001 - as in get
            err = self._error(exc, name)
            raise (err or StoreError("error", f"{name}: the bucket {self.bucket!r} does not exist")) from None
