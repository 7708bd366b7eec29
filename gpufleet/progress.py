"""The job's own progress, reported from inside the training loop (docs/progress.md).

    from gpufleet import progress
    progress.init(flops_per_step=6 * n_params * tokens_per_step)    # optional
    with progress.span("checkpoint_load"):
        load()
    for batch in data:
        ...
        optimizer.step()
        progress.step(step, tokens=n_tokens)

Standard library only: ``pip install gpufleet`` is enough. A call never blocks and never
raises into the training loop: it appends a tuple to a bounded buffer (events beyond it are
dropped and counted) and a daemon thread ships the buffer every 0.2 s, as datagrams to the
node agent's Unix socket or, for hosts without an agent, as protocol v1 batches to a
collector URL. The destination is ``GPUFLEET_PROGRESS`` (default: the agent socket,
``DEFAULT_SOCKET`` or its per-user fallback); ``GPUFLEET_PROGRESS=off`` disables it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "DEFAULT_SOCKET",
    "KNOWN_SPANS",
    "Reporter",
    "default_socket_paths",
    "event",
    "flush",
    "init",
    "shutdown",
    "span",
    "stats",
    "step",
]

DEFAULT_SOCKET = "/run/gpufleet/progress.sock"
KNOWN_SPANS = ("init", "compile", "data_wait", "checkpoint_save", "checkpoint_load", "eval")
MAX_BUFFER = 65536  # events held between flushes; beyond it calls are dropped and counted
FLUSH_S = 0.2
HEARTBEAT_S = 2.0  # an idle (or blocked) process still says it is alive this often
MAX_EVENTS_PER_DATAGRAM = 512  # ~25 KB of JSON, well under the kernel's datagram limit
MAX_FIELDS_BYTES = 2048  # progress.event(**fields) beyond this is truncated to a note
MAX_NAME = 64


def default_socket_paths() -> list[str]:
    """Where the agent listens, in order: /run/gpufleet (system agent), then the per-user
    fallback a non-root agent uses (``$XDG_RUNTIME_DIR`` or /tmp)."""
    rt = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/gpufleet-{os.getuid()}"
    return [DEFAULT_SOCKET, os.path.join(rt, "gpufleet", "progress.sock")]


def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def identity_from_env(job_id: str | None = None, rank: int | None = None,
                      world_size: int | None = None) -> dict[str, Any]:
    env = os.environ
    job = job_id or env.get("GPUFLEET_JOB_ID") or env.get("SLURM_JOB_ID") or env.get("TORCHELASTIC_RUN_ID")
    if not job:
        pod = env.get("POD_NAME") or env.get("HOSTNAME") if env.get("KUBERNETES_SERVICE_HOST") else None
        job = pod
    ident: dict[str, Any] = {
        "job": str(job) if job else None,
        "rank": rank if rank is not None else (_env_int("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
                                                or 0),
        "world": world_size if world_size is not None else _env_int("WORLD_SIZE", "SLURM_NTASKS",
                                                                    "OMPI_COMM_WORLD_SIZE"),
        "local_rank": _env_int("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
        "host": socket.gethostname(),
    }
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd and ident["local_rank"] is not None:
        devs = [d.strip() for d in cvd.split(",") if d.strip()]
        if devs:  # the GPU this rank most likely drives (GPU-uuid or index, as the scheduler set it)
            ident["gpu"] = devs[ident["local_rank"] % len(devs)]
    return ident


class Reporter:
    """One process's progress stream. The module functions use a process-wide Reporter;
    tests and libraries can hold their own (``destination``, ``clock`` injectable)."""

    def __init__(self, destination: str | None = None, *, token: str | None = None, start_thread: bool = True,
                 max_buffer: int = MAX_BUFFER, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, pid: int | None = None) -> None:
        # clock/wall/pid: a simulated process (the demo's, agent/sim_progress.py) reports in its
        # own time and as its own pid; a real one leaves them alone.
        self._clock = clock
        self._shown_pid = pid
        self._dest = destination if destination is not None else os.environ.get("GPUFLEET_PROGRESS", "")
        self._token = token if token is not None else os.environ.get("GPUFLEET_TOKEN")
        self._buf: deque[tuple[Any, ...]] = deque()
        self._max = max_buffer
        self.dropped = 0  # events never delivered: buffer full, no listener, send failed
        self.sent = 0
        self.ident = identity_from_env()
        self.meta: dict[str, Any] = {}
        self._explicit: dict[str, Any] = {}
        self._wall0 = wall()
        self._mono0 = clock()
        self._pid = os.getpid()
        self._depth: list[tuple[str, float]] = []
        self._lock = threading.Lock()  # the flusher's: callers never take it
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._sink: _Sink | None = None
        self.disabled = self._dest.strip().lower() in ("off", "0", "none", "disabled")
        self._last_error = ""
        if start_thread and not self.disabled:
            self._start()

    # --- the calls a training loop makes (cheap, never raise) ---------------------------

    def step(self, step: int, *, tokens: int | None = None, samples: int | None = None) -> None:
        if self.disabled:
            return
        if len(self._buf) >= self._max:
            self.dropped += 1
            return
        self._buf.append(("s", self._clock(), step, tokens, samples))

    @contextlib.contextmanager
    def span(self, kind: str) -> Iterator[None]:
        t0 = self._clock()
        self._emit(("b", t0, str(kind)[:MAX_NAME]))
        try:
            yield
        finally:
            t1 = self._clock()
            self._emit(("e", t1, str(kind)[:MAX_NAME], t1 - t0))

    def event(self, name: str, **fields: Any) -> None:
        try:
            body = json.dumps(fields, default=str, separators=(",", ":"))
            fields = {"truncated": len(body)} if len(body) > MAX_FIELDS_BYTES else json.loads(body)
        except Exception:  # a field that cannot be shown must not break the caller
            fields = {"unserialisable": True}
        self._emit(("v", self._clock(), str(name)[:MAX_NAME], fields))

    def init(self, job_id: str | None = None, rank: int | None = None, world_size: int | None = None,
             flops_per_step: float | None = None, params: int | None = None) -> None:
        try:
            # A later init() (a framework callback adding params) keeps what an earlier one named.
            self._explicit.update({k: v for k, v in (("job", job_id), ("rank", rank), ("world", world_size))
                                   if v is not None})
            e = self._explicit
            self.ident = identity_from_env(e.get("job"), e.get("rank"), e.get("world"))
            if flops_per_step is not None:
                self.meta["flops_per_step"] = float(flops_per_step)
            if params is not None:
                self.meta["params"] = int(params)
        except Exception as e:  # never into the caller
            self._last_error = f"init: {e}"
        self._wake.set()

    def _emit(self, ev: tuple[Any, ...]) -> None:
        if self.disabled:
            return
        if len(self._buf) >= self._max:
            self.dropped += 1
            return
        self._buf.append(ev)

    # --- shipping ------------------------------------------------------------------------

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufleet-progress", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        """A forked child (DataLoader worker, multiprocessing) is a new stream or nothing:
        it keeps no parent events and gets its own flusher only if it reports."""
        self._buf = deque()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._sink = None
        self._depth = []
        self.dropped = self.sent = 0
        self._thread = None
        if not self.disabled:
            self._start()

    def _run(self) -> None:
        last_beat = 0.0
        while not self._stop:
            self._wake.wait(FLUSH_S)
            self._wake.clear()
            now = time.monotonic()
            if self._buf or now - last_beat >= HEARTBEAT_S:
                self.flush()
                last_beat = now

    def _header(self) -> dict[str, Any]:
        return {"v": 1, "pid": self._shown_pid or self._pid, "wall0": self._wall0, "mono0": self._mono0,
                "id": self.ident, "meta": self.meta, "dropped": self.dropped, "now": self._clock()}

    def flush(self) -> None:
        """Ship what is buffered (the flusher thread calls this; so may a caller at exit)."""
        with self._lock:
            try:
                if self._sink is None:
                    self._sink = _open_sink(self._dest, self._token)
                evs: list[tuple[Any, ...]] = []
                buf = self._buf
                while buf:
                    evs.append(buf.popleft())
                chunks = [evs[i:i + MAX_EVENTS_PER_DATAGRAM] for i in range(0, len(evs), MAX_EVENTS_PER_DATAGRAM)]
                for chunk in chunks or [[]]:
                    if self._sink.send(self._header(), chunk):
                        self.sent += len(chunk)
                    else:
                        self.dropped += len(chunk)
            except Exception as e:  # the flusher must survive anything
                self._last_error = str(e)

    def stats(self) -> dict[str, Any]:
        return {"sent": self.sent, "dropped": self.dropped, "buffered": len(self._buf),
                "destination": self._sink.where if self._sink else self._dest, "error": self._last_error}

    def shutdown(self, timeout: float = 2.0) -> None:
        """Flush and stop; tells the relay the process ends cleanly (what follows its last step
        is teardown, not lost work)."""
        if not self.disabled and self._pid == os.getpid():
            self._emit(("x", self._clock()))
        self.flush()
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._sink is not None:
            self._sink.close()


class _Sink:
    where = ""

    def send(self, header: dict[str, Any], events: list[tuple[Any, ...]]) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _UnixSink(_Sink):
    """Datagrams to the agent, non-blocking: a full socket buffer or an absent agent is a
    counted drop, never a wait."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.where = paths[0]

    def send(self, header: dict[str, Any], events: list[tuple[Any, ...]]) -> bool:
        data = json.dumps({**header, "ev": events}, separators=(",", ":"), default=str).encode()
        for p in [self.where] + [q for q in self.paths if q != self.where]:
            try:
                self.sock.sendto(data, p)
                self.where = p
                return True
            except (FileNotFoundError, ConnectionRefusedError):
                continue  # no agent there: try the next path
            except (BlockingIOError, OSError):
                return False
        return False

    def close(self) -> None:
        self.sock.close()


