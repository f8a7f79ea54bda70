"""The orphan sweep against a real sidecar (file:// storage): listing and deleting go
through ``ListObjects``/``DiscardObjects``, the driver never opens the store."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from dstl_client.client import ChangelogClient
from dstl_client.coordinator import cleanup
from dstl_client.coordinator.cleanup import JobReferences, NoRecordsRead, OrphanSweeper
from dstl_client.core.errors import ConfigError, InvalidArgument, PermissionDenied
from dstl_client.core.handle import ChangelogHandle
from dstl_client.core.keys import new_object_key
from dstl_client.objects import ObjectInfo
from dstl_server.auth import Authenticator
from dstl_server.testing import ServerProcess

#: a moment every object written by these tests is older than the default grace by
LATER = time.time() + 3600


def plant(objects_dir: Path, job: str, n: int, *, age_s: float = 0.0) -> list[str]:
    """``n`` object files of ``job`` written straight into the sidecar's store."""
    keys = []
    for i in range(n):
        key = new_object_key(job)
        path = objects_dir / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (i + 1))
        if age_s:
            then = time.time() - age_s
            os.utime(path, (then, then))
        keys.append(key)
    return sorted(keys)


def refs(job: str, keys: Iterable[str]) -> JobReferences:
    """References as if one record of ``job`` naming ``keys`` had been read."""
    return JobReferences(job, frozenset(keys), 1, "test")


def stored(objects_dir: Path, job: str) -> set[str]:
    root = objects_dir / job
    return {p.relative_to(objects_dir).as_posix() for p in root.rglob("*.dstl")}


def persist(client: ChangelogClient, job: str, rounds: int) -> list[ChangelogHandle]:
    """One writer of ``job`` persisting ``rounds`` times: one new object each."""
    w = client.create_writer(job_id=job, operator_id="op", key_group_range=(0, 3))
    handles = []
    for r in range(rounds):
        boundary = w.last_appended_sqn()
        w.append(r % 4, f"{job}-{r}".encode())
        handles.append(w.persist_durably(after=boundary).result(timeout=30))
    w.close()
    return handles


class RecordingClient(ChangelogClient):
    """Records the size of every DiscardObjects call."""

    def __init__(self, target: str, **kwargs: object) -> None:
        super().__init__(target, **kwargs)  # type: ignore[arg-type]
        self.discards: list[int] = []

    def discard_objects(self, job_id: str, object_keys: Sequence[str]) -> int:
        self.discards.append(len(object_keys))
        return super().discard_objects(job_id, object_keys)


# --------------------------------------------------------------------- the sweep
def test_referenced_and_young_objects_are_kept_old_orphans_deleted(
    client: ChangelogClient, objects_dir: Path
) -> None:
    job = "sweep-basic"
    handles = persist(client, job, 4)
    keys = [k for h in handles for k in h.object_keys]
    assert len(set(keys)) == 4 and stored(objects_dir, job) == set(keys)
    referenced = set(handles[0].object_keys) | set(handles[2].object_keys)
    sweeper = OrphanSweeper(client, job)  # grace 600 s
    # everything was just written: nothing is old enough
    assert sweeper.sweep(refs(job, referenced)) == 0
    assert stored(objects_dir, job) == set(keys)
    # an hour later the unreferenced ones go, the referenced ones stay readable
    assert sweeper.sweep(refs(job, referenced), now=LATER) == 2
    assert stored(objects_dir, job) == referenced
    for h in (handles[0], handles[2]):
        assert [d for _, _, d in client.read_changes(h)]
    # a second sweep finds nothing more
    assert sweeper.sweep(refs(job, referenced), now=LATER) == 0
    assert sweeper.sweep(refs(job, list(referenced)), now=LATER) == 0  # any collection


def test_age_is_the_objects_modification_time(client: ChangelogClient, objects_dir: Path) -> None:
    job = "sweep-age"
    old = plant(objects_dir, job, 3, age_s=700)
    young = plant(objects_dir, job, 2, age_s=500)
    old_referenced = plant(objects_dir, job, 1, age_s=7200)
    unknown = plant(objects_dir, job, 1)
    os.utime(objects_dir / unknown[0], (0, 0))  # the store cannot tell its age
    listed = {o.key: o for o in client.list_objects(job)}
    assert listed[unknown[0]].modified == 0.0
    assert time.time() - 701 < listed[old[0]].modified < time.time() - 699
    assert OrphanSweeper(client, job).sweep(refs(job, old_referenced)) == 3
    assert stored(objects_dir, job) == {*young, *old_referenced, *unknown}
    # a shorter grace reaches the younger ones; an object of unknown age never goes
    assert OrphanSweeper(client, job, grace_s=400).sweep(refs(job, old_referenced)) == 2
    assert OrphanSweeper(client, job, grace_s=0).sweep(refs(job, ()), now=LATER) == 1
    assert stored(objects_dir, job) == set(unknown)


