"""Engines and the database URL. One place decides SQLite pragmas and pool settings.

Where the URL comes from (flags, ``GPUFLEET_DATABASE_URL``) is the settings' business
(``gpufleet.settings.DatabaseSettings``); storage never reads the environment."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext, make_url

from gpufleet.storage.dialect import is_sqlite

DEFAULT_DATA_DIR = Path("./gpufleet-data")


def resolve_url(url: str | None = None, data_dir: str | Path | None = None) -> str:
    """``url`` when given, else a SQLite file under ``data_dir`` (created)."""
    if url:
        return normalise(url)
    d = Path(data_dir or DEFAULT_DATA_DIR).expanduser().resolve()
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'gpufleet.db'}"


def normalise(url: str) -> str:
    """Accept plain postgresql:// URLs and pick the psycopg (v3) driver for sync work."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def asyncpg_dsn(url: str) -> str:
    """The same PostgreSQL database as a libpq DSN for asyncpg's COPY path."""
    u = make_url(url).set(drivername="postgresql")
    return u.render_as_string(hide_password=False)


def make_engine(url: str, **kw: object) -> Engine:
    url = normalise(url)
    if is_sqlite(url):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kw)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _rec: Any) -> None:  # DB-API objects: untyped by nature
            # WAL lets readers (API) run while the collector writes; NORMAL is durable
            # across process crashes, which is what acknowledging a batch promises.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "handle_error")
        def _io_error_replaces_the_connection(ctx: ExceptionContext) -> None:
            # SQLite's "disk I/O error" family (SQLITE_IOERR_*) can leave the connection that
            # met it failing every later statement while a fresh connection reads the same file
            # fine (a CI run saw a test's pooled reader fail for 60 s beside a worker that read
            # on). Counting it as a lost connection makes the pool drop it and its siblings:
            # this statement still fails (the API answers 503), the next one opens anew.
            if _is_sqlite_io_error(ctx.original_exception):
                ctx.is_disconnect = True

        return engine
    kw.setdefault("pool_pre_ping", True)
    if "poolclass" not in kw:
        kw.setdefault("pool_size", 10)
        kw.setdefault("max_overflow", 20)
    return create_engine(url, **kw)


def _is_sqlite_io_error(e: BaseException) -> bool:
    # Python reports the extended code (e.g. 266, SQLITE_IOERR_READ); its low byte is the
    # primary code, and SQLITE_IOERR's text is the same whatever the extension.
    code = getattr(e, "sqlite_errorcode", None)
    return isinstance(e, sqlite3.OperationalError) and isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_IOERR


_process_engine: tuple[int, str, Engine] | None = None


def engine_for_process(url: str) -> Engine:
    """One engine per worker process for Celery tasks: created after the prefork (a pooled
    connection inherited across fork is shared by two processes), re-created if the URL changes."""
    global _process_engine
    url = normalise(url)
    if _process_engine is None or _process_engine[0] != os.getpid() or _process_engine[1] != url:
        _process_engine = (os.getpid(), url, make_engine(url))
    return _process_engine[2]