class _HttpSink(_Sink):
    """No agent on this host: fold into 10 s windows here and POST protocol v1 batches."""

    def __init__(self, url: str, token: str | None) -> None:
        from gpufleet.progress_fold import Folder  # stdlib only, like this module

        self.url = url.rstrip("/")
        if not self.url.endswith("/api/v1/ingest"):
            self.url += "/api/v1/ingest"
        self.where = self.url
        self.token = token
        self.folder = Folder()
        self.boot_id = os.urandom(16).hex()
        self.seq = 0
        self.pending: deque[dict[str, Any]] = deque(maxlen=360)  # an hour of windows while the collector is down
        self.next_post = 0.0

    def send(self, header: dict[str, Any], events: list[tuple[Any, ...]]) -> bool:
        now = time.monotonic()
        self.folder.feed({**header, "ev": events}, now)
        if now < self.next_post:
            return True
        self.next_post = now + 5.0
        windows = self.folder.close_due(time.time(), now)
        if windows:
            self.pending.append(self._batch(windows))
        while self.pending:
            if not self._post(self.pending[0]):
                break
            self.pending.popleft()
        return True

    def _batch(self, windows: list[dict[str, Any]]) -> dict[str, Any]:
        b = {"v": 1, "agent": {"boot_id": self.boot_id, "seq": self.seq, "node": socket.gethostname(),
                               "version": "progress-http", "sent_at": time.time()}, "progress": windows}
        self.seq += 1
        return b

    def _post(self, batch: dict[str, Any]) -> bool:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url, data=json.dumps(batch).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return bool(200 <= r.status < 300)  # urlopen's result is untyped (Any)
        except urllib.error.HTTPError as e:
            return 400 <= e.code < 500 and e.code not in (401, 403, 408, 429)  # permanent: don't retry forever
        except OSError:
            return False

    def close(self) -> None:
        windows = self.folder.close_all(time.time(), time.monotonic())
        if windows:
            self.pending.append(self._batch(windows))
        for b in list(self.pending):
            if not self._post(b):
                break


