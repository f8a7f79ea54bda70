"""How a batch's rows reach their subtasks, and the schemas of what the tasks return.

Every keyed API routes the same way: the key group is computed in SQL
(``pmod(crc32(key), max_parallelism)``, equal to the Python hash), each row
goes to partition ``kg * p div max_parallelism`` with ``repartitionById``,
plus one marker row per partition so every subtask runs even without data;
``mapInArrow`` then runs one task per partition, which returns the user's
output rows and one result row (:mod:`.columns`). Called on the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dstl_client.batch.columns import MARKER_COLUMN, PART_COLUMN, RESULT_COLUMNS
from dstl_client.keygroups import partition_sql

#: a batch's ``mapInArrow`` function: Arrow batches of one partition in, out
TaskFunction = Callable[[Iterator[Any]], Iterator[Any]]


@dataclass(frozen=True, slots=True)
class KeyedSchemas:
    """The output schemas of a keyed operator's tasks. Frozen: any thread."""

    #: the user's output rows (``StructType``)
    user: Any
    #: the tasks' rows: the user's columns (nullable), then the result columns
    mapped: Any
    #: ``mapped`` as an Arrow schema
    arrow: Any


def keyed_schemas(output_schema: Any, timezone: str | None = None) -> KeyedSchemas:
    """The schemas of a keyed operator whose rows are ``output_schema`` (DDL, ``StructType``, None).

    Timestamps in the Arrow schema carry ``timezone``, by default the active
    session's ``spark.sql.session.timeZone`` (as Spark's own Arrow schemas do).
    Called on the driver.
    """
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import BinaryType, StructField, StructType

    if isinstance(output_schema, str):
        output_schema = StructType.fromDDL(output_schema)
    user = output_schema or StructType([])
    # every field nullable: the result row of a task has nulls in the user columns
    mapped = StructType(
        [StructField(f.name, f.dataType, True) for f in user.fields]
        + [StructField(name, BinaryType(), True) for name in RESULT_COLUMNS]
    )
    zone = timezone or session_timezone()
    return KeyedSchemas(user=user, mapped=mapped, arrow=to_arrow_schema(mapped, timezone=zone))


def session_timezone() -> str:
    """The active Spark session's time zone (``spark.sql.session.timeZone``; UTC without one)."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    zone = session.conf.get("spark.sql.session.timeZone") if session is not None else None
    return zone or "UTC"


def route_and_map(
    rows: Any,
    *,
    key: str,
    parallelism: int,
    max_parallelism: int,
    task: TaskFunction,
    schemas: KeyedSchemas,
) -> Any:
    """``rows`` (null keys dropped) routed to their subtasks, through ``task`` (``mapInArrow``).

    Each row goes to the subtask of its key group (Flink's operator index,
    computed by Spark: :func:`~dstl_client.keygroups.partition_sql`); one
    marker row per subtask makes every subtask run, with data or without.
    The result has ``schemas.mapped``: the user's output rows, then one
    result row per task.
    """
    from pyspark.sql import functions as F

    part_expr = partition_sql(key, parallelism, max_parallelism)
    markers = rows.sparkSession.range(parallelism).select(
        F.col("id").cast("int").alias(PART_COLUMN), F.lit(True).alias(MARKER_COLUMN)
    )
    routed = (
        rows.where(F.col(key).isNotNull())
        .withColumn(PART_COLUMN, F.expr(part_expr))
        .withColumn(MARKER_COLUMN, F.lit(False))
        .unionByName(markers, allowMissingColumns=True)
        .repartitionById(parallelism, F.col(PART_COLUMN))
        .drop(PART_COLUMN)
    )
    return routed.mapInArrow(task, schemas.mapped)
