"""Kubernetes attribution against a fake kubelet PodResources gRPC server on a unix socket."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpufleet.agent.attribution.kubernetes import SERVICE, KubernetesAttributor, messages
from gpufleet.agent.sources.base import GpuReading
from gpufleet.pod_jobs import PodJobs
from gpufleet.protocol import GpuInfo

from .test_attribution import fake_proc


class FakeKubelet:
    def __init__(self, sock: Path) -> None:
        self.pods: list[tuple[str, str, str, str, list[str]]] = []  # ns, pod, container, resource, ids
        self.calls = 0
        m = messages()

        def list_(request: object, context: object) -> object:
            self.calls += 1
            resp = m["ListPodResourcesResponse"]()
            for ns, pod, ctr, res, ids in self.pods:
                p = resp.pod_resources.add(name=pod, namespace=ns)
                c = p.containers.add(name=ctr)
                c.devices.add(resource_name=res, device_ids=ids)
            return resp

        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "List": grpc.unary_unary_rpc_method_handler(
                list_, request_deserializer=m["ListPodResourcesRequest"].FromString,
                response_serializer=m["ListPodResourcesResponse"].SerializeToString)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix:{sock}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def sock() -> Iterator[Path]:
    # unix socket paths are limited to ~107 bytes: pytest's tmp_path can be longer
    with tempfile.TemporaryDirectory(prefix="gf-kubelet-") as d:
        yield Path(d) / "kubelet.sock"


DEVICES = [GpuInfo(index=0, uuid="GPU-0"), GpuInfo(index=1, uuid="GPU-1"), GpuInfo(index=2, uuid="GPU-2"),
           GpuInfo(index=2, uuid="MIG-2a", mig_profile="1g.10gb", parent_uuid="GPU-2")]


def test_list_maps_gpus_to_pods_even_when_idle(sock: Path, tmp_path: Path) -> None:
    kubelet = FakeKubelet(sock)
    try:
        kubelet.pods = [("ml", "trainer-0", "main", "nvidia.com/gpu", ["GPU-0", "GPU-1"]),
                        ("ml", "infer-7", "srv", "nvidia.com/mig-1g.10gb", ["MIG-2a"]),
                        ("default", "web", "nginx", "cpu", ["0", "1"])]
        k = KubernetesAttributor(sock, proc_root=tmp_path, ttl_s=60)
        a = k.attribute(DEVICES, [GpuReading("GPU-0"), GpuReading("GPU-1")], 0.0)  # no processes at all
        assert a.gpu_job == {"GPU-0": "ml/trainer-0", "GPU-1": "ml/trainer-0", "MIG-2a": "ml/infer-7"}
        j = a.jobs["ml/trainer-0"]
        assert (j.source, j.namespace, j.name, j.labels["container"]) == ("kubernetes", "ml", "trainer-0", "main")
        k.attribute(DEVICES, [], 1.0)
        assert kubelet.calls == 1, "answers are cached for ttl_s"
    finally:
        kubelet.stop()


def test_pod_uid_from_cgroup_when_the_kubelet_is_away(sock: Path, tmp_path: Path) -> None:
    uid = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
    fake_proc(tmp_path, 77, f"0::/kubepods/burstable/pod{uid}/cri-abc\n")
    k = KubernetesAttributor(sock, proc_root=tmp_path, ttl_s=0, timeout_s=0.5,  # nothing listens on sock
                             pod_log_dir=tmp_path / "no-pod-logs")
    a = k.attribute(DEVICES, [GpuReading("GPU-1", pids=(77,)), GpuReading("GPU-0", pids=(78,))], 0.0)
    assert a.gpu_job == {"GPU-1": f"pod-uid/{uid}"} and k.errors == 1
    assert a.jobs[f"pod-uid/{uid}"].labels == {"pod_uid": uid}


def _pod_logs(root: Path, *pods: tuple[str, str, str, tuple[str, ...]]) -> Path:
    """The kubelet's /var/log/pods: <namespace>_<pod>_<uid>/<container>/0.log."""
    for ns, pod, uid, ctrs in pods:
        d = root / f"{ns}_{pod}_{uid}"
        d.mkdir(parents=True)
        for c in ctrs:
            (d / c).mkdir()
            (d / c / "0.log").write_text("")
    return root


