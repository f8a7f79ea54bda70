"""A keyed job on a real multi-node Spark standalone cluster, one sidecar per node.

Two workers, each with its own ``dstl-server`` (own port, own state
directory), one SeaweedFS for the objects and the driver's checkpoint
records, and a driver with the sidecar of its own node. The job runs with
executors on every node; then a node is killed (worker, executors, sidecar:
SIGKILL) mid-stream, its tasks move to the other node and restore their key
groups from S3 through *that* node's sidecar; later the driver is killed and
a new one starts with a fresh local disk (only the S3 metadata and Spark's
own checkpoint directory survive). The outputs and the final state must
equal a failure-free run's, and each node's sidecar must have uploaded its
own executors' flushes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from dstl_server.testing import ServerProcess
from dstl_server.testing_s3 import SeaweedS3
from loadtest.cluster_bench.driver import Driver, checkpoint_dir, spark_checkpoint
from loadtest.spark_cluster import SparkCluster
from loadtest.spark_offsets import file_groups
from tests.e2e._spark_job import TEST_JVM_OPTIONS, expected_grouped, read_outputs, write_input

# three driver runs, each starting Spark on a cluster (JVMs): minutes, not seconds
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.s3, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
ROWS, KEYS = 1500, 500
DRIVER_TIMEOUT_S = 420.0


def objects_uploaded(sidecar: ServerProcess) -> float:
    return sidecar.scrape_metrics().get('dstl_uploads_total{result="ok"}', 0.0)


def start_driver(
    tmp: Path,
    cluster: SparkCluster,
    address: str,
    until: int | None = None,
    crash: str = "",
    until_files: int | None = None,
) -> Driver:
    """A driver with a fresh local disk; its dstl metadata on S3, Spark's checkpoint in tmp.

    The job gives up on its own 30 s before the test stops waiting, so a hang
    ends with the job's own error in the log the assertion shows.
    """
    return Driver(
        tmp,
        cluster,
        address,
        until=until,
        until_files=until_files,
        crash=crash,
        timeout_s=DRIVER_TIMEOUT_S - 30,
    )


def wait_for_output(out: Path, batch: int, driver: Driver, timeout_s: float = 240.0) -> None:
    """Until the sink wrote ``batch`` (bounded; the driver must stay alive)."""
    deadline = time.monotonic() + timeout_s
    while not (out / f"batch={batch}" / "_SUCCESS").exists():
        assert driver.poll() is None, f"the driver exited early:\n{driver.tail()}"
        assert time.monotonic() < deadline, f"batch {batch} not written:\n{driver.tail()}"
        time.sleep(0.2)


def test_a_node_kill_and_a_driver_restart_on_a_two_node_cluster_give_the_failure_free_results(
    tmp_path: Path, weed_s3: SeaweedS3, s3_prefix: str
) -> None:
    batches = 8
    write_input(tmp_path / "input", 0, batches - 1, ROWS, KEYS)
    driver_node = ServerProcess(
        tmp_path / "driver-sidecar",
        storage=weed_s3.storage_url(s3_prefix),
        extra_args=weed_s3.server_args(),
        env=weed_s3.env(),
    )
    cluster = SparkCluster(
        tmp_path / "cluster", weed_s3, s3_prefix, workers=2, jvm_options=TEST_JVM_OPTIONS
    )
    with driver_node, cluster:
        try:
            # run 1: executors on both nodes; node 1 dies after batch 2
            driver = start_driver(tmp_path, cluster, driver_node.address, until=4)
            wait_for_output(tmp_path / "out", 2, driver)
            per_node = {n.name: objects_uploaded(n.sidecar) for n in cluster.nodes}
            # each node's sidecar uploaded its own executors' flushes
            assert all(v >= 1 for v in per_node.values()), per_node
            victim, survivor = cluster.nodes[1], cluster.nodes[0]
            survivor_before = objects_uploaded(survivor.sidecar)
            cluster.kill_node(victim)
            assert driver.wait(DRIVER_TIMEOUT_S) == 0, driver.tail()
            # the lost node's key groups were restored and logged on the survivor
            assert objects_uploaded(survivor.sidecar) > survivor_before
            assert survivor.sidecar.scrape_metrics()["dstl_read_requests_total"] >= 1

            # run 2: the node is back (a fresh sidecar); the driver dies after
            # batch 6's tasks, before its record
            cluster.restart_node(victim)
            crashed = start_driver(tmp_path, cluster, driver_node.address, 7, "tasks_done:6")
            assert crashed.wait(DRIVER_TIMEOUT_S) == -signal.SIGKILL, crashed.tail()
            # run 3: a new driver on an empty disk resumes from the S3 records and
            # runs until every input file is in a recorded batch (run 1's stop may
            # have landed while Spark planned a batch: then one batch read two
            # files and there is no batch 7; see loadtest.spark_offsets)
            final = start_driver(tmp_path, cluster, driver_node.address, until_files=batches)
            assert final.wait(DRIVER_TIMEOUT_S) == 0, final.tail()
        except BaseException:
            print(cluster.diagnostics())
            raise

    groups = file_groups(spark_checkpoint(tmp_path))
    assert [f for g in groups for f in g] == list(range(batches)), groups
    _, want_outputs = expected_grouped(groups, ROWS, KEYS)
    assert read_outputs(tmp_path / "out") == want_outputs
    # the driver's records are on S3 only: nothing of dstl's beside Spark's checkpoint
    assert not list(checkpoint_dir(tmp_path).rglob("ck-*.json"))
    s3 = weed_s3.boto3_client()
    try:
        listed = s3.list_objects_v2(Bucket=weed_s3.bucket, Prefix=f"{s3_prefix}/metadata/")
        names = [o["Key"].rsplit("/", 1)[-1] for o in listed.get("Contents", ())]
    finally:
        s3.close()
    assert f"ck-{len(groups) - 1:012d}.json" in names, names
