"""What the fault proxy does to requests: :class:`FaultConfig` and its :class:`LatencySpec`.

Both are frozen and validated on construction (a bad value raises
:class:`FaultConfigError`), so a configuration in force is always a valid one
and may be read from any thread or task.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

_DISTS = ("fixed", "uniform", "lognormal", "pareto")
_PHASES = ("request", "response")


class FaultConfigError(ValueError):
    """A fault configuration that does not validate."""


def _rate(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise FaultConfigError(f"{name} must be a number, got {value!r}") from None
    if not 0.0 <= v <= 1.0:
        raise FaultConfigError(f"{name} must be between 0 and 1, got {v}")
    return v


def _nonneg(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise FaultConfigError(f"{name} must be a number, got {value!r}") from None
    if v < 0 or not math.isfinite(v):
        raise FaultConfigError(f"{name} must be >= 0, got {v}")
    return v


@dataclass(frozen=True, slots=True)
class LatencySpec:
    """Extra latency for a fraction ``rate`` of requests.

    ``dist``: ``fixed`` (``ms``), ``uniform`` (``min_ms``..``max_ms``),
    ``lognormal`` (``median_ms``, ``sigma``) or ``pareto`` (scale ``min_ms``,
    shape ``alpha``). For ``lognormal`` and ``pareto`` a ``max_ms`` > 0 caps
    the draw.

    Frozen and validated when built; :meth:`draw_ms` uses the caller's ``rng``
    (the proxy's, on its event loop), so the spec itself is safe anywhere.
    """

    rate: float = 0.0
    dist: str = "fixed"
    ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    median_ms: float = 0.0
    sigma: float = 1.0
    alpha: float = 1.5

    def __post_init__(self) -> None:
        _rate("latency.rate", self.rate)
        if self.dist not in _DISTS:
            raise FaultConfigError(f"latency.dist must be one of {_DISTS}, got {self.dist!r}")
        for name in ("ms", "min_ms", "max_ms", "median_ms", "sigma", "alpha"):
            _nonneg(f"latency.{name}", getattr(self, name))
        if self.dist == "uniform" and self.max_ms < self.min_ms:
            raise FaultConfigError("latency.max_ms must be >= latency.min_ms for uniform")
        if self.dist == "pareto" and (self.alpha <= 0 or self.min_ms <= 0):
            raise FaultConfigError("pareto latency needs alpha > 0 and min_ms > 0")

    def draw_ms(self, rng: random.Random) -> float:
        """One latency sample in milliseconds."""
        if self.dist == "fixed":
            return self.ms
        if self.dist == "uniform":
            return rng.uniform(self.min_ms, self.max_ms)
        if self.dist == "lognormal":
            v = self.median_ms * math.exp(rng.gauss(0.0, self.sigma))
        else:
            v = self.min_ms * rng.paretovariate(self.alpha)
        return min(v, self.max_ms) if self.max_ms > 0 else v


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """What the proxy does to requests (every rate is a probability in 0..1).

    Each request that ``methods`` selects (all when empty) draws once:
    ``reset_rate``, then ``error_503_rate``, then ``error_500_rate`` decide a
    failure (these three are exclusive; their sum must be <= 1); independently
    ``latency.rate`` adds a delay (also before a failure answer).
    ``latency_phase``/``reset_phase``: ``request`` acts before forwarding,
    ``response`` after the upstream answered.

    Frozen and validated when built: the proxy swaps the whole configuration
    (never mutates it), so a request sees one consistent configuration.
    """

    latency: LatencySpec = field(default_factory=LatencySpec)
    error_503_rate: float = 0.0
    error_500_rate: float = 0.0
    reset_rate: float = 0.0
    methods: tuple[str, ...] = ()
    latency_phase: str = "request"
    reset_phase: str = "request"

    def __post_init__(self) -> None:
        total = 0.0
        for name in ("error_503_rate", "error_500_rate", "reset_rate"):
            total += _rate(name, getattr(self, name))
        if total > 1.0 + 1e-9:
            raise FaultConfigError(f"error_503_rate + error_500_rate + reset_rate = {total} > 1")
        for name in ("latency_phase", "reset_phase"):
            if getattr(self, name) not in _PHASES:
                raise FaultConfigError(f"{name} must be one of {_PHASES}")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FaultConfig:
        """Build from JSON-like data; unknown keys are an error (typos must not pass)."""
        if not isinstance(raw, Mapping):
            raise FaultConfigError("the fault configuration must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise FaultConfigError(f"unknown fault settings: {sorted(unknown)}")
        values = dict(raw)
        lat = values.pop("latency", None) or {}
        if not isinstance(lat, Mapping):
            raise FaultConfigError("latency must be an object")
        lat_known = {f.name for f in fields(LatencySpec)}
        if set(lat) - lat_known:
            raise FaultConfigError(f"unknown latency settings: {sorted(set(lat) - lat_known)}")
        methods = values.pop("methods", ()) or ()
        if isinstance(methods, str) or not all(isinstance(m, str) for m in methods):
            raise FaultConfigError("methods must be a list of HTTP method names")
        try:
            return cls(
                latency=LatencySpec(**lat),
                methods=tuple(m.upper() for m in methods),
                **values,
            )
        except TypeError as exc:
            raise FaultConfigError(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["methods"] = list(self.methods)
        return d

    def applies_to(self, method: str) -> bool:
        return not self.methods or method.upper() in self.methods
