"""How database errors are classified (storage/errors.py), including the driver's own exceptions:
the write path's hot statements run on psycopg's cursor (storage/pg_arrays.py), so a deadlock
lost there arrives unwrapped and must still be retried, never answered 500."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import psycopg
import psycopg.errors as pe
from sqlalchemy.exc import DBAPIError, IntegrityError

from gpufleet.storage.errors import is_transient, is_unreachable


def test_raw_psycopg_errors_by_sqlstate() -> None:
    assert is_transient(pe.DeadlockDetected("x")) and not is_unreachable(pe.DeadlockDetected("x"))
    assert is_transient(pe.SerializationFailure("x"))
    assert is_transient(pe.AdminShutdown("x")) and is_unreachable(pe.AdminShutdown("x"))
    assert is_transient(psycopg.OperationalError("connection lost"))  # no SQLSTATE: the connection
    assert is_unreachable(psycopg.OperationalError("connection lost"))
    for permanent in (pe.UniqueViolation("x"), pe.CheckViolation("x"), pe.UndefinedTable("x")):
        assert not is_transient(permanent) and not is_unreachable(permanent)


def test_raw_sqlite_and_wrapped_errors() -> None:
    assert is_transient(sqlite3.OperationalError("database is locked"))
    assert not is_transient(sqlite3.IntegrityError("UNIQUE constraint failed"))
    wrapped = DBAPIError.instance("SELECT 1", {}, pe.DeadlockDetected("x"), psycopg.Error)
    assert is_transient(wrapped) and not is_unreachable(wrapped)
    assert not is_transient(IntegrityError("INSERT", {}, pe.UniqueViolation("x")))
    assert not is_transient(ValueError("not a database error"))


def test_a_real_deadlock_from_postgresql_is_transient(pg_url: str) -> None:
    """Two transactions lock two rows in opposite orders: PostgreSQL kills one with 40P01,
    raised by psycopg itself, and the classifier says retry."""
    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE deadlock_probe (k int PRIMARY KEY, v int)")
        c.execute("INSERT INTO deadlock_probe VALUES (1, 0), (2, 0)")
    a, b = psycopg.connect(dsn), psycopg.connect(dsn)
    errors: list[BaseException] = []
    both_locked = threading.Barrier(2, timeout=30)

    def run(conn: Any, first: int, second: int) -> None:
        try:
            conn.execute("UPDATE deadlock_probe SET v = v + 1 WHERE k = %s", (first,))
            both_locked.wait()
            conn.execute("UPDATE deadlock_probe SET v = v + 1 WHERE k = %s", (second,))
            conn.commit()
        except psycopg.Error as e:
            errors.append(e)
            conn.rollback()

    try:
        ts = [threading.Thread(target=run, args=(a, 1, 2)), threading.Thread(target=run, args=(b, 2, 1))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    finally:
        a.close()
        b.close()
    assert len(errors) == 1, errors
    (e,) = errors
    assert isinstance(e, pe.DeadlockDetected) and is_transient(e) and not is_unreachable(e)
