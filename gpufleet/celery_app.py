"""The Celery application (production mode: Redis broker). ``gpufleet worker`` and
``gpufleet beat`` run it; ``gpufleet up`` runs the same task functions in-process instead.

Tasks live next to what they wrap (analysis/tasks.py, alerts/tasks.py) and stay thin."""

from __future__ import annotations

import os

from celery import Celery


def make_celery(broker_url: str | None = None) -> Celery:
    url = broker_url or os.environ.get("GPUFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    app = Celery("gpufleet", broker=url, backend=url,
                 include=["gpufleet.analysis.tasks", "gpufleet.alerts.tasks"])
    app.conf.update(
        task_acks_late=True,  # a worker killed mid-task leaves the message for another worker
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        timezone="UTC",
        broker_connection_retry_on_startup=True,
        beat_schedule=beat_schedule(),
    )
    return app


def beat_schedule() -> dict[str, dict[str, object]]:
    """What ``gpufleet beat`` sends. Each message expires before the next tick, so a backlog
    (workers down for an hour) is not replayed 60 times: the next run catches up anyway."""
    every = float(os.environ.get("GPUFLEET_ANALYSIS_INTERVAL_S", "60"))
    return {
        "analyze-due-jobs": {
            "task": "gpufleet.analysis.analyze_due_jobs",
            "schedule": every,
            "options": {"expires": max(1.0, every * 0.9)},
        },
        # Analysis triggers alert evaluation when flags change; this tick also covers what
        # changes with time alone: reminders (repeat interval), silence expiry, the digest.
        "evaluate-alerts": {
            "task": "gpufleet.alerts.evaluate_alerts",
            "schedule": 60.0,
            "options": {"expires": 54.0},
        },
    }


app = make_celery()
