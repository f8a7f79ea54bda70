"""PySpark integration: keyed stateful processing of streaming DataFrames on the DSTL.

:mod:`.keyed` (``process_keyed``, the driver's batch function), :mod:`.options`
(``KeyedOptions``), :mod:`.task` (the executor side), :mod:`.query` (``DstlQuery``).
"""

from dstl_client.spark.keyed import process_keyed
from dstl_client.spark.options import KeyedOptions, default_job_id
from dstl_client.spark.query import DstlQuery

__all__ = ["DstlQuery", "KeyedOptions", "default_job_id", "process_keyed"]
