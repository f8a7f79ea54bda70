"""The state every restore of the benchmark rebuilds: keys, values, update rounds.

One row of state per key: a ``ValueState`` of ``value_bytes`` bytes under a
12-character key. Round 0 writes every key; update round ``r`` (1, 2, ...)
rewrites a fixed, seeded sample of ``update_fraction`` of the keys with a
value that names the round, so the state after round ``r`` is known exactly
and the Spark job (the same keys, the same values, the last value per key)
holds the same state.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from typing import Any

from dstl_client.keygroups import key_group_range_for_operator
from dstl_client.state.api import KeyedContext
from dstl_client.state.serializers import BYTES


def key_name(i: int) -> str:
    """The key of id ``i``: 12 characters."""
    return f"key-{i:08d}"


def value_of(i: int, round_no: int, size: int) -> bytes:
    """The value key ``i`` holds after round ``round_no``: ``size`` bytes, naming the round."""
    head = f"{round_no:05d}:".encode()
    body = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=32).hexdigest().encode()
    reps = (size - len(head)) // len(body) + 1
    return (head + body * reps)[:size]


def update_ids(keys: int, fraction: float, round_no: int, seed: int) -> list[int]:
    """The key ids round ``round_no`` (>= 1) rewrites: a seeded sample, sorted."""
    n = max(1, round(keys * fraction))
    return sorted(random.Random(seed * 1_000_003 + round_no).sample(range(keys), n))


def subtask_of_ids(keys: int, parallelism: int, max_parallelism: int) -> list[int]:
    """The subtask (at ``parallelism``) owning each key id, in id order."""
    owner = [0] * max_parallelism
    for index in range(parallelism):
        for kg in key_group_range_for_operator(index, parallelism, max_parallelism):
            owner[kg] = index
    # key_group_for_key(str) == crc32(utf-8) % max_parallelism; inlined for speed
    return [owner[zlib.crc32(key_name(i).encode()) % max_parallelism] for i in range(keys)]


def put_value(key: Any, rows: list[bytes], ctx: KeyedContext) -> None:
    """The job's function: the key's state becomes its last input value; no output."""
    ctx.value_state("v", BYTES).update(rows[-1])
