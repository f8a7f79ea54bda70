"""The chaos bench's keyed job: a :class:`~dstl_client.processor.StatefulProcessor` with
event-time timers, as one driver process on a standalone cluster.

Takes the command line of :mod:`loadtest.cluster_bench.job`, ``--jvm-options``
included (the bench starts it through
:class:`loadtest.cluster_bench.driver.Driver` with
``module="loadtest.chaos_bench.job"``)::

    python -m loadtest.chaos_bench.job --master spark://127.0.0.1:7077 --address ... \\
        --checkpoint-dir ... --metadata-url s3://... --input-dir ... --out-dir ... \\
        --until-files 30 --parallelism 2 --phases-file ...

Per key (:mod:`loadtest.chaos_bench.workload`): a count and sum (value
state), the buckets of ``v`` seen (map state) and an idle timer ``IDLE_MS``
after the latest event (re-registered on every update); an ``update`` row
per key and batch, an ``idle`` row when the timer fires. The output goes to
dstl's exactly-once Parquet sink. The processor is defined here, in
``__main__``, so it travels to the executors by value.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from dstl_client.processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from loadtest.chaos_bench.workload import (
    BUCKETS,
    DELAY,
    IDLE_MS,
    INPUT_SCHEMA,
    OUTPUT_SCHEMA,
)
from loadtest.cluster_bench.job import MAX_P, session
from loadtest.spark_offsets import run_until_all_input

JOB_ID = "chaos-bench"


class IdleTotals(StatefulProcessor):
    """Count, total and buckets per key; ``idle`` (and cleared) once the watermark passes
    ``IDLE_MS`` after its latest event. ``Row``\\ s in and out."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.agg = handle.getValueState("agg", "n long, total long")
        self.buckets = handle.getMapState("buckets", "b long", "n long")
        self.timer = handle.getValueState("timer", "at long")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: TimerValues) -> Any:
        agg = self.agg.get()
        n, total = (0, 0) if agg is None else (agg[0], agg[1])
        latest = None
        for row in rows:
            n += 1
            total += row.v
            seen = self.buckets.getValue((row.v % BUCKETS,))
            self.buckets.updateValue((row.v % BUCKETS,), ((seen[0] if seen else 0) + 1,))
            latest = row.at if latest is None else max(latest, row.at)
        assert latest is not None
        self.agg.update((n, total))
        old = self.timer.get()
        if old is not None:
            self.handle.deleteTimer(old[0])
        self.handle.registerTimer(latest + IDLE_MS)
        self.timer.update((latest + IDLE_MS,))
        yield self._row(key[0], "update", latest)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Any:
        row = self._row(key[0], "idle", expiredTimerInfo.getExpiryTimeInMs())
        self.agg.clear()
        self.buckets.clear()
        self.timer.clear()
        yield row

    def _row(self, k: str, kind: str, at: int) -> Any:
        from pyspark.sql import Row

        agg = self.agg.get() or (0, 0)
        return Row(
            k=k,
            kind=kind,
            count=agg[0],
            total=agg[1],
            buckets=len(list(self.buckets.keys())),
            at=at,
        )


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("master", "address", "checkpoint-dir", "input-dir", "out-dir"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--metadata-url", default="")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--until-files", type=int, required=True)
    p.add_argument("--until-batch", type=int, help="not used (the cluster job's flag)")
    p.add_argument("--crash", default="", help="not used (the cluster job's flag)")
    p.add_argument("--jvm-options", default="", help="the driver's and executors' JVMs")
    p.add_argument("--phases-file", default="", help="append 'phase batch unix_time' lines")
    p.add_argument("--timeout-s", type=float, default=400.0)
    args = p.parse_args()
    from dstl_client.processor import transform_with_state

    phases = open(args.phases_file, "a", buffering=1) if args.phases_file else None  # noqa: SIM115
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("dstl_client").setLevel(logging.INFO)
    faulthandler.dump_traceback_later(max(1.0, args.timeout_s - 5.0))

    def on_phase(phase: str, batch_id: int) -> None:
        print(f"{time.strftime('%H:%M:%S')} phase {phase} {batch_id}", flush=True)
        if phases is not None:
            phases.write(f"{phase} {batch_id} {time.time():.6f}\n")

    spark = session(args.master, args.executors, args.jvm_options)
    events = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(args.input_dir)
    )
    extra: dict[str, Any] = {"metadata_url": args.metadata_url} if args.metadata_url else {}
    stream = transform_with_state(
        events.groupBy("k"),
        processor=IdleTotals(),
        output_schema=OUTPUT_SCHEMA,
        output_mode="Update",
        time_mode="EventTime",
        use_pandas=False,
        event_time_column="ts",
        watermark_delay=DELAY,
        parallelism=args.parallelism,
        max_parallelism=MAX_P,
        checkpoint_dir=args.checkpoint_dir,
        job_id=JOB_ID,
        dstl_address=args.address,
        orphan_grace_s=0,
        materialize_interval_s=2,
        checkpoint_timeout_s=150,
        on_phase=on_phase,
        **extra,
    )
    q = stream.writeStream.format("parquet").outputMode("update").start(args.out_dir)
    try:
        run_until_all_input(q, args.checkpoint_dir, args.until_files, args.timeout_s)
    finally:
        q.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
