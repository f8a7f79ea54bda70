"""The observability pack: metric names, the Grafana dashboard, alerts, PodMonitor, helm test.

Every PromQL expression the chart ships (the dashboard's queries and the
PrometheusRule's alerts, as rendered) may name only metrics that the sidecar's
or the driver's registry exports, with the suffixes prometheus-client gives
them (``_total``, ``_bucket``/``_sum``/``_count``, ``_info``). The registries
are built in-process, so a renamed metric fails here, not on a dashboard.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from dstl_client.coordinator.metrics import CoordinatorMetrics
from dstl_server.metrics import ServerMetrics
from dstl_server.testing import ServerProcess
from tests.deploy._helpers import (
    CHART,
    CONFIGS,
    K8S_VERSIONS,
    NAMESPACE,
    RELEASE,
    SIDECAR,
    TREE,
    Manifest,
    container,
    executor_pod,
)

DASHBOARD = CHART / "dashboards" / "dstl.json"
ALL_MONITORING: dict[str, Any] = {
    "prometheusRule": {"enabled": True, "alertLabels": {"team": "data"}},
    "dashboard": {"enabled": True},
}
#: the alerts issue 13 asks for, and the store's
ALERTS = {
    "DstlPersistFailures",
    "DstlUploadErrorRate",
    "DstlStoreDown",
    "DstlHedgeBudgetExhausted",
    "DstlBackpressure",
    "DstlCheckpointTimeouts",
    "DstlCheckpointNearTimeout",
    "DstlMaterializationStuck",
    "DstlMaterializationFailing",
}


# ------------------------------------------------------------- exported names
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def exported(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can expose, labelled metrics without children too."""
    names: set[str] = set()
    for family in registry.collect():
        names |= {family.name + suffix for suffix in _SUFFIXES[family.type]}
        names |= {sample.name for sample in family.samples}
    return names


def sidecar_registry() -> CollectorRegistry:
    return ServerMetrics().registry


def driver_registry() -> CollectorRegistry:
    return CoordinatorMetrics("obs").registry


@pytest.fixture(scope="module")
def exported_names() -> set[str]:
    return exported(sidecar_registry()) | exported(driver_registry())


