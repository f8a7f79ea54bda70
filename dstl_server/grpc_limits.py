"""The gRPC server's own limits, from the settings: message sizes, streams, connections.

One place turns :class:`~dstl_server.settings.ServerSettings` into the
options of the ``grpc.aio`` server (``app.py`` passes them, and
``max_concurrent_rpcs`` as the server's ``maximum_concurrent_rpcs``):

* ``max_request_bytes`` -- the largest message either way;
* ``max_streams_per_connection`` -- ``grpc.max_concurrent_streams``: HTTP/2
  streams one connection may hold open (a client's further calls queue on
  its side, costing the sidecar nothing);
* ``keepalive_time_s`` / ``keepalive_timeout_s`` -- the sidecar pings a
  connection without traffic and closes it when the ping goes unanswered,
  so a peer that vanished (its node gone, no FIN) does not keep its streams;
* ``max_connection_idle_s`` -- a connection with no call open for that long
  gets a GOAWAY (the client reconnects at its next call);
* no BDP probing (``grpc.http2.bdp_probe`` 0): with it, gRPC grows every
  stream's receive window to megabytes and takes a request off the wire
  before the sidecar reads it (measured: 6 MiB per Session stream); without
  it a stream the sidecar does not read holds 64 KiB and the rest waits on
  the client (:meth:`~dstl_server.throttle.MemoryBudget.wait_read_turn`). A read
  still opens the window to the whole message, so throughput on loopback
  is the same.

How many calls run at once over every connection is bounded by
``maximum_concurrent_rpcs``: past it gRPC answers ``RESOURCE_EXHAUSTED``
before any handler runs. Called once, at start.
"""

from __future__ import annotations

from dstl_server.settings import ServerSettings


def server_options(s: ServerSettings) -> list[tuple[str, int]]:
    """The ``grpc.aio.server`` options of these settings (0 for a time: the option is left out)."""
    options = [
        ("grpc.max_receive_message_length", s.max_request_bytes),
        ("grpc.max_send_message_length", s.max_request_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", s.max_streams_per_connection),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.keepalive_timeout_ms", _ms(s.keepalive_timeout_s)),
    ]
    if s.keepalive_time_s:
        options.append(("grpc.keepalive_time_ms", _ms(s.keepalive_time_s)))
    if s.max_connection_idle_s:
        options.append(("grpc.max_connection_idle_ms", _ms(s.max_connection_idle_s)))
    return options


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
