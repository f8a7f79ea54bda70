"""The driver side: checkpoint records, the shared state registry, the coordinator."""

from dstl_client.coordinator.coordinator import (
    CheckpointCoordinator,
    CoordinatorConfig,
    MaterializationFailed,
    blob_store_lister,
)
from dstl_client.coordinator.records import CheckpointRecord, TaskResult
from dstl_client.coordinator.registry import SharedStateRegistry
from dstl_client.coordinator.storage import CheckpointExists, CheckpointStorage

__all__ = [
    "CheckpointCoordinator",
    "CheckpointExists",
    "CheckpointRecord",
    "CheckpointStorage",
    "CoordinatorConfig",
    "MaterializationFailed",
    "SharedStateRegistry",
    "TaskResult",
    "blob_store_lister",
]
