"""Kubernetes attribution: the kubelet PodResources v1 API over its unix socket.

``List`` says which pod/container holds which device (GPU UUID or MIG device id), even
when nothing runs on it. The few proto3 messages are built at runtime with protobuf's
descriptor API (no generated code, no grpcio-tools). When the kubelet does not answer,
the pod UID in ``/proc/<pid>/cgroup`` of GPU processes is the fallback, and the kubelet's pod
log directory (``/var/log/pods/<namespace>_<pod>_<uid>/<container>/``, written by the kubelet
for every pod on the node whatever the runtime) names that pod, so its GPUs get the same job
as through the API (a PyTorchJob's pods grouped by name too).
"""

from __future__ import annotations

import logging
import os
import re
import time
from functools import cache
from pathlib import Path
from typing import Any

from gpufleet.pod_jobs import DEFAULT as DEFAULT_POD_JOBS
from gpufleet.pod_jobs import PodJobs
from gpufleet.protocol import GpuInfo, JobInfo

from ..sources.base import GpuReading, SourceAttribution
from .procfs import pod_uid_from_cgroup, read_text

log = logging.getLogger(__name__)

SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")


@cache
def messages() -> dict[str, Any]:
    """Message classes for ListPodResourcesRequest/Response (kubelet podresources v1)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="gpufleet_podresources_v1.proto", package="v1", syntax="proto3")

    def msg(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, num, typ, label, type_name in fields:
            f = m.field.add(name=fname, number=num, type=typ, label=label)
            if type_name:
                f.type_name = type_name

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    msg("ListPodResourcesRequest")
    msg("ContainerDevices", ("resource_name", 1, F.TYPE_STRING, opt, ""), ("device_ids", 2, F.TYPE_STRING, rep, ""))
    msg("ContainerResources", ("name", 1, F.TYPE_STRING, opt, ""),
        ("devices", 2, F.TYPE_MESSAGE, rep, ".v1.ContainerDevices"))
    msg("PodResources", ("name", 1, F.TYPE_STRING, opt, ""), ("namespace", 2, F.TYPE_STRING, opt, ""),
        ("containers", 3, F.TYPE_MESSAGE, rep, ".v1.ContainerResources"))
    msg("ListPodResourcesResponse", ("pod_resources", 1, F.TYPE_MESSAGE, rep, ".v1.PodResources"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
            for name in ("ListPodResourcesRequest", "ListPodResourcesResponse", "PodResources",
                         "ContainerResources", "ContainerDevices")}


def list_pod_resources(socket_path: Path, timeout_s: float = 2.0) -> Any:
    """One ``List`` call; raises grpc.RpcError when the kubelet does not answer."""
    import grpc

    m = messages()
    with grpc.insecure_channel(f"unix://{socket_path}") as ch:
        call = ch.unary_unary(LIST_METHOD, request_serializer=m["ListPodResourcesRequest"].SerializeToString,
                              response_deserializer=m["ListPodResourcesResponse"].FromString)
        return call(m["ListPodResourcesRequest"](), timeout=timeout_s)


def gpu_owners(resp: Any) -> dict[str, tuple[str, str, str]]:
    """Device id (GPU or MIG UUID) -> (namespace, pod, container)."""
    out = {}
    for pod in resp.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                if d.resource_name.startswith(GPU_RESOURCES):
                    for dev_id in d.device_ids:
                        out[dev_id] = (pod.namespace or "default", pod.name, c.name)
    return out


_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$|^[0-9a-f]{32}$")


def pods_by_uid(pod_log_dir: Path) -> dict[str, tuple[str, str, str]]:
    """Pod UID -> (namespace, pod, its directory) from the kubelet's pod log directory, whose
    entries are ``<namespace>_<pod>_<uid>`` (namespaces and pod names are DNS labels and
    subdomains: no ``_``, so the split is exact; a static pod's UID is its 32-hex config hash).
    One listing, no look inside the entries. An entry of another shape is skipped; a missing or
    unreadable directory is an empty map."""
    out: dict[str, tuple[str, str, str]] = {}
    try:
        entries = list(os.scandir(pod_log_dir))
    except OSError:
        return out
    for e in entries:
        parts = e.name.split("_")
        if len(parts) != 3 or not all(parts) or not _UID.match(parts[2]) or not e.is_dir():
            continue
        out[parts[2]] = (parts[0], parts[1], e.path)
    return out


def only_container(pod_dir: str) -> str | None:
    """The pod's container when its log directory holds exactly one, else None."""
    try:
        ctrs = [c.name for c in os.scandir(pod_dir) if c.is_dir()]
    except OSError:
        return None
    return ctrs[0] if len(ctrs) == 1 else None


class KubernetesAttributor:
    name = "kubernetes"

    def __init__(self, socket_path: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
                 proc_root: Path = Path("/proc"), ttl_s: float = 5.0, timeout_s: float = 2.0,
                 pod_jobs: PodJobs = DEFAULT_POD_JOBS, pod_log_dir: Path = Path("/var/log/pods")) -> None:
        self.pod_jobs = pod_jobs
        self.socket_path = Path(socket_path)
        self.proc_root = Path(proc_root)
        self.pod_log_dir = Path(pod_log_dir)
        self._pod_dirs: dict[str, tuple[str, str, str]] = {}  # the last listing (pods_by_uid)
        self._pod_names: dict[str, tuple[str, str, str | None]] = {}  # UIDs named so far
        self._pod_names_at = -1e18
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._owners: dict[str, tuple[str, str, str]] = {}
        self._fetched = -1e18
        self._last_error_log = 0.0
        self.errors = 0

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._fetched < self.ttl_s:
            return
        self._fetched = now
        try:
            self._owners = gpu_owners(list_pod_resources(self.socket_path, self.timeout_s))
        except Exception as e:  # grpc.RpcError and socket errors: fall back to cgroups
            self.errors += 1
            self._owners = {}
            if now - self._last_error_log > 60:
                self._last_error_log = now
                log.warning("kubelet PodResources at %s unavailable (%s): attributing by pod UID from cgroups",
                            self.socket_path, e.details() if hasattr(e, "details") else e)

    def attribute(self, devices: list[GpuInfo], readings: list[GpuReading], now: float) -> SourceAttribution:
        self._refresh()
        a = SourceAttribution()
        for d in devices:
            owner = self._owners.get(d.uuid)
            if owner is None:
                continue
            ns, pod, container = owner
            # a PyTorchJob's or JobSet's pods are one job (gpufleet/pod_jobs.py), else the pod
            info = self.pod_jobs.job(ns, pod, container)
            a.gpu_job[d.uuid] = info.job_id
            a.jobs.setdefault(info.job_id, info)
        for r in readings:
            if r.uuid in a.gpu_job:
                continue
            for pid in r.pids:
                text = read_text(self.proc_root, pid, "cgroup")
                uid = pod_uid_from_cgroup(text) if text else None
                if uid:
                    named = self._pod_name(uid)
                    if named is not None:  # the job the API would have given (grouped or the pod)
                        info = self.pod_jobs.job(*named)
                    else:
                        info = JobInfo(job_id=f"pod-uid/{uid}", source="kubernetes", labels={"pod_uid": uid})
                    a.gpu_job[r.uuid] = info.job_id
                    a.jobs.setdefault(info.job_id, info)
                    break
        return a

    def _pod_name(self, uid: str) -> tuple[str, str, str | None] | None:
        """(namespace, pod, container) of a pod UID, from the pod log directory: listed again
        when a UID is not in it, at most every ttl_s (a pod started since the last listing);
        only a named pod's own directory is looked into, once."""
        named = self._pod_names.get(uid)
        if named is not None:
            return named
        found = self._pod_dirs.get(uid)
        now = time.monotonic()
        if found is None and now - self._pod_names_at >= self.ttl_s:
            self._pod_names_at = now
            self._pod_dirs = pods_by_uid(self.pod_log_dir)
            self._pod_names = {u: n for u, n in self._pod_names.items() if u in self._pod_dirs}  # gone pods
            found = self._pod_dirs.get(uid)
        if found is None:
            return None
        ns, pod, where = found
        named = self._pod_names[uid] = (ns, pod, only_container(where))
        return named
