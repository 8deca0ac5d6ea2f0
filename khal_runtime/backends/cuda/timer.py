"""GPU time of launches on CUDA: a pair of events around each, from a pool.

Recorded on the launch's own stream, so nothing is serialised; read lazily by the profiler
(:class:`khal_runtime.tracing.Profiler`): a query when many are pending, a wait only when a
report is asked for.
"""

from __future__ import annotations

import threading
from typing import Any

from khal_runtime.backends.cuda.driver import check, driver

__all__ = ["EventTimer"]


class EventTimer:
    """Event pairs from a pool (one timer per process)."""

    #: how the profile table names where its times come from
    what = "CUDA events"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: list[Any] = []

    def _event(self) -> Any:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        drv = driver()
        return check(drv.cuEventCreate(drv.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

    def start(self, stream: Any) -> Any:
        e0 = self._event()
        driver().cuEventRecord(e0, stream.native)
        return e0

    def stop(self, start: Any, stream: Any) -> tuple[Any, Any]:
        e1 = self._event()
        driver().cuEventRecord(e1, stream.native)
        return (start, e1)

    def elapsed_ms(self, token: tuple[Any, Any], wait: bool) -> float | None:
        """Milliseconds between the pair; None while not finished (``wait`` False); -1 when it
        cannot be read. The pair goes back to the pool once read."""
        e0, e1 = token
        drv = driver()
        if wait:
            drv.cuEventSynchronize(e1)
        elif drv.cuEventQuery(e1)[0]:
            return None
        res = drv.cuEventElapsedTime(e0, e1)
        with self._lock:
            self._pool += [e0, e1]
        return -1.0 if res[0] else float(res[1])
