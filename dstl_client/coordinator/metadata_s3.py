"""The job metadata store on S3: write-once by conditional PUT, one retry policy.

Why boto3 (sync) rather than pyarrow.fs or fsspec: it is already installed
(aioboto3 pulls it in, the sidecar uses the same botocore), it exposes S3's
conditional PUT parameter ``IfNoneMatch`` that write-once needs (the generic
file-system layers offer no create-only write on S3), and the driver's
metadata traffic is a few small objects per micro-batch, made from plain
threads: no event loop, no connection pool worth tuning.

Why tenacity rather than botocore's ``standard`` retry mode: which S3 answers
are worth another attempt is decided by the project's one table
(:mod:`dstl_client.core.s3_errors`, shared with the sidecar), and a
write-once must know that an earlier attempt failed in a way the server may
have applied (to read a later 412 right); botocore retries inside one call
and hides both. botocore's own retries are off (one attempt per call).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)
from tenacity.stop import stop_base

from dstl_client.coordinator.metadata_store import (
    MetadataStore,
    MetadataStoreError,
    MetadataWriteConflict,
    check_name,
    check_prefix,
)
from dstl_client.core.s3_errors import NOT_FOUND_CODES, is_transient, status_and_code

__all__ = ["S3MetadataStore"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class _OutOfTime(stop_base):
    """tenacity stop: the next pause would end past ``limit_s`` from this policy's start."""

    def __init__(self, clock: Callable[[], float], limit_s: float) -> None:
        self._clock = clock
        self._limit_s = limit_s
        self._started = clock()

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._clock() - self._started + retry_state.upcoming_sleep > self._limit_s


