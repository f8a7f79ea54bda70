"""What one upload may do, and how its failures are classified and reported.

:class:`UploadPolicy` holds every limit of the upload engine
(:class:`~dstl_server.uploader.UploadExecutor`), built once from
:class:`~dstl_server.settings.ServerSettings`, which already validated every
value (so nothing is checked again here). :func:`is_retryable` is the one
classification of an attempt's error, by its type alone (Flink
``RetryPolicy``); :func:`upload_error` and :func:`deadline_error` are the one
place where the errors an upload raises are worded.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Literal, cast

from tenacity import AsyncRetrying, RetryCallState, wait_random_exponential

from dstl_client.core.errors import DstlError, StorageError, TransientStorageError
from dstl_server.settings import ServerSettings

HedgeMode = Literal["off", "fixed", "adaptive"]


@dataclass(frozen=True, slots=True)
class UploadPolicy:
    """Limits of one upload and the hedging knobs (defaults: ``ServerSettings``'s).

    * ``attempt_timeout_s``: each attempt (``put``) is cut after this long.
    * ``max_attempts``: the first attempt and its retries (a hedge comes on top).
    * ``retry_base_delay_s`` / ``retry_max_delay_s``: jittered exponential backoff.
    * ``deadline_s``: the whole upload, every attempt and hedge included, in
      every hedge mode.
    * ``hedge_mode``: ``off`` (no hedge ever starts), ``fixed``
      (``hedge_delay_s``) or ``adaptive`` (the ``hedge_quantile`` of recent
      latencies, clamped to ``[hedge_min_delay_s, hedge_max_delay_s]``).
    * ``hedge_budget_fraction`` / ``hedge_budget_window_s``: hedges stay below
      this fraction of the uploads of the window.

    Immutable, so any task may read it; validated by ``ServerSettings`` (a
    policy built by hand, in tests, is taken as given).
    """

    attempt_timeout_s: float = 10.0
    max_attempts: int = 3
    retry_base_delay_s: float = 0.1
    retry_max_delay_s: float = 2.0
    deadline_s: float = 30.0
    hedge_mode: HedgeMode = "adaptive"
    hedge_delay_s: float = 0.5
    hedge_quantile: float = 0.95
    hedge_min_delay_s: float = 0.05
    hedge_max_delay_s: float = 2.0
    hedge_budget_fraction: float = 0.05
    hedge_budget_window_s: float = 60.0
    #: latency samples kept per size class (the newest ones)
    latency_window: int = 500
    #: samples a size class needs before its quantile replaces ``hedge_max_delay_s``
    min_samples: int = 20
    #: attempts at deleting the objects of losing attempts (when one is known to exist)
    discard_attempts: int = 3
    #: losing attempts' keys wait this long to be deleted together (one request)
    discard_batch_delay_s: float = 1.0

    @classmethod
    def from_settings(cls, s: ServerSettings) -> UploadPolicy:
        """The policy of ``s`` (already validated by ``ServerSettings``)."""
        return cls(
            attempt_timeout_s=s.upload_timeout_s,
            max_attempts=s.upload_max_attempts,
            retry_base_delay_s=s.upload_retry_base_delay_ms / 1000.0,
            deadline_s=s.upload_deadline_s,
            hedge_mode=cast(HedgeMode, s.hedge_mode),
            hedge_delay_s=s.hedge_delay_ms / 1000.0,
            hedge_quantile=s.hedge_quantile,
            hedge_min_delay_s=s.hedge_min_delay_ms / 1000.0,
            hedge_max_delay_s=s.hedge_max_delay_ms / 1000.0,
            hedge_budget_fraction=s.hedge_budget_fraction,
            hedge_budget_window_s=s.hedge_budget_window_s,
        )

    def backoff_wait(self) -> wait_random_exponential:
        """tenacity's jittered exponential wait between attempts of this policy."""
        return wait_random_exponential(
            multiplier=self.retry_base_delay_s, max=self.retry_max_delay_s
        )

    def backoff_s(self, failures: int) -> float:
        """Seconds to wait before the retry that follows ``failures`` failures."""
        state = RetryCallState(AsyncRetrying(), None, (), {})
        state.attempt_number = max(1, failures)
        return float(self.backoff_wait()(state))


def is_retryable(exc: BaseException) -> bool:
    """Whether another attempt may succeed where ``exc`` ended one, by type alone.

    Timeouts are; storage errors are when ``retryable`` says so (True for
    :class:`TransientStorageError`: 5xx, throttling, reset connections; False
    for a 403 or a missing bucket); anything else (a bug) is not.
    """
    if isinstance(exc, TimeoutError):
        return True
    return isinstance(exc, StorageError) and exc.retryable


def failure_kind(exc: BaseException) -> str:
    """The ``kind`` label of ``exc`` in the failure metrics."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, DstlError):
        return exc.kind
    return "other"


def describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "attempt timed out"
    if isinstance(exc, DstlError):
        return exc.message
    return repr(exc)


def upload_error(exc: BaseException, nbytes: int, attempts: int) -> DstlError:
    """The typed error an upload raises when its last attempt failed with ``exc``.

    Keeps the type (and ``retryable``) of a dstl error; a timeout becomes a
    :class:`TransientStorageError`, anything else a non-retryable
    :class:`StorageError`.
    """
    if isinstance(exc, TimeoutError):
        return TransientStorageError(
            f"upload of {nbytes} bytes timed out after {attempts} attempt(s)"
        )
    msg = f"upload of {nbytes} bytes failed after {attempts} attempt(s): {describe(exc)}"
    if isinstance(exc, StorageError):
        return type(exc)(msg, retryable=exc.retryable)
    if isinstance(exc, DstlError):
        return type(exc)(msg)
    return StorageError(msg)


def deadline_error(
    policy: UploadPolicy,
    nbytes: int,
    attempts: int,
    errors: list[BaseException],
    running: int,
) -> TransientStorageError:
    """The error of an upload that missed ``policy.deadline_s``."""
    last = f"; last error: {describe(errors[-1])}" if errors else ""
    return TransientStorageError(
        f"upload of {nbytes} bytes missed its {policy.deadline_s:g}s deadline "
        f"({attempts} attempt(s), {len(errors)} failed, {running} still running{last})"
    )


def release_frames(exc: BaseException) -> None:
    """Clear the finished frames of ``exc``'s tracebacks (and of its causes).

    Client libraries keep the exception they raise in a local of a frame on
    its own traceback (botocore's retry loop does), a reference cycle that
    also holds the request, body included, until the cyclic GC runs. With
    objects of megabytes and a store failing every request, that is hundreds
    of MB. Only the message and type of a failed attempt are needed.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
        todo += (e.__cause__, e.__context__)
