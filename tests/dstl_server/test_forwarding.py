"""Forwarding tree, in process: a child's flush joins its parent's object of the job.

Two (or three) in-process sidecars on loopback share one ``file://`` root.
The client is synchronous, so its calls run in threads while the servers
serve on the test's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc
from dstl_client.core.errors import InvalidArgument, PermissionDenied
from dstl_client.core.format import EncodedSection, verify_object
from dstl_server.app import DstlServer
from dstl_server.auth import NODE, Authenticator, Principal, check_job, check_node
from dstl_server.forwarder import _check_answer, decode_forwarded
from dstl_server.testing import running_server

T = TypeVar("T")
JOB = "job-fwd"


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    return await asyncio.to_thread(fn, *args)


def storage_of(root: Path) -> str:
    return f"file://{root.resolve() / 'objects'}"


def objects(root: Path) -> list[Path]:
    return sorted((root / "objects").rglob("*.dstl"))


def write(writer: ChangelogWriter, tag: str) -> list[tuple[int, bytes]]:
    out = []
    for kg in range(4):
        data = f"{tag}-{kg}".encode() * 5
        writer.append(kg, data)
        out.append((kg, data))
    return out


def read(client: ChangelogClient, handle: ChangelogHandle) -> list[tuple[int, bytes]]:
    return sorted((kg, data) for kg, _sqn, data in client.read_changes(handle))


async def wait_queued(server: DstlServer, job: str, timeout_s: float = 10.0) -> None:
    """Until ``job``'s next object on ``server`` holds something (a forwarded section)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        sch = server.registry.uploads._schedulers.get(job)
        if sch is not None and sch.queued_bytes > 0:
            return
        assert asyncio.get_running_loop().time() < deadline, "nothing was forwarded"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_child_sections_merge_into_the_parents_object(tmp_path: Path) -> None:
    storage = storage_of(tmp_path)
    async with (
        running_server(tmp_path / "p", storage=storage, persist_delay_ms=60_000.0) as parent,
        running_server(
            tmp_path / "c", storage=storage, persist_delay_ms=1.0, parent=parent.address
        ) as child,
    ):
        pc, cc = ChangelogClient(parent.address), ChangelogClient(child.address)
        try:
            # two writers on the parent: one persist alone does not flush it
            p1 = await off_loop(
                lambda: pc.create_writer(job_id=JOB, operator_id="o", key_group_range=(0, 3))
            )
            p2 = await off_loop(
                lambda: pc.create_writer(job_id=JOB, operator_id="o", key_group_range=(0, 3))
            )
            c1 = await off_loop(
                lambda: cc.create_writer(job_id=JOB, operator_id="o", key_group_range=(0, 3))
            )
            want = {w.log_id: write(w, w.log_id) for w in (p1, p2, c1)}
            fc = c1.persist_durably(0)
            await wait_queued(parent, JOB)
            f1 = p1.persist_durably(0)
            f2 = p2.persist_durably(0)  # every parent writer waits: flush now
            handles = [await asyncio.wrap_future(f) for f in (fc, f1, f2)]
            keys = {k for h in handles for k in h.object_keys}
            assert len(keys) == 1, keys
            assert len(objects(tmp_path)) == 1
            index = verify_object(objects(tmp_path)[0].read_bytes())
            assert {lid.hex() for lid in index.sections} == set(want)
            for h in handles:  # byte-exact through either sidecar
                assert await off_loop(read, pc, h) == sorted(want[h.log_id])
                assert await off_loop(read, cc, h) == sorted(want[h.log_id])
            assert child.metrics.forwarded_batches._value.get() == 1
            assert parent.metrics.forward_received_batches._value.get() == 1
        finally:
            pc.close()
            cc.close()


@pytest.mark.asyncio
async def test_an_unreachable_parent_means_a_direct_upload_then_a_backoff(tmp_path: Path) -> None:
    async with running_server(tmp_path / "gone") as gone:
        dead = gone.address
    async with running_server(tmp_path, persist_delay_ms=1.0, parent=dead) as child:
        client = ChangelogClient(child.address)
        try:
            w = await off_loop(
                lambda: client.create_writer(job_id=JOB, operator_id="o", key_group_range=(0, 3))
            )
            after = 0
            for round_ in range(2):
                want = await off_loop(write, w, f"r{round_}")
                handle = await asyncio.wrap_future(w.persist_durably(after))
                after = handle.to_sqn
                assert await off_loop(read, client, handle) == sorted(want)
            fallbacks = child.metrics.forward_fallbacks
            assert fallbacks.labels("unavailable")._value.get() == 1
            assert fallbacks.labels("backoff")._value.get() == 1
            assert len(objects(tmp_path)) == 2
        finally:
            client.close()


def _section(length: int) -> EncodedSection:
    return EncodedSection(b"\x00" * 16, 1, 2, [b"x" * length], length)


