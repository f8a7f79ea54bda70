"""The Helm chart in deploy/helm/dstl, checked offline.

Rendering, linting and values-schema checks go through the Helm SDK itself
(helm-python-sdk, a ctypes binding of Helm v4); every rendered manifest is then
validated against the Kubernetes OpenAPI schemas shipped by kubernetes-validate
(strict: unknown fields fail), for the chart's oldest supported Kubernetes and
the newest one the package knows. The settings the chart hands to dstl-server
are checked against ``ServerSettings`` itself, and the exec health probe is run
against a real dstl-server process. The node secret (``DSTL_AUTH_SECRET``) goes
to dstl-server only; executors get a job's own token from a Secret of the job.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from dstl_client.client import ChangelogClient
from dstl_client.core.errors import ConfigError, Unauthenticated
from dstl_server.auth import Authenticator
from dstl_server.cli import build_parser
from dstl_server.memory_rule import memory_needed, memory_shortfall
from dstl_server.settings import ServerSettings, env_name
from dstl_server.testing import ServerProcess
from tests.deploy._helpers import (
    CHART,
    CONFIGS,
    DEFAULTS,
    K8S_VERSIONS,
    NAMESPACE,
    NODE_SECRET,
    RELEASE,
    ROOT,
    S3_TCP_AUTH,
    SETTING_ENV,
    SIDECAR,
    SIDECAR_IMAGE,
    TLS_TCP_ONLY,
    TREE,
    Manifest,
    MiB,
    by_name,
    container,
    executor_pod,
    kinds,
    only,
    render,
    secret_names,
    settings_from,
)


# ------------------------------------------------------------------------ tests
def test_chart_lints_clean_in_strict_mode() -> None:
    for values in CONFIGS.values():
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
        assert report["errors"] == []
        # severity 1 is "info" (e.g. "icon is recommended"); warnings fail strict mode
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_a_broken_template(tmp_path: Path) -> None:
    """The lint check above can fail: a chart with a template error does."""
    broken = tmp_path / "dstl"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("{{ .Values.image.repository | nope }}\n")
    report = helm.lint(broken, strict=True)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"])


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("k8s", K8S_VERSIONS)
def test_every_manifest_is_valid_kubernetes(chart: helm.Chart, config: str, k8s: str) -> None:
    docs = render(chart, CONFIGS[config])
    assert docs
    if CONFIGS[config].get("executorPodTemplate", {"enabled": True})["enabled"]:
        docs.append(executor_pod(docs))  # a Pod spec Spark reads: valid on its own too
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD; its shape is asserted in test_s3_tcp_token_daemonset
        try:
            kubernetes_validate.validate(doc, k8s, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata'].get('name')}: {exc.message}")


def test_default_daemonset(chart: helm.Chart) -> None:
    docs = render(chart, {})
    assert kinds(docs) == {"DaemonSet", "ConfigMap", "Service", "ServiceAccount"}
    ds = only(docs, "DaemonSet", RELEASE)
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")
    pod = ds["spec"]["template"]
    spec = pod["spec"]
    server = container(spec, "dstl")
    sock = "/var/run/dstl/dstl.sock"

    assert server["image"] == f"{SIDECAR_IMAGE}:0.1.0"  # appVersion when image.tag is empty
    assert server["command"] == ["dstl-server"] and "args" not in server
    assert server["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    assert cm["data"]["DSTL_UNIX_SOCKET"] == sock
    assert cm["data"]["DSTL_LISTEN"] == ""  # Unix socket only
    assert cm["data"]["DSTL_METRICS_HOST"] == "0.0.0.0"
    assert cm["data"]["DSTL_METRICS_PUBLIC"] == "true"  # dstl-server refuses 0.0.0.0 without
    assert cm["data"]["DSTL_STORAGE"] == "file:///var/lib/dstl/objects"

    # the socket directory is the node's, at the same path as in the executors
    mounts = by_name(server["volumeMounts"])
    volumes = by_name(spec["volumes"])
    assert mounts["dstl-socket"]["mountPath"] == "/var/run/dstl"
    assert volumes["dstl-socket"]["hostPath"] == {
        "path": "/var/run/dstl",
        "type": "DirectoryOrCreate",
    }
    assert mounts["dstl-objects"]["mountPath"] == "/var/lib/dstl/objects"
    assert volumes["dstl-objects"]["hostPath"]["path"] == "/var/lib/dstl/objects"
    assert mounts["dstl-tmp"]["mountPath"] == "/tmp"  # the root filesystem is read-only

    # Unix socket only: kubelet gRPC probes cannot reach it, exec probes can
    for probe_key, service in (
        ("startupProbe", ""),
        ("readinessProbe", "dstl.v1.Changelog"),
        ("livenessProbe", ""),
    ):
        command = server[probe_key]["exec"]["command"]
        assert command == [
            "dstl-server",
            "health",
            "--address",
            f"unix://{sock}",
            "--service",
            service,
            "--timeout",
            "4",
        ]
    assert server["readinessProbe"]["timeoutSeconds"] == 5

    # non-root, read-only, no capabilities; the socket's group is the executors'
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001
    sc = server["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["runAsGroup"] == 185
    init = container(spec, "host-dirs", init=True)
    assert init["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["CHOWN", "FOWNER"],
    }
    assert "chown 10001:185 /var/run/dstl && chmod 0750 /var/run/dstl" in init["command"][2]

    # SIGTERM is the clean stop: the kill waits longer than the server's own grace
    assert spec["terminationGracePeriodSeconds"] > DEFAULTS["shutdown_grace_s"]
    assert server["resources"]["limits"]["memory"] == "512Mi"
    assert "cpu" not in server["resources"]["limits"]

    ports = by_name(server["ports"])
    assert set(ports) == {"metrics"} and ports["metrics"]["containerPort"] == 9464
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9464"
    assert len(annotations["checksum/config"]) == 64

    svc = only(docs, "Service", RELEASE)
    assert svc["spec"]["clusterIP"] == "None"
    assert [p["name"] for p in svc["spec"]["ports"]] == ["metrics"]
    assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    assert spec["serviceAccountName"] == only(docs, "ServiceAccount")["metadata"]["name"]

    # the executors mount the same directory read-only and find the socket by env
    executor = executor_pod(docs)
    exec_c = container(executor["spec"], "spark-kubernetes-executor")
    assert by_name(exec_c["env"])["DSTL_ADDRESS"]["value"] == f"unix://{sock}"
    assert "DSTL_TOKEN" not in by_name(exec_c["env"])  # auth is off
    assert "env" not in server and "Secret" not in kinds(docs)
    assert by_name(exec_c["volumeMounts"])["dstl-socket"]["readOnly"] is True
    assert by_name(executor["spec"]["volumes"])["dstl-socket"]["hostPath"]["path"] == (
        "/var/run/dstl"
    )
    assert executor["spec"]["securityContext"]["supplementalGroups"] == [185]

    # their keyed state: a node directory the DaemonSet hands to Spark's user 185
    state = "/var/lib/dstl/state"
    assert by_name(exec_c["env"])["DSTL_STATE_DIR"]["value"] == state
    assert by_name(exec_c["volumeMounts"])["dstl-state"] == {
        "name": "dstl-state",
        "mountPath": state,
    }
    assert by_name(executor["spec"]["volumes"])["dstl-state"]["hostPath"] == {
        "path": state,
        "type": "Directory",
    }
    assert f"chown 185:185 {state} && chmod 0700 {state}" in init["command"][2]
    assert by_name(init["volumeMounts"])["dstl-executor-state"]["mountPath"] == state
    assert volumes["dstl-executor-state"]["hostPath"] == {
        "path": state,
        "type": "DirectoryOrCreate",
    }
    assert "dstl-executor-state" not in by_name(server["volumeMounts"])  # not the server's


def test_s3_tcp_auth_daemonset(chart: helm.Chart) -> None:
    docs = render(chart, S3_TCP_AUTH)
    ds = only(docs, "DaemonSet", RELEASE)
    spec = ds["spec"]["template"]["spec"]
    server = container(spec, "dstl")
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")["data"]

    assert server["image"] == "registry.example.com/dstl-server:1.2.3"
    assert server["args"] == ["--persist-delay-ms", "5"]
    assert server["envFrom"] == [
        {"configMapRef": {"name": f"{RELEASE}-config"}},
        {"secretRef": {"name": "dstl-s3-credentials"}},
    ]
    env = by_name(server["env"])
    assert env["DSTL_AUTH_SECRET"]["valueFrom"] == {
        "secretKeyRef": {"name": "dstl-node-secret", "key": "node-secret"}
    }
    assert env["AWS_MAX_ATTEMPTS"]["value"] == "2"
    assert "Secret" not in kinds(docs)  # an existing Secret is referenced, not made

    assert cm["DSTL_LISTEN"] == "0.0.0.0:7070"
    assert cm["DSTL_STORAGE"] == "s3://dstl-changelog/prod"
    assert cm["DSTL_S3_ENDPOINT_URL"] == "https://s3.example.internal:8443"
    assert cm["DSTL_S3_REGION"] == "eu-west-1"
    assert cm["DSTL_MAX_IN_FLIGHT_BYTES"] == "268435456"  # not 2.68435456e+08
    assert cm["DSTL_LOG_LEVEL"] == "INFO"
    mounts = by_name(server["volumeMounts"])
    assert cm["DSTL_S3_CA_BUNDLE"] == mounts["dstl-s3-ca"]["mountPath"] + "/ca.pem"
    assert by_name(spec["volumes"])["dstl-s3-ca"]["configMap"]["name"] == "s3-ca"
    assert "dstl-objects" not in mounts  # s3:// needs no local directory

    assert cm["DSTL_TLS_CERT"] == mounts["dstl-tls"]["mountPath"] + "/tls.crt"
    assert "DSTL_AUTH_SECRET" not in cm  # from the Secret, never the ConfigMap

    # TCP on the pod IP has TLS, which kubelet's gRPC probes cannot speak: exec
    # probes over the Unix socket (on here), which need no token either
    for probe_key, service in (
        ("startupProbe", ""),
        ("readinessProbe", "dstl.v1.Changelog"),
        ("livenessProbe", ""),
    ):
        assert "grpc" not in server[probe_key]
        assert server[probe_key]["exec"]["command"][2:6] == [
            "--address",
            "unix:///var/run/dstl/dstl.sock",
            "--service",
            service,
        ]
    ports = by_name(server["ports"])
    assert ports["grpc"] == {
        "name": "grpc",
        "containerPort": 7070,
        "hostPort": 7070,
        "protocol": "TCP",
    }
    assert server["resources"]["limits"]["memory"] == "1Gi"

    svc = only(docs, "Service", RELEASE)
    assert svc["spec"]["clusterIP"] == "None"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 7070, "metrics": 9464}
    monitor = only(docs, "ServiceMonitor", RELEASE)
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    sa = only(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam")

    # executors: still the Unix socket (it is on), plus their job's own token
    exec_env = by_name(container(executor_pod(docs)["spec"], "spark-kubernetes-executor")["env"])
    assert exec_env["DSTL_ADDRESS"]["value"] == "unix:///var/run/dstl/dstl.sock"
    assert exec_env["DSTL_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "job1-dstl-token",
        "key": "bearer",
    }


def test_tls_tcp_only_uses_a_tcp_probe_and_the_node_ip(chart: helm.Chart) -> None:
    docs = render(chart, TLS_TCP_ONLY)
    spec = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    server = container(spec, "dstl")
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")["data"]
    # kubelet gRPC probes speak no TLS: only a connect check is possible
    assert server["readinessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert cm["DSTL_TLS_CERT"] == "/etc/dstl/tls/tls.crt"
    assert cm["DSTL_UNIX_SOCKET"] == ""
    assert by_name(spec["volumes"])["dstl-tls"]["secret"]["secretName"] == "dstl-tls"
    assert "initContainers" not in spec  # no hostPath directory to prepare
    executor = executor_pod(docs)
    env = by_name(container(executor["spec"], "spark-kubernetes-executor")["env"])
    assert env["DSTL_NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["DSTL_ADDRESS"]["value"] == "$(DSTL_NODE_IP):7070"
    # TCP only is for executor namespaces without hostPath: their state is the pod's own
    assert env["DSTL_STATE_DIR"]["value"] == "/var/lib/dstl/state"
    assert executor["spec"]["volumes"] == [{"name": "dstl-state", "emptyDir": {}}]


def test_sidecar_mode_executor_pod_template(chart: helm.Chart) -> None:
    docs = render(chart, SIDECAR)
    assert "DaemonSet" not in kinds(docs) and "Service" not in kinds(docs)
    secret = only(docs, "Secret", f"{RELEASE}-auth")
    assert base64.b64decode(secret["data"]["secret"]).decode() == NODE_SECRET

    pod = executor_pod(docs)
    spec = pod["spec"]
    sidecar = container(spec, "dstl", init=True)
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: up before the executor
    assert "exec" in sidecar["readinessProbe"]
    assert sidecar["envFrom"][0]["configMapRef"]["name"] == f"{RELEASE}-config"
    node_ref = {"secretKeyRef": {"name": f"{RELEASE}-auth", "key": "secret"}}
    assert by_name(sidecar["env"])["DSTL_AUTH_SECRET"]["valueFrom"] == node_ref
    # the executor's pod securityContext is not the chart's: the container pins its own
    sc = sidecar["securityContext"]
    assert (sc["runAsNonRoot"], sc["runAsUser"], sc["runAsGroup"]) == (True, 10001, 185)
    assert sc["readOnlyRootFilesystem"] is True

    executor = container(spec, "spark-kubernetes-executor")
    env = by_name(executor["env"])
    assert env["DSTL_ADDRESS"]["value"] == "unix:///var/run/dstl/dstl.sock"
    job_ref = {"secretKeyRef": {"name": "job1-dstl-token", "key": "token"}}
    assert env["DSTL_TOKEN"]["valueFrom"] == job_ref
    assert "DSTL_AUTH_SECRET" not in env
    volumes = by_name(spec["volumes"])
    assert "emptyDir" in volumes["dstl-socket"] and "hostPath" not in volumes["dstl-socket"]
    assert by_name(sidecar["volumeMounts"])["dstl-socket"]["mountPath"] == "/var/run/dstl"
    assert by_name(executor["volumeMounts"])["dstl-socket"]["mountPath"] == "/var/run/dstl"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9464"
    # no node directory in this mode: the keyed state is the executor pod's own
    assert env["DSTL_STATE_DIR"]["value"] == "/var/lib/dstl/state"
    assert volumes["dstl-state"] == {"name": "dstl-state", "emptyDir": {}}
    assert "hostPath" not in str(spec)

    # sidecar.native=false: an ordinary second container instead
    plain = executor_pod(render(chart, {**SIDECAR, "sidecar": {"native": False}}))["spec"]
    assert "initContainers" not in plain
    assert "restartPolicy" not in container(plain, "dstl")


@pytest.mark.parametrize("config", CONFIGS)
def test_config_map_holds_real_settings_the_server_accepts(chart: helm.Chart, config: str) -> None:
    docs = render(chart, CONFIGS[config])
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")
    unknown = sorted(set(cm["data"]) - set(SETTING_ENV))
    assert unknown == [], f"not dstl-server settings: {unknown}"
    # variables fed from Secrets to dstl-server (DaemonSet or executor sidecar) too
    servers = [c for doc in docs for c in _containers(doc)]
    if CONFIGS[config].get("executorPodTemplate", {"enabled": True})["enabled"]:
        servers += [c for c in _containers(executor_pod(docs)) if c["name"] == "dstl"]
    assert servers
    for c in servers:
        for var in c.get("env", []):
            if var["name"].startswith("DSTL_"):
                assert var["name"] in SETTING_ENV, var["name"]
    secrets = {"DSTL_AUTH_SECRET": NODE_SECRET} if "auth" in CONFIGS[config] else {}
    if CONFIGS[config].get("auth", {}).get("previousSecretKey"):
        secrets["DSTL_AUTH_PREVIOUS_SECRET"] = NODE_SECRET[::-1]
    settings = settings_from(cm, **secrets)  # raises ConfigError when dstl-server would
    assert settings.storage == CONFIGS[config].get("storage", {}).get(
        "url", "file:///var/lib/dstl/objects"
    )
    # metrics bind 0.0.0.0 in the pod, which dstl-server allows only when told to
    assert (settings.metrics_host, settings.metrics_public) == ("0.0.0.0", True)
    assert "DSTL_AUTH_SECRET" not in cm["data"]


def _containers(doc: Manifest) -> list[Manifest]:
    """The containers of a Pod or of a workload's pod template."""
    spec = doc.get("spec", {})
    spec = spec.get("template", {}).get("spec", {}) if doc["kind"] != "Pod" else spec
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def test_values_config_keys_are_the_server_flags_with_its_defaults(chart: helm.Chart) -> None:
    """One values key per setting, named after its flag, defaulting to its default."""
    config = chart.values["config"]
    schema = chart.schema
    assert schema is not None
    schema_keys = set(schema["properties"]["config"]["properties"])
    assert set(config) == schema_keys
    data = only(render(chart, {}), "ConfigMap", f"{RELEASE}-config")["data"]
    for key, value in config.items():
        flag = "".join("-" + ch.lower() if ch.isupper() else ch for ch in key)
        name = flag.replace("-", "_")
        assert name in DEFAULTS, f"config.{key}: no setting {name} (flag --{flag})"
        assert value == DEFAULTS[name], f"config.{key}={value!r}, server default {DEFAULTS[name]!r}"
        env = env_name(name)
        assert env in data, f"config.{key} is not rendered as {env}"
    settings = settings_from(only(render(chart, {}), "ConfigMap", f"{RELEASE}-config"))
    assert settings.max_in_flight_bytes == DEFAULTS["max_in_flight_bytes"]


