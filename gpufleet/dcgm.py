"""dcgm-exporter's vocabulary as one shared mapping: which catalog field a series name is,
which GPU a label set names, which job it belongs to.

Two readers use it: the agent's dcgm-exporter source (the text exposition it scrapes) and the
collector's remote-write receiver (the same series, forwarded by Prometheus, vmagent, Alloy or
an OpenTelemetry Collector). It lives in core because the collector may not import the agent
(tests/test_layers.py), and two copies of these rules would drift. Pure functions over label
mappings: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gpufleet.catalog import CATALOG, Field
from gpufleet.pod_jobs import DEFAULT as DEFAULT_POD_JOBS
from gpufleet.pod_jobs import PodJobs
from gpufleet.protocol import JobInfo

BY_DCGM: dict[str, Field] = CATALOG.by_dcgm_name()
FB_FREE, FB_RESERVED = "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"
# Framebuffer free/reserved (MiB) are not catalog fields, but with FB_USED they give the total.
FB_EXTRA = (FB_FREE, FB_RESERVED)
MIB = 1048576.0

# Pod attribution label triples, newest spelling first. ``exported_*``: a Prometheus that
# scrapes dcgm-exporter through a ServiceMonitor attaches the exporter pod's own pod/namespace
# and renames the workload's labels to exported_pod/... (honor_labels: false), so those win.
POD_LABELS = (
    ("exported_pod", "exported_namespace", "exported_container"),
    ("pod", "namespace", "container"),
    ("pod_name", "pod_namespace", "container_name"),  # dcgm-exporter 1.x
)


def field_for(name: str) -> Field | None:
    """The catalog field a dcgm-exporter series name carries (old or DCGM 4.6 spelling; a
    ``_total`` suffix, which OpenMetrics and OTLP translation append to counters, is ignored)."""
    return BY_DCGM.get(name) or BY_DCGM.get(name.removesuffix("_total"))


def mig_uuid(parent: str, gi: str) -> str:
    # dcgm-exporter labels a MIG instance with its parent's UUID and GPU instance id only.
    return f"MIG-{parent.removeprefix('GPU-')}-gi{gi}"


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    uuid: str  # GPU-... or, for a MIG instance, MIG-<parent>-gi<id>
    index: int  # -1 when neither ``gpu`` nor ``device`` says
    model: str = ""
    mig_profile: str | None = None
    parent_uuid: str | None = None
    gi_id: int | None = None


def gpu_identity(labels: Mapping[str, str]) -> GpuIdentity | None:
    """The GPU (or MIG instance) a series is about, from ``UUID`` (``uuid`` in some exporters),
    ``gpu``/``device`` (index) and ``GPU_I_ID``/``GPU_I_PROFILE``; None without a UUID (the
    label-less placeholder series real dumps contain name no GPU)."""
    parent = (labels.get("UUID") or labels.get("uuid") or "").strip()
    if not parent:
        return None
    gi = labels.get("GPU_I_ID", "").strip()
    try:
        index = int(labels.get("gpu", "") or labels.get("device", "nvidia-1").removeprefix("nvidia"))
    except ValueError:
        index = -1
    if gi:
        return GpuIdentity(mig_uuid(parent, gi), index, labels.get("modelName", ""),
                           labels.get("GPU_I_PROFILE") or None, parent, int(gi) if gi.isdigit() else None)
    return GpuIdentity(parent, index, labels.get("modelName", ""))


def job_from_labels(labels: Mapping[str, str], pod_jobs: PodJobs = DEFAULT_POD_JOBS) -> JobInfo | None:
    """The job a GPU's series are attributed to: an explicit ``gpufleet_job`` (a relabel rule
    the operator writes), else dcgm-exporter's ``hpc_job`` (its Slurm job mapping), else the
    pod's: its owner where the pod's name says one (``namespace/<PyTorchJob or JobSet>``,
    gpufleet/pod_jobs.py), else ``namespace/pod``. ``gpufleet_user`` names the user."""
    user = labels.get("gpufleet_user", "").strip() or None
    explicit = labels.get("gpufleet_job", "").strip()
    hpc = labels.get("hpc_job", "").strip()
    if explicit or hpc:
        pod = _pod(labels)
        source: Literal["kubernetes", "slurm"] = "kubernetes" if explicit and pod is not None and not hpc else "slurm"
        return JobInfo(job_id=explicit or hpc, source=source, user=user)
    pod = _pod(labels)
    if pod is None:
        return None
    name, ns, container, uid = pod
    return pod_jobs.job(ns, name, container, uid, user=user)


def _pod(labels: Mapping[str, str]) -> tuple[str, str, str | None, str | None] | None:
    for pod_k, ns_k, ctr_k in POD_LABELS:
        pod = labels.get(pod_k, "").strip()
        if pod:
            ns = labels.get(ns_k, "").strip() or "default"
            return pod, ns, labels.get(ctr_k) or None, labels.get("pod_uid") or None
    return None
