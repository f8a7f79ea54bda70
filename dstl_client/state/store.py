"""The node-local keyed store: one SQLite database per key-group range.

Python worker memory is no home for state (tasks take any idle worker, idle
workers die after 60 s), so the working state of a key-group range lives on
the node's disk, where any task on the node finds it, and carries the version
(batch id) it is at.

Layout of one store (a directory ``<state_dir>/<job>/<operator>/kg-<first>-<last>``):

* ``kv``: the state as of ``main_version`` (the last batch known committed).
* ``delta``: the writes of one later batch (``delta_version``), not yet known
  to be committed. The next task merges it into ``kv`` when the driver says
  that batch was committed, or drops it when the batch is re-run. So a batch
  is applied copy-on-write on top of version N-1, and a retried or re-run
  batch starts again from N-1.
* ``kg_changed``: the last batch that changed each key group (for
  incremental materialization: a key group unchanged since its last
  materialization is re-referenced, not uploaded).
* ``segments``: SQN range of each batch in the changelog writer (for
  truncation).
* ``meta``: versions, task attempt ids, the changelog writer's log id.

A version is identified by ``(batch id, attempt id)``: the driver records
the attempt whose results it committed, so a store written by a failed or
zombie attempt is never mistaken for the committed state.

One task at a time holds a store (an exclusive ``flock`` on its lock file,
see :mod:`.store_dirs`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from operator import itemgetter
from pathlib import Path

from dstl_client.keygroups import KeyGroupRange
from dstl_client.state import packed_rows as packed
from dstl_client.state.changes import prefix_end
from dstl_client.state.packed_rows import PackedKeys, PackedRows
from dstl_client.state.store_dirs import lock_file

#: rows per executemany call when bulk writing
_CHUNK = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    kg INTEGER NOT NULL, k BLOB NOT NULL, v BLOB NOT NULL, PRIMARY KEY (kg, k)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS delta (
    kg INTEGER NOT NULL, k BLOB NOT NULL, v BLOB, PRIMARY KEY (kg, k)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kg_changed (kg INTEGER PRIMARY KEY, batch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS segments (
    batch INTEGER PRIMARY KEY, log_id TEXT NOT NULL, start_sqn INTEGER NOT NULL,
    end_sqn INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

NO_VERSION = -1


class LocalKeyedStore:
    """One key-group range's state on local disk. Not thread-safe: one task owns it."""

    def __init__(
        self,
        directory: str | Path,
        kg_range: KeyGroupRange,
        *,
        lock_timeout_s: float = 600.0,
    ) -> None:
        self.directory = Path(directory)
        self.kg_range = kg_range
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_file(self.directory / "lock", lock_timeout_s)
        try:
            self._db = sqlite3.connect(
                self.directory / "state.sqlite", isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            # A lost transaction after an OS crash rolls the version back with the
            # data (both in one transaction), so the next task restores: NORMAL is safe.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA cache_size=-65536")
            self._db.executescript(_SCHEMA)
            self._meta: dict[str, str] = dict(
                self._db.execute("SELECT name, value FROM meta").fetchall()
            )
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._in_tx = False

    # ------------------------------------------------------------------ meta
    def meta(self, name: str, default: str = "") -> str:
        return str(self._meta.get(name, default))

    def set_meta(self, **values: str | int) -> None:
        """Set meta values (inside the current transaction, if one is open)."""
        rows = [(k, str(v)) for k, v in values.items()]
        self._db.executemany("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", rows)
        self._meta.update({k: v for k, v in rows})

    @property
    def main_version(self) -> tuple[int, str]:
        return int(self.meta("main_version", str(NO_VERSION))), self.meta("main_attempt")

    @property
    def delta_version(self) -> tuple[int, str] | None:
        v = self.meta("delta_version")
        return (int(v), self.meta("delta_attempt")) if v else None

    # ---------------------------------------------------------- transactions
    def begin(self) -> None:
        if not self._in_tx:
            self._db.execute("BEGIN IMMEDIATE")
            self._in_tx = True

    def commit(self) -> None:
        if self._in_tx:
            self._db.execute("COMMIT")
            self._in_tx = False

    def rollback(self) -> None:
        if self._in_tx:
            self._db.execute("ROLLBACK")
            self._in_tx = False
            self._meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())

    # ------------------------------------------------------------ versions
    def merge_delta(self) -> None:
        """Fold the pending batch into ``kv``; it becomes the main version."""
        dv = self.delta_version
        if dv is None:
            return
        self.begin()
        db = self._db
        db.execute(
            "INSERT OR REPLACE INTO kv (kg, k, v) SELECT kg, k, v FROM delta WHERE v IS NOT NULL"
        )
        # per key group: SQLite seeks a row-value IN by its first column only (a
        # scan of the group); with kg fixed, each deleted key is one seek
        for (kg,) in db.execute("SELECT DISTINCT kg FROM delta WHERE v IS NULL").fetchall():
            db.execute(
                "DELETE FROM kv WHERE kg = ?1 AND k IN "
                "(SELECT k FROM delta WHERE kg = ?1 AND v IS NULL)",
                (kg,),
            )
        db.execute(
            "INSERT OR REPLACE INTO kg_changed (kg, batch) SELECT DISTINCT kg, ? FROM delta",
            (dv[0],),
        )
        db.execute("DELETE FROM delta")
        self.set_meta(main_version=dv[0], main_attempt=dv[1], delta_version="", delta_attempt="")
        self.commit()

    def drop_delta(self) -> None:
        """Forget the pending batch (it was not committed; it is re-run)."""
        if self.delta_version is None:
            return
        self.begin()
        self._db.execute("DELETE FROM delta")
        self.set_meta(delta_version="", delta_attempt="")
        self.commit()

    def reset(self) -> None:
        """Empty the store (before a restore)."""
        self.begin()
        for table in ("kv", "delta", "kg_changed", "segments"):
            self._db.execute(f"DELETE FROM {table}")
        self._db.execute("DELETE FROM meta WHERE name NOT IN ('log_id', 'max_change_bytes')")
        self._meta = {k: v for k, v in self._meta.items() if k in ("log_id", "max_change_bytes")}
        self.commit()

    # ----------------------------------------------------------------- reads
    def get(self, kg: int, k: bytes, with_delta: bool) -> bytes | None:
        """Value of a row: the delta's (if asked and present) else the main one."""
        if with_delta:
            row = self._db.execute("SELECT v FROM delta WHERE kg = ? AND k = ?", (kg, k)).fetchone()
            if row is not None:
                return row[0]  # type: ignore[no-any-return]
        row = self._db.execute("SELECT v FROM kv WHERE kg = ? AND k = ?", (kg, k)).fetchone()
        return None if row is None else row[0]

    def scan_prefix(self, kg: int, prefix: bytes, with_delta: bool) -> dict[bytes, bytes]:
        """Every row of ``kg`` whose ``k`` starts with ``prefix`` (delta applied if asked)."""
        return self.scan_range(kg, prefix, prefix_end(prefix), with_delta)

    def scan_range(
        self, kg: int, start: bytes, end: bytes | None, with_delta: bool
    ) -> dict[bytes, bytes]:
        """Every row of ``kg`` with ``start <= k < end`` (``None``: no upper bound).

        One index range seek per table, so a scan costs the rows in range, not
        the key group's size. The delta is applied if asked (deleted rows left out).
        """
        out: dict[bytes, bytes] = {}
        tables = ("kv", "delta") if with_delta else ("kv",)
        for table in tables:
            if end is None:
                sql = f"SELECT k, v FROM {table} WHERE kg = ? AND k >= ?"
                args: tuple[object, ...] = (kg, start)
            else:
                sql = f"SELECT k, v FROM {table} WHERE kg = ? AND k >= ? AND k < ?"
                args = (kg, start, end)
            for k, v in self._db.execute(sql, args):
                if v is None:
                    out.pop(k, None)
                else:
                    out[k] = v
        return out

    def get_packed(self, keys: PackedKeys, with_delta: bool) -> list[bytes | None]:
        """The value of each of ``keys`` as :meth:`get` gives it, in order: one statement.

        A key missing (or deleted in the pending batch, if ``with_delta``) is
        ``None``. An empty pending batch is not looked up. For :mod:`.bulk`.
        """
        if not keys.count:
            return []
        kv = "(SELECT v FROM kv WHERE kv.kg = q.kg AND kv.k = q.k)"
        sql = packed.KEYS_CTE + (
            f"SELECT CASE WHEN d.k IS NULL THEN {kv} ELSE d.v END FROM q "
            "LEFT JOIN delta d ON d.kg = q.kg AND d.k = q.k"
            if with_delta and self._db.execute("SELECT 1 FROM delta LIMIT 1").fetchone()
            else f"SELECT {kv} FROM q"
        )
        return list(map(itemgetter(0), self._db.execute(sql, keys.params())))

    def rows_of_key_group(self, kg: int) -> Iterator[tuple[bytes, bytes]]:
        """Every main row of one key group, in ``k`` order."""
        yield from self._db.execute("SELECT k, v FROM kv WHERE kg = ? ORDER BY k", (kg,))

    def changed_key_groups(self) -> dict[int, int]:
        """``{key group: last batch that changed it}`` for the main version."""
        return dict(self._db.execute("SELECT kg, batch FROM kg_changed").fetchall())

    def segments(self) -> list[tuple[int, str, int, int]]:
        """``(batch, log id, start SQN, end SQN)`` of logged batches, in batch order."""
        return list(
            self._db.execute(
                "SELECT batch, log_id, start_sqn, end_sqn FROM segments ORDER BY batch"
            )
        )

    def size_bytes(self) -> int:
        """Live bytes of the database (pages in use)."""
        (pages,) = self._db.execute("PRAGMA page_count").fetchone()
        (free,) = self._db.execute("PRAGMA freelist_count").fetchone()
        (size,) = self._db.execute("PRAGMA page_size").fetchone()
        return int((pages - free) * size)

    def count_rows(self) -> int:
        (n,) = self._db.execute("SELECT count(*) FROM kv").fetchone()
        return int(n)

    def count_live_rows(self) -> int:
        """Rows of the main version with the pending batch applied (a scan of both)."""
        (n,) = self._db.execute(
            "SELECT (SELECT count(*) FROM kv)"
            " + (SELECT count(*) FROM delta d WHERE d.v IS NOT NULL AND NOT EXISTS"
            "    (SELECT 1 FROM kv WHERE kv.kg = d.kg AND kv.k = d.k))"
            " - (SELECT count(*) FROM delta d WHERE d.v IS NULL AND EXISTS"
            "    (SELECT 1 FROM kv WHERE kv.kg = d.kg AND kv.k = d.k))"
        ).fetchone()
        return int(n)

    # ---------------------------------------------------------------- writes
    def write_delta(self, rows: Iterable[tuple[int, bytes, bytes | None]]) -> None:
        """Upsert rows into the pending batch (``None`` deletes)."""
        self.begin()
        for chunk in _chunks(rows):
            self._db.executemany("INSERT OR REPLACE INTO delta (kg, k, v) VALUES (?, ?, ?)", chunk)

    def write_delta_packed(self, rows: PackedRows) -> None:
        """:meth:`write_delta` of packed rows (at most one per key) in one statement."""
        self.begin()
        if rows.keys.count:
            self._db.execute(
                "INSERT OR REPLACE INTO delta (kg, k, v) "
                f"SELECT {packed.KG_EXPR}, {packed.K_EXPR}, {packed.V_EXPR} FROM json_each(:x)",
                rows.params(),
            )

    def write_main(self, rows: Iterable[tuple[int, bytes, bytes | None]]) -> None:
        """Upsert or delete rows of the main version directly (restores only)."""
        self.begin()
        puts: list[tuple[int, bytes, bytes]] = []
        dels: list[tuple[int, bytes]] = []
        for kg, k, v in rows:
            if v is None:
                dels.append((kg, k))
            else:
                puts.append((kg, k, v))
            if len(puts) + len(dels) >= _CHUNK:
                self._flush_main(puts, dels)
        self._flush_main(puts, dels)

    def _flush_main(
        self, puts: list[tuple[int, bytes, bytes]], dels: list[tuple[int, bytes]]
    ) -> None:
        if puts:
            self._db.executemany("INSERT OR REPLACE INTO kv (kg, k, v) VALUES (?, ?, ?)", puts)
            puts.clear()
        if dels:
            self._db.executemany("DELETE FROM kv WHERE kg = ? AND k = ?", dels)
            dels.clear()

    def mark_changed(self, changed: dict[int, int]) -> None:
        """Set the last-changed batch of key groups."""
        self.begin()
        self._db.executemany(
            "INSERT OR REPLACE INTO kg_changed (kg, batch) VALUES (?, ?)", list(changed.items())
        )

    def add_segment(self, batch: int, log_id: str, start_sqn: int, end_sqn: int) -> None:
        self.begin()
        self._db.execute(
            "INSERT OR REPLACE INTO segments (batch, log_id, start_sqn, end_sqn) VALUES (?, ?, ?, ?)",
            (batch, log_id, start_sqn, end_sqn),
        )

    def prune_segments(self, before_batch: int) -> None:
        self.begin()
        self._db.execute("DELETE FROM segments WHERE batch < ?", (before_batch,))

    def snapshot_reader(self) -> SnapshotReader:
        """A read-only view of the main version for a background thread."""
        return SnapshotReader(self.directory / "state.sqlite")

    # --------------------------------------------------------------- closing
    def close(self) -> None:
        """Roll back anything uncommitted, close the database, release the lock."""
        try:
            with contextlib.suppress(sqlite3.Error):
                self.rollback()
            self._db.close()
        finally:
            os.close(self._lock_fd)

    def __enter__(self) -> LocalKeyedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SnapshotReader:
    """A consistent read-only view of a store's main version, for another thread.

    Opened on its own SQLite connection inside a read transaction, so it keeps
    seeing the version it started with while the task writes its batch.
    """

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        self._db.execute("BEGIN")
        # the first read fixes the snapshot
        self.changed: dict[int, int] = dict(
            self._db.execute("SELECT kg, batch FROM kg_changed").fetchall()
        )

    def rows_of_key_group(self, kg: int) -> Iterator[tuple[bytes, bytes]]:
        yield from self._db.execute("SELECT k, v FROM kv WHERE kg = ? ORDER BY k", (kg,))

    def row_batches(self, kg: int, rows: int) -> Iterator[list[tuple[bytes, bytes]]]:
        """The rows of one key group in ``k`` order, in lists of at most ``rows`` (none empty)."""
        cursor = self._db.execute("SELECT k, v FROM kv WHERE kg = ? ORDER BY k", (kg,))
        try:
            while batch := cursor.fetchmany(rows):
                yield batch
        finally:
            cursor.close()

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("ROLLBACK")
        self._db.close()


def _chunks(
    rows: Iterable[tuple[int, bytes, bytes | None]],
) -> Iterator[Sequence[tuple[int, bytes, bytes | None]]]:
    it = iter(rows)
    while chunk := list(islice(it, _CHUNK)):
        yield chunk


def read_all_rows(store: LocalKeyedStore) -> dict[tuple[int, bytes], bytes]:
    """Every main row of a store: ``{(key group, row key): value}`` (tools and tests)."""
    return {(kg, k): v for kg, k, v in store._db.execute("SELECT kg, k, v FROM kv")}
