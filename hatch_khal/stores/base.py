"""What every store is (:class:`Store`) and how one fails (:class:`StoreError`)."""

from __future__ import annotations

from typing import Literal, Protocol

__all__ = ["Store", "StoreError", "StoreKind"]

StoreKind = Literal["unreachable", "timeout", "denied", "full", "error"]


class StoreError(Exception):
    """A store could not do what was asked; ``kind`` says how it failed."""

    def __init__(self, kind: StoreKind, message: str) -> None:
        super().__init__(message)
        self.kind: StoreKind = kind


class Store(Protocol):
    #: the store's URL, for messages (never with credentials)
    url: str

    def get(self, name: str, limit: int) -> bytes | None:
        """The bytes stored under ``name``, read up to ``limit + 1`` (more than ``limit`` bytes back:
        the object is larger), or None when there is none; StoreError when the store fails."""
        ...

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` under ``name``, replacing what is there in one step; StoreError when the
        store fails."""
        ...
