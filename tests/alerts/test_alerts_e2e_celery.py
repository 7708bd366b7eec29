"""End to end: real PostgreSQL, real Redis, a real Celery worker subprocess, the local Slack
stand-in. An inefficient job gives one message (through a 429, a 500 and a worker crash right
after the send was recorded), a healthy job none, a silenced job none, recovery the resolved
message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from alert_rows import add_flag, add_job, add_report, close_flags
from sqlalchemy import insert, select

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(1200)]  # waits catch hangs

RULES = """
lifecycle: {repeat_interval: 4h, send_resolved: true}
cost: {price_per_gpu_hour: 2.0}
delivery: {rate_per_s: 5, burst: 2, timeout: 1s, max_attempts: 6, backoff_base: 0.1s, backoff_max: 0.5s,
           lease: 2s, max_inline_wait: 0.5s}
"""


def wait_for(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def worker(pg_url: str, redis_url: str, fake_slack: Any, tmp_path: Path) -> Any:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    marker = tmp_path / "crashed"
    env = {**os.environ, "GPUFLEET_DATABASE_URL": pg_url, "GPUFLEET_REDIS_URL": redis_url,
           "GPUFLEET_SLACK_WEBHOOK_URL": fake_slack.url, "GPUFLEET_ALERT_RULES": str(rules),
           "GPUFLEET_PUBLIC_URL": "http://fleet.test"}
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - closed below
    crash_worker = str(Path(__file__).resolve().parent.parent / "support" / "crash_worker.py")
    proc = subprocess.Popen([sys.executable, crash_worker, "alerts:after_sent", str(marker), "--",
                             "worker", "--pool=prefork", "--concurrency=1",
                             "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
                             "-n", f"alerts-e2e-{os.getpid()}@localhost"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    from gpufleet.celery_app import make_celery
    from gpufleet.settings import Settings

    app = make_celery(Settings.of({"celery": {"redis_url": redis_url}}))
    try:
        wait_for(lambda: proc.poll() is not None or (tmp_path / "worker.log").read_text().count("ready.") > 0,
                 60, "worker start")
        assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        yield app, marker, tmp_path / "worker.log"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def test_end_to_end_with_redis_and_a_celery_worker(pg_url, fake_slack, worker) -> None:  # type: ignore[no-untyped-def]
    from gpufleet.storage.alert_models import AlertOutbox, AlertSilence
    from gpufleet.storage.db import make_engine

    app, marker, logfile = worker
    engine = make_engine(pg_url)
    now = time.time()
    try:
        bad = add_job(engine, "7001", user="alice", name="llama <!channel>", start=now - 3 * 3600, node="n1")
        add_report(engine, bad, now=now, score=0.2, wasted=9.0)
        add_flag(engine, bad, "idle_gpu", severity="critical", wasted=6.0, now=now)
        add_flag(engine, bad, "input_stall", wasted=3.0, now=now)
        healthy = add_job(engine, "7002", user="bob", start=now - 3 * 3600, node="n2")
        add_report(engine, healthy, now=now, score=0.92, wasted=0.1)
        muted = add_job(engine, "7003", user="carol", start=now - 3 * 3600, node="n3")
        add_flag(engine, muted, "low_sm_activity", wasted=4.0, now=now)
        with engine.begin() as c:
            c.execute(insert(AlertSilence).values(user="carol", reason="profiling", created_by="t", created_at=now,
                                                  expires_at=now + 3600))

        fake_slack.script = [429, 500]
        fake_slack.retry_after = "0.5"
        app.send_task("gpufleet.alerts.evaluate_alerts")
        (msg,) = fake_slack.wait_delivered(1, timeout=60)
        assert "7001" in msg.body["text"] and "<!channel>" not in str(msg.body)
        assert "Idle GPUs" in str(msg.body["blocks"]) and "18.00 USD" in str(msg.body["blocks"])
        # the worker died right after recording the send; Celery redelivered the task to a new
        # process, which found the row sent and did nothing
        wait_for(marker.exists, 120, "the injected worker crash")
        wait_for(lambda: "WorkerLostError" in logfile.read_text() or "exited with" in logfile.read_text(),
                 30, "the worker to report the lost process")
        time.sleep(3)
        assert len(fake_slack.delivered()) == 1
        statuses = [p.status for p in fake_slack.posts]
        assert statuses == [429, 500, 200], statuses

        # evaluating again changes nothing: no second message for the same state
        app.send_task("gpufleet.alerts.evaluate_alerts")
        time.sleep(3)
        assert len(fake_slack.delivered()) == 1

        # recovery: the flags close, the resolved message goes out
        close_flags(engine, bad, time.time())
        app.send_task("gpufleet.alerts.evaluate_alerts")
        msgs = fake_slack.wait_delivered(2, timeout=30)
        assert len(msgs) == 2 and msgs[1].body["text"].startswith("Resolved")
        time.sleep(2)
        assert len(fake_slack.delivered()) == 2  # healthy and silenced jobs: never a message
        assert not any("7002" in p.body["text"] or "7003" in p.body["text"] for p in fake_slack.posts)
        with engine.connect() as c:
            rows = c.execute(select(AlertOutbox.__table__)).all()
        assert sorted(r.state for r in rows) == ["sent", "sent"]
        assert len({r.idempotency_key for r in rows}) == 2
    finally:
        engine.dispose()
