"""The contract of a job metadata store, on POSIX, on S3 (SeaweedFS) and on the in-memory fake.

Every store: write-once never overwrites and has exactly one winner among
racing writers, ``put`` replaces, ``list`` is complete past S3's 1,000-key
page, ``delete`` of a missing name is fine, a missing name reads as
``None``. Then what each implementation adds: the file store's temp files,
S3's conditional PUT conflicts and lost answers (botocore's Stubber), and the
URL forms :func:`open_metadata_store` accepts.
"""

from __future__ import annotations

import concurrent.futures
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstl_client.coordinator.metadata import (
    FileMetadataStore,
    MetadataStore,
    MetadataStoreError,
    MetadataWriteConflict,
    S3MetadataStore,
    open_metadata_store,
)
from dstl_client.core.atomic import TEMP_SUFFIX
from dstl_client.core.errors import ConfigError
from dstl_server.testing_s3 import SeaweedS3
from tests.dstl_client.coordinator._helpers import s3_env
from tests.fakes import MemoryMetadataStore


def open_s3(s3: SeaweedS3, prefix: str) -> MetadataStore:
    return open_metadata_store(
        f"s3://{s3.bucket}/{prefix}/dstl", s3_endpoint_url=s3.endpoint_url, s3_region=s3.region
    )


@pytest.fixture(params=["memory", "file", pytest.param("s3", marks=pytest.mark.s3)])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MetadataStore]:
    opened: MetadataStore
    if request.param == "memory":
        opened = MemoryMetadataStore()
    elif request.param == "file":
        opened = open_metadata_store(str(tmp_path / "ck" / "dstl"), fsync=False)
    else:
        s3: SeaweedS3 = request.getfixturevalue("weed_s3")
        s3_env(monkeypatch, s3)
        opened = open_s3(s3, request.getfixturevalue("s3_prefix"))
    try:
        yield opened
    finally:
        opened.close()


# ------------------------------------------------------------------ contract


def test_put_once_then_get(store: MetadataStore) -> None:
    assert store.get("checkpoints/ck-000000000001.json") is None
    assert store.put_once("checkpoints/ck-000000000001.json", b"record 1")
    assert store.get("checkpoints/ck-000000000001.json") == b"record 1"
    assert store.list() == ["checkpoints/ck-000000000001.json"]
    assert store.describe("checkpoints/ck-000000000001.json").endswith(
        "/checkpoints/ck-000000000001.json"
    )


def test_a_second_put_once_is_refused_and_changes_nothing(store: MetadataStore) -> None:
    assert store.put_once("a/b", b"first")
    assert not store.put_once("a/b", b"second")
    assert not store.put_once("a/b", b"first")  # even the same bytes: it exists
    assert store.get("a/b") == b"first"
    store.put("a/c", b"by put")
    assert not store.put_once("a/c", b"once")
    assert store.get("a/c") == b"by put"


def test_put_creates_and_replaces(store: MetadataStore) -> None:
    store.put("config-overrides.json", b'{"checkpointTimeout": 1}')
    store.put("config-overrides.json", b'{"checkpointTimeout": 2}')
    assert store.get("config-overrides.json") == b'{"checkpointTimeout": 2}'
    store.put("config-overrides.json", b"")
    assert store.get("config-overrides.json") == b""
    assert store.list() == ["config-overrides.json"]


def test_list_filters_by_prefix(store: MetadataStore) -> None:
    names = [
        "checkpoints/ck-000000000001.json",
        "checkpoints/ck-000000000002.json",
        "config-overrides.json",
        "operators/a/checkpoints/ck-000000000001.json",
        "operators/a/config-overrides.json",
        "operators/ab/checkpoints/ck-000000000003.json",
    ]
    for name in reversed(names):
        assert store.put_once(name, name.encode())
    assert store.list() == names
    assert store.list("checkpoints/") == names[:2]
    assert store.list("checkpoints/ck-000000000002") == names[1:2]
    assert store.list("operators/") == names[3:]
    assert store.list("operators/a/") == names[3:5]
    assert store.list("operators/a") == names[3:]
    assert store.list("operators/a/checkpoints/") == names[3:4]
    assert store.list("config") == names[2:3]
    assert store.list("nothing/") == [] and store.list("nothing") == []


