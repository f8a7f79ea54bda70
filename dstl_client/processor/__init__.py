"""Spark's ``StatefulProcessor`` API on the DSTL: timers, TTL and event time in the keyed state.

A processor written for Spark's ``transformWithStateInPandas`` (or
``transformWithState``) runs here with at most its import changed; its state,
timers and TTL index are keyed state rows, logged to the DSTL and
checkpointed with the batch:

* :mod:`.api`: ``StatefulProcessor``, ``TimerValues``, ``ExpiredTimerInfo``;
  :mod:`.handle`: ``StatefulProcessorHandle``; :mod:`.states`: ``ValueState``,
  ``ListState``, ``MapState``.
* :mod:`.schema` (DDL without a JVM) and :mod:`.codec` (a compact binary
  encoding of rows from their schema, no pickle).
* :mod:`.layout` (reserved state names, time encoding), :mod:`.timers`
  (timers and their per-key-group index), :mod:`.ttl` (expiry and cleanup).
* :mod:`.runtime` (one task's variables, timers, TTL), :mod:`.runner` (the
  task's lifecycle, engine-neutral), :mod:`.task` (Spark's ``mapInArrow`` side).
* :mod:`.times` (processing time and watermark from Spark's offsets log),
  :mod:`.transform` (``transform_with_state``, the driver side),
  :mod:`.writer` (the ``writeStream`` builder), :mod:`.sinks`, :mod:`.conf`
  (``spark.dstl.*`` keys), :mod:`.stats` and :mod:`.progress` (per-batch figures).
"""

from dstl_client.processor.api import ExpiredTimerInfo, StatefulProcessor, TimerValues
from dstl_client.processor.handle import StatefulProcessorHandle
from dstl_client.processor.states import ListState, MapState, ValueState
from dstl_client.processor.transform import transform_with_state

__all__ = [
    "ExpiredTimerInfo",
    "ListState",
    "MapState",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "TimerValues",
    "ValueState",
    "transform_with_state",
]
