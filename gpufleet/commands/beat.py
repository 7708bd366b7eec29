"""`gpufleet beat`: the Celery beat scheduler (sends the analysis task every
``GPUFLEET_ANALYSIS_INTERVAL_S``, 60 s by default; run exactly one)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from gpufleet.commands.worker import add_broker_args

    p = sub.add_parser("beat", help="run the Celery beat scheduler (analysis every GPUFLEET_ANALYSIS_INTERVAL_S, "
                                    "default 60 s); run exactly one")
    add_broker_args(p)
    p.add_argument("--schedule-file", default=None, help="beat state file (default under the data dir)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.celery_app import make_celery
    from gpufleet.commands.worker import broker_settings, schedule_path

    settings = broker_settings(args)
    app = make_celery(settings)
    app.start(["beat", f"--loglevel={args.loglevel}", f"--schedule={schedule_path(args, settings)}"])
    return 0
