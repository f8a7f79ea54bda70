"""The processor API, with Spark's names and meaning (``pyspark.sql.streaming.stateful_processor``).

A processor written for Spark's ``transformWithStateInPandas`` (or
``transformWithState``) runs on dstl with at most its import changed::

    from dstl_client.processor import StatefulProcessor, StatefulProcessorHandle

    class CountPerUser(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):
            n = self.count.get()[0] if self.count.exists() else 0
            for pdf in rows:
                n += len(pdf)
            self.count.update((n,))
            yield pd.DataFrame({"user": [key[0]], "count": [n]})

(a processor deriving from Spark's own ``StatefulProcessor`` runs too: the
runtime calls these methods and nothing else). Per task of a batch the
runtime calls ``init(handle)`` once, ``handleInitialState`` for initial state
rows (first batch only), ``handleInputRows`` once per key with input, then
``handleExpiredTimer`` once per expired timer in timestamp order, then
``close()``. ``key`` is a tuple of the grouping key's values, as in Spark.

:class:`TimerValues` and :class:`ExpiredTimerInfo` are immutable values, safe
from any thread; a processor instance belongs to one task's thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dstl_client.processor.handle import StatefulProcessorHandle

#: the time modes of Spark's ``transformWithState`` (``timeMode=``), case-insensitive
TIME_MODES = ("None", "ProcessingTime", "EventTime")


def time_mode_of(value: str) -> str:
    """``value`` spelt as in :data:`TIME_MODES`; :class:`ValueError` for another one."""
    for mode in TIME_MODES:
        if value.lower() == mode.lower():
            return mode
    raise ValueError(f"time mode {value!r}: use one of {', '.join(TIME_MODES)}")


class TimerValues:
    """Processing time and watermark of the current batch, in ms (``-1``: not in this mode).

    The same values for every call of a batch. Immutable: any thread.
    """

    __slots__ = ("_processing_ms", "_watermark_ms")

    def __init__(self, currentProcessingTimeInMs: int = -1, currentWatermarkInMs: int = -1) -> None:
        self._processing_ms = currentProcessingTimeInMs
        self._watermark_ms = currentWatermarkInMs

    def getCurrentProcessingTimeInMs(self) -> int:
        """The batch's processing time (Spark's batch timestamp), the same for every call."""
        return self._processing_ms

    def getCurrentWatermarkInMs(self) -> int:
        """The event-time watermark timers of this batch fire at."""
        return self._watermark_ms

    def __repr__(self) -> str:
        return f"TimerValues(processing={self._processing_ms}, watermark={self._watermark_ms})"


class ExpiredTimerInfo:
    """The expired timer a ``handleExpiredTimer`` call is for. Immutable: any thread."""

    __slots__ = ("_expiry_ms",)

    def __init__(self, expiryTimeInMs: int = -1) -> None:
        self._expiry_ms = expiryTimeInMs

    def getExpiryTimeInMs(self) -> int:
        return self._expiry_ms

    def __repr__(self) -> str:
        return f"ExpiredTimerInfo(expiry={self._expiry_ms})"


class StatefulProcessor(ABC):
    """Keyed stateful logic over a stream (Spark's ``StatefulProcessor``).

    Input rows are pandas DataFrames (``transformWithStateInPandas`` style,
    the default) or ``Row``\\ s (``transformWithState`` style), and so are
    the outputs: an iterator of DataFrames, or of Rows (tuples and dicts work too).
    One instance per task: attributes set in :meth:`init` live for one batch
    of one partition; what must outlive it goes into the handle's state.
    The runtime calls it from the task's thread only.
    """

    @abstractmethod
    def init(self, handle: StatefulProcessorHandle) -> None:
        """Get the state variables (and delete retired ones) from ``handle``."""

    @abstractmethod
    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        """The input of one key in this batch; returns (yields) output rows or DataFrames."""

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        """A timer of ``key`` expired; may output rows, change state, register timers."""
        return iter(())

    def close(self) -> None:  # noqa: B027 - optional, as in Spark
        """The task is done with this instance."""

    def handleInitialState(  # noqa: B027 - optional, as in Spark
        self, key: Any, initialState: Any, timerValues: TimerValues
    ) -> None:
        """One key's initial state (a DataFrame, or one Row), first batch only, before its input."""
