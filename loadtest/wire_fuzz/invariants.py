"""The per-call invariants: ``typed-errors``, ``call-bound`` and ``call-order``.

``health`` and ``rss`` are checked by the monitor (and health also by the
workers, every ``HEALTH_EVERY_CALLS`` calls), ``bystander`` after the run.
"""

from __future__ import annotations

from loadtest.wire_fuzz.calls import Call, Outcome
from loadtest.wire_fuzz.settings import CALL_TIMEOUT_S
from loadtest.wire_fuzz.state import RunState


def check_call(run: RunState, call: Call, out: Outcome, worker: int, n: int) -> None:
    """Record in ``run`` every per-call invariant call number ``n`` broke.

    Called by the worker thread that sent the call, before its model of the
    writer is updated (``call.writer.history`` holds the calls before this one).
    """
    if run.report.stopped_early or not run.server_alive():
        return  # the server was stalled, killed or died: not this call's doing
    oversize = len(call.request) > run.settings.max_request_bytes
    w = call.writer
    if out.code == "DEADLINE_EXCEEDED" and out.kind is None:
        run.violate(
            "call-bound",
            f"{call.method}: no answer within {CALL_TIMEOUT_S:g}s",
            call.desc,
            worker,
            n,
            run.context(),
            call.method,
        )
    elif out.code != "OK":
        # gRPC itself refuses a request over max_request_bytes before the service sees it
        transport_refusal = oversize and out.code == "RESOURCE_EXHAUSTED" and out.kind is None
        if not transport_refusal and (out.code in ("UNKNOWN", "INTERNAL") or out.kind is None):
            run.violate(
                "typed-errors",
                f"{call.method} -> {out.summary()}",
                call.desc,
                worker,
                n,
                [],
                call.method,
            )
    if call.ordered and w is not None and w.clean and out.kind == "call_lost":
        run.violate(
            "call-order",
            f"{call.method} of an ordered writer (every earlier call answered) -> {out.summary()}",
            call.desc,
            worker,
            n,
            [f"earlier call of this writer: {h}" for h in w.history],
            call.method,
        )
