"""Reading /proc for attribution: cgroups (Slurm job, Kubernetes pod), environment, owner.

Everything takes a ``proc_root`` so tests use a fake tree; parsers take text, not paths.
"""

from __future__ import annotations

import os
import pwd
import re
from functools import lru_cache
from pathlib import Path

# cgroup v1: 10:devices:/slurm/uid_2101171/job_280678/step_interactive/task_0
# cgroup v2: 0::/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0
_SLURM_JOB = re.compile(r"/job_(\d+)(?=/|$)")
# cgroupfs driver: /kubepods/burstable/pod8b1c...-.../<container>
# systemd driver:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8b1c..._....slice/cri-containerd-...
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
ENVIRON_MAX = 256 * 1024  # a process environment larger than this is not worth reading


def slurm_job_from_cgroup(text: str) -> str | None:
    for line in text.splitlines():
        m = _SLURM_JOB.search(line.split(":", 2)[-1])
        if m:
            return m.group(1)
    return None


def pod_uid_from_cgroup(text: str) -> str | None:
    for line in text.splitlines():
        m = _POD_UID.search(line.split(":", 2)[-1])
        if m:
            return m.group(1).replace("_", "-")
    return None


def parse_environ(data: bytes) -> dict[str, str]:
    out = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def read_text(proc_root: Path, pid: int, name: str) -> str | None:
    try:
        return (proc_root / str(pid) / name).read_text(errors="replace")
    except (OSError, ValueError):
        return None  # the process exited, or it is not ours to read


def read_environ(proc_root: Path, pid: int) -> dict[str, str]:
    try:
        with open(proc_root / str(pid) / "environ", "rb") as f:
            return parse_environ(f.read(ENVIRON_MAX))
    except OSError:
        return {}


def proc_uid(proc_root: Path, pid: int) -> int | None:
    status = read_text(proc_root, pid, "status")
    if status is None:
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return None


@lru_cache(maxsize=1024)
def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def proc_command(proc_root: Path, pid: int) -> tuple[str, str]:
    """(short name, command line) of a process; empty strings when it is gone."""
    comm = (read_text(proc_root, pid, "comm") or "").strip()
    raw = read_text(proc_root, pid, "cmdline") or ""
    cmdline = " ".join(a for a in raw.split("\0") if a)
    return comm, cmdline[:300]


def proc_start_time(proc_root: Path, pid: int) -> float | None:
    """Epoch seconds the process started (boot time + starttime ticks)."""
    stat = read_text(proc_root, pid, "stat")
    boot = _boot_time(proc_root)
    if stat is None or boot is None:
        return None
    try:
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks = int(fields[19])  # field 22 overall; fields[0] is field 3
    except (ValueError, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _boot_time(proc_root: Path) -> float | None:
    try:
        for line in (proc_root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        return None
    return None
