"""Keyed state on the DSTL: the state API, serializers, the node-local store, the backends.

How the pieces fit (one keyed operator of a Spark job):

* :mod:`~dstl_client.keygroups`: a key's group is ``crc32(key) % max_parallelism``;
  subtask ``i`` of ``p`` owns a contiguous range of groups.
* :mod:`.api`: ``ValueState``, ``ListState``, ``MapState``, ``ReducingState``
  from a :class:`KeyedContext`, scoped to the current key.
* :mod:`.store`: the working state of a key-group range, in SQLite on the
  node's disk, with the version (batch id, attempt) it is at; a batch is
  written copy-on-write and merged once the driver recorded it.
* :mod:`.backend`: every change applied to that store and appended to the
  DSTL (the changelog backend), tagged with its key group.
* :mod:`.subtask`: one task of one batch: bring the store to the last
  checkpoint (merge, drop or restore), materialize if asked, run the user
  function, persist, commit; with :mod:`.restore` (rebuild a range from a
  checkpoint), :mod:`.materialize` (upload a snapshot in the background),
  :mod:`.clients` (the process's sidecar client, found by
  :mod:`dstl_client.connect`) and :mod:`.store_dirs` (store layout, locks).
* What a task receives from the driver and reports back (the plan, the
  result, the checkpoint record) is :mod:`dstl_client.checkpoint`; this
  package never imports the driver's :mod:`dstl_client.coordinator`.

**Where materialized state goes.** A materialization is a snapshot of the key
groups changed since their last materialization, written *through the
sidecar* like the changelog: a fresh DSTL writer appends every row of those
key groups (as PUT changes) and persists them; the resulting handle is the
*part*. So snapshots live in the same blob store as the changelog
(``file://`` or S3), under the job's prefix, in the same object format with
its per-key-group index: a restoring task reads exactly its key groups with
ranged reads, whatever the parallelism that wrote them. The checkpoint record
maps each key group to its part (re-referenced while the group is unchanged),
the shared state registry counts every object, and the driver discards
objects through the sidecar when no retained checkpoint refers to them. No
second storage system and no storage credentials are needed on executors.
"""

from dstl_client.state.api import (
    KeyedContext,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from dstl_client.state.serializers import (
    BOOL,
    BYTES,
    FLOAT64,
    INT64,
    JSON,
    PICKLE,
    STR,
    Serializer,
    TupleSerializer,
)

__all__ = [
    "BOOL",
    "BYTES",
    "FLOAT64",
    "INT64",
    "JSON",
    "PICKLE",
    "STR",
    "KeyedContext",
    "ListState",
    "MapState",
    "ReducingState",
    "Serializer",
    "TupleSerializer",
    "ValueState",
]
