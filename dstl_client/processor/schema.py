"""Schemas of state variables: a Spark ``StructType`` or a DDL string, parsed without a JVM.

A processor names its state schemas in ``init()``, which runs on executors,
where no JVM is at hand to parse DDL. :func:`as_struct` parses Spark's DDL
in Python (the subset state schemas use)::

    "count long, last string"                 fields, as ``StructType.fromDDL``
    "user STRING NOT NULL, tags ARRAY<STRING>" type names in any case, NOT NULL, COMMENT '...'
    "`odd name` decimal(10, 2)"               back-quoted names
    "struct<a: int, b: map<string, double>>"  a struct type
    "bigint"                                  one bare type: one field called ``value``

Types: boolean, tinyint/byte, smallint/short, int/integer, bigint/long,
float/real, double, decimal(p, s), string (char(n), varchar(n)), binary,
date, timestamp (timestamp_ltz), timestamp_ntz, void, array<t>, map<k, v>,
struct<...>. Anything else raises :class:`~dstl_client.core.errors.InvalidArgument`.

Pure functions: safe from any thread.
"""

from __future__ import annotations

import re
from typing import Any

from dstl_client.core.errors import InvalidArgument

_TOKEN = re.compile(
    r"\s*(?:(?P<quoted>`(?:[^`]|``)*`)|(?P<string>'(?:[^'\\]|\\.)*')"
    r"|(?P<number>\d+)|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>[<>(),:]))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    end = len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise InvalidArgument(f"cannot parse the schema {text!r} at {text[pos : pos + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        value = m.group(kind)
        if kind == "quoted":
            kind, value = "word", value[1:-1].replace("``", "`")
            out.append(("name", value))
        else:
            out.append((kind, value))
        pos = m.end()
    return out


def _simple_types() -> dict[str, Any]:
    from pyspark.sql import types as T

    return {
        "boolean": T.BooleanType(),
        "bool": T.BooleanType(),
        "tinyint": T.ByteType(),
        "byte": T.ByteType(),
        "smallint": T.ShortType(),
        "short": T.ShortType(),
        "int": T.IntegerType(),
        "integer": T.IntegerType(),
        "bigint": T.LongType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "real": T.FloatType(),
        "double": T.DoubleType(),
        "string": T.StringType(),
        "binary": T.BinaryType(),
        "date": T.DateType(),
        "timestamp": T.TimestampType(),
        "timestamp_ltz": T.TimestampType(),
        "timestamp_ntz": T.TimestampNTZType(),
        "void": T.NullType(),
    }


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.pos = 0
        self.simple = _simple_types()

    def fail(self, what: str) -> InvalidArgument:
        near = " ".join(v for _, v in self.toks[self.pos : self.pos + 4]) or "the end"
        return InvalidArgument(f"bad schema {self.text!r}: {what} near {near!r}")

    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        i = self.pos + offset
        return self.toks[i] if i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1].lower() != value):
            raise self.fail(f"expected {value!r}" if value else "unexpected end")
        self.pos += 1
        return tok

    def accept(self, value: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] in ("word", "punct") and tok[1].lower() == value:
            self.pos += 1
            return True
        return False

    def done(self) -> bool:
        return self.pos >= len(self.toks)

    def number(self) -> int:
        kind, value = self.take()
        if kind != "number":
            raise self.fail("expected a number")
        return int(value)

    def data_type(self) -> Any:
        from pyspark.sql import types as T

        kind, word = self.take()
        if kind != "word":
            raise self.fail("expected a type")
        name = word.lower()
        if name in self.simple:
            return self.simple[name]
        if name in ("char", "varchar"):
            self.take("(")
            self.number()
            self.take(")")
            return T.StringType()
        if name in ("decimal", "dec", "numeric"):
            if self.accept("("):
                precision = self.number()
                scale = self.number() if self.accept(",") else 0
                self.take(")")
                return T.DecimalType(precision, scale)
            return T.DecimalType(10, 0)
        if name == "array":
            self.take("<")
            element = self.data_type()
            self.take(">")
            return T.ArrayType(element, True)
        if name == "map":
            self.take("<")
            key = self.data_type()
            self.take(",")
            value = self.data_type()
            self.take(">")
            return T.MapType(key, value, True)
        if name == "struct":
            self.take("<")
            fields = [] if self.accept(">") else self.fields(closing=">")
            if fields:
                self.take(">")
            return T.StructType(fields)
        self.pos -= 1
        raise self.fail(f"unsupported type {word!r}")

    def field(self) -> Any:
        from pyspark.sql import types as T

        kind, name = self.take()
        if kind not in ("word", "name"):
            raise self.fail("expected a field name")
        self.accept(":")
        dtype = self.data_type()
        nullable = True
        if self.accept("not"):
            self.take("null")
            nullable = False
        if self.accept("comment"):
            kind, _ = self.take()
            if kind != "string":
                raise self.fail("expected a comment string")
        return T.StructField(name, dtype, nullable)

    def fields(self, closing: str | None = None) -> list[Any]:
        out = [self.field()]
        while self.accept(","):
            out.append(self.field())
        tok = self.peek()
        if closing is not None and (tok is None or tok[1] != closing):
            raise self.fail(f"expected {closing!r}")
        return out


def parse_ddl(text: str) -> Any:
    """A DDL string as a ``StructType`` (fields) or, for one bare type, that ``DataType``."""
    if not text.strip():
        raise InvalidArgument("empty schema")
    # one bare type ("bigint", "array<string>"): a type name not followed by another word
    bare = _Parser(text)
    try:
        dtype = bare.data_type()
        if bare.done():
            return dtype
    except InvalidArgument:
        pass
    parser = _Parser(text)
    fields = parser.fields()
    if not parser.done():
        raise parser.fail("unexpected text")
    from pyspark.sql import types as T

    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"bad schema {text!r}: duplicate field names")
    return T.StructType(fields)


def as_struct(schema: Any) -> Any:
    """``schema`` (``StructType``, another ``DataType`` or a DDL string) as a ``StructType``.

    A type that is not a struct becomes a struct of one field called ``value``
    (state values are tuples, as in Spark).
    """
    from pyspark.sql import types as T

    if isinstance(schema, str):
        schema = parse_ddl(schema)
    if isinstance(schema, T.StructType):
        return schema
    if isinstance(schema, T.DataType):
        return T.StructType([T.StructField("value", schema, True)])
    raise InvalidArgument(f"a schema is a StructType or a DDL string, not {type(schema).__name__}")
