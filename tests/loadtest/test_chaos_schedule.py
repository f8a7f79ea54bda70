"""The chaos bench's schedule generator: deterministic per seed, every kind over seeds, bounded.

Pure functions (no Spark, no processes): :func:`loadtest.chaos_bench.schedule.draw`,
the spec's validation, the proxy configuration of open S3 windows, and the
workload's expectation rules.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from loadtest.chaos_bench.config import ChaosConfig, short_config
from loadtest.chaos_bench.faults import proxy_faults
from loadtest.chaos_bench.schedule import (
    ALL_KINDS,
    DRIVER_NODE,
    PROCESS_KINDS,
    S3_KINDS,
    Fault,
    FaultKind,
    ScheduleError,
    ScheduleSpec,
    draw,
)
from loadtest.chaos_bench.workload import (
    DELAY_MS,
    LATE_FROM,
    expected_outputs,
    file_rows,
)

SPEC = ChaosConfig().spec()


def test_the_same_seed_and_round_give_the_same_schedule_and_others_differ() -> None:
    assert draw(42, 0, SPEC) == draw(42, 0, SPEC)
    assert draw(42, 3, SPEC).lines() == draw(42, 3, SPEC).lines()
    others = {draw(seed, r, SPEC).faults for seed in range(5) for r in range(3)}
    assert len(others) == 15


def test_every_kind_appears_in_every_default_round_and_over_seeds() -> None:
    seen: Counter[FaultKind] = Counter()
    for seed in range(50):
        s = draw(seed, 0, SPEC)
        # the default counts leave room for each kind once per round
        assert set(s.counts()) == set(ALL_KINDS), s.lines()
        seen.update(s.counts())
    # fewer faults than kinds: each kind still shows up over seeds
    small = ScheduleSpec(batches=20, process_faults=2, s3_windows=1)
    over: Counter[FaultKind] = Counter()
    for seed in range(200):
        over.update(draw(seed, 0, small).counts())
    assert set(over) == set(ALL_KINDS)


@pytest.mark.parametrize("seed", range(40))
def test_a_schedule_stays_inside_its_bounds(seed: int) -> None:
    spec = SPEC
    s = draw(seed, seed % 4, spec)
    assert len(s.process_faults) == spec.process_faults
    assert len(s.s3_windows) == spec.s3_windows
    last = spec.batches - spec.end_margin - 1
    for f in s.faults:
        assert spec.first_batch <= f.at_batch <= last, f
        assert 0 <= f.delay_frac < 1
    positions = [f.at_batch for f in s.process_faults]
    assert all(b - a >= spec.min_gap for a, b in itertools.pairwise(positions))
    for f in s.s3_windows:
        assert spec.s3_rate[0] - 1e-9 <= f.rate <= spec.s3_rate[1] + 1e-9
        assert spec.s3_duration_s[0] - 0.05 <= f.duration_s <= spec.s3_duration_s[1] + 0.05
        assert f.kind is not FaultKind.S3_STALL or f.stall_ms == spec.stall_ms == 2000
    nodes = {f"node{i}" for i in range(spec.nodes)}
    parallelism = spec.parallelism
    for f in s.process_faults:
        if f.kind is FaultKind.SIDECAR_KILL:
            assert f.target in nodes | {DRIVER_NODE}
        elif f.kind in (FaultKind.EXECUTOR_KILL, FaultKind.NODE_KILL):
            assert f.target in nodes
        elif f.kind is FaultKind.RESCALE:
            # a rescale always changes the parallelism, to one of the choices
            assert f.parallelism != parallelism and f.parallelism in spec.parallelism_choices
            parallelism = f.parallelism
    assert [f.at_batch for f in s.faults] == sorted(f.at_batch for f in s.faults)


def test_the_short_variant_is_fixed_and_small() -> None:
    cfg = short_config()
    s = draw(cfg.seed, 0, cfg.spec())
    assert s == draw(7, 0, cfg.spec())
    assert len(s.faults) == 4
    assert set(s.counts()) == set(cfg.kinds)
    assert cfg.rounds == 1 and cfg.batches <= 12


def test_specs_that_cannot_be_met_are_refused() -> None:
    with pytest.raises(ScheduleError, match="no room"):
        ScheduleSpec(batches=10, process_faults=5, min_gap=3)
    with pytest.raises(ScheduleError, match="nodes"):
        ScheduleSpec(batches=40, nodes=1)
    with pytest.raises(ScheduleError, match="rescale"):
        ScheduleSpec(batches=40, parallelism=2, parallelism_choices=(2,))
    with pytest.raises(ScheduleError, match="no process fault kind"):
        ScheduleSpec(batches=40, kinds=S3_KINDS)
    with pytest.raises(ScheduleError, match="no S3 fault kind"):
        ScheduleSpec(batches=40, kinds=PROCESS_KINDS)
    with pytest.raises(ScheduleError, match="s3_rate"):
        ScheduleSpec(batches=40, s3_rate=(0.2, 0.9))


def test_open_windows_add_up_in_the_proxy_configuration() -> None:
    w503 = Fault(FaultKind.S3_503, 3, 0.5, rate=0.2, duration_s=10)
    reset = Fault(FaultKind.S3_RESET, 3, 0.5, rate=0.1, duration_s=10, phase="response")
    stall = Fault(FaultKind.S3_STALL, 3, 0.5, rate=0.3, duration_s=10, stall_ms=2000)
    cfg = proxy_faults([w503, reset, stall])
    assert cfg.error_503_rate == pytest.approx(0.2)
    assert cfg.reset_rate == pytest.approx(0.1)
    assert cfg.reset_phase == "response"
    assert cfg.latency.rate == pytest.approx(0.3) and cfg.latency.ms == 2000
    # capped: some requests always pass
    many = proxy_faults([w503] * 5)
    assert many.error_503_rate + many.reset_rate <= 0.6 + 1e-9
    assert proxy_faults([]).error_503_rate == 0 and proxy_faults([]).latency.rate == 0


def _spark_watermarks(groups: list[range], rows: int, keys: int) -> list[int]:
    """Spark's per-batch watermark of a run without restarts (from the batches before)."""
    marks, mark = [], 0
    for files in groups:
        marks.append(mark)
        latest = max(at for f in files for _, at, _ in file_rows(f, rows, keys))
        mark = max(mark, latest - DELAY_MS)
    return marks