def test_null_leaves_a_setting_to_the_server(chart: helm.Chart) -> None:
    cm = only(render(chart, {"config": {"hedgeMode": None}}), "ConfigMap", f"{RELEASE}-config")
    assert "DSTL_HEDGE_MODE" not in cm["data"]
    assert "DSTL_HEDGE_QUANTILE" in cm["data"]


NODE_AUTH: dict[str, Any] = {"existingSecret": "dstl-node-secret"}
TLS: dict[str, Any] = {"existingSecret": "dstl-tls"}


@pytest.mark.parametrize(
    ("values", "missing"),
    [
        ({}, "tls.existingSecret, auth.existingSecret (or auth.secret)"),
        ({"auth": NODE_AUTH}, "tls.existingSecret"),
        ({"auth": {"secret": NODE_SECRET}}, "tls.existingSecret"),
        ({"tls": TLS}, "auth.existingSecret (or auth.secret)"),
    ],
)
def test_non_loopback_tcp_without_tls_and_auth_fails_to_render(
    chart: helm.Chart, values: dict[str, Any], missing: str
) -> None:
    with pytest.raises(helm.HelmRenderError) as failure:
        render(chart, {"tcp": {"enabled": True}, **values})
    message = str(failure.value)
    assert "tcp.bindAddress 0.0.0.0 is not loopback, so TCP needs both TLS and auth" in message
    assert "tls.existingSecret and auth.existingSecret (or auth.secret)" in message
    assert message.rstrip().endswith(f"missing: {missing}")
    # the same rule as dstl-server's own: one of the two is not enough
    with pytest.raises(ConfigError, match="needs TLS"):
        ServerSettings(
            listen="0.0.0.0:7070",
            auth_secret=NODE_SECRET if "auth" in values else "",
            tls_cert="/c" if "tls" in values else "",
            tls_key="/k" if "tls" in values else "",
        )


