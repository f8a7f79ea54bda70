"""The one call lifecycle: the gate, and one error -> answer mapping for both renderings."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from dstl_client.core._pb import dstl_pb2 as pb
from dstl_client.core.errors import BudgetFull, PermissionDenied, ShuttingDown
from dstl_server.calls import MAX_ERROR_MESSAGE_CHARS, Calls
from dstl_server.metrics import ServerMetrics
from tests.fakes import MemoryUploader, registry


def _calls() -> Calls:
    return Calls(registry(MemoryUploader()), ServerMetrics())


def _count(calls: Calls, kind: str) -> float:
    return calls.metrics.errors.labels(kind)._value.get()  # type: ignore[no-any-return]


def test_a_typed_error_is_answered_with_its_kind_code_and_bounded_message() -> None:
    calls = _calls()
    exc = BudgetFull("x" * (3 * MAX_ERROR_MESSAGE_CHARS))
    answer = calls.answer(exc)
    assert (answer.status, answer.code, answer.kind, answer.typed) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "RESOURCE_EXHAUSTED",
        exc.kind,
        True,
    )
    assert len(answer.message) <= MAX_ERROR_MESSAGE_CHARS
    assert answer.message.endswith("...(truncated)")
    # the stream's rendering is the same answer, counted the same way
    out = calls.stream_error(7, exc)
    assert out == pb.SessionResponse(
        id=7, error=pb.SessionError(kind=exc.kind, code=answer.code, message=answer.message)
    )
    assert _count(calls, exc.kind) == 2


def test_a_refused_principal_counts_as_an_auth_refusal() -> None:
    calls = _calls()
    calls.stream_error(1, PermissionDenied("not your job"))
    assert calls.metrics.auth_refusals.labels("permission_denied")._value.get() == 1


def test_anything_else_is_internal_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    calls = _calls()
    with caplog.at_level(logging.ERROR, logger="dstl_server.calls"):
        out = calls.stream_error(3, RuntimeError("a bug"))
    assert out.error == pb.SessionError(
        kind="internal", code="INTERNAL", message="internal error: RuntimeError('a bug')"
    )
    assert not calls.answer(RuntimeError("again")).typed
    assert _count(calls, "internal") == 2
    assert any("internal error" in r.message for r in caplog.records)


@pytest.mark.asyncio
async def test_the_gate_counts_calls_and_refuses_new_ones_once_draining() -> None:
    calls = _calls()
    calls.enter()
    assert calls.in_flight == 1
    assert not await calls.wait_idle(0.01)
    calls.stop_accepting()
    with pytest.raises(ShuttingDown):
        calls.enter()
    idle = asyncio.ensure_future(calls.wait_idle(5))
    calls.leave()
    assert await idle
    assert calls.in_flight == 0
