"""Query options from Spark's configuration: ``spark.dstl.<option>`` keys.

Every :class:`~dstl_client.batch.options.KeyedOptions` field can be set in
``spark-defaults.conf``, with ``--conf`` or ``spark.conf.set``, in camelCase
or as spelt in Python::

    spark.dstl.dstlAddress        unix:///var/run/dstl/dstl.sock
    spark.dstl.stateDir           /local/dstl-state
    spark.dstl.parallelism        8
    spark.dstl.max_parallelism    256
    spark.dstl.trigger            {"processingTime": "5 seconds"}   (JSON)

Explicit arguments win over these keys. A ``spark.dstl.`` key naming no
option is logged as a warning and ignored (another part of the job may own
it). Pure functions over a session's configuration: call them on the driver.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from dstl_client.batch.options import KeyedOptions
from dstl_client.core.errors import ConfigError

log = logging.getLogger(__name__)

PREFIX = "spark.dstl."
#: options a configuration key cannot set (code, or the query's own life)
_NOT_FROM_CONF = frozenset({"on_phase", "start"})


def settable_from_conf(name: str) -> bool:
    """Whether a ``spark.dstl.*`` key may set the option ``name`` (not code or the query's life)."""
    return name not in _NOT_FROM_CONF


def option_name(conf_key: str) -> str:
    """``spark.dstl.maxParallelism`` → ``max_parallelism``."""
    name = conf_key[len(PREFIX) :] if conf_key.startswith(PREFIX) else conf_key
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _coerce(text: str, hint: Any, key: str) -> Any:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if type(None) in args and text.strip().lower() in ("", "none", "null"):
        return None
    for t in args:
        if t is type(None):
            continue
        origin = typing.get_origin(t) or t
        try:
            if t is bool:
                low = text.strip().lower()
                if low not in ("true", "false"):
                    raise ValueError(f"not a boolean: {text!r}")
                return low == "true"
            if t in (int, float, str):
                return t(text)
            if origin in (Mapping, dict):
                doc = json.loads(text)
                if not isinstance(doc, dict):
                    raise ValueError("not a JSON object")
                return doc
        except ValueError as exc:
            raise ConfigError(f"{key}={text!r}: {exc}") from None
    raise ConfigError(f"{key} cannot be set in the Spark configuration")


def conf_options(session: Any) -> dict[str, Any]:
    """The ``spark.dstl.*`` options of ``session``'s configuration, typed as the fields."""
    try:
        conf: Mapping[str, str] = session.conf.getAll
    except AttributeError:  # older PySpark: the context's (static) configuration
        conf = dict(session.sparkContext.getConf().getAll())
    return options_of(conf)


def options_of(conf: Mapping[str, str]) -> dict[str, Any]:
    """The ``spark.dstl.*`` keys of ``conf`` as :class:`KeyedOptions` keywords."""
    hints = typing.get_type_hints(KeyedOptions)
    names = {f.name for f in dataclasses.fields(KeyedOptions)} - _NOT_FROM_CONF
    out: dict[str, Any] = {}
    for key, value in conf.items():
        if not key.startswith(PREFIX):
            continue
        name = option_name(key)
        if name not in names:
            log.warning("ignoring %s: no dstl option %r (options: %s)", key, name, sorted(names))
            continue
        out[name] = _coerce(str(value), hints[name], key)
    return out


def merged_options(
    session: Any, config: KeyedOptions | None, explicit: Mapping[str, Any]
) -> KeyedOptions:
    """``config`` with ``explicit`` keywords applied, ``spark.dstl.*`` keys filling the rest.

    A configuration key applies to an option given neither as a keyword nor,
    in ``config``, with a value other than its default. :class:`TypeError`
    names missing required options.
    """
    from_conf = conf_options(session)
    defaults = {f.name: f.default for f in dataclasses.fields(KeyedOptions)}
    fill = {}
    for name, value in from_conf.items():
        if name in explicit:
            continue
        if config is not None and getattr(config, name) != defaults.get(name):
            continue
        fill[name] = value
    given = {**fill, **explicit}
    if config is None:
        missing = sorted(
            f.name
            for f in dataclasses.fields(KeyedOptions)
            if f.default is dataclasses.MISSING and f.name not in given
        )
        if missing:
            raise TypeError(f"the query needs the options {missing}")
    return KeyedOptions.of(config, given)


def writer_query_options(
    api: str,
    session: Any,
    config: KeyedOptions | None,
    options: Mapping[str, Any],
    writer_options: Mapping[str, Any],
) -> KeyedOptions:
    """The options of a query started by a writer: the API call's ``options`` and the
    writer's (``checkpointLocation``...; the same key given both ways with two values is a
    ``ConfigError``), ``spark.dstl.*`` keys filling the rest (:func:`merged_options`)."""
    clash = sorted(k for k in writer_options if k in options and options[k] != writer_options[k])
    if clash:
        raise ConfigError(f"{clash} given to both {api} and the writer")
    try:
        return merged_options(session, config, {**options, **writer_options})
    except TypeError as exc:  # a required option is missing
        raise ConfigError(
            f"{exc}: give them to {api}, to the writer "
            "(checkpointLocation) or as spark.dstl.* configuration keys"
        ) from None