def test_loopback_tcp_or_tls_and_auth_render(chart: helm.Chart) -> None:
    """Loopback needs nothing, like dstl-server itself; other addresses TLS and auth."""
    for ok in (
        {"tcp": {"enabled": True, "bindAddress": "127.0.0.1"}},
        {"tcp": {"enabled": True}, "auth": NODE_AUTH, "tls": TLS},
        {"tcp": {"enabled": True}, "auth": {"secret": NODE_SECRET}, "tls": TLS},
    ):
        docs = render(chart, ok)
        assert "DaemonSet" in kinds(docs)
        secrets = {"DSTL_AUTH_SECRET": NODE_SECRET} if "auth" in ok else {}
        settings_from(only(docs, "ConfigMap", f"{RELEASE}-config"), **secrets)


@pytest.mark.parametrize(
    ("values", "listen", "probe"),
    [
        # IPv6 literal: bracketed; TLS on the pod IP: exec over the Unix socket
        (
            {"tcp": {"bindAddress": "::"}, "auth": NODE_AUTH, "tls": TLS},
            "[::]:7070",
            "unix:///var/run/dstl/dstl.sock",
        ),
        # loopback only, no socket: exec over loopback TCP (out of kubelet's reach)
        (
            {
                "tcp": {"bindAddress": "127.0.0.1", "port": 7171},
                "unixSocket": {"enabled": False},
                "executorPodTemplate": {"enabled": False},
            },
            "127.0.0.1:7171",
            "127.0.0.1:7171",
        ),
        # TLS and no socket: only a TCP connect check is possible
        (
            {
                "tcp": {"hostPort": True},
                "unixSocket": {"enabled": False},
                "auth": NODE_AUTH,
                "tls": TLS,
            },
            "0.0.0.0:7070",
            "tcpSocket",
        ),
    ],
)
def test_listen_address_and_probe_follow_the_tcp_values(
    chart: helm.Chart, values: dict[str, Any], listen: str, probe: str
) -> None:
    docs = render(chart, {**values, "tcp": {"enabled": True, **values["tcp"]}})
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")
    assert cm["data"]["DSTL_LISTEN"] == listen
    secrets = {"DSTL_AUTH_SECRET": NODE_SECRET} if "auth" in values else {}
    assert settings_from(cm, **secrets).listen == listen
    server = container(only(docs, "DaemonSet")["spec"]["template"]["spec"], "dstl")
    readiness = server["readinessProbe"]
    assert "grpc" not in readiness  # kubelet gRPC probes: no TLS, no socket
    if probe == "tcpSocket":
        assert readiness["tcpSocket"] == {"port": "grpc"}
    else:
        assert readiness["exec"]["command"][3] == probe


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"unixSocket": {"enabled": False}}, "nothing to listen on"),
        ({"terminationGracePeriodSeconds": 30}, "must exceed config.shutdownGraceS"),
        (
            {**SIDECAR, "tcp": {"enabled": True, "hostPort": True}, "tls": TLS},
            "tcp.hostPort is for mode daemonset only",
        ),
        ({"mode": "sidecar"}, "file:// objects in the executor pod's emptyDir"),
        (
            {
                "unixSocket": {"enabled": False},
                "tcp": {"enabled": True},
                "auth": NODE_AUTH,
                "tls": TLS,
            },
            "executors reach the DaemonSet over unixSocket or tcp.hostPort",
        ),
        (
            {"auth": {**NODE_AUTH, "secret": NODE_SECRET}},
            "give the node secret once: auth.existingSecret or auth.secret, not both",
        ),
        (
            {"auth": {**NODE_AUTH, "jobTokenSecret": {"name": "dstl-node-secret"}}},
            "auth.jobTokenSecret.name dstl-node-secret is the node secret's Secret",
        ),
        (
            {"auth": {"secret": NODE_SECRET, "jobTokenSecret": {"name": f"{RELEASE}-auth"}}},
            f"auth.jobTokenSecret.name {RELEASE}-auth is the node secret's Secret",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(chart, values)


@pytest.mark.parametrize(
    ("secret", "ok"),
    [
        (NODE_SECRET, True),
        ("0123456789abcdef0123456789abcdef", True),  # `openssl rand -hex 16`: 32, 16 distinct
        (NODE_SECRET[:31], False),
        (f"  {NODE_SECRET[:31]}\n", False),  # dstl-server strips whitespace, so does the chart
        ("ab" * 20, False),  # long but 2 distinct characters
        ("0123456789a" * 3, False),  # 33 characters, 11 distinct
        ("s3cr3t-token", False),
    ],
)
def test_auth_secret_strength_is_checked_like_dstl_server(
    chart: helm.Chart, secret: str, ok: bool
) -> None:
    values = {"auth": {"secret": secret}}
    if ok:
        secret_doc = only(render(chart, values), "Secret", f"{RELEASE}-auth")
        assert base64.b64decode(secret_doc["data"]["secret"]).decode() == secret
        ServerSettings(auth_secret=secret)
        return
    with pytest.raises(helm.HelmRenderError) as failure:
        render(chart, values)
    message = str(failure.value)
    assert "dstl: auth.secret is too weak" in message
    assert "at least 32 characters, 12 of them distinct" in message
    assert secret.strip() not in message  # the failure does not print the secret
    with pytest.raises(ConfigError, match="too weak"):
        ServerSettings(auth_secret=secret)


@pytest.mark.parametrize(
    "values",
    [
        S3_TCP_AUTH,
        TLS_TCP_ONLY,
        {"auth": {"secret": NODE_SECRET}},
        {"auth": {"secret": NODE_SECRET, "jobTokenSecret": {"name": "job1-dstl-token"}}},
        SIDECAR,
        {**SIDECAR, "sidecar": {"native": False}},
    ],
    ids=["s3-tcp-auth", "tls-tcp-only", "made-secret", "made-secret-job", "sidecar", "plain"],
)
def test_node_secret_never_reaches_the_executor(chart: helm.Chart, values: dict[str, Any]) -> None:
    """Executors get their job's token only: with the node secret a job could mint any job's."""
    docs = render(chart, values)
    node_secret = values["auth"].get("existingSecret") or f"{RELEASE}-auth"
    job_secret = values["auth"].get("jobTokenSecret", {}).get("name")
    cm = only(docs, "ConfigMap", f"{RELEASE}-executor-pod-template")
    text = cm["data"]["executor-pod-template.yaml"]
    assert NODE_SECRET not in text
    pod = executor_pod(docs)
    executor = container(pod["spec"], "spark-kubernetes-executor")
    assert secret_names(executor) == ({job_secret} if job_secret else set())
    assert "DSTL_AUTH_SECRET" not in by_name(executor.get("env", []))
    assert not executor.get("envFrom")
    if values.get("mode") == "sidecar":
        # the pod's own dstl-server needs it, and is the only container that gets it
        dstl = [c for c in _containers(pod) if c["name"] == "dstl"]
        assert len(dstl) == 1 and node_secret in secret_names(dstl[0])
        others = [c for c in _containers(pod) if c["name"] != "dstl"]
        assert all(node_secret not in secret_names(c) for c in others)
        assert node_secret not in secret_names(pod["spec"]["volumes"])
    else:
        # daemonset mode: the template names no Secret of the chart at all
        assert node_secret not in text and "DSTL_AUTH_SECRET" not in text
        assert secret_names(pod) == ({job_secret} if job_secret else set())
        server = container(only(docs, "DaemonSet")["spec"]["template"]["spec"], "dstl")
        assert (
            by_name(server["env"])["DSTL_AUTH_SECRET"]["valueFrom"]["secretKeyRef"]["name"]
            == node_secret
        )


def test_notes_tell_how_to_give_a_job_its_token(chart: helm.Chart) -> None:
    def notes(values: dict[str, Any]) -> str:
        text: str = chart.render(values, name=RELEASE, namespace=NAMESPACE)[
            "dstl/templates/NOTES.txt"
        ]
        return text

    assert "token" not in notes({})  # auth off: nothing to say
    daemonset = notes({"auth": {"secret": NODE_SECRET}})
    assert f"exec daemonset/{RELEASE} -c dstl -- dstl-server --print-token my-job" in daemonset
    assert "spark.kubernetes.executor.secretKeyRef.DSTL_TOKEN=my-job-dstl-token:token" in daemonset
    assert NODE_SECRET not in daemonset
    sidecar = notes(SIDECAR)
    assert "dstl-server --print-token my-job" in sidecar
    assert "reads DSTL_TOKEN from Secret job1-dstl-token (key token)" in sidecar
    assert NODE_SECRET not in sidecar


def test_every_server_setting_reaches_dstl_server(chart: helm.Chart) -> None:
    """Each setting is a config key, derived from structured values, or Secret-fed."""
    reached: set[str] = set()
    for values in CONFIGS.values():
        docs = render(chart, values)
        reached |= set(only(docs, "ConfigMap", f"{RELEASE}-config")["data"])
        for doc in docs:
            for c in _containers(doc):
                reached |= {v["name"] for v in c.get("env", []) if v["name"] in SETTING_ENV}
    # the node secrets arrive as DSTL_AUTH_SECRET (and DSTL_AUTH_PREVIOUS_SECRET) from a
    # Secret, never as a file path
    assert sorted(set(SETTING_ENV) - reached) == [
        "DSTL_AUTH_PREVIOUS_SECRET_FILE",
        "DSTL_AUTH_SECRET_FILE",
    ]


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"mode": "cluster"}, "/mode"),
        ({"storage": {"url": "hdfs://nn/dstl"}}, "/storage/url"),
        ({"storage": {"url": ""}}, "/storage/url"),
        ({"config": {"hedgeMode": "sometimes"}}, "/config/hedgeMode"),
        ({"config": {"maxInFlightBytes": "100Mi"}}, "/config/maxInFlightBytes"),
        ({"config": {"hedgeQuantile": 1.5}}, "/config/hedgeQuantile"),
        ({"config": {"persistDelay": 5}}, "/config"),
        ({"tcp": {"port": 70000}}, "/tcp/port"),
        ({"metrics": {"serviceMonitor": {"interval": "soon"}}}, "interval"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"auth": {"token": "s3cr3t"}}, "/auth"),  # the shared token is gone
        ({"auth": {"jobTokenSecret": {"name": "Job_1"}}}, "/auth/jobTokenSecret/name"),
        ({"config": {"maxWritersPerJob": 0}}, "/config/maxWritersPerJob"),
        ({"config": {"writerIdleTimeoutS": 0}}, "/config/writerIdleTimeoutS"),
        ({**TREE, "tree": {"size": 0, "fanout": 2}}, "/tree/size"),
        ({**TREE, "tree": {"size": -3, "fanout": 2}}, "/tree/size"),
        ({**TREE, "tree": {"size": 4, "fanout": 0}}, "/tree/fanout"),
        ({**TREE, "tree": {"size": "4", "fanout": 2}}, "/tree/size"),
        ({**TREE, "tree": {"size": 4, "fanout": 1.5}}, "/tree/fanout"),
        ({**TREE, "tree": {"size": 4, "fanout": 2, "depth": 3}}, "/tree"),
        ({**TREE, "tree": {"size": 4, "fanout": 2, "parentCa": {"configMap": "CA"}}}, "/tree"),
    ],
)
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError):  # and rendering checks the schema too
        chart.render(values, name=RELEASE)


