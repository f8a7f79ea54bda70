"""The schema codec: DDL without a JVM, a compact deterministic encoding of rows, no pickle."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import Row
from pyspark.sql import types as T

from dstl_client.core.errors import InvalidArgument
from dstl_client.processor.codec import RowCodec
from dstl_client.processor.schema import as_struct, parse_ddl


@pytest.mark.parametrize(
    ("ddl", "want"),
    [
        ("n long", T.StructType([T.StructField("n", T.LongType())])),
        ("bigint", T.StructType([T.StructField("value", T.LongType())])),
        (
            "user STRING NOT NULL, tags ARRAY<STRING> COMMENT 'labels'",
            T.StructType(
                [
                    T.StructField("user", T.StringType(), False),
                    T.StructField("tags", T.ArrayType(T.StringType())),
                ]
            ),
        ),
        (
            "`odd name` decimal(10, 2), m map<string, double>, s struct<a: int, b: date>",
            T.StructType(
                [
                    T.StructField("odd name", T.DecimalType(10, 2)),
                    T.StructField("m", T.MapType(T.StringType(), T.DoubleType())),
                    T.StructField(
                        "s",
                        T.StructType(
                            [T.StructField("a", T.IntegerType()), T.StructField("b", T.DateType())]
                        ),
                    ),
                ]
            ),
        ),
        (
            "date timestamp, t timestamp_ntz, b binary, f float, x tinyint, y smallint, z boolean",
            T.StructType(
                [
                    T.StructField("date", T.TimestampType()),
                    T.StructField("t", T.TimestampNTZType()),
                    T.StructField("b", T.BinaryType()),
                    T.StructField("f", T.FloatType()),
                    T.StructField("x", T.ByteType()),
                    T.StructField("y", T.ShortType()),
                    T.StructField("z", T.BooleanType()),
                ]
            ),
        ),
    ],
)
def test_ddl_is_parsed_as_spark_parses_it(ddl: str, want: Any) -> None:
    assert as_struct(ddl) == want


@pytest.mark.parametrize(
    "bad", ["", "a", "a long,", "a long b long", "a unknowntype", "a map<string>", "a long, a int"]
)
def test_bad_ddl_is_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        as_struct(bad)


def test_a_bare_type_and_a_struct_type_parse() -> None:
    assert parse_ddl("array<bigint>") == T.ArrayType(T.LongType())
    assert as_struct(T.LongType()) == T.StructType([T.StructField("value", T.LongType())])
    with pytest.raises(InvalidArgument):
        as_struct(42)


EVERYTHING = (
    "a long, b string, c double, d array<int>, e map<string, long>, "
    "f struct<x: int, y: string>, g decimal(38, 6), h timestamp, i date, j boolean, "
    "k binary, l float, m tinyint, n smallint, o timestamp_ntz"
)


def test_every_type_round_trips() -> None:
    codec = RowCodec(EVERYTHING)
    value = (
        -(1 << 63),
        "hé ✓",
        -1.5e300,
        [1, None, -3],
        {"z": 1, "a": None},
        (7, "q"),
        decimal.Decimal("-12345678901234567890123456789012.345678"),
        datetime.datetime(2024, 1, 2, 3, 4, 5, 6),
        datetime.date(1969, 12, 31),
        True,
        b"\x00\xff",
        0.5,
        -128,
        32767,
        datetime.datetime(1900, 1, 1),
    )
    assert codec.loads(codec.dumps(value)) == value
    nulls = tuple(None for _ in value)
    assert codec.loads(codec.dumps(nulls)) == nulls
    assert len(codec.dumps(nulls)) == 2  # the null bitmap only


def test_rows_dicts_and_numpy_scalars_encode_like_tuples() -> None:
    import numpy as np
    import pandas as pd

    codec = RowCodec("n long, s string, x double, t timestamp")
    ts = datetime.datetime(2024, 5, 1, 12)
    want = codec.dumps((3, "a", 1.5, ts))
    assert codec.dumps(Row(n=3, s="a", x=1.5, t=ts)) == want
    assert codec.dumps({"t": ts, "x": 1.5, "s": "a", "n": 3}) == want
    assert codec.dumps([np.int64(3), "a", np.float64(1.5), pd.Timestamp(ts)]) == want
    assert codec.dumps((3, pd.NA, 1.5, pd.NaT)) == codec.dumps((3, None, 1.5, None))


def test_values_decode_as_sparks_state_clients_return_them() -> None:
    """A tuple at the top (or a Row with ``loads_row``), nested structs as Rows with names."""
    codec = RowCodec("n int, s struct<x: int, y: string>, l array<struct<p: int>>")
    value = codec.loads(codec.dumps((1, {"x": 2, "y": "q"}, [(3,), None])))
    assert type(value) is tuple
    assert isinstance(value[1], Row) and value[1].asDict() == {"x": 2, "y": "q"}
    assert value[2][0].asDict() == {"p": 3} and value[2][1] is None
    as_row = codec.loads_row(codec.dumps(value))
    assert isinstance(as_row, Row) and as_row.n == 1 and as_row.s.y == "q"


def test_a_top_level_iterable_is_taken_as_its_items_as_spark_takes_it() -> None:
    codec = RowCodec("name string")
    assert codec.dumps("k") == codec.dumps(("k",)) == codec.dumps(iter(["k"]))
    with pytest.raises(InvalidArgument, match="a str is taken as its characters"):
        codec.dumps("key")
    with pytest.raises(InvalidArgument):
        codec.dumps(5)


def test_equal_values_give_equal_bytes_whatever_the_insertion_order_of_maps() -> None:
    codec = RowCodec("m map<string, long>")
    assert codec.dumps(({"a": 1, "b": 2},)) == codec.dumps(({"b": 2, "a": 1},))


def test_the_encoding_is_compact() -> None:
    assert RowCodec("n long").dumps((1,)) == b"\x00\x02"  # bitmap, zigzag varint
    assert len(RowCodec("n long, s string").dumps((300, "abc"))) == 1 + 2 + 4


@pytest.mark.parametrize(
    ("schema", "value", "message"),
    [
        ("n long", (1, 2), "has 1 fields"),
        ("n long", 5, "tuple, Row or dict"),
        ("n int", (1 << 31,), "does not fit"),
        ("n long", ("x",), "needs an integer"),
        ("n long not null", (None,), "not nullable"),
        ("s string", (1,), "needs a str"),
        ("d array<int>", ("abc",), "needs a list"),
        ("m map<string, int>", ({None: 1},), "cannot be null"),
        ("n long", {"n": 1, "zz": 2}, "not in"),
    ],
)
def test_bad_values_are_refused_with_the_field_named(schema: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        RowCodec(schema).dumps(value)


def test_numpy_arrays_are_stored_as_lists() -> None:
    """What pandas hands over for array columns (1-D and object arrays) goes into state as the
    list it holds (the NumPy array used to reach ``.item()``: a bare ``ValueError``)."""
    codec = RowCodec(
        "a array<int>, s array<string>, aa array<array<int>>, st array<struct<p: int>>, "
        "one array<bigint>, m map<string, array<double>>"
    )
    value = (
        np.array([1, 2, 3], dtype=np.int32),
        np.array(["x", None], dtype=object),
        np.array([np.array([1, 2]), np.array([3])], dtype=object),
        np.array([{"p": 1}, None], dtype=object),
        np.array([7]),
        {"k": np.array([0.5, 1.5])},
    )
    got = codec.loads(codec.dumps(value))
    assert got == ([1, 2, 3], ["x", None], [[1, 2], [3]], [Row(p=1), None], [7], {"k": [0.5, 1.5]})
    assert codec.dumps(value) == codec.dumps(got)
    grid = RowCodec("g array<array<long>>")
    assert grid.loads(grid.dumps((np.arange(4).reshape(2, 2),))) == ([[0, 1], [2, 3]],)


@pytest.mark.parametrize(
    ("schema", "value", "message"),
    [
        ("n long", (np.array([1, 2]),), "field 'n': bigint needs an"),
        ("n int", (1.7,), "field 'n': int needs an integer, not float 1.7"),
        ("x double", (decimal.Decimal("1.5"),), "field 'x': double needs a number"),
        ("b boolean", (5,), "field 'b': boolean needs a bool, not int 5"),
        ("n int", ("3",), "field 'n': int needs an integer"),
        ("n int", (2**40 + 3,), "field 'n': 1099511627779 does not fit int"),
        ("m map<string, int>", ([("a", 1)],), r"field 'm': map needs a dict.*pass dict\(value\)"),
        ("s struct<m: map<string, int>>", ({"m": [("a", 1)]},), "field 's': field 'm': map"),
    ],
)
def test_a_value_its_field_cannot_hold_is_refused_with_the_field_named(
    schema: str, value: Any, message: str
) -> None:
    """Where Spark 4.3 stores null (or an integer's low bits), dstl refuses: never a lost value."""
    with pytest.raises(InvalidArgument, match=message):
        RowCodec(schema).dumps(value)


def test_a_value_its_field_holds_exactly_is_kept_in_the_fields_type() -> None:
    codec = RowCodec("n int, x double, f float, d decimal(5, 2), b boolean, l bigint")
    got = codec.loads(codec.dumps((2.0, 5, 3, 1, 1, np.float64(4.0))))
    assert got == (2, 5.0, 3.0, decimal.Decimal("1.00"), True, 4)
    assert [type(v) for v in got] == [int, float, float, decimal.Decimal, bool, int]


def test_truncated_bytes_are_refused() -> None:
    codec = RowCodec("n long, s string")
    data = codec.dumps((5, "hello"))
    with pytest.raises(InvalidArgument):
        codec.loads(data[:-1])
    with pytest.raises(InvalidArgument):
        codec.loads(data + b"\x00")


def test_unsupported_types_are_refused_when_the_codec_is_made() -> None:
    with pytest.raises(InvalidArgument, match="not supported"):
        RowCodec(T.StructType([T.StructField("v", T.VariantType())]))


_ROWS = st.tuples(
    st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1)),
    st.one_of(st.none(), st.text()),
    st.one_of(st.none(), st.floats(allow_nan=False)),
    st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(-(1 << 31), (1 << 31) - 1)))),
    st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.one_of(st.none(), st.booleans()))),
    st.one_of(st.none(), st.binary()),
)


@settings(max_examples=200, deadline=None)
@given(_ROWS)
def test_any_row_round_trips(value: tuple[Any, ...]) -> None:
    codec = RowCodec("a long, b string, c double, d array<int>, e map<string, boolean>, f binary")
    data = codec.dumps(value)
    assert codec.loads(data) == value
    assert codec.dumps(codec.loads(data)) == data
