"""Fixtures for the agent tests: a collector subprocess that can be SIGKILLed, an agent
thread, a lossy TCP proxy, and counts of what the database stored."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpufleet.storage.raw_read import count_raw_samples, raw_records

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 180.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


class CollectorProcess:
    """``gpufleet serve`` in a subprocess, on a fixed port so it can be killed and restarted."""

    def __init__(self, database_url: str, log_dir: Path) -> None:
        self.database_url = database_url
        self.port = free_port()
        self.handed_out = False  # whether anyone read the URL (then the port must stay)
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        self.handed_out = True
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CollectorProcess:
        assert self.proc is None or self.proc.poll() is not None
        for attempt in range(3):
            self.starts += 1
            path = self.log_dir / f"collector-{self.starts}.log"
            log = open(path, "wb")  # noqa: SIM115 - closed with the process
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self.proc = subprocess.Popen(
                [PY, "-m", "gpufleet.cli", "serve", "--database-url", self.database_url, "--host", "127.0.0.1",
                 "--port", str(self.port), "--allow-anonymous"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_port(self.port, proc=self.proc)
                return self
            except RuntimeError:
                # free_port() released its pick and another process bound it first: while nobody
                # knows the URL, pick another; once handed out (a restart, an agent made before
                # the first start) the port stays
                if self.handed_out or attempt == 2 or "already in use" not in path.read_text():
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def collector_process(tmp_path: Path) -> Iterator[Callable[[str], CollectorProcess]]:
    made: list[CollectorProcess] = []

    def make(database_url: str) -> CollectorProcess:
        c = CollectorProcess(database_url, tmp_path)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def stored(database_url: str) -> tuple[int, int]:
    """(raw samples stored, distinct (gpu, ts) pairs)."""
    import sqlalchemy as sa

    eng = sa.create_engine(database_url)
    try:
        with eng.connect() as c:
            n = count_raw_samples(c)
            d = len({(r["gpu_pk"], r["ts"]) for r in raw_records(c)})
    finally:
        eng.dispose()
    return int(n), int(d)


class AgentThread:
    def __init__(self, agent: object) -> None:
        self.agent = agent
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=agent.run, args=(self.stop_event,), daemon=True)  # type: ignore[attr-defined]

    def __enter__(self) -> AgentThread:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "agent did not stop within 30 s"

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.stop()


class TickClock:
    """Distinct, increasing timestamps (one per call) near now: no two cycles share a ts."""

    def __init__(self, start: float | None = None, step: float = 1.0) -> None:
        self.t = (start if start is not None else time.time() - 3600)
        self.step = step
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.t += self.step
            return self.t


class DropAckProxy:
    """TCP proxy that forwards requests to ``upstream`` but throws away the response of every
    other request (the 1st, 3rd, ...; ``drop`` in all) and resets the connection: the batch
    is stored, the acknowledgement lost, and the retry that follows gets through."""

    def __init__(self, upstream_port: int, drop: int) -> None:
        self.upstream_port = upstream_port
        self.drop = drop
        self.dropped = 0
        self.requests = 0
        self._srv = socket.create_server(("127.0.0.1", 0))  # bound here: no free_port() race
        self.port = self._srv.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._srv.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30) as up:
            client.settimeout(30)
            while True:
                try:
                    req = read_http_message(client)
                except TimeoutError:  # a kept-alive connection the agent no longer uses
                    return
                if req is None:
                    return
                up.sendall(req)
                resp = read_http_message(up)
                if resp is None:
                    return
                self.requests += 1
                if self.requests % 2 == 1 and self.dropped < self.drop:
                    self.dropped += 1
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return  # close with RST: the agent sees a connection error, never the 200
                client.sendall(resp)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._srv.close()


def read_http_message(s: socket.socket) -> bytes | None:
    """One whole HTTP/1.1 message (head and Content-Length body) from ``s``; None at EOF."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return head + b"\r\n\r\n" + rest
