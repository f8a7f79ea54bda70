"""The Helm chart in deploy/helm/dstl, checked offline.

Rendering, linting and values-schema checks go through the Helm SDK itself
(helm-python-sdk, a ctypes binding of Helm v4); every rendered manifest is then
validated against the Kubernetes OpenAPI schemas shipped by kubernetes-validate
(strict: unknown fields fail), for the chart's oldest supported Kubernetes and
the newest one the package knows. The settings the chart hands to dstl-server
are checked against ``ServerSettings`` itself, and the exec health probe is run
against a real dstl-server process.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from dstl_server.settings import ServerSettings, env_name
from dstl_server.testing import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "dstl"
RELEASE = "dstl"
NAMESPACE = "obs"
#: the chart's kubeVersion floor (native sidecars) and the newest schemas shipped
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())
SETTING_ENV = {env: name for name, env, _default, _unit, _doc in ServerSettings.describe()}
DEFAULTS = {name: default for name, _env, default, _unit, _doc in ServerSettings.describe()}

Manifest = dict[str, Any]

# --------------------------------------------------------------- configurations
S3_TCP_TOKEN: dict[str, Any] = {
    "image": {"repository": "registry.example.com/dstl-server", "tag": "1.2.3"},
    "storage": {"url": "s3://dstl-changelog/prod"},
    "s3": {
        "endpointUrl": "https://s3.example.internal:8443",
        "region": "eu-west-1",
        "credentialsSecret": "dstl-s3-credentials",
        "caBundle": {"configMap": "s3-ca", "key": "ca.pem"},
    },
    "tcp": {"enabled": True, "hostPort": True},
    "auth": {"existingSecret": "dstl-token", "secretKey": "bearer"},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "config": {"maxInFlightBytes": 268435456, "logLevel": "INFO", "hedgeMode": "fixed"},
    "extraArgs": ["--persist-delay-ms", "5"],
    "extraEnv": [{"name": "AWS_MAX_ATTEMPTS", "value": "2"}],
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
    "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
}
SIDECAR: dict[str, Any] = {
    "mode": "sidecar",
    "storage": {"url": "s3://dstl-changelog/jobs"},
    "auth": {"token": "s3cr3t-token"},
}
TLS_TCP_ONLY: dict[str, Any] = {
    "storage": {"url": "s3://dstl-changelog/tls"},
    "unixSocket": {"enabled": False},
    "tcp": {"enabled": True, "hostPort": True},
    "tls": {"existingSecret": "dstl-tls"},
    "executorPodTemplate": {"enabled": True},
}
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "s3-tcp-token": S3_TCP_TOKEN,
    "sidecar": SIDECAR,
    "tls-tcp-only": TLS_TCP_ONLY,
}


# ---------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any], release: str = RELEASE) -> list[Manifest]:
    """Every Kubernetes object the chart renders for ``values``."""
    files = chart.render(values, name=release, namespace=NAMESPACE)
    docs: list[Manifest] = []
    for path, text in sorted(files.items()):
        if path.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def only(docs: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def kinds(docs: list[Manifest]) -> set[str]:
    return {d["kind"] for d in docs}


def executor_pod(docs: list[Manifest]) -> Manifest:
    cm = only(docs, "ConfigMap", f"{RELEASE}-executor-pod-template")
    pod: Manifest = yaml.safe_load(cm["data"]["executor-pod-template.yaml"])
    return pod


def container(pod_spec: Manifest, name: str, *, init: bool = False) -> Manifest:
    key = "initContainers" if init else "containers"
    found: list[Manifest] = [c for c in pod_spec.get(key, []) if c["name"] == name]
    assert len(found) == 1, f"no {key[:-1]} {name!r} in {pod_spec.get(key)}"
    return found[0]


def by_name(items: list[Manifest]) -> dict[str, Manifest]:
    return {item["name"]: item for item in items}


def settings_from(config_map: Manifest, **secrets: str) -> ServerSettings:
    """What dstl-server makes of the ConfigMap (plus Secret-fed variables)."""
    return ServerSettings.from_sources(environ={**config_map["data"], **secrets})


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

    assert server["image"] == "dstl-server:0.1.0"  # appVersion when image.tag is empty
    assert server["command"] == ["dstl-server"] and "args" not in server
    assert server["envFrom"] == [{"configMapRef": {"name": cm["metadata"]["name"]}}]
    assert cm["data"]["DSTL_UNIX_SOCKET"] == sock
    assert cm["data"]["DSTL_LISTEN"] == ""  # Unix socket only
    assert cm["data"]["DSTL_METRICS_HOST"] == "0.0.0.0"
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
        assert command[0] == "python3" and command[1] == "-c"
        assert command[3:] == [f"unix://{sock}", service, "4"]
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
    assert by_name(exec_c["volumeMounts"])["dstl-socket"]["readOnly"] is True
    assert by_name(executor["spec"]["volumes"])["dstl-socket"]["hostPath"]["path"] == (
        "/var/run/dstl"
    )
    assert executor["spec"]["securityContext"]["supplementalGroups"] == [185]


def test_s3_tcp_token_daemonset(chart: helm.Chart) -> None:
    docs = render(chart, S3_TCP_TOKEN)
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
    assert env["DSTL_AUTH_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "dstl-token", "key": "bearer"}
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

    # TCP on the pod IP in clear text: kubelet's own gRPC probes
    assert server["readinessProbe"]["grpc"] == {"port": 7070, "service": "dstl.v1.Changelog"}
    assert server["livenessProbe"]["grpc"] == {"port": 7070, "service": ""}
    assert server["startupProbe"]["grpc"]["port"] == 7070
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

    # executors: still the Unix socket (it is on), plus the token
    exec_env = by_name(container(executor_pod(docs)["spec"], "spark-kubernetes-executor")["env"])
    assert exec_env["DSTL_ADDRESS"]["value"] == "unix:///var/run/dstl/dstl.sock"
    assert exec_env["DSTL_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "dstl-token",
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
    env = by_name(container(executor_pod(docs)["spec"], "spark-kubernetes-executor")["env"])
    assert env["DSTL_NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["DSTL_ADDRESS"]["value"] == "$(DSTL_NODE_IP):7070"


def test_sidecar_mode_executor_pod_template(chart: helm.Chart) -> None:
    docs = render(chart, SIDECAR)
    assert "DaemonSet" not in kinds(docs) and "Service" not in kinds(docs)
    secret = only(docs, "Secret", f"{RELEASE}-auth")
    assert base64.b64decode(secret["data"]["token"]).decode() == "s3cr3t-token"

    pod = executor_pod(docs)
    spec = pod["spec"]
    sidecar = container(spec, "dstl", init=True)
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: up before the executor
    assert "exec" in sidecar["readinessProbe"]
    assert sidecar["envFrom"][0]["configMapRef"]["name"] == f"{RELEASE}-config"
    token_ref = {"secretKeyRef": {"name": f"{RELEASE}-auth", "key": "token"}}
    assert by_name(sidecar["env"])["DSTL_AUTH_TOKEN"]["valueFrom"] == token_ref
    # the executor's pod securityContext is not the chart's: the container pins its own
    sc = sidecar["securityContext"]
    assert (sc["runAsNonRoot"], sc["runAsUser"], sc["runAsGroup"]) == (True, 10001, 185)
    assert sc["readOnlyRootFilesystem"] is True

    executor = container(spec, "spark-kubernetes-executor")
    env = by_name(executor["env"])
    assert env["DSTL_ADDRESS"]["value"] == "unix:///var/run/dstl/dstl.sock"
    assert env["DSTL_TOKEN"]["valueFrom"] == token_ref
    volumes = by_name(spec["volumes"])
    assert "emptyDir" in volumes["dstl-socket"] and "hostPath" not in volumes["dstl-socket"]
    assert by_name(sidecar["volumeMounts"])["dstl-socket"]["mountPath"] == "/var/run/dstl"
    assert by_name(executor["volumeMounts"])["dstl-socket"]["mountPath"] == "/var/run/dstl"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9464"

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
    secrets = {"DSTL_AUTH_TOKEN": "t"} if "auth" in CONFIGS[config] else {}
    settings = settings_from(cm, **secrets)  # raises ConfigError when dstl-server would
    assert settings.storage == CONFIGS[config].get("storage", {}).get(
        "url", "file:///var/lib/dstl/objects"
    )


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


def test_non_loopback_tcp_without_token_or_tls_fails_to_render(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError) as failure:
        render(chart, {"tcp": {"enabled": True}})
    message = str(failure.value)
    assert "tcp.bindAddress 0.0.0.0 is not loopback, so TCP needs a token or TLS" in message
    assert "auth.existingSecret" in message and "tls.existingSecret" in message
    # loopback needs nothing, like dstl-server itself; a token or TLS is enough
    for ok in (
        {"tcp": {"enabled": True, "bindAddress": "127.0.0.1"}},
        {"tcp": {"enabled": True}, "auth": {"token": "x"}},
        {"tcp": {"enabled": True}, "tls": {"existingSecret": "dstl-tls"}},
    ):
        assert "DaemonSet" in kinds(render(chart, ok))


@pytest.mark.parametrize(
    ("tcp", "listen", "probe_target"),
    [
        ({"bindAddress": "::"}, "[::]:7070", None),  # IPv6 literal: bracketed
        ({"bindAddress": "127.0.0.1", "port": 7171}, "127.0.0.1:7171", "unix://"),
    ],
)
def test_listen_address_and_probe_follow_the_tcp_values(
    chart: helm.Chart, tcp: dict[str, Any], listen: str, probe_target: str | None
) -> None:
    docs = render(chart, {"tcp": {"enabled": True, **tcp}, "auth": {"existingSecret": "t"}})
    cm = only(docs, "ConfigMap", f"{RELEASE}-config")
    assert cm["data"]["DSTL_LISTEN"] == listen
    assert settings_from(cm, DSTL_AUTH_TOKEN="t").listen == listen
    probe = container(only(docs, "DaemonSet")["spec"]["template"]["spec"], "dstl")["readinessProbe"]
    if probe_target is None:  # reachable on the pod IP: kubelet's gRPC probe
        assert probe["grpc"]["port"] == 7070
    else:  # loopback is out of kubelet's reach: exec over the socket
        assert probe["exec"]["command"][3].startswith(probe_target)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"unixSocket": {"enabled": False}}, "nothing to listen on"),
        ({"terminationGracePeriodSeconds": 30}, "must exceed config.shutdownGraceS"),
        (
            {**SIDECAR, "tcp": {"enabled": True, "hostPort": True}},
            "tcp.hostPort is for mode daemonset only",
        ),
        ({"mode": "sidecar"}, "file:// objects in the executor pod's emptyDir"),
        (
            {"unixSocket": {"enabled": False}, "tcp": {"enabled": True}, "auth": {"token": "x"}},
            "executors reach the DaemonSet over unixSocket or tcp.hostPort",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_clear_message(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(chart, values)


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


def test_exec_probe_checks_a_real_server(chart: helm.Chart, tmp_path: Path) -> None:
    """The exec probe of the Unix-socket-only default, run against dstl-server.

    The server takes its settings from the rendered ConfigMap; only the paths
    and ports move into the test's directory.
    """
    docs = render(chart, {})
    server_c = container(only(docs, "DaemonSet")["spec"]["template"]["spec"], "dstl")
    env = only(docs, "ConfigMap", f"{RELEASE}-config")["data"]
    sock = tmp_path / "dstl.sock"

    def probe(kind: str) -> subprocess.CompletedProcess[str]:
        python, flag, code, _target, service, timeout = server_c[kind]["exec"]["command"]
        assert (python, flag) == ("python3", "-c")
        return subprocess.run(
            [sys.executable, "-c", code, f"unix://{sock}", service, timeout],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    with ServerProcess(tmp_path / "server", env=env, listen="", unix_socket=str(sock)) as server:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            result = probe(kind)
            assert result.returncode == 0, result.stderr
        assert server.stop() == 0
    result = probe("readinessProbe")
    assert result.returncode != 0  # nothing serving: the probe fails


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
    assert sidecar["image"] == "dstl-server:0.1.0"
    assert "dstl-socket" in by_name(pod["spec"]["volumes"])


def _doc_snippet(name: str) -> str:
    """The template block of docs/deploy.md that follows a ``# <name>`` line."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    marker = f"# {name}\n"
    start = text.index(marker) + len(marker)
    return text[start : text.index("```", start)]
