"""The sidecar's uploader, built from its settings.

Request hedging is not a class of its own: it is a mode of the one upload
engine, :class:`~dstl_server.uploader.UploadExecutor` (``hedge_mode`` ``off``
only means that no hedge ever starts; retries, the total deadline and the
batched deletes of losing attempts are the same in every mode). What hedging
decides from, :class:`LatencyTracker` and :class:`HedgeBudget`, lives in
:mod:`dstl_server.hedge_stats`; the limits, in
:class:`~dstl_server.upload_policy.UploadPolicy`.
"""

from __future__ import annotations

from dstl_server.hedge_stats import HedgeBudget, LatencyTracker
from dstl_server.metrics import ServerMetrics
from dstl_server.settings import ServerSettings
from dstl_server.storage.base import BlobStore
from dstl_server.upload_policy import UploadPolicy
from dstl_server.uploader import Uploader, UploadExecutor

__all__ = ["HedgeBudget", "LatencyTracker", "make_uploader"]


def make_uploader(store: BlobStore, settings: ServerSettings, metrics: ServerMetrics) -> Uploader:
    """The sidecar's uploader: one :class:`UploadExecutor` for every ``hedge_mode``."""
    return UploadExecutor(store, UploadPolicy.from_settings(settings), metrics)