def test_only_the_jobs_objects_are_listed_and_swept(
    client: ChangelogClient, objects_dir: Path
) -> None:
    job = "sweep-mine"
    mine = plant(objects_dir, job, 3)
    # neighbours whose ids extend ours, and files that are not objects of the job
    others = {j: plant(objects_dir, j, 2) for j in ("sweep-mine2", "sweep-mine.x", "sweep-min")}
    junk = [
        f"{job}/README",
        f"{job}/ab/not-an-object.dstl",
        f"{job}/ab/{'0' * 32}.txt",
        f"{job}/zz/{'0' * 32}.dstl",
        f"{job}/ab/.{'0' * 32}.dstl.1234abcd.tmp-dstl",  # a write in progress
        f"{job}/ab/cd/{'0' * 32}.dstl",
    ]
    for rel in junk:
        (objects_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (objects_dir / rel).write_bytes(b"junk")
    expected = [(k, (objects_dir / k).stat().st_size) for k in mine]
    assert [(o.key, o.size) for o in client.list_objects(job)] == expected
    assert [(o.key, o.size) for o in client.list_objects(job, page_size=2)] == expected
    assert OrphanSweeper(client, job, grace_s=0).sweep(refs(job, ()), now=LATER) == 3
    assert not any((objects_dir / k).exists() for k in mine)
    for rel in junk:
        assert (objects_dir / rel).exists(), rel
    for j, keys in others.items():
        assert stored(objects_dir, j) == set(keys)


def test_paging_over_many_pages(sidecar: ServerProcess, objects_dir: Path) -> None:
    job = "sweep-pages"
    keys = plant(objects_dir, job, 25)
    sizes = {k: (objects_dir / k).stat().st_size for k in keys}
    client = RecordingClient(sidecar.address)
    with client:
        before = sidecar.scrape_metrics().get("dstl_list_requests_total", 0.0)
        listed = list(client.list_objects(job, page_size=4))
        assert [o.key for o in listed] == keys
        assert all(isinstance(o, ObjectInfo) and o.size == sizes[o.key] for o in listed)
        # 25 objects, 4 per page: seven pages (the last one short ends the listing)
        assert sidecar.scrape_metrics()["dstl_list_requests_total"] == before + 7
        # one full page per call at most, whatever the caller asks
        assert [o.key for o in client.list_objects(job, page_size=10**9)] == keys
        with pytest.raises(InvalidArgument, match="page_size"):
            list(client.list_objects(job, page_size=0))
        keep = set(keys[::2])
        sweeper = OrphanSweeper(client, job, page_size=3)
        assert sweeper.sweep(refs(job, keep), now=LATER) == 12
        assert stored(objects_dir, job) == keep
        assert client.discards == [12]


def test_discards_go_in_batches(
    sidecar: ServerProcess, objects_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = "sweep-batches"
    keys = plant(objects_dir, job, 11)
    monkeypatch.setattr(cleanup, "DISCARD_BATCH", 4)
    client = RecordingClient(sidecar.address)
    with client:
        assert OrphanSweeper(client, job, page_size=5).sweep(refs(job, {keys[0]}), now=LATER) == 10
        assert client.discards == [4, 4, 2]
    assert stored(objects_dir, job) == {keys[0]}
    assert cleanup.DISCARD_BATCH <= 10_000


def test_no_sweep_without_a_record_of_the_job_read(
    client: ChangelogClient, objects_dir: Path
) -> None:
    """No record read (or only another job's) is not "nothing referenced": refused."""
    job = "sweep-refused"
    keys = plant(objects_dir, job, 3)
    sweeper = OrphanSweeper(client, job, grace_s=0)
    for given in (
        JobReferences(job, frozenset(), 0, "file:///wrong/place"),
        JobReferences(job, frozenset(), 0, "file:///wrong/place", other_jobs=("other",)),
        JobReferences("other", frozenset(), 2, "file:///wrong/place"),
    ):
        with pytest.raises(
            NoRecordsRead,
            match="no checkpoint record of job 'sweep-refused' at file:///wrong/place",
        ):
            sweeper.sweep(given, now=LATER)
        with pytest.raises(NoRecordsRead):  # at once, before anything is listed
            sweeper.unreferenced(given, now=LATER)
    assert stored(objects_dir, job) == set(keys)


def test_sweeper_arguments_are_checked(client: ChangelogClient) -> None:
    for bad in ("", "a/b", "../x"):
        with pytest.raises(ConfigError):
            OrphanSweeper(client, bad)
    with pytest.raises(ConfigError):
        OrphanSweeper(client, "job", grace_s=-1)
    with pytest.raises(ConfigError):
        OrphanSweeper(client, "job", page_size=0)
    assert OrphanSweeper(client, "job").grace_s == cleanup.DEFAULT_GRACE_S == 600.0


# ------------------------------------------------------------------ isolation
SECRET = "sweep-test-node-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A sidecar that requires tokens."""
    with ServerProcess(
        tmp_path_factory.mktemp("secured"), env={"DSTL_AUTH_SECRET": SECRET}
    ) as proc:
        yield proc


def test_a_job_token_lists_and_sweeps_only_its_own_job(secured: ServerProcess) -> None:
    auth = Authenticator(SECRET)
    objects = Path(secured.storage.removeprefix("file://"))
    with (
        ChangelogClient(secured.address, token=auth.job_token("jobA")) as a,
        ChangelogClient(secured.address, token=auth.job_token("jobB")) as b,
        ChangelogClient(secured.address, token=auth.admin_token()) as admin,
    ):
        (hb,) = persist(b, "jobB", 1)
        b_keys = set(hb.object_keys)
        with pytest.raises(PermissionDenied):
            list(a.list_objects("jobB"))
        with pytest.raises(PermissionDenied):
            OrphanSweeper(a, "jobB", grace_s=0).sweep(refs("jobB", ()), now=LATER)
        assert stored(objects, "jobB") == b_keys
        # its own job: fine (nothing there); the admin may list any job
        assert list(a.list_objects("jobA")) == []
        assert OrphanSweeper(a, "jobA").sweep(refs("jobA", ()), now=LATER) == 0
        assert {o.key for o in admin.list_objects("jobB")} == b_keys
        assert {o.key for o in b.list_objects("jobB")} == b_keys
        # B's own sweeper keeps what B references
        assert OrphanSweeper(b, "jobB").sweep(refs("jobB", b_keys), now=LATER) == 0
        assert stored(objects, "jobB") == b_keys
