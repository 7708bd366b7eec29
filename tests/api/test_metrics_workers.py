"""/metrics of a real ``gpufleet serve --workers 2``: whichever process answers a scrape, it
shows every process's counters, each labelled with its worker, and no series ever goes down
from one scrape to the next (before, each scrape showed only the answering process's counters
and they jumped between the two processes' values, which Prometheus reads as resets). The
database gauges appear once, without a worker. Unit tests of the merge beside it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.api.metrics_share import SharedMetrics

JOBS = ("gpufleet_api_requests_total", "/api/v1/jobs")


def _series(text: str, name: str, route: str) -> dict[str, float]:
    """worker -> value of ``name`` for GET ``route`` answered 200."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels.get("route") == route and s.labels.get("status") == "200":
                out[s.labels.get("worker", "")] = s.value
    return out


def test_every_scrape_shows_both_workers_and_no_series_goes_down(database_url: str, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "serve.log").open("wb")
    share = tmp_path / "metrics-share"
    env = {**os.environ, "GPUFLEET_METRICS_DIR": str(share)}
    p = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "serve", "--database-url", database_url, "--port",
                          str(port), "--workers", "2", "--allow-anonymous", "--migrate"], stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    scrapes: list[str] = []
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        # until both processes have answered a jobs request (each scrape or request lands on either)
        sent = 0
        while time.time() < deadline:
            assert httpx.get(url + "/api/v1/jobs", timeout=10).status_code == 200
            sent += 1
            if len(list(share.glob("*.prom"))) == 2 and len(_series(httpx.get(url + "/metrics").text, *JOBS)) == 2:
                break
        for _ in range(30):
            assert httpx.get(url + "/api/v1/jobs", timeout=10).status_code == 200
            sent += 1
            scrapes.append(httpx.get(url + "/metrics", timeout=10).text)
        time.sleep(2.5)  # every process has written its file since its last request
        scrapes.append(httpx.get(url + "/metrics", timeout=10).text)
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
        log.close()
    seen = [_series(t, *JOBS) for t in scrapes]
    workers = set(seen[-1])
    assert len(workers) == 2 and "" not in workers, seen[-1]
    for before, after in pairwise(seen):
        assert set(before) == workers  # both processes in every scrape, whichever answered
        for w in workers:
            assert after[w] >= before[w], (w, before, after)  # never a reset
    assert sum(seen[-1].values()) == sent  # every request counted once, by the process that served it
    last = scrapes[-1]
    db_up = [s for f in text_string_to_metric_families(last) for s in f.samples if s.name == "gpufleet_api_database_up"]
    assert len(db_up) == 1 and "worker" not in db_up[0].labels and db_up[0].value == 1.0


def test_a_dead_workers_file_is_left_out_and_removed(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    Counter("gpufleet_things", "things", ["kind"], registry=reg).labels("a").inc(5)
    me = SharedMetrics(reg, tmp_path, pid=os.getpid())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    other = SharedMetrics(reg, tmp_path, pid=dead.pid)  # wrote its file, then its process ended
    other.snapshot()
    alive_other = SharedMetrics(reg, tmp_path, pid=os.getppid())
    alive_other.snapshot()
    (tmp_path / "notapid.prom").write_text("garbage")  # not a worker's file: ignored
    fams = {f.name: f for f in me.families()}
    workers = sorted(s.labels["worker"] for s in fams["gpufleet_things"].samples)
    assert workers == sorted([str(os.getpid()), str(os.getppid())])
    assert not (tmp_path / f"{dead.pid}.prom").exists()
    assert all(s.value == 5 for s in fams["gpufleet_things"].samples if s.name == "gpufleet_things_total")


def test_a_scrape_answers_when_the_directory_is_gone(tmp_path: Path) -> None:
    reg = CollectorRegistry()
    Counter("gpufleet_things", "things", registry=reg).inc(2)
    me = SharedMetrics(reg, tmp_path / "gone", pid=os.getpid())  # never created: every write fails
    fams = {f.name: f for f in me.families()}
    assert [s.value for s in fams["gpufleet_things"].samples] == [2.0]