class S3MetadataStore(MetadataStore):
    """Objects ``<prefix>/<name>`` in one S3 bucket, through a synchronous boto3 client.

    * ``put_once``: ``PutObject`` with ``IfNoneMatch="*"``; 412
      ``PreconditionFailed`` means the key exists (False). 409
      ``ConditionalRequestConflict`` (a concurrent conditional write in
      flight) is retried up to ``conflict_attempts`` times, then
      :class:`MetadataWriteConflict`. A retried attempt after a failure the
      server may have applied anyway (5xx, timeout, lost connection) that
      then gets 412 reads the object back: the same bytes are this write's
      (records carry their creation time, so another writer's differ).
    * Every call is retried on transient errors (the table of
      :mod:`dstl_client.core.s3_errors`, timeouts, connection errors) up to
      ``attempts`` in all and never past ``retry_limit_s`` from its first
      attempt (a pause that would end later is not taken), pausing
      ``backoff_s`` doubling up to ``max_backoff_s``, plus a random
      ``0..jitter_s`` (so drivers that failed together do not retry
      together). Other errors (credentials, access denied, a missing bucket)
      raise :class:`MetadataStoreError` at once. :attr:`retries` counts the
      pauses taken.
    * ``list`` pages through ``ListObjectsV2`` (1,000 keys a page) to the end.
    * Path-style addressing whenever an endpoint is configured (MinIO,
      SeaweedFS, Ceph); AWS keeps botocore's default.

    Thread-safety: any thread. boto3 clients are thread-safe; the only other
    mutable state, the :attr:`retries` count, is under a lock. One client per
    store, created here (no request is made).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str = "",
        region: str = "",
        attempts: int = 4,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        jitter_s: float = 0.2,
        retry_limit_s: float = 60.0,
        conflict_attempts: int = 5,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import boto3  # type: ignore[import-untyped,unused-ignore]
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._attempts = max(1, attempts)
        self._conflict_attempts = max(1, conflict_attempts)
        self._retry_limit_s = retry_limit_s
        self._wait = wait_exponential(multiplier=backoff_s, max=max_backoff_s) + wait_random(
            0, max(0.0, jitter_s)
        )
        self._sleep = sleep
        self._clock = clock
        self._retries_lock = threading.Lock()
        #: pauses taken before another attempt (transient errors and write conflicts)
        self._retries = 0
        custom_endpoint = bool(
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        config = Config(
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=16,
            s3={"addressing_style": "path" if custom_endpoint else "auto"},
        )
        # a session of its own: boto3's default session is not thread-safe
        self._client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url or None,
            region_name=region or None,
            config=config,
        )

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _key(self, name: str) -> str:
        check_name(name)
        return f"{self.prefix}/{name}" if self.prefix else name

    # ------------------------------------------------------------ errors
    def _error(self, exc: BaseException, what: str) -> MetadataStoreError:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            CredentialRetrievalError,
            HTTPClientError,
            IncompleteReadError,
            NoCredentialsError,
            PartialCredentialsError,
            ReadTimeoutError,
            ResponseStreamingError,
        )

        if isinstance(exc, ClientError):
            status, code = status_and_code(exc.response)
            message = exc.response.get("Error", {}).get("Message", "")
            text = f"{what}: {code or status} {message}".rstrip()
            if code == "NoSuchBucket":
                text = f"{what}: bucket {self.bucket!r} does not exist"
            return MetadataStoreError(text, retryable=is_transient(code, status))
        if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
            return MetadataStoreError(
                f"{what}: no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, a profile, or a web identity (IRSA)"
            )
        if isinstance(
            exc,
            ConnectionError
            | HTTPClientError
            | ReadTimeoutError
            | IncompleteReadError
            | ResponseStreamingError,
        ):
            return MetadataStoreError(f"{what}: {exc}", retryable=True)
        if isinstance(exc, BotoCoreError):
            return MetadataStoreError(f"{what}: {exc}")
        raise exc

    @property
    def retries(self) -> int:
        """Pauses taken before another attempt (transient errors and write conflicts)."""
        return self._retries

    def _transient(self, exc: BaseException) -> bool:
        """Whether a botocore failure is worth another attempt."""
        from botocore.exceptions import BotoCoreError, ClientError

        return isinstance(exc, ClientError | BotoCoreError) and self._error(exc, "").retryable

    def _counted(self, state: RetryCallState) -> None:
        """tenacity's ``before_sleep``: count the pause and say why it is taken."""
        with self._retries_lock:
            self._retries += 1
        error = state.outcome.exception() if state.outcome is not None else None
        log.info(
            "metadata store %s: attempt %d failed (%s); retrying in %.2fs",
            self.url,
            state.attempt_number,
            error,
            state.upcoming_sleep,
        )

    def _policy(self, attempts: int, retry: Callable[[BaseException], bool]) -> Retrying:
        """``attempts`` in all, never past ``retry_limit_s`` from now, retrying what ``retry`` says."""
        return Retrying(
            sleep=self._sleep,
            stop=stop_after_attempt(attempts) | _OutOfTime(self._clock, self._retry_limit_s),
            wait=self._wait,
            retry=retry_if_exception(retry),
            before_sleep=self._counted,
            reraise=True,
        )

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """``call`` under the retry policy; its final botocore failure as MetadataStoreError."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self._policy(self._attempts, self._transient)(call)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, what) from None

    # -------------------------------------------------------- operations
    def put_once(self, name: str, data: bytes) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._key(name)
        what = f"write-once of {self.describe(name)}"
        maybe_written = False

        def attempt() -> bool:
            nonlocal maybe_written
            try:
                self._put_if_absent(key, data, what)
                return True
            except ClientError as exc:
                status, code = status_and_code(exc.response)
                if status == 412 or code == "PreconditionFailed":
                    # an earlier attempt of ours may have landed before its answer was lost
                    return maybe_written and self.get(name) == data
                maybe_written = True  # matters only if it is retried
                raise
            except BotoCoreError:
                maybe_written = True
                raise

        return self._retrying(what, attempt)

    def _put_if_absent(self, key: str, data: bytes, what: str) -> None:
        """One conditional PUT, sent again while S3 answers 409 (a concurrent write in flight)."""
        from botocore.exceptions import ClientError

        def conflict(exc: BaseException) -> bool:
            if not isinstance(exc, ClientError):
                return False
            status, code = status_and_code(exc.response)
            return status == 409 or code == "ConditionalRequestConflict"

        policy = self._policy(self._conflict_attempts, conflict)
        try:
            policy(self._client.put_object, Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if conflict(exc):
                raise MetadataWriteConflict(
                    f"{what}: {policy.statistics.get('attempt_number', 0)} conditional write "
                    "conflicts in a row (409 ConditionalRequestConflict): concurrent writers"
                ) from None
            raise

    def put(self, name: str, data: bytes) -> None:
        key = self._key(name)
        self._retrying(
            f"write of {self.describe(name)}",
            lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=data),
        )

    def get(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        key = self._key(name)

        def call() -> bytes | None:
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                status, code = status_and_code(exc.response)
                if code in NOT_FOUND_CODES or (status == 404 and code != "NoSuchBucket"):
                    return None
                raise
            with contextlib.closing(resp["Body"]) as body:
                data: bytes = body.read()
            return data

        return self._retrying(f"read of {self.describe(name)}", call)

    def list(self, prefix: str = "") -> builtins.list[str]:
        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""

        def call() -> builtins.list[str]:
            names: builtins.list[str] = []
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=root + prefix
            )
            for page in pages:
                names.extend(obj["Key"][len(root) :] for obj in page.get("Contents", ()))
            return sorted(names)

        return self._retrying(f"listing of {self.describe(prefix)}", call)

    def delete(self, name: str) -> None:
        key = self._key(name)
        self._retrying(
            f"delete of {self.describe(name)}",
            lambda: self._client.delete_object(Bucket=self.bucket, Key=key),
        )

    def close(self) -> None:
        self._client.close()
