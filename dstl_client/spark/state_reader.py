"""Read the state of a retained checkpoint: Python records, or a Spark DataFrame.

The counterpart of Spark's ``statestore`` data source
(``spark.read.format("statestore").load(checkpointLocation)``) for keyed
state on the DSTL. Offline: no query needs to run, but a sidecar must be
reachable, since the state objects are read through it
(:class:`~dstl_client.client.ChangelogClient`; no storage credentials)::

    from dstl_client.spark.state_reader import StateSpec, read_state

    df = read_state(
        spark,
        checkpoint_dir="/ckpt/clicks",       # the query's checkpointLocation
        dstl_address="localhost:7000",       # default: $DSTL_ADDRESS
        serializers={                        # optional, per state name
            "total": INT64,                  # a value (or reducing) state
            "recent": StateSpec.list_state(INT64),
            "pages": StateSpec.map_state(STR, INT64),
        },
    )
    df.where("state_name = 'pages'").show()

:func:`read_state` (a DataFrame) and :func:`iter_state_rows` (a generator of
:class:`StateRow`, no Spark needed) take the same arguments:

* where: ``checkpoint_dir`` (the job's metadata is at ``<checkpoint_dir>/dstl``)
  or ``metadata_url`` (a path, ``file:///...`` or ``s3://bucket/prefix``, as the
  query's ``metadata_url``; S3 credentials from boto3's default chain, endpoint
  and region overridable), ``operator_id`` (default ``"keyed"``) and
  ``batch_id`` (default: the latest retained checkpoint).
* the sidecar: ``dstl_address`` / ``dstl_token`` (default ``$DSTL_ADDRESS`` /
  ``$DSTL_TOKEN``; ``$DSTL_CA_FILE`` turns on TLS, as for tasks).
* ``serializers``: per state name a
  :class:`~dstl_client.state.serializers.Serializer` (a value or reducing
  state, or the values of a map state) or a :class:`StateSpec` (the kind of
  state and its serializers). States not named decode by their recorded
  schema (a processor's states: :mod:`dstl_client.coordinator.state_schemas`,
  values as ``Row``\\ s, a TTL's expiry in ``StateRow.expiry_ms``), else keep
  raw bytes.
* ``key_groups``: only these key groups (default: all).
* ``state_name`` (:func:`read_state` only, Spark's ``stateVarName``): that
  state alone, as typed columns from its recorded schema
  (:func:`typed_schema`: ``key``, ``value`` / ``list_element`` /
  ``user_map_key`` and ``user_map_value``, ``partition_id``, ``key_group``,
  and ``expiration_ms`` with a TTL), as Spark's ``statestore`` source reads a
  ``transformWithState`` state variable.

**Rows** (every state at once). One per stored row of the checkpoint: one per key and value, list
or reducing state, one per key and *entry* of a map state. Columns (the
DataFrame's, and :class:`StateRow`'s fields):

==================  ========  ===================================================
``key_group``       int       the key's group
``key``             string    the key (its bytes as UTF-8; invalid bytes escaped)
``state_name``      string    the state's name
``state_kind``      string    ``value``, ``list``, ``map`` or ``reducing``; null
                              when unknown (see below)
``user_key``        string    a map entry's key, decoded, as JSON text; null for
                              other states or without a key serializer
``value``           string    the decoded value as JSON text (tuples and lists as
                              arrays, a list state's elements as an array,
                              ``Row``\\ s as objects, times as ISO text; what
                              JSON cannot hold as its ``repr``); null without a
                              serializer or recorded schema
``user_key_bytes``  binary    a map entry's key as stored
``value_bytes``     binary    the value as stored (a list's elements
                              length-prefixed, see :mod:`dstl_client.state.changes`)
==================  ========  ===================================================

A row key says which state and key it belongs to, and whether it is a map
entry, but not whether a single row is a value, a list or a reducing state
(they are stored alike): ``state_kind`` is ``"map"`` for map entries, the
kind a :class:`StateSpec` or the recorded schema names, ``"value"`` for a
bare serializer, and null for other states. A serializer that cannot decode a row, or a spec whose kind
contradicts the rows (a map spec for a single row, or the reverse), raises
:class:`~dstl_client.core.errors.InvalidArgument` naming the state, key and
key group. Decoded values are JSON text in the DataFrame because one column
cannot take every state's type: ``F.from_json("value", "array<long>")``
gives typed columns back; :class:`StateRow` holds the Python objects.

**Errors.** :class:`~dstl_client.coordinator.storage.CheckpointMissing`, with
what there is instead: no checkpoint records at the location, an operator the
job does not have (the known ones listed), a batch not retained (the retained
ones listed; older checkpoints were dropped with their objects). Raised by
:func:`read_state` in the caller's process, before Spark plans anything.

**How the DataFrame is built, and why.** :func:`read_state` resolves the
checkpoint record in the caller's process, then reads through a Python data
source (``dstl_state``, :class:`StateDataSource`): its partitions are slices of
the key groups; each Spark task restores its key groups from the sidecar into
a scratch SQLite store on the executor's disk (the code path of a task's
recovery, :func:`~dstl_client.state.restore.restore_range`) and streams them
out as Arrow batches of :data:`CHUNK_ROWS` rows. So no process holds more than
a chunk of rows in memory (nor a scratch store of more than
:data:`RESTORE_KEY_GROUPS` key groups on disk), the read is spread over the
executors, and nothing is left to clean up. Building it from driver-side
chunks (``createDataFrame`` and ``union``) keeps every row in the driver's
JVM; a temporary Parquet copy needs a location every executor can read and
someone to delete it. The price: the DataFrame is evaluated per action, each
re-reading from the sidecar, so ``.cache()`` it when it is queried more than
once, and a checkpoint dropped by a running query meanwhile (``retain``)
fails the next action. The executors reach the sidecar of their node
(``$DSTL_ADDRESS``) or else the given address, like the job's tasks.

The data source can be used directly too, like ``statestore``::

    spark.dataSource.register(StateDataSource)
    spark.read.format("dstl_state").option("batchId", 7).load("/ckpt/clicks")

(options ``metadataUrl``, ``operatorId``, ``batchId``, ``dstlAddress``,
``keyGroups`` (``"0-15,31"``), ``stateVarName``; the token from
``$DSTL_TOKEN``); recorded schemas decode, serializers cannot be given.

**Where the code is**: finding the record (:mod:`.state_location`), decoding
a stored row (:mod:`.state_decode`), reading rows without Spark
(:mod:`.state_rows`), the Spark data source (:mod:`.state_source`); this
module names their public parts.
"""

from __future__ import annotations

import contextlib

from dstl_client.spark.state_decode import SCHEMA_DDL, StateRow, StateSpec
from dstl_client.spark.state_location import (
    CheckpointState,
    load_checkpoint,
    load_state,
    retained_checkpoints,
)
from dstl_client.spark.state_rows import RESTORE_KEY_GROUPS, iter_record_rows, iter_state_rows
from dstl_client.spark.state_source import CHUNK_ROWS, FORMAT, read_state, typed_schema

with contextlib.suppress(ImportError):  # without Spark there is no data source
    from dstl_client.spark.state_source import StateDataSource  # noqa: F401

__all__ = [
    "CHUNK_ROWS",
    "FORMAT",
    "RESTORE_KEY_GROUPS",
    "SCHEMA_DDL",
    "CheckpointState",
    "StateRow",
    "StateSpec",
    "iter_record_rows",
    "iter_state_rows",
    "load_checkpoint",
    "load_state",
    "read_state",
    "retained_checkpoints",
    "typed_schema",
]