def test_the_workload_fires_timers_drops_late_rows_and_is_never_ambiguous() -> None:
    rows, keys, files = 200, 240, 14
    groups = [range(f, f + 1) for f in range(files)]
    e = expected_outputs(groups, _spark_watermarks(groups, rows, keys), rows, keys)
    kinds = Counter(o[2] for o in e.outputs)
    assert kinds["update"] > 0 and kinds["idle"] > 0
    assert e.late_rows == sum(
        1 for f in range(LATE_FROM, files) for j in range(rows) if j % 97 == 96
    )
    assert e.ambiguous_rows == 0
    # two files in one batch (a stop while Spark planned) and a watermark held back by a
    # driver restart: the same rows are late under either lateness bound
    merged = [range(0, 1), range(1, 3), *(range(f, f + 1) for f in range(3, files))]
    marks = _spark_watermarks(merged, rows, keys)
    marks[6] = marks[5]
    held = expected_outputs(merged, marks, rows, keys)
    assert held.ambiguous_rows == 0 and held.late_rows == e.late_rows
    # each input row that is not late is counted once in the keys' final updates
    total_rows = rows * files - e.late_rows
    last: dict[str, int] = {}
    for _b, key, kind, count, *_ in sorted(e.outputs):
        last[key] = 0 if kind == "idle" else count
    idle_counts = sum(o[3] for o in e.outputs if o[2] == "idle")
    assert sum(last.values()) + idle_counts == total_rows
