"""The launch-memo epoch: one counter that invalidates every remembered launch at once.

The typed call reuses what it packed for a repeated launch (the generated code of
:mod:`khal_runtime.backends.cuda.launchgen`). ``EPOCH[0]`` changes whenever device memory an
earlier launch may have packed a pointer to becomes invalid: a DeviceBuffer freed, the
uniform cache flushed. Each change also clears every registered memo, as (memo list, index
of its valid flag, value that clears it): in ``MEMOS`` for as long as the process runs (a
plan's shared snapshots), in ``THREAD_MEMOS`` for as long as their owner lives (a thread's
slots, owned by an object only that thread's thread-local storage holds, so they go when the
thread ends). A launch that read its arguments before a change stores no memo.

A leaf module: it imports nothing of the project.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["EPOCH", "MEMOS", "THREAD_MEMOS", "bump_epoch", "register_memo"]

EPOCH = [0]
#: (memo, its valid flag: an index of a list or an attribute name, the value that clears it)
MEMOS: list[tuple[Any, int | str, Any]] = []
THREAD_MEMOS: weakref.WeakKeyDictionary[Any, list[tuple[Any, int | str, Any]]] = weakref.WeakKeyDictionary()
# reentrant: taking it can allocate, allocating can collect a dropped DeviceBuffer, and its
# __del__ frees it, which bumps the epoch again in the same thread
_EPOCH_LOCK = threading.RLock()


def bump_epoch() -> None:
    """Invalidate every remembered launch (device memory some of them point at is going)."""
    with _EPOCH_LOCK:  # two racing ``+= 1`` could leave the epoch changed once, not twice
        EPOCH[0] += 1
        for group in (MEMOS, *list(THREAD_MEMOS.values())):
            for memo, flag, reset in group:
                if flag.__class__ is str:
                    setattr(memo, flag, reset)
                else:
                    memo[flag] = reset


def register_memo(memo: Any, flag: int | str, reset: Any = None, owner: Any = None) -> None:
    """Have every bump_epoch() set ``memo[flag]`` (an attribute, for a name) to ``reset`` (while
    ``owner`` lives, if given)."""
    with _EPOCH_LOCK:
        if owner is None:
            MEMOS.append((memo, flag, reset))
        else:
            THREAD_MEMOS.setdefault(owner, []).append((memo, flag, reset))
