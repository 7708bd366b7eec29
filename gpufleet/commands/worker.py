"""`gpufleet worker`: the Celery worker (production: analysis and alert tasks from Redis)."""

from __future__ import annotations

import argparse
import os

from gpufleet.commands._db import add_database_args, database_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run a Celery worker for analysis and alert tasks (Redis broker)")
    add_database_args(p)
    p.add_argument("--redis-url", default=None, help="broker URL (default $GPUFLEET_REDIS_URL, else redis://127.0.0.1:6379/0)")
    p.add_argument("--concurrency", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--loglevel", default="INFO")
    p.add_argument("--beat", action="store_true", help="also run the beat scheduler in this process (small setups)")
    p.add_argument("--schedule-file", default=None, help="beat state file with --beat (default under the data dir)")
    p.set_defaults(func=run)


def celery_env(args: argparse.Namespace) -> None:
    """Tasks read their URLs from the environment: set them before the app is imported."""
    os.environ["GPUFLEET_DATABASE_URL"] = database_url(args)
    if args.redis_url:
        os.environ["GPUFLEET_REDIS_URL"] = args.redis_url


def schedule_path(args: argparse.Namespace) -> str:
    if args.schedule_file:
        return str(args.schedule_file)
    d = args.data_dir or os.environ.get("GPUFLEET_DATA_DIR", "./gpufleet-data")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, "celerybeat-schedule")


def run(args: argparse.Namespace) -> int:
    celery_env(args)
    from gpufleet.celery_app import app

    argv = ["worker", f"--loglevel={args.loglevel}"]
    if args.concurrency:
        argv.append(f"--concurrency={args.concurrency}")
    if args.beat:
        argv += ["--beat", f"--schedule={schedule_path(args)}"]
    app.worker_main(argv)
    return 0
