"""The agent's serving section end to end (SQLite and PostgreSQL): a simulated vLLM replica served
over real HTTP, the agent's loop scraping it through ``serving_rules``, its own spool and sender
delivering the minutes to the real collector, and GET /api/v1/deployments/{name} showing the
attainment the analysis computes from the engine's pages. A refused serving body is dead-lettered
and the GPU rows still arrive."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.runner import Agent
from gpufleet.agent.serving_section import ServingSection, engine_of_page, parse_rules
from gpufleet.agent.sources.base import GpuReading, SourceAttribution
from gpufleet.analysis.serving.measures import ServingMinute, summarize
from gpufleet.analysis.serving.slo import PRESETS
from gpufleet.protocol import Event, GpuInfo, JobInfo
from gpufleet.serving_expo import minutes_of, parse_exposition, snapshot
from tests.raw_samples_helpers import raw_count

from .test_serving_scrape import engine_server  # noqa: F401  (the fixture)

T0 = int(time.time() // 60 * 60) - 20 * 60  # the replica's scrapes start 20 minutes ago, on a minute
JOB = "ml/chat-0"
GPUS = ["GPU-aaaa-0", "GPU-aaaa-1"]


class TwoGpuSource:
    """Two GPUs, both attributed to the serving replica's job."""

    name = "test"

    def devices(self) -> list[GpuInfo]:
        return [GpuInfo(index=i, uuid=u, model="NVIDIA H100") for i, u in enumerate(GPUS)]

    def read(self, now: float) -> list[GpuReading]:
        return [GpuReading(u, {"gpu_util": 0.55}) for u in GPUS]

    def attribution(self, now: float) -> SourceAttribution:
        return SourceAttribution(jobs={JOB: JobInfo(job_id=JOB, source="kubernetes")}, gpu_job=dict.fromkeys(GPUS, JOB))

    def drain_events(self) -> list[Event]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture
def engine(engine_server: tuple[str, list[str]]) -> tuple[int, list[str]]:  # noqa: F811
    """The scrape test's real HTTP server: the simulator's next vLLM page on each GET."""
    url, pages = engine_server
    return int(url.split(":")[2].split("/")[0]), pages


def _agent(tmp_path: Path, url: str, rules: list[dict[str, Any]]) -> Agent:
    cfg = AgentConfig(collector_url=url, node="n1", cluster="default", spool_dir=tmp_path / "spool", fsync=False,
                      serving_rules=json.dumps(rules), attributors=("none",), infiniband=False, nic_health=False)
    return Agent(cfg, TwoGpuSource(), attributors=[], enrichers=[])  # type: ignore[arg-type]


def _deliver(agent: Agent) -> None:
    agent.flush()
    assert agent.serving is not None
    deadline = time.monotonic() + 180  # a bound that only catches a hang
    while (len(agent.spool) or len(agent.serving.spool)) and time.monotonic() < deadline:
        agent.sender.send_one()
        agent.serving.sender.send_one()
    assert len(agent.spool) == 0 and len(agent.serving.spool) == 0


def test_agent_scrapes_folds_and_delivers(database_url: str, live_server: Callable[..., Any], tmp_path: Path,
                                          engine: tuple[int, list[str]]) -> None:
    port, pages = engine
    server = str(live_server(database_url).url)
    agent = _agent(tmp_path, server, [{"job": "ml/chat-*", "engine": "vllm", "port": port,
                                       "deployment": "llama-chat"}])
    agent.start()
    for i in range(len(pages)):  # one cycle per page, 15 s apart, as the simulator scraped them
        agent.cycle(T0 + 15 * i)
    _deliver(agent)
    agent.serving.close()  # type: ignore[union-attr]

    # what the analysis makes of the same pages, folded the same way (whole minutes only)
    end = T0 + 15 * (len(pages) - 1)
    scrapes = [(T0 + 15 * i, snapshot(parse_exposition(p), "vllm")) for i, p in enumerate(pages)]
    want_ms = [ServingMinute("llama-chat", JOB, m, 2, "vllm", s) for m, s in minutes_of(scrapes).items()
               if m + 60 <= end]
    slo = PRESETS["mlperf-llama3.1-8b"]
    want = summarize("llama-chat", want_ms, slo)
    with httpx.Client(base_url=server, timeout=60) as c:
        one = c.get("/api/v1/deployments/llama-chat", params={"start": str(T0), "end": str(T0 + 600)})
        assert one.status_code == 200, one.text
        doc = one.json()
        (rep,) = doc["replicas"]
        assert rep["replica"] == JOB and rep["gpu_uuids"] == GPUS and rep["job_id"] == JOB
        assert len(doc["series"]) == len(want_ms)
        summ = doc["summary"]
        assert summ["requests"] == want.requests > 0
        assert summ["ttft_attainment"] == pytest.approx(want.ttft_attainment)
        assert summ["tpot_attainment"] == pytest.approx(want.tpot_attainment)
    # the GPU rows went their own way
    assert agent.sender.dead_lettered == 0 and raw_count(database_url) == len(GPUS) * len(pages)


