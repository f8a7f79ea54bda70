"""A real ``dstl-server`` on a Unix domain socket, alone and together with TCP."""

from __future__ import annotations

import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dstl_client import ChangelogClient
from dstl_server.testing import ServerProcess
from tests.integration._helpers import read_all

#: sun_path holds 108 bytes on Linux, pytest's tmp_path can be longer
_MAX_SOCKET_PATH = 100


@pytest.fixture
def socket_path(tmp_path: Path) -> Iterator[Path]:
    """A socket path short enough for sun_path, inside a temp dir removed afterwards."""
    path = tmp_path / "dstl.sock"
    if len(str(path)) <= _MAX_SOCKET_PATH:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="dstl-") as short:
        yield Path(short) / "dstl.sock"


@pytest.mark.slow
def test_unix_socket_only(tmp_path: Path, socket_path: Path) -> None:
    """``--listen ''`` serves on the socket only; the client takes ``unix://``."""
    root = tmp_path / "srv"
    with ServerProcess(root, listen="", unix_socket=str(socket_path)) as proc:
        assert proc.address == f"unix://{socket_path}"
        assert socket_path.is_socket()
        # Owner and group may connect, others may not.
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o660
        with ChangelogClient(proc.address) as client:
            w = client.create_writer(job_id="uds", operator_id="op", key_group_range=(0, 3))
            w.append(1, b"x" * 1000)
            w.append(2, b"y")
            t = w.last_appended_sqn()
            w.append(3, b"z")
            h = w.persist_durably(after=0).result(timeout=30)
            assert read_all(client, h) == [(1, 0, b"x" * 1000), (2, 0, b"y"), (3, t, b"z")]
            w.truncate(before=t)
            h2 = w.persist_durably(after=t).result(timeout=30)
            assert read_all(client, h2) == [(3, t, b"z")]
            w.close()
        assert proc.stop() == 0
    # A clean stop removes the socket file.
    assert not socket_path.exists()


@pytest.mark.slow
def test_tcp_and_unix_socket_serve_one_registry(tmp_path: Path, socket_path: Path) -> None:
    root = tmp_path / "srv"
    # Both writers are new to the job, so the flush waits only the persist delay
    # for them; a long delay makes "one flush" independent of a loaded machine.
    with ServerProcess(
        root, unix_socket=str(socket_path), extra_args=["--persist-delay-ms", "1500"]
    ) as proc:
        assert not proc.address.startswith("unix:")
        with (
            ChangelogClient(proc.address) as tcp,
            ChangelogClient(f"unix://{socket_path}") as uds,
        ):
            w_tcp = tcp.create_writer(job_id="both", operator_id="a", key_group_range=(0, 1))
            w_uds = uds.create_writer(job_id="both", operator_id="b", key_group_range=(2, 3))
            assert tcp.server_epoch == uds.server_epoch
            w_tcp.append(0, b"over tcp")
            w_uds.append(2, b"over uds")
            f_tcp = w_tcp.persist_durably(after=0)
            f_uds = w_uds.persist_durably(after=0)
            h_tcp, h_uds = f_tcp.result(timeout=30), f_uds.result(timeout=30)
            # Both writers belong to one job on one sidecar: one flush, one object.
            assert h_tcp.object_keys == h_uds.object_keys
            # Handles made over one transport read back over the other.
            assert read_all(uds, h_tcp) == [(0, 0, b"over tcp")]
            assert read_all(tcp, h_uds) == [(2, 0, b"over uds")]
    assert not socket_path.exists()


@pytest.mark.slow
def test_stale_socket_file_is_replaced(tmp_path: Path, socket_path: Path) -> None:
    """A socket left by a crashed sidecar does not stop the next one from starting."""
    root = tmp_path / "srv"
    with ServerProcess(root, listen="", unix_socket=str(socket_path)) as first:
        first.kill()
    assert socket_path.is_socket()
    with (
        ServerProcess(root, listen="", unix_socket=str(socket_path)) as second,
        ChangelogClient(second.address) as client,
    ):
        client.create_writer(job_id="again", operator_id="op", key_group_range=(0, 0)).close()
