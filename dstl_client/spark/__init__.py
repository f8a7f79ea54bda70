"""PySpark integration: keyed stateful processing of streaming DataFrames on the DSTL."""

from dstl_client.spark.keyed import DstlQuery, default_job_id, process_keyed

__all__ = ["DstlQuery", "default_job_id", "process_keyed"]
