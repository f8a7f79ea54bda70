"""The vectorized keyed-state API: one call of the user's function per task and micro-batch.

``transform_batches(df, key=..., fn=..., state_schema=..., output_schema=...)``
(:mod:`.transform`); ``fn(BatchInput) -> BatchOutput`` (:mod:`.api`). See
``docs/vectorized-api.md``.
"""

from dstl_client.vectorized.api import BatchFunction, BatchInput, BatchOutput
from dstl_client.vectorized.transform import transform_batches

__all__ = ["BatchFunction", "BatchInput", "BatchOutput", "transform_batches"]
