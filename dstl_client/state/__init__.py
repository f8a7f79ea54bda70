"""Keyed state on the DSTL: the state API, serializers, the node-local store, the backends."""

from dstl_client.state.api import (
    KeyedContext,
    ListState,
    MapState,
    ReducingState,
    ValueState,
)
from dstl_client.state.serializers import (
    BOOL,
    BYTES,
    FLOAT64,
    INT64,
    JSON,
    PICKLE,
    STR,
    Serializer,
    TupleSerializer,
)

__all__ = [
    "BOOL",
    "BYTES",
    "FLOAT64",
    "INT64",
    "JSON",
    "PICKLE",
    "STR",
    "KeyedContext",
    "ListState",
    "MapState",
    "ReducingState",
    "Serializer",
    "TupleSerializer",
    "ValueState",
]