def test_schema_accepts_the_documented_configurations(chart: helm.Chart) -> None:
    for values in CONFIGS.values():
        chart.validate_schema(values)
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert "url" in schema["properties"]["storage"]["required"]


@pytest.mark.parametrize("auth", [False, True], ids=["open", "auth"])
def test_exec_probe_checks_a_real_server(chart: helm.Chart, tmp_path: Path, auth: bool) -> None:
    """The exec probe of the Unix-socket-only default, run against dstl-server.

    The server takes its settings from the rendered ConfigMap (and, with auth,
    the node secret from the rendered Secret its env names); only the paths and
    ports move into the test's directory. Health checks need no token.
    """
    docs = render(chart, {"auth": {"secret": NODE_SECRET}} if auth else {})
    server_c = container(only(docs, "DaemonSet")["spec"]["template"]["spec"], "dstl")
    env = dict(only(docs, "ConfigMap", f"{RELEASE}-config")["data"])
    for var in server_c.get("env", []):
        ref = var["valueFrom"]["secretKeyRef"]
        data = only(docs, "Secret", ref["name"])["data"][ref["key"]]
        env[var["name"]] = base64.b64decode(data).decode()
    assert ("DSTL_AUTH_SECRET" in env) is auth
    sock = tmp_path / "dstl.sock"

    def probe(kind: str) -> subprocess.CompletedProcess[str]:
        command = server_c[kind]["exec"]["command"]
        assert command[:3] == ["dstl-server", "health", "--address"]
        # the rendered command with the test's socket; python -m dstl_server is dstl-server
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "dstl_server",
                "health",
                "--address",
                f"unix://{sock}",
                *command[4:],
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    with ServerProcess(tmp_path / "server", env=env, listen="", unix_socket=str(sock)) as server:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            result = probe(kind)
            assert result.returncode == 0, result.stderr
        if auth:  # auth is really on: calls need the job's token
            with ChangelogClient(f"unix://{sock}") as anonymous, pytest.raises(Unauthenticated):
                anonymous.discard_objects("job1", [])
            token = Authenticator(NODE_SECRET).job_token("job1")
            with ChangelogClient(f"unix://{sock}", token=token) as job1:
                assert job1.discard_objects("job1", []) == 0
        assert server.stop() == 0
    result = probe("readinessProbe")
    assert result.returncode == 1  # nothing serving: the probe fails
    assert "dstl-server health: unix://" in result.stderr


