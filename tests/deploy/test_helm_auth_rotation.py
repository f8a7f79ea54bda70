"""The chart's values for rotating the node secret (docs/deploy.md, "Rotating the node secret").

``auth.previousSecretKey`` names a second key of ``auth.existingSecret``; the
chart feeds it to dstl-server as ``DSTL_AUTH_PREVIOUS_SECRET`` (a Secret
reference, never the ConfigMap, never an executor), and
``auth.previousSecretUntil`` as ``DSTL_AUTH_PREVIOUS_SECRET_UNTIL`` in the
ConfigMap, whose checksum rolls the pods. Half a rotation fails to render.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from dstl_client.core.errors import ConfigError
from tests.deploy._helpers import (
    NODE_SECRET,
    RELEASE,
    ROTATION,
    TLS_TCP_ONLY,
    by_name,
    container,
    executor_pod,
    only,
    render,
    settings_from,
)


def test_the_previous_secret_reaches_dstl_server_only(chart: helm.Chart) -> None:
    docs = render(chart, ROTATION)
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")["data"]
    assert cm["DSTL_AUTH_PREVIOUS_SECRET_UNTIL"] == "2030-01-31T12:00:00Z"
    assert "DSTL_AUTH_PREVIOUS_SECRET" not in cm
    server = container(only(docs, "DaemonSet", RELEASE)["spec"]["template"]["spec"], "dstl")
    env = by_name(server["env"])
    ref = {"secretKeyRef": {"name": "dstl-node-secret", "key": "previous"}}
    assert env["DSTL_AUTH_PREVIOUS_SECRET"]["valueFrom"] == ref
    assert env["DSTL_AUTH_SECRET"]["valueFrom"]["secretKeyRef"]["key"] == "secret"
    executor = container(executor_pod(docs)["spec"], "spark-kubernetes-executor")
    secrets = {"DSTL_AUTH_SECRET", "DSTL_AUTH_PREVIOUS_SECRET"}
    assert not secrets & {v["name"] for v in executor.get("env", [])}
    # what dstl-server makes of it: the rotation, with its deadline
    settings = settings_from(
        {"data": cm}, DSTL_AUTH_SECRET=NODE_SECRET, DSTL_AUTH_PREVIOUS_SECRET=NODE_SECRET[::-1]
    )
    assert settings.auth_previous_deadline is not None
    # without the previous secret, dstl-server refuses the deadline alone
    with pytest.raises(ConfigError, match="needs a previous secret"):
        settings_from({"data": cm}, DSTL_AUTH_SECRET=NODE_SECRET)


def test_starting_and_ending_a_rotation_rolls_the_pods(chart: helm.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        ds = only(render(chart, values), "DaemonSet", RELEASE)
        return str(ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum(ROTATION) != checksum(TLS_TCP_ONLY)


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"existingSecret": "s", "previousSecretKey": "previous"}, "go together"),
        ({"existingSecret": "s", "previousSecretUntil": "2030-01-31T12:00:00Z"}, "go together"),
        (
            {
                "secret": NODE_SECRET,
                "previousSecretKey": "previous",
                "previousSecretUntil": "2030-01-31T12:00:00Z",
            },
            "names a key of auth.existingSecret",
        ),
        (
            {
                "existingSecret": "s",
                "previousSecretKey": "secret",
                "previousSecretUntil": "2030-01-31T12:00:00Z",
            },
            "auth.previousSecretKey secret is auth.secretKey",
        ),
    ],
)
def test_half_a_rotation_fails_to_render(
    chart: helm.Chart, auth: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(chart, {**TLS_TCP_ONLY, "auth": auth})


@pytest.mark.parametrize("until", ["tomorrow", "2030-01-31", "2030-01-31T12:00:00"])
def test_the_schema_wants_a_time_with_its_offset(chart: helm.Chart, until: str) -> None:
    values = {**TLS_TCP_ONLY, "auth": {"existingSecret": "s", "previousSecretUntil": until}}
    with pytest.raises(helm.HelmValuesError, match="previousSecretUntil"):
        chart.validate_schema(values)
