"""The agent's serving scrape (agent/sources/serving_scrape.py): targets from pod annotations, a
configured port and a process's listening port; real HTTP pages from the simulator folded into
minute records that the intake accepts."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.sim_serving import EngineModel, Workload, simulate
from gpufleet.agent.sources.serving_scrape import (
    ServingScraper,
    listening_ports,
    targets_from_config,
    targets_from_pods,
)
from gpufleet.collector.serving_routes import check_minute
from tests.prometheus.procs import FakeExporter


def test_targets_from_pod_annotations() -> None:
    pods = [
        {"metadata": {"name": "chat-7d9f8b6c5d-x2k4p", "namespace": "ml", "labels": {},
                      "annotations": {"gpufleet.io/serving-engine": "vllm", "prometheus.io/port": "8000",
                                      "gpufleet.io/slo-preset": "mlperf-llama3.1-8b"}},
         "status": {"podIP": "10.0.0.5"}},
        {"metadata": {"name": "sg-0", "namespace": "ml", "labels": {"app": "sg"},
                      "annotations": {"gpufleet.io/serving-engine": "sglang", "gpufleet.io/serving-port": "30000",
                                      "gpufleet.io/serving-path": "/m"}}, "status": {"podIP": "10.0.0.6"}},
        {"metadata": {"name": "x", "annotations": {"gpufleet.io/serving-engine": "ollama"}}, "status": {}},
        {"metadata": {"name": "pending", "annotations": {"gpufleet.io/serving-engine": "vllm"}}, "status": {}},
        {"metadata": {"name": "trainer", "annotations": {}}, "status": {"podIP": "10.0.0.9"}},
    ]
    targets, skipped = targets_from_pods(pods)
    assert [(t.deployment, t.replica, t.engine, t.url) for t in targets] == [
        ("chat", "ml/chat-7d9f8b6c5d-x2k4p", "vllm", "http://10.0.0.5:8000/metrics"),
        ("sg", "ml/sg-0", "sglang", "http://10.0.0.6:30000/m")]
    assert targets[0].slo_labels == (("gpufleet.io/slo-preset", "mlperf-llama3.1-8b"),)
    assert len(skipped) == 2 and "ollama" in skipped[0] and "port" in skipped[1]


def test_targets_from_config_and_process_ports(tmp_path: Path) -> None:
    rules = [{"job": "ml/chat-*", "engine": "vllm", "port": 8000, "deployment": "chat"}]
    (t,) = targets_from_config(rules, ["ml/chat-1", "ml/train-2"])
    assert (t.deployment, t.replica, t.url) == ("chat", "ml/chat-1", "http://127.0.0.1:8000/metrics")
    # a fake /proc: pid 42 holds socket inode 555 listening on :8000 (0x1F40) and a connected one
    fd = tmp_path / "42" / "fd"
    fd.mkdir(parents=True)
    os.symlink("socket:[555]", fd / "3")
    os.symlink("socket:[556]", fd / "4")
    os.symlink("/dev/null", fd / "5")
    (tmp_path / "42" / "net").mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (tmp_path / "42" / "net" / "tcp").write_text(
        head + "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 555\n"
        + "   1: 0100007F:9C40 0100007F:1F40 01 00000000:00000000 00:00000000 00000000  1000        0 556\n")
    assert listening_ports(tmp_path, [42, 99]) == [8000]


@pytest.fixture
def engine_server() -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server answering /metrics with the next simulated page on each request."""
    res = simulate(EngineModel(), Workload(rate_rps=4, duration_s=180, seed=9), engine="vllm", drain=False)
    pages = [p for _, p in res.pages]
    srv = FakeExporter("", page=lambda k: pages[min(k, len(pages) - 1)])  # the next page per scrape
    try:
        yield f"http://127.0.0.1:{srv.port}/metrics", pages
    finally:
        srv.stop()


def test_scrape_real_http_into_minutes(engine_server: tuple[str, list[str]]) -> None:
    url, pages = engine_server
    target = targets_from_config([{"job": "*", "engine": "vllm", "port": int(url.split(":")[2].split("/")[0])}],
                                 ["ml/chat-0"])[0]
    with httpx.Client(timeout=10) as c:
        scraper = ServingScraper(fetch=lambda u: c.get(u).raise_for_status().text)
        scraper.set_targets([target])
        t0 = 1_700_000_040.0  # a minute boundary: scrapes every 15 s, as the simulator's pages are
        for i in range(len(pages)):
            scraper.scrape(t0 + 15 * i)
    recs = scraper.drain(t0 + 15 * len(pages), gpus_of=lambda job: ["GPU-a", "GPU-b"])
    assert len(recs) == (15 * (len(pages) - 1)) // 60
    assert all(r["gpus"] == 2 and r["job_id"] == "ml/chat-0" for r in recs)
    total = sum(r["measures"]["requests"] for r in recs)
    last = pages[-2]  # the page scraped at the end of the last whole minute
    done = float(next(ln.split()[-1] for ln in last.splitlines() if ln.startswith("vllm:request_success_total")))
    assert total == done
    for r in recs:
        row, why = check_minute(r)
        assert row is not None and why == [], why
    later = scraper.drain(t0 + 10_000, gpus_of=lambda job: [])  # the minute still open at the first drain
    assert [r["minute"] for r in later] == [recs[-1]["minute"] + 60]
    assert scraper.drain(t0 + 10_000, gpus_of=lambda job: []) == []  # each minute once


def test_a_dead_endpoint_is_reported_not_fatal() -> None:
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    dead = port.getsockname()[1]
    port.close()
    (t,) = targets_from_config([{"job": "*", "engine": "vllm", "port": dead}], ["j"])
    with httpx.Client(timeout=2) as c:
        def fetch(u: str) -> str:
            try:
                return c.get(u).text
            except httpx.HTTPError as e:
                raise OSError(str(e)) from None
        s = ServingScraper(fetch=fetch)
        s.set_targets([t])
        s.scrape(0.0)
    assert t.url in s.errors and s.drain(1000.0, lambda j: []) == []