def test_delete_and_missing_names(store: MetadataStore) -> None:
    assert store.get("missing") is None
    assert store.get("missing/deeper/name") is None
    store.delete("missing")  # fine
    store.delete("missing/deeper/name")
    assert store.put_once("checkpoints/ck-000000000005.json", b"x")
    store.delete("checkpoints/ck-000000000005.json")
    assert store.get("checkpoints/ck-000000000005.json") is None
    assert store.list("checkpoints/") == []
    store.delete("checkpoints/ck-000000000005.json")
    # a name is free again once deleted
    assert store.put_once("checkpoints/ck-000000000005.json", b"y")
    assert store.get("checkpoints/ck-000000000005.json") == b"y"


def test_racing_put_once_has_exactly_one_winner(store: MetadataStore) -> None:
    # (SeaweedFS makes the losers of a conditional PUT race wait, in whole seconds)
    writers = 8
    for round_ in range(2):
        name = f"checkpoints/ck-{round_:012d}.json"
        barrier = threading.Barrier(writers)

        def write(i: int, name: str = name, barrier: threading.Barrier = barrier) -> bool:
            barrier.wait()
            return store.put_once(name, f"writer {i}".encode())

        with concurrent.futures.ThreadPoolExecutor(writers) as pool:
            won = list(pool.map(write, range(writers)))
        assert won.count(True) == 1, won
        assert store.get(name) == f"writer {won.index(True)}".encode()
    assert len(store.list("checkpoints/")) == 2


def test_bad_names_are_refused(store: MetadataStore) -> None:
    for bad in ("", "/abs", "a//b", "a/", "../x", "a/../b", "./a", ".hidden", "a/.tmp"):
        with pytest.raises(ValueError):
            store.put_once(bad, b"x")
        with pytest.raises(ValueError):
            store.get(bad)
    with pytest.raises(ValueError):
        store.list("../")
    assert store.list() == []


def test_listing_is_complete_past_one_page(store: MetadataStore) -> None:
    """S3 lists 1,000 keys a page: 1,005 names come back, all of them."""
    if isinstance(store, MemoryMetadataStore):
        pytest.skip("no pages in a dict")
    names = [f"many/ck-{i:012d}.json" for i in range(1005)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(lambda n: store.put_once(n, b"."), names))
    store.put("manx", b"not under the prefix")
    assert store.list("many/") == names
    assert len(store.list()) == 1006


# ------------------------------------------------------------- file store


def test_the_file_store_never_lists_temp_files_and_removes_them(tmp_path: Path) -> None:
    store = FileMetadataStore(tmp_path / "dstl", fsync=False)
    assert store.url == (tmp_path / "dstl").as_uri()
    assert store.put_once("checkpoints/ck-000000000001.json", b"r")
    assert store.describe("checkpoints/ck-000000000001.json") == str(
        tmp_path / "dstl" / "checkpoints" / "ck-000000000001.json"
    )
    # what a crash leaves: a hidden temp file of a write, one of an older version
    folder = tmp_path / "dstl" / "checkpoints"
    (folder / f".ck-000000000002.json.0123456789ab{TEMP_SUFFIX}").write_bytes(b"half")
    (folder / ".tmp-old").write_bytes(b"half")
    (tmp_path / "dstl" / f".config-overrides.json.0123456789ab{TEMP_SUFFIX}").write_bytes(b"")
    assert store.list() == ["checkpoints/ck-000000000001.json"]
    assert store.remove_temp_files("checkpoints/") == 2  # that folder only
    assert sorted(p.name for p in folder.iterdir()) == ["ck-000000000001.json"]
    assert store.remove_temp_files() == 1
    assert not store.remove_temp_files()


def test_the_file_store_names_its_path_in_errors(tmp_path: Path) -> None:
    store = FileMetadataStore(tmp_path / "dstl", fsync=False)
    (tmp_path / "dstl" / "checkpoints").write_bytes(b"a file where a folder belongs")
    with pytest.raises(MetadataStoreError, match=str(tmp_path / "dstl" / "checkpoints")):
        store.put_once("checkpoints/ck-000000000001.json", b"x")
    with pytest.raises(MetadataStoreError, match="cannot create"):
        FileMetadataStore(tmp_path / "dstl" / "checkpoints" / "below")


# ------------------------------------------------------------------ URLs


def test_paths_and_file_urls_open_the_file_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    relative = open_metadata_store("ck/dstl", fsync=False)
    assert isinstance(relative, FileMetadataStore) and relative.root == tmp_path / "ck" / "dstl"
    absolute = open_metadata_store(str(tmp_path / "a"))
    assert isinstance(absolute, FileMetadataStore) and absolute.root == tmp_path / "a"
    url = open_metadata_store(f"file://{tmp_path}/b")
    assert isinstance(url, FileMetadataStore) and url.root == tmp_path / "b"
    assert url.url == (tmp_path / "b").as_uri()


