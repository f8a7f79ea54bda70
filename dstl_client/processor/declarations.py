"""The driver's check of a processor's ``init``: its state declarations, as Spark's driver does.

:func:`check_processor` runs ``init`` once on a copy of the processor, with
a :class:`DeclarationCheck` handle that checks every declaration (names, one
kind per name, TTL needs a time mode, no timers outside a key) and keeps
them: the states' schemas the checkpoints record. Used by the streaming
(:mod:`.transform`) and the sorted mode (:mod:`dstl_client.bounded`). The
caller's thread (the driver's).
"""

from __future__ import annotations

from typing import Any

from dstl_client.coordinator.state_schemas import OperatorSchemas, declared_of
from dstl_client.core.errors import ConfigError, InvalidArgument
from dstl_client.processor.codec import RowCodec
from dstl_client.processor.layout import check_state_name


class Unbound:
    """A state variable declared in the driver's check of ``init``: not usable there.

    Every attribute raises. Driver thread only (the check's).
    """

    def __getattr__(self, name: str) -> Any:
        raise InvalidArgument(
            "state is used in handleInputRows and handleExpiredTimer, not in init"
        )


class DeclarationCheck:
    """A handle for the driver's run of ``init``: checks every declaration, keeps nothing.

    Invariant: the handle's rules (names, one kind per name, TTL needs a time
    mode, no timers without a key). The caller's thread only.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.kinds: dict[str, tuple[Any, ...]] = {}
        #: names ``init`` deletes (``deleteIfExists``)
        self.deleted: list[str] = []

    def schemas(self, key: str, key_type: str) -> OperatorSchemas:
        """The declared states as the schema document the checkpoints record."""
        states: dict[str, tuple[str, str, str | None, int | None]] = {}
        for name, sig in self.kinds.items():
            if sig[0] == "map":
                states[name] = ("map", sig[2].json(), sig[1].json(), sig[3])
            else:
                states[name] = (sig[0], sig[1].json(), None, sig[2])
        return declared_of(key, key_type, states)

    def _declare(self, name: str, signature: tuple[Any, ...], ttl: int | None) -> Unbound:
        check_state_name(name)
        if ttl is not None:
            if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl <= 0:
                raise InvalidArgument(f"state {name!r}: ttlDurationMs must be a positive int")
            if self.mode == "None":
                raise InvalidArgument(
                    f"state {name!r} has a TTL: use time mode ProcessingTime or EventTime"
                )
        old = self.kinds.setdefault(name, signature)
        if old != signature:
            raise InvalidArgument(f"state {name!r} is declared twice, differently")
        return Unbound()

    def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        return self._declare(
            stateName, ("value", RowCodec(schema).schema, ttlDurationMs), ttlDurationMs
        )

    def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
        return self._declare(
            stateName, ("list", RowCodec(schema).schema, ttlDurationMs), ttlDurationMs
        )

    def getMapState(
        self,
        stateName: str,
        userKeySchema: Any,
        valueSchema: Any,
        ttlDurationMs: int | None = None,
    ) -> Any:
        signature = (
            "map",
            RowCodec(userKeySchema).schema,
            RowCodec(valueSchema).schema,
            ttlDurationMs,
        )
        return self._declare(stateName, signature, ttlDurationMs)

    def deleteIfExists(self, stateName: str) -> None:
        check_state_name(stateName)
        self.deleted.append(stateName)

    def _no_key(self, *args: Any) -> Any:
        raise InvalidArgument("timers belong to a key: use them in the handlers, not in init")

    registerTimer = deleteTimer = listTimers = _no_key


def check_processor(processor: Any, mode: str) -> DeclarationCheck:
    """Spark's driver-side ``init``: on a copy, with a handle that only checks declarations
    (and keeps them: the states' schemas)."""
    from pyspark import cloudpickle

    for method in ("init", "handleInputRows"):
        if not callable(getattr(processor, method, None)):
            raise ConfigError(f"the processor has no {method}() (a StatefulProcessor)")
    probe = cloudpickle.loads(cloudpickle.dumps(processor))  # type: ignore[no-untyped-call]
    declared = DeclarationCheck(mode)
    try:
        probe.init(declared)
        probe.close()
    except InvalidArgument as exc:
        raise ConfigError(f"the processor's init(): {exc.message}") from None
    return declared
