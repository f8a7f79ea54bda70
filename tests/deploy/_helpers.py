"""What the chart's test modules share: the chart's configurations and manifest helpers.

The configurations are values files the documentation describes; the helpers
render the chart with the Helm SDK and pick objects out of what it renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

from dstl_server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "dstl"
RELEASE = "dstl"
#: the sidecar image deploy/docker/sidecar.Dockerfile builds (tests/deploy/test_images.py)
SIDECAR_IMAGE = "ghcr.io/dstl-project/dstl-sidecar"
NAMESPACE = "obs"
#: the chart's kubeVersion floor (native sidecars) and the newest schemas shipped
K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())
SETTING_ENV = {env: name for name, env, _default, _unit, _doc in ServerSettings.describe()}
DEFAULTS = {name: default for name, _env, default, _unit, _doc in ServerSettings.describe()}

Manifest = dict[str, Any]
MiB = 1 << 20

#: a node secret dstl-server accepts (32+ characters, 12+ distinct)
NODE_SECRET = "q7Vx2LmP9rT4wZ8kN3bH6cJ1fD5sGa0y"

# --------------------------------------------------------------- configurations
S3_TCP_AUTH: dict[str, Any] = {
    "image": {"repository": "registry.example.com/dstl-server", "tag": "1.2.3"},
    "storage": {"url": "s3://dstl-changelog/prod"},
    "s3": {
        "endpointUrl": "https://s3.example.internal:8443",
        "region": "eu-west-1",
        "credentialsSecret": "dstl-s3-credentials",
        "caBundle": {"configMap": "s3-ca", "key": "ca.pem"},
    },
    "tcp": {"enabled": True, "hostPort": True},
    "tls": {"existingSecret": "dstl-tls"},
    "auth": {
        "existingSecret": "dstl-node-secret",
        "secretKey": "node-secret",
        "jobTokenSecret": {"name": "job1-dstl-token", "key": "bearer"},
    },
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
    "auth": {"secret": NODE_SECRET, "jobTokenSecret": {"name": "job1-dstl-token"}},
}
TLS_TCP_ONLY: dict[str, Any] = {
    "storage": {"url": "s3://dstl-changelog/tls"},
    "unixSocket": {"enabled": False},
    "tcp": {"enabled": True, "hostPort": True},
    "tls": {"existingSecret": "dstl-tls"},
    "auth": {"existingSecret": "dstl-node-secret"},
    "executorPodTemplate": {"enabled": True},
}
#: a forwarding tree of 6 nodes, fan-out 2: 0 <- 1, 2; 1 <- 3, 4; 2 <- 5
TREE: dict[str, Any] = {
    "mode": "tree",
    "storage": {"url": "s3://dstl-changelog/tree"},
    "tcp": {"enabled": True},
    "tls": {"existingSecret": "dstl-tls"},
    "auth": {"existingSecret": "dstl-node-secret"},
    "tree": {"size": 6, "fanout": 2},
    "config": {"forwardThresholdBytes": 262144, "forwardTimeoutS": 2.5},
    "executorPodTemplate": {"enabled": False},
    "metrics": {"serviceMonitor": {"enabled": True}},
}
#: a node secret being rotated (docs/deploy.md, "Rotating the node secret")
ROTATION: dict[str, Any] = {
    **TLS_TCP_ONLY,
    "auth": {
        "existingSecret": "dstl-node-secret",
        "previousSecretKey": "previous",
        "previousSecretUntil": "2030-01-31T12:00:00Z",
    },
}
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "s3-tcp-auth": S3_TCP_AUTH,
    "sidecar": SIDECAR,
    "tls-tcp-only": TLS_TCP_ONLY,
    "tree": TREE,
    "rotation": ROTATION,
}


# ---------------------------------------------------------------------- helpers
def render(chart: helm.Chart, values: dict[str, Any], release: str = RELEASE) -> list[Manifest]:
    """Every Kubernetes object the chart renders for ``values``."""
    files = chart.render(values, name=release, namespace=NAMESPACE)
    docs: list[Manifest] = []
    for path, text in sorted(files.items()):
        # the `helm test` pod is no release object: tests/deploy/test_observability.py
        if path.endswith(".yaml") and "/templates/tests/" not in path:
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


def secret_names(obj: Any) -> set[str]:
    """Every Secret a pod spec, container or env list refers to, wherever it does."""
    found: set[str] = set()
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("secretKeyRef", "secretRef") and isinstance(value, dict):
                found.add(value["name"])
            elif key == "secret" and isinstance(value, dict) and "secretName" in value:
                found.add(value["secretName"])  # a volume
            else:
                found |= secret_names(value)
    elif isinstance(obj, list):
        for item in obj:
            found |= secret_names(item)
    return found