# ------------------------------------------------------------------ memory rule
def _limit_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return int(quantity[:-2]) * units[quantity[-2:]]


@pytest.mark.parametrize("config", CONFIGS)
def test_every_documented_configuration_satisfies_the_memory_rule(
    chart: helm.Chart, config: str
) -> None:
    """The memory limit rendered fits docs/sidecar.md's rule for the settings rendered."""
    docs = render(chart, CONFIGS[config])
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")
    secrets = {"DSTL_AUTH_SECRET": NODE_SECRET} if "auth" in CONFIGS[config] else {}
    if CONFIGS[config].get("auth", {}).get("previousSecretKey"):
        secrets["DSTL_AUTH_PREVIOUS_SECRET"] = NODE_SECRET[::-1]
    settings = settings_from(cm, **secrets)
    workloads = [d for d in docs if d["kind"] in ("DaemonSet", "StatefulSet")]
    if config == "sidecar":
        workloads = [executor_pod(docs)]
    servers = [c for doc in workloads for c in _containers(doc) if c["name"] == "dstl"]
    assert servers
    for server in servers:
        limit = _limit_bytes(server["resources"]["limits"]["memory"])
        assert memory_shortfall(limit, settings) is None, (limit, memory_needed(settings))
    if config == "defaults":  # the chart's defaults: 512Mi for 488 MiB
        assert limit == 512 * MiB and memory_needed(settings).total == 488 * MiB


