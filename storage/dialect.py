"""Which database: the one place that answers it. Everything that differs between PostgreSQL and
SQLite (COPY, partitions, upsert syntax, JSON and array types) asks here, so a third backend
would be one function to extend and a grep to review."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session

Dialect = Literal["postgresql", "sqlite"]
Bind = Engine | Connection | Session | URL | str


def dialect_of(bind: Bind) -> Dialect:
    """The backend behind an engine, connection, session or URL."""
    if isinstance(bind, str | URL):
        name = make_url(bind).get_backend_name()
    elif isinstance(bind, Session):
        name = bind.get_bind().dialect.name
    else:
        name = bind.dialect.name
    if name not in ("postgresql", "sqlite"):
        raise ValueError(f"unsupported database {name!r}: gpufleet runs on PostgreSQL or SQLite")
    return name  # type: ignore[return-value]  # narrowed by the check above


def is_postgres(bind: Bind) -> bool:
    return dialect_of(bind) == "postgresql"


def is_sqlite(bind: Bind) -> bool:
    return dialect_of(bind) == "sqlite"
