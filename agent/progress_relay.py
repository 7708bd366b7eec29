"""The node agent's progress relay: training processes on this host send ``gpufleet.progress``
datagrams to a Unix socket; the relay folds each process's events into 10 s windows
(``gpufleet.progress_fold``) and hands the finished windows to the agent loop, which journals
them with the cycle and spools them with the batch, so they travel with the same no-loss,
no-duplicate guarantees as samples (docs/progress.md).

The socket path: ``GPUFLEET_PROGRESS`` when it names a path, else the first of
``gpufleet.progress.default_socket_paths()`` whose folder this process can create or write.

The socket is 0660 (the agent's user and group, plus ``progress_socket_group``): what arrives
is still untrusted, so every datagram is checked (``sane``: finite clocks, integers a database
column holds, NUL-free names, bounded event fields) before it is folded, the fold's finished
windows are bounded in bytes (``max_ready_bytes``, then the oldest are dropped and counted),
and no input stops the receiving thread.
"""

from __future__ import annotations

import grp
import json
import logging
import math
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
MAX_READY_BYTES = 8 << 20  # the same, in bytes of their JSON (the agent drains every cycle: ~8,000 windows)
MAX_EVENTS_PER_DATAGRAM = 4096  # the client sends at most 512
MAX_FIELDS_BYTES = 4096  # one progress.event's fields (the client truncates at 2048)
_INT4 = 2**31 - 1
_INT8 = 2**63 - 1
MAX_WALL_SKEW_S = 366 * 86400.0
_CLOCK = 1e9  # a monotonic clock in seconds stays far below this (31 years of uptime)


def _num(v: Any, lo: float = -_CLOCK, hi: float = _CLOCK) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi


def _int(v: Any, lo: int = 0, hi: int = _INT8) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _name(v: Any, limit: int = 255) -> bool:
    return isinstance(v, str) and len(v) <= limit and "\x00" not in v


