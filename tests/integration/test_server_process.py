"""End to end through a real ``dstl-server`` process: the FLIP-158 lifecycle, handles
crossing process boundaries, and corrupt, truncated or deleted objects."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from dstl_client import ChangelogClient, ChangelogHandle
from dstl_client.core.errors import BlobNotFound, CorruptObject, LogNotFound
from dstl_client.core.format import parse_object, verify_object
from dstl_server.app import DstlServer
from dstl_server.log import PART_OVERHEAD_BYTES
from dstl_server.testing import ServerProcess
from tests.integration._helpers import object_files, object_path, read_all

JOB = "job-lifecycle"


@pytest.mark.slow
def test_flip158_state_change_lifecycle(tmp_path: Path, transport: str) -> None:
    """Seed 000, "State change lifecycle": CP1, materialization at T2, CP2, truncate, CP3."""
    root = tmp_path / "srv"
    with ServerProcess(root) as proc, ChangelogClient(proc.address, transport=transport) as client:
        w = client.create_writer(job_id=JOB, operator_id="list-state", key_group_range=(0, 127))
        # On startup the state is empty: StateChangelog.sqn = T0 = lastMaterializedSqn.
        t0 = w.last_appended_sqn()
        last_materialized = t0

        w.append(5, b"a")
        # CP1: persistDurably(after = lastMaterializedSqn = T0); the future is remembered.
        cp1_future = w.persist_durably(after=last_materialized)

        w.append(5, b"b")
        # Materialization obtains T2 from the changelog; materialized state = (T0:T2 = a,b).
        t2 = w.last_appended_sqn()

        w.append(7, b"c")
        # CP2: persistDurably(after = T0) reuses CP1's upload and adds (T1:T3 = b,c).
        cp2_future = w.persist_durably(after=last_materialized)

        cp1 = cp1_future.result(timeout=30)
        t1 = cp1.to_sqn
        assert t0 == cp1.from_sqn < t1 < t2
        assert len(cp1.entries) == 1
        assert read_all(client, cp1) == [(5, t0, b"a")]

        cp2 = cp2_future.result(timeout=30)
        t3 = cp2.to_sqn
        assert (cp2.from_sqn, t2 < t3) == (t0, True)
        # CP2 points to two objects: CP1's (reused, not re-uploaded) and a new one.
        assert cp2.entries[0] == cp1.entries[0]
        assert len(cp2.object_keys) == 2
        cp1_key, cp2_key = cp2.object_keys
        assert len(object_files(root)) == 2
        assert [(kg, d) for kg, _, d in read_all(client, cp2)] == [(5, b"a"), (5, b"b"), (7, b"c")]

        # Materialization completes: lastMaterializedSqn = T2; truncate(before = T2).
        last_materialized = t2
        w.truncate(before=t2)
        # Truncation releases references but never deletes an object a handle may use.
        assert object_path(root, cp1_key).exists()
        assert read_all(client, cp1) == [(5, t0, b"a")]

        w.append(9, b"d")
        # CP3: persistDurably(after = T2) finds (T1:T3 = b,c) and adds (T3:T4 = d).
        cp3 = w.persist_durably(after=last_materialized).result(timeout=30)
        t4 = cp3.to_sqn
        assert (cp3.from_sqn, cp3.key_group_range) == (t2, (0, 127))
        assert t4 > t3
        # The handle reuses CP2's second object, whose section starts before T2.
        assert cp3.entries[0] == cp2.entries[-1]
        assert cp3.entries[0].first_sqn < t2 <= cp3.entries[0].end_sqn
        assert cp3.object_keys[0] == cp2_key and len(cp3.object_keys) == 2
        # Recovery reads (T2:T4): c and d; "b" (SQN < T2) is filtered out.
        assert [(kg, d) for kg, _, d in read_all(client, cp3)] == [(7, b"c"), (9, b"d")]
        assert all(t2 <= sqn < t4 for _, sqn, _ in read_all(client, cp3))
        assert read_all(client, cp3, key_groups=[5]) == []
        assert [d for _, _, d in read_all(client, cp3, key_groups=[9])] == [b"d"]

        # CP2 is subsumed: the object holding only (T0:T1 = a) is no longer referenced.
        assert client.discard_objects(JOB, [cp1_key]) == 1
        assert not object_path(root, cp1_key).exists()
        assert [(kg, d) for kg, _, d in read_all(client, cp3)] == [(7, b"c"), (9, b"d")]
        w.close()
        for path in object_files(root):
            verify_object(path.read_bytes())


@pytest.mark.asyncio
async def test_lifecycle_memory_in_process(server: DstlServer) -> None:
    """Truncate frees the writer's memory, keeps objects; close drops unpersisted changes."""

    def steps() -> tuple[str, int, ChangelogHandle]:
        # The synchronous client runs in a thread; the sidecar on this test's loop.
        with ChangelogClient(server.address) as client:
            w = client.create_writer(job_id=JOB, operator_id="op", key_group_range=(0, 127))
            w.append(5, b"a" * 1000)
            w.persist_durably(after=0).result(timeout=30)
            w.append(5, b"b" * 1000)
            t2 = w.last_appended_sqn()
            w.append(7, b"c" * 1000)
            cp2 = w.persist_durably(after=0).result(timeout=30)
            w.append(9, b"d" * 1000)  # appended after CP2: only in the sidecar's memory
            w.truncate(before=t2)
            w.flush()
            return w.log_id, t2, cp2

    log_id, t2, cp2 = await asyncio.to_thread(steps)
    registry = server.registry
    wl = registry.get(log_id)
    assert wl.truncated_before == t2
    assert wl.uploaded and all(sqn >= t2 for sqn in wl.uploaded)
    assert not wl.not_uploaded and not wl.uploading
    # Uploaded data left memory; only "d" (its 4-byte size and one part's overhead) is held.
    assert wl.pending_bytes == registry.budget.used == 1004 + PART_OVERHEAD_BYTES
    stored = {b.key async for b in server.store.list(f"{JOB}/")}
    assert set(cp2.object_keys) <= stored  # truncate deleted nothing

    registry.close_writer(log_id)
    assert registry.budget.used == 0
    with pytest.raises(LogNotFound):
        registry.get(log_id)


