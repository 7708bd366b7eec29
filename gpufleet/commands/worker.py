"""`gpufleet worker`: the Celery worker (production: analysis and alert tasks from Redis), and
this host's share of database housekeeping (``storage.maintenance``) in a background thread."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.commands._db import add_database_args, settings_from_args

if TYPE_CHECKING:
    from gpufleet.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run a Celery worker for analysis and alert tasks (Redis broker)")
    add_broker_args(p)
    p.add_argument("--concurrency", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--beat", action="store_true", help="also run the beat scheduler in this process (small setups)")
    p.add_argument("--schedule-file", default=None, help="beat state file with --beat (default under the data dir)")
    p.set_defaults(func=run)


def add_broker_args(p: argparse.ArgumentParser) -> None:
    add_database_args(p)
    p.add_argument("--redis-url", default=None,
                   help="broker URL (default $GPUFLEET_REDIS_URL, else redis://127.0.0.1:6379/0)")
    p.add_argument("--loglevel", default="INFO")


def broker_settings(args: argparse.Namespace) -> Settings:
    celery: dict[str, Any] = {"redis_url": args.redis_url} if args.redis_url else {}
    return settings_from_args(args, celery=celery)


def schedule_path(args: argparse.Namespace, settings: Settings) -> str:
    if args.schedule_file:
        return str(args.schedule_file)
    d = Path(settings.database.data_dir).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return str(d / "celerybeat-schedule")


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.pool import NullPool

    from gpufleet.celery_app import make_celery
    from gpufleet.storage.db import make_engine
    from gpufleet.storage.dialect import is_sqlite
    from gpufleet.storage.maintenance import MaintenanceLoop

    settings = broker_settings(args)
    app = make_celery(settings)
    argv = ["worker", f"--loglevel={args.loglevel}"]
    if args.concurrency:
        argv.append(f"--concurrency={args.concurrency}")
    if args.beat:
        argv += ["--beat", f"--schedule={schedule_path(args, settings)}"]
    url = settings.database_url()
    # Housekeeping runs in this (main) process. Celery forks its pool inside worker_main, after
    # the thread starts: a child gets no thread, and must not close the parent's pooled
    # connections it inherited (SQLAlchemy's advice for fork); tasks open their own engine.
    # SQLite's advice is stronger: carry no open connection across fork at all, since the
    # child's SQLite would take the copied connection's locks for its own. So on SQLite the
    # loop opens a connection per pass (NullPool) and no fork happens during a pass.
    engine = make_engine(url, poolclass=NullPool) if is_sqlite(url) else make_engine(url)
    os.register_at_fork(after_in_child=lambda: engine.dispose(close=False))
    loop = MaintenanceLoop(engine, settings.maintenance)
    loop.hold_passes_across_fork()
    with loop:
        app.worker_main(argv)
    engine.dispose()
    return 0
