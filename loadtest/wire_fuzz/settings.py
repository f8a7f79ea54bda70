"""The wire fuzzer's numbers: server settings it assumes, limits, job names, the op mix.

Everything here is immutable and shared by every module of the fuzzer (and
read from any thread).
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1 << 10
MiB = 1 << 20
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1

SERVICE = "/dstl.v1.Changelog/"

#: every call must be answered within this (its gRPC deadline)
CALL_TIMEOUT_S = 10.0
#: a health check must answer SERVING within this
HEALTH_TIMEOUT_S = 1.0
#: each worker checks health after this many of its calls
HEALTH_EVERY_CALLS = 25
#: the monitor thread checks health and samples RSS this often
MONITOR_INTERVAL_S = 0.25
#: RSS bound: start RSS + RSS_IN_FLIGHT_FACTOR x max_in_flight_bytes + read_cache_bytes
#: + RSS_SLACK_BYTES
RSS_IN_FLIGHT_FACTOR = 4
#: (64 MiB until a 2-core CI run peaked 4 MiB over it for half a second, at 252 MiB,
#: while decoding 200k-part requests and 2 MB of garbage, back to 137 MiB 5 s later;
#: a leak stays over the bound, a decoding peak does not)
RSS_SLACK_BYTES = 96 * MiB
#: past the bound by this much, a server this run started is killed (protects the machine)
RUNAWAY_BYTES = 1024 * MiB
#: the run stops after this many consecutive failed monitor health checks (server stalled)
FATAL_HEALTH_FAILURES = 8
#: writers a worker keeps; a writer is replaced after this many calls
WRITERS_PER_WORKER = 4
WRITER_MAX_CALLS = 150
#: share of a chaotic writer's calls (and of garbage made of them) sent on a Session stream
STREAM_FRACTION = 0.3
#: of those, the share sent on a Mux stream (in one message with a second request,
#: for a writer the sidecar does not know: answered alone) instead of a Session stream
MUX_FRACTION = 0.5
#: distinct violations kept with their example (the rest are only counted)
MAX_DISTINCT_VIOLATIONS = 60
DESC_LIMIT = 700

FUZZ_JOBS = ("fuzz-a", "fuzz-b")
BYSTANDER_JOB = "bystander"
INVARIANTS = ("typed-errors", "call-bound", "call-order", "health", "rss", "bystander")

INTERESTING_U64 = (
    0,
    1,
    2,
    (1 << 31) - 1,
    1 << 31,
    U32,
    1 << 32,
    1 << 40,
    1 << 53,
    (1 << 63) - 1,
    1 << 63,
    U64 - 1,
    U64,
)
INTERESTING_U32 = (0, 1, (1 << 24) - 1, 1 << 24, (1 << 31) - 1, 1 << 31, U32 - 1, U32)
#: every RPC of the service (garbage goes to any of them)
METHODS = (
    "CreateWriter",
    "Append",
    "LastAppendedSqn",
    "PersistDurably",
    "Truncate",
    "CloseWriter",
    "ReadChanges",
    "DiscardObjects",
    "ListObjects",
    "Forward",
)

#: what a worker does, with weights (``--ops`` picks a subset)
OPS: tuple[tuple[str, int], ...] = (
    ("append", 28),
    ("persist", 12),
    ("last_sqn", 4),
    ("truncate", 6),
    ("close", 2),
    ("create_bad", 4),
    ("read", 20),
    ("discard", 3),
    ("list", 4),
    ("foreign", 6),
    ("forward", 4),
    ("garbage", 12),
    ("hoard", 4),
)
#: what the hoarding writer appends: memory the budget must see
HOARD_MODES: tuple[tuple[str, int], ...] = (
    ("many_empty", 3),
    ("many_small", 3),
    ("zero_count", 1),
    ("near_limit", 2),
    ("many_groups", 1),
)


@dataclass(frozen=True, slots=True)
class FuzzSettings:
    """The server settings the fuzzer assumes (and passes to a server it starts).

    Frozen: one instance is shared by every thread of a run.
    """

    max_in_flight_bytes: int = 32 * MiB
    max_request_bytes: int = 2 * MiB
    max_change_bytes: int = 512 * KiB
    batch_size_threshold: int = 4 * MiB
    preemptive_persist_threshold: int = 1 * MiB
    call_order_timeout_s: float = 0.5
    backpressure_timeout_s: float = 1.0
    upload_timeout_s: float = 2.0
    upload_deadline_s: float = 5.0
    persist_delay_ms: float = 5.0
    #: what the sidecar keeps of its uploads for reads: counted in the RSS bound
    read_cache_bytes: int = 16 * MiB

    def server_args(self) -> list[str]:
        args: list[str] = []
        for name in self.__slots__:
            args += ["--" + name.replace("_", "-"), str(getattr(self, name))]
        return [*args, "--no-fsync"]

    @property
    def rss_allowance(self) -> int:
        return (
            RSS_IN_FLIGHT_FACTOR * self.max_in_flight_bytes
            + self.read_cache_bytes
            + RSS_SLACK_BYTES
        )
