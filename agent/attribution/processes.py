"""No scheduler: each GPU process is its own job (pid, user, command), so a bare box is
attributed too. Job ids are ``<node>:<pid>:<start time>``: pids repeat across nodes and,
over weeks, on one node."""

from __future__ import annotations

import socket
from pathlib import Path

from gpufleet.protocol import GpuInfo, JobInfo

from ..sources.base import GpuReading, SourceAttribution
from .procfs import proc_command, proc_start_time, proc_uid, user_name


class ProcessAttributor:
    name = "process"

    def __init__(self, proc_root: Path = Path("/proc"), node: str | None = None) -> None:
        self.proc_root = Path(proc_root)
        self.node = node or socket.gethostname()
        self._jobs: dict[int, JobInfo | None] = {}

    def attribute(self, devices: list[GpuInfo], readings: list[GpuReading], now: float) -> SourceAttribution:
        a = SourceAttribution()
        seen: set[int] = set()
        for r in readings:
            infos = []
            for pid in r.pids:
                seen.add(pid)
                info = self._job(pid)
                if info is not None:
                    infos.append(info)
            if infos:
                # The longest-running process owns the GPU (helpers come and go around it).
                owner = min(infos, key=lambda j: (j.start_ts if j.start_ts is not None else float("inf"), j.job_id))
                a.jobs.setdefault(owner.job_id, owner)
                a.gpu_job[r.uuid] = owner.job_id
        for pid in [p for p in self._jobs if p not in seen]:
            del self._jobs[pid]
        return a

    def _job(self, pid: int) -> JobInfo | None:
        if pid in self._jobs:
            return self._jobs[pid]
        start = proc_start_time(self.proc_root, pid)
        comm, cmdline = proc_command(self.proc_root, pid)
        uid = proc_uid(self.proc_root, pid)
        if start is None and not comm:
            info = None  # gone already, or in another pid namespace
        else:
            info = JobInfo(job_id=f"{self.node}:{pid}:{int(start or 0)}", source="process",
                           user=user_name(uid) if uid is not None else None, name=comm or None,
                           start_ts=start, labels={"pid": str(pid), "cmdline": cmdline})
        self._jobs[pid] = info
        return info