def test_s3_urls_open_the_s3_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for url, bucket, prefix in (
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://bucket/jobs/clicks/dstl/", "bucket", "jobs/clicks/dstl"),
    ):
        store = open_metadata_store(url, s3_endpoint_url="http://127.0.0.1:9", s3_region="eu-1")
        try:
            assert isinstance(store, S3MetadataStore)
            assert (store.bucket, store.prefix) == (bucket, prefix)
            assert store.url == url.rstrip("/")
            assert store.describe("a/b") == f"{url.rstrip('/')}/a/b"
        finally:
            store.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", r"empty job metadata URL: use a path, file:///absolute/path or s3://bucket"),
        ("s3a://bucket/ck", r"s3a:// is Hadoop's scheme.*s3://bucket/ck"),
        ("s3n://bucket/ck", r"s3n:// is Hadoop's scheme.*s3://bucket/ck"),
        ("gs://bucket/ck", r"unsupported job metadata URL 'gs://bucket/ck': use a path, file:///"),
        ("hdfs://namenode/ck", r"unsupported job metadata URL 'hdfs://namenode/ck'"),
        ("s3a:/bucket/ck", r"s3a:// is Hadoop's scheme"),  # what Path() made of s3a://
        ("file://relative/dir", r"absolute path \(file:///absolute/path\)"),
        ("file://host/abs/dir", r"absolute path"),
        ("s3://", r"use s3://bucket\[/prefix\]"),
        ("s3:///prefix", r"use s3://bucket\[/prefix\]"),
        ("s3://bucket/a//b", r"use s3://bucket\[/prefix\]"),
        ("s3://bucket/../b", r"use s3://bucket\[/prefix\]"),
        ("s3://bucket/x?versionId=1", r"use s3://bucket\[/prefix\]"),
    ],
)
def test_unsupported_urls_are_config_errors(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        open_metadata_store(url)
    assert "\n" not in info.value.message


# ------------------------------------------------------------------ S3 behaviour (stubbed)


class Stubbed:
    """An :class:`S3MetadataStore` whose HTTP calls are answered by botocore's Stubber."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> None:
        from botocore.stub import Stubber

        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
        self.sleeps: list[float] = []
        self.store = S3MetadataStore(
            "bucket",
            "ck/dstl",
            endpoint_url="http://127.0.0.1:9",
            region="us-east-1",
            sleep=self.sleeps.append,
            **kwargs,
        )
        self.stub = Stubber(self.store._client)
        self.stub.activate()

    def put(self, data: bytes = b"rec") -> dict[str, Any]:
        return {
            "Bucket": "bucket",
            "Key": "ck/dstl/checkpoints/ck-000000000001.json",
            "Body": data,
            "IfNoneMatch": "*",
        }

    def error(self, op: str, code: str, status: int, params: dict[str, Any] | None) -> None:
        self.stub.add_client_error(
            op, service_error_code=code, http_status_code=status, expected_params=params
        )

    def object(self, data: bytes) -> None:
        from botocore.response import StreamingBody

        self.stub.add_response(
            "get_object",
            {"Body": StreamingBody(io.BytesIO(data), len(data))},
            {"Bucket": "bucket", "Key": "ck/dstl/checkpoints/ck-000000000001.json"},
        )

    def close(self) -> None:
        self.stub.deactivate()
        self.store.close()


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubbed]:
    s = Stubbed(monkeypatch, attempts=3, conflict_attempts=3, jitter_s=0.0)
    try:
        yield s
    finally:
        s.close()


NAME = "checkpoints/ck-000000000001.json"


def test_s3_put_once_is_a_conditional_put(stubbed: Stubbed) -> None:
    stubbed.stub.add_response("put_object", {}, stubbed.put())
    assert stubbed.store.put_once(NAME, b"rec")
    stubbed.error("put_object", "PreconditionFailed", 412, stubbed.put())
    assert not stubbed.store.put_once(NAME, b"rec")
    stubbed.stub.assert_no_pending_responses()
    assert stubbed.sleeps == []


def test_s3_conditional_conflicts_are_retried_then_fail(stubbed: Stubbed) -> None:
    # 409: another conditional write of the key is in flight; the retry settles it
    stubbed.error("put_object", "ConditionalRequestConflict", 409, stubbed.put())
    stubbed.error("put_object", "PreconditionFailed", 412, stubbed.put())
    assert not stubbed.store.put_once(NAME, b"rec")
    stubbed.error("put_object", "ConditionalRequestConflict", 409, stubbed.put())
    stubbed.stub.add_response("put_object", {}, stubbed.put())
    assert stubbed.store.put_once(NAME, b"rec")
    for _ in range(3):  # bounded: the third conflict in a row is an error
        stubbed.error("put_object", "ConditionalRequestConflict", 409, stubbed.put())
    with pytest.raises(MetadataWriteConflict, match=r"s3://bucket/ck/dstl/checkpoints/.*409"):
        stubbed.store.put_once(NAME, b"rec")
    stubbed.stub.assert_no_pending_responses()


def test_s3_a_lost_answer_then_412_reads_back_whose_write_landed(stubbed: Stubbed) -> None:
    # the first PUT landed but its answer was a 500: the retry's 412 is our own object
    stubbed.error("put_object", "InternalError", 500, stubbed.put())
    stubbed.error("put_object", "PreconditionFailed", 412, stubbed.put())
    stubbed.object(b"rec")
    assert stubbed.store.put_once(NAME, b"rec")
    # the same, but another writer's bytes are there: not ours
    stubbed.error("put_object", "SlowDown", 503, stubbed.put())
    stubbed.error("put_object", "PreconditionFailed", 412, stubbed.put())
    stubbed.object(b"someone else's record")
    assert not stubbed.store.put_once(NAME, b"rec")
    stubbed.stub.assert_no_pending_responses()
    assert stubbed.sleeps == [0.2, 0.2]


def test_s3_errors_are_typed_retried_when_transient_and_name_the_url(stubbed: Stubbed) -> None:
    for _ in range(3):  # attempts=3: every one a 503
        stubbed.error("put_object", "ServiceUnavailable", 503, None)
    with pytest.raises(MetadataStoreError, match=r"s3://bucket/ck/dstl/a: ServiceUnavailable") as e:
        stubbed.store.put("a", b"x")
    assert e.value.retryable and stubbed.sleeps == [0.2, 0.4]
    stubbed.error("get_object", "AccessDenied", 403, None)  # not retried
    with pytest.raises(MetadataStoreError, match=r"read of s3://bucket/ck/dstl/a: AccessDenied"):
        stubbed.store.get("a")
    stubbed.error("put_object", "NoSuchBucket", 404, None)
    with pytest.raises(MetadataStoreError, match=r"bucket 'bucket' does not exist") as e:
        stubbed.store.put_once(NAME, b"x")
    assert not e.value.retryable
    stubbed.error("get_object", "NoSuchKey", 404, None)
    assert stubbed.store.get("a") is None
    stubbed.stub.assert_no_pending_responses()
    assert stubbed.sleeps == [0.2, 0.4]


# ------------------------------------------------------------------ S3 for real


@pytest.mark.s3
def test_s3_wrong_credentials_and_missing_buckets_are_clear_errors(
    weed_s3: SeaweedS3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_env(monkeypatch, weed_s3)
    missing = open_metadata_store(
        "s3://no-such-bucket-dstl/x",
        s3_endpoint_url=weed_s3.endpoint_url,
        s3_region=weed_s3.region,
    )
    try:
        with pytest.raises(MetadataStoreError, match="no-such-bucket-dstl"):
            missing.list()
    finally:
        missing.close()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    wrong = open_s3(weed_s3, s3_prefix)
    try:
        with pytest.raises(MetadataStoreError, match=rf"s3://{weed_s3.bucket}/{s3_prefix}/dstl"):
            wrong.put_once(NAME, b"x")
    finally:
        wrong.close()


@pytest.mark.s3
def test_s3_objects_are_plain_keys_under_the_prefix(
    weed_s3: SeaweedS3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_env(monkeypatch, weed_s3)
    store = open_s3(weed_s3, s3_prefix)
    client = weed_s3.boto3_client()
    try:
        assert store.put_once(NAME, b"rec")
        got = client.get_object(Bucket=weed_s3.bucket, Key=f"{s3_prefix}/dstl/{NAME}")
        assert got["Body"].read() == b"rec"
        # a key beside the prefix ("dstl-other") is not the store's
        client.put_object(Bucket=weed_s3.bucket, Key=f"{s3_prefix}/dstl-other/x", Body=b"")
        assert store.list() == [NAME]
    finally:
        client.close()
        store.close()
