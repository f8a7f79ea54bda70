"""The driver side: checkpoint records, the shared state registry, the coordinator.

Names are imported lazily: tasks import :mod:`dstl_client.coordinator.messages`
without pulling in the driver's modules (and without an import cycle).

Module map (one role each): :mod:`.messages` (what driver and tasks
exchange), :mod:`.records`, :mod:`.metadata` (the job metadata store: a
directory or S3), :mod:`.storage`, :mod:`.registry`,
:mod:`.config`, :mod:`.batches`, :mod:`.retention`, :mod:`.cleanup`,
:mod:`.watchdog`, :mod:`.overrides`, :mod:`.stats`, :mod:`.metrics`,
:mod:`.coordinator` (sequences them), :mod:`.rest`, :mod:`.local`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dstl_client.coordinator.batches import IncompleteBatch as IncompleteBatch
    from dstl_client.coordinator.batches import MaterializationFailed as MaterializationFailed
    from dstl_client.coordinator.cleanup import OrphanSweeper as OrphanSweeper
    from dstl_client.coordinator.config import CheckpointSettings as CheckpointSettings
    from dstl_client.coordinator.config import CoordinatorConfig as CoordinatorConfig
    from dstl_client.coordinator.coordinator import (
        CheckpointCoordinator as CheckpointCoordinator,
    )
    from dstl_client.coordinator.messages import BatchPlan as BatchPlan
    from dstl_client.coordinator.messages import MatResult as MatResult
    from dstl_client.coordinator.messages import TaskResult as TaskResult
    from dstl_client.coordinator.messages import TaskStats as TaskStats
    from dstl_client.coordinator.metadata import MetadataStore as MetadataStore
    from dstl_client.coordinator.metadata import open_metadata_store as open_metadata_store
    from dstl_client.coordinator.overrides import (
        ConfigUpdateInProgress as ConfigUpdateInProgress,
    )
    from dstl_client.coordinator.records import CheckpointRecord as CheckpointRecord
    from dstl_client.coordinator.registry import SharedStateRegistry as SharedStateRegistry
    from dstl_client.coordinator.stats import CheckpointStats as CheckpointStats
    from dstl_client.coordinator.storage import CheckpointExists as CheckpointExists
    from dstl_client.coordinator.storage import CheckpointMissing as CheckpointMissing
    from dstl_client.coordinator.storage import CheckpointStorage as CheckpointStorage
    from dstl_client.coordinator.watchdog import CheckpointTimedOut as CheckpointTimedOut

_WHERE = {
    "IncompleteBatch": "batches",
    "MaterializationFailed": "batches",
    "OrphanSweeper": "cleanup",
    "CheckpointSettings": "config",
    "CoordinatorConfig": "config",
    "CheckpointCoordinator": "coordinator",
    "BatchPlan": "messages",
    "MatResult": "messages",
    "TaskResult": "messages",
    "TaskStats": "messages",
    "MetadataStore": "metadata",
    "open_metadata_store": "metadata",
    "ConfigUpdateInProgress": "overrides",
    "CheckpointRecord": "records",
    "SharedStateRegistry": "registry",
    "CheckpointStats": "stats",
    "CheckpointExists": "storage",
    "CheckpointMissing": "storage",
    "CheckpointStorage": "storage",
    "CheckpointTimedOut": "watchdog",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"dstl_client.coordinator.{module}"), name)