@pytest.mark.parametrize("mode", ["daemonset", "sidecar"])
def test_a_memory_limit_below_the_rule_fails_with_the_numbers(chart: helm.Chart, mode: str) -> None:
    base: dict[str, Any] = SIDECAR if mode == "sidecar" else {}
    values = {**base, "resources": {"limits": {"memory": "384Mi"}}}
    with pytest.raises(helm.HelmRenderError) as failure:
        render(chart, values)
    message = " ".join(str(failure.value).split())
    assert (
        "dstl: resources.limits.memory 384Mi (384 MiB) is below what dstl-server can hold with "
        "these settings: 2 x config.maxInFlightBytes (200 MiB) + config.readCacheBytes (64 MiB) "
        "+ config.maxRequestBytes (64 MiB) + 160 MiB overhead = 488 MiB"
    ) in message
    assert "Raise the limit to at least 488 MiB" in message
    assert 'docs/sidecar.md, "Memory"' in message
    # the settings count, as dstl-server sees them (null: its default)
    bigger = {**base, "config": {"maxInFlightBytes": 256 * MiB, "readCacheBytes": None}}
    with pytest.raises(
        helm.HelmRenderError, match=r"\(512 MiB\) \+ config.readCacheBytes \(64 MiB\)"
    ):
        render(chart, {**bigger, "resources": {"limits": {"memory": "768Mi"}}})
    render(chart, {**bigger, "resources": {"limits": {"memory": "1Gi"}}})  # 800 MiB fits


@pytest.mark.parametrize(
    ("quantity", "fits"),
    [
        ("488Mi", True),
        ("0.5Gi", True),
        ("511705088", True),
        ("511705087", False),
        ("500M", False),
        ("1G", True),
    ],
)
def test_the_chart_and_dstl_server_draw_the_line_at_the_same_byte(
    chart: helm.Chart, quantity: str, fits: bool
) -> None:
    """Kubernetes quantities parsed by the chart agree with dstl_server.memory_rule."""
    need = memory_needed(ServerSettings()).total
    assert need == 511705088  # 488 MiB
    limit: Any = int(quantity) if quantity.isdigit() else quantity
    values = {"resources": {"limits": {"memory": limit}}}
    if fits:
        render(chart, values)
    else:
        with pytest.raises(helm.HelmRenderError, match="is below what dstl-server can hold"):
            render(chart, values)


def test_a_memory_limit_that_is_no_quantity_fails(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match='"512MB" is not a memory quantity'):
        render(chart, {"resources": {"limits": {"memory": "512MB"}}})


def test_no_memory_limit_nothing_to_check(chart: helm.Chart) -> None:
    docs = render(chart, {"resources": {"limits": None}})
    server = container(only(docs, "DaemonSet")["spec"]["template"]["spec"], "dstl")
    assert "limits" not in server["resources"]


def test_sidecar_container_from_a_parent_chart(tmp_path: Path) -> None:
    """dstl.sidecarContainer used as docs/deploy.md shows: dstl as a subchart."""
    parent = tmp_path / "spark-job"
    shutil.copytree(CHART, parent / "charts" / "dstl")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: spark-job\nversion: 0.1.0\n"
        "dependencies:\n  - name: dstl\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        yaml.safe_dump({"dstl": {"mode": "sidecar", "storage": {"url": "s3://dstl-jobs/x"}}})
    )
    template = _doc_snippet("executor-template.yaml")
    (parent / "templates").mkdir()
    (parent / "templates" / "executor-template.yaml").write_text(template)
    with helm.Chart.load(parent) as loaded:
        docs = render(loaded, {}, release="job1")
    pod = yaml.safe_load(only(docs, "ConfigMap", "spark-job-executor")["data"]["executor.yaml"])
    kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)
    sidecar = container(pod["spec"], "dstl", init=True)
    # the same ConfigMap the dstl subchart rendered for this release
    subchart_cm = only(docs, "ConfigMap", "job1-dstl-config")
    assert sidecar["envFrom"][0]["configMapRef"]["name"] == subchart_cm["metadata"]["name"]
    assert subchart_cm["data"]["DSTL_STORAGE"] == "s3://dstl-jobs/x"
    assert sidecar["image"] == f"{SIDECAR_IMAGE}:0.1.0"
    assert "dstl-socket" in by_name(pod["spec"]["volumes"])


