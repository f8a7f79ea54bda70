"""One batch's state changes, applied in bulk: into the store's pending batch and the DSTL.

A change is a row ``(kg, k, v)`` (``v`` null: delete) of :data:`CHANGES`; the
changes of a step are concatenated in the order they take effect (for one
row key the last wins, in the store as in a replay of the log). They are
written to the store's pending batch (``delta``) with
:func:`dstl_client.state.bulk.write_rows` and logged to the DSTL as the
PUT/DELETE records of :mod:`dstl_client.state.changes`, one
``append_packed`` run per key group (:meth:`ChangelogWriter.append_packed`),
encoded by Arrow kernels (no Python per change; row keys of 128 bytes or
more take a Python step each).

The :class:`~dstl_client.state.subtask.Subtask` then persists the log and
commits the pending batch as for every task kind; the backend's figures
(``changes``, ``touched``, ``logged_bytes``) are kept up to date here so its
result reports them. Thread: the task's.
"""

from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dstl_client.state.backend import ChangelogStateBackend
from dstl_client.state.bulk import write_rows
from dstl_client.state.changes import encode_delete, encode_put

CHANGES = pa.schema([("kg", pa.int32(), False), ("k", pa.binary(), False), ("v", pa.binary())])


def changes(kg: pa.Array, k: pa.Array, v: pa.Array | None = None) -> pa.Table:
    """A change table (``v`` ``None``: every row deleted)."""
    if v is None:
        v = pa.nulls(len(k), pa.binary())
    return pa.Table.from_arrays([kg.cast(pa.int32()), k, v.cast(pa.binary())], schema=CHANGES)


def encode_changes(table: pa.Table) -> pa.Array:
    """The logged record of each change: PUT ``0x01 varint(len k) k v`` or DELETE ``0x02 k``."""
    k = table.column("k").combine_chunks()
    v = table.column("v").combine_chunks()
    lengths = pc.binary_length(k).to_numpy(zero_copy_only=False)
    n = len(k)
    if n and int(lengths.max()) >= 0x80:  # long row keys: one Python step each (rare)
        return pa.array(
            [
                encode_delete(kk) if vv is None else encode_put(kk, vv)
                for kk, vv in zip(k.to_pylist(), v.to_pylist(), strict=True)
            ],
            pa.binary(),
        )
    heads = np.empty((n, 2), np.uint8)
    heads[:, 0] = 1
    heads[:, 1] = lengths
    put_head = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(2), n, [None, pa.py_buffer(heads.tobytes())]
    ).cast(pa.binary())
    empty = pa.scalar(b"", pa.binary())
    puts = pc.binary_join_element_wise(put_head, k, v.fill_null(b""), empty)
    deletes = pc.binary_join_element_wise(pa.scalar(b"\x02", pa.binary()), k, empty)
    return pc.if_else(pc.is_valid(v), puts, deletes)


def apply_changes(backend: ChangelogStateBackend, table: pa.Table) -> int:
    """Write ``table``'s changes into the store's pending batch and log them; how many."""
    n: int = table.num_rows
    if not n:
        return 0
    kgs = write_rows(backend.store, table)
    order = pc.sort_indices(table, sort_keys=[("kg", "ascending")])  # stable: order kept per kg
    table = table.take(order)
    records = encode_changes(table)
    offsets = np.frombuffer(records.buffers()[1], np.int32, n + 1, records.offset * 4)
    data = records.buffers()[2]
    sizes = np.diff(offsets).astype(np.uint32)
    kg = table.column("kg").to_numpy()
    bounds = np.flatnonzero(np.diff(kg)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [n]])
    writer = backend.writer
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        run = array("I")
        run.frombytes(sizes[start:end].tobytes())
        lo, hi = int(offsets[start]), int(offsets[end])
        payload = data.slice(lo, hi - lo).to_pybytes() if data is not None else b""
        writer.append_packed(int(kg[start]), run, payload)
    backend.changes += n
    backend.touched.update(kgs)
    backend.logged_bytes += int(offsets[n] - offsets[0])
    return n
