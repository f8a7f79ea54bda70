"""What every task of a vectorized query needs: :class:`VectorSpec` (pickled into the batch's function)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from dstl_client.vectorized.api import PRESENT, TIMESTAMP


@dataclass(frozen=True, slots=True)
class VectorSpec:
    """One vectorized operator, as its tasks run it. Frozen: built on the driver, read by tasks.

    Invariants (checked by :func:`~.transform.transform_batches`): ``key`` is
    a string or integer column of ``input_schema``; ``state_schema`` holds
    value-format types only (:mod:`.values`) and neither the key nor
    :data:`~.api.PRESENT`; ``ttl_ms`` needs a time mode other than ``"None"``.
    """

    key: str
    #: the input rows' columns (the routing's key-group column not included)
    input_schema: pa.Schema
    state_schema: pa.Schema
    #: the output rows' columns (all nullable)
    output_schema: pa.Schema
    #: ``"arrow"`` or ``"pandas"``
    frame: str = "arrow"
    #: ``"None"``, ``"ProcessingTime"`` or ``"EventTime"``
    time_mode: str = "None"
    event_time_column: str | None = None
    #: ``"drop"`` late rows (Spark's behaviour) or ``"pass"`` them to the function
    late_rows: str = "drop"
    #: time to live of a key's state row, ms (``None``: forever)
    ttl_ms: int | None = None

    @property
    def key_field(self) -> pa.Field:
        return self.input_schema.field(self.key)

    @property
    def upsert_fields(self) -> list[pa.Field]:
        return [self.key_field, *self.state_schema]

    @property
    def timer_fields(self) -> list[pa.Field]:
        return [self.key_field, pa.field(TIMESTAMP, pa.int64(), nullable=False)]

    @property
    def state_fields(self) -> list[pa.Field]:
        """The columns of the ``state`` table the function gets."""
        return [*self.upsert_fields, pa.field(PRESENT, pa.bool_(), nullable=False)]