def _open_sink(dest: str, token: str | None) -> _Sink:
    d = dest.strip()
    if d.startswith(("http://", "https://")):
        return _HttpSink(d, token)
    return _UnixSink([d] if d else default_socket_paths())


# --- the process-wide stream the module functions use -------------------------------------

_reporter: Reporter | None = None
_reporter_lock = threading.Lock()


def _get() -> Reporter:
    global _reporter
    r = _reporter
    if r is None:
        with _reporter_lock:
            if _reporter is None:
                _reporter = Reporter()
            r = _reporter
    return r


def _reset_after_fork() -> None:
    if _reporter is not None:
        _reporter._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


@atexit.register
def _flush_at_exit() -> None:
    """The last fraction of a second of events (the final steps, the last span) still goes."""
    if _reporter is not None:
        _reporter.shutdown(timeout=1.0)


def init(job_id: str | None = None, rank: int | None = None, world_size: int | None = None,
         flops_per_step: float | None = None, params: int | None = None) -> None:
    """Optional: name the job and rank (else from the environment) and the model's cost."""
    try:
        _get().init(job_id, rank, world_size, flops_per_step, params)
    except Exception as e:  # never into the caller
        print(f"gpufleet.progress: init failed: {e}", file=sys.stderr)


def step(step: int, *, tokens: int | None = None, samples: int | None = None) -> None:
    """After each optimizer step: the step number (a lower one than before = a restart)."""
    r = _reporter or _get()
    if r.disabled:
        return
    if len(r._buf) >= r._max:
        r.dropped += 1
        return
    r._buf.append(("s", time.monotonic(), step, tokens, samples))


def span(kind: str) -> contextlib.AbstractContextManager[None]:
    """``with progress.span("checkpoint_save"):`` time not spent on steps, by kind."""
    try:
        return _get().span(kind)
    except Exception:
        return contextlib.nullcontext()


def event(name: str, **fields: Any) -> None:
    r = _get()
    try:
        r.event(name, **fields)
    except Exception:  # never into the caller: counted like any other lost event
        r.dropped += 1


def flush() -> None:
    if _reporter is not None:
        _reporter.flush()


def stats() -> dict[str, Any]:
    return _get().stats()


def shutdown() -> None:
    global _reporter
    if _reporter is not None:
        _reporter.shutdown()
        _reporter = None