def _json_safe(v: Any, depth: int = 0) -> Any:
    """Event fields as the database's JSON holds them: NaN/Inf become null (not known; a
    training loop's loss=nan is a fact worth keeping, not a reason to lose the window)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return v.replace("\x00", "")
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v if -_INT8 <= v <= _INT8 else None
    if depth > 8:
        return None
    if isinstance(v, dict):
        return {str(k).replace("\x00", ""): _json_safe(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_safe(x, depth + 1) for x in v]
    return None


def _sane_event(ev: Any, lo: float, hi: float) -> list[Any] | None:
    if not (isinstance(ev, list) and len(ev) >= 2 and isinstance(ev[0], str) and _num(ev[1], lo, hi)):
        return None
    kind = ev[0]
    if kind == "s":
        if len(ev) < 3 or not _int(ev[2], -_INT8, _INT8):
            return None
        return [kind, ev[1], ev[2], *[x if _int(x) else None for x in ev[3:5]]]
    if kind == "b":
        return ev[:3] if len(ev) >= 3 and _name(ev[2], 64) else None
    if kind == "e":
        return ev[:4] if len(ev) >= 4 and _name(ev[2], 64) and _num(ev[3], 0, _CLOCK) else None
    if kind == "v":
        if len(ev) < 3 or not _name(ev[2], 64):
            return None
        fields = _json_safe(ev[3]) if len(ev) > 3 and isinstance(ev[3], dict) else {}
        size = len(json.dumps(fields))
        return [kind, ev[1], ev[2], fields if size <= MAX_FIELDS_BYTES else {"truncated": size}]
    if kind == "x":
        return ev[:2]
    return None


def sane(msg: Any) -> dict[str, Any] | None:
    """The datagram with only what the fold can use safely, or None when it is not a progress
    datagram at all (then counted as bad). Events that break a bound are dropped alone."""
    if not isinstance(msg, dict):
        return None
    pid: Any = msg.get("pid")
    mono0: Any = msg.get("mono0")
    wall0: Any = msg.get("wall0")
    if not (_int(pid, 0, _INT4) and _num(mono0) and _num(wall0, 946684800.0, 4102444800.0)):
        return None
    m0 = float(mono0)
    now = msg.get("now")
    if now is not None and not _num(now, m0 - 86400.0, m0 + _CLOCK):
        return None
    ident = msg.get("id") or {}
    if not isinstance(ident, dict):
        return None
    clean_id: dict[str, Any] = {}
    for k, ok in (("job", lambda v: _name(v) and v != ""), ("rank", lambda v: _int(v, 0, _INT4)),
                  ("host", _name), ("world", lambda v: _int(v, 1, _INT4)), ("local_rank", lambda v: _int(v, 0, _INT4)),
                  ("gpu", lambda v: _name(v, 96))):
        v = ident.get(k)
        if v is not None and ok(v):
            clean_id[k] = v
    meta = msg.get("meta") or {}
    clean_meta: dict[str, Any] = {}
    if isinstance(meta, dict):
        if _num(meta.get("flops_per_step"), 0.0, 1e300):
            clean_meta["flops_per_step"] = meta["flops_per_step"]
        if _int(meta.get("params")):
            clean_meta["params"] = meta["params"]
    evs = msg.get("ev") or []
    if not isinstance(evs, list):
        return None
    lo, hi = m0 - 86400.0, m0 + _CLOCK
    clean_ev = [e for e in (_sane_event(ev, lo, hi) for ev in evs[:MAX_EVENTS_PER_DATAGRAM]) if e is not None]
    dropped = msg.get("dropped")
    return {"pid": pid, "mono0": mono0, "wall0": wall0, "now": now, "id": clean_id, "meta": clean_meta,
            "dropped": dropped if _int(dropped) else 0, "ev": clean_ev}


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
                 expire_s: float = EXPIRE_S, group: str | None = None,
                 max_ready_bytes: int = MAX_READY_BYTES) -> None:
        self.path = str(path)
        self.group = group
        self.max_ready_bytes = max_ready_bytes
        self.ready_bytes = 0  # JSON bytes of the finished windows waiting for drain()
        self._ready_sizes: list[int] = []  # one per window in self.folder.ready
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
        # Not 0666: any local user could then forge another job's progress or flood the relay.
        # Trainers run as the agent's group or as ``group`` (progress_socket_group).
        if self.group:
            try:
                os.chown(self.path, -1, grp.getgrnam(self.group).gr_gid)
            except (KeyError, PermissionError) as e:
                s.close()
                os.unlink(self.path)
                raise OSError(f"cannot give {self.path} to group {self.group!r}: {e}") from None
        os.chmod(self.path, 0o660)
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
                self._receive(data)
            except Exception:  # no datagram may stop the relay: a trainer's windows depend on it
                log.exception("progress datagram of %d bytes not folded", len(data))
                with self._lock:
                    self.folder.bad += 1
            now_cpu = time.thread_time()
            self.cpu_s += now_cpu - t_cpu
            t_cpu = now_cpu

    def _receive(self, data: bytes) -> None:
        try:
            msg = sane(json.loads(data))
        except (ValueError, RecursionError):
            msg = None
        if msg is not None and abs(msg["wall0"] - self.wall()) > MAX_WALL_SKEW_S:
            msg = None  # a process's start is no year away from this node's clock
        with self._lock:
            self.received += 1
            if msg is None:
                self.folder.bad += 1
                return
            self.events += len(msg["ev"])
            self.folder.feed(msg, self.mono())
            self._bound_ready()

    def _bound_ready(self) -> None:
        """Count the new finished windows' bytes; past the bound the oldest go (counted)."""
        ready = self.folder.ready
        for w in ready[len(self._ready_sizes):]:
            n = len(msgspec.json.encode(w))
            self._ready_sizes.append(n)
            self.ready_bytes += n
        drop = 0
        while self.ready_bytes > self.max_ready_bytes and drop < len(ready):
            self.ready_bytes -= self._ready_sizes[drop]
            drop += 1
        if drop:
            del ready[:drop]
            del self._ready_sizes[:drop]
            self.dropped += drop

    def _take(self, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self._ready_sizes.clear()
        self.ready_bytes = 0
        return raw

    def drain(self, now: float | None = None) -> list[ProgressWindow]:
        with self._lock:
            raw = self._take(self.folder.close_due(self.wall() if now is None else now, self.mono()))
        return self._convert(raw)

    def drain_all(self) -> list[ProgressWindow]:
        """Everything, open windows included (the agent is stopping)."""
        with self._lock:
            raw = self.folder.close_due(self.wall(), self.mono()) + self.folder.close_all(self.wall(), self.mono())
            self._take(raw)
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
                "dropped": self.dropped, "unattributed": self.unattributed, "cpu_s": self.cpu_s,
                "ready_bytes": self.ready_bytes, "max_ready_bytes": self.max_ready_bytes}

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
    group = getattr(getattr(agent, "config", None), "progress_socket_group", None)
    try:
        relay = ProgressRelay(p, job_for=one_job_on_node(agent), group=group)
    except OSError as e:
        log.warning("progress relay not started (cannot listen on %s: %s); training processes on this node "
                    "report nothing until it can", p, e)
        return None
    agent.progress = relay
    log.info("progress relay listening on %s", p)
    return relay
