"""A pooled SQLite connection that meets a real "disk I/O error" is replaced, not handed out
again: the failing statement raises (marked as a lost connection, which the API answers 503),
the next one opens a fresh connection and reads the file as it is.

The I/O error is real: the pooled connection's own file descriptors for the database and its
WAL are pointed at a directory (``dup2``), so SQLite's next ``read()`` gets EISDIR and SQLite
reports SQLITE_IOERR_READ; a new connection opens the files anew and is unaffected. Without
the engine's hook the pool hands the broken connection back and every later query fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from gpufleet.storage.db import make_engine
from gpufleet.storage.errors import is_transient


def _fds_of(paths: set[str]) -> list[int]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") in paths:
                out.append(int(name))
        except OSError:
            continue
    return out


def _count(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(text("select count(*) from t")).scalar_one())


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc to find the connection's files")
def test_a_connection_that_met_an_io_error_is_replaced(tmp_path: Path) -> None:
    db = tmp_path / "io.db"
    engine = make_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as c:
            c.execute(text("create table t (x integer)"))
            c.execute(text("insert into t values (1)"))
        assert _count(engine) == 1  # the pool now holds one connection with its files open
        held = _fds_of({str(db), f"{db}-wal"})
        assert len(held) == 2, held

        # Another process's write (here: a second engine), so the pooled reader must read pages.
        other = make_engine(f"sqlite:///{db}")
        with other.begin() as c:
            c.execute(text("insert into t select value from json_each(json_array(2, 3, 4, 5))"))
        other.dispose()

        d = os.open(tmp_path, os.O_RDONLY)
        try:
            for fd in held:
                os.dup2(d, fd)  # the pooled connection's next read() fails with EISDIR
        finally:
            os.close(d)

        with pytest.raises(OperationalError) as err:
            _count(engine)
        assert "disk I/O error" in str(err.value)
        assert getattr(err.value.orig, "sqlite_errorname", "").startswith("SQLITE_IOERR")
        assert err.value.connection_invalidated  # what tells the API to answer 503, not 500
        assert is_transient(err.value)

        # The next statement gets a fresh connection that sees every row.
        assert _count(engine) == 5
        assert _count(engine) == 5
    finally:
        engine.dispose()


def test_other_sqlite_errors_keep_the_connection(tmp_path: Path) -> None:
    """A statement error (no such table) is the statement's fault: the connection stays pooled."""
    db = tmp_path / "keep.db"
    engine = make_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as c:
            first = c.connection.dbapi_connection
            with pytest.raises(OperationalError) as err:
                c.execute(text("select * from no_such_table"))
            assert not err.value.connection_invalidated
        with engine.connect() as c:
            assert c.connection.dbapi_connection is first
    finally:
        engine.dispose()
