"""Celery tasks (thin wrappers around ``runner.run_analysis``).

``analyze_due_jobs`` runs from beat every 60 s; ``analyze_job(job_pk)`` analyzes one job on
demand. Both are idempotent (the runner writes only what changed), so a redelivered message
(acks_late: a worker killed mid-task) just redoes the work: each job is its own transaction,
nothing half-written survives, and jobs not reached stay "due" for the next run.

A Redis lock keeps two beat runs from analyzing the same fleet at once (a slow run is not
doubled up by the next tick); it expires by itself, so a killed worker delays the next run by
at most ``analysis.lock_ttl_s``. After a run that changed flags or reports the alerts engineer's
``gpufleet.alerts.evaluate_alerts`` is nudged, when that task exists.

Settings come from the Celery app the tasks are bound to (``settings_of``)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from celery import shared_task
from sqlalchemy import Engine

from gpufleet.settings import Settings, settings_of

log = logging.getLogger(__name__)

LOCK_KEY = "gpufleet:analysis:due-jobs"
_REFRESH = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

# Called with each job's pk after it is analyzed and committed, inside the task. An extension
# point (progress metrics, and the tests' crash injection: tests/support/crash_worker.py).
job_done_hooks: list[Callable[[int], None]] = []


def _settings() -> Settings:
    return settings_of(analyze_due_jobs.app)


def _engine_for_process(settings: Settings) -> Engine:
    from gpufleet.storage.db import engine_for_process

    return engine_for_process(settings.database_url())


def _thresholds(settings: Settings) -> Any:
    from gpufleet.analysis.config import load_thresholds

    path = settings.analysis.thresholds
    return load_thresholds(str(path) if path else None)


_caches: dict[float, Any] = {}


def _cache(settings: Settings) -> Any:
    """This process's job-feature cache, sized by the settings (one per size, in practice one)."""
    from gpufleet.analysis.state import StateCache

    mb = settings.analysis.cache_mb
    if mb not in _caches:
        _caches[mb] = StateCache(max_bytes=int(mb * 2**20))
    return _caches[mb]


def _lock(settings: Settings) -> tuple[Any, str, int] | None:
    """(redis client, token, ttl ms) when we hold the lock; None when another run holds it.
    Without a Redis URL (eager mode, tests) there is nothing to coordinate with: always granted."""
    ttl_ms = int(settings.analysis.lock_ttl_s * 1000)
    url = settings.celery.redis_url
    if not url:
        return (None, "", ttl_ms)
    import redis

    client = redis.Redis.from_url(url)
    token = uuid.uuid4().hex
    if client.set(LOCK_KEY, token, nx=True, px=ttl_ms):
        return (client, token, ttl_ms)
    return None


def _unlock(held: tuple[Any, str, int]) -> None:
    client, token, _ = held
    if client is None:
        return
    # Delete only our own lock (a run slower than the TTL must not free someone else's).
    client.eval(_RELEASE, 1, LOCK_KEY, token)


def _progress(held: tuple[Any, str, int]) -> Callable[[int], None]:
    """After each job: keep the lock alive (a killed worker stops refreshing it, so the next
    run starts within the TTL), then the hooks."""
    client, token, ttl_ms = held

    def done(job_pk: int) -> None:
        if client is not None:
            client.eval(_REFRESH, 1, LOCK_KEY, token, ttl_ms)
        for hook in job_done_hooks:
            hook(job_pk)

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
    d: dict[str, Any] = summary.as_dict()
    d["job_pks_changed"] = d["job_pks_changed"][:100]
    d["errors"] = d["errors"][:20]
    return d


@shared_task(name="gpufleet.analysis.analyze_due_jobs", ignore_result=True)
def analyze_due_jobs(now: float | None = None) -> dict[str, Any]:
    from gpufleet.analysis.runner import run_analysis

    settings = _settings()
    held = _lock(settings)
    if held is None:
        return {"skipped": "another analysis run holds the lock"}
    try:
        summary = run_analysis(_engine_for_process(settings), now=now, thresholds=_thresholds(settings),
                               cache=_cache(settings), on_job_done=_progress(held))
    finally:
        _unlock(held)
    out = _result(summary)
    out["alerts_nudged"] = _nudge_alerts(summary)
    log.info("analysis: %s", {k: v for k, v in out.items() if k != "job_pks_changed"})
    return out


@shared_task(name="gpufleet.analysis.analyze_job", ignore_result=True)
def analyze_job(job_pk: int, now: float | None = None) -> dict[str, Any]:
    from gpufleet.analysis.runner import run_analysis

    settings = _settings()
    summary = run_analysis(_engine_for_process(settings), now=now, job_pks=[int(job_pk)],
                           thresholds=_thresholds(settings), cache=_cache(settings))
    out = _result(summary)
    out["alerts_nudged"] = _nudge_alerts(summary)
    return out
