"""The command line of the wire fuzzer (``python -m loadtest.wire_fuzz``)."""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from loadtest.wire_fuzz.report import FuzzReport
from loadtest.wire_fuzz.runner import run_fuzz
from loadtest.wire_fuzz.settings import OPS, FuzzSettings


def build_parser() -> argparse.ArgumentParser:
    d = FuzzSettings()
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.wire_fuzz",
        description="Fuzz the dstl sidecar's gRPC API on the wire and check it stays typed, "
        "bounded, healthy, within memory, and harmless to other jobs.",
    )
    parser.add_argument("--duration-s", type=float, default=300.0, help="how long to fuzz")
    parser.add_argument(
        "--max-calls", type=int, default=5_000_000, help="stop after this many calls"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent fuzzing threads")
    parser.add_argument(
        "--address",
        default="",
        help="fuzz this sidecar (host:port) instead of starting one; it must run with the "
        "fuzzer's settings (printed at start)",
    )
    parser.add_argument("--server-pid", type=int, default=None, help="with --address: for RSS")
    parser.add_argument("--dir", default="", help="server root (default: a temporary directory)")
    parser.add_argument("--progress-s", type=float, default=5.0, help="progress line interval")
    parser.add_argument(
        "--ops",
        default="",
        help="comma-separated subset of the operations to run (default all): "
        + ",".join(name for name, _ in OPS),
    )
    parser.add_argument(
        "--ordered-fraction",
        type=float,
        default=0.5,
        help="fraction of writers whose calls carry the right session and seq (default 0.5)",
    )
    parser.add_argument(
        "--max-in-flight-bytes", type=int, default=d.max_in_flight_bytes, help="server setting"
    )
    parser.add_argument(
        "--max-request-bytes", type=int, default=d.max_request_bytes, help="server setting"
    )
    parser.add_argument(
        "--max-change-bytes", type=int, default=d.max_change_bytes, help="server setting"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Fuzz a sidecar (``--address``) or one this starts; exit status 1 on any MISS."""
    d = FuzzSettings()
    ns = build_parser().parse_args(argv)
    settings = FuzzSettings(
        max_in_flight_bytes=ns.max_in_flight_bytes,
        max_request_bytes=ns.max_request_bytes,
        max_change_bytes=ns.max_change_bytes,
        batch_size_threshold=min(d.batch_size_threshold, ns.max_in_flight_bytes),
    )
    seed = ns.seed if ns.seed is not None else random.SystemRandom().randrange(1 << 32)
    print("server settings: " + " ".join(settings.server_args()), flush=True)

    def go(address: str, pid: int | None, kill: Callable[[], None] | None) -> FuzzReport:
        return run_fuzz(
            address,
            settings=settings,
            duration_s=ns.duration_s,
            max_calls=ns.max_calls,
            seed=seed,
            workers=ns.workers,
            server_pid=pid,
            on_runaway=kill,
            progress_s=ns.progress_s,
            log=lambda line: print(line, flush=True),
            ops=[o for o in ns.ops.split(",") if o],
            ordered_fraction=ns.ordered_fraction,
        )

    if ns.address:
        report = go(ns.address, ns.server_pid, None)
    else:
        from dstl_server.testing import ServerProcess

        with tempfile.TemporaryDirectory(prefix="dstl-fuzz-") as tmp:
            root = Path(ns.dir or tmp) / "srv"
            with ServerProcess(root, extra_args=settings.server_args()) as proc:
                assert proc.proc is not None
                report = go(proc.address, proc.proc.pid, proc.kill)
            tail = (
                proc.stderr_path.read_text(errors="replace")[-1500:]
                if proc.stderr_path.exists()
                else ""
            )
            if not report.passed and tail:
                print("server stderr (tail):\n" + tail)
    print(report.render(), flush=True)
    print(f"seed {seed}: " + ("PASS" if report.passed else "FAIL"), flush=True)
    return 0 if report.passed else 1
