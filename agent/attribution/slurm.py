"""Slurm attribution on the node.

1. The job mapping directory a prolog maintains (dcgm-exporter's ``--hpc-job-mapping-dir``
   format: one file per GPU index, one job id per line) and Princeton jobstats'
   ``/run/gpustat/<index|GPU-uuid|MIG-uuid>`` files (``"jobid uid"``). These show GPUs that
   are allocated but idle, which no process-based method can see.
2. GPU processes (from the source) -> ``/proc/<pid>/cgroup`` -> job id (cgroup v1 and v2).
3. Job facts (user, name, account, partition, nodes, tasks) from ``/proc/<pid>/environ``.

The mapping directory wins where both speak: it is the allocation, processes may be stray.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from gpufleet.protocol import GpuInfo, JobInfo

from ..sources.base import GpuReading, SourceAttribution
from .procfs import read_environ, read_text, slurm_job_from_cgroup, user_name

log = logging.getLogger(__name__)


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "") else None
    except ValueError:
        return None


def job_from_environ(job_id: str, env: dict[str, str]) -> JobInfo:
    labels = {}
    if env.get("SLURM_ARRAY_JOB_ID"):
        labels["array"] = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}"
    if env.get("SLURM_HET_JOB_ID"):
        labels["het_job"] = env["SLURM_HET_JOB_ID"]
    if env.get("SLURM_JOB_QOS"):
        # the QoS often names the kind of work (interactive, inference, debug): the analysis
        # reads labels["qos"] for the workload class (analysis/workload.py)
        labels["qos"] = env["SLURM_JOB_QOS"]
    return JobInfo(job_id=job_id, source="slurm", user=env.get("SLURM_JOB_USER") or None,
                   name=env.get("SLURM_JOB_NAME") or None, account=env.get("SLURM_JOB_ACCOUNT") or None,
                   partition=env.get("SLURM_JOB_PARTITION") or None,
                   num_nodes=_int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")),
                   ntasks=_int(env.get("SLURM_NTASKS")), labels=labels)


def read_mapping_dir(path: Path) -> dict[str, str]:
    """dcgm-exporter HPC mapping: file name ``<gpu index>`` or ``<index>.<gpu instance>`` -> job
    id (first line; a GPU shared by several jobs is given to the first listed)."""
    out: dict[str, str] = {}
    try:
        entries = list(path.iterdir())
    except OSError:
        return out
    for f in entries:
        name = f.name
        head = name.split(".", 1)
        if not all(p.isdigit() for p in head):
            continue
        try:
            lines = [ln.strip() for ln in f.read_text().splitlines() if ln.strip()]
        except OSError:
            continue
        if lines:
            out[name] = lines[0].split()[0]
    return out


def read_gpustat_dir(path: Path) -> dict[str, tuple[str, int | None]]:
    """Princeton jobstats: file name (index, GPU-uuid or MIG-uuid) -> (job id, uid)."""
    out: dict[str, tuple[str, int | None]] = {}
    try:
        entries = list(path.iterdir())
    except OSError:
        return out
    for f in entries:
        try:
            parts = f.read_text().split()
        except OSError:
            continue
        if parts and parts[0] not in ("0", ""):
            out[f.name] = (parts[0], _int(parts[1]) if len(parts) > 1 else None)
    return out


class SlurmAttributor:
    name = "slurm"

    def __init__(self, mapping_dir: Path = Path("/var/run/gpufleet/jobs"), gpustat_dir: Path = Path("/run/gpustat"),
                 proc_root: Path = Path("/proc"), gpu_instance_ids: Callable[[], dict[str, int]] | None = None) -> None:
        self.mapping_dir = Path(mapping_dir)
        self.gpu_instance_ids = gpu_instance_ids  # MIG uuid -> GPU instance id, from the source
        self.gpustat_dir = Path(gpustat_dir)
        self.proc_root = Path(proc_root)
        self._pid_job: dict[int, str | None] = {}  # pid -> slurm job (None: not in a job)
        self._facts: dict[str, JobInfo] = {}

    def attribute(self, devices: list[GpuInfo], readings: list[GpuReading], now: float) -> SourceAttribution:
        a = SourceAttribution()
        by_index = {str(d.index): d.uuid for d in devices if d.mig_profile is None}
        if self.gpu_instance_ids is not None:
            gis = self.gpu_instance_ids()
            by_index.update({f"{d.index}.{gis[d.uuid]}": d.uuid for d in devices if d.uuid in gis})
        uuids = {d.uuid for d in devices}

        for name, job in read_mapping_dir(self.mapping_dir).items():
            uuid = by_index.get(name)
            if uuid:
                a.gpu_job[uuid] = job
        for name, (job, uid) in read_gpustat_dir(self.gpustat_dir).items():
            uuid = name if name in uuids else by_index.get(name)
            if uuid and uuid not in a.gpu_job:
                a.gpu_job[uuid] = job
            if uid is not None and job not in a.jobs:
                a.jobs[job] = JobInfo(job_id=job, source="slurm", user=user_name(uid))

        seen: set[int] = set()
        for r in readings:
            for pid in r.pids:
                seen.add(pid)
                pid_job = self._job_of(pid)
                if pid_job is None:
                    continue
                a.gpu_job.setdefault(r.uuid, pid_job)
                if pid_job not in self._facts:
                    env = read_environ(self.proc_root, pid)
                    if env.get("SLURM_JOB_ID") == pid_job:
                        self._facts[pid_job] = job_from_environ(pid_job, env)
        for pid in [p for p in self._pid_job if p not in seen]:
            del self._pid_job[pid]  # exited: its pid may be reused by another job

        live = set(a.gpu_job.values())
        for job in live:
            info = self._facts.get(job) or a.jobs.get(job) or JobInfo(job_id=job, source="slurm")
            a.jobs[job] = info
        for job in [j for j in self._facts if j not in live]:
            del self._facts[job]
        return a

    def _job_of(self, pid: int) -> str | None:
        if pid not in self._pid_job:
            text = read_text(self.proc_root, pid, "cgroup")
            self._pid_job[pid] = slurm_job_from_cgroup(text) if text else None
        return self._pid_job[pid]
