"""storage.maintenance: the one owner of housekeeping. A pass ends stale jobs (and their open
allocations), keeps partitions ahead and applies retention, on both databases; a failing step is
reported and does not stop the others or the loop."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import select

from gpufleet.storage.maintenance import DefaultPolicy, MaintenanceLoop, run_once
from gpufleet.storage.models import Allocation, Job
from tests.alerts.alert_rows import add_job


def _states(engine: Any) -> dict[str, tuple[str, float | None]]:
    with engine.connect() as c:
        return {j: (s, e) for j, s, e in c.execute(select(Job.job_id, Job.state, Job.end_ts))}


def test_a_pass_ends_stale_jobs_only(engine: Any) -> None:
    now = time.time()
    add_job(engine, "stale", start=now - 3600)
    add_job(engine, "fresh", start=now - 60, node="node-b")
    res = run_once(engine, now, DefaultPolicy(stale_job_s=300))
    assert res.errors == [] and res.jobs_closed == 1
    states = _states(engine)
    assert states["stale"] == ("ended", now - 3600)  # ended at its last sign of life, not now
    assert states["fresh"] == ("running", None)
    with engine.connect() as c:
        open_allocs = c.execute(select(Allocation.job_pk).where(Allocation.end_ts.is_(None))).scalars().all()
    assert len(open_allocs) == 4  # only the fresh job's GPUs are still allocated
    assert res.retention is not None  # due on the first pass
    again = run_once(engine, now, DefaultPolicy(stale_job_s=300), retention_due=False)
    assert (again.jobs_closed, again.retention, again.errors) == (0, None, [])  # idempotent


def test_a_failing_step_is_reported_and_the_rest_still_run(engine: Any) -> None:
    from gpufleet.storage import retention

    now = time.time()
    add_job(engine, "stale", start=now - 3600)

    def broken(*_: Any, **__: Any) -> int:
        raise RuntimeError("lock timeout\nsecond line")

    saved = retention.ensure_ahead
    retention.ensure_ahead = broken  # type: ignore[assignment]
    try:
        res = run_once(engine, now, DefaultPolicy())
    finally:
        retention.ensure_ahead = saved  # type: ignore[assignment]
    assert res.errors == ["partitions: lock timeout"]
    assert res.jobs_closed == 1 and res.retention is not None


def test_the_loop_runs_passes_until_stopped(sqlite_url: str) -> None:
    from gpufleet.storage.db import make_engine

    engine = make_engine(sqlite_url)
    add_job(engine, "stale", start=time.time() - 3600)
    loop = MaintenanceLoop(engine, DefaultPolicy(interval_s=0.05))
    with loop:
        deadline = time.monotonic() + 10
        while loop.passes < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert loop.passes >= 3
    assert _states(engine)["stale"][0] == "ended"
    n = loop.passes
    time.sleep(0.2)
    assert loop.passes == n, "stopped means stopped"
    engine.dispose()


@pytest.mark.slow
@pytest.mark.redis
def test_gpufleet_worker_runs_the_housekeeping(sqlite_url: str, redis_url: str, tmp_path: Any) -> None:
    """`gpufleet worker` alone (no collector anywhere) still ends stale jobs, and its Celery
    worker comes up: the settings reach it from flags and the environment, none written back."""
    import os
    import subprocess
    import sys

    from gpufleet.storage.db import make_engine

    engine = make_engine(sqlite_url)
    add_job(engine, "stale", start=time.time() - 3600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["GPUFLEET_MAINTENANCE_INTERVAL_S"] = "0.5"
    broker = redis_url.rsplit("/", 1)[0] + "/9"
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "worker", "--database-url", sqlite_url,
                                 "--redis-url", broker, "--concurrency", "1", "--data-dir", str(tmp_path)],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (_states(engine)["stale"][0] == "ended"
                                                    and "ready." in log.read_text()):
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert _states(engine)["stale"][0] == "ended", log.read_text()[-3000:]
        assert "ready." in log.read_text(), log.read_text()[-3000:]
    finally:
        proc.terminate()
        proc.wait(30)
        engine.dispose()
