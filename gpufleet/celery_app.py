"""The Celery application (production mode: Redis broker). ``gpufleet worker`` and
``gpufleet beat`` build it from their Settings (``make_celery(settings)``) and run it;
``gpufleet up`` runs the same task functions in-process instead.

Tasks live next to what they wrap (analysis/tasks.py, alerts/tasks.py) and stay thin; they read
their settings from the app they are bound to (``settings_of(task.app)``), so nothing here
needs the environment at import time. ``celery -A gpufleet.celery_app`` still works: the module
attribute ``app`` is built on first access, from the environment."""

from __future__ import annotations

import importlib
from typing import Any

from celery import Celery
from celery.signals import worker_init

from gpufleet.settings import Settings

TASK_MODULES = ["gpufleet.analysis.tasks", "gpufleet.alerts.tasks"]
# What the tasks import lazily (numpy, the detectors, SQLAlchemy models): loaded once in the
# worker's main process before it forks its pool, so the children share it instead of each
# paying seconds of imports inside its first analysis shard (measured: 4-5 s on a busy 2-core box).
PRELOAD = ["gpufleet.analysis.runner", "gpufleet.alerts.runner"]


@worker_init.connect(dispatch_uid="gpufleet.celery_app.preload", weak=False)
def _preload(**_: Any) -> None:
    for name in PRELOAD:
        importlib.import_module(name)


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    url = settings.celery.broker()
    app = Celery("gpufleet", broker=url, backend=url, include=TASK_MODULES, set_as_current=True)
    app.conf.update(
        task_acks_late=True,  # a worker killed mid-task leaves the message for another worker
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        timezone="UTC",
        broker_connection_retry_on_startup=True,
        beat_schedule=beat_schedule(settings),
        # Read back by the tasks (gpufleet.settings.settings_of); prefork children inherit it.
        gpufleet_settings=settings,
    )
    return app


def beat_schedule(settings: Settings) -> dict[str, dict[str, object]]:
    """What ``gpufleet beat`` sends. Each message expires before the next tick, so a backlog
    (workers down for an hour) is not replayed 60 times: the next run catches up anyway."""
    every = settings.analysis.interval_s
    return {
        # A fan-out: one analyze_shard and one analyze_progress_shard message per shard
        # (analysis.shards), so every worker takes part in the pass (analysis/tasks.py).
        "analyze-due-jobs": {
            "task": "gpufleet.analysis.analyze_due_jobs",
            "schedule": every,
            "options": {"expires": max(1.0, every * 0.9)},
        },
        # The progress pass alone, more often (docs/progress.md, "Time to detect"): a hang is
        # judged from the last step, so the pass cadence adds to the 60 s rule; the hardware
        # analysis stays at its own period. Two passes never overlap (per-shard progress lock).
        "analyze-progress": {
            "task": "gpufleet.analysis.analyze_progress_due",
            "schedule": settings.analysis.progress_interval_s,
            "options": {"expires": max(1.0, settings.analysis.progress_interval_s * 0.9)},
        },
        # Analysis triggers alert evaluation when flags change; this tick also covers what
        # changes with time alone: reminders (repeat interval), silence expiry, the digest.
        "evaluate-alerts": {
            "task": "gpufleet.alerts.evaluate_alerts",
            "schedule": 60.0,
            "options": {"expires": 54.0},
        },
    }


_app: Celery | None = None


def __getattr__(name: str) -> Any:
    # `celery -A gpufleet.celery_app` looks up `app`; build it then, not at import.
    global _app
    if name == "app":
        if _app is None:
            _app = make_celery()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
