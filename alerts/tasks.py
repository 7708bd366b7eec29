"""Celery tasks (thin): evaluate alerts, deliver one outbox row, sweep the outbox.

``shared_task`` binds to the app that includes this module (``gpufleet.celery_app``) without
importing it (alerts sits below the top layer). The outbox row is the truth; a Celery message
is only a nudge, so a lost or duplicated message costs a delay, never a lost or double post:
``sweep_outbox`` (run after every evaluation) finds rows nobody is working on.

Settings come from the Celery app the tasks are bound to (``settings_of``)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from celery import shared_task
from sqlalchemy import Engine

from gpufleet.alerts.config import AlertConfig
from gpufleet.alerts.ratelimit import Limiter, MemoryLimiter, RedisLimiter
from gpufleet.settings import Settings, settings_of

log = logging.getLogger(__name__)

# Called with the stage name ("before_post", "after_sent", ...) while a notification is being
# delivered (``outbox.deliver_one``'s hook). An extension point; the tests' crash injection
# uses it (tests/support/crash_worker.py).
delivery_hooks: list[Callable[[str], None]] = []


def _run_hooks(stage: str) -> None:
    for hook in delivery_hooks:
        hook(stage)


def _settings() -> Settings:
    return settings_of(evaluate_alerts.app)


def _engine_for_process(settings: Settings) -> Engine:
    from gpufleet.storage.db import engine_for_process

    return engine_for_process(settings.database_url())


def _config(settings: Settings) -> AlertConfig:
    from gpufleet.alerts.runner import alert_config

    return alert_config(settings)


_limiters: dict[tuple[int, str, float, int], Limiter] = {}


def _limiter(config: AlertConfig, settings: Settings) -> Limiter:
    """Shared across workers through Redis; one client per process and settings."""
    url = settings.celery.redis_url or ""
    key = (os.getpid(), url, config.delivery.rate_per_s, config.delivery.burst)
    if key not in _limiters:
        _limiters[key] = (RedisLimiter(url, key[2], key[3]) if url else MemoryLimiter(key[2], key[3]))
    return _limiters[key]


@shared_task(name="gpufleet.alerts.evaluate_alerts", ignore_result=True)
def evaluate_alerts(now: float | None = None) -> dict[str, Any]:
    from gpufleet.alerts.runner import evaluate

    settings = _settings()
    config = _config(settings)
    if not config.enabled:
        return {"enabled": False}
    res = evaluate(_engine_for_process(settings), config, now)
    for oid in res.outbox_ids:
        deliver_notification.delay(oid)
    sweep_outbox.delay()
    return {"enabled": True, "queued": len(res.outbox_ids), "jobs": res.jobs_seen}


@shared_task(name="gpufleet.alerts.deliver_notification", bind=True, ignore_result=True, max_retries=None)
def deliver_notification(self: Any, outbox_id: int) -> str:
    from gpufleet.alerts.outbox import deliver_one

    settings = _settings()
    config = _config(settings)
    res = deliver_one(_engine_for_process(settings), outbox_id, config, _limiter(config, settings),
                      hook=_run_hooks if delivery_hooks else None)
    if res.retry_in is not None and res.state in ("pending", "sending"):
        # The backoff itself is stored in the row (next_attempt_at); this only wakes us then.
        raise self.retry(countdown=max(0.05, res.retry_in), max_retries=None)
    return res.state


@shared_task(name="gpufleet.alerts.sweep_outbox", ignore_result=True)
def sweep_outbox() -> int:
    """Re-nudge rows whose Celery message was lost (worker crash, broker restart)."""
    from gpufleet.alerts.outbox import due_ids

    settings = _settings()
    config = _config(settings)
    # grace: leave rows alone that a scheduled retry will pick up anyway
    ids = due_ids(_engine_for_process(settings), time.time(), grace_s=config.delivery.lease_s)
    for oid in ids:
        deliver_notification.delay(oid)
    return len(ids)
