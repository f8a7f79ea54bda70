"""Small helpers shared by the integration tests (real dstl-server processes)."""

from __future__ import annotations

from pathlib import Path

import grpc

from dstl_client import ChangelogClient, ChangelogHandle, ChangelogWriter
from dstl_client.core._pb import dstl_pb2_grpc as pb_grpc

TMP_SUFFIX = ".tmp-dstl"


def object_files(root: Path) -> list[Path]:
    """Every stored object (``*.dstl``) under a ServerProcess root, sorted."""
    return sorted((root / "objects").rglob("*.dstl"))


def temp_files(root: Path) -> list[Path]:
    """Leftover temp files of interrupted writes under a ServerProcess root."""
    return sorted(p for p in (root / "objects").rglob("*") if p.name.endswith(TMP_SUFFIX))


def object_path(root: Path, key: str) -> Path:
    return root / "objects" / key


def read_all(
    client: ChangelogClient, handle: ChangelogHandle, key_groups: list[int] | None = None
) -> list[tuple[int, int, bytes]]:
    return list(client.read_changes(handle, key_groups))


def raw_stub(address: str) -> tuple[grpc.Channel, pb_grpc.ChangelogStub]:
    """A bare gRPC stub that bypasses the client library's checks and buffering."""
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.ChangelogStub(channel)  # type: ignore[no-untyped-call]


class Bystander:
    """Another job's writer whose data must survive whatever a test does to the sidecar.

    It persists one checkpoint on creation; ``assert_intact`` appends and
    persists more and checks every byte of both checkpoints reads back.
    """

    def __init__(self, client: ChangelogClient, job_id: str = "bystander") -> None:
        self.client = client
        self.writer: ChangelogWriter = client.create_writer(
            job_id=job_id, operator_id="op", key_group_range=(0, 7)
        )
        self.expected: list[tuple[int, bytes]] = []
        self._write(0)

    def _write(self, round_: int) -> ChangelogHandle:
        for kg in range(8):
            data = f"bystander-{round_}-{kg}".encode() * 3
            self.writer.append(kg, data)
            self.expected.append((kg, data))
        return self.writer.persist_durably(after=0).result(timeout=30)

    def assert_intact(self) -> None:
        handle = self._write(len(self.expected) // 8)
        got = sorted((kg, data) for kg, _sqn, data in read_all(self.client, handle))
        assert got == sorted(self.expected)
