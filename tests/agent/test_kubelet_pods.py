"""Serving replicas found from pod annotations (agent/sources/kubelet_pods.py, docs/serving.md).

A fake kubelet serves its authenticated ``/pods`` over real HTTPS (a self-signed certificate made
with the openssl CLI, a bearer token it checks), and the API server's
``/api/v1/pods?fieldSelector=spec.nodeName=...`` the same way. The pods it lists are shaped like a
real kubelet's answer: the fields and nesting of ``pkg/util/kubernetes/kubelet/testdata/
podlist_container_ready.json`` in DataDog/datadog-agent (captured from a kubelet's ``/pods``:
``kind: PodList``, ``apiVersion: v1``, an empty list ``metadata``, and per pod ``metadata`` with
uid, labels, annotations including ``kubernetes.io/config.seen`` and ``config.source``,
``ownerReferences``; ``spec.nodeName`` and containers; ``status`` with phase, conditions, hostIP,
podIP and containerStatuses), plus ``podIPs``, which kubelets since 1.16 add. The GPUs are the
Kubernetes attribution's (the kubelet PodResources gRPC fake of test_kubernetes.py over fake NVML),
and the engine is the serving simulator's vLLM pages on 127.0.0.1 standing in for the pod IP.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.attribution.kubernetes import KubernetesAttributor
from gpufleet.agent.config import AgentConfig, load_config
from gpufleet.agent.runner import Agent
from gpufleet.agent.serving_section import ServingSection
from gpufleet.agent.sources.base import GpuReading
from gpufleet.agent.sources.kubelet_pods import PodLister, default_base_url, parse_pod_list, pods_url
from gpufleet.agent.sources.nvml import NvmlSource
from gpufleet.agent.sources.serving_scrape import targets_from_node_pods
from gpufleet.pod_jobs import PodJobs
from gpufleet.protocol import GpuInfo
from tests.raw_samples_helpers import raw_count
from tests.serving.test_agent_serving import _deliver
from tests.serving.test_serving_scrape import engine_server  # noqa: F401  (the fixture)

from ..support.fake_nvml import FakeNvml, h100
from .test_attribution import fake_proc
from .test_kubernetes import FakeKubelet, sock  # noqa: F401  (sock: the fixture)

NODE = "gpu-node-7"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.fake-service-account-token"
T0 = int(time.time() // 60 * 60) - 20 * 60  # the scrapes start 20 minutes ago, on a minute


def kubelet_pod(name: str, *, ns: str = "ml", uid: str, ip: str | None = "127.0.0.1", phase: str = "Running",
                annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                gpus: int = 0, node: str = NODE, owner: tuple[str, str] | None = None) -> dict[str, Any]:
    """One item of the kubelet's /pods, in the shape of the capture cited in the module docstring."""
    limits = {"cpu": "8", "memory": "64Gi"} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    started = {"running": {"startedAt": "2026-12-07T18:00:05Z"}} if phase == "Running" else \
        {"waiting": {"reason": "ContainerCreating"}}
    meta: dict[str, Any] = {
        "name": name, "namespace": ns, "uid": uid, "resourceVersion": "48211",
        "creationTimestamp": "2026-12-07T18:00:00Z",
        "labels": labels or {},
        "annotations": {"kubernetes.io/config.seen": "2026-12-07T18:00:00.068047648Z",
                        "kubernetes.io/config.source": "api"} | (annotations or {})}
    if owner is not None:
        meta["generateName"] = name.rsplit("-", 1)[0] + "-"
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                    "uid": "31417f22-85f7-11e9-892f-02c6fa0ccfb0", "controller": True,
                                    "blockOwnerDeletion": True}]
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": t, "status": "True" if phase == "Running" else "False", "lastProbeTime": None,
                        "lastTransitionTime": "2026-12-07T18:00:04Z"}
                       for t in ("Initialized", "Ready", "PodScheduled")],
        "hostIP": "10.0.2.15", "startTime": "2026-12-07T18:00:00Z",
        "containerStatuses": [{"name": "engine", "state": started, "lastState": {}, "ready": phase == "Running",
                               "restartCount": 0, "image": "vllm/vllm-openai:v0.11.0",
                               "imageID": "", "containerID": "containerd://bfcd62d56d00667d8026c822c0061b56"}],
        "qosClass": "Guaranteed"}
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {"metadata": meta,
            "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
                                     "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                                     "resources": {"limits": limits, "requests": limits},
                                     "terminationMessagePath": "/dev/termination-log",
                                     "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
                     "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                     "serviceAccountName": "default", "serviceAccount": "default", "nodeName": node,
                     "securityContext": {}, "schedulerName": "default-scheduler"},
            "status": status}


