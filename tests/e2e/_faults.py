"""Fault injection for the end-to-end tests (test code only, nothing in the library).

:class:`FailAfterCommit` wraps a keyed function: in one chosen task of one
chosen batch, first attempt only, the function's output rows fail when
Spark's task converts them. A task converts its output only after the
batch's changes are durable and committed locally (see
:mod:`dstl_client.spark.task`), so the attempt dies *after* its commit:
Spark's retry must not apply the batch twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class InjectedFailure(RuntimeError):
    pass


class _FailingRow(dict[str, Any]):
    """An output row whose conversion to Arrow fails."""

    message = ""

    def get(self, key: str, default: Any = None) -> Any:
        raise InjectedFailure(self.message)


class FailAfterCommit:
    """``fn`` whose first attempt of task ``partition`` in batch ``batch_id`` fails after commit.

    Picklable (a class of an importable module), so it travels to the executors.
    """

    def __init__(self, fn: Any, columns: Sequence[str], batch_id: int, partition: int) -> None:
        self.fn = fn
        self.columns = list(columns)
        self.batch_id = batch_id
        self.partition = partition

    def __call__(self, key: Any, rows: list[Any], ctx: Any) -> Iterable[Any] | None:
        from pyspark import TaskContext

        out = self.fn(key, rows, ctx)
        task = TaskContext.get()
        if (
            out is None
            or task is None
            or ctx.batch_id != self.batch_id
            or task.partitionId() != self.partition
            or task.attemptNumber() != 0
        ):
            return out  # type: ignore[no-any-return]
        failing = []
        for row in out:
            r = _FailingRow(zip(self.columns, row, strict=True))
            r.message = (
                f"injected failure after commit: batch {self.batch_id} task {self.partition}"
            )
            failing.append(r)
        return failing
