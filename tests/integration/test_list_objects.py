"""``ListObjects`` through a real ``dstl-server`` process, on file:// and on S3 (SeaweedFS).

The listing holds exactly the job's persisted objects with their sizes (as the
store itself reports them), pages with an opaque token, bounds the page size,
refuses another job's token (PERMISSION_DENIED) and malformed page tokens
(INVALID_ARGUMENT), and never shows another job's objects or temp files.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from dstl_client import ChangelogClient
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import PermissionDenied
from dstl_client.core.keys import new_object_key
from dstl_server.auth import Authenticator
from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3, find_weed

SECRET = "list-objects-node-secret-4f1c9a7e2b"
AUTH = Authenticator(SECRET)
JOB = "list-job"
OTHER = "list-job2"  # its prefix starts like JOB's
MAX_PAGE = 1000


@dataclass
class Backend:
    """A secured sidecar process on one kind of store, and direct access to that store."""

    kind: str
    proc: ServerProcess
    #: key -> size of every object of a job, straight from the store
    stored: Callable[[str], dict[str, int]]
    #: write raw objects (or anything) under keys, straight into the store
    put_raw: Callable[[list[str]], None]

    def client(self, job: str | None = JOB) -> ChangelogClient:
        token = AUTH.admin_token() if job is None else AUTH.job_token(job)
        return ChangelogClient(self.proc.address, token=token, timeout_s=30)


def _file_backend(root: Path) -> Iterator[Backend]:
    with ServerProcess(root, env={"DSTL_AUTH_SECRET": SECRET}) as proc:
        objects = Path(proc.storage.removeprefix("file://"))

        def stored(job: str) -> dict[str, int]:
            return {
                p.relative_to(objects).as_posix(): p.stat().st_size
                for p in (objects / job).rglob("*.dstl")
                if not p.name.startswith(".")
            }

        def put_raw(keys: list[str]) -> None:
            for k in keys:
                (objects / k).parent.mkdir(parents=True, exist_ok=True)
                (objects / k).write_bytes(b"raw")

        yield Backend("file", proc, stored, put_raw)


def _s3_backend(root: Path, s3: SeaweedS3, prefix: str) -> Iterator[Backend]:
    proc = ServerProcess(
        root,
        storage=s3.storage_url(prefix),
        extra_args=["--s3-endpoint-url", s3.endpoint_url, "--s3-region", s3.region],
        env={**s3.env(), "DSTL_AUTH_SECRET": SECRET},
    )
    client = s3.boto3_client()

    def stored(job: str) -> dict[str, int]:
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=s3.bucket, Prefix=f"{prefix}/{job}/"
        ):
            for obj in page.get("Contents", ()):
                out[obj["Key"][len(prefix) + 1 :]] = int(obj["Size"])
        return out

    def put_raw(keys: list[str]) -> None:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda k: client.put_object(Bucket=s3.bucket, Key=f"{prefix}/{k}", Body=b"raw"),
                    keys,
                )
            )

    try:
        with proc:
            yield Backend("s3", proc, stored, put_raw)
    finally:
        client.close()


@pytest.fixture(scope="module", autouse=True)
def _s3_server_first(request: pytest.FixtureRequest) -> None:
    """Start the session's S3 server before the per-test leak check looks at processes.

    Only when S3 tests of this module were selected and ``weed`` exists (else
    those tests skip, or fail under CI, on their own).
    """
    wanted = any(
        isinstance(item, pytest.Function)
        and item.module is request.module
        and item.get_closest_marker("s3")
        for item in request.session.items
    )
    if wanted and find_weed() is not None:
        request.getfixturevalue("weed_s3_server")


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "file":
        yield from _file_backend(tmp_path / "srv")
    else:
        s3: SeaweedS3 = request.getfixturevalue("weed_s3")
        yield from _s3_backend(tmp_path / "srv", s3, request.getfixturevalue("s3_prefix"))


def persist_rounds(client: ChangelogClient, job: str, rounds: int) -> set[str]:
    """A writer of ``job`` persisting ``rounds`` times (one new object each); their keys."""
    keys: set[str] = set()
    with client.create_writer(job_id=job, operator_id="op", key_group_range=(0, 7)) as w:
        for r in range(rounds):
            boundary = w.last_appended_sqn()
            for kg in range(r % 8 + 1):
                w.append(kg, f"{job}/{r}/{kg}/".encode() * (50 * (r + 1)))
            keys |= set(w.persist_durably(after=boundary).result(timeout=60).object_keys)
    return keys


def list_page(
    backend: Backend, job: str, page_size: int = 0, token: str = "", *, as_job: str | None = ""
) -> pb.ListObjectsResponse:
    """One raw ListObjects call (no client-side paging or checks) with the token of
    ``as_job`` (default ``job`` itself; ``None``: the admin)."""
    auth = AUTH.admin_token() if as_job is None else AUTH.job_token(as_job or job)
    with grpc.insecure_channel(backend.proc.address) as channel:
        stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
        resp: pb.ListObjectsResponse = stub.ListObjects(
            pb.ListObjectsRequest(job_id=job, page_size=page_size, page_token=token),
            timeout=30,
            metadata=(("authorization", f"Bearer {auth}"),),
        )
        return resp


def status_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    code: grpc.StatusCode = info.value.code()  # type: ignore[attr-defined]
    return code


# ------------------------------------------------------------------------ tests
def test_lists_exactly_the_persisted_objects(backend: Backend) -> None:
    started = time.time()
    with backend.client(JOB) as a, backend.client(OTHER) as b:
        mine = persist_rounds(a, JOB, 5)
        theirs = persist_rounds(b, OTHER, 2)
        assert len(mine) == 5 and len(theirs) == 2
        stored = backend.stored(JOB)
        assert set(stored) == mine
        listed = list(a.list_objects(JOB))
        # every persisted object once, in key order, with the size the store reports
        assert [(o.key, o.size) for o in listed] == sorted(stored.items())
        for o in listed:
            assert started - 2 <= o.modified <= time.time() + 2
        assert {o.key for o in b.list_objects(OTHER)} == theirs == set(backend.stored(OTHER))
        # discarded objects are no longer listed
        gone = sorted(mine)[:2]
        assert a.discard_objects(JOB, gone) == 2
        assert [o.key for o in a.list_objects(JOB)] == sorted(mine - set(gone))
        with backend.client("list-job-empty") as empty:
            assert list(empty.list_objects("list-job-empty")) == []
        assert "dstl_list_requests_total" in backend.proc.scrape_metrics()


def test_pages_with_an_opaque_token(backend: Backend) -> None:
    with backend.client(JOB) as a:
        keys = sorted(persist_rounds(a, JOB, 7))
        for page_size in (1, 2, 3, 7, 8):
            pages: list[list[str]] = []
            token = ""
            while True:
                resp = list_page(backend, JOB, page_size, token)
                assert len(resp.objects) <= page_size
                pages.append([o.object_key for o in resp.objects])
                token = resp.next_page_token
                if not token:
                    break
                assert token.startswith(JOB + "/")
            assert [k for p in pages for k in p] == keys, page_size
            # full pages until the last (which may be empty when it fits exactly)
            assert all(len(p) == page_size for p in pages[:-1])
            assert len(pages) == len(keys) // page_size + 1
        # the client pages the same way
        assert [o.key for o in a.list_objects(JOB, page_size=2)] == keys
        before = backend.proc.scrape_metrics()["dstl_list_requests_total"]
        list(a.list_objects(JOB, page_size=3))
        assert backend.proc.scrape_metrics()["dstl_list_requests_total"] == before + 3


def test_page_size_is_bounded(backend: Backend) -> None:
    job = "list-bulk"
    keys = sorted(new_object_key(job) for _ in range(MAX_PAGE + 3))
    backend.put_raw(keys)
    for asked in (0, MAX_PAGE + 1, 2**32 - 1):
        first = list_page(backend, job, asked)
        assert [o.object_key for o in first.objects] == keys[:MAX_PAGE], asked
        assert first.next_page_token == keys[MAX_PAGE - 1]
        rest = list_page(backend, job, asked, first.next_page_token)
        assert [o.object_key for o in rest.objects] == keys[MAX_PAGE:]
        assert rest.next_page_token == ""
    assert all(o.size == 3 for o in first.objects)
    with backend.client(job) as c:
        assert [o.key for o in c.list_objects(job, page_size=10**6)] == keys


def test_only_objects_of_the_job_are_listed(backend: Backend) -> None:
    with backend.client(JOB) as a:
        mine = persist_rounds(a, JOB, 2)
        h32 = "0" * 32
        backend.put_raw(
            [
                f"{JOB}/README",
                f"{JOB}/ab/not-an-object.dstl",
                f"{JOB}/zz/{h32}.dstl",
                f"{JOB}/ab/{h32}.txt",
                f"{JOB}/ab/cd/{h32}.dstl",
                f"{JOB}/ab/.{h32}.dstl.1234abcd.tmp-dstl",  # a write in progress
                f"{OTHER}/ab/{h32}.dstl",
                f"{JOB}x/ab/{h32}.dstl",
            ]
        )
        assert {o.key for o in a.list_objects(JOB)} == mine
        # pages of junk only come back empty, but the listing goes on past them
        assert {o.key for o in a.list_objects(JOB, page_size=1)} == mine


def test_another_jobs_token_is_refused(backend: Backend) -> None:
    with backend.client(JOB) as a, backend.client(OTHER) as b, backend.client(None) as admin:
        mine = persist_rounds(a, JOB, 2)
        with pytest.raises(PermissionDenied):
            list(b.list_objects(JOB))
        assert (
            status_of(lambda: list_page(backend, JOB, as_job=OTHER))
            == grpc.StatusCode.PERMISSION_DENIED
        )
        # the admin lists any job; no token at all is unauthenticated
        assert {o.key for o in admin.list_objects(JOB)} == mine
        with grpc.insecure_channel(backend.proc.address) as channel:
            stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
            code = status_of(lambda: stub.ListObjects(pb.ListObjectsRequest(job_id=JOB)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        refusals = backend.proc.scrape_metrics()
        assert refusals['dstl_auth_refusals_total{reason="permission_denied"}'] >= 2


@pytest.mark.parametrize(
    "token",
    [
        f"{OTHER}/ab/{'0' * 32}.dstl",  # another job's key
        f"{JOB}x/ab/{'0' * 32}.dstl",
        "/abs",
        f"/{JOB}/ab/x",
        f"{JOB}/",
        f"{JOB}//ab",
        f"{JOB}/../{OTHER}/ab/{'0' * 32}.dstl",
        f"{JOB}/ab/\x00",
        f"{JOB}/" + "a" * 2000,
        "x",
    ],
)
def test_malformed_page_tokens_are_invalid_arguments(backend: Backend, token: str) -> None:
    assert status_of(lambda: list_page(backend, JOB, 5, token)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )


def test_bad_job_ids_are_invalid_arguments(backend: Backend) -> None:
    for job in ("", "../x", "a/b", "x" * 200):
        assert status_of(functools.partial(list_page, backend, job, as_job=None)) == (
            grpc.StatusCode.INVALID_ARGUMENT
        )


def test_a_page_ends_before_it_outgrows_a_message(tmp_path: Path) -> None:
    """With a small message limit and the longest job ids, 1000 keys do not fit
    one answer: the page ends early with a token, and paging lists them all."""
    job = "j" * 128
    limit = 64 * 1024 + 1024
    args = ["--max-request-bytes", str(limit), "--max-change-bytes", "1024"]
    with ServerProcess(tmp_path / "srv", env={"DSTL_AUTH_SECRET": SECRET}, extra_args=args) as p:
        objects = Path(p.storage.removeprefix("file://"))
        keys = sorted(new_object_key(job) for _ in range(MAX_PAGE))
        for k in keys:
            (objects / k).parent.mkdir(parents=True, exist_ok=True)
            (objects / k).write_bytes(b"raw")
        backend = Backend("file", p, lambda _: {}, lambda _: None)
        first = list_page(backend, job)
        assert 0 < len(first.objects) < MAX_PAGE
        assert first.ByteSize() <= limit
        assert first.next_page_token == first.objects[-1].object_key
        with ChangelogClient(
            p.address,
            token=AUTH.job_token(job),
            timeout_s=30,
            max_message_bytes=limit,
            batch_bytes=1024,
        ) as c:
            assert [o.key for o in c.list_objects(job)] == keys