@pytest.mark.slow
def test_handle_bytes_cross_processes(tmp_path: Path) -> None:
    """Handle bytes made in one process are read back in another (executor -> driver)."""
    root = tmp_path / "srv"
    with ServerProcess(root) as proc, ChangelogClient(proc.address) as client:
        w = client.create_writer(job_id=JOB, operator_id="op", key_group_range=(10, 20))
        payloads = {kg: bytes(range(kg, kg + 50)) * 7 for kg in range(10, 21)}
        for kg, data in payloads.items():
            w.append(kg, data)
        handle = w.persist_durably(after=0).result(timeout=30)
        blob = handle.to_bytes()
        assert ChangelogHandle.from_bytes(blob) == handle
        assert ChangelogHandle.from_bytes(blob).to_bytes() == blob

        blob_file = tmp_path / "handle.bin"
        blob_file.write_bytes(blob)
        reader = (
            "import sys\n"
            "from pathlib import Path\n"
            "from dstl_client import ChangelogClient, ChangelogHandle\n"
            "h = ChangelogHandle.from_bytes(Path(sys.argv[1]).read_bytes())\n"
            "with ChangelogClient(sys.argv[2]) as c:\n"
            "    for kg, sqn, data in c.read_changes(h, key_groups=[12, 20]):\n"
            "        print(kg, sqn, data.hex())\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", reader, str(blob_file), proc.address],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
        assert out == ["12", "0", payloads[12].hex(), "20", "0", payloads[20].hex()]
        w.close()


#: reads go to the store: the damage is done at rest, on the store's copy (the read
#: cache holds what this sidecar uploaded; see test_cached_reads_skip_the_store)
NO_READ_CACHE = ("--read-cache-bytes", "0")


