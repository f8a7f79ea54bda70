"""Uploaders: put one built object into the store, with retries.

The scheduler hands an uploader the bytes of one object and the job it
belongs to; the uploader picks the key (a new one for every attempt, so
attempts never overwrite each other) and returns the key that won. An
uploader either returns the key of a complete object or raises; it never
returns a key whose object is incomplete.

:class:`RetryingUploader` retries retryable failures and per-attempt timeouts
with jittered exponential backoff (tenacity), deleting what a failed attempt
may have left behind. Hedged attempts plug in as another ``Uploader`` without
changing the scheduler.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
import traceback
from dataclasses import dataclass

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from dstl_client.errors import DstlError, StorageError, TransientStorageError
from dstl_server.keys import new_object_key
from dstl_server.metrics import ServerMetrics, size_class
from dstl_server.storage.base import BlobStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UploadPolicy:
    """Per-upload limits (from :class:`~dstl_server.settings.ServerSettings`)."""

    attempt_timeout_s: float = 10.0
    max_attempts: int = 3
    retry_base_delay_s: float = 0.1
    retry_max_delay_s: float = 2.0


class Uploader(abc.ABC):
    """Writes one object; returns its key. Called from the event loop."""

    @abc.abstractmethod
    async def upload(self, job_id: str, data: bytes) -> str:
        """Store ``data`` as a new object of ``job_id``; raise on final failure."""

    async def close(self, timeout_s: float = 30.0) -> None:  # noqa: B027 - optional hook
        """Finish background work (deleting losing attempts) within ``timeout_s``."""


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


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or (isinstance(exc, StorageError) and exc.retryable)


class RetryingUploader(Uploader):
    """One attempt at a time, retried on retryable errors and timeouts."""

    def __init__(self, store: BlobStore, policy: UploadPolicy, metrics: ServerMetrics) -> None:
        self.store = store
        self.policy = policy
        self.metrics = metrics
        #: deletes of failed attempts still running (referenced so they are not collected)
        self._cleanup: set[asyncio.Task[None]] = set()

    async def upload(self, job_id: str, data: bytes) -> str:
        started = time.perf_counter()
        attempts = 0
        p = self.policy

        def before_sleep(state: RetryCallState) -> None:
            self.metrics.upload_retries.inc()

        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(p.max_attempts),
                wait=wait_random_exponential(
                    multiplier=p.retry_base_delay_s, max=p.retry_max_delay_s
                ),
                retry=retry_if_exception(_retryable),
                before_sleep=before_sleep,
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    key = new_object_key(job_id)
                    await self._attempt(key, data)
        except Exception as exc:
            self.metrics.uploads.labels("failed").inc()
            self.metrics.upload_attempts.observe(attempts)
            raise _as_storage_error(exc, attempts) from exc
        self.metrics.uploads.labels("ok").inc()
        self.metrics.upload_attempts.observe(attempts)
        self.metrics.upload_bytes.inc(len(data))
        self.metrics.upload_size.observe(len(data))
        self.metrics.upload_latency.labels(size_class(len(data))).observe(
            time.perf_counter() - started
        )
        return key

    async def _attempt(self, key: str, data: bytes) -> None:
        try:
            await asyncio.wait_for(self.store.put(key, data), self.policy.attempt_timeout_s)
        except BaseException as exc:
            kind = "timeout" if isinstance(exc, TimeoutError) else getattr(exc, "kind", "other")
            self.metrics.storage_failures.labels("put", kind).inc()
            release_frames(exc)
            # A timed-out or failed put may still have left an object: remove it.
            task = asyncio.get_running_loop().create_task(self._discard(key))
            self._cleanup.add(task)
            task.add_done_callback(self._cleanup.discard)
            raise

    async def close(self, timeout_s: float = 30.0) -> None:
        """Wait, at most ``timeout_s``, for the deletes of failed attempts."""
        if self._cleanup:
            await asyncio.wait(list(self._cleanup), timeout=timeout_s)

    async def _discard(self, key: str) -> None:
        try:
            await self.store.delete([key])
        except Exception as exc:  # best effort; the cleaner removes orphans later
            log.warning("could not delete failed attempt %s: %s", key, exc)


def _as_storage_error(exc: BaseException, attempts: int) -> DstlError:
    if isinstance(exc, TimeoutError):
        return TransientStorageError(f"upload timed out after {attempts} attempt(s)")
    if isinstance(exc, DstlError):
        new = type(exc)(f"{exc.message} (after {attempts} attempt(s))")
        if isinstance(exc, StorageError) and isinstance(new, StorageError):
            new.retryable = exc.retryable
        return new
    return StorageError(f"upload failed after {attempts} attempt(s): {exc!r}")
