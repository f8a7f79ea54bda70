"""The fault proxy's counters: requests by method and S3 operation, injected faults."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any


def s3_operation(method: str, query: Mapping[str, str]) -> str:
    """Coarse S3 operation name of a request, for the stats."""
    if method == "POST" and "delete" in query:
        return "DeleteObjects"
    if method == "GET" and ("list-type" in query or "prefix" in query or "delimiter" in query):
        return "ListObjects"
    if method == "POST" and "uploads" in query:
        return "CreateMultipartUpload"
    if method == "PUT" and "partNumber" in query:
        return "UploadPart"
    return {
        "PUT": "PutObject",
        "GET": "GetObject",
        "HEAD": "HeadObject",
        "DELETE": "DeleteObject",
    }.get(method, method)


class ProxyStats:
    """Counters of one proxy.

    Event-loop only: the proxy's request handlers and control endpoints
    update and read it on the loop the proxy runs on, never from another thread.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.started = time.time()
        self.requests = 0
        self.in_flight = 0
        self.by_method: Counter[str] = Counter()
        self.by_op: Counter[str] = Counter()
        self.forwarded = 0
        self.upstream_errors = 0
        self.faults: Counter[str] = Counter()
        self.faults_by_op: Counter[str] = Counter()

    def fault(self, kind: str, op: str) -> None:
        self.faults[kind] += 1
        self.faults_by_op[f"{op}:{kind}"] += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "since": self.started,
            "requests": self.requests,
            "in_flight": self.in_flight,
            "forwarded": self.forwarded,
            "upstream_errors": self.upstream_errors,
            "by_method": dict(self.by_method),
            "by_op": dict(self.by_op),
            "faults": {k: self.faults.get(k, 0) for k in ("latency", "503", "500", "reset")},
            "faults_by_op": dict(self.faults_by_op),
        }
