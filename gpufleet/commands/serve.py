"""`gpufleet serve`: the collector + REST API + web dashboard (production mode).

Schema changes are `gpufleet migrate`'s job (a pre-deploy step); `--migrate` is for
single-instance setups. With `--workers N`, uvicorn spawns N processes; each builds the app
(`server.server_process_app`: the FastAPI app behind the ingest front) from the Settings this
command built, handed over inside uvicorn's pickled Config (``SettingsConfig``), not through the
environment. Each worker runs its own housekeeping (``storage.maintenance``, from the collector's
lifespan) and shares nothing else but the database."""

from __future__ import annotations

import argparse
from typing import Any

from gpufleet.commands._db import add_database_args, settings_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the collector, REST API and web dashboard")
    add_database_args(p)
    p.add_argument("--host", default=None, help="listen address (default $GPUFLEET_HOST, else 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default $GPUFLEET_PORT, else 8000)")
    p.add_argument("--workers", type=int, default=None,
                   help="collector/API processes (default $GPUFLEET_WORKERS, else 1)")
    p.add_argument("--migrate", action="store_true", help="upgrade the schema before serving")
    p.add_argument("--allow-anonymous", action="store_true", default=None,
                   help="accept requests without a token (never on a shared network)")
    p.set_defaults(func=run)


def _flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    http = {k: v for k, v in (("host", args.host), ("port", args.port), ("workers", args.workers)) if v is not None}
    auth = {"allow_anonymous": True} if args.allow_anonymous else {}
    return {"http": http, "auth": auth}


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, **_flags(args))
    url = settings.database_url()
    if args.migrate:
        from gpufleet.storage.migrate import upgrade

        upgrade(url)
    else:
        _require_schema(url)
    serve(settings)
    return 0


def serve(settings: Any) -> None:
    import shutil
    import sys
    import tempfile

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from gpufleet.api.http_timeouts import http_protocol
    from gpufleet.server import SettingsConfig

    http = settings.http
    made = None
    if http.workers > 1 and not http.metrics_dir:
        # the processes' shared /metrics (api/metrics_share.py): each scrape reaches one of them
        try:
            made = tempfile.mkdtemp(prefix="gpufleet-metrics-")
        except OSError as e:
            print(f"gpufleet serve: no temporary directory for the workers' shared /metrics ({e}); each scrape "
                  "shows the answering process's counters only: set GPUFLEET_METRICS_DIR", file=sys.stderr)
        else:
            http = http.model_copy(update={"metrics_dir": made})
            settings = settings.model_copy(update={"http": http})
    config = SettingsConfig(
        settings, host=http.host, port=http.port, workers=http.workers, log_level="info", access_log=False,
        # Nothing in gpufleet reads the client address, and uvicorn's X-Forwarded-* rewriting
        # middleware is ~3% of an ingest worker's CPU at thousands of requests/s.
        proxy_headers=False,
        http=http_protocol(),  # request headers must arrive within GPUFLEET_HTTP_HEADER_TIMEOUT_S
        # uvicorn kills a worker that has not answered its supervisor's ping within this many
        # seconds, starting included; its default of 5 s never let `--workers 2` start on a
        # loaded 2-core box (load 11: a worker's imports took 13 s, killed, respawned, forever).
        timeout_worker_healthcheck=60,
    )
    try:
        if config.workers > 1:
            Multiprocess(config, sockets=[config.bind_socket()]).run()
        else:
            uvicorn.Server(config).run()
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def _require_schema(url: str) -> None:
    from gpufleet.storage.migrate import current

    if current(url) is None:
        raise SystemExit(
            "gpufleet serve: the database has no gpufleet schema yet. Run `gpufleet migrate` "
            "(with the same --database-url) first, or pass --migrate."
        )