def pod_list(*pods: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(pods)}


def serving(port: int, **extra: str) -> dict[str, str]:
    return {"gpufleet.io/serving-engine": "vllm", "gpufleet.io/serving-port": str(port)} | extra


class FakeKubeletApi:
    """The kubelet's /pods (and the API server's node-filtered pod list) over HTTPS with a bearer
    token. ``mode``: ok, garbage (a 200 that is not JSON), forbidden (403), down (closes)."""

    def __init__(self, cert: Path | None, key: Path | None, token: str = TOKEN) -> None:
        self.pods: list[dict[str, Any]] = []
        self.mode = "ok"
        self.requests: list[tuple[str, str | None]] = []  # (path with query, Authorization)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append((self.path, self.headers.get("Authorization")))
                url = urllib.parse.urlsplit(self.path)
                if self.headers.get("Authorization") != f"Bearer {token}":
                    return self._send(401, b"Unauthorized", "text/plain")
                if outer.mode == "forbidden":
                    body = (b"Forbidden (user=system:serviceaccount:gpu:rel-gpufleet, verb=get, resource=nodes, "
                            b"subresource=pods)")
                    return self._send(403, body, "text/plain")
                if outer.mode == "garbage":
                    return self._send(200, b"<html>proxy error</html>", "text/html")
                if url.path == "/pods":
                    items = outer.pods
                elif url.path == "/api/v1/pods":
                    sel = urllib.parse.parse_qs(url.query).get("fieldSelector", [""])[0]
                    node = sel.removeprefix("spec.nodeName=")
                    items = [p for p in outer.pods if p["spec"]["nodeName"] == node]
                else:
                    return self._send(404, b"404 page not found", "text/plain")
                self._send(200, json.dumps(pod_list(*items)).encode(), "application/json")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if cert is not None and key is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if cert else 'http'}://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed serving certificate for 127.0.0.1 (as a kubelet's, with an IP SAN) and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make a test certificate")
    d = tmp_path_factory.mktemp("kubelet-tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2",
                    "-subj", f"/CN={NODE}", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return d / "cert.pem", d / "key.pem"


@pytest.fixture
def kubelet_api(tls: tuple[Path, Path]) -> Iterator[FakeKubeletApi]:
    k = FakeKubeletApi(*tls)
    yield k
    k.stop()


@pytest.fixture
def sa_dir(tmp_path: Path, tls: tuple[Path, Path]) -> Path:
    """/var/run/secrets/kubernetes.io/serviceaccount: the token and the CA that signed the server."""
    d = tmp_path / "serviceaccount"
    d.mkdir()
    (d / "token").write_text(TOKEN)
    shutil.copy(tls[0], d / "ca.crt")
    return d


def _lister(url: str, sa: Path, **kw: Any) -> PodLister:
    return PodLister("kubelet", NODE, base_url=url, token_file=sa / "token", ca_file=sa / "ca.crt", **kw)


# --- the shape of the answers -------------------------------------------------------------

def test_pod_lists_and_what_is_not_one() -> None:
    body = json.dumps(pod_list(kubelet_pod("a", uid="u1"), None)).encode()  # type: ignore[arg-type]
    (p,) = parse_pod_list(body)
    assert p["metadata"]["name"] == "a"
    for bad, why in ((b"<html>", "not JSON"), (b'{"kind": "Status", "code": 401}', "not a PodList"),
                     (b"[]", "not a PodList")):
        with pytest.raises(Exception, match=why):
            parse_pod_list(bad)
    assert pods_url("kubelet", "https://10.0.2.15:10250/", NODE) == "https://10.0.2.15:10250/pods"
    assert pods_url("apiserver", "https://10.96.0.1:443", NODE) == \
        f"https://10.96.0.1:443/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"
    assert default_base_url("kubelet", NODE) == f"https://{NODE}:10250"
    assert default_base_url("apiserver", NODE, {"KUBERNETES_SERVICE_HOST": "fd00::1",
                                                "KUBERNETES_SERVICE_PORT": "6443"}) == "https://[fd00::1]:6443"
    assert default_base_url("apiserver", NODE, {}) == "https://kubernetes.default.svc"


# --- the replica is named as the attribution names the pod's job --------------------------

DEVICES = [GpuInfo(index=i, uuid=f"GPU-{i}") for i in range(6)]


def test_replicas_are_named_as_the_kubernetes_attribution_names_jobs(sock: Path, tmp_path: Path) -> None:  # noqa: F811
    """The kubelet's PodResources (gRPC) gives the GPUs, the kubelet's /pods the annotations: a
    lone pod is its own job, a StatefulSet-like ``<set>-worker-<n>`` pod is grouped the Kubeflow
    way (gpufleet/pod_jobs.py) and only one replica is kept per job; a pod the attribution found by
    cgroup UID only is ``pod-uid/<uid>``; Pending pods, pods without GPUs on this node and
    annotations without a port are skipped with their reason."""
    uid_only = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
    grpc = FakeKubelet(sock)
    try:
        grpc.pods = [("ml", "chat-7d9f8b6c5d-x2k4p", "engine", "nvidia.com/gpu", ["GPU-0"]),
                     ("ml", "llama-worker-0", "engine", "nvidia.com/gpu", ["GPU-1", "GPU-2"]),
                     ("ml", "llama-worker-1", "engine", "nvidia.com/gpu", ["GPU-3"])]
        proc = tmp_path / "proc"  # GPU-4's process is in a pod the PodResources answer does not name
        fake_proc(proc, 91, f"0::/kubepods/burstable/pod{uid_only}/cri-abc\n")
        att = KubernetesAttributor(sock, proc_root=proc, ttl_s=60, pod_log_dir=tmp_path / "none")
        a = att.attribute(DEVICES, [GpuReading("GPU-4", pids=(91,))], 0.0)
    finally:
        grpc.stop()
    assert a.gpu_job == {"GPU-0": "ml/chat-7d9f8b6c5d-x2k4p", "GPU-1": "ml/llama", "GPU-2": "ml/llama",
                         "GPU-3": "ml/llama", "GPU-4": f"pod-uid/{uid_only}"}
    pods = [kubelet_pod("chat-7d9f8b6c5d-x2k4p", uid="u-chat", ip="10.1.0.5", gpus=1, owner=("ReplicaSet", "chat-7d9"),
                        annotations=serving(8000, **{"gpufleet.io/slo-preset": "mlperf-llama3.1-8b-interactive"}),
                        labels={"app.kubernetes.io/name": "chat"}),
            kubelet_pod("llama-worker-1", uid="u-l1", ip="10.1.0.7", gpus=1, annotations=serving(8000)),
            kubelet_pod("llama-worker-0", uid="u-l0", ip="10.1.0.6", gpus=2, annotations=serving(8000)),
            kubelet_pod("uid-only-0", uid=uid_only, ip="fd00:10:1::8", gpus=1, annotations=serving(9000)),
            kubelet_pod("chat-7d9f8b6c5d-zz9q1", uid="u-pend", ip=None, phase="Pending", annotations=serving(8000)),
            kubelet_pod("cpu-embedder-0", uid="u-cpu", ip="10.1.0.9", annotations=serving(8080)),
            kubelet_pod("no-port-0", uid="u-np", ip="10.1.0.10", annotations={"gpufleet.io/serving-engine": "vllm"}),
            kubelet_pod("trainer-0", uid="u-t", ip="10.1.0.11", gpus=1)]
    targets, skipped = targets_from_node_pods(pods, set(a.gpu_job.values()), PodJobs())
    assert [(t.deployment, t.replica, t.url) for t in targets] == [
        ("chat", "ml/chat-7d9f8b6c5d-x2k4p", "http://10.1.0.5:8000/metrics"),
        ("llama", "ml/llama", "http://10.1.0.6:8000/metrics"),  # worker-0: the first of the job's pods
        ("uid-only-0", f"pod-uid/{uid_only}", "http://[fd00:10:1::8]:9000/metrics")]
    assert targets[0].slo_labels == (("gpufleet.io/slo-preset", "mlperf-llama3.1-8b-interactive"),)
    assert sorted(s.split(":")[0] for s in skipped) == ["ml/cpu-embedder-0", "ml/llama-worker-1", "ml/no-port-0"]
    assert any("one replica per job" in s for s in skipped)
    # "none": every pod its own job, as the attribution then names them
    apart, _ = targets_from_node_pods(pods, {"ml/llama-worker-0", "ml/llama-worker-1"}, PodJobs(("none",)))
    assert [t.replica for t in apart] == ["ml/llama-worker-0", "ml/llama-worker-1"]


# --- listing over HTTPS: the token, the CA, and every way it fails --------------------------

def test_lists_over_https_with_the_token_and_the_ca(kubelet_api: FakeKubeletApi, sa_dir: Path) -> None:
    kubelet_api.pods = [kubelet_pod("a-0", uid="u1"), kubelet_pod("b-0", uid="u2", node="other-node")]
    lister = _lister(kubelet_api.url, sa_dir)
    assert [p["metadata"]["name"] for p in lister.current(0.0)] == ["a-0", "b-0"]  # the kubelet: its own pods
    assert lister.error is None and kubelet_api.requests == [("/pods", f"Bearer {TOKEN}")]
    (sa_dir / "token").write_text(TOKEN + "\n")  # read again each time (projected tokens rotate)
    api = PodLister("apiserver", NODE, base_url=kubelet_api.url, token_file=sa_dir / "token",
                    ca_file=sa_dir / "ca.crt")
    assert [p["metadata"]["name"] for p in api.current(0.0)] == ["a-0"]
    assert kubelet_api.requests[-1][0] == f"/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"


@pytest.mark.parametrize("case", ["unknown-ca", "skip-verify", "401", "no-token", "403", "garbage", "down"])
def test_a_failed_listing_is_recorded_and_the_last_good_one_kept(
        case: str, kubelet_api: FakeKubeletApi, sa_dir: Path, tmp_path: Path) -> None:
    kubelet_api.pods = [kubelet_pod("a-0", uid="u1")]
    lister = _lister(kubelet_api.url, sa_dir, retry_s=30.0)
    assert len(lister.current(0.0)) == 1
    n = len(kubelet_api.requests)
    if case in ("unknown-ca", "skip-verify"):
        other = tmp_path / "other-ca.crt"  # a CA that did not sign the kubelet's certificate
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(tmp_path / "k.pem"), "-out", str(other), "-days", "2",
                        "-subj", "/CN=other"], check=True, capture_output=True, timeout=60)
        lister.ca_file = other
        lister.insecure = case == "skip-verify"
        why = None if case == "skip-verify" else "CERTIFICATE_VERIFY_FAILED"
    elif case == "401":
        (sa_dir / "token").write_text("expired")
        why = "401 Unauthorized: the kubelet did not accept the token in"
    elif case == "no-token":
        (sa_dir / "token").unlink()
        why = "(there is none)"
    elif case == "403":
        kubelet_api.mode = "forbidden"
        why = "403 Forbidden: the service account needs RBAC get on nodes/pods"
    elif case == "garbage":
        kubelet_api.mode = "garbage"
        why = "not JSON"
    else:
        kubelet_api.stop()
        why = "ConnectError"
    kubelet_api.pods = []
    pods = lister.current(100.0)
    if why is None:
        assert pods == [] and lister.error is None
        return
    assert [p["metadata"]["name"] for p in pods] == ["a-0"], "the last good listing is kept"
    assert lister.error is not None and why in lister.error and lister.errors == 1
    tried = len(kubelet_api.requests)
    assert tried - n <= 1
    lister.current(110.0)  # less than retry_s after the failure: not asked again
    assert len(kubelet_api.requests) == tried and lister.errors == 1
    lister.current(131.0)  # retry_s later: asked again
    assert lister.errors == 2


