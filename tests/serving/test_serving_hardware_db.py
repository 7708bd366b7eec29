"""The serving detectors see a replica's GPUs in production, not only in the simulator's
evaluation: replica-minutes stored through the real intake are joined with the minute features
the agent's GPU rows folded at ingest (SQLite and PostgreSQL). An engine that reports a full batch
while its GPUs' SM activity sits near zero is engine_hw_disagree, with the measured activity in
the evidence; the same minutes without GPU samples leave the activity unknown and raise nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.sources.base import GpuReading
from gpufleet.analysis.runner import run_analysis
from gpufleet.serving_expo import Hist, measures_to_json
from gpufleet.storage.db import make_engine

from .test_agent_serving import GPUS, JOB, TwoGpuSource
from .test_serving_ledger_db import NOW, T0, _gpu_rows


class StalledGpus(TwoGpuSource):
    """The replica's two GPUs barely run a kernel (SM activity 0.02)."""

    def read(self, now: float) -> list[GpuReading]:
        return [GpuReading(u, {"gpu_util": 0.05, "sm_active": 0.02}) for u in GPUS]


def _minutes() -> list[dict[str, Any]]:
    ok = Hist((0.5, 1.0, math.inf), (100.0, 100.0, 100.0), 20.0)
    tok = Hist((0.05, 0.1, math.inf), (100.0, 100.0, 100.0), 2.0)
    return [{"deployment": "chat", "replica": JOB, "minute": T0 + 60 * i, "engine": "vllm", "gpus": 2,
             "gpu_uuids": GPUS, "job_id": JOB,
             "measures": measures_to_json({"requests": 100.0, "ttft": ok, "tpot": tok, "running": 16.0,
                                           "waiting": 0.0, "kv_usage": 0.4})}
            for i in range(20)]


def _post_minutes(server: str) -> None:
    r = httpx.post(f"{server}/api/v1/serving/minutes", timeout=60,
                   json={"cluster": "default", "node": "n1", "minutes": _minutes()})
    assert r.status_code == 200 and r.json()["stored"] == 20, r.text


def _stored_and_judged(server: str, database_url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Post the replica-minutes, run one analysis pass, and read the deployment and its flags."""
    _post_minutes(server)
    engine = make_engine(database_url)
    try:
        assert not run_analysis(engine, now=NOW).errors
    finally:
        engine.dispose()
    with httpx.Client(base_url=server, timeout=60) as c:
        d = c.get("/api/v1/deployments/chat", params={"start": T0, "end": T0 + 1200}).json()
        flags = c.get("/api/v1/flags", params={"kind": "engine_hw_disagree"}).json()["data"]
    return d, flags


def test_a_full_batch_on_stalled_gpus_is_engine_hw_disagree(database_url: str, live_server: Callable[..., Any],
                                                            tmp_path: Path) -> None:
    server = str(live_server(database_url).url)
    _gpu_rows(server, tmp_path, StalledGpus())
    d, flags = _stored_and_judged(server, database_url)
    (finding,) = [f for f in d["findings"] if f["kind"] == "engine_hw_disagree"]
    assert abs(finding["evidence"]["sm_active_mean"] - 0.02) < 1e-3, finding
    assert len(flags) == 1 and flags[0]["job_id"] == JOB


def test_without_gpu_samples_the_hardware_side_is_unknown(database_url: str, live_server: Callable[..., Any]) -> None:
    server = str(live_server(database_url).url)
    d, flags = _stored_and_judged(server, database_url)
    assert not [f for f in d["findings"] if f["kind"] == "engine_hw_disagree"] and flags == []