def test_refused_serving_body_is_dead_lettered_and_gpu_rows_arrive(
        database_url: str, live_server: Callable[..., Any], tmp_path: Path, engine: tuple[int, list[str]]) -> None:
    port, _ = engine
    server = str(live_server(database_url).url)
    # a deployment name the intake refuses (longer than 253 characters): every record is refused -> 422
    agent = _agent(tmp_path, server, [{"job": "*", "engine": "vllm", "port": port, "deployment": "d" * 300}])
    agent.start()
    for i in range(12):
        agent.cycle(T0 + 15 * i)
    _deliver(agent)
    assert agent.serving is not None
    assert agent.serving.sender.dead_lettered >= 1 and agent.sender.dead_lettered == 0
    reasons = (agent.serving.spool.dead_dir / "reasons.jsonl").read_text().splitlines()
    assert json.loads(reasons[0])["status"] == 422
    agent.serving.close()
    assert raw_count(database_url) == len(GPUS) * 12
    with httpx.Client(base_url=server, timeout=60) as c:
        r = c.get("/api/v1/deployments", params={"start": str(T0), "end": str(T0 + 600)})
        assert r.status_code == 200 and r.json()["data"] == []


def test_rules_and_engine_detection(engine: tuple[int, list[str]]) -> None:
    _, pages = engine
    assert engine_of_page(pages[0]) == "vllm"
    assert engine_of_page("# HELP up x\nup 1\n") is None
    assert engine_of_page("not { a page") is None
    assert parse_rules(None) == []
    for bad in ("{nope", '{"job": "*"}', '[{"job": "*", "engine": "ollama", "port": 1}]', '[{"engine": "vllm"}]'):
        with pytest.raises(ValueError, match="serving_rules"):
            parse_rules(bad)


def test_discovers_the_jobs_listening_port(tmp_path: Path, engine: tuple[int, list[str]]) -> None:
    """serving_discover on the real /proc: this process listens on the engine's port (and on others
    that are no engine's); the job's GPU processes are this process."""
    port, _ = engine
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        cfg = AgentConfig(collector_url="http://127.0.0.1:9", node="n1", spool_dir=tmp_path / "spool", fsync=False,
                          serving_discover=True, proc_root=Path("/proc"))
        section = ServingSection(cfg)
        readings = [GpuReading(u, {}, pids=(os.getpid(),)) for u in GPUS]
        (t,) = section.targets(dict.fromkeys(GPUS, JOB), readings)
        assert (t.replica, t.engine, t.url) == (JOB, "vllm", f"http://127.0.0.1:{port}/metrics")
        assert section.targets(dict.fromkeys(GPUS, JOB), [GpuReading(u, {}) for u in GPUS]) == []  # no pids
        section.close()
    finally:
        other.shutdown()


def test_run_loop_scrapes_and_stops(tmp_path: Path, engine: tuple[int, list[str]]) -> None:
    """Agent.run starts the serving sender beside the GPU sender, scrapes each cycle, and stops both."""
    port, _ = engine
    cfg = AgentConfig(collector_url="http://127.0.0.1:9", node="n1", spool_dir=tmp_path / "spool", fsync=False,
                      interval_s=0.1, flush_s=0.5, timeout_s=2, infiniband=False, nic_health=False,
                      serving_rules=json.dumps([{"job": "*", "engine": "vllm", "port": port}]))
    agent = Agent(cfg, TwoGpuSource(), attributors=[], enrichers=[])  # type: ignore[arg-type]
    assert agent.serving is not None
    stop = threading.Event()
    th = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    th.start()
    deadline = time.monotonic() + 120
    while agent.serving.scraper.folder.last_time((JOB, JOB)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent.serving.scraper.folder.last_time((JOB, JOB)) is not None, agent.serving.scraper.errors
    names = {t.name for t in threading.enumerate()}
    assert "gpufleet-serving-sender-n1" in names
    stop.set()
    th.join(120)
    assert not th.is_alive()
    assert "gpufleet-serving-sender-n1" not in {t.name for t in threading.enumerate()}