# ------------------------------------------------------------------- PromQL
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_IDENT = re.compile(r"(?<![\w.$])([A-Za-z_:][\w:]*)\s*(\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"} | {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or Grafana ``label_values`` query) selects."""
    text = _STRING.sub('""', expr)
    text = _VARIABLE.sub("", text)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    label_values = re.fullmatch(r"\s*label_values\(\s*([\w:]+)\s*,\s*\w+\s*\)\s*", text)
    if label_values:
        return {label_values.group(1)}
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.groups()
        if not call and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def test_metric_names_of_promql() -> None:
    """The extractor the checks below rely on finds names, and only names."""
    expr = (
        'histogram_quantile(0.99, sum by (le, instance) (rate(a_seconds_bucket{x=~"$i",'
        'code!="OK"}[$__rate_interval]))) / on (job_id) group_left b_total > 1e-9 * c'
        " and increase(d_total[5m] offset 1h) > bool 0"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c", "d_total"}
    assert metric_names("label_values(dstl_build_info, instance)") == {"dstl_build_info"}
    assert metric_names("time() - max by (job_id) (g{job_id=~'$job_id'})") == {"g"}


# ------------------------------------------------------------ metric names
def test_build_info_on_sidecar_and_driver() -> None:
    assert "dstl_build_info" in exported(sidecar_registry())
    driver = driver_registry()
    assert "dstl_driver_build_info" in exported(driver)
    info = [s for f in driver.collect() for s in f.samples if s.name == "dstl_driver_build_info"]
    assert len(info) == 1 and info[0].value == 1
    assert set(info[0].labels) == {"job_id", "version", "python"}


def _label_names(owner: object, registry: CollectorRegistry) -> set[str]:
    names = {label for f in registry.collect() for s in f.samples for label in s.labels}
    for metric in vars(owner).values():
        if isinstance(metric, MetricWrapperBase):
            names |= set(metric._labelnames)
    return names


def test_no_label_is_called_job() -> None:
    """Prometheus sets ``job`` to the scrape job: an exported ``job`` label would be renamed."""
    server, driver = ServerMetrics(), CoordinatorMetrics("obs")
    assert "job" not in _label_names(server, server.registry)
    assert "job" not in _label_names(driver, driver.registry)
    assert "job_id" in _label_names(driver, driver.registry)


def test_sidecar_and_driver_share_no_dstl_name() -> None:
    """Driver metrics are dstl_driver_*: no name means one thing on each side."""
    sidecar = {n for n in exported(sidecar_registry()) if n.startswith("dstl_")}
    driver = {n for n in exported(driver_registry()) if n.startswith("dstl_")}
    assert sidecar and driver
    assert sidecar.isdisjoint(driver)
    assert all(n.startswith("dstl_driver_") for n in driver)
    assert not any(n.startswith("dstl_driver_") for n in sidecar)
    # process and Python metrics on both: the same meaning (the exporting process)
    for names in (exported(sidecar_registry()), exported(driver_registry())):
        assert {"process_resident_memory_bytes", "process_cpu_seconds_total"} <= names
        assert {"python_info", "python_gc_collections_total"} <= names


# ---------------------------------------------------------------- dashboard
def _dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expression) of every query: panels (rows included) and variables."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield (
                f"variable {variable['name']}",
                query["query"] if isinstance(query, dict) else query,
            )


def test_dashboard_is_json_and_queries_only_exported_metrics(exported_names: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    queries = list(_dashboard_queries(dashboard))
    assert len(queries) > 30
    used: set[str] = set()
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - exported_names
        assert not unknown, f"{where}: {sorted(unknown)} not exported by sidecar or driver"
        used |= names
    # what the issue asks the dashboard to show
    for metric in (
        "dstl_persist_latency_seconds_bucket",
        "dstl_uploads_total",
        "dstl_upload_failures_total",
        "dstl_upload_latency_seconds_bucket",
        "dstl_hedges_started_total",
        "dstl_backpressure_waits_total",
        "dstl_upload_in_flight_bytes",
        "dstl_driver_checkpoints_total",
        "dstl_forwarded_bytes_total",
        "dstl_driver_checkpoint_duration_seconds_bucket",
        "dstl_driver_materializations_total",
        "dstl_grpc_requests_total",
    ):
        assert metric in used, metric
    # unique panel ids, every panel on the data source variable
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"


# --------------------------------------------------------------- rendering
def render_all(chart: helm.Chart, values: dict[str, Any]) -> dict[str, list[Manifest]]:
    """Rendered objects by template path, the `helm test` pod included."""
    files = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return {
        path: [d for d in yaml.safe_load_all(text) if d]
        for path, text in files.items()
        if path.endswith(".yaml")
    }


def with_metrics(values: dict[str, Any], **metrics: Any) -> dict[str, Any]:
    return {**values, "metrics": {**values.get("metrics", {}), **metrics}}


def objects(chart: helm.Chart, values: dict[str, Any], kind: str) -> list[Manifest]:
    return [d for docs in render_all(chart, values).values() for d in docs if d["kind"] == kind]


RUNBOOKS = (Path(__file__).resolve().parents[2] / "docs" / "runbooks.md").read_text()


def test_monitoring_is_off_by_default(chart: helm.Chart) -> None:
    for config in CONFIGS.values():
        docs = [d for ds in render_all(chart, config).values() for d in ds]
        assert not {"PrometheusRule", "PodMonitor"} & {d["kind"] for d in docs}
        assert not any(d["metadata"]["name"].endswith("-dashboard") for d in docs)


def test_prometheus_rule_alerts_query_exported_metrics(
    chart: helm.Chart, exported_names: set[str]
) -> None:
    (rule,) = objects(chart, with_metrics({}, **ALL_MONITORING), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for r in rules:
        names = metric_names(r["expr"])
        assert names and not names - exported_names, (r["alert"], names - exported_names)
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["labels"]["team"] == "data"  # alertLabels
        assert r["annotations"]["summary"] and "{{ $labels." in r["annotations"]["summary"]
        assert "job=" not in r["expr"] and "(job)" not in r["expr"]
        # every alert links its own section of docs/runbooks.md
        url = r["annotations"]["runbook_url"]
        base, anchor = url.split("#")
        assert base.endswith("/docs/runbooks.md") and anchor == r["alert"].lower()
        assert f"\n## {r['alert']}\n" in RUNBOOKS, r["alert"]
    by_name = {r["alert"]: r for r in rules}
    assert "> 0.05" in by_name["DstlUploadErrorRate"]["expr"]
    assert (
        "0.8 * dstl_driver_checkpoint_timeout_seconds"
        in by_name["DstlCheckpointNearTimeout"]["expr"]
    )
    # thresholds come from the values
    tuned = with_metrics(
        {},
        prometheusRule={"enabled": True, "uploadErrorRatio": 0.2, "materializationGraceS": 60},
    )
    (rule,) = objects(chart, tuned, "PrometheusRule")
    exprs = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "> 0.2" in exprs["DstlUploadErrorRate"]
    assert "+ 60)" in exprs["DstlMaterializationStuck"]


def test_dashboard_config_map(chart: helm.Chart) -> None:
    values = with_metrics(
        {}, dashboard={"enabled": True, "annotations": {"grafana_folder": "dstl"}}
    )
    (cm,) = [
        c
        for c in objects(chart, values, "ConfigMap")
        if c["metadata"]["name"].endswith("-dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "dstl"}
    assert json.loads(cm["data"]["dstl.json"]) == json.loads(DASHBOARD.read_text())
    for k8s in K8S_VERSIONS:
        kubernetes_validate.validate(cm, k8s, strict=True)


def test_pod_monitor_scrapes_the_executor_sidecars(chart: helm.Chart) -> None:
    values = with_metrics(SIDECAR, podMonitor={"enabled": True, "labels": {"release": "prom"}})
    docs = [d for ds in render_all(chart, values).values() for d in ds]
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    pod = executor_pod(docs)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    sidecar = container(pod["spec"], "dstl", init=True)
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in sidecar["ports"]}
    assert endpoint["path"] == "/metrics"
    other = with_metrics(
        SIDECAR, podMonitor={"enabled": True, "namespaces": ["spark-a", "spark-b"]}
    )
    (monitor,) = objects(chart, other, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["spark-a", "spark-b"]
    # the other modes have a Service: a PodMonitor there is a mistake
    with pytest.raises(helm.HelmRenderError, match=r"metrics\.podMonitor is for mode sidecar"):
        render_all(chart, with_metrics({}, podMonitor={"enabled": True}))


def test_chart_with_monitoring_lints_clean(chart: helm.Chart) -> None:
    for values in (
        with_metrics({}, **ALL_MONITORING),
        with_metrics(SIDECAR, podMonitor={"enabled": True}, **ALL_MONITORING),
        with_metrics(TREE, **ALL_MONITORING),
    ):
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_values_schema_checks_the_monitoring_values(chart: helm.Chart) -> None:
    chart.validate_schema(with_metrics({}, **ALL_MONITORING))
    for bad in (
        {"prometheusRule": {"uploadErrorRatio": 2}},
        {"prometheusRule": {"nope": True}},
        {"podMonitor": {"interval": "soon"}},
        {"dashboard": {"labels": {"grafana_dashboard": 1}}},
    ):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(with_metrics({}, **bad))


# ---------------------------------------------------------------- helm test
def helm_test_pods(chart: helm.Chart, values: dict[str, Any]) -> list[Manifest]:
    return [
        d
        for path, docs in render_all(chart, values).items()
        if "/templates/tests/" in path
        for d in docs
    ]


@pytest.mark.parametrize("config", CONFIGS)
def test_helm_test_pod_is_valid_kubernetes(chart: helm.Chart, config: str) -> None:
    pods = helm_test_pods(chart, CONFIGS[config])
    if CONFIGS[config].get("mode") == "sidecar":
        assert pods == []  # no standing dstl-server to test
        return
    (pod,) = pods
    assert pod["kind"] == "Pod"
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (check,) = pod["spec"]["containers"]
    assert check["securityContext"]["readOnlyRootFilesystem"] is True
    service = f"{RELEASE}-tree" if config == "tree" else RELEASE
    assert check["command"][3:] == [f"{service}.{NAMESPACE}.svc", "9464"]
    for k8s in K8S_VERSIONS:
        kubernetes_validate.validate(pod, k8s, strict=True)
    assert helm_test_pods(chart, {**CONFIGS[config], "helmTest": {"enabled": False}}) == []


def _run_check(pod: Manifest, host: str, port: int) -> subprocess.CompletedProcess[str]:
    command = pod["spec"]["containers"][0]["command"]
    return subprocess.run(
        [sys.executable, *command[1:3], host, str(port)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_helm_test_passes_against_a_real_sidecar(chart: helm.Chart, tmp_path: Path) -> None:
    (pod,) = helm_test_pods(chart, {})
    with ServerProcess(tmp_path / "srv") as proc:
        result = _run_check(pod, "127.0.0.1", proc.metrics_port)
    assert result.returncode == 0, result.stderr
    assert f"http://127.0.0.1:{proc.metrics_port}/metrics: ok" in result.stdout


class _Metrics(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'dstl_build_info{python="3.12",version="0.1.0"} 1.0\ndstl_store_up 0.0\n', "store"),
        (b"process_open_fds 7.0\n", "no dstl_build_info"),
    ],
)
def test_helm_test_fails_without_a_store_or_a_sidecar(
    chart: helm.Chart, body: bytes, why: str
) -> None:
    (pod,) = helm_test_pods(chart, {})
    handler = type("Handler", (_Metrics,), {"body": body})
    httpd = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        result = _run_check(pod, "127.0.0.1", httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
    assert result.returncode == 1 and why in result.stderr
    httpd_port = httpd.server_address[1]
    closed = _run_check(pod, "127.0.0.1", httpd_port)  # nothing listens any more
    assert closed.returncode == 1 and "refused" in closed.stderr.lower()
