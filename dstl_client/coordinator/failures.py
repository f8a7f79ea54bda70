"""Tolerable checkpoint failures: a failed or aborted checkpoint is retried, up to a limit.

Like Flink's ``execution.checkpointing.tolerable-failed-checkpoints``: a
checkpoint that times out (aborted by the watchdog), whose task results are
incomplete, or whose record cannot be written (the metadata store is down)
does not fail the query at once. The batch is planned and run again from the
last record (it was not recorded, so nothing is applied twice), up to
``tolerable_failed_checkpoints`` consecutive failures; one more fails the
query with :class:`TooManyCheckpointFailures`, naming the last cause. A
recorded checkpoint resets the count. Other errors (the user's function
raising, a stopping query, a configuration error) fail the batch at once,
as before: Spark's own task retries and query restart rules apply to them.

Threads: the ``foreachBatch`` thread only (one batch at a time).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dstl_client.coordinator.batches import IncompleteBatch
from dstl_client.coordinator.metadata import MetadataStoreError
from dstl_client.coordinator.watchdog import CheckpointTimedOut
from dstl_client.core.errors import DstlError

log = logging.getLogger(__name__)


class TooManyCheckpointFailures(DstlError):
    """More consecutive checkpoint failures than ``tolerable_failed_checkpoints``."""

    grpc_code = "ABORTED"
    kind = "too_many_checkpoint_failures"


def is_checkpoint_failure(exc: BaseException, *, aborted: bool) -> bool:
    """Whether ``exc`` failed the checkpoint itself (retryable), not the user's work.

    ``aborted``: the watchdog aborted this batch (its Spark jobs were
    cancelled, so the exception Spark raised is the abort's).
    """
    return aborted or isinstance(exc, CheckpointTimedOut | IncompleteBatch | MetadataStoreError)


class CheckpointFailures:
    """Counts a query's consecutive checkpoint failures and decides: retry, or fail the query.

    Invariant: :attr:`consecutive` is reset only by :meth:`succeeded` (a
    recorded checkpoint). ``tolerable()`` is read at each failure, so a new
    value applies at once.
    """

    def __init__(self, tolerable: Callable[[], int]) -> None:
        self._tolerable = tolerable
        self.consecutive = 0
        #: failures tolerated so far (for figures and tests)
        self.tolerated = 0

    def succeeded(self) -> None:
        self.consecutive = 0

    def retry(self, batch_id: int, exc: BaseException, *, aborted: bool) -> bool:
        """Whether to run the batch again after ``exc``; raises when past the limit.

        ``False``: not a checkpoint failure (the caller re-raises ``exc``).
        """
        if not is_checkpoint_failure(exc, aborted=aborted):
            return False
        self.consecutive += 1
        limit = self._tolerable()
        if self.consecutive > limit:
            raise TooManyCheckpointFailures(
                f"{self.consecutive} consecutive checkpoint failures (tolerable: {limit}); "
                f"the last, of batch {batch_id}: {type(exc).__name__}: {exc}"
            ) from exc
        self.tolerated += 1
        log.warning(
            "checkpoint of batch %d failed (%d of %d tolerated in a row): %s: %s; running it again",
            batch_id,
            self.consecutive,
            limit,
            type(exc).__name__,
            exc,
        )
        return True
