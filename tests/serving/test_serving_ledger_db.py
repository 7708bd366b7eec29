"""A serving replica's time in the stored ledger (SQLite and PostgreSQL), end to end: the agent's
GPU rows make the replica's job and its ledger from telemetry; its replica-minutes, POSTed later to
the real collector intake (POST /api/v1/serving/minutes), make the job due again, and the next
pass refolds its ledger with the serving view (productive as served, slo_missed, idle_replica);
the idle_replica flag's waste is its share of that ledger, and the fleet summary puts it under
serving."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.runner import Agent
from gpufleet.agent.sources.base import GpuReading
from gpufleet.analysis.runner import due_jobs, run_analysis
from gpufleet.serving_expo import Hist, measures_to_json
from gpufleet.storage.db import make_engine
from gpufleet.storage.gpu_ledger import read_job_ledger
from gpufleet.storage.models import Job

from .test_agent_serving import GPUS, JOB, TwoGpuSource

NOW = time.time()
END = int(NOW // 60 * 60)
T0 = END - 20 * 60  # the replica ran the last 20 whole minutes
TTFT = Hist((1.0, 2.0, math.inf), (80.0, 90.0, 100.0), 50.0)  # 90% within the 2 s SLO
TPOT = Hist((0.05, 0.1, math.inf), (95.0, 100.0, 100.0), 3.0)  # all within 100 ms


def _minutes() -> list[dict[str, Any]]:
    """5 busy minutes (90% of requests within the SLOs), then 15 idle ones."""
    out = []
    for i in range(20):
        measures = ({"requests": 100.0, "ttft": TTFT, "tpot": TPOT} if i < 5
                    else {"requests": 0.0, "running": 0.0, "waiting": 0.0})
        out.append({"deployment": "chat", "replica": JOB, "minute": T0 + 60 * i, "engine": "vllm", "gpus": 2,
                    "gpu_uuids": GPUS, "job_id": JOB, "measures": measures_to_json(measures)})
    return out


def _gpu_rows(server: str, tmp_path: Path, source: TwoGpuSource | None = None) -> None:
    """The agent's GPU rows every 10 s over the 20 minutes (they make the job and its telemetry)."""
    cfg = AgentConfig(collector_url=server, node="n1", spool_dir=tmp_path / "spool", fsync=False, infiniband=False,
                      nic_health=False)
    agent = Agent(cfg, source or TwoGpuSource(), attributors=[], enrichers=[])  # type: ignore[arg-type]
    agent.start()
    for i in range(120):
        agent.cycle(T0 + 5 + 10 * i)
    agent.flush()
    deadline = time.monotonic() + 180  # a bound that only catches a hang
    while len(agent.spool) and time.monotonic() < deadline:
        agent.sender.send_one()
    assert len(agent.spool) == 0 and agent.sender.dead_lettered == 0


class QuietGpus(TwoGpuSource):
    """The replica's GPUs at SM activity 0.15 (a small share of what they could serve)."""

    def read(self, now: float) -> list[GpuReading]:
        return [GpuReading(u, {"gpu_util": 0.3, "sm_active": 0.15}) for u in GPUS]