@pytest.mark.parametrize("config", ["defaults", "sidecar", "tree"])
def test_a_chart_bump_alone_restarts_no_pod(chart: helm.Chart, tmp_path: Path, config: str) -> None:
    """Pod templates carry no chart version: a new chart version changes no pod spec.

    The objects themselves keep helm.sh/chart and app.kubernetes.io/version;
    their pods get the stable selector labels (and podLabels) only, so a chart
    bump with the same image and settings does not roll every sidecar.
    """
    bumped = tmp_path / "dstl"
    shutil.copytree(CHART, bumped)
    meta = yaml.safe_load((bumped / "Chart.yaml").read_text())
    meta["version"] = "9.9.9"
    (bumped / "Chart.yaml").write_text(yaml.safe_dump(meta))
    values = {**CONFIGS[config], "podLabels": {"team": "data"}}
    with helm.Chart.load(bumped) as loaded:
        new_docs = render(loaded, values)
    old_docs = render(chart, values)

    def pods(docs: list[Manifest]) -> dict[str, Manifest]:
        found = {
            f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]
            for d in docs
            if d["kind"] in ("DaemonSet", "StatefulSet")
        }
        if config != "tree":
            found["executor"] = executor_pod(docs)
        return found

    old, new = pods(old_docs), pods(new_docs)
    assert old and old == new
    for template in old.values():
        labels = template["metadata"]["labels"]
        assert not {"helm.sh/chart", "app.kubernetes.io/version"} & set(labels)
    for name, template in old.items():
        if name != "executor":
            selector = only(old_docs, *name.split("/"))["spec"]["selector"]["matchLabels"]
            assert template["metadata"]["labels"] == {**selector, "team": "data"}
    # the objects do carry the version: the bump is visible on them
    workload = [d for d in new_docs if d["kind"] in ("DaemonSet", "StatefulSet", "ConfigMap")]
    assert all(d["metadata"]["labels"]["helm.sh/chart"] == "dstl-9.9.9" for d in workload)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {**SIDECAR, "executorPodTemplate": {"stateDir": {"volume": "hostPath"}}},
            "executorPodTemplate.stateDir.volume hostPath is for mode daemonset only",
        ),
        (
            {"executorPodTemplate": {"stateDir": {"path": "/var/run/dstl"}}},
            "stateDir.path /var/run/dstl is a directory of dstl-server's own",
        ),
        (
            {"executorPodTemplate": {"stateDir": {"path": "/var/lib/dstl/objects/"}}},
            "stateDir.path /var/lib/dstl/objects/ is a directory of dstl-server's own",
        ),
    ],
)
def test_state_dir_misuse_fails(chart: helm.Chart, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(chart, values)


def test_state_dir_choices(chart: helm.Chart) -> None:
    # emptyDir in daemonset mode: the pod's own, and the DaemonSet prepares nothing for it
    docs = render(chart, {"executorPodTemplate": {"stateDir": {"volume": "emptyDir"}}})
    pod = executor_pod(docs)
    assert by_name(pod["spec"]["volumes"])["dstl-state"] == {"name": "dstl-state", "emptyDir": {}}
    spec = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert "dstl-executor-state" not in by_name(spec["volumes"])
    assert "/var/lib/dstl/state" not in container(spec, "host-dirs", init=True)["command"][2]

    # another owner and path: the init container hands that directory to that user
    own = {"path": "/mnt/disks/ssd0/dstl-state", "uid": 1000, "gid": 2000}
    docs = render(chart, {"executorPodTemplate": {"stateDir": own}})
    spec = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    command = container(spec, "host-dirs", init=True)["command"][2]
    assert f"chown 1000:2000 {own['path']} && chmod 0700 {own['path']}" in command
    exec_c = container(executor_pod(docs)["spec"], "spark-kubernetes-executor")
    assert by_name(exec_c["env"])["DSTL_STATE_DIR"]["value"] == own["path"]

    # hostDirInit off: the nodes prepare it; the executors still mount the node directory
    docs = render(chart, {"hostDirInit": {"enabled": False}})
    spec = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    assert "dstl-executor-state" not in by_name(spec["volumes"])
    volumes = by_name(executor_pod(docs)["spec"]["volumes"])
    assert volumes["dstl-state"]["hostPath"]["path"] == "/var/lib/dstl/state"

    # no path: no DSTL_STATE_DIR (dstl_client falls back to <tmp>/dstl-state)
    docs = render(chart, {"executorPodTemplate": {"stateDir": {"path": ""}}})
    pod = executor_pod(docs)
    exec_c = container(pod["spec"], "spark-kubernetes-executor")
    assert "DSTL_STATE_DIR" not in by_name(exec_c["env"])
    assert "dstl-state" not in by_name(pod["spec"]["volumes"])
    for k8s in K8S_VERSIONS:
        kubernetes_validate.validate(pod, k8s, strict=True)


def _doc_snippet(name: str) -> str:
    """The template block of docs/deploy.md that follows a ``# <name>`` line."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    marker = f"# {name}\n"
    start = text.index(marker) + len(marker)
    return text[start : text.index("```", start)]


# -------------------------------------------------------------------- tree mode
def _tree_server(docs: list[Manifest]) -> Manifest:
    return container(only(docs, "StatefulSet", RELEASE)["spec"]["template"]["spec"], "dstl")


def _run_entrypoint(
    server: Manifest, pod_name: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """The tree container's command and args, run by a real sh for pod ``pod_name``.

    A stand-in ``dstl-server`` on PATH prints the argv it was exec'ed with as JSON.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "dstl-server"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "POD_NAME": pod_name}
    return subprocess.run(
        [*server["command"], *server["args"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _tree_settings(docs: list[Manifest], argv: list[str]) -> ServerSettings:
    """What dstl-server makes of the ConfigMap, the node secret and its flags (as its CLI)."""
    ns = build_parser().parse_args(argv)
    flags = {k: v for k, v in vars(ns).items() if not k.startswith("print_") and v is not None}
    environ = {**only(docs, "ConfigMap", f"{RELEASE}-config")["data"]}
    environ["DSTL_AUTH_SECRET"] = NODE_SECRET  # from Secret dstl-node-secret (see env)
    return ServerSettings.from_sources(flags, environ=environ)


def test_tree_mode_renders_a_statefulset_and_its_headless_service(chart: helm.Chart) -> None:
    docs = render(chart, TREE)
    assert kinds(docs) == {
        "StatefulSet",
        "Service",
        "ConfigMap",
        "ServiceAccount",
        "ServiceMonitor",
    }
    sts = only(docs, "StatefulSet", RELEASE)
    svc = only(docs, "Service")
    assert svc["metadata"]["name"] == f"{RELEASE}-tree"
    assert svc["spec"]["clusterIP"] == "None"
    # parents are addressed before they are ready: a child falls back on its own
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 7070, "metrics": 9464}
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert sts["spec"]["replicas"] == 6
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert (
        only(docs, "ServiceMonitor")["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    )

    spec = sts["spec"]["template"]["spec"]
    server = container(spec, "dstl")
    assert server["command"][:2] == ["sh", "-c"] and server["command"][3] == "dstl-server"
    assert "exec dstl-server --tree-index" in server["command"][2]
    assert server["args"] == [
        "--tree-size",
        "6",
        "--tree-fanout",
        "2",
        "--tree-address-template",
        f"{RELEASE}-{{index}}.{RELEASE}-tree.{NAMESPACE}.svc:7070",
    ]
    env = by_name(server["env"])
    # the pod name (never truncated, unlike $HOSTNAME), not a label a feature gate adds
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["DSTL_AUTH_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "dstl-node-secret"

    cm = only(docs, "ConfigMap", f"{RELEASE}-config")["data"]
    assert cm["DSTL_LISTEN"] == "0.0.0.0:7070"
    assert cm["DSTL_TLS_CERT"] == "/etc/dstl/tls/tls.crt"
    assert cm["DSTL_PARENT_CA_FILE"] == "/etc/dstl/tls/ca.crt"  # the TLS Secret's ca.crt
    assert cm["DSTL_FORWARD_THRESHOLD_BYTES"] == "262144"
    assert cm["DSTL_FORWARD_TIMEOUT_S"] == "2.5"
    # per pod (and derived): flags only, so `kubectl exec ... --print-token` still runs
    for var in ("DSTL_PARENT", "DSTL_TREE_INDEX", "DSTL_TREE_SIZE", "DSTL_TREE_FANOUT"):
        assert var not in cm
    assert "DSTL_TREE_ADDRESS_TEMPLATE" not in cm

    # no node directories: the socket (for the exec probe) is the pod's own
    volumes = by_name(spec["volumes"])
    assert "emptyDir" in volumes["dstl-socket"] and "hostPath" not in str(spec)
    assert volumes["dstl-tls"]["secret"]["secretName"] == "dstl-tls"
    assert "initContainers" not in spec
    assert server["readinessProbe"]["exec"]["command"][3] == "unix:///var/run/dstl/dstl.sock"
    ports = by_name(server["ports"])
    assert ports["grpc"] == {"name": "grpc", "containerPort": 7070, "protocol": "TCP"}

    # the parent's CA from a ConfigMap of its own instead
    own_ca = {
        **TREE,
        "tree": {**TREE["tree"], "parentCa": {"configMap": "tree-ca", "key": "a.pem"}},
    }
    docs = render(chart, own_ca)
    spec = only(docs, "StatefulSet")["spec"]["template"]["spec"]
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")["data"]
    mount = by_name(container(spec, "dstl")["volumeMounts"])["dstl-parent-ca"]
    assert cm["DSTL_PARENT_CA_FILE"] == f"{mount['mountPath']}/a.pem"
    assert by_name(spec["volumes"])["dstl-parent-ca"]["configMap"]["name"] == "tree-ca"
    for k8s in K8S_VERSIONS:
        for doc in docs:
            if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
                kubernetes_validate.validate(doc, k8s, strict=True)


@pytest.mark.parametrize(
    ("ordinal", "parent"),
    [(0, ""), (1, 0), (2, 0), (3, 1), (4, 1), (5, 2)],
)
def test_tree_pods_derive_their_index_and_the_server_accepts_it(
    chart: helm.Chart, tmp_path: Path, ordinal: int, parent: int | str
) -> None:
    """The entrypoint, run by sh, hands dstl-server the ordinal; settings it accepts."""
    docs = render(chart, TREE)
    server = _tree_server(docs)
    result = _run_entrypoint(server, f"{RELEASE}-{ordinal}", tmp_path)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)
    assert argv == ["--tree-index", str(ordinal), *server["args"]]
    settings = _tree_settings(docs, argv)
    assert (settings.tree_index, settings.tree_size, settings.tree_fanout) == (ordinal, 6, 2)
    expected = "" if parent == "" else f"{RELEASE}-{parent}.{RELEASE}-tree.{NAMESPACE}.svc:7070"
    assert settings.parent_address == expected
    assert settings.parent_ca_file == "/etc/dstl/tls/ca.crt"
    assert settings.forward_threshold_bytes == 262144
    assert settings.forward_timeout_s == 2.5
    assert settings.listen == "0.0.0.0:7070" and settings.tls_cert
    # the address of pod i is the StatefulSet's DNS name for it
    sts = only(docs, "StatefulSet")
    own = settings.tree_address_template.replace("{index}", str(ordinal))
    assert own == (
        f"{sts['metadata']['name']}-{ordinal}.{sts['spec']['serviceName']}.{NAMESPACE}.svc:7070"
    )


def test_tree_pod_name_without_an_ordinal_stops_the_pod(chart: helm.Chart, tmp_path: Path) -> None:
    server = _tree_server(render(chart, TREE))
    for name in ("dstl-x", "dstl-", "dstl"):
        result = _run_entrypoint(server, name, tmp_path)
        assert result.returncode == 2 and result.stdout == ""
        assert f"dstl: no StatefulSet ordinal at the end of pod name '{name}'" in result.stderr
    # an ordinal beyond tree.size is dstl-server's own ConfigError (exit 2 at start)
    docs = render(chart, TREE)
    argv = json.loads(_run_entrypoint(server, f"{RELEASE}-6", tmp_path).stdout)
    with pytest.raises(ConfigError, match="out of range for tree_size=6"):
        _tree_settings(docs, argv)


def test_tree_of_one_is_a_root_alone(chart: helm.Chart, tmp_path: Path) -> None:
    docs = render(chart, {**TREE, "tree": {"size": 1, "fanout": 1}})
    assert only(docs, "StatefulSet")["spec"]["replicas"] == 1
    argv = json.loads(_run_entrypoint(_tree_server(docs), f"{RELEASE}-0", tmp_path).stdout)
    assert _tree_settings(docs, argv).parent_address == ""


TREE_BASE: dict[str, Any] = {"mode": "tree", "storage": {"url": "s3://dstl-changelog/tree"}}


@pytest.mark.parametrize(
    ("values", "missing"),
    [
        ({}, "tcp.enabled, tls.existingSecret, auth.existingSecret (or auth.secret)"),
        ({"tcp": {"enabled": True}}, "tls.existingSecret, auth.existingSecret (or auth.secret)"),
        ({"tcp": {"enabled": True}, "auth": NODE_AUTH}, "tls.existingSecret"),
        ({"tcp": {"enabled": True}, "tls": TLS}, "auth.existingSecret (or auth.secret)"),
        ({"auth": {"secret": NODE_SECRET}, "tls": TLS}, "tcp.enabled"),
        (
            {"tcp": {"enabled": True, "bindAddress": "127.0.0.1"}, "auth": NODE_AUTH, "tls": TLS},
            "a non-loopback tcp.bindAddress (not 127.0.0.1)",
        ),
    ],
)
def test_tree_mode_without_tcp_tls_and_auth_fails_to_render(
    chart: helm.Chart, values: dict[str, Any], missing: str
) -> None:
    with pytest.raises(helm.HelmRenderError) as failure:
        render(chart, {**TREE_BASE, **values})
    message = str(failure.value)
    assert "dstl: mode tree forwards between pods over TCP on the pod IP" in message
    assert "needs TCP off loopback with both TLS and auth" in message
    assert message.rstrip().endswith(f"missing: {missing}")


def test_dstl_server_refuses_a_tree_parent_without_tls_or_token() -> None:
    """The chart's rule is the server's: a non-loopback parent needs a CA and a token."""
    tree: dict[str, Any] = {
        "listen": "127.0.0.1:7070",
        "tree_index": 1,
        "tree_size": 2,
        "tree_address_template": "dstl-{index}.dstl-tree.obs.svc:7070",
    }
    with pytest.raises(ConfigError, match="needs parent_ca_file"):
        ServerSettings(**tree, auth_secret=NODE_SECRET)
    with pytest.raises(ConfigError, match="needs parent_ca_file"):
        ServerSettings(**tree, parent_ca_file="/ca.crt")
    ServerSettings(**tree, auth_secret=NODE_SECRET, parent_ca_file="/ca.crt")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"storage": {"url": "file:///var/lib/dstl/objects"}}, "mode tree would keep file://"),
        ({"config": {"parent": "root:7070"}}, "leave config.parent unset"),
        ({"config": {"treeIndex": 0}}, "leave config.treeIndex unset"),
        (
            {"config": {"treeSize": 4, "treeAddressTemplate": "x-{index}:1"}},
            "leave config.treeSize, config.treeAddressTemplate unset",
        ),
        ({"config": {"parentCaFile": "/ca.pem"}}, "leave config.parentCaFile unset"),
        ({"tcp": {"enabled": True, "hostPort": True}}, "tcp.hostPort is for mode daemonset only"),
    ],
)
def test_tree_mode_inconsistent_values_fail(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    merged = {**TREE, **values}
    with pytest.raises(helm.HelmRenderError, match=message):
        render(chart, merged)
    chart.validate_schema(merged)  # the schema alone lets them by: the templates catch them


def test_notes_of_tree_mode(chart: helm.Chart) -> None:
    text: str = chart.render(TREE, name=RELEASE, namespace=NAMESPACE)["dstl/templates/NOTES.txt"]
    assert "tree of 6 dstl-servers (fan-out 2)" in text
    assert f"{RELEASE}-{{index}}.{RELEASE}-tree.{NAMESPACE}.svc:7070" in text
    assert f"*.{RELEASE}-tree.{NAMESPACE}.svc" in text
    assert f"exec statefulset/{RELEASE} -c dstl -- dstl-server --print-token my-job" in text
