"""Where a processor query's output goes: any sink Spark can write a batch DataFrame to.

:func:`make_sink` turns a :class:`WriteSpec` (what the ``writeStream``
builder collected) into the function the keyed batch cycle calls with each
batch's output, *before* the batch's checkpoint is recorded. A driver crash
between the two re-runs the batch with the same id and input and delivers
its output again; how each kind of sink takes that:

* file formats (``parquet``, ``json``, ``csv``, ``orc``, ``text``, ``avro``,
  ``xml``) with a path: **exactly once** (:class:`ExactlyOnceFileSink`):
  each batch is written to ``<path>/_dstl_staging/<batch>`` and its files
  are moved into ``<path>`` (keeping ``partitionBy`` folders) named
  ``part-b<batch>-...``; a re-delivered batch first deletes the files of
  its earlier attempt. Readers (Spark skips ``_``-folders) see each batch's
  rows once, once its move is done.
* ``delta``: appends with ``txnAppId``/``txnVersion`` (Delta's idempotent writes).
* ``memory``: a temporary view named by ``queryName`` in the session that
  started the query (readable with ``spark.table``/``spark.sql`` from the
  start, empty until the first batch, and after the query stopped, as
  Spark's memory sink), kept by batch id; ``console``, ``noop``: harmless.
* ``foreachBatch(fn)``: ``fn(df, batch_id)``, to be made idempotent by its
  batch id, as with Spark's own ``foreachBatch``.
* any other format (``jdbc``, ``kafka``, ``iceberg``...) and ``toTable``:
  ``df.write.format(...).mode("append")``: at least once.

Sinks run on the driver's ``foreachBatch`` thread, one batch at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dstl_client.core.errors import ConfigError

log = logging.getLogger(__name__)

Sink = Callable[[Any, int], None]

FILE_FORMATS = frozenset({"parquet", "json", "csv", "orc", "text", "avro", "xml"})
STAGING = "_dstl_staging"


@dataclass(frozen=True, slots=True)
class WriteSpec:
    """What a ``writeStream`` builder collected about the output's destination. Frozen."""

    format: str = "parquet"
    options: Mapping[str, str] = field(default_factory=dict)
    path: str | None = None
    table: str | None = None
    partition_by: tuple[str, ...] = ()
    query_name: str | None = None
    foreach_batch: Callable[[Any, int], None] | None = None


def batch_file_prefix(batch_id: int) -> str:
    """Output files of a batch are named ``<prefix><Spark's name without "part-">``."""
    return f"part-b{batch_id:012d}-"


class ExactlyOnceFileSink:
    """Batch output files moved into a directory under batch-named files (see the module).

    Invariant: after ``__call__(df, b)`` returns, the directory holds the
    files of exactly one delivery of batch ``b``. Thread: the driver's batch thread.
    """

    def __init__(self, spec: WriteSpec) -> None:
        if not spec.path:
            raise ConfigError(f"format {spec.format!r} needs a path: start(path)")
        self.spec = spec
        self.path = spec.path.rstrip("/")

    def __call__(self, df: Any, batch_id: int) -> None:
        session = df.sparkSession
        jvm = session._jvm
        conf = session._jsc.hadoopConfiguration()
        hpath = jvm.org.apache.hadoop.fs.Path
        root = hpath(self.path)
        fs = root.getFileSystem(conf)
        staging = hpath(f"{self.path}/{STAGING}/{batch_id}")
        writer = df.write.format(self.spec.format).options(**self.spec.options).mode("overwrite")
        if self.spec.partition_by:
            writer = writer.partitionBy(*self.spec.partition_by)
        writer.save(staging.toString())
        prefix = batch_file_prefix(batch_id)
        depth = len(self.spec.partition_by)
        # an earlier delivery of this batch (a crash before its checkpoint): replaced
        pattern = hpath(self.path + "/*" * depth + f"/{prefix}*")
        for status in fs.globStatus(pattern) or []:
            fs.delete(status.getPath(), False)
        moved = 0
        files = fs.listFiles(staging, True)
        staging_root = staging.toUri().getPath().rstrip("/")
        while files.hasNext():
            src = files.next().getPath()
            name = src.getName()
            if not name.startswith("part-"):
                continue  # _SUCCESS, checksums
            rel_dir = src.getParent().toUri().getPath()[len(staging_root) :].strip("/")
            target_dir = hpath(f"{self.path}/{rel_dir}") if rel_dir else root
            fs.mkdirs(target_dir)
            if not fs.rename(src, hpath(target_dir, prefix + name[len("part-") :])):
                raise OSError(f"could not move {src.toString()} into {target_dir.toString()}")
            moved += 1
        fs.delete(staging, True)
        log.debug("batch %d: %d files into %s", batch_id, moved, self.path)


class MemorySink:
    """Every batch's rows kept on the driver, as the temporary view ``name`` of ``session``.

    ``session`` is the user's (the one the query was started from), not the
    batch DataFrame's: Spark runs ``foreachBatch`` in a clone of it, whose
    temporary views the user never sees. The view exists from construction
    (empty, with ``schema``) and stays after the query stops, as with
    Spark's memory sink. Keyed by batch id, so a re-delivered batch replaces
    itself. For tests and notebooks (the output must fit the driver).
    Thread: the driver's batch thread (the constructor: the thread starting the query).
    """

    def __init__(self, name: str, session: Any, schema: Any) -> None:
        if not name:
            raise ConfigError("the memory sink needs a queryName (its view's name)")
        self.name = name
        self.session = session
        self.schema = schema
        self.batches: dict[int, list[Any]] = {}
        self._publish()

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = df.collect()
        self._publish()

    def _publish(self) -> None:
        rows = [r for b in sorted(self.batches) for r in self.batches[b]]
        self.session.createDataFrame(rows, self.schema).createOrReplaceTempView(self.name)


def make_sink(spec: WriteSpec, *, app_id: str, session: Any, schema: Any) -> Sink:
    """The batch function for ``spec``: ``app_id`` names the query for idempotent writers,
    ``session`` is the user's and ``schema`` the rows' (a ``StructType``; the memory sink)."""
    if spec.foreach_batch is not None:
        return spec.foreach_batch
    fmt = spec.format.lower()
    if spec.table is not None:
        table = spec.table

        def to_table(df: Any, batch_id: int) -> None:
            writer = df.write.format(spec.format).options(**spec.options).mode("append")
            if spec.partition_by:
                writer = writer.partitionBy(*spec.partition_by)
            writer.saveAsTable(table)

        return to_table
    if fmt in FILE_FORMATS:
        return ExactlyOnceFileSink(spec)
    if fmt == "memory":
        return MemorySink(spec.query_name or "", session, schema)
    if fmt == "console":
        rows = int(spec.options.get("numRows", 20))
        truncate = str(spec.options.get("truncate", "true")).lower() == "true"

        def console(df: Any, batch_id: int) -> None:
            print(f"-------------------------------------------\nBatch: {batch_id}")
            df.show(rows, truncate)

        return console
    if fmt == "noop":
        return lambda df, batch_id: None

    def append(df: Any, batch_id: int) -> None:
        options = dict(spec.options)
        if fmt == "delta":
            options.setdefault("txnAppId", app_id)
            options["txnVersion"] = str(batch_id)
        writer = df.write.format(spec.format).options(**options).mode("append")
        if spec.partition_by:
            writer = writer.partitionBy(*spec.partition_by)
        if spec.path:
            writer.save(spec.path)
        else:
            writer.save()

    return append
