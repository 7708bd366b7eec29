"""NCCL Inspector source: tail the plugin's files under a directory, attribute each record to
its job, rank and GPU, and hand out 10 s aggregates (docs/nccl.md).

* Files are found recursively under ``root`` every ``SCAN_S``: JSON lines (``*.log``,
  ``*.json``, ``*.jsonl`` and rotations such as ``*.log.1``) and Prometheus textfiles
  (``*.prom``). A file seen for the first time is read from its start (a running job's history
  counts).
* Files are known by (device, inode), not path: a rotation by rename keeps its offset and the new
  file starts at 0; a file that shrank (truncated, or copytruncate) is read again from 0.
* Reading is bounded: at most ``max_bytes_per_poll`` per poll over all files (a 2 GB backlog is
  read over many polls, never held in memory), the unfinished last line stays for the next poll,
  a line longer than ``MAX_LINE`` is skipped and counted.
* Offsets are persisted in ``state_path`` (next to the spool) by ``commit()``, which the agent
  calls once the aggregates handed out are in its journal. The persisted offset of a file is the
  first record not yet handed out, so a restart neither loses nor repeats a record.
* Job: a ``nccl-inspector-<jobid>`` directory in the path, else the Prometheus ``slurm_job_id``
  label, else the process's ``SLURM_JOB_ID`` (``/proc/<pid>/environ``), else its Slurm cgroup.
  GPU: the process's GPU (NVML's running processes), else the Prometheus ``gpu_device_id``.
* On a shared file system every node sees every node's files: a file named
  ``<host>-pid<pid>.log`` (the Inspector's name) is read only by the agent of that host.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.nccl_fold import WINDOW_S, Aggregator
from gpufleet.protocol import CollectiveAgg, GpuInfo

from ..attribution.procfs import read_environ, read_text, slurm_job_from_cgroup
from .base import GpuReading
from .nccl_inspector_parse import ParseError, parse_json_line, parse_prom_text

log = logging.getLogger(__name__)

SCAN_S = 10.0  # look for new files this often
MAX_FILES = 4096  # files followed at once; past it the newest are left for later (counted)
MAX_LINE = 1 << 20  # a JSON line longer than this is not an Inspector record
MAX_PROM_FILE = 16 << 20
GRACE_S = 15.0  # a window is handed out this long after it ends: the dump thread writes late
FORGET_S = 24 * 3600.0  # forget a vanished file's state after this long
# JSON files, also rotated ones (x.log.1, x.log-20261201); compressed rotations are not followed
_JSON_NAME = re.compile(r"\.(log|json|jsonl)([.-]\d+)?$")
_JOB_DIR = re.compile(r"^nccl-inspector-(\d+)$")
_INSPECTOR_NAME = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log")


@dataclass
class _File:
    fid: str  # "<dev>:<ino>"
    path: Path
    offset: int = 0  # read up to here
    prom_sig: tuple[int, int] | None = None  # (mtime_ns, size) of the last prom snapshot read
    seen: float = 0.0
    job_id: str | None = None


class InspectorSource:
    def __init__(self, root: Path, state_path: Path, *, hostname: str | None = None, proc_root: Path = Path("/proc"),
                 max_bytes_per_poll: int = 8 << 20, grace_s: float = GRACE_S, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = Path(root)
        self.state_path = Path(state_path)
        self.hostname = hostname or socket.gethostname()
        self.proc_root = Path(proc_root)
        self.max_bytes_per_poll = max_bytes_per_poll
        self.grace_s = grace_s
        self.clock = clock
        self.agg = Aggregator(window_s=window_s)
        self.files: dict[str, _File] = {}
        self._scanned_at = -1e18
        self._pid_job: dict[int, str | None] = {}
        self._pid_gpu: dict[int, str] = {}
        self._index_gpu: dict[int, str] = {}
        self._prom_last_sn: dict[tuple[str, str, int, str], int] = {}
        self._cursor = 0  # round-robin start over files, so one huge file does not starve the others
        # counters (exported through the agent's metrics by name)
        self.records = 0
        self.bad_lines = 0
        self.long_lines = 0
        self.truncations = 0
        self.files_over_limit = 0
        self.read_errors = 0
        self._load_state()

    # --- state -----------------------------------------------------------------------------

    def _load_state(self) -> None:
        try:
            data = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warning("NCCL Inspector offsets %s unreadable (%s): reading every file from its start",
                        self.state_path, e)
            return
        try:
            for fid, st in data.get("files", {}).items():
                self.files[fid] = _File(fid, Path(st["path"]), int(st["offset"]),
                                        tuple(st["prom_sig"]) if st.get("prom_sig") else None,
                                        float(st.get("seen", 0)))
            self._prom_last_sn = {(fid, comm, int(rank), coll): int(sn)
                                  for fid, comm, rank, coll, sn in data.get("prom_sn", [])}
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            log.warning("NCCL Inspector offsets %s malformed (%s): reading every file from its start",
                        self.state_path, e)
            self.files, self._prom_last_sn = {}, {}

    def commit(self) -> None:
        """Persist offsets: for each file, the first record not yet handed out."""
        held = self.agg.held_offsets()
        files = {f.fid: {"path": str(f.path), "offset": min(f.offset, held.get(f.fid, f.offset)),
                         "prom_sig": list(f.prom_sig) if f.prom_sig else None, "seen": f.seen}
                 for f in self.files.values()}
        prom = [[*k, sn] for k, sn in self._prom_last_sn.items() if k[0] in self.files]
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"v": 1, "files": files, "prom_sn": prom}))
        os.replace(tmp, self.state_path)

    # --- attribution -----------------------------------------------------------------------

    def update_gpus(self, devices: list[GpuInfo], readings: list[GpuReading]) -> None:
        """Which pid runs on which GPU (the GPU source's process lists) and index -> uuid."""
        self._index_gpu = {d.index: d.uuid for d in devices if d.mig_profile is None}
        for r in readings:
            for pid in r.pids:
                self._pid_gpu[pid] = r.uuid

    def _job_of_pid(self, pid: int | None) -> str | None:
        if pid is None:
            return None
        if pid not in self._pid_job:
            job = read_environ(self.proc_root, pid).get("SLURM_JOB_ID") or None
            if job is None:
                text = read_text(self.proc_root, pid, "cgroup")
                job = slurm_job_from_cgroup(text) if text else None
            self._pid_job[pid] = job
            if len(self._pid_job) > 65536:  # long-lived agent, many short jobs: forget old pids
                self._pid_job = {pid: job}
        return self._pid_job[pid]

    @staticmethod
    def job_of_path(path: Path) -> str | None:
        for part in reversed(path.parts[:-1]):
            m = _JOB_DIR.match(part)
            if m:
                return m.group(1)
        return None

    # --- scanning and reading ---------------------------------------------------------------

    def _mine(self, path: Path) -> bool:
        m = _INSPECTOR_NAME.match(path.name)
        return m is None or m.group("host") in (self.hostname, self.hostname.split(".")[0])

    def scan(self, now: float) -> None:
        found: dict[str, _File] = {}
        over = 0
        for dirpath, _dirs, names in os.walk(self.root):
            for name in names:
                if not (name.endswith(".prom") or _JSON_NAME.search(name)):
                    continue
                p = Path(dirpath) / name
                if not self._mine(p):
                    continue
                try:
                    st = p.stat()
                except OSError:
                    continue  # vanished between listing and stat
                fid = f"{st.st_dev}:{st.st_ino}"
                if len(found) >= MAX_FILES:
                    over += 1
                    continue
                f = self.files.get(fid)
                if f is None:
                    f = _File(fid, p)
                f.path, f.seen = p, now
                f.job_id = self.job_of_path(p)
                found[fid] = f
        if over and over != self.files_over_limit:
            log.warning("NCCL Inspector: %d files under %s beyond the %d followed; the rest wait", over, self.root,
                        MAX_FILES)
        self.files_over_limit = over
        # a vanished file is kept a while (its records may be held in open windows), then forgotten
        for fid, f in self.files.items():
            if fid not in found and now - f.seen < FORGET_S:
                found[fid] = f
        self.files = found

    def poll(self, now: float, wall: float | None = None) -> list[CollectiveAgg]:
        """Read what is new (bounded), return the windows that ended ``grace_s`` before ``wall``."""
        wall = time.time() if wall is None else wall
        if now - self._scanned_at >= SCAN_S:
            self.scan(now)
            self._scanned_at = now
        budget = self.max_bytes_per_poll
        files = [f for f in self.files.values() if f.path.exists()]
        if files:
            self._cursor %= len(files)
            files = files[self._cursor:] + files[:self._cursor]
            self._cursor += 1
        for f in files:
            if budget <= 0:
                break
            if f.path.suffix == ".prom":
                self._read_prom(f)
            else:
                budget -= self._read_json(f, budget)
        return self.agg.drain(wall - self.grace_s)

    def _read_json(self, f: _File, budget: int) -> int:
        try:
            fd = os.open(f.path, os.O_RDONLY)
        except OSError:
            return 0
        try:
            st = os.fstat(fd)
            if f"{st.st_dev}:{st.st_ino}" != f.fid:
                return 0  # the path now names another file; the next scan sorts it out
            if st.st_size < f.offset:
                self.truncations += 1
                log.info("NCCL Inspector file %s shrank from %d to %d bytes: reading it again from the start",
                         f.path, f.offset, st.st_size)
                f.offset = 0
            avail = st.st_size - f.offset
            if avail <= 0:
                return 0
            data = os.pread(fd, min(avail, budget), f.offset)
            if b"\n" not in data and avail > len(data):  # one line longer than the budget: finish it
                data = os.pread(fd, min(avail, MAX_LINE + 1), f.offset)
        except OSError as e:  # EIO on a network file system: try again next poll
            self.read_errors += 1
            log.warning("NCCL Inspector: cannot read %s: %s", f.path, e)
            return 0
        finally:
            os.close(fd)
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) > MAX_LINE:  # no newline in a whole MAX_LINE: skip past it
                self.long_lines += 1
                f.offset += len(data)
            return len(data)
        self._fold_lines(f, data, end)
        f.offset += end + 1
        return end + 1

    def _fold_lines(self, f: _File, data: bytes, end: int) -> None:
        pos = 0
        base = f.offset
        path_job = f.job_id
        while pos <= end:
            nl = data.find(b"\n", pos, end + 1)
            line = data[pos:nl]
            start = pos
            pos = nl + 1
            if len(line) > MAX_LINE:
                self.long_lines += 1
                continue
            if not line.strip():
                continue
            try:
                r = parse_json_line(line)
            except ParseError as e:
                self.bad_lines += 1
                if self.bad_lines <= 5 or self.bad_lines % 10000 == 0:
                    log.warning("NCCL Inspector %s at byte %d: %s (%d bad lines so far)", f.path, base + start, e,
                                self.bad_lines)
                continue
            job = path_job or self._job_of_pid(r.pid)
            self.agg.add(r, job, self._pid_gpu.get(r.pid) if r.pid is not None else None, f.fid, base + start)
            self.records += 1

    def _read_prom(self, f: _File) -> None:
        try:
            st = f.path.stat()
            sig = (st.st_mtime_ns, st.st_size)
            if sig == f.prom_sig:
                return
            if st.st_size > MAX_PROM_FILE:
                self.bad_lines += 1
                log.warning("NCCL Inspector %s is %d bytes, more than a textfile snapshot: skipped", f.path,
                            st.st_size)
                f.prom_sig = sig
                return
            text = f.path.read_text(errors="replace")
        except OSError:
            return
        f.prom_sig = sig
        recs, bad = parse_prom_text(text, st.st_mtime)
        self.bad_lines += bad
        for r in recs:
            # a snapshot is rewritten every dump: count each collective (coll_sn) once
            k = (f.fid, r.comm, r.rank, r.coll)
            if r.sn is not None:
                if r.sn <= self._prom_last_sn.get(k, -1):
                    continue
                self._prom_last_sn[k] = r.sn
            job = r.job_id or f.job_id or self._job_of_pid(r.pid)
            gpu = (self._pid_gpu.get(r.pid) if r.pid is not None else None) or \
                (self._index_gpu.get(r.gpu_index) if r.gpu_index is not None else None)
            self.agg.add(r, job, gpu)
            self.records += 1
