"""Serving findings stored as flags by the periodic analysis pass (SQLite and PostgreSQL): a replica
idle for 20 minutes gets an open idle_replica flag on its job, shown by GET /api/v1/flags; when the
minutes no longer show it, the flag resolves and the hardware runner leaves the row alone."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.runner import Agent
from gpufleet.alerts.config import AlertConfig
from gpufleet.alerts.decide import alerting_kinds
from gpufleet.alerts.facts import FlagFact, JobFacts
from gpufleet.analysis.runner import run_analysis
from gpufleet.storage.db import make_engine

from .test_agent_serving import JOB, TwoGpuSource

NOW = time.time()
END = int(NOW // 60 * 60)


def _idle_minutes(n: int) -> list[dict[str, Any]]:
    return [{"deployment": "chat", "replica": JOB, "minute": END - 60 * (n - i), "engine": "vllm", "gpus": 2,
             "gpu_uuids": ["GPU-aaaa-0", "GPU-aaaa-1"], "job_id": JOB,
             "measures": {"requests": 0.0, "running": 0.0, "waiting": 0.0}} for i in range(n)]


def _idle_replica(server: str, tmp_path: Path) -> None:
    """The replica's job exists because its GPUs reported (the agent's GPU rows); 20 idle minutes."""
    agent = Agent(AgentConfig(collector_url=server, node="n1", spool_dir=tmp_path / "spool", fsync=False,
                              infiniband=False, nic_health=False), TwoGpuSource(), attributors=[], enrichers=[])  # type: ignore[arg-type]
    agent.start()
    for i in range(3):
        agent.cycle(NOW - 30 + 10 * i)
    agent.flush()
    deadline = time.monotonic() + 180
    while len(agent.spool) and time.monotonic() < deadline:
        agent.sender.send_one()
    assert len(agent.spool) == 0 and agent.sender.dead_lettered == 0
    r = httpx.post(f"{server}/api/v1/serving/minutes", timeout=60,
                   json={"cluster": "default", "node": "n1", "minutes": _idle_minutes(20)})
    assert r.status_code == 200 and r.json()["stored"] == 20, r.text


def test_idle_replica_becomes_a_flag_and_resolves(database_url: str, live_server: Callable[..., Any],
                                                  tmp_path: Path) -> None:
    server = str(live_server(database_url).url)
    _idle_replica(server, tmp_path)
    engine = make_engine(database_url)
    try:
        with httpx.Client(base_url=server, timeout=60) as c:
            s = run_analysis(engine, now=NOW)
            assert not s.errors, s.errors
            flags = c.get("/api/v1/flags", params={"kind": "idle_replica"}).json()["data"]
            (f,) = flags
            assert f["open"] and f["scope"] == f"serving:chat:{JOB}" and f["job_id"] == JOB
            assert f["suggestion"] and f["evidence"]
            # the hardware runner re-analyses the job and leaves the serving flag as it is
            run_analysis(engine, now=NOW + 1)
            (again,) = c.get("/api/v1/flags", params={"kind": "idle_replica"}).json()["data"]
            assert again["open"] and again["opened_at"] == f["opened_at"]
            # an hour later no minute shows an idle stretch: resolved, the row kept
            run_analysis(engine, now=NOW + 3 * 3600)
            (done,) = c.get("/api/v1/flags", params={"kind": "idle_replica"}).json()["data"]
            assert not done["open"] and done["resolved_at"] is not None
    finally:
        engine.dispose()


def test_slo_missed_pages_under_the_slo_burn_rule() -> None:
    """A stored slo_missed flag claims no GPU-hours, so the waste rule would never page it; slo_burn does."""
    now = time.time()
    flag = FlagFact(kind="slo_missed", scope=f"serving:chat:{JOB}", severity="warning", wasted_gpu_hours=0.0,
                    evidence={"cause": "queueing"}, start_ts=now - 3600, end_ts=now)
    job = JobFacts(job_pk=1, cluster="default", job_id=JOB, start_ts=now - 600, n_gpus=2, flags=(flag,))
    assert "slo_missed" in alerting_kinds(job, AlertConfig(), now)
    idle = FlagFact(kind="idle_replica", scope=f"serving:chat:{JOB}", severity="warning", wasted_gpu_hours=0.0,
                    evidence={}, start_ts=now - 3600, end_ts=now)
    assert alerting_kinds(JobFacts(job_pk=1, cluster="default", job_id=JOB, start_ts=now - 600, n_gpus=2,
                                   flags=(idle,)), AlertConfig(), now) == {}


def test_the_celery_shard_zero_runs_the_serving_pass(database_url: str, live_server: Callable[..., Any],
                                                     redis_url: str, tmp_path: Path) -> None:
    """Production analysis runs as shards with their job lists: shard 0 also runs the serving pass."""
    from gpufleet.analysis import tasks
    from gpufleet.celery_app import make_celery
    from gpufleet.settings import Settings

    server = str(live_server(database_url).url)
    _idle_replica(server, tmp_path)
    app = make_celery(Settings.from_env({"GPUFLEET_DATABASE_URL": database_url, "GPUFLEET_REDIS_URL": redis_url,
                                         "GPUFLEET_ANALYSIS_SHARDS": "2"}))
    app.conf.task_always_eager = True
    try:
        one = tasks.analyze_shard.apply((1, 2, NOW)).get()
        assert "serving_flags_opened" not in one
        zero = tasks.analyze_shard.apply((0, 2, NOW)).get()
    finally:
        app.close()
    assert zero["serving_flags_opened"] == 1, zero
    (f,) = httpx.get(f"{server}/api/v1/flags", params={"kind": "idle_replica"}, timeout=60).json()["data"]
    assert f["open"] and f["job_id"] == JOB