@pytest.mark.slow
class TestDamagedObjects:
    """A damaged object is reported as a typed error, never returned as data."""

    @staticmethod
    def _two_checkpoints(
        client: ChangelogClient,
    ) -> tuple[ChangelogHandle, ChangelogHandle, ChangelogHandle]:
        """A victim checkpoint in its own object, then an unrelated one in another."""
        victim = client.create_writer(job_id=JOB, operator_id="victim", key_group_range=(0, 3))
        for kg in range(4):
            victim.append(kg, f"victim-{kg}".encode() * 100)
        h_victim = victim.persist_durably(after=0).result(timeout=30)
        other = client.create_writer(job_id=JOB, operator_id="other", key_group_range=(0, 3))
        for kg in range(4):
            other.append(kg, f"other-{kg}".encode() * 100)
        h_other = other.persist_durably(after=0).result(timeout=30)
        assert h_victim.object_keys != h_other.object_keys
        victim.append(0, b"later")
        h_victim_later = victim.persist_durably(after=h_victim.to_sqn).result(timeout=30)
        assert h_victim_later.object_keys[0] not in h_victim.object_keys
        return h_victim, h_victim_later, h_other

    @staticmethod
    def _assert_others_fine(
        client: ChangelogClient, h_other: ChangelogHandle, h_later: ChangelogHandle
    ) -> None:
        assert [(kg, d) for kg, _, d in read_all(client, h_other)] == [
            (kg, f"other-{kg}".encode() * 100) for kg in range(4)
        ]
        assert [d for _, _, d in read_all(client, h_later)] == [b"later"]

    @pytest.mark.parametrize("where", ["payload", "log_header", "kg_checksum"])
    def test_flipped_byte(self, tmp_path: Path, where: str) -> None:
        root = tmp_path / "srv"
        with (
            ServerProcess(root, extra_args=NO_READ_CACHE) as proc,
            ChangelogClient(proc.address) as client,
        ):
            h_victim, h_later, h_other = self._two_checkpoints(client)
            entry = h_victim.entries[0]
            path = object_path(root, entry.object_key)
            data = bytearray(path.read_bytes())
            # The footer indexes the very section the handle names.
            assert (entry.offset, entry.length) in parse_object(bytes(data)).sections.values()
            pos = {
                "payload": entry.offset + entry.length // 2,
                "log_header": entry.offset + 6,
                "kg_checksum": entry.offset + entry.length - 1,
            }[where]
            data[pos] ^= 0x40
            path.write_bytes(bytes(data))

            with pytest.raises(CorruptObject, match="checksum mismatch") as err:
                read_all(client, h_victim)
            assert entry.object_key in err.value.message  # operators can find the object
            self._assert_others_fine(client, h_other, h_later)

    def test_truncated_object(self, tmp_path: Path) -> None:
        root = tmp_path / "srv"
        with (
            ServerProcess(root, extra_args=NO_READ_CACHE) as proc,
            ChangelogClient(proc.address) as client,
        ):
            h_victim, h_later, h_other = self._two_checkpoints(client)
            entry = h_victim.entries[0]
            path = object_path(root, entry.object_key)
            data = path.read_bytes()
            path.write_bytes(data[: entry.offset + entry.length // 2])
            with pytest.raises(CorruptObject, match="truncated"):
                read_all(client, h_victim)
            # A read of just one key group is refused the same way.
            with pytest.raises(CorruptObject):
                read_all(client, h_victim, key_groups=[3])
            self._assert_others_fine(client, h_other, h_later)

    def test_deleted_object(self, tmp_path: Path) -> None:
        root = tmp_path / "srv"
        with (
            ServerProcess(root, extra_args=NO_READ_CACHE) as proc,
            ChangelogClient(proc.address) as client,
        ):
            h_victim, h_later, h_other = self._two_checkpoints(client)
            key = h_victim.entries[0].object_key
            object_path(root, key).unlink()
            with pytest.raises(BlobNotFound) as err:
                read_all(client, h_victim)
            assert key.rsplit("/", 1)[-1] in err.value.message
            assert err.value.grpc_code == "NOT_FOUND"
            self._assert_others_fine(client, h_other, h_later)


@pytest.mark.slow
def test_cached_reads_skip_the_store(tmp_path: Path) -> None:
    """What this sidecar uploaded is read back from its memory (a restore on this node)."""
    root = tmp_path / "srv"
    with ServerProcess(root) as proc, ChangelogClient(proc.address) as client:
        h_victim, h_later, _ = TestDamagedObjects._two_checkpoints(client)
        object_path(root, h_victim.entries[0].object_key).unlink()  # the store's copy
        assert [(kg, d) for kg, _, d in read_all(client, h_victim)] == [
            (kg, f"victim-{kg}".encode() * 100) for kg in range(4)
        ]
        assert [d for _, _, d in read_all(client, h_later)] == [b"later"]
        metrics = proc.scrape_metrics()
        assert metrics["dstl_read_cache_hits_total"] >= 2
        assert metrics["dstl_read_cache_misses_total"] == 0
        assert metrics["dstl_read_cache_bytes"] > 0
