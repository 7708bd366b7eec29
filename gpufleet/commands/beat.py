"""`gpufleet beat`: the Celery beat scheduler (sends the analysis task every 60 s; run one)."""

from __future__ import annotations

import argparse

from gpufleet.commands._db import add_database_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("beat", help="run the Celery beat scheduler (analysis every 60 s); run exactly one")
    add_database_args(p)
    p.add_argument("--redis-url", default=None, help="broker URL (default $GPUFLEET_REDIS_URL, else redis://127.0.0.1:6379/0)")
    p.add_argument("--loglevel", default="INFO")
    p.add_argument("--schedule-file", default=None, help="beat state file (default under the data dir)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.commands.worker import celery_env, schedule_path

    celery_env(args)
    from gpufleet.celery_app import app

    app.start(["beat", f"--loglevel={args.loglevel}", f"--schedule={schedule_path(args)}"])
    return 0