# --- the agent end to end: fake NVML + the attribution -> pods -> engine -> collector ----------

@pytest.fixture
def node(sock: Path, tmp_path: Path) -> Iterator[tuple[FakeKubelet, list[str]]]:  # noqa: F811
    """Three fake-NVML GPUs; the kubelet's PodResources gives two to the serving pod llama-worker-0
    (grouped as job ml/llama) and one to trainer-0."""
    gpus = [h100(i, node=NODE) for i in range(3)]
    uuids = [g.uuid for g in gpus]
    grpc = FakeKubelet(sock)
    grpc.pods = [("ml", "llama-worker-0", "engine", "nvidia.com/gpu", uuids[:2]),
                 ("ml", "trainer-0", "main", "nvidia.com/gpu", uuids[2:])]
    yield grpc, uuids
    grpc.stop()


def _agent(tmp_path: Path, collector: str, sock: Path, uuids: list[str], **cfg: Any) -> Agent:  # noqa: F811
    gpus = [h100(i, node=NODE) for i in range(len(uuids))]
    config = AgentConfig(collector_url=collector, node=NODE, spool_dir=tmp_path / "spool", fsync=False,
                         infiniband=False, nic_health=False, gpm=False, **cfg)
    att = KubernetesAttributor(sock, proc_root=tmp_path / "proc", ttl_s=60, pod_log_dir=tmp_path / "none")
    return Agent(config, NvmlSource(FakeNvml(gpus), gpm=False, xid_events=False), [att], enrichers=[])


