"""Celery tasks (thin wrappers around ``runner.run_analysis``).

``analyze_due_jobs`` runs from beat every 60 s; ``analyze_job(job_pk)`` analyzes one job on
demand. Both are idempotent (the runner writes only what changed), so a redelivered message
(acks_late: a worker killed mid-task) just redoes the work: each job is its own transaction,
nothing half-written survives, and jobs not reached stay "due" for the next run.

A Redis lock keeps two beat runs from analyzing the same fleet at once (a slow run is not
doubled up by the next tick); it expires by itself, so a killed worker delays the next run by
at most ``LOCK_TTL_S``. After a run that changed flags or reports the alerts engineer's
``gpufleet.alerts.evaluate_alerts`` is nudged, when that task exists."""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from celery import shared_task
from sqlalchemy import Engine

log = logging.getLogger(__name__)

LOCK_KEY = "gpufleet:analysis:due-jobs"
LOCK_TTL_S = float(os.environ.get("GPUFLEET_ANALYSIS_LOCK_TTL_S", "30"))  # refreshed after every job
_REFRESH = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

def _engine_for_process() -> Engine:
    from gpufleet.storage.db import engine_for_process

    return engine_for_process()


def _lock() -> tuple[Any, str] | None:
    """(redis client, token) when we hold the lock; None when another run holds it. Without
    a Redis URL (eager mode, tests) there is nothing to coordinate with: always granted."""
    url = os.environ.get("GPUFLEET_REDIS_URL")
    if not url:
        return (None, "")
    import redis

    client = redis.Redis.from_url(url)
    token = uuid.uuid4().hex
    if client.set(LOCK_KEY, token, nx=True, px=int(LOCK_TTL_S * 1000)):
        return (client, token)
    return None


def _unlock(held: tuple[Any, str]) -> None:
    client, token = held
    if client is None:
        return
    # Delete only our own lock (a run slower than the TTL must not free someone else's).
    client.eval(_RELEASE, 1, LOCK_KEY, token)


def _progress(held: tuple[Any, str]) -> Any:
    """After each job: keep the lock alive (a killed worker stops refreshing it, so the next
    run starts within LOCK_TTL_S), and the test-only crash hook."""
    client, token = held
    crash = os.environ.get("GPUFLEET_ANALYSIS_TEST_CRASH")

    def done(job_pk: int) -> None:
        if client is not None:
            client.eval(_REFRESH, 1, LOCK_KEY, token, int(LOCK_TTL_S * 1000))
        if crash and not os.path.exists(crash):
            # Fault injection for the end-to-end test only: die mid-run, after one job.
            with open(crash, "w") as fh:
                fh.write(str(job_pk))
            os._exit(1)

    return done


ALERTS_TASK = "gpufleet.alerts.evaluate_alerts"


def _nudge_alerts(summary: Any) -> bool:
    """Send the alerts task by name (analysis sits below alerts and does not import it),
    only when the app knows it and this run changed something."""
    if not (summary.job_pks_changed or summary.flags_opened or summary.flags_resolved):
        return False
    app = analyze_due_jobs.app
    if ALERTS_TASK not in app.tasks:
        return False
    app.send_task(ALERTS_TASK)
    return True


def _result(summary: Any) -> dict[str, Any]:
    d = summary.as_dict()
    d["job_pks_changed"] = d["job_pks_changed"][:100]
    d["errors"] = d["errors"][:20]
    return d


@shared_task(name="gpufleet.analysis.analyze_due_jobs", ignore_result=True)
def analyze_due_jobs(now: float | None = None) -> dict[str, Any]:
    from gpufleet.analysis.runner import run_analysis

    held = _lock()
    if held is None:
        return {"skipped": "another analysis run holds the lock"}
    try:
        summary = run_analysis(_engine_for_process(), now=now, on_job_done=_progress(held))
    finally:
        _unlock(held)
    out = _result(summary)
    out["alerts_nudged"] = _nudge_alerts(summary)
    log.info("analysis: %s", {k: v for k, v in out.items() if k != "job_pks_changed"})
    return out


@shared_task(name="gpufleet.analysis.analyze_job", ignore_result=True)
def analyze_job(job_pk: int, now: float | None = None) -> dict[str, Any]:
    from gpufleet.analysis.runner import run_analysis

    summary = run_analysis(_engine_for_process(), now=now, job_pks=[int(job_pk)])
    out = _result(summary)
    out["alerts_nudged"] = _nudge_alerts(summary)
    return out
