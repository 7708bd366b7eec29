"""End to end in production mode: real PostgreSQL, real Redis, a real Celery worker process
with beat. Samples go in through POST /api/v1/ingest; beat sends analyze_due_jobs every 2 s;
the worker process is killed in the middle of a run (after one job) and the analysis still
completes: every job gets its report and flags, nothing is lost or half-written."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.agent.simulator import make_job

from .conftest import sim_batches

CRASH_WORKER = Path(__file__).resolve().parent.parent / "support" / "crash_worker.py"
pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def _wait(pred: Any, timeout: float, what: str, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.25)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out waiting for {what}\n--- worker log ---\n{tail}")


def test_ingest_worker_beat_flags_survive_a_killed_worker(pg_url: str, redis_url: str, live_server: Any,
                                                          tmp_path: Path) -> None:
    import httpx

    from gpufleet import protocol
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.models import Flag, Job, JobReport

    srv = live_server(pg_url)
    now = time.time()
    start = now - 40 * 60
    jobs = [make_job("idle_gpu", "e2e-idle", 2, start, 4 * 3600, node_prefix="e2e"),
            make_job("input_stall", "e2e-stall", 2, start, 4 * 3600, node_prefix="e2e"),
            make_job("vision_train", "e2e-good", 2, start, 4 * 3600, node_prefix="e2e")]
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for job in jobs:
            for b in sim_batches(job, start, now - 2, chunk_s=600):
                body, headers = protocol.encode(b)
                r = c.post("/api/v1/ingest", content=body, headers=headers)
                assert r.status_code == 200, r.text

    broker = redis_url.rsplit("/", 1)[0] + "/7"  # our own Redis database: no other test's queue
    crash = tmp_path / "crashed"
    log = tmp_path / "worker.log"
    env = {**os.environ, "GPUFLEET_REDIS_URL": broker, "GPUFLEET_DATABASE_URL": pg_url,
           "GPUFLEET_ANALYSIS_INTERVAL_S": "2", "GPUFLEET_ANALYSIS_LOCK_TTL_S": "4"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(CRASH_WORKER), "analysis", str(crash), "--", "worker", "--beat", "--concurrency=1",
             "--loglevel=INFO", f"--schedule={tmp_path / 'beat-schedule'}", "--without-gossip", "--without-mingle"],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    engine = make_engine(pg_url)
    try:
        _wait(crash.exists, 90, "the worker to die mid-run", log)

        def done() -> dict[str, set[str]] | None:
            with engine.connect() as c:
                reps = c.execute(select(Job.job_id).join(JobReport, JobReport.job_pk == Job.id)).scalars().all()
                if len(reps) < 3:
                    return None
                rows = c.execute(select(Job.job_id, Flag.kind, Flag.open).join(Flag, Flag.job_pk == Job.id)).all()
            out: dict[str, set[str]] = {j.job_id: set() for j in jobs}
            for jid, kind, is_open in rows:
                assert is_open  # running jobs: the problems are going on now
                out[jid].add(kind)
            return out

        flags = _wait(done, 120, "every job analyzed after the crash", log)
        assert flags == {"e2e-idle": {"idle_gpu"}, "e2e-stall": {"input_stall"}, "e2e-good": set()}
        assert proc.poll() is None, "the worker's main process survives its child's death"
        # ... and the API serves them: ingest -> tasks -> flags in the API.
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for job_id, kinds in (("e2e-idle", {"idle_gpu"}), ("e2e-stall", {"input_stall"}), ("e2e-good", set())):
                r = c.get(f"/api/v1/jobs/{job_id}")
                assert r.status_code == 200, r.text
                assert {f["kind"] for f in r.json()["flags"]} == kinds
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        engine.dispose()
