"""Wire fuzzer of the ``dstl.v1.Changelog`` service (``make bench-fuzz``).

Sends raw gRPC requests straight onto the wire, bypassing every check of
``dstl_client``: random log ids (own writers, random hex, empty, huge),
numbers up to 2^64-1 (``seq``, ``session``, ``after``, ``before``, SQN
ranges, handle offsets and lengths) and 2^32-1 (key groups, counts, page
sizes), key-group parts that are empty, inconsistent, zero-count, too large
or very many, requests near and over the message limit, ``ReadChanges``
handles with random offsets, lengths, SQN and key-group ranges, foreign,
traversing and absolute object keys and bad format versions,
``CreateWriter`` and ``DiscardObjects`` with bad arguments, ``ListObjects``
pages of the fuzz jobs (first pages and the next pages their answers named),
of other jobs, with huge page sizes, malformed or foreign page tokens and bad
job ids, ``Forward`` calls of valid, corrupt (body or header), empty and
garbage sections, and plain garbage request bytes to every RPC. The
amplification shapes (requests that are small on the wire and huge once
decoded) are among them: real handles padded with up to a million empty
entries, up to a million blank key-group parts, empty discard keys and empty
forwarded sections; the ``typed-errors``, ``call-bound`` and ``rss``
invariants hold for them like for any request.

Invariants (a violation is printed with the request that caused it, the
seed, the worker and call number, and the calls around it):

* ``typed-errors``: every call ends OK or with a typed error: a status other
  than UNKNOWN and INTERNAL that carries the ``dstl-error-kind`` trailer. The
  one exception is a request larger than ``max_request_bytes``, which gRPC
  itself refuses with RESOURCE_EXHAUSTED before the service sees it.
* ``call-bound``: every call is answered within ``CALL_TIMEOUT_S`` (10 s);
  the fuzz server runs with short sequencing, backpressure and upload
  timeouts, so no legitimate wait comes near it.
* ``call-order``: half of the writers are *ordered*: their calls carry the
  writer's session and the next ``seq``, one at a time, exactly as the
  client library sends them, with only their other fields fuzzed. Every such
  call was answered, so the sidecar must never tell such a writer that one of
  its calls was lost (``call_lost``): a refused call must still take its
  turn. (The other writers send random sessions and seqs.)
* ``health``: ``grpc.health.v1.Health/Check`` answers SERVING within 1 s,
  checked by every worker every ``HEALTH_EVERY_CALLS`` calls and by a monitor
  thread every ``MONITOR_INTERVAL_S``.
* ``rss``: the server's RSS (sampled every ``MONITOR_INTERVAL_S``) stays
  below ``start RSS + 4 x max_in_flight_bytes + read_cache_bytes + 96 MiB``
  (about 300 MiB with the fuzz settings; the read cache keeps up to
  ``read_cache_bytes`` of the objects the sidecar uploaded). The sidecar bounds what it holds by ``max_in_flight_bytes``
  (one request may overcommit it by one request's worth of parts); on top
  come objects being encoded (about the in-flight bytes again), the requests
  being decoded (a few times ``max_request_bytes`` each) and allocator slack.
  Four times the budget plus 96 MiB holds all of that with room; memory the
  budget does not see (parts it does not charge, buffers the allocator never
  returns) crosses it within seconds. Each worker keeps one *hoarding*
  writer that only appends big many-part batches and never persists, so such
  memory piles up instead of being freed by the next persist. When the
  fuzzer started the server itself it kills it once RSS runs 1 GiB past the
  bound, to protect the machine.
* ``bystander``: a writer of another job, written with the real client
  before the fuzzing, reads back byte-exact afterwards and can still append
  and persist.

``python -m loadtest.wire_fuzz --duration-s 300 [--seed N]`` starts its own
server (or fuzzes ``--address``, with ``--server-pid`` for the RSS check),
prints progress every few seconds and ends with a PASS/MISS line per
invariant; the exit status is 1 if any invariant was violated. ``--ops``
narrows the operation mix, ``--ordered-fraction`` the share of ordered
writers. A seed fixes every random choice of every worker; the requests also
depend on the server's answers and timing, so a replay usually but not always
hits the same failure, which is why each violation prints its request.

Modules: :mod:`~loadtest.wire_fuzz.settings` (limits, op mix,
:class:`FuzzSettings`), :mod:`~loadtest.wire_fuzz.encoding` (raw protobuf,
descriptions), :mod:`~loadtest.wire_fuzz.calls` (a call on the wire),
:mod:`~loadtest.wire_fuzz.gen` (request generators, one module per family of
RPCs), :mod:`~loadtest.wire_fuzz.invariants` (the per-call checks),
:mod:`~loadtest.wire_fuzz.state` (what the threads of a run share),
:mod:`~loadtest.wire_fuzz.worker` and :mod:`~loadtest.wire_fuzz.monitor`
(the threads), :mod:`~loadtest.wire_fuzz.bystander`,
:mod:`~loadtest.wire_fuzz.runner` (:func:`run_fuzz`),
:mod:`~loadtest.wire_fuzz.report` (:class:`FuzzReport`) and
:mod:`~loadtest.wire_fuzz.cli`.
"""

from __future__ import annotations

from loadtest.wire_fuzz.bystander import Bystander
from loadtest.wire_fuzz.calls import Call, Outcome, Writer, check_health, invoke
from loadtest.wire_fuzz.cli import main
from loadtest.wire_fuzz.encoding import Part, describe, describe_parts, encode_parts
from loadtest.wire_fuzz.gen import Gen
from loadtest.wire_fuzz.report import FuzzReport, Violation
from loadtest.wire_fuzz.runner import run_fuzz
from loadtest.wire_fuzz.settings import (
    CALL_TIMEOUT_S,
    HEALTH_TIMEOUT_S,
    HOARD_MODES,
    INVARIANTS,
    OPS,
    FuzzSettings,
)

__all__ = [
    "CALL_TIMEOUT_S",
    "HEALTH_TIMEOUT_S",
    "HOARD_MODES",
    "INVARIANTS",
    "OPS",
    "Bystander",
    "Call",
    "FuzzReport",
    "FuzzSettings",
    "Gen",
    "Outcome",
    "Part",
    "Violation",
    "Writer",
    "check_health",
    "describe",
    "describe_parts",
    "encode_parts",
    "invoke",
    "main",
    "run_fuzz",
]
