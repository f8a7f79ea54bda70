"""The pandas side of a processor task: per-key input frames and the output stacking,
checked against the plain pandas operations they replace."""

from __future__ import annotations

import warnings
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from dstl_client.processor.frames import concat_frames as _concat_frames
from dstl_client.processor.task import ProcessorTaskSpec, _input_groups


def spec() -> ProcessorTaskSpec:
    return ProcessorTaskSpec(processor=b"", key="k", columns=("k", "v", "t"), how=None)  # type: ignore[arg-type]


def test_each_key_gets_its_rows_in_arrival_order_with_a_fresh_range_index() -> None:
    keys = ["b", "a", "b", "c", "a", "b"]
    table = pa.table(
        {
            "k": keys,
            "v": pa.array([1, 2, 3, 4, None, 6], pa.int64()),
            "t": pa.array([10, 20, 30, 40, 50, 60], pa.timestamp("us", tz="UTC")),
        }
    )
    groups, n = _input_groups(spec(), table)
    assert n == 6
    full = table.to_pandas()
    # as Spark hands them over: naive times in the session zone, in nanoseconds
    full["t"] = full["t"].dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")
    seen = []
    for key, frames in groups:
        (frame,) = list(frames)
        want = full[full["k"] == key].reset_index(drop=True)
        pd.testing.assert_frame_equal(frame, want)
        assert isinstance(frame.index, pd.RangeIndex) and frame.index.start == 0
        seen.append(key)
    assert seen == ["b", "a", "c"]  # keys in order of first appearance


def test_a_key_frame_is_the_processors_own_to_change() -> None:
    table = pa.table({"k": ["a", "b", "a"], "v": [1, 2, 3], "t": [0, 0, 0]})
    groups, _ = _input_groups(spec(), table)
    frames = [next(f) for _k, f in groups]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no SettingWithCopyWarning: not a view of another frame
        frames[0]["v"] = frames[0]["v"] * 10
    assert frames[0]["v"].tolist() == [10, 30]
    assert frames[1]["v"].tolist() == [2]


CASES: list[list[dict[str, Any]]] = [
    [{"k": ["x"], "n": [1], "s": [1.5]}, {"k": ["y"], "n": [2], "s": [2.5]}],
    [{"k": ["x"], "n": [1]}, {"k": ["y"], "n": [None]}],  # a missing value
    [{"t": [pd.Timestamp("2024-01-01")], "b": [True]}, {"t": [pd.NaT], "b": [False]}],
    [{"n": pd.array([1, None], dtype="Int64")}, {"n": pd.array([3], dtype="Int64")}],
    [{"k": ["x"], "n": [1]}, {"n": [2], "k": ["y"]}],  # other column order: pd.concat
    [{"k": ["x", "z"], "n": [1, 3]}, {"k": ["y"], "n": [2.5]}],  # ints and floats
    [{"n": [2**60]}, {"n": [None]}],  # a large integer stays exact
]


@pytest.mark.parametrize("columns", CASES)
def test_stacked_output_frames_equal_pd_concat(columns: list[dict[str, Any]]) -> None:
    frames = [pd.DataFrame(c) for c in columns]
    got = _concat_frames(frames)
    want = pd.concat(frames, ignore_index=True)
    # the same values, and Arrow sees the same column types and nulls
    got_arrow = pa.Table.from_pandas(got, preserve_index=False)
    want_arrow = pa.Table.from_pandas(want, preserve_index=False)
    assert got_arrow.schema.remove_metadata() == want_arrow.schema.remove_metadata()
    assert got_arrow.to_pylist() == want_arrow.to_pylist()
