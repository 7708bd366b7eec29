"""The node agent's progress relay: training processes on this host send ``gpufleet.progress``
datagrams to a Unix socket; the relay folds each process's events into 10 s windows
(``gpufleet.progress_fold``) and hands the finished windows to the agent loop, which journals
them with the cycle and spools them with the batch, so they travel with the same no-loss,
no-duplicate guarantees as samples (docs/progress.md).

The socket path: ``GPUFLEET_PROGRESS`` when it names a path, else the first of
``gpufleet.progress.default_socket_paths()`` whose folder this process can create or write.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from gpufleet.progress import default_socket_paths
from gpufleet.progress_fold import EXPIRE_S, Folder
from gpufleet.protocol import ProgressWindow

log = logging.getLogger(__name__)

MAX_DATAGRAM = 1 << 20
MAX_READY = 20000  # finished windows held while the agent loop is not draining (then counted drops)


def socket_path_from_env() -> str | None:
    d = os.environ.get("GPUFLEET_PROGRESS", "").strip()
    if d.lower() in ("off", "0", "none", "disabled"):
        return None
    if d and not d.startswith(("http://", "https://")):
        return d
    for p in default_socket_paths():
        folder = Path(p).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return p
    return None


class ProgressRelay:
    """Listens on ``path`` in a daemon thread. ``drain(now)`` (called by the agent each cycle)
    returns the windows finished since, as protocol structs. ``job_for`` names the job of a
    stream that did not say (the agent's attribution: the one job on this node, if one)."""

    def __init__(self, path: str | os.PathLike[str], *, job_for: Callable[[dict[str, Any]], str | None] | None = None,
                 mono: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 expire_s: float = EXPIRE_S) -> None:
        self.path = str(path)
        self.job_for = job_for
        self.mono = mono
        self.wall = wall
        self.folder = Folder(expire_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.received = 0  # datagrams
        self.events = 0
        self.dropped = 0  # windows lost because nobody drained (bounded memory)
        self.unattributed = 0  # windows with no job named and none to infer
        self.cpu_s = 0.0  # thread CPU seconds spent receiving and folding (bench)
        self._sock = self._bind()
        self._thread = threading.Thread(target=self._run, name="gpufleet-progress-relay", daemon=True)
        self._thread.start()

    def _bind(self) -> socket.socket:
        p = Path(self.path)
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            if stat.S_ISSOCK(p.lstat().st_mode):
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                try:
                    probe.connect(self.path)
                except ConnectionRefusedError:
                    p.unlink()  # a previous agent's socket that nobody listens on any more
                else:
                    raise OSError(f"another agent listens on {self.path}: one relay per host (set "
                                  "GPUFLEET_PROGRESS to another path for a second one)")
                finally:
                    probe.close()
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(self.path)
        os.chmod(self.path, 0o666)  # any training process on the node may report
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        except OSError:
            pass
        s.settimeout(0.5)
        return s

    def _run(self) -> None:
        t_cpu = time.thread_time()
        while not self._stop.is_set():
            try:
                data = self._sock.recv(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    break
                continue
            try:
                msg = json.loads(data)
            except ValueError:
                self.folder.bad += 1
                continue
            with self._lock:
                self.received += 1
                self.events += len(msg.get("ev") or ()) if isinstance(msg, dict) else 0
                if isinstance(msg, dict):
                    self.folder.feed(msg, self.mono())
                else:
                    self.folder.bad += 1
            now_cpu = time.thread_time()
            self.cpu_s += now_cpu - t_cpu
            t_cpu = now_cpu

    def drain(self, now: float | None = None) -> list[ProgressWindow]:
        with self._lock:
            raw = self.folder.close_due(self.wall() if now is None else now, self.mono())
        return self._convert(raw)

    def drain_all(self) -> list[ProgressWindow]:
        """Everything, open windows included (the agent is stopping)."""
        with self._lock:
            raw = self.folder.close_due(self.wall(), self.mono()) + self.folder.close_all(self.wall(), self.mono())
        return self._convert(raw)

    def _convert(self, raw: list[dict[str, Any]]) -> list[ProgressWindow]:
        out: list[ProgressWindow] = []
        for w in raw:
            if not w.get("job_id"):
                job = self.job_for(w) if self.job_for is not None else None
                if not job:
                    # Still stored, under a name that says what it is, rather than lost.
                    self.unattributed += 1
                    job = f"unattributed-{w.get('host') or 'host'}-{w.get('pid')}"
                w["job_id"] = job
            try:
                out.append(msgspec.convert(w, ProgressWindow))
            except msgspec.ValidationError as e:
                log.warning("progress window from pid %s not sent: %s", w.get("pid"), e)
                self.folder.bad += 1
        if len(out) > MAX_READY:
            self.dropped += len(out) - MAX_READY
            out = out[-MAX_READY:]
        return out

    def flush_into(self, agent: Any) -> None:
        """At agent shutdown: the open windows join the open batch (and its journal)."""
        windows = self.drain_all()
        ob = getattr(agent, "_open", None)
        if not windows or ob is None:
            return
        part = ob.new_part(agent.clock(), [], [], [], [], [], progress=windows)
        try:
            agent.journal.append(part)
        except OSError:
            pass  # the spool write that follows at once carries them
        ob.add(part)

    def stats(self) -> dict[str, Any]:
        return {"path": self.path, "received": self.received, "events": self.events, "streams":
                len(self.folder.streams), "bad": self.folder.bad, "refused": self.folder.refused,
                "dropped": self.dropped, "unattributed": self.unattributed, "cpu_s": self.cpu_s}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def one_job_on_node(agent: Any) -> Callable[[dict[str, Any]], str | None]:
    """A stream that named no job belongs to the job of the GPU its process runs on (NVML lists
    the process there, when the agent shares the trainer's pid namespace); else to the node's
    job when exactly one runs there."""

    def job_for(window: dict[str, Any]) -> str | None:
        last = getattr(agent, "last", None)
        if last is None:
            return None
        gpu_job = last.attribution.gpu_job
        pid = window.get("pid")
        if isinstance(pid, int):
            mine = {gpu_job[r.uuid] for r in last.readings if pid in r.pids and r.uuid in gpu_job}
            if len(mine) == 1:
                return next(iter(mine))
        jobs = set(gpu_job.values())
        return next(iter(jobs)) if len(jobs) == 1 else None

    return job_for


def attach(agent: Any, path: str | None = None) -> ProgressRelay | None:
    """Start a relay for ``agent`` (path from the environment when not given); None when
    disabled or no folder for the socket can be written (logged, the agent runs on)."""
    p = path or socket_path_from_env()
    if p is None:
        return None
    try:
        relay = ProgressRelay(p, job_for=one_job_on_node(agent))
    except OSError as e:
        log.warning("progress relay not started (cannot listen on %s: %s); training processes on this node "
                    "report nothing until it can", p, e)
        return None
    agent.progress = relay
    log.info("progress relay listening on %s", p)
    return relay