def test_agent_finds_the_pod_scrapes_it_and_the_collector_stores_its_replica_minutes(
        sqlite_url: str, live_server: Callable[..., Any], tmp_path: Path, sock: Path,  # noqa: F811
        node: tuple[FakeKubelet, list[str]], kubelet_api: FakeKubeletApi, sa_dir: Path,
        engine_server: tuple[str, list[str]]) -> None:  # noqa: F811
    _, uuids = node
    engine_url, pages = engine_server
    port = int(engine_url.split(":")[2].split("/")[0])
    kubelet_api.pods = [
        kubelet_pod("llama-worker-0", uid="u-l0", gpus=2, owner=("StatefulSet", "llama-worker"),
                    annotations=serving(port, **{"gpufleet.io/deployment": "llama-chat",
                                                 "gpufleet.io/slo-ttft-ms": "500", "gpufleet.io/slo-tpot-ms": "30"})),
        kubelet_pod("trainer-0", uid="u-t", gpus=1),
        kubelet_pod("llama-worker-9", uid="u-l9", ip=None, phase="Pending", annotations=serving(port)),
        kubelet_pod("kube-proxy-d9fx4", ns="kube-system", uid="u-kp", ip="10.0.2.15",
                    owner=("DaemonSet", "kube-proxy"))]
    srv = live_server(sqlite_url)
    agent = _agent(tmp_path, str(srv.url), sock, uuids, serving_pods="kubelet", serving_pods_url=kubelet_api.url,
                   serving_pods_token_file=sa_dir / "token", serving_pods_ca_file=sa_dir / "ca.crt")
    assert agent.serving is not None, "serving_pods alone turns the serving section on"
    agent.start()
    for i in range(len(pages)):  # one cycle per page, 15 s apart, as the simulator scraped them
        agent.cycle(T0 + 15 * i)
    (t,) = agent.serving.scraper.targets.values()
    assert (t.deployment, t.replica, t.url) == ("llama-chat", "ml/llama", engine_url)
    assert agent.serving.scraper.errors == {}
    assert sum(1 for p, _ in kubelet_api.requests if p == "/pods") == 1, "listed once per targets TTL"
    _deliver(agent)
    agent.serving.close()
    with httpx.Client(base_url=str(srv.url), timeout=60) as c:
        r = c.get("/api/v1/deployments/llama-chat", params={"start": str(T0), "end": str(T0 + 600)})
        assert r.status_code == 200, r.text
        doc = r.json()
    (rep,) = doc["replicas"]
    assert rep["replica"] == rep["job_id"] == "ml/llama" and rep["gpu_uuids"] == sorted(uuids[:2])
    assert doc["series"] and doc["summary"]["requests"] > 0
    slo = doc["summary"]["slo"]  # the pod's gpufleet.io/slo-* annotations, carried as the deployment's labels
    assert (slo["ttft_ms"], slo["tpot_ms"]) == pytest.approx((500, 30)), slo
    assert raw_count(sqlite_url) == 3 * len(pages)  # the GPU rows, all three GPUs


