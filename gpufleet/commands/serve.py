"""`gpufleet serve`: the collector + REST API + web dashboard (production mode).

Schema changes are `gpufleet migrate`'s job (a pre-deploy step); `--migrate` is for
single-instance setups. With `--workers N`, uvicorn forks N processes that each build the
app from the environment (`create_app_from_env`: the FastAPI app behind the ingest front,
`collector.front.IngestFront`) and share the database, nothing else."""

from __future__ import annotations

import argparse
import os

from gpufleet.commands._db import add_database_args, database_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the collector, REST API and web dashboard")
    add_database_args(p)
    p.add_argument("--host", default=os.environ.get("GPUFLEET_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GPUFLEET_PORT", "8000")))
    p.add_argument("--workers", type=int, default=int(os.environ.get("GPUFLEET_WORKERS", "1")),
                   help="collector/API processes (default 1)")
    p.add_argument("--migrate", action="store_true", help="upgrade the schema before serving")
    p.add_argument("--allow-anonymous", action="store_true", default=None,
                   help="accept requests without a token (never on a shared network)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    url = database_url(args)
    os.environ["GPUFLEET_DATABASE_URL"] = url
    if args.allow_anonymous:
        os.environ["GPUFLEET_ALLOW_ANONYMOUS"] = "true"
    if args.migrate:
        from gpufleet.storage.migrate import upgrade

        upgrade(url)
    else:
        _require_schema(url)
    uvicorn.run(
        "gpufleet.server:create_app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers if args.workers > 1 else None,
        log_level="info",
        access_log=False,
        # Nothing in gpufleet reads the client address, and uvicorn's X-Forwarded-* rewriting
        # middleware is ~3% of an ingest worker's CPU at thousands of requests/s.
        proxy_headers=False,
    )
    return 0


def _require_schema(url: str) -> None:
    from gpufleet.storage.migrate import current

    if current(url) is None:
        raise SystemExit(
            "gpufleet serve: the database has no gpufleet schema yet. Run `gpufleet migrate` "
            "(with the same --database-url) first, or pass --migrate."
        )