def _hours(rows: list[tuple[int, str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for _, cat, secs in rows:
        out[cat] = out.get(cat, 0.0) + secs / 3600
    return out


def test_serving_minutes_arriving_later_refold_the_replicas_ledger(database_url: str,
                                                                   live_server: Callable[..., Any],
                                                                   tmp_path: Path) -> None:
    server = str(live_server(database_url).url)
    _gpu_rows(server, tmp_path)
    engine = make_engine(database_url)
    try:
        s = run_analysis(engine, now=NOW)
        assert not s.errors, s.errors
        with engine.connect() as c:
            pk = c.execute(select(Job.id).where(Job.job_id == JOB)).scalar_one()
            before = _hours(read_job_ledger(c, pk))
            assert pk not in due_jobs(c, NOW + 1)  # analysed up to its last sample: nothing new
        assert not {"slo_missed", "idle_replica"} & set(before)

        r = httpx.post(f"{server}/api/v1/serving/minutes", timeout=60,
                       json={"cluster": "default", "node": "n1", "minutes": _minutes()})
        assert r.status_code == 200 and r.json()["stored"] == 20, r.text
        with engine.connect() as c:
            assert pk in due_jobs(c, NOW + 1)  # its replica-minutes are recent: due again
        s = run_analysis(engine, now=NOW + 1)
        assert not s.errors, s.errors
        with engine.connect() as c:
            after = _hours(read_job_ledger(c, pk))
        allocated = sum(before.values())
        assert abs(sum(after.values()) - allocated) < 1e-3  # still every allocated second once
        # 5 busy minutes x 2 GPUs, 10% missed; 15 idle minutes x 2 GPUs (the first and the last minute
        # hold 55 allocated seconds per GPU, from the first sample to the last: scaled to them)
        assert abs(after["slo_missed"] - (55 + 4 * 60) * 2 * 0.1 / 3600) < 1e-4, after
        assert abs(after["idle_replica"] - (14 * 60 + 55) * 2 / 3600) < 1e-4, after
        assert abs(after["productive"] - (55 + 4 * 60) * 2 * 0.9 / 3600) < 1e-4, after

        with httpx.Client(base_url=server, timeout=60) as c:
            led = c.get(f"/api/v1/jobs/{JOB}/ledger").json()
            assert led["categories"]["idle_replica"] == round(after["idle_replica"], 4)
            (flag,) = c.get("/api/v1/flags", params={"kind": "idle_replica"}).json()["data"]
            # the flag's waste: the idle_replica seconds of its episode (the whole window here)
            assert flag["open"] and flag["wasted_gpu_hours"] == round(after["idle_replica"], 4)
            (mine,) = [f for f in led["flags"] if f["kind"] == "idle_replica"]
            assert mine["wasted_gpu_hours"] == flag["wasted_gpu_hours"]
            fleet = c.get("/api/v1/fleet/summary", params={"window": "1h"}).json()
            serving = fleet["wasted_by_workload"]["serving"]
            assert serving["jobs"] == 1 and serving["wasted_gpu_hours"]["idle_replica"] == round(
                after["idle_replica"], 4)
            assert fleet["wasted_by_workload"]["training"]["jobs"] == 0

        # a second pass over the same minutes writes no ledger row
        with engine.connect() as c:
            rows = read_job_ledger(c, pk)
        run_analysis(engine, now=NOW + 2)
        with engine.connect() as c:
            assert read_job_ledger(c, pk) == rows
    finally:
        engine.dispose()


def test_an_overprovisioned_deployment_books_its_spare_gpus(database_url: str, live_server: Callable[..., Any],
                                                            tmp_path: Path) -> None:
    """Two replicas (one GPU each) of one job, both nearly idle in KV, far under the SLOs and with
    a request in flight a third of the time, and each GPU's SM activity at 0.15 (the GPU rows'
    minute features size the compute: 0.3 of a GPU): the serving pass opens overprovisioned_deployment
    (1 of 2 GPUs needed); the next pass books half of the served seconds of its episode to it,
    and the flag's waste is that share."""
    server = str(live_server(database_url).url)
    _gpu_rows(server, tmp_path, QuietGpus())
    fast = Hist((0.05, 0.1, math.inf), (100.0, 100.0, 100.0), 2.0)
    quick = Hist((0.005, 0.01, math.inf), (100.0, 100.0, 100.0), 0.3)
    minutes = [{"deployment": "chat", "replica": f"r{r}", "minute": T0 + 60 * i, "engine": "vllm", "gpus": 1,
                "gpu_uuids": [GPUS[r]], "job_id": JOB,
                "measures": measures_to_json({"requests": 100.0, "ttft": fast, "tpot": quick, "kv_usage": 0.1,
                                              "waiting": 0.0, "running": 0.3})}
               for r in range(2) for i in range(20)]
    r = httpx.post(f"{server}/api/v1/serving/minutes", timeout=60,
                   json={"cluster": "default", "node": "n1", "minutes": minutes})
    assert r.status_code == 200 and r.json()["stored"] == 40, r.text
    engine = make_engine(database_url)
    try:
        s = run_analysis(engine, now=NOW)
        assert not s.errors, s.errors
        s = run_analysis(engine, now=NOW + 1)  # the flag's episode enters the ledger
        assert not s.errors, s.errors
        with engine.connect() as c:
            pk = c.execute(select(Job.id).where(Job.job_id == JOB)).scalar_one()
            led = _hours(read_job_ledger(c, pk))
        with httpx.Client(base_url=server, timeout=60) as c:
            (flag,) = c.get("/api/v1/flags", params={"kind": "overprovisioned_deployment"}).json()["data"]
        assert flag["evidence"]["gpus"] == 2 and flag["evidence"]["needed_gpus"] == 1
        assert abs(led["overprovisioned_deployment"] - led["productive"]) < 1e-3, led  # half of what was served
        assert flag["wasted_gpu_hours"] == round(led["overprovisioned_deployment"], 4)
        assert abs(sum(led.values()) - 2 * 1190 / 3600) < 1e-3  # still the allocation, once
    finally:
        engine.dispose()
