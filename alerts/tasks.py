"""Celery tasks (thin): evaluate alerts, deliver one outbox row, sweep the outbox.

``shared_task`` binds to the app that includes this module (``gpufleet.celery_app``) without
importing it (alerts sits below the top layer). The outbox row is the truth; a Celery message
is only a nudge, so a lost or duplicated message costs a delay, never a lost or double post:
``sweep_outbox`` (run after every evaluation) finds rows nobody is working on."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from celery import shared_task
from sqlalchemy import Engine

from gpufleet.alerts.config import AlertConfig, load_config
from gpufleet.alerts.ratelimit import Limiter, MemoryLimiter, RedisLimiter

log = logging.getLogger(__name__)

def _engine_for_process() -> Engine:
    from gpufleet.storage.db import engine_for_process

    return engine_for_process()


def _config() -> AlertConfig:
    # Same env names as ServerSettings (public_url, grafana_url); read directly because the
    # alerts layer does not import the server's settings module.
    return load_config().with_links(os.environ.get("GPUFLEET_PUBLIC_URL", ""),
                                    os.environ.get("GPUFLEET_GRAFANA_URL", ""))


_limiters: dict[tuple[int, str, float, int], Limiter] = {}


def _limiter(config: AlertConfig) -> Limiter:
    """Shared across workers through Redis; one client per process and settings."""
    url = os.environ.get("GPUFLEET_REDIS_URL", "")
    key = (os.getpid(), url, config.delivery.rate_per_s, config.delivery.burst)
    if key not in _limiters:
        _limiters[key] = (RedisLimiter(url, key[2], key[3]) if url else MemoryLimiter(key[2], key[3]))
    return _limiters[key]


def _test_crash_hook(stage: str) -> None:
    """Fault injection for the end-to-end test only: ``GPUFLEET_ALERTS_TEST_CRASH=stage:marker``
    kills this worker process once at ``stage`` (the marker file records that it happened)."""
    spec = os.environ.get("GPUFLEET_ALERTS_TEST_CRASH")
    if not spec:
        return
    want, _, marker = spec.partition(":")
    if want == stage and marker and not Path(marker).exists():
        Path(marker).write_text(str(time.time()))
        os._exit(1)


@shared_task(name="gpufleet.alerts.evaluate_alerts", ignore_result=True)
def evaluate_alerts(now: float | None = None) -> dict[str, Any]:
    from gpufleet.alerts.runner import evaluate

    config = _config()
    if not config.enabled:
        return {"enabled": False}
    res = evaluate(_engine_for_process(), config, now)
    for oid in res.outbox_ids:
        deliver_notification.delay(oid)
    sweep_outbox.delay()
    return {"enabled": True, "queued": len(res.outbox_ids), "jobs": res.jobs_seen}


@shared_task(name="gpufleet.alerts.deliver_notification", bind=True, ignore_result=True, max_retries=None)
def deliver_notification(self: Any, outbox_id: int) -> str:
    from gpufleet.alerts.outbox import deliver_one

    config = _config()
    res = deliver_one(_engine_for_process(), outbox_id, config, _limiter(config), hook=_test_crash_hook)
    if res.retry_in is not None and res.state in ("pending", "sending"):
        # The backoff itself is stored in the row (next_attempt_at); this only wakes us then.
        raise self.retry(countdown=max(0.05, res.retry_in), max_retries=None)
    return res.state


@shared_task(name="gpufleet.alerts.sweep_outbox", ignore_result=True)
def sweep_outbox() -> int:
    """Re-nudge rows whose Celery message was lost (worker crash, broker restart)."""
    from gpufleet.alerts.outbox import due_ids

    config = _config()
    # grace: leave rows alone that a scheduled retry will pick up anyway
    ids = due_ids(_engine_for_process(), time.time(), grace_s=config.delivery.lease_s)
    for oid in ids:
        deliver_notification.delay(oid)
    return len(ids)
