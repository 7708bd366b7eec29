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


def _raw_driver_error(e: BaseException) -> str | None:
    """Which driver raised ``e`` itself (not wrapped by SQLAlchemy), by exception class."""
    if isinstance(e, sqlite3.Error):
        return "sqlite3"
    try:
        import psycopg
    except ImportError:  # the agent-only install has no database driver
        return None
    return "psycopg" if isinstance(e, psycopg.Error) else None


def _psycopg_connection_failure(e: BaseException) -> bool:
    """psycopg raises its base OperationalError itself (never a SQLSTATE subclass) when a
    connection cannot be made or is lost."""
    return type(e).__name__ == "OperationalError" and type(e).__module__.startswith("psycopg")


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
    transaction lost a deadlock or serialisation race."""
    if isinstance(e, OperationalError):
        return True
    if isinstance(e, DBAPIError):
        if e.connection_invalidated:
            return True
        return _sqlstate(e).startswith(_TRANSIENT_STATES)
    raw = _raw_driver_error(e)
    if raw is None:
        return False
    # The write path's hot statements run on the driver's own cursor (storage/pg_arrays.py),
    # so their errors arrive unwrapped: a lost deadlock there must be retried like any other
    # (it was answered 500 after a one-by-one replay of the whole group).
    if raw == "sqlite3":
        return isinstance(e, sqlite3.OperationalError)  # "database is locked" and the like
    return _sqlstate(e).startswith(_TRANSIENT_STATES) or _psycopg_connection_failure(e)


def is_unreachable(e: BaseException) -> bool:
    """The database cannot be reached at all (refused, down, starting up, shutting down):
    retrying within the request only adds latency; the client should come back later. A
    PostgreSQL driver error without SQLSTATE is a client-side connection failure."""
    if not isinstance(e, DBAPIError):
        if _raw_driver_error(e) != "psycopg":
            return False
        code = _sqlstate(e)
        return code.startswith("08") or code in ("57P01", "57P02", "57P03") or _psycopg_connection_failure(e)
    if e.connection_invalidated:
        return True
    code = _sqlstate(e)
    if code.startswith("08") or code in ("57P01", "57P02", "57P03"):
        return True
    # psycopg raises its base OperationalError itself (never a SQLSTATE subclass) when a
    # connection cannot be made or is lost, whatever the server said while refusing it.
    orig = e.orig
    return isinstance(e, OperationalError) and type(orig).__name__ == "OperationalError" \
        and type(orig).__module__.startswith("psycopg")
