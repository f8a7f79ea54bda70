"""State schemas recorded with the checkpoints: the document, its store, what a restart may change."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dstl_client.checkpoint.records import CheckpointRecord, SubtaskInfo
from dstl_client.coordinator.metadata import CorruptMetadata, FileMetadataStore
from dstl_client.coordinator.schema_evolution import (
    StateSchemaMismatch,
    adopt,
    incompatibilities,
    merged,
)
from dstl_client.coordinator.state_schemas import (
    OperatorSchemas,
    StateSchema,
    load_schemas,
    schema_name,
    write_schemas,
)
from dstl_client.core.errors import ConfigError
from dstl_client.processor.codec import RowCodec
from dstl_client.processor.layout import stamp, unstamp
from dstl_client.processor.schema import as_struct

PREFIX = "checkpoints/"


def ddl(text: str) -> str:
    return str(as_struct(text).json())


def value(name: str, schema: str, ttl: int | None = None, kind: str = "value") -> StateSchema:
    return StateSchema(name, kind, ddl(schema), None, ttl)


def doc(*states: StateSchema, key_type: str = "string") -> OperatorSchemas:
    return OperatorSchemas("user", key_type, states)


COUNT = value("count", "n long")
PAGES = StateSchema("pages", "map", ddl("n long"), ddl("page string"))
RECENT = value("recent", "ts timestamp", ttl=60_000, kind="list")
DECLARED = doc(RECENT, COUNT, PAGES)


def test_a_document_is_named_by_its_content_written_once_and_read_back(tmp_path: Path) -> None:
    store = FileMetadataStore(tmp_path)
    assert [s.name for s in DECLARED.states] == ["count", "pages", "recent"]  # sorted
    same = doc(PAGES, COUNT, RECENT)
    assert same.schema_id == DECLARED.schema_id and len(DECLARED.schema_id) == 32
    assert doc(COUNT).schema_id != DECLARED.schema_id

    schema_id = write_schemas(store, PREFIX, DECLARED)
    assert write_schemas(store, PREFIX, same) == schema_id  # already there: the same document
    assert load_schemas(store, PREFIX, schema_id) == DECLARED
    stored = json.loads((tmp_path / schema_name(PREFIX, schema_id)).read_text())
    assert stored["key"] == {"column": "user", "type": "string"}
    assert stored["states"][1]["key_schema"]["fields"][0]["name"] == "page"
    assert stored["states"][2]["ttl_ms"] == 60_000

    with pytest.raises(CorruptMetadata, match="is missing"):
        load_schemas(store, PREFIX, "0" * 32)
    # a document whose content is not what its name says, or that does not parse
    other = doc(COUNT)
    (tmp_path / schema_name(PREFIX, other.schema_id)).write_bytes(DECLARED.to_bytes())
    with pytest.raises(CorruptMetadata, match=f"content is document {schema_id}"):
        load_schemas(store, PREFIX, other.schema_id)
    (tmp_path / schema_name(PREFIX, other.schema_id)).write_text('{"format": 1, "key": 3}')
    with pytest.raises(CorruptMetadata, match="key: 3 is not a JSON object"):
        load_schemas(store, PREFIX, other.schema_id)
    with pytest.raises(CorruptMetadata, match="holds another document"):
        write_schemas(store, PREFIX, other)


def test_a_record_names_its_schema_and_older_records_without_one_still_read() -> None:
    record = CheckpointRecord(
        job_id="j",
        operator_id="keyed",
        batch_id=3,
        max_parallelism=4,
        parallelism=1,
        subtasks=(SubtaskInfo(0, 0, 3, "a"),),
        state_schema=DECLARED.schema_id,
    )
    assert CheckpointRecord.from_bytes(record.to_bytes()).state_schema == DECLARED.schema_id
    old = record.to_json()
    assert old.pop("state_schema") == DECLARED.schema_id
    assert "state_schema" not in dataclasses.replace(record, state_schema=None).to_json()
    assert CheckpointRecord.from_json(old).state_schema is None
    # the id becomes a file name: only hex digits
    with pytest.raises(CorruptMetadata, match=r"state_schema: '\.\./x' is not a schema id"):
        CheckpointRecord.from_json({**old, "state_schema": "../x"})


def test_the_first_run_records_what_it_declares_and_a_restart_the_same_or_compatible(
    tmp_path: Path,
) -> None:
    store = FileMetadataStore(tmp_path)
    first = adopt(store, PREFIX, None, DECLARED)
    assert first == DECLARED.schema_id
    assert adopt(store, PREFIX, first, doc(COUNT, PAGES, RECENT)) == first

    # a new state is added; a state no longer declared keeps its schema (its rows remain)
    extra = value("extra", "s string")
    second = load_schemas(store, PREFIX, adopt(store, PREFIX, first, doc(COUNT, extra)))
    assert second.names == ["count", "extra", "pages", "recent"]
    assert second.get("pages") == PAGES and second.get("recent") == RECENT
    # ... so declaring it again with another schema is refused, unless init deletes it
    retyped = value("pages", "s string")
    with pytest.raises(StateSchemaMismatch, match="state 'pages'"):
        adopt(store, PREFIX, second.schema_id, doc(COUNT, retyped))
    third = load_schemas(
        store, PREFIX, adopt(store, PREFIX, second.schema_id, doc(retyped), deleted=["pages"])
    )
    assert third.get("pages") == retyped

    # compatible: a TTL's duration, a NOT NULL field made nullable
    strict = doc(value("count", "n long NOT NULL"))
    relaxed = doc(value("count", "n long"))
    assert merged(strict, relaxed) == relaxed
    assert merged(doc(RECENT), doc(dataclasses.replace(RECENT, ttl_ms=5))).get("recent") == (
        dataclasses.replace(RECENT, ttl_ms=5)
    )


@pytest.mark.parametrize(
    ("declared", "reason"),
    [
        (value("count", "n long", kind="list"), "it was a value state"),
        (value("count", "n int"), "its value: n is int, recorded as bigint"),
        (value("count", "n long, m long"), "has 2 fields, the recorded one 1"),
        (value("count", "total long"), "field n is now called 'total'"),
        (value("count", "n long NOT NULL"), "field n became NOT NULL"),
        (value("count", "n long", ttl=10), "a TTL cannot be added or removed"),
        (value("count", "n array<int>"), "n is array<int>, recorded as bigint"),
    ],
)
def test_an_incompatible_change_fails_naming_the_state_and_both_schemas(
    tmp_path: Path, declared: StateSchema, reason: str
) -> None:
    store = FileMetadataStore(tmp_path)
    first = adopt(store, PREFIX, None, doc(COUNT, PAGES))
    before = set(store.list(PREFIX))
    with pytest.raises(StateSchemaMismatch) as caught:
        adopt(store, PREFIX, first, doc(declared, PAGES))
    message = caught.value.message
    assert "state 'count'" in message and reason in message
    assert f"declared as {declared.describe()}" in message
    assert "recorded as value state struct<n: bigint>" in message
    assert isinstance(caught.value, ConfigError)
    assert set(store.list(PREFIX)) == before  # nothing recorded


def test_nested_and_map_key_changes_and_the_grouping_key_type_are_checked() -> None:
    old = StateSchema("m", "map", ddl("v struct<a: int, b: string>"), ddl("k string"))
    nested = dataclasses.replace(old, value_schema=ddl("v struct<a: int, b: int>"))
    assert incompatibilities(old, nested) == [
        "its value: v.b is int, recorded as string",
    ]
    user_key = dataclasses.replace(old, key_schema=ddl("k long"))
    assert incompatibilities(old, user_key) == ["its user key: k is bigint, recorded as string"]
    with pytest.raises(StateSchemaMismatch, match="grouping key 'user' is integer"):
        merged(doc(COUNT), doc(COUNT, key_type="integer"))


def test_the_allowed_changes_read_the_stored_bytes() -> None:
    """What :func:`merged` accepts is what the codec reads: checked on real bytes."""
    stored = RowCodec("n long NOT NULL, s string NOT NULL").dumps((7, "x"))
    assert RowCodec("n long, s string").loads(stored) == (7, "x")
    # a TTL's duration is not in the bytes: only the expiry each value carries
    expiry, data = unstamp(stamp(1_000 + 60_000, stored))
    assert (expiry, RowCodec("n long, s string").loads(data)) == (61_000, (7, "x"))