def test_an_answer_that_does_not_match_what_was_sent_is_refused() -> None:
    key = f"{JOB}/ab/{'c' * 32}.dstl"
    ok = pb.ForwardResponse(object_key=key, placements=[pb.SectionPlacement(offset=12, length=5)])
    assert _check_answer(JOB, [_section(5)], ok) == (key, [(12, 5)])
    with pytest.raises(ValueError):
        _check_answer(JOB, [_section(6)], ok)
    with pytest.raises(ValueError):
        _check_answer(JOB, [_section(5), _section(5)], ok)
    with pytest.raises(PermissionDenied):
        _check_answer("other-job", [_section(5)], ok)


def test_a_forwarded_section_must_be_a_valid_log_section() -> None:
    with pytest.raises(InvalidArgument):
        decode_forwarded(b"LOG1" + b"\x00" * 60)


def test_only_a_node_token_may_forward_and_it_may_do_nothing_else() -> None:
    auth = Authenticator("k7Qv2-node-secret-9fLx3mZp8RtYw4Hs6Jd1")
    assert auth.principal(auth.node_token()) == NODE
    check_node(NODE)
    check_node(None)  # auth off
    for who in (Principal(JOB), auth.principal(auth.admin_token())):
        with pytest.raises(PermissionDenied):
            check_node(who)
    with pytest.raises(PermissionDenied):
        check_job(NODE, JOB)
    # a job named "node" gets a job token, never the node token
    assert auth.principal(auth.job_token("node")) == Principal("node")


SECRET = "k7Qv2-node-secret-9fLx3mZp8RtYw4Hs6Jd1"


@pytest.mark.asyncio
async def test_with_auth_a_child_forwards_with_the_node_token_a_job_token_cannot(
    tmp_path: Path,
) -> None:
    auth = Authenticator(SECRET)
    storage = storage_of(tmp_path)
    async with (
        running_server(tmp_path / "p", storage=storage, auth_secret=SECRET) as parent,
        running_server(
            tmp_path / "c",
            storage=storage,
            auth_secret=SECRET,  # the node token is derived from the shared secret
            persist_delay_ms=1.0,
            parent=parent.address,
        ) as child,
    ):
        client = ChangelogClient(child.address, token=auth.job_token(JOB))
        try:
            w = await off_loop(
                lambda: client.create_writer(job_id=JOB, operator_id="o", key_group_range=(0, 3))
            )
            want = await off_loop(write, w, "x")
            handle = await asyncio.wrap_future(w.persist_durably(0))
            assert await off_loop(read, client, handle) == sorted(want)
            assert child.metrics.forwarded_batches._value.get() == 1
        finally:
            client.close()
        section = (objects(tmp_path)[0].read_bytes())[
            handle.entries[0].offset : handle.entries[0].offset + handle.entries[0].length
        ]
        async with grpc.aio.insecure_channel(parent.address) as channel:
            stub = pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]
            for token in (auth.job_token(JOB), auth.admin_token()):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.Forward(
                        pb.ForwardRequest(job_id=JOB, sections=[section]),
                        metadata=(("authorization", f"Bearer {token}"),),
                    )
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Forward(pb.ForwardRequest(job_id=JOB, sections=[section]))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # a node token, but a sender name longer than any node sends
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Forward(
                    pb.ForwardRequest(job_id=JOB, sections=[section], sender="n" * 65),
                    metadata=(("authorization", f"Bearer {auth.node_token()}"),),
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "sender" in (info.value.details() or "")
        assert len(objects(tmp_path)) == 1  # refused calls stored nothing


@pytest.mark.asyncio
async def test_a_parent_slower_than_the_forward_timeout_means_a_direct_upload(
    tmp_path: Path,
) -> None:
    storage = storage_of(tmp_path)
    async with (
        running_server(tmp_path / "p", storage=storage, persist_delay_ms=60_000.0) as parent,
        running_server(
            tmp_path / "c",
            storage=storage,
            persist_delay_ms=1.0,
            parent=parent.address,
            forward_timeout_s=0.3,
        ) as child,
    ):
        client = ChangelogClient(child.address)
        pclient = ChangelogClient(parent.address)
        try:
            # the parent has a writer of the job that does not persist: it waits its delay
            await off_loop(
                lambda: pclient.create_writer(job_id=JOB, operator_id="p", key_group_range=(0, 3))
            )
            w = await off_loop(
                lambda: client.create_writer(job_id=JOB, operator_id="o", key_group_range=(0, 3))
            )
            want = await off_loop(write, w, "slow")
            handle = await asyncio.wrap_future(w.persist_durably(0))
            assert await off_loop(read, client, handle) == sorted(want)
            assert child.metrics.forward_fallbacks.labels("deadline")._value.get() == 1
            assert child.metrics.forwarded_batches._value.get() == 0
            assert len(objects(tmp_path)) == 1  # the child's own upload
        finally:
            client.close()
            pclient.close()
    # the parent completed its copy at shutdown: an object no handle names (orphan sweep)
    assert len(objects(tmp_path)) == 2
