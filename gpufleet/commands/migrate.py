"""`gpufleet migrate`: create or upgrade the schema (Alembic), or step it down."""

from __future__ import annotations

import argparse

from gpufleet.commands._db import add_database_args, database_url


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate", help="create or upgrade the database schema (alembic upgrade)")
    add_database_args(p)
    p.add_argument("--revision", default="head", help="target revision (default head)")
    p.add_argument("--downgrade", action="store_true", help="downgrade to --revision instead (e.g. base)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.storage import migrate

    url = database_url(args)
    if args.downgrade:
        migrate.downgrade(url, args.revision)
    else:
        migrate.upgrade(url, args.revision)
    print(f"database at revision {migrate.current(url)}: {_safe(url)}")
    return 0


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
