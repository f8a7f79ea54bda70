"""What hedging decides from: recent attempt latencies and the hedge budget.

:class:`LatencyTracker` gives the adaptive hedge delay (a quantile of recent
successful attempt latencies per size class); :class:`HedgeBudget` bounds
hedges to a fraction of the uploads of a sliding window. Both are used by
:class:`~dstl_server.uploader.UploadExecutor` on the sidecar's event loop.
"""

from __future__ import annotations

import math
import time
from collections import deque

from dstl_server.metrics import size_class
from dstl_server.upload_clock import Clock


class LatencyTracker:
    """Latencies of recent successful attempts, per size class.

    Invariant: each size class (``metrics.size_class``) keeps at most
    ``window`` samples, the newest ones. :meth:`quantile` answers ``None``
    until a class holds ``min_samples`` samples, so a cold start does not
    hedge on two lucky samples. Not thread-safe: event-loop only.
    """

    def __init__(self, window: int = 500, min_samples: int = 20) -> None:
        self.window = window
        self.min_samples = min_samples
        self._samples: dict[str, deque[float]] = {}

    def record(self, nbytes: int, seconds: float) -> None:
        cls = size_class(nbytes)
        samples = self._samples.get(cls)
        if samples is None:
            samples = self._samples[cls] = deque(maxlen=self.window)
        samples.append(seconds)

    def count(self, nbytes: int) -> int:
        samples = self._samples.get(size_class(nbytes))
        return len(samples) if samples is not None else 0

    def quantile(self, nbytes: int, q: float) -> float | None:
        """The nearest-rank ``q`` quantile of the class of ``nbytes``, or None."""
        samples = self._samples.get(size_class(nbytes))
        if samples is None or len(samples) < self.min_samples:
            return None
        ordered = sorted(samples)
        rank = max(1, math.ceil(q * len(ordered)))
        return ordered[rank - 1]


class HedgeBudget:
    """Hedges allowed: at most ``fraction`` of the uploads of the last ``window_s``.

    Counts live in about 60 time buckets of ``window_s / 60`` each (bounded
    memory whatever the rate), on ``clock``. Invariant: :meth:`try_acquire`
    grants a hedge only if, counted over the buckets of the window,
    ``hedges + 1 <= fraction * uploads``. Uploads are counted when they start
    (:meth:`note_upload`), so the upload asking for a hedge counts itself.
    Not thread-safe: event-loop only.
    """

    BUCKETS = 60

    def __init__(self, fraction: float, window_s: float, clock: Clock = time.monotonic) -> None:
        self.fraction = fraction
        self.window_s = window_s
        self._width = window_s / self.BUCKETS
        self._clock = clock
        # [bucket index, uploads, hedges], oldest first
        self._buckets: deque[list[int]] = deque()
        self._uploads = 0
        self._hedges = 0

    def _current(self) -> list[int]:
        index = int(self._clock() // self._width)
        oldest_kept = index - self.BUCKETS + 1
        while self._buckets and self._buckets[0][0] < oldest_kept:
            _, u, h = self._buckets.popleft()
            self._uploads -= u
            self._hedges -= h
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append([index, 0, 0])
        return self._buckets[-1]

    def note_upload(self) -> None:
        self._current()[1] += 1
        self._uploads += 1

    def try_acquire(self) -> bool:
        """Take one hedge from the budget if there is room; False otherwise."""
        bucket = self._current()
        if self._hedges + 1 > self.fraction * self._uploads:
            return False
        bucket[2] += 1
        self._hedges += 1
        return True

    @property
    def uploads(self) -> int:
        self._current()
        return self._uploads

    @property
    def hedges(self) -> int:
        self._current()
        return self._hedges
