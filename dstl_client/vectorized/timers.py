"""Timers and TTL of vectorized state, as tables (the processor API's semantics).

Timers live in the key group's ``$vtimer-index`` (:mod:`.keys`): one row
``ms key`` per timer, sorted by time, so the due timers of a task are one
range scan per key group of its range, keys without input included.
:func:`due_rows` finds them before the function runs (``expired``); after
it, the registrations are written, then the deletions, then the fired
timers are removed (as the processor API removes a timer once its handler
ran: a due timer registered again in the same batch is removed too).
Registering an existing timer or deleting a missing one changes nothing.

TTL (``state_ttl_ms``): each upsert stores ``expiry = processing time +
TTL`` in the value (:mod:`.values`); a value whose expiry is at or before
the batch's processing time is invisible (``present`` False). Each upsert
also puts ``expiry key`` into the key group's ``$vttl-index`` and removes
the key's entry of its old expiry; after the function, the cleanup pass
scans the due part of the index and deletes the values that really
expired (one updated since has a later expiry and stays). All of it goes
through :mod:`.apply`: logged, checkpointed, restored and rescaled with the
key group. Thread: the task's.
"""

from __future__ import annotations

import pyarrow as pa

from dstl_client.state.store import LocalKeyedStore
from dstl_client.vectorized.keys import index_bound, split_index_rows

#: a table of index rows of a task: ``kg`` (int32), ``ms`` (int64), ``kb`` (key bytes)
INDEX_ROWS = pa.schema([("kg", pa.int32()), ("ms", pa.int64()), ("kb", pa.binary())])


def due_rows(store: LocalKeyedStore, prefix: bytes, up_to_ms: int) -> pa.Table:
    """The index rows at or before ``up_to_ms`` of every key group of the store's range,
    by key group, then time, then key (the pending batch applied)."""
    end = index_bound(prefix, up_to_ms)
    kgs: list[int] = []
    rows: list[bytes] = []
    for kg in store.kg_range:
        found = store.scan_range(kg, prefix, end, True)
        if found:
            keys = sorted(found)
            rows.extend(keys)
            kgs.extend([kg] * len(keys))
    ms, kb = split_index_rows(prefix, pa.array(rows, pa.binary()))
    return pa.Table.from_arrays([pa.array(kgs, pa.int32()), ms, kb], schema=INDEX_ROWS)