def test_the_pod_log_dir_names_a_pod_found_by_cgroup_uid(sock: Path, tmp_path: Path) -> None:
    """The kubelet's API away: a GPU process's cgroup gives the pod UID, the pod log directory
    the pod's name, so its GPUs get the job the API would give: a PyTorchJob's pods are one
    job, a lone pod is itself with its one container; a pod missing from the listing (started
    since, or an entry of another shape) keeps the UID job."""
    u1, u2, u3, u4 = ("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5" + c for c in "bcde")
    logs = _pod_logs(tmp_path / "pods", ("ml", "llm-worker-0", u1, ("pytorch",)),
                     ("ml", "llm-worker-1", u2, ("pytorch", "sidecar")), ("ml", "solo-0", u3, ("main",)))
    (logs / f"odd_name_with_{u4}").mkdir()  # not <namespace>_<pod>_<uid>: skipped
    proc = tmp_path / "proc"
    for pid, uid in ((71, u1), (72, u2), (73, u3), (74, u4)):
        fake_proc(proc, pid, f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-ab.scope\n")
    k = KubernetesAttributor(sock, proc_root=proc, ttl_s=60, timeout_s=0.5, pod_log_dir=logs)
    a = k.attribute(DEVICES, [GpuReading("GPU-0", pids=(71,)), GpuReading("GPU-1", pids=(72,)),
                              GpuReading("GPU-2", pids=(73,)), GpuReading("MIG-2a", pids=(74,))], 0.0)
    assert a.gpu_job == {"GPU-0": "ml/llm", "GPU-1": "ml/llm", "GPU-2": "ml/solo-0", "MIG-2a": f"pod-uid/{u4}"}
    assert a.jobs["ml/llm"].labels == {"job_from": "pod name"}
    solo = a.jobs["ml/solo-0"]
    assert (solo.namespace, solo.name, solo.labels) == ("ml", "solo-0", {"pod": "solo-0", "container": "main"})
    # a pod started after the listing is named on the next call once ttl_s has passed
    u5 = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5f"
    _pod_logs(logs, ("ml", "late-0", u5, ("main",)))
    fake_proc(proc, 75, f"0::/kubepods/besteffort/pod{u5}/abc\n")
    assert k.attribute(DEVICES, [GpuReading("GPU-3", pids=(75,))], 1.0).gpu_job == {"GPU-3": f"pod-uid/{u5}"}
    k._pod_names_at -= 61  # ttl_s later
    assert k.attribute(DEVICES, [GpuReading("GPU-3", pids=(75,))], 2.0).gpu_job == {"GPU-3": "ml/late-0"}


def test_pods_by_uid_on_a_missing_or_odd_directory(tmp_path: Path) -> None:
    from gpufleet.agent.attribution.kubernetes import pods_by_uid

    assert pods_by_uid(tmp_path / "absent") == {}
    (tmp_path / "ml_a-file_0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5c").write_text("")  # the right name, not a dir
    (tmp_path / "kube-system_etcd-node1_0f1e2d3c4b5a69788a9b0c1d2e3f4a5b").mkdir()  # a static pod: hash UID
    (tmp_path / "ns__0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b").mkdir()  # empty pod name
    static = tmp_path / "kube-system_etcd-node1_0f1e2d3c4b5a69788a9b0c1d2e3f4a5b"
    assert pods_by_uid(tmp_path) == {"0f1e2d3c4b5a69788a9b0c1d2e3f4a5b": ("kube-system", "etcd-node1", str(static))}


def test_a_pytorchjobs_pods_are_one_job_and_none_keeps_them_apart(sock: Path, tmp_path: Path) -> None:
    kubelet = FakeKubelet(sock)
    try:
        kubelet.pods = [("ml", "llm-master-0", "pytorch", "nvidia.com/gpu", ["GPU-0"]),
                        ("ml", "llm-worker-0", "pytorch", "nvidia.com/gpu", ["GPU-1"]),
                        ("ml", "solo-0", "main", "nvidia.com/mig-1g.10gb", ["MIG-2a"])]
        a = KubernetesAttributor(sock, proc_root=tmp_path, ttl_s=60).attribute(DEVICES, [], 0.0)
        assert a.gpu_job == {"GPU-0": "ml/llm", "GPU-1": "ml/llm", "MIG-2a": "ml/solo-0"}
        assert a.jobs["ml/llm"].name == "llm" and a.jobs["ml/llm"].labels == {"job_from": "pod name"}
        apart = KubernetesAttributor(sock, proc_root=tmp_path, ttl_s=60, pod_jobs=PodJobs(("none",)))
        b = apart.attribute(DEVICES, [], 0.0)
        assert b.gpu_job == {"GPU-0": "ml/llm-master-0", "GPU-1": "ml/llm-worker-0", "MIG-2a": "ml/solo-0"}
    finally:
        kubelet.stop()


def test_the_agent_builds_its_attributor_with_the_configured_patterns(sock: Path, tmp_path: Path) -> None:
    from gpufleet.agent.attribution import build_attributors
    from gpufleet.agent.config import load_config

    cfg = load_config(None, {"GPUFLEET_ATTRIBUTORS": "kubernetes", "GPUFLEET_KUBELET_SOCKET": str(sock),
                             "GPUFLEET_KUBERNETES_JOB_PATTERNS": r"^(?P<job>.+)-\d+$"})
    (k,) = build_attributors(cfg)
    assert isinstance(k, KubernetesAttributor) and k.pod_jobs.owner("vllm-3") == "vllm"
