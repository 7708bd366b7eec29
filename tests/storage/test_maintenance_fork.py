"""``gpufleet worker`` runs the maintenance loop in a thread of the Celery main process, and
Celery forks its pool children from that process. A fork that lands while the thread is inside
SQLite gives the child SQLite's mutexes copied as they were: found staging it, a child hung for
good in its first ``sqlite3.connect`` (SQLite's allocator mutex, copied locked; seen with gdb).

Here the loop runs passes back to back on a real SQLite file while the test's main thread forks
children that each open their own engine and read, as a Celery pool child does. With the
worker's arrangement (a connection per pass, ``hold_passes_across_fork``) every child finishes;
a child not done in 20 s counts as hung (a write waiting on a lock the child
*thinks* its process holds waits out SQLite's 30 s busy timeout). Run with the hold removed, children hang (checked by
hand when this was written: the first or second fork already did)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from gpufleet.storage.db import make_engine
from gpufleet.storage.maintenance import DefaultPolicy, MaintenanceLoop

FORKS = 25
HUNG_AFTER_S = 20.0


# Passes back to back, retention in every one: the thread is inside SQLite most of the time.
BUSY = DefaultPolicy(interval_s=0.001, retention_interval_s=0.0)


def _child(url: str, n: int) -> None:
    """What a pool child does: its own engine, a read, a write (an analysis stores its report).
    Never returns."""
    code = 0
    try:
        engine = make_engine(url)
        with engine.connect() as c:
            c.execute(text("select count(*) from jobs")).scalar_one()
        with engine.begin() as c:
            c.execute(text("insert into fork_probe values (:n)"), {"n": n})
        engine.dispose()
    except BaseException:
        code = 3
    os._exit(code)


def _outcome(pid: int) -> str:
    deadline = time.monotonic() + HUNG_AFTER_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "ok" if os.waitstatus_to_exitcode(status) == 0 else "failed"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is what is tested")
def test_children_forked_during_sqlite_passes_open_the_database(sqlite_url: str, tmp_path: Path) -> None:
    engine = make_engine(sqlite_url, poolclass=NullPool)  # as gpufleet worker builds it on SQLite
    with engine.begin() as c:
        c.execute(text("create table fork_probe (n integer)"))
    loop = MaintenanceLoop(engine, BUSY)
    loop.hold_passes_across_fork()
    outcomes: list[str] = []
    with loop:
        deadline = time.monotonic() + 10
        while loop.passes < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop.passes >= 3, "the loop made no passes"
        first = loop.passes
        for n in range(FORKS):
            pid = os.fork()
            if pid == 0:
                _child(sqlite_url, n)
            outcomes.append(_outcome(pid))
        passes_during = loop.passes - first
    with engine.connect() as c:
        written = sorted(n for (n,) in c.execute(text("select n from fork_probe")))
    engine.dispose()
    assert loop.last is not None and loop.last.errors == [], loop.last
    assert passes_during >= FORKS // 5, passes_during  # the forks really landed among passes
    assert outcomes == ["ok"] * FORKS, outcomes
    assert written == list(range(FORKS))  # every child's write stored, once
