"""The driver side: checkpoint records, the shared state registry, the coordinator.

Names are imported lazily: tasks import :mod:`dstl_client.coordinator.records`
without pulling in the driver's modules (and without an import cycle).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dstl_client.coordinator.coordinator import (
        CheckpointCoordinator as CheckpointCoordinator,
    )
    from dstl_client.coordinator.coordinator import (
        CoordinatorConfig as CoordinatorConfig,
    )
    from dstl_client.coordinator.coordinator import (
        MaterializationFailed as MaterializationFailed,
    )
    from dstl_client.coordinator.coordinator import (
        blob_store_lister as blob_store_lister,
    )
    from dstl_client.coordinator.records import CheckpointRecord as CheckpointRecord
    from dstl_client.coordinator.records import TaskResult as TaskResult
    from dstl_client.coordinator.registry import SharedStateRegistry as SharedStateRegistry
    from dstl_client.coordinator.storage import CheckpointExists as CheckpointExists
    from dstl_client.coordinator.storage import CheckpointStorage as CheckpointStorage

_WHERE = {
    "CheckpointCoordinator": "coordinator",
    "CoordinatorConfig": "coordinator",
    "MaterializationFailed": "coordinator",
    "blob_store_lister": "coordinator",
    "CheckpointRecord": "records",
    "TaskResult": "records",
    "SharedStateRegistry": "registry",
    "CheckpointExists": "storage",
    "CheckpointStorage": "storage",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"dstl_client.coordinator.{module}"), name)
