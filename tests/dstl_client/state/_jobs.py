"""A keyed job used by the state and coordinator tests: every kind of state, a reference."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dstl_client.batch.local import LocalRunner, checkpoint_rows
from dstl_client.client import ChangelogClient
from dstl_client.coordinator.config import CoordinatorConfig
from dstl_client.coordinator.coordinator import CheckpointCoordinator
from dstl_client.coordinator.retention import SweeperFactory
from dstl_client.state.api import KeyedContext
from dstl_client.state.changes import decode_state_key
from dstl_client.state.serializers import INT64, STR

MAX_P = 32


def _add(a: int, b: int) -> int:
    return a + b


def job_fn(key: Any, rows: list[dict[str, Any]], ctx: KeyedContext) -> Iterator[tuple[Any, int]]:
    """Count, sum, per-page counts (cleared on multiples of 17) and the last 3 values."""
    count = ctx.value_state("count", INT64)
    total = ctx.reducing_state("sum", _add, INT64)
    pages = ctx.map_state("pages", STR, INT64)
    recent = ctx.list_state("recent", INT64)
    for r in rows:
        count.update((count.value() or 0) + 1)
        total.add(r["v"])
        if r["v"] % 17 == 0:
            pages.clear()
        else:
            pages.put(r["page"], (pages.get(r["page"]) or 0) + 1)
        recent.add(r["v"])
        last = recent.get()
        if len(last) > 3:
            recent.update(last[-3:])
    yield key, count.value() or 0


def reference(batches: list[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """What :func:`job_fn` leaves in state, computed with plain dicts."""
    out: dict[str, dict[str, Any]] = {}
    for rows in batches:
        for r in rows:
            s = out.setdefault(str(r["k"]), {"count": 0, "sum": 0, "pages": {}, "recent": []})
            s["count"] += 1
            s["sum"] += r["v"]
            if r["v"] % 17 == 0:
                s["pages"] = {}
            else:
                s["pages"][r["page"]] = s["pages"].get(r["page"], 0) + 1
            s["recent"] = (s["recent"] + [r["v"]])[-3:]
    return out


def make_batches(n_batches: int, rows: int, keys: int, seed: int = 7) -> list[list[dict[str, Any]]]:
    rnd = random.Random(seed)
    return [
        [
            {
                "k": f"key-{rnd.randrange(keys)}",
                "v": rnd.randrange(1000),
                "page": f"p{rnd.randrange(4)}",
            }
            for _ in range(rows)
        ]
        for _ in range(n_batches)
    ]


def decode_rows(rows: dict[tuple[int, bytes], bytes]) -> dict[str, dict[str, Any]]:
    """Checkpoint rows back into the shape of :func:`reference`."""
    from dstl_client.state.changes import iter_elements

    out: dict[str, dict[str, Any]] = {}
    for (_kg, k), v in rows.items():
        name, key, suffix = decode_state_key(k)
        s = out.setdefault(key.decode(), {"count": 0, "sum": 0, "pages": {}, "recent": []})
        if name in ("count", "sum"):
            s[name] = INT64.loads(v)
        elif name == "pages":
            s["pages"][suffix[1:].decode()] = INT64.loads(v)
        elif name == "recent":
            s["recent"] = [INT64.loads(e) for e in iter_elements(v)]
    return out


def make_coordinator(
    root: Path,
    address: str,
    *,
    job_id: str = "job",
    interval: float = 3600.0,
    retain: int = 2,
    client: ChangelogClient | None = None,
    sweeper: SweeperFactory | None = None,
    state_dir: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    **kw: Any,
) -> CheckpointCoordinator:
    # these jobs check what each batch recorded: a task waits for the materialization it
    # started (the background case has its own tests)
    kw.setdefault("materialization_wait_s", 120.0)
    cfg = CoordinatorConfig(
        job_id=job_id,
        checkpoint_dir=str(root / "ckpt"),
        max_parallelism=MAX_P,
        retain=retain,
        materialize_interval_s=interval,
        state_dir=state_dir or str(root / "state"),
        dstl_address=address,
        fsync=False,
        **kw,
    )
    coord = CheckpointCoordinator(cfg, client=client, sweeper=sweeper, clock=clock)
    coord.start()
    return coord


def runner(coord: CheckpointCoordinator, parallelism: int, client: ChangelogClient) -> LocalRunner:
    return LocalRunner(coord, job_fn, key=lambda r: r["k"], parallelism=parallelism, client=client)


def final_state(coord: CheckpointCoordinator, client: ChangelogClient) -> dict[str, dict[str, Any]]:
    assert coord.latest is not None
    return decode_rows(checkpoint_rows(coord.latest, client))
