"""Scrape inference engines' own metrics endpoints and fold them into per-minute replica records.

Which endpoint belongs to which replica, three ways:

* Kubernetes pod annotations (``targets_from_pods``): a pod annotated
  ``gpufleet.io/serving-engine: vllm`` (or sglang, tgi, triton, dynamo) is scraped at
  ``http://<podIP>:<gpufleet.io/serving-port or prometheus.io/port>/<…path, default /metrics>``;
  its deployment is ``gpufleet.io/deployment`` (else the ``app.kubernetes.io/name`` or ``app``
  label, else the pod name without its ReplicaSet hashes); ``gpufleet.io/slo-*`` annotations set
  the deployment's SLO (docs/serving.md). The agent lists the node's pods from the kubelet or the
  API server (agent/sources/kubelet_pods.py) and keeps the Running ones whose GPUs the
  attribution gives a job on this node (``targets_from_node_pods``).
* A configured port per workload (``targets_from_config``): ``{"job": glob on the job id, "engine",
  "port", "path"?, "deployment"?}`` for jobs the attribution found on this node.
* On Slurm (or any bare process), the serving process's own port (``listening_ports``): the TCP
  ports its processes listen on, read from /proc (the root is injected, as everywhere in the agent).

The replica's GPUs are the GPUs the existing GPU -> job attribution gives its job; the scrape only
names the job. Fetching is injected (``fetch(url) -> text``) so tests serve real pages over HTTP
or hand them in. Pure folding lives in gpufleet/serving_expo.py.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.pod_jobs import PodJobs
from gpufleet.serving_expo import ExpositionError, MinuteFolder, measures_to_json, parse_exposition, snapshot
from gpufleet.serving_metrics import serving_registry

ANNOTATION_ENGINE = "gpufleet.io/serving-engine"
ANNOTATION_PORT = "gpufleet.io/serving-port"
ANNOTATION_PATH = "gpufleet.io/serving-path"
ANNOTATION_DEPLOYMENT = "gpufleet.io/deployment"
SLO_PREFIX = "gpufleet.io/slo-"
_HASHES = re.compile(r"(-[a-z0-9]{8,10})?-[a-z0-9]{5}$")  # <deployment>-<replicaset hash>-<pod hash>


@dataclass(frozen=True, slots=True)
class ServingTarget:
    deployment: str
    replica: str  # the job id the attribution uses for the replica's GPUs (namespace/pod, Slurm job id)
    engine: str
    url: str
    slo_labels: tuple[tuple[str, str], ...] = ()


def targets_from_pods(pods: Iterable[Mapping[str, Any]]) -> tuple[list[ServingTarget], list[str]]:
    """Targets from pod objects (the kubelet's /pods or the API's list); and why a pod was skipped."""
    engines = serving_registry().engines
    out, skipped = [], []
    for pod in pods:
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        engine = ann.get(ANNOTATION_ENGINE)
        if engine is None:
            continue
        name, ns = str(meta.get("name", "")), str(meta.get("namespace", "default"))
        ip = (pod.get("status") or {}).get("podIP")
        port = ann.get(ANNOTATION_PORT) or ann.get("prometheus.io/port")
        if engine not in engines:
            skipped.append(f"{ns}/{name}: {ANNOTATION_ENGINE}={engine!r} is not one of {sorted(engines)}")
            continue
        if not ip or not str(port or "").isdigit():
            skipped.append(f"{ns}/{name}: no pod IP yet or no {ANNOTATION_PORT} (a port number)")
            continue
        path = ann.get(ANNOTATION_PATH) or ann.get("prometheus.io/path") or "/metrics"
        labels = meta.get("labels") or {}
        deployment = (ann.get(ANNOTATION_DEPLOYMENT) or labels.get("app.kubernetes.io/name") or labels.get("app")
                      or _HASHES.sub("", name))
        slo = tuple(sorted((k, str(v)) for k, v in ann.items() if k.startswith(SLO_PREFIX)))
        host = f"[{ip}]" if ":" in str(ip) else ip  # an IPv6 pod IP
        out.append(ServingTarget(str(deployment), f"{ns}/{name}", engine, f"http://{host}:{port}{path}", slo))
    return out, skipped


def targets_from_node_pods(pods: Iterable[Mapping[str, Any]], jobs: Collection[str],
                           pod_jobs: PodJobs) -> tuple[list[ServingTarget], list[str]]:
    """Targets of this node's Running annotated pods whose GPUs the attribution gives a job here.

    The replica is named as the Kubernetes attribution names the pod's job
    (agent/attribution/kubernetes.py): ``<namespace>/<pod>``, or the group a PyTorchJob's or
    JobSet's pods share (gpufleet/pod_jobs.py), or ``pod-uid/<uid>`` when the attribution found
    the pod only by its UID. So the replica's GPUs are that job's GPUs on this node. One replica per
    job: a second annotated pod of a grouped job is skipped, with the reason. A grouped pod with no
    deployment annotation or label is in the deployment named after its group."""
    running = sorted((p for p in pods if (p.get("status") or {}).get("phase") == "Running"),
                     key=lambda p: (str((p.get("metadata") or {}).get("namespace", "default")),
                                    str((p.get("metadata") or {}).get("name", ""))))
    uids = {f"{m.get('namespace', 'default')}/{m.get('name', '')}": m.get("uid")
            for m in ((p.get("metadata") or {}) for p in running)}
    targets, skipped = targets_from_pods(running)
    out: list[ServingTarget] = []
    seen: dict[str, str] = {}
    for t in targets:
        ns, name = t.replica.split("/", 1)
        info = pod_jobs.job(ns, name)
        named = info.job_id
        uid = uids.get(t.replica)
        job = next((j for j in (named, f"pod-uid/{uid}" if uid else None) if j is not None and j in jobs), None)
        if job is None:
            skipped.append(f"{t.replica}: no GPU on this node is attributed to its job {named}")
        elif job in seen:
            skipped.append(f"{t.replica}: its job {job} is scraped already, from {seen[job]} (one replica per job)")
        else:
            seen[job] = t.replica
            grouped = job == named and info.name != name  # a deployment named after one of its pods: the group
            deployment = info.name if grouped and t.deployment == _HASHES.sub("", name) else t.deployment
            out.append(dataclasses.replace(t, replica=job, deployment=str(deployment)))
    return out, skipped


def targets_from_config(rules: Iterable[Mapping[str, Any]], job_ids: Iterable[str],
                        host: str = "127.0.0.1") -> list[ServingTarget]:
    """Targets for the jobs on this node that a configured rule names (first rule that matches)."""
    out = []
    for job in sorted(set(job_ids)):
        for rule in rules:
            if fnmatch.fnmatchcase(job, str(rule.get("job", "*"))):
                path = str(rule.get("path", "/metrics"))
                out.append(ServingTarget(str(rule.get("deployment") or job), job, str(rule["engine"]),
                                         f"http://{host}:{int(rule['port'])}{path}"))
                break
    return out


def listening_ports(proc_root: Path, pids: Iterable[int]) -> list[int]:
    """TCP ports the processes listen on (IPv4 and IPv6), from /proc/<pid>/fd and /proc/<pid>/net/tcp*."""
    ports: set[int] = set()
    for pid in pids:
        inodes = set()
        try:
            for fd in (proc_root / str(pid) / "fd").iterdir():
                try:
                    target = str(fd.readlink())
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
        for table in ("tcp", "tcp6"):
            try:
                lines = (proc_root / str(pid) / "net" / table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                parts = line.split()
                if len(parts) > 9 and parts[3] == "0A" and parts[9] in inodes:  # 0A = LISTEN
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


@dataclass
class ServingScraper:
    """Scrapes each target and hands out whole minutes as intake records (gpufleet.serving_expo.MinuteFolder)."""

    fetch: Callable[[str], str]
    targets: dict[tuple[str, str], ServingTarget] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # url -> the last failure (surfaced, not hidden)
    folder: MinuteFolder = field(default_factory=MinuteFolder)  # bounded while the collector is away

    def set_targets(self, targets: Iterable[ServingTarget]) -> None:
        new = {(t.deployment, t.replica): t for t in targets}
        # a target whose endpoint or engine changed starts afresh (its counters are another engine's)
        self.folder.forget(k for k, t in new.items() if self.targets.get(k) == t)
        self.targets = new

    def scrape(self, now: float) -> None:
        for key, t in self.targets.items():
            try:
                snap = snapshot(parse_exposition(self.fetch(t.url)), t.engine)
            except (OSError, ExpositionError, ValueError) as e:
                self.errors[t.url] = f"{type(e).__name__}: {e}"
                continue
            self.errors.pop(t.url, None)
            self.folder.add(key, now, snap)

    def drain(self, now: float, gpus_of: Callable[[str], list[str]]) -> list[dict[str, Any]]:
        """Records of the minutes that ended before ``now`` (each once); ``gpus_of(job)`` is the GPU
        -> job attribution's answer for the replica's job."""
        out = []
        for key, minute, measures in self.folder.drain(now):
            t = self.targets.get(key)
            if t is None:
                continue
            uuids = gpus_of(t.replica)
            out.append({"deployment": t.deployment, "replica": t.replica, "minute": minute, "engine": t.engine,
                        "gpus": len(uuids), "gpu_uuids": uuids, "job_id": t.replica,
                        "measures": measures_to_json(measures)})
        return out

    def deployment_labels(self) -> dict[str, dict[str, str]]:
        return {t.deployment: dict(t.slo_labels) for t in self.targets.values() if t.slo_labels}
