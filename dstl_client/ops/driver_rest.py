"""``dstl config``'s client of the driver's checkpoint-configuration REST endpoint.

The CLI accepts what ``PATCH /jobs/{job}/checkpoints/configuration`` accepts
(:data:`~dstl_client.coordinator.overrides.FIELDS`: ``checkpointInterval``,
``checkpointTimeout``, ``materializationInterval``, or their kebab-case
spellings), each a duration with a unit (``500ms``, ``5s``, ``10min``, ``2h``)
or a plain number of milliseconds, converted exactly to whole milliseconds.
The endpoint alone judges the range (it refuses with 400 and says why), so the
CLI and ``curl`` can never disagree about a value.

Errors map to the CLI's two exit codes, each one line: an answer that says the
command is wrong (400 a value, 401 the token, 404 the job or the URL, 405, 413)
is a :class:`RestRefused` (exit 2); one that says the driver could not do it now
(409 another update in progress, 503 not persisted, a timeout, no connection)
is a :class:`RestFailed` (exit 1). The token, when there is one, travels as
``Authorization: Bearer ...`` and is never printed.

One command's thread; no state between calls.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from dstl_client.coordinator.overrides import FIELDS
from dstl_client.core.durations import parse_duration
from dstl_client.core.errors import ConfigError, DstlError, InvalidArgument
from dstl_client.ops.tokens import CONFIG_TOKEN_ENV

#: ``NAME=VALUE`` names the CLI accepts -> the REST field
FIELD_NAMES: dict[str, str] = {
    **{f: f for f in FIELDS},
    **{re.sub(r"(?<!^)(?=[A-Z])", "-", f).lower(): f for f in FIELDS},
}
#: the units a setting may be written in (its values are at most 7 days)
UNITS = ("ms", "s", "m", "min", "h")
#: the longest error message taken from an answer (one line on the terminal)
_MAX_REASON = 300
#: the most bytes of an answer read (the endpoint's answers are well under 1 KiB)
_MAX_ANSWER = 64 * 1024
#: HTTP statuses that say the command is wrong (exit 2); any other failure is exit 1
_REFUSALS = {400, 401, 403, 404, 405, 413}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The endpoint never redirects: a redirect is an error, and the token stays here."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class RestRefused(ConfigError):
    """The endpoint refused the request as given (exit code 2)."""


class RestFailed(DstlError):
    """The endpoint could not be reached or could not do it now (exit code 1)."""

    kind = "ops_failed"


def millis(name: str, text: str) -> int:
    """``text`` (``500ms``, ``5s``, ``1.5s``, ``10min``, ``2h``, ``60000``) in whole ms."""
    try:
        value = parse_duration(text, bare_unit="ms", units=UNITS, what=name).ms
    except InvalidArgument:
        raise ConfigError(
            f"{name}={text!r}: a duration, e.g. 60000 (ms), 500ms, 5s, 10min, 2h"
        ) from None
    if value != value.to_integral_value():
        raise ConfigError(f"{name}={text!r}: is {value} ms; give whole milliseconds")
    return int(value)


def parse_settings(items: list[str]) -> dict[str, int]:
    """The PATCH body of ``NAME=VALUE`` items (a name given twice: the last wins)."""
    body: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        field = FIELD_NAMES.get(name.strip())
        if not sep or field is None:
            raise ConfigError(
                f"{item!r}: give NAME=VALUE with NAME one of {', '.join(FIELDS)}, "
                "e.g. checkpointInterval=10s"
            )
        body[field] = millis(name.strip(), value)
    return body


@dataclass(frozen=True, slots=True)
class DriverEndpoint:
    """The driver's REST endpoint for one job: where, with which token, how long to wait."""

    base_url: str
    job_id: str
    token: str | None
    timeout_s: float
    #: the variable the token may come from (named in a 401's hint)
    token_env: str = CONFIG_TOKEN_ENV

    @property
    def url(self) -> str:
        job = urllib.parse.quote(self.job_id, safe="")
        return f"{self.base_url.rstrip('/')}/jobs/{job}/checkpoints/configuration"

    def get(self) -> dict[str, Any]:
        """The values in force and their sources."""
        return self._call("GET", None)

    def patch(self, body: dict[str, int]) -> dict[str, Any]:
        """Change the given fields; the values in force after the change."""
        return self._call("PATCH", body)

    def _hint(self, status: int) -> str:
        if status == 401:
            given = "the one given was refused" if self.token else "none was given"
            return (
                f"{given}: the endpoint's config_token goes in ${self.token_env} or a file "
                "named by --config-token-file"
            )
        if status == 404:
            return "check --job-id (the query's job_id) and --rest-url (its config_port)"
        if status == 409:
            return "try again"
        return ""

    def _call(self, method: str, body: dict[str, int] | None) -> dict[str, Any]:
        url = self.url
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--rest-url {self.base_url!r}: give http://HOST:PORT")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        where = f"{method} {url}"
        try:
            with _OPENER.open(req, timeout=self.timeout_s) as resp:
                raw = resp.read(_MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            with exc:  # an error answer holds the connection until closed
                reason = _reason(exc.read(_MAX_ANSWER + 1)) or str(exc.reason or "")
            message = f"{where}: HTTP {exc.code}" + (f": {reason}" if reason else "")
            hint = self._hint(exc.code)
            if hint:
                message += f" ({hint})"
            if exc.code in _REFUSALS:
                raise RestRefused(message) from None
            raise RestFailed(message) from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", None) or exc
            raise RestFailed(f"{where}: {_one_line(str(why))}") from None
        try:
            doc = json.loads(raw) if len(raw) <= _MAX_ANSWER else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise RestFailed(f"{where}: the answer is not a JSON object (is it the driver?)")
        return doc


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


def _reason(raw: bytes) -> str:
    """The ``error`` of a JSON answer, on one bounded line ("" when there is none)."""
    if len(raw) > _MAX_ANSWER:
        return ""
    try:
        doc = json.loads(raw)
    except ValueError:
        return ""
    error = doc.get("error") if isinstance(doc, dict) else None
    return _one_line(error) if isinstance(error, str) else ""
