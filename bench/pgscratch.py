"""A scratch PostgreSQL database for a benchmark run: created on the server named by an admin
URL, dropped afterwards (sessions still attached are ended first). Shared by bench/*/ scripts,
which put this folder on sys.path."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def scratch_database(admin_url: str, name: str) -> Iterator[str]:
    """Yield the SQLAlchemy URL of a fresh, empty database ``name``; drop it on exit."""
    import psycopg
    from sqlalchemy.engine import make_url

    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')  # a leftover from a killed run
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as c:
            c.execute("select pg_terminate_backend(pid) from pg_stat_activity where datname = %s", (name,))
            if os.environ.get("GPUFLEET_BENCH_KEEP_DB"):  # to look into a run afterwards (drop it yourself)
                print(f"kept database {name}", file=sys.stderr)
            else:
                c.execute(f'DROP DATABASE IF EXISTS "{name}"')
