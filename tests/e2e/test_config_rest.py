"""Changing the checkpoint interval of a running job through its token-protected REST
endpoint, with the operator's ``dstl config set`` (the token in the environment, as an
operator would give it): the trigger switches between two batches in the same driver,
and the results stay exactly-once."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dstl_server.testing import ServerProcess
from loadtest.spark_offsets import wait_for_all_input
from tests.e2e._spark_job import (
    agg,
    agg_job_in,
    expected,
    expected_grouped,
    read_outputs,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS, KEYS = 400, 50
NEW_INTERVAL_MS = 4000
TOKEN = "e2e-config-token-7Hq2xPz"


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, json.loads(resp.read())


def dstl_cli(*argv: str, token: str | None) -> subprocess.CompletedProcess[str]:
    """The operator's ``dstl`` in a process of its own; the token only in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSTL_")}
    if token is not None:
        env["DSTL_CONFIG_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "dstl_client.ops.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def start_job(
    spark: Any, tmp: Path, sidecar: ServerProcess, batches: int, job_id: str, fn: Any, **kw: Any
) -> Any:
    """``agg``'s job on ``batches`` input files (one per micro-batch), with ``kw`` options."""
    write_input(tmp / "input", 0, batches - 1, ROWS, KEYS)
    return agg_job_in(spark, tmp, sidecar.address, fn=fn, job_id=job_id, **kw)


def test_a_new_checkpoint_interval_switches_the_trigger_without_restarting_spark(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    batches = 8  # input files; the new run gets several of them whenever the switch lands
    app_id = spark.sparkContext.applicationId
    q = start_job(
        spark,
        tmp_path,
        sidecar,
        batches,
        "rest-interval",
        agg,
        config_port=0,
        config_token=TOKEN,  # as off loopback: every request needs it
    )
    try:
        assert q.config_server is not None
        base = f"http://127.0.0.1:{q.config_server.port}"
        url = f"{base}/jobs/rest-interval/checkpoints/configuration"
        q.wait_for_batch(1, timeout_s=180)
        first_query = q.query
        status, doc = http("GET", url)
        assert status == 200 and doc["checkpointInterval"] == 0
        assert doc["sources"]["checkpointInterval"] == "default"
        # the operator's CLI: only the URL and the job id; without the token, refused
        where = ["--rest-url", base, "--job-id", "rest-interval"]
        setting = f"checkpointInterval={NEW_INTERVAL_MS // 1000}s"
        refused = dstl_cli("config", "set", setting, *where, token=None)
        assert refused.returncode == 2 and "HTTP 401" in refused.stderr, refused.stderr
        assert q.switches == []
        done = dstl_cli("config", "set", setting, "--json", *where, token=TOKEN)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert doc["checkpointInterval"] == NEW_INTERVAL_MS
        assert doc["sources"]["checkpointInterval"] == "override"
        try:
            groups = wait_for_all_input(
                lambda: q.last_batch_id, tmp_path / "ckpt" / "spark", batches, timeout_s=240
            )
        except TimeoutError as exc:  # say where the switch stood
            raise AssertionError(
                f"{exc}; switching={q.switching.is_set()} switches={q.switches} "
                f"active={q.query.isActive} status={q.query.status}"
            ) from exc
        # the query was stopped and started again in this driver: same application,
        # same query id (its checkpoint), a new run
        assert len(q.switches) == 1 and q.switches[0].interval_s == NEW_INTERVAL_MS / 1000
        assert spark.sparkContext.applicationId == app_id
        assert q.query is not first_query
        assert q.query.id == first_query.id and q.query.runId != first_query.runId
        # Spark runs the new run under the new trigger (its own object says so) ...
        trigger = q.query._jsq.streamingQuery().trigger()
        assert trigger.getClass().getSimpleName() == "ProcessingTimeTrigger"
        assert trigger.intervalMs() == NEW_INTERVAL_MS
        # ... and it paces the batches: each starts at the first tick of the interval
        # (multiples of it, Spark aligns them) after the previous one started, or at
        # once when that batch ran past the tick. So a start is less than one interval
        # after the last tick it passed, and k gaps span more than k - 1 intervals
        # (a single gap may be short: a late start, then the next tick).
        starts = [
            datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            for p in q.query.recentProgress
        ]
        k = len(starts) - 1
        interval_s = NEW_INTERVAL_MS / 1000
        assert k >= 2, starts
        assert starts[-1] - starts[0] > (k - 1) * interval_s - 0.2, starts
    finally:
        q.stop()
    assert read_outputs(tmp_path / "out") == expected_grouped(groups, ROWS, KEYS)[1]


#: the checkpoint timeout of the job below, and how long its slow attempt takes: twice
#: the timeout, so the watchdog aborts the batch while the attempt sleeps (the abort
#: cancels the batch's Spark jobs; then the batch runs again)
TIMEOUT_S = 15.0
SLOW_S = 2 * TIMEOUT_S


def slow_once(marker: Path, key: Any, rows: list[dict[str, Any]], ctx: Any) -> Any:
    """``agg``, but the first attempt of batch 1 outlives the checkpoint timeout."""
    if ctx.batch_id == 1 and not marker.exists():
        marker.touch()
        time.sleep(SLOW_S)
    return agg(key, rows, ctx)


def test_a_checkpoint_that_times_out_is_run_again_and_the_query_goes_on(
    tmp_path: Path, sidecar: ServerProcess, spark: Any
) -> None:
    batches = 3
    q = start_job(
        spark,
        tmp_path,
        sidecar,
        batches,
        "tolerate",
        functools.partial(slow_once, tmp_path / "slow-once"),
        checkpoint_timeout_s=TIMEOUT_S,
        tolerable_failed_checkpoints=1,
    )
    try:
        q.wait_for_batch(batches - 1, timeout_s=240)
    finally:
        q.stop()
    assert (tmp_path / "slow-once").exists()  # the slow attempt ran, and was aborted
    assert q.failures is not None and q.failures.tolerated >= 1  # (a slow machine: more)
    _state, want_outputs = expected(batches, ROWS, KEYS)
    assert read_outputs(tmp_path / "out") == want_outputs
