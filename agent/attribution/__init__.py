"""Attribution: map GPUs to jobs (Slurm, Kubernetes, or plain processes), chosen by config."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .base import Attributor, merge

if TYPE_CHECKING:
    from ..config import AgentConfig

log = logging.getLogger(__name__)

__all__ = ["Attributor", "build_attributors", "merge"]


def build_attributors(cfg: AgentConfig, source: object = None) -> list[Attributor]:
    """Attributors in precedence order. ``auto`` picks Slurm when its mapping dirs or
    slurmstepd cgroups exist, Kubernetes when the kubelet socket exists, and always ends
    with the per-process fallback so a bare box is attributed too."""
    wanted = list(cfg.attributors)
    if "none" in wanted:
        return []
    auto = "auto" in wanted
    out: list[Attributor] = []
    if "slurm" in wanted or (auto and _slurm_present(cfg)):
        from .slurm import SlurmAttributor

        out.append(SlurmAttributor(mapping_dir=cfg.slurm_mapping_dir, gpustat_dir=cfg.gpustat_dir,
                                   proc_root=cfg.proc_root,
                                   gpu_instance_ids=getattr(source, "gpu_instance_ids", None)))
    if "kubernetes" in wanted or (auto and cfg.kubelet_socket.exists()):
        from gpufleet.pod_jobs import PodJobs

        from .kubernetes import KubernetesAttributor

        out.append(KubernetesAttributor(socket_path=cfg.kubelet_socket, proc_root=cfg.proc_root,
                                        ttl_s=cfg.attribution_ttl_s, pod_jobs=PodJobs(cfg.kubernetes_job_patterns),
                                        pod_log_dir=cfg.pod_log_dir))
    if "process" in wanted or auto:
        from .processes import ProcessAttributor

        out.append(ProcessAttributor(proc_root=cfg.proc_root, node=cfg.node))
    log.debug("attributors: %s", [a.name for a in out])
    return out


def _slurm_present(cfg: AgentConfig) -> bool:
    return (cfg.slurm_mapping_dir.is_dir() or cfg.gpustat_dir.is_dir()
            or (cfg.sys_root / "fs/cgroup/system.slice/slurmstepd.scope").exists()
            or (cfg.sys_root / "fs/cgroup/devices/slurm").exists())
