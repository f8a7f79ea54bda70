"""What one call of the user's function changes, as change tables (:mod:`.apply`).

:meth:`StateUpdate.changes` turns a :class:`~.api.BatchOutput` into the
batch's changes, in the order they take effect: the upserted state rows,
the deleted ones, the TTL index entries of the old expiries removed and of
the new ones added, the timers registered, the timers deleted, the fired
timers removed (semantics in :mod:`.timers`). :meth:`StateUpdate.ttl_cleanup`
is the TTL pass after them. Every key named by the function gets its key
group from the known keys (or ``crc32``: :func:`~.keys.lookup_key_groups`).
One instance per task and batch; the task's thread.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.core.errors import InvalidArgument
from dstl_client.state.bulk import read_rows
from dstl_client.state.store import LocalKeyedStore
from dstl_client.vectorized.api import TIMESTAMP, BatchOutput
from dstl_client.vectorized.apply import CHANGES, changes
from dstl_client.vectorized.frames import table_of
from dstl_client.vectorized.keys import (
    MAX_MS,
    TIMER_INDEX_PREFIX,
    TTL_INDEX_PREFIX,
    index_row_keys,
    key_bytes_of,
    lookup_key_groups,
    state_row_keys,
)
from dstl_client.vectorized.spec import VectorSpec
from dstl_client.vectorized.timers import due_rows
from dstl_client.vectorized.values import ValueCodec


class StateUpdate:
    """The changes of one task's batch (see the module). Thread: the task's."""

    def __init__(
        self,
        spec: VectorSpec,
        codec: ValueCodec,
        store: LocalKeyedStore,
        known_kb: pa.Array,
        known_kg: pa.Array,
        now_ms: int,
        max_parallelism: int,
    ) -> None:
        self.spec = spec
        self.codec = codec
        self.store = store
        self.known_kb = known_kb
        self.known_kg = known_kg
        self.now_ms = now_ms
        self.max_parallelism = max_parallelism

    def _keys(self, table: pa.Table) -> tuple[pa.Array, pa.Array]:
        """``(key bytes, key groups)`` of a returned table's key column."""
        kb = key_bytes_of(table.column(self.spec.key))
        kg = lookup_key_groups(
            kb,
            self.known_kb,
            self.known_kg,
            self.store.kg_range,
            self.max_parallelism,
        )
        return kb, kg

    def changes(self, out: BatchOutput, due: pa.Table) -> pa.Table:
        """The batch's changes from what the function returned and the fired timers ``due``."""
        spec = self.spec
        parts: list[pa.Table] = []
        ups = table_of(out.upserts, "upserts", spec.upsert_fields)
        dels = table_of(out.deletes, "deletes", [spec.key_field])
        ttl = spec.ttl_ms is not None
        expiry = MAX_MS if spec.ttl_ms is None else self.now_ms + spec.ttl_ms
        up_kb = up_kg = del_kb = del_kg = None
        if ups is not None and ups.num_rows:
            up_kb, up_kg = self._keys(ups)
            state = ups.select([f.name for f in spec.state_schema])
            values = self.codec.encode(state, np.full(ups.num_rows, expiry, np.int64))
            parts.append(changes(up_kg, state_row_keys(up_kb), values))
        if dels is not None and dels.num_rows:
            del_kb, del_kg = self._keys(dels)
            parts.append(changes(del_kg, state_row_keys(del_kb)))
        if ttl:
            parts += self._ttl_index(up_kb, up_kg, del_kb, del_kg, expiry)
        for what, value in (("timers", out.timers), ("timer_deletes", out.timer_deletes)):
            timers = table_of(value, what, spec.timer_fields)
            if timers is None or not timers.num_rows:
                continue
            if spec.time_mode == "None":
                raise InvalidArgument(
                    f"BatchOutput.{what}: timers need time mode ProcessingTime or EventTime"
                )
            kb, kg = self._keys(timers)
            rows = index_row_keys(TIMER_INDEX_PREFIX, timers.column(TIMESTAMP), kb)
            empty = pa.array([b""] * len(rows), pa.binary()) if what == "timers" else None
            parts.append(changes(kg, rows, empty))
        if due.num_rows:
            fired = index_row_keys(TIMER_INDEX_PREFIX, due.column("ms"), due.column("kb"))
            parts.append(changes(due.column("kg").combine_chunks(), fired))
        return pa.concat_tables(parts) if parts else CHANGES.empty_table()

    def _ttl_index(
        self,
        up_kb: pa.Array | None,
        up_kg: pa.Array | None,
        del_kb: pa.Array | None,
        del_kg: pa.Array | None,
        expiry: int,
    ) -> list[pa.Table]:
        """The TTL index changes: old entries of the written keys out, the upserts' new in."""
        kb = [a for a in (up_kb, del_kb) if a is not None]
        kg = [a for a in (up_kg, del_kg) if a is not None]
        if not kb:
            return []
        all_kb, all_kg = pa.concat_arrays(kb), pa.concat_arrays(kg)
        old = read_rows(self.store, pa.table({"kg": all_kg, "k": state_row_keys(all_kb)}))
        _, had, old_expiry = self.codec.decode(old.column("v").combine_chunks())
        stale = had & (old_expiry != MAX_MS) & (old_expiry != expiry)
        mask = pa.array(stale, pa.bool_())
        out = [
            changes(
                all_kg.filter(mask),
                index_row_keys(
                    TTL_INDEX_PREFIX,
                    pa.array(old_expiry, pa.int64()).filter(mask),
                    all_kb.filter(mask),
                ),
            )
        ]
        if up_kb is not None and up_kg is not None:
            n = len(up_kb)
            rows = index_row_keys(TTL_INDEX_PREFIX, pa.array(np.full(n, expiry, np.int64)), up_kb)
            out.append(changes(up_kg, rows, pa.array([b""] * n, pa.binary())))
        return out

    def ttl_cleanup(self) -> tuple[pa.Table, int]:
        """The cleanup pass: the due TTL index entries removed, the values that really expired
        deleted; ``(changes, values deleted)``. Run after :meth:`changes` was applied."""
        due = due_rows(self.store, TTL_INDEX_PREFIX, self.now_ms)
        if not due.num_rows:
            return CHANGES.empty_table(), 0
        kg = due.column("kg").combine_chunks()
        kb = due.column("kb").combine_chunks()
        entries = changes(kg, index_row_keys(TTL_INDEX_PREFIX, due.column("ms"), kb))
        current = read_rows(self.store, pa.table({"kg": kg, "k": state_row_keys(kb)}))
        _, had, expiry = self.codec.decode(current.column("v").combine_chunks())
        gone = pa.array(had & (expiry <= self.now_ms), pa.bool_())
        gone_kb = kb.filter(gone)
        first = pc.index_in(pc.unique(gone_kb), value_set=gone_kb)
        gone_kb, gone_kg = gone_kb.take(first), kg.filter(gone).take(first)
        values = changes(gone_kg, state_row_keys(gone_kb))
        return pa.concat_tables([entries, values]), len(gone_kb)
