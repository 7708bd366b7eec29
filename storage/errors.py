"""What the write path says when it cannot store something, as values, and how database
exceptions are classified. Nothing here knows HTTP: ``WriteRefused.kind`` says why and the
collector (``collector.errors``) decides the status. Exceptions from the database are told
apart by their type and SQLSTATE, never by their text (messages change with the server's
version and locale)."""

from __future__ import annotations

import sqlite3
from typing import Literal

from sqlalchemy.exc import DBAPIError, OperationalError

RefusalKind = Literal["conflict", "unknown_reference", "not_permitted"]


class WriteRefused(Exception):
    """A batch the database state forbids storing: ``conflict`` (e.g. a GPU uuid that another
    live node reports), ``unknown_reference`` (a sample of a GPU the batch does not list and
    the node never reported), ``not_permitted`` (a node describing a job it has no GPU of).
    ``index``: the batch's position in the ``write_batches`` call; the caller rolls back."""

    def __init__(self, kind: RefusalKind, message: str, *, index: int | None, part: str,
                 field: str | None = None, row: int | None = None) -> None:
        super().__init__(message)
        self.kind: RefusalKind = kind
        self.message = message
        self.index = index
        self.part = part
        self.field = field
        self.row = row


# 40001 serialization, 40P01 deadlock, 57P01-03 admin shutdown / cannot connect now, 08xxx
# connection exceptions, 53xxx insufficient resources, 55P03 lock not available
_TRANSIENT_STATES = ("40", "57P", "08", "53", "55P03")


def _driver_error(e: BaseException) -> BaseException | None:
    """The database driver's own exception behind ``e``: SQLAlchemy's ``orig``, or ``e`` itself
    when the driver raised it unwrapped (the write path's hot statements run on psycopg's own
    cursor, storage/pg_arrays.py); None when ``e`` is no database error."""
    if isinstance(e, DBAPIError):
        return e.orig
    if isinstance(e, sqlite3.Error):
        return e
    try:
        import psycopg
    except ImportError:  # the agent-only install has no database driver
        return None
    return e if isinstance(e, psycopg.Error) else None


def _psycopg_connection_failure(d: BaseException | None) -> bool:
    """psycopg raises its base OperationalError itself (never a SQLSTATE subclass) when a
    connection cannot be made or is lost, whatever the server said while refusing it."""
    return type(d).__name__ == "OperationalError" and type(d).__module__.startswith("psycopg")


def _sqlstate(e: BaseException) -> str:
    orig = e.orig if isinstance(e, DBAPIError) else e
    return getattr(orig, "sqlstate", None) or ""


def is_missing_partition(e: BaseException) -> bool:
    """PostgreSQL's "no partition of relation .. found for row": check_violation (23514)
    reported on the partitioned table itself, without a constraint name (a real CHECK
    constraint violation always names its constraint)."""
    if _sqlstate(e) != "23514":
        return False
    orig = e.orig if isinstance(e, DBAPIError) else e
    diag = getattr(orig, "diag", None)
    return diag is not None and diag.constraint_name is None


def is_transient(e: BaseException) -> bool:
    """Worth retrying: the database was unreachable, restarting, overloaded, or this
    transaction lost a deadlock or serialisation race. Wrapped by SQLAlchemy or not: an
    unwrapped lost deadlock was once answered 500 after a one-by-one replay of its group."""
    if isinstance(e, OperationalError) or (isinstance(e, DBAPIError) and e.connection_invalidated):
        return True
    d = _driver_error(e)
    if d is None:
        return False
    if isinstance(d, sqlite3.OperationalError):  # "database is locked" and the like
        return True
    return _sqlstate(d).startswith(_TRANSIENT_STATES) or _psycopg_connection_failure(d)


def is_unreachable(e: BaseException) -> bool:
    """The database cannot be reached at all (refused, down, starting up, shutting down):
    retrying within the request only adds latency; the client should come back later. A
    PostgreSQL driver error without SQLSTATE is a client-side connection failure."""
    if isinstance(e, DBAPIError) and e.connection_invalidated:
        return True
    d = _driver_error(e)
    if d is None:
        return False
    code = _sqlstate(d)
    return code.startswith("08") or code in ("57P01", "57P02", "57P03") or _psycopg_connection_failure(d)
