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
    )
    return app


app = make_celery()
