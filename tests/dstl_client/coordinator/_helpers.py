"""What several coordinator test modules share: records' parts, rows, S3 credentials."""

from __future__ import annotations

import uuid

import pytest

from dstl_client.checkpoint.messages import MatResult, TaskResult
from dstl_client.core.handle import ChangelogHandle, HandleEntry
from dstl_server.testing_s3 import SeaweedS3
from tests.dstl_client.state._jobs import make_batches

#: one batch of the keyed test job's rows
ROWS = make_batches(1, rows=50, keys=10)[0]


def handle(rng: tuple[int, int], *objects: str) -> ChangelogHandle:
    """A changelog handle over key groups ``rng`` naming ``objects`` (one entry each)."""
    entries = tuple(HandleEntry(o, 0, 10, i, i + 1) for i, o in enumerate(objects))
    return ChangelogHandle("job", uuid.uuid4().hex, rng, 0, len(objects), entries)


def result(
    index: int,
    rng: tuple[int, int],
    batch: int,
    log: ChangelogHandle | None,
    mat: MatResult | None = None,
) -> TaskResult:
    """Subtask ``index``'s report of ``batch`` (attempt ``a<batch>-<index>``)."""
    return TaskResult(index, rng[0], rng[1], batch, f"a{batch}-{index}", log, mat)


def s3_env(monkeypatch: pytest.MonkeyPatch, s3: SeaweedS3) -> None:
    """The server's credentials through the standard AWS variables (boto3's default chain)."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
