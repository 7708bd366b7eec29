"""Debian's prometheus and victoria-metrics as throwaway processes on free ports (scripts/test.sh
installs both), and a fake dcgm-exporter serving the real captures with values moving."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from tests.conftest import free_port

T = TypeVar("T")


def settled(read: Callable[[], T], quiet_s: float, timeout_s: float = 60.0) -> T:
    """``read()`` once two reads ``quiet_s`` apart agree. After its targets stop, Prometheus
    may still append a scrape that was in flight (answered before the stop): a fixed sleep
    raced that on a loaded box; ``quiet_s`` longer than a scrape interval plus its timeout
    means no scrape can land after the value returned."""
    prev = read()
    deadline = time.monotonic() + timeout_s
    while True:
        time.sleep(quiet_s)
        cur = read()
        if cur == prev:
            return cur
        if time.monotonic() > deadline:
            raise AssertionError(f"still changing after {timeout_s:.0f} s")
        prev = cur


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed; scripts/test.sh installs Debian's {name}"
        if os.environ.get("CI") or os.environ.get("GPUFLEET_REQUIRE_SERVICES"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


class Proc:
    # Prometheus answers /-/ready with 503 until its TSDB and WAL are open; on a loaded machine
    # (the full suite beside other work) that has taken over 30 s. The bound is generous because
    # leaving early costs nothing: the loop returns at the first 200.
    READY_TIMEOUT_S = 120.0

    def __init__(self, args: list[str], url: str, ready: str, log: Path,
                 ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.url = url
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._out = log.open("ab")
        self.p = subprocess.Popen(args, stdout=self._out, stderr=subprocess.STDOUT)
        started = time.monotonic()
        last = "no answer"
        while True:
            if self.p.poll() is not None:
                raise RuntimeError(f"{args[0]} exited {self.p.returncode}: {log.read_text()[-2000:]}")
            try:
                r = httpx.get(url + ready, timeout=5)
                if r.status_code == 200:
                    break
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = type(e).__name__
            if time.monotonic() - started > ready_timeout_s:
                self.stop()
                raise RuntimeError(f"{args[0]} not ready after {ready_timeout_s:.0f} s (last {url + ready}: {last}): "
                                   f"{log.read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self._out.close()

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = httpx.get(self.url + "/api/v1/query", params=params, timeout=10)
        r.raise_for_status()
        return r.json()["data"]["result"]


def _on_a_port(start: Callable[[int], Proc], port: int | None) -> Proc:
    """``start(port)``, or on a free port, picked again when the process found it taken: a
    subprocess cannot be handed a bound socket, and free_port() releases its pick, so another
    process can bind it first (the process then exits: address already in use)."""
    if port is not None:
        return start(port)
    for attempt in range(3):
        try:
            return start(free_port())
        except RuntimeError as e:
            if attempt == 2 or "address already in use" not in str(e):
                raise
    raise AssertionError("unreachable")


def start_prometheus(tmp: Path, config: str, *extra: str) -> Proc:
    (tmp / "prometheus.yml").write_text(config)
    return _on_a_port(lambda port: Proc(
        [binary("prometheus"), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *extra],
        f"http://127.0.0.1:{port}", "/-/ready", tmp / "prometheus.log"), None)


def start_victoria_metrics(tmp: Path, *extra: str, port: int | None = None) -> Proc:
    return _on_a_port(lambda port: Proc(
        [binary("victoria-metrics"), f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={tmp / 'vm'}",
         "-retentionPeriod=100y", "-search.latencyOffset=0s", "-loggerLevel=ERROR", *extra],
        f"http://127.0.0.1:{port}", "/health", tmp / "victoria-metrics.log"), port)


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)\s*$")


def moving(text: str, k: int, inject: Callable[[str], str] = lambda labels: labels) -> str:
    """The capture as scrape ``k`` serves it: gauges alternate between the captured value and
    half of it (never leaving the catalog's range), counters grow by 1000 per scrape;
    ``inject`` may add labels (what dcgm-exporter's HPC job mapping does)."""
    counters = set(re.findall(r"^# TYPE (\S+) counter", text, re.M))
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            out.append(line)
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        value = value + 1000.0 * k if name in counters else (
            value if k % 2 == 0 else value // 2 if value.is_integer() else value / 2)
        out.append(f"{name}{inject(labels)} {value!r}")
    return "\n".join(out) + "\n"


class FakeExporter:
    """One node's dcgm-exporter: ``/metrics`` answers the capture, moving on every scrape; or,
    with ``page``, whatever ``page(scrape number)`` gives (``text`` is then unused)."""

    def __init__(self, text: str, inject: Callable[[str], str] = lambda labels: labels,
                 page: Callable[[int], str] | None = None) -> None:
        self.text = text
        self.scrapes = 0
        outer = self
        render = page or (lambda k: moving(outer.text, k, inject))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render(outer.scrapes).encode()
                outer.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
