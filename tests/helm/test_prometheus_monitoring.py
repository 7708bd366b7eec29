"""helm/gpufleet/templates/prometheus-monitoring.yaml: ServiceMonitor, PodMonitor and
PrometheusRule, off by default; they select what the chart deploys; the rules pass promtool
(syntax and unit tests of the alerts) and name only metrics gpufleet really exposes."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.helm.test_helm_chart import REPO, REQUIRED, SCHEMA, VALUES, _kind, _render, needs_helm

ON = [*REQUIRED, "prometheus.serviceMonitor.enabled=true", "prometheus.podMonitor.enabled=true",
      "prometheus.rules.enabled=true", "prometheus.serviceMonitor.labels.release=kps"]


@pytest.mark.parametrize(("path", "value"), [
    ("serviceMonitor.interval", "30 seconds"), ("rules.exportQueueFullRatio", 2), ("podMonitor.typo", 1),
    ("rules.spoolBytes", 0), ("rules.labels", {"a": 1})])
def test_schema_rejects_broken_monitoring_values(path: str, value: Any) -> None:
    v = copy.deepcopy(VALUES)
    node = v["prometheus"]
    *parents, leaf = path.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(v, SCHEMA)


@needs_helm
def test_off_by_default_and_selecting_what_the_chart_deploys() -> None:
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & {d["kind"] for d in _render()}
    docs = _render(sets=ON)
    sm = _kind(docs, "ServiceMonitor")
    svc = _kind(docs, "Service")
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    pm = _kind(docs, "PodMonitor")
    ds = _kind(docs, "DaemonSet")
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in c["ports"]}
    rule = _kind(docs, "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {"GpufleetIngestErrors", "GpufleetRemoteWriteErrors", "GpufleetAgentSpoolGrowing",
                      "GpufleetAnalysisLagging", "GpufleetExportQueueFull"}
    no_agent = _render(sets=[*ON, "agent.enabled=false"])
    assert not [d for d in no_agent if d["kind"] == "PodMonitor"]


def _exposed_metric_names() -> set[str]:
    names: set[str] = set()
    for folder in ("agent", "api", "collector", "analysis", "alerts", "storage"):
        for p in (REPO / folder).rglob("*.py"):
            names |= set(re.findall(r'"(gpufleet_[a-z0-9_]+)"', p.read_text()))
    return names


def _rule_tests(rule: dict[str, Any]) -> dict[str, Any]:
    desc = {r["alert"]: r["annotations"]["description"] for g in rule["spec"]["groups"] for r in g["rules"]}
    series = [("gpufleet_export_queue_bytes{pod='s-0'}", "950x20"),
              ("gpufleet_export_queue_max_bytes{pod='s-0'}", "1000x20"),
              ("gpufleet_agent_spool_bytes{node='gpu-7'}", "300000000+10000000x40"),
              ("gpufleet_analysis_lag_seconds", "60x40")]
    cases = [
        {"eval_time": "10m", "alertname": "GpufleetExportQueueFull", "exp_alerts": [
            {"exp_labels": {"severity": "critical", "pod": "s-0"},
             "exp_annotations": {"summary": "gpufleet remote-write export queue of s-0 is full or dropping samples",
                                 "description": desc["GpufleetExportQueueFull"]}}]},
        {"eval_time": "40m", "alertname": "GpufleetAgentSpoolGrowing", "exp_alerts": [
            {"exp_labels": {"severity": "warning", "node": "gpu-7"},
             "exp_annotations": {"summary": "gpufleet agent spool on gpu-7 is growing (667.6MiB)",
                                 "description": desc["GpufleetAgentSpoolGrowing"]}}]},
        {"eval_time": "40m", "alertname": "GpufleetAnalysisLagging", "exp_alerts": []},  # 60 s is no lag
    ]
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": [{"series": k, "values": v} for k, v in series],
                       "alert_rule_test": cases}]}


@needs_helm
def test_rules_pass_promtool_and_name_only_exposed_metrics(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed; scripts/test.sh installs Debian's prometheus (it ships promtool)")
    rule = _kind(_render(sets=ON), "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    res = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_rule_tests(rule)))
    res = subprocess.run([promtool, "test", "rules", "tests.yaml"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    exposed = _exposed_metric_names()
    for g in rule["spec"]["groups"]:
        for r in g["rules"]:
            for name in re.findall(r"gpufleet_[a-z0-9_]+", r["expr"]):
                assert name.removesuffix("_total") in exposed, (r["alert"], name)
