"""`WarmupProgress`: how far a warm-up is, read from other threads (a server's `/health`).

`Engine.warmup` says how many step programs it warms (`begin`); the runner counts each one as it
is ready, loaded from the step store or compiled (`ready`). A server thread reads `snapshot()`
while the engine thread warms up.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class WarmupProgress:
    """Programs a warm-up has made ready out of its total, and since when it runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = self._loaded = self._compiled = self._ran = 0
        self._started: float | None = None
        self._finished: float | None = None

    def begin(self, total: int) -> None:
        """A warm-up of `total` programs starts (a later one adds its own)."""
        with self._lock:
            self._total += total
            if self._started is None or self._finished is not None:
                self._started = time.perf_counter()
            self._finished = None

    def ready(self, count: int = 1, *, loaded: bool = False, compiled: bool = False) -> None:
        """`count` programs are ready: `loaded` from the step store, `compiled` now, or neither
        (ready before this warm-up)."""
        with self._lock:
            self._loaded += count * loaded
            self._compiled += count * compiled
            self._ran += count

    def finish(self) -> None:
        with self._lock:
            self._finished = time.perf_counter()

    def snapshot(self) -> dict[str, Any]:
        """{"programs_ready", "programs_total", "loaded", "compiled", "seconds"} now."""
        with self._lock:
            end = self._finished if self._finished is not None else time.perf_counter()
            seconds = 0.0 if self._started is None else end - self._started
            return {
                "programs_ready": self._ran,
                "programs_total": self._total,
                "loaded": self._loaded,
                "compiled": self._compiled,
                "seconds": round(seconds, 1),
            }