@pytest.mark.parametrize("case", ["down", "401", "garbage"])
def test_an_unreachable_kubelet_is_recorded_and_gpu_samples_still_arrive(
        case: str, sqlite_url: str, live_server: Callable[..., Any], tmp_path: Path, sock: Path,  # noqa: F811
        node: tuple[FakeKubelet, list[str]], kubelet_api: FakeKubeletApi, sa_dir: Path) -> None:
    _, uuids = node
    kubelet_api.pods = [kubelet_pod("llama-worker-0", uid="u-l0", gpus=2, annotations=serving(8000))]
    if case == "down":
        kubelet_api.stop()
    elif case == "401":
        (sa_dir / "token").write_text("revoked")
    else:
        kubelet_api.mode = "garbage"
    srv = live_server(sqlite_url)
    agent = _agent(tmp_path, str(srv.url), sock, uuids, serving_pods="kubelet", serving_pods_url=kubelet_api.url,
                   serving_pods_token_file=sa_dir / "token", serving_pods_ca_file=sa_dir / "ca.crt")
    agent.start()
    for i in range(5):
        agent.cycle(T0 + 15 * i)
    assert agent.serving is not None and agent.serving.pods is not None
    url = agent.serving.pods.url
    assert set(agent.serving.scraper.errors) == {url} and agent.serving.scraper.targets == {}
    assert {"down": "ConnectError", "401": "401", "garbage": "not JSON"}[case] in agent.serving.scraper.errors[url]
    agent.flush()
    deadline = time.monotonic() + 180
    while len(agent.spool) and time.monotonic() < deadline:
        agent.sender.send_one()
    agent.serving.close()
    assert raw_count(sqlite_url) == 3 * 5


def test_settings_from_the_environment_and_bad_ones_named(tmp_path: Path) -> None:
    cfg = load_config(None, {"GPUFLEET_SERVING_PODS": "apiserver", "GPUFLEET_NODE": NODE,
                             "GPUFLEET_SERVING_PODS_URL": "https://10.96.0.1:443",
                             "GPUFLEET_SERVING_PODS_INSECURE_SKIP_TLS_VERIFY": "true",
                             "GPUFLEET_SPOOL_DIR": str(tmp_path / "spool")})
    assert (cfg.serving_pods, cfg.serving_pods_insecure_skip_tls_verify) == ("apiserver", True)
    section = ServingSection(cfg)
    assert section.pods is not None and section.pods.url == \
        f"https://10.96.0.1:443/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}"
    section.close()
    assert load_config(None, {}).serving_pods == "off"
    with pytest.raises(ValueError, match="serving_pods 'etcd'"):
        load_config(None, {"GPUFLEET_SERVING_PODS": "etcd"})
    with pytest.raises(ValueError, match="serving_pods_url"):
        load_config(None, {"GPUFLEET_SERVING_PODS": "kubelet", "GPUFLEET_SERVING_PODS_URL": "10.0.2.15:10250"})

