"""Key groups: the unit of keyed state, of routing and of rescaling.

A key belongs to key group ``crc32(key_bytes(key)) % max_parallelism``. The
hash is CRC-32 (zlib's), which Spark SQL computes too, so the driver can route
rows with ``pmod(crc32(cast(cast(key AS STRING) AS BINARY)), max_parallelism)``
(:func:`key_group_sql`) and Python finds the same group for the same key: the
key's bytes are the UTF-8 of its string form, exactly what the SQL cast gives.

``max_parallelism`` is fixed when a job is created (it is the number of key
groups and the upper bound of the parallelism). Subtask ``i`` of ``p`` owns a
contiguous range of key groups, Flink's ``KeyGroupRangeAssignment``:

* key group ``kg`` goes to subtask ``kg * p // max_parallelism``;
* subtask ``i`` owns ``[ceil(i * max_p / p), ((i + 1) * max_p - 1) // p]``.

Both formulas describe the same partition, and every range is non-empty when
``1 <= p <= max_parallelism``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from dstl_client.core.errors import ConfigError, InvalidArgument

#: default number of key groups (Flink's lower default); the upper bound of the parallelism
DEFAULT_MAX_PARALLELISM = 128
#: largest supported number of key groups (Flink's bound as well)
MAX_MAX_PARALLELISM = 1 << 15


def check_parallelism(parallelism: int, max_parallelism: int) -> None:
    """Raise :class:`ConfigError` unless ``1 <= parallelism <= max_parallelism <= 32768``."""
    if not 1 <= max_parallelism <= MAX_MAX_PARALLELISM:
        raise ConfigError(
            f"max_parallelism={max_parallelism}: must be between 1 and {MAX_MAX_PARALLELISM}"
        )
    if not 1 <= parallelism <= max_parallelism:
        raise ConfigError(
            f"parallelism={parallelism}: must be between 1 and max_parallelism={max_parallelism}"
        )


def key_bytes(key: object) -> bytes:
    """The bytes a key is hashed and stored by: UTF-8 of its string form.

    ``str`` and ``int`` keys are supported (``bool`` is refused: Spark casts it
    to ``"true"``, Python to ``"True"``); ``bytes`` are taken as they are. Two
    keys with the same string form (``5`` and ``"5"``) are the same key.
    """
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bool):
        raise InvalidArgument("bool keys are not supported (Spark and Python spell them apart)")
    if isinstance(key, int):
        return str(key).encode("ascii")
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise InvalidArgument(f"unsupported key type {type(key).__name__}: use str, int or bytes")


def key_group_of_bytes(data: bytes, max_parallelism: int) -> int:
    """Key group of already encoded key bytes."""
    return zlib.crc32(data) % max_parallelism


def key_group_for_key(key: object, max_parallelism: int) -> int:
    """Key group of ``key`` (stable across processes, runs and Spark SQL)."""
    return zlib.crc32(key_bytes(key)) % max_parallelism


def operator_index_for_key_group(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The subtask (0-based) that owns ``key_group`` at ``parallelism``."""
    if not 0 <= key_group < max_parallelism:
        raise InvalidArgument(f"key group {key_group} outside [0, {max_parallelism})")
    return key_group * parallelism // max_parallelism


@dataclass(frozen=True, slots=True, order=True)
class KeyGroupRange:
    """Key groups ``first..last``, both inclusive (as in the DSTL protocol)."""

    first: int
    last: int

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last:
            raise InvalidArgument(f"bad key-group range [{self.first}, {self.last}]")

    def __contains__(self, key_group: object) -> bool:
        return isinstance(key_group, int) and self.first <= key_group <= self.last

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.last + 1))

    def __len__(self) -> int:
        return self.last - self.first + 1

    def as_tuple(self) -> tuple[int, int]:
        return (self.first, self.last)

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange | None:
        """The key groups both ranges hold, or ``None``."""
        first, last = max(self.first, other.first), min(self.last, other.last)
        return KeyGroupRange(first, last) if first <= last else None

    def __str__(self) -> str:
        return f"[{self.first}, {self.last}]"


def key_group_range_for_operator(
    index: int, parallelism: int, max_parallelism: int
) -> KeyGroupRange:
    """The contiguous key-group range subtask ``index`` of ``parallelism`` owns."""
    check_parallelism(parallelism, max_parallelism)
    if not 0 <= index < parallelism:
        raise InvalidArgument(f"subtask index {index} outside [0, {parallelism})")
    first = (index * max_parallelism + parallelism - 1) // parallelism
    last = ((index + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(first, last)


def all_ranges(parallelism: int, max_parallelism: int) -> list[KeyGroupRange]:
    """Every subtask's range, in subtask order (they partition ``[0, max_p)``)."""
    return [
        key_group_range_for_operator(i, parallelism, max_parallelism) for i in range(parallelism)
    ]


def key_group_sql(column: str, max_parallelism: int) -> str:
    """Spark SQL expression computing the key group of ``column`` (a column name).

    Equal to :func:`key_group_for_key` for string and integer columns.
    """
    quoted = "`" + column.replace("`", "``") + "`"
    return f"pmod(crc32(cast(cast({quoted} AS STRING) AS BINARY)), {int(max_parallelism)})"


def operator_index_sql(key_group_column: str, parallelism: int, max_parallelism: int) -> str:
    """Spark SQL expression of the owning subtask for a key-group column."""
    quoted = "`" + key_group_column.replace("`", "``") + "`"
    return f"CAST(({quoted} * {int(parallelism)}) DIV {int(max_parallelism)} AS INT)"


def partition_sql(column: str, parallelism: int, max_parallelism: int) -> str:
    """Spark SQL expression of the subtask owning the key in ``column`` (an ``INT``)."""
    kg = key_group_sql(column, max_parallelism)
    return f"CAST((({kg}) * {int(parallelism)}) DIV {int(max_parallelism)} AS INT)"
