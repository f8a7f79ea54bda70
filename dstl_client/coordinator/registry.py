"""The shared state registry: reference counts per stored object.

Checkpoints share objects (a materialized part is re-referenced by later
checkpoints; one sidecar object holds the sections of many writers). The
registry counts, per object key, how many retained checkpoints refer to it.
Registering a checkpoint increments the counts of its objects; dropping it
decrements them, and the objects whose count reaches zero are returned to be
discarded. After a driver restart the counts are rebuilt by registering the
retained checkpoints again.
"""

from __future__ import annotations

from collections.abc import Iterable


class SharedStateRegistry:
    """Reference counts of objects by the checkpoints that use them.

    Invariants: a checkpoint is registered at most once; an object's count is
    the number of registered checkpoints referring to it, and an object is
    returned as unused exactly when its count reaches zero. Not thread-safe:
    its owner (:class:`~dstl_client.coordinator.retention.RetainedCheckpoints`)
    calls it under the coordinator's lock.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._by_checkpoint: dict[int, frozenset[str]] = {}

    def register(self, checkpoint_id: int, object_keys: Iterable[str]) -> None:
        """Count the objects of a new checkpoint (once per checkpoint)."""
        if checkpoint_id in self._by_checkpoint:
            raise ValueError(f"checkpoint {checkpoint_id} is already registered")
        keys = frozenset(object_keys)
        self._by_checkpoint[checkpoint_id] = keys
        for key in keys:
            self._counts[key] = self._counts.get(key, 0) + 1

    def unregister(self, checkpoint_id: int) -> list[str]:
        """Drop a checkpoint; return the objects no checkpoint refers to any more."""
        keys = self._by_checkpoint.pop(checkpoint_id, frozenset())
        unused = []
        for key in keys:
            n = self._counts[key] - 1
            if n:
                self._counts[key] = n
            else:
                del self._counts[key]
                unused.append(key)
        return sorted(unused)

    def count(self, object_key: str) -> int:
        return self._counts.get(object_key, 0)

    def is_referenced(self, object_key: str) -> bool:
        return object_key in self._counts

    @property
    def checkpoints(self) -> list[int]:
        return sorted(self._by_checkpoint)

    def referenced(self) -> frozenset[str]:
        """Every object some registered checkpoint refers to."""
        return frozenset(self._counts)

    def __len__(self) -> int:
        return len(self._counts)
