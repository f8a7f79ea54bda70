"""The ``writeStream`` habit: the output of ``transform_with_state`` and its writer builder.

::

    q = (transform_with_state(events.groupBy("user"), processor=..., output_schema=...)
         .writeStream.format("parquet")
         .option("checkpointLocation", "/ckpt/clicks")
         .outputMode("update")
         .trigger(processingTime="10 seconds")
         .queryName("clicks")
         .start("/out/clicks"))

Like Spark's ``DataStreamWriter``: ``format``, ``option``/``options``,
``outputMode``, ``trigger``, ``queryName``, ``partitionBy``, ``foreachBatch``,
``start(path)``, ``toTable(name)``. ``checkpointLocation`` is the query's
``checkpoint_dir``; other options go to the sink (:mod:`.sinks`). ``start``
returns the running :class:`~.progress.ProcessorQuery`.

A builder belongs to the thread that builds it; each call returns the builder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dstl_client.core.errors import ConfigError
from dstl_client.processor.progress import ProcessorQuery
from dstl_client.processor.sinks import WriteSpec

#: ``start(spec, query_options)``: the query (``query_options``: ``KeyedOptions`` keywords)
Starter = Callable[[WriteSpec, dict[str, Any]], ProcessorQuery]

OUTPUT_MODES = ("append", "update")


class ProcessorStreamWriter:
    """Where and how a processor's output is written (Spark's ``DataStreamWriter`` calls).

    Invariant: output mode Append or Update, one trigger. Thread: the builder's.
    """

    def __init__(self, starter: Starter, output_mode: str) -> None:
        self._starter = starter
        self._format = "parquet"
        self._options: dict[str, str] = {}
        self._output_mode = output_mode
        self._trigger: dict[str, Any] | None = None
        self._query_name: str | None = None
        self._partition_by: tuple[str, ...] = ()
        self._foreach_batch: Callable[[Any, int], None] | None = None

    def format(self, source: str) -> ProcessorStreamWriter:
        self._format = source
        return self

    def option(self, key: str, value: Any) -> ProcessorStreamWriter:
        self._options[key] = value if isinstance(value, str) else _text(value)
        return self

    def options(self, **options: Any) -> ProcessorStreamWriter:
        for k, v in options.items():
            self.option(k, v)
        return self

    def outputMode(self, outputMode: str) -> ProcessorStreamWriter:
        if outputMode.lower() not in OUTPUT_MODES:
            raise ConfigError(f"output mode {outputMode!r}: a processor supports Append or Update")
        self._output_mode = outputMode
        return self

    def trigger(
        self,
        *,
        processingTime: str | None = None,
        once: bool | None = None,
        availableNow: bool | None = None,
        continuous: str | None = None,
    ) -> ProcessorStreamWriter:
        if continuous is not None:
            raise ConfigError("continuous processing has no micro-batches to checkpoint")
        given = {
            k: v
            for k, v in (
                ("processingTime", processingTime),
                ("once", once),
                ("availableNow", availableNow),
            )
            if v is not None
        }
        if len(given) != 1:
            raise ConfigError("trigger() takes one of processingTime, once, availableNow")
        self._trigger = given
        return self

    def queryName(self, queryName: str) -> ProcessorStreamWriter:
        self._query_name = queryName
        return self

    def partitionBy(self, *cols: str) -> ProcessorStreamWriter:
        self._partition_by = tuple(
            c for group in cols for c in ([group] if isinstance(group, str) else group)
        )
        return self

    def foreachBatch(self, func: Callable[[Any, int], None]) -> ProcessorStreamWriter:
        self._foreach_batch = func
        return self

    # ------------------------------------------------------------- start
    def _start(self, path: str | None, table: str | None) -> ProcessorQuery:
        options = dict(self._options)
        query: dict[str, Any] = {}
        checkpoint = options.pop("checkpointLocation", None)
        if checkpoint:
            query["checkpoint_dir"] = checkpoint
        path = path or options.pop("path", None)
        if self._trigger is not None:
            query["trigger"] = self._trigger
        if self._query_name is not None:
            query["query_name"] = self._query_name
        spec = WriteSpec(
            format=self._format,
            options=options,
            path=path,
            table=table,
            partition_by=self._partition_by,
            query_name=self._query_name,
            foreach_batch=self._foreach_batch,
        )
        return self._starter(spec, query)

    def start(
        self,
        path: str | None = None,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: str | list[str] | None = None,
        queryName: str | None = None,
        **options: Any,
    ) -> ProcessorQuery:
        """Start the query; its output goes to ``path`` in ``format`` (or the ``foreachBatch``)."""
        self._apply(format, outputMode, partitionBy, queryName, options)
        return self._start(path, None)

    def toTable(
        self,
        tableName: str,
        format: str | None = None,
        outputMode: str | None = None,
        partitionBy: str | list[str] | None = None,
        queryName: str | None = None,
        **options: Any,
    ) -> ProcessorQuery:
        """Start the query; each batch's output is appended to the table ``tableName``."""
        self._apply(format, outputMode, partitionBy, queryName, options)
        return self._start(None, tableName)

    def _apply(
        self,
        format: str | None,
        output_mode: str | None,
        partition_by: str | list[str] | None,
        query_name: str | None,
        options: dict[str, Any],
    ) -> None:
        if format is not None:
            self.format(format)
        if output_mode is not None:
            self.outputMode(output_mode)
        if partition_by is not None:
            self.partitionBy(*([partition_by] if isinstance(partition_by, str) else partition_by))
        if query_name is not None:
            self.queryName(query_name)
        self.options(**options)


class ProcessorStream:
    """The output of :func:`~.transform.transform_with_state`, to be written with ``writeStream``.

    Each ``writeStream`` is a new builder; each ``start`` a new query. Thread: the caller's.
    """

    def __init__(self, starter: Starter, schema: Any, output_mode: str) -> None:
        self._starter = starter
        self.schema = schema
        self._output_mode = output_mode

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.schema.fields]

    @property
    def writeStream(self) -> ProcessorStreamWriter:
        return ProcessorStreamWriter(self._starter, self._output_mode)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
